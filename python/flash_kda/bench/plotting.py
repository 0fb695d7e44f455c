"""The PNG chart: time per case for each implementation, log scale, HBM floor marked."""

from __future__ import annotations

from pathlib import Path

from .report import _median

#: (implementation key, timing mode, legend label) of the bars, left to right in each group.
SERIES = [
    ("flash_kda", "eager", "flash_kda"),
    ("flash_kda", "graph", "flash_kda (CUDA graph)"),
    ("fla", "eager", "fla chunk_kda Triton"),
    ("fla", "graph", "fla chunk_kda Triton (CUDA graph)"),
]


def plot(results: dict, path: Path) -> None:
    """Draw grouped bars (median ms, log y axis) per case into `path` (PNG), with each case's
    HBM floor as a black tick and, for standard cases, the anchor FlashKDA time as a marker.
    Series without any measurement are left out. Needs matplotlib (Agg backend, no display).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = results["cases"]
    names = [r["case"]["name"] for r in cases]
    series = [(impl, mode, label) for impl, mode, label in SERIES
              if any(_median(r, impl, mode) is not None for r in cases)]
    n = max(len(series), 1)
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(max(8.0, 0.9 * len(cases) + 3) + 3.5, 5.5))
    for j, (impl, mode, label) in enumerate(series):
        xs, ys = [], []
        for i, r in enumerate(cases):
            v = _median(r, impl, mode)
            if v is not None:
                xs.append(i - 0.4 + width * (j + 0.5))
                ys.append(v)
        ax.bar(xs, ys, width=width, label=label)
    ax.hlines([r["floor_ms"] for r in cases], [i - 0.45 for i in range(len(cases))],
              [i + 0.45 for i in range(len(cases))], colors="black", linewidth=2, label="HBM floor")
    anchor = [(i, r["anchor"]["flash_kda_ms"]) for i, r in enumerate(cases) if r.get("anchor")]
    if anchor:
        ax.scatter([a[0] for a in anchor], [a[1] for a in anchor], marker="x", color="red", zorder=3,
                   label="anchor FlashKDA (anchors-h200.md)")
    ax.set_yscale("log")
    ax.set_ylabel("time per forward (ms, log scale)")
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels(names, rotation=40, ha="right", fontsize=8)
    gpu = results.get("meta", {}).get("gpu", "")
    ax.set_title(f"KDA forward per case on {gpu}".strip())
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
