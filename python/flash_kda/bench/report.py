"""Writers of the benchmark's results: the printed table, JSON and Markdown.

Pure Python on the dict run_suite returns (no torch), so tests can feed fake results:
  {"meta": {gpu, driver, torch, triton, fla, flash_kda, date, ...}, "copy_bandwidth": bytes/s,
   "anchor_source": str, "settings": {...}, "planned_cases": int (more than len(cases) while
   a run is going or after it was stopped),
   "cases": [{"case": Case.to_dict(), "floor_ms", "floor_bytes", "anchor": {flash_kda_ms,
              fla_ms, floor_ms} | None, "times": {"flash_kda"|"fla": {"eager"|"graph":
              {median, min, max, n}}}, "host_us": {"flash_kda": us per eager call} | absent,
              "check": check_case dict | None, "errors": {what: msg},
              "kernels_us": {"flash_kda": {kernel name: mean device us a call}} | absent (--kernels;
              settings.kernel_calls the profiled calls; an error under errors["kernels"]),
              "from_run": str | absent (a record merged from several runs: the run this case's
              figures come from, when it is not the header's)}],
   "layer": layer result | absent,
   "decode": [{"case": DecodeCase.to_dict() (name, num_seqs, heads, T, state, pool_slots, indices),
               "floor_ms", "floor_bytes", "times": as the cases', "check": {out_err, state_err,
               fla_out_err, fla_state_err, sampled_seqs, bound, fla_ratio_bound, passed} | None,
               "errors"}] | absent (python -m flash_kda.bench --decode),
   "decode_run": {meta, copy_bandwidth, settings} | absent (a record the decode table was merged into),
   "train": [{"case": Case.to_dict(), "times": {"flash_kda"|"fla": {"eager": summary}} (forward +
              backward), "saved_bytes": {impl: bytes}, "saved_bytes_beyond_inputs": {impl: bytes},
              "check": train.check_gradients dict | None, "check_note": str | absent, "errors"}]
            | absent (python -m flash_kda.bench --train),
   "train_run": {meta, settings, planned_train} | absent (a record the training table was merged into)}
All times are milliseconds, but host_us and kernels_us (microseconds).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from . import check
from .cases import is_flashkda_configuration
from .decode import GRAPH_CALLS

COLUMNS = [
    "case", "T total", "H", "seqs", "flash_kda ms", "x floor", "flash_kda graph ms", "flash_kda host us",
    "fla ms", "fla graph ms", "speedup vs fla", "floor ms",
    "anchor FlashKDA ms", "anchor fla ms", "check",
]


def _median(r: dict, impl: str, mode: str) -> float | None:
    return r.get("times", {}).get(impl, {}).get(mode, {}).get("median")


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.4f}" if v < 0.1 else f"{v:.3f}"


def _ratio(num: float | None, den: float | None, suffix: str = "x") -> str:
    if num is None or den is None or den == 0:
        return "-"
    return f"{num / den:.2f}{suffix}"


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def variant_of(c: dict) -> tuple:
    """(gate, state_layout, (initial dtype, final dtype) or None when they agree, strided,
    entry) of a case dict: what separates the report's sections (one state dtype for both
    states is not a variant: the table's cases may differ in it). The entry is "chunk_kda" for
    every variant but FlashKDA's configuration, the only one whose entry point is a choice;
    records without the variant fields read as FlashKDA's configuration, and without an entry
    as through fwd, the entry that configuration takes by default."""
    state = c.get("state", "fp32")
    out = state if state == "none" or c.get("state_out") is None else c["state_out"]
    gate, layout, dtypes = c.get("gate", "safe"), c.get("state_layout", "v_first"), (state, out) if out != state else None
    strided = bool(c.get("strided", False))
    entry = c.get("entry", "fwd") if is_flashkda_configuration(gate, layout, dtypes, strided) else "chunk_kda"
    return (gate, layout, dtypes, strided, entry)


def is_plain(variant: tuple) -> bool:
    """FlashKDA's configuration through fwd: safe gate, v-first, one state dtype, contiguous
    inputs, flash_kda.fwd (the call of the anchors and of the README's table)."""
    *configuration, entry = variant
    return is_flashkda_configuration(*configuration) and entry == "fwd"


def variant_label(variant: tuple) -> str:
    """The variant in words ("softplus gate, k-first states, bf16 -> fp32 states"; "safe gate,
    v-first states, through chunk_kda"). The entry point is named only for FlashKDA's
    configuration: every other variant runs through chunk_kda."""
    gate, layout, dtypes, strided, entry = variant
    parts = [f"{gate} gate", layout.replace("_", "-") + " states"]
    if dtypes is not None:
        parts.append(f"{dtypes[0]} -> {dtypes[1]} states")
    if strided:
        parts.append("strided q/k/v (views of a fused projection)")
    if entry != "fwd" and is_flashkda_configuration(gate, layout, dtypes, strided):
        parts.append(f"through {entry}")
    return ", ".join(parts)


def variant_groups(results: dict) -> list[tuple[tuple, dict]]:
    """The cases split by variant, in order of first appearance: [(variant, results with only
    that variant's cases)]."""
    order: list[tuple] = []
    by: dict = {}
    for r in results.get("cases", []):
        v = variant_of(r["case"])
        if v not in by:
            order.append(v)
            by[v] = []
        by[v].append(r)
    return [(v, {**results, "cases": by[v]}) for v in order]


def variant_cost_lines(results: dict) -> list[str]:
    """For each variant other than FlashKDA's configuration, our time over our time in that
    configuration on the same case and initial state dtype, case by case (the issue's "softplus
    at most 1.2x the safe gate" and "strided within 3% of contiguous" read off these): eager,
    and, where both were graph-timed, graph. The two differ in what they include: a variant runs
    through chunk_kda, whose host time (fla's keyword rules, its outputs allocated per call) adds
    to an eager call's but not to a graph replay's, so the graph ratio is the kernels' alone.
    FlashKDA's configuration through chunk_kda (--entry chunk_kda) is such a variant too: its
    line is chunk_kda's cost over fwd's on the same kernels."""
    groups = variant_groups(results)
    base = [r for bv, b in groups if is_plain(bv) for r in b["cases"]]
    key = lambda r: (r["case"]["name"], r["case"].get("state"))
    lines = []
    for v, sub in groups:
        if is_plain(v):
            continue
        parts = []
        for mode in ("eager", "graph"):
            ref = {key(r): _median(r, "flash_kda", mode) for r in base}
            ratios = [(r["case"]["name"], _median(r, "flash_kda", mode) / ref[key(r)])
                      for r in sub["cases"] if ref.get(key(r)) and _median(r, "flash_kda", mode)]
            if ratios:
                worst = max(ratios, key=lambda p: p[1])
                parts.append(f"{mode} max {worst[1]:.2f}x ({worst[0]}), geomean "
                             f"{_geomean([x for _, x in ratios]):.2f}x over {len(ratios)} case(s)")
        if parts:
            lines.append(f"{variant_label(v)}: flash_kda time / safe-gate v-first time: " + "; ".join(parts))
    return lines


def geomean_line(results: dict) -> str | None:
    """The headline: geometric mean of the eager medians over the cases every column has
    (flash_kda, fla, and the anchors' FlashKDA and fla), so the four means compare like with
    like; None when no case has all four. The issues' targets are stated as such means."""
    cols = {"flash_kda": [], "fla": [], "anchor FlashKDA": [], "anchor fla": []}
    for r in results.get("cases", []):
        a = r.get("anchor") or {}
        vals = (_median(r, "flash_kda", "eager"), _median(r, "fla", "eager"),
                a.get("flash_kda_ms"), a.get("fla_ms"))
        if all(v is not None and v > 0 for v in vals):
            for key, v in zip(cols, vals):
                cols[key].append(v)
    n = len(cols["flash_kda"])
    if n == 0:
        return None
    means = ", ".join(f"{key} {_ms(_geomean(v))} ms" for key, v in cols.items())
    return f"geomean over {n} case(s), eager: {means}"


def plain_geomean_line(results: dict) -> str | None:
    """Geometric means of the eager medians of flash_kda and fla over the cases both ran (for
    variants the anchors did not measure)."""
    pairs = [(_median(r, "flash_kda", "eager"), _median(r, "fla", "eager")) for r in results.get("cases", [])]
    pairs = [(a, b) for a, b in pairs if a and b]
    if not pairs:
        return None
    ours, fla = _geomean([a for a, _ in pairs]), _geomean([b for _, b in pairs])
    return (f"geomean over {len(pairs)} case(s), eager: flash_kda {_ms(ours)} ms, fla {_ms(fla)} ms "
            f"(fla / flash_kda {fla / ours:.2f}x)")


def check_label(r: dict, keys: tuple[str, ...] = ("out_err",)) -> str:
    """"ok"/"FAIL" with our errors vs the fp64 reference (the check's `keys`, joined by "/"),
    "error", or "-" when skipped."""
    c = r.get("check")
    if c is None:
        return "error" if "check" in r.get("errors", {}) else "-"
    return f"{'ok' if c.get('passed') else 'FAIL'} " + "/".join(f"{c.get(k, float('nan')):.1e}" for k in keys)


def rows(results: dict) -> list[list[str]]:
    """One row of strings per case, in COLUMNS order.

    "x floor": our eager median / floor. "flash_kda host us": host microseconds per eager call
    (timing.host_us_per_call: an eager median near it is host-bound, not the kernels'; "-" for
    records written before it was measured). "speedup vs fla": fla eager / ours eager, and graph
    vs graph after a slash when both graphs ran.
    """
    out = []
    for r in results["cases"]:
        c = r["case"]
        ours_e, ours_g = _median(r, "flash_kda", "eager"), _median(r, "flash_kda", "graph")
        fla_e, fla_g = _median(r, "fla", "eager"), _median(r, "fla", "graph")
        speed = _ratio(fla_e, ours_e)
        if fla_g is not None and ours_g is not None:
            speed += " / " + _ratio(fla_g, ours_g)
        a = r.get("anchor") or {}
        out.append([
            c["name"], str(c["T_total"]), str(c["heads"]), str(c["num_seqs"]),
            _ms(ours_e), _ratio(ours_e, r["floor_ms"]), _ms(ours_g), _host_us(r, "flash_kda"),
            _ms(fla_e), _ms(fla_g), speed, _ms(r["floor_ms"]),
            _ms(a.get("flash_kda_ms")), _ms(a.get("fla_ms")), check_label(r),
        ])
    return out


def _padded(columns: list[str], body: list[list[str]]) -> list[str]:
    """Header, rule and rows as text lines, each column padded to its widest cell (the first
    left-aligned, the others right-aligned)."""
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(columns)]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return [line(columns), line(["-" * w for w in widths])] + [line(row) for row in body]


def format_table(results: dict) -> str:
    """The plain-text table printed last on stdout (columns padded to width); the decode
    table for a --decode run."""
    if results.get("train") and not results.get("cases") and not results.get("decode"):
        return format_train_table(results)
    if results.get("decode") and not results.get("cases"):
        return format_decode_table(results)
    if not results.get("cases"):
        return format_layer(results["layer"]) if "layer" in results else "no cases were run"
    groups = variant_groups(results)
    sectioned = len(groups) > 1 or not is_plain(groups[0][0])
    text = []
    for v, sub in groups:
        if sectioned:
            text += [f"== {variant_label(v)} ==", ""]
        text += _padded(COLUMNS, rows(sub)) + [""]
        if (g := geomean_line(sub)) is not None:
            text.append(g)
        elif sectioned and (g := plain_geomean_line(sub)) is not None:
            text.append(g)
        if sectioned:
            text.append("")
    text += variant_cost_lines(results)
    text.append(f"copy bandwidth {results['copy_bandwidth'] / 1e12:.2f} TB/s (read + write); "
                "floor = fewest bytes / copy bandwidth; times are medians of event-timed calls")
    text.append(f"anchor columns: {results.get('anchor_source', 'anchors-h200.md')}")
    text.extend(notes(results))
    text.extend(_error_lines(results))
    if "layer" in results:
        text.append(format_layer(results["layer"]))
    return "\n".join(text)


#: What "check" means, printed under the table and in the Markdown report.
CHECK_NOTE = ("check: flash_kda's out and final_state vs the fp64 reference on all heads, relative "
              f"Frobenius error <= {check.REF_BOUND:g} over all heads and on the worst head, and "
              f"<= {check.FLA_RATIO_BOUND:g}x fla's error "
              "when fla ran; the column shows the all-head out error; ours vs fla is reported in "
              "results.json, not judged")
#: Why "x floor" can be below 1.
L2_NOTE = ("no cache flush between calls: a case whose data fits in the GPU's L2 (50 MB on an H200) "
           "is served from it, so its time can beat the HBM floor (x floor < 1)")
#: fla's first call of a new shape runs Triton's autotuning.
AUTOTUNE_NOTE = ("fla autotunes its Triton kernels on the first call of each new shape (the check or "
                 "warm-up call), which is excluded from the times; keep TRITON_CACHE_DIR between runs "
                 "to reuse the tuned configurations and skip it")
#: --state bf16 is not like-for-like for fla.
BF16_FLA_NOTE = ("--state bf16: fla accepts only fp32 states, so it still reads and writes fp32 states "
                 "(twice our state bytes): its times are not like-for-like with ours")


def notes(results: dict) -> list[str]:
    """The notes printed under the table: partial run, what check means, L2, and (when fla
    ran) its autotuning and, with bf16 states, that its state traffic is fp32."""
    cases = results.get("cases", [])
    out = []
    planned = results.get("planned_cases")
    if planned is not None and len(cases) < planned:
        out.append(f"PARTIAL: {len(cases)} of {planned} cases finished (the run was stopped or is still going)")
    out += [CHECK_NOTE, L2_NOTE]
    out += from_run_lines(cases)
    fla_ran = any("fla" in r.get("times", {}) for r in cases)
    if fla_ran:
        out.append(AUTOTUNE_NOTE)
        if any(r["case"].get("state") == "bf16" and "fla" in r.get("times", {}) for r in cases):
            out.append(BF16_FLA_NOTE)
    return out


def from_run_lines(cases: list[dict]) -> list[str]:
    """One note per earlier or later run that some cases of a merged record come from (their
    `from_run`), naming those cases; nothing when every case is from the header's run."""
    runs: dict[str, list[str]] = {}
    for r in cases:
        if r.get("from_run"):
            c = r["case"]
            runs.setdefault(r["from_run"], []).append(f"{c['name']} ({c.get('gate', 'safe')} gate)")
    return [f"from another run than the others: {', '.join(names)}: {run}" for run, names in runs.items()]


def _error_lines(results: dict) -> list[str]:
    lines = []
    for r in results["cases"]:
        for what, msg in r.get("errors", {}).items():
            lines.append(f"{r['case']['name']}: {what} failed: {msg}")
    return lines


def format_layer(layer: dict) -> str:
    """One paragraph on the --layer result (times in ms, rel. difference of outputs)."""
    t, f = layer.get("triton_ms"), layer.get("flash_kda_ms")
    s = (f"KimiDeltaAttention layer (hidden {layer['hidden_size']}, {layer['num_heads']} heads of "
         f"{layer['head_dim']}, B {layer['batch']}, T {layer['T']}): fla Triton {_ms(t)} ms, "
         f"dispatched to flash_kda {_ms(f)} ms, speedup {_ratio(t, f)}, "
         f"rel. difference of outputs {layer.get('rel_diff', float('nan')):.2e} "
         f"(bound {layer.get('rel_diff_bound', float('nan')):.0e}: {'ok' if layer.get('passed') else 'FAIL'})")
    if layer.get("error"):
        s += f" (ERROR in the flash_kda run: {layer['error']})"
    elif not layer.get("dispatched", True):
        s += f" (WARNING: fla did not dispatch to flash_kda: {layer.get('dispatch_note', '')})"
    return s


def _table_head(columns) -> list[str]:
    """A Markdown table's header and alignment rows: the first column left-aligned, the others
    right-aligned."""
    return ["| " + " | ".join(columns) + " |", "|" + "|".join(["---"] + ["---:"] * (len(columns) - 1)) + "|"]


def _table(columns, body: list[list[str]]) -> list[str]:
    """A Markdown table of `columns` with one row per list of cell strings in `body`."""
    return _table_head(columns) + ["| " + " | ".join(row) + " |" for row in body]


#: The machine and versions a decode or training section lists from its run's meta.
SECTION_META_KEYS = ("gpu", "torch", "triton", "fla", "flash_kda", "date")


def _section_head(title: str, run: dict) -> list[str]:
    """A section's title line (blank lines around it) and its run's machine and versions."""
    m = run.get("meta", {})
    return ["", title, ""] + [f"- {key}: {m[key]}" for key in SECTION_META_KEYS if key in m]


def to_markdown(results: dict, chart: str | None = None) -> str:
    """The Markdown report: header with machine and versions, the table, notes, chart link."""
    m = results.get("meta", {})
    md = [f"# flash_kda benchmark on {m.get('gpu', 'unknown GPU')}", "",
          "Generated by `python -m flash_kda.bench`; see docs/benchmark.md for how to read it.", ""]
    for key in ("gpu", "sm_count", "driver", "cuda_runtime", "torch", "triton", "fla", "flash_kda", "date", "rendered"):
        if key in m:
            md.append(f"- {key}: {m[key]}")
    s = results.get("settings", {})
    if s:
        states = sorted({r["case"].get("state", "?") for r in results.get("cases", [])})
        md.append(f"- settings: {s.get('iters')} timed calls after {s.get('warmup')} warm-up, seed {s.get('seed')}"
                  + (f", states {'/'.join(states)}" if states else ""))
    if (part := results.get("partition")) is not None:
        md.append(f"- SM partition (--num-sms): a green context of {part['num_sms']} of the device's "
                  f"{part['device_sms']} SMs; a bf16 matmul ran {part['ratio']:.2f}x slower there than on the whole "
                  f"device ({part['sm_ratio']:.2f}x fewer SMs); flash_kda's plan was told {part['num_sms']} SMs")
    if results.get("cases"):
        md.append(f"- device-to-device copy bandwidth (this run): {results['copy_bandwidth'] / 1e12:.2f} TB/s")
        groups = variant_groups(results)
        sectioned = len(groups) > 1 or not is_plain(groups[0][0])
        for v, sub in groups:
            if sectioned:
                md += ["", f"## {variant_label(v)[0].upper() + variant_label(v)[1:]}"]
            md += [""] + _table(COLUMNS, rows(sub))
            g = geomean_line(sub) or (plain_geomean_line(sub) if sectioned else None)
            if g is not None:
                md += ["", f"- {g}"]
        md += ["", "Times are medians (ms); \"x floor\" is flash_kda's eager time over the HBM floor; "
               "\"speedup vs fla\" is fla's time over ours (eager / CUDA graph); fla runs the same variant "
               "(gate, state layout) on its Triton path.",
               f"The anchor columns are NOT from this run: {results.get('anchor_source', 'anchors-h200.md')}.",
               ""]
        md += [f"- {line}" for line in variant_cost_lines(results)]
        md += [f"- {line}" for line in notes(results)]
        md += [f"- {line}" for line in _error_lines(results)]
        md += accuracy_section(results)
    md += decode_markdown(results)
    md += train_markdown(results)
    md += kernels_section(results)
    if "layer" in results:
        md += ["", "## KimiDeltaAttention layer", "", format_layer(results["layer"])]
    if chart:
        md += ["", f"![time per case]({chart})"]
    return "\n".join(md) + "\n"


def kernels_section(results: dict) -> list[str]:
    """The per-kernel table of a --kernels run (case, kernel, mean device us a call, and its
    share of the case's eager median; a --train case's rows are its forward + backward step's,
    named "<case> (train step)"), or nothing when no case has kernels_us."""
    body = []
    calls = results.get("settings", {}).get("kernel_calls", "the")
    for section, suffix in (("cases", ""), ("train", " (train step)")):
        for r in results.get(section, []):
            eager = _median(r, "flash_kda", "eager")
            for label, us in (r.get("kernels_us") or {}).get("flash_kda", {}).items():
                share = f"{us / (eager * 1e3) * 100:.0f}%" if eager else "-"
                body.append([r["case"]["name"] + suffix, f"`{label}`", f"{us:.1f}", share])
    if not body:
        return []
    return (["", "## Per-kernel device time (`--kernels`)", "",
             f"flash_kda's kernels of one eager call: mean device us a call over {calls} profiled calls "
             "(torch.profiler), and that over the case's eager median. Launch gaps and overlap are "
             "not in a kernel's figure, so the rows need not sum to the call's time.", ""]
            + _table(["case", "kernel", "us a call", "of eager"], body))


def _err(chk: dict, key: str) -> str:
    v = chk.get(key)
    return "" if v is None else f"{v:.1e}"


def accuracy_section(results: dict) -> list[str]:
    """Markdown lines: per case, flash_kda's and fla's relative Frobenius errors against the fp64
    reference (all heads; worst head for ours), from each case's check; empty without checks."""
    checked = [r for r in results.get("cases", []) if r.get("check")]
    if not checked:
        return []
    md = ["", "## Accuracy against the fp64 reference", "",
          "Relative Frobenius error over all heads (worst single head in brackets) of out and "
          "final_state; fla's on the same inputs (its fp32 state rounded to the case's state dtype).", "",
          "| case | flash_kda out | flash_kda state | fla out | fla state |", "|---|---:|---:|---:|---:|"]
    for r in checked:
        c = r["check"]
        ours_o = f"{_err(c, 'out_err')} ({_err(c, 'out_err_worst_head')})" if c.get("out_err") is not None else ""
        ours_s = f"{_err(c, 'state_err')} ({_err(c, 'state_err_worst_head')})" if c.get("state_err") is not None else ""
        v = variant_of(r["case"])
        name = r["case"]["name"] if is_plain(v) else f"{r['case']['name']} ({variant_label(v)})"
        md.append(f"| {name} | {ours_o} | {ours_s} | {_err(c, 'fla_out_err')} | {_err(c, 'fla_state_err')} |")
    return md


#: The README's benchmark table lies between these two lines; --write-record rewrites it.
README_TABLE_BEGIN = "<!-- benchmark table: written by python -m flash_kda.bench --write-record -->"
README_TABLE_END = "<!-- end of benchmark table -->"


def readme_table(results: dict) -> list[str]:
    """The README's benchmark table of a run: per case of FlashKDA's configuration (is_plain)
    flash_kda eager and graph, fla eager and graph (same run), FlashKDA's anchor and the floor
    (ms), then the eager geometric means, and a line naming the rows from another run than
    the rest (from_run_lines) when the record was merged from several."""
    head = ["case", "flash_kda ms", "graph ms", "fla ms (same run)", "fla graph ms",
            "FlashKDA ms (anchor, not this run)", "HBM floor ms"]
    lines = _table_head(head)
    cols: dict = {"flash_kda": [], "fla": [], "anchor": []}
    for r in results.get("cases", []):
        if not is_plain(variant_of(r["case"])):
            continue  # the README's table is FlashKDA's configuration, as the anchors
        a = r.get("anchor") or {}
        vals = [_median(r, "flash_kda", "eager"), _median(r, "flash_kda", "graph"), _median(r, "fla", "eager"),
                _median(r, "fla", "graph"), a.get("flash_kda_ms"), r.get("floor_ms")]
        lines.append("| " + " | ".join([r["case"]["name"]] + [_ms(v) for v in vals]) + " |")
        for key, v in zip(cols, (vals[0], vals[2], vals[4])):
            if v is not None and v > 0:
                cols[key].append(v)
    means = [_ms(_geomean(v)) if v else "-" for v in cols.values()]
    lines.append(f"| geometric mean (eager) | {means[0]} | | {means[1]} | | {means[2]} | |")
    others = from_run_lines([r for r in results.get("cases", []) if is_plain(variant_of(r["case"]))])
    return (lines + [""] + [f"Note: {line}." for line in others]) if others else lines


def update_readme(readme: Path, results: dict) -> bool:
    """Replace the table between README_TABLE_BEGIN and README_TABLE_END in `readme` with
    readme_table(results); False (and nothing written) when the file or the markers are absent."""
    try:
        text = readme.read_text()
    except OSError:
        return False
    begin, end = text.find(README_TABLE_BEGIN), text.find(README_TABLE_END)
    if begin < 0 or end < begin:
        return False
    table = "\n".join(readme_table(results))
    readme.write_text(text[: begin + len(README_TABLE_BEGIN)] + "\n" + table + "\n" + text[end:])
    return True


def write_json(results: dict, path: Path) -> None:
    """Write results as indented JSON (creating the folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")


def write_markdown(results: dict, path: Path, chart: str | None = None) -> None:
    """Write to_markdown(results, chart) to path (creating the folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_markdown(results, chart))


# --- the decode table (python -m flash_kda.bench --decode) -------------------------------------

DECODE_COLUMNS = [
    "point", "N", "H", "T", "state", "flash_kda graph us", "flash_kda eager us", "flash_kda host us", "fla graph us",
    "fla eager us", "fla host us", "speedup vs fla (graph)", "floor us", "x floor (graph)", "check",
]
#: The issue's floor target applies where the floor is at least this many milliseconds.
DECODE_FLOOR_TARGET_MS = 0.030
#: ... and asks for at most this multiple of it.
DECODE_FLOOR_RATIO = 1.1


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def decode_check_label(r: dict) -> str:
    """check_label with our out and state errors ("ok 3.0e-03/2.0e-07")."""
    return check_label(r, ("out_err", "state_err"))


def _host_us(r: dict, impl: str) -> str:
    """A point's host microseconds per eager call of impl ("-" when not measured: records
    written before the field existed have none)."""
    v = r.get("host_us", {}).get(impl)
    return "-" if v is None else f"{v:.1f}"


def decode_rows(results: dict) -> list[list[str]]:
    """One row of strings per decode point, in DECODE_COLUMNS order (times in microseconds)."""
    out = []
    for r in results.get("decode", []):
        c = r["case"]
        ours_g, ours_e = _median(r, "flash_kda", "graph"), _median(r, "flash_kda", "eager")
        fla_g, fla_e = _median(r, "fla", "graph"), _median(r, "fla", "eager")
        state = c["state"] if c.get("layout", "v_first") == "v_first" else f"{c['state']} k-first"
        out.append([c["name"], str(c["num_seqs"]), str(c["heads"]), str(c["T"]), state, _us(ours_g), _us(ours_e),
                    _host_us(r, "flash_kda"), _us(fla_g), _us(fla_e), _host_us(r, "fla"), _ratio(fla_g, ours_g),
                    _us(r.get("floor_ms")),
                    _ratio(ours_g, r.get("floor_ms")), decode_check_label(r)])
    return out


def decode_summary(results: dict) -> list[str]:
    """The issue's targets read off the graph times: points faster than fla, the worst
    multiple of the floor where the floor is >= 30 us, and the 1 x 32 heads, T = 1 time."""
    pts = results.get("decode", [])
    both = [(r, _median(r, "flash_kda", "graph"), _median(r, "fla", "graph")) for r in pts]
    both = [(r, o, f) for r, o, f in both if o is not None and f is not None]
    lines = []
    if both:
        faster = sum(1 for _, o, f in both if o < f)
        lines.append(f"faster than fla (CUDA graph): {faster} of {len(both)} points")
    floored = [(r, _median(r, "flash_kda", "graph") / r["floor_ms"]) for r in pts
               if r.get("floor_ms", 0) >= DECODE_FLOOR_TARGET_MS and _median(r, "flash_kda", "graph") is not None]
    if floored:
        worst, ratio = max(floored, key=lambda p: p[1])
        within = sum(1 for _, x in floored if x <= DECODE_FLOOR_RATIO)
        lines.append(f"within {DECODE_FLOOR_RATIO:g}x of the floor where it is >= {DECODE_FLOOR_TARGET_MS * 1e3:.0f} us: "
                     f"{within} of {len(floored)} points (worst {ratio:.2f}x, {worst['case']['name']})")
    for r in pts:
        c = r["case"]
        if c["num_seqs"] == 1 and c["heads"] == 32 and c["T"] == 1:
            layout = "" if c.get("layout", "v_first") == "v_first" else " k-first"
            lines.append(f"1 x 32 heads, T = 1, {c['state']}{layout} pool: {_us(_median(r, 'flash_kda', 'graph'))} us "
                         "(graph)")
    checked = [r for r in pts if r.get("check")]
    if checked:
        ok = sum(1 for r in checked if r["check"].get("passed"))
        lines.append(f"checks passed: {ok} of {len(checked)} (flash_kda out/state error vs the fp64 reference on "
                     f"sampled sequences <= {check.REF_BOUND:g} and <= {check.FLA_RATIO_BOUND:g}x fla's)")
    planned = results.get("planned_decode")
    if planned is not None and len(pts) < planned:
        lines.append(f"PARTIAL: {len(pts)} of {planned} decode points finished")
    return lines


def _decode_errors(results: dict) -> list[str]:
    return [f"{r['case']['name']}: {what} failed: {msg}"
            for r in results.get("decode", []) for what, msg in r.get("errors", {}).items()]


def decode_kernel_labels(results: dict) -> list[str]:
    """The flash_kda implementations of a --decode-kernel run, in the order first timed
    ("flash_kda" for auto, "flash_kda_<kernel>"); empty for a run of auto alone."""
    labels: list[str] = []
    for r in results.get("decode", []):
        for label in r.get("times", {}):
            if label.startswith("flash_kda") and label not in labels:
                labels.append(label)
    return labels if labels != ["flash_kda"] else []


def decode_kernel_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    """(columns, rows): per decode point each kernel's graph time (us), its multiple of the
    floor and fla's graph time over it (the --decode-kernel A/B); no rows without one."""
    labels = decode_kernel_labels(results)
    if not labels:
        return [], []
    cols = ["point"]
    for label in labels:
        cols += [f"{label} graph us", f"{label} x floor", f"fla / {label}"]
    rows = []
    for r in results.get("decode", []):
        row = [r["case"]["name"]]
        fla_g = _median(r, "fla", "graph")
        for label in labels:
            g = _median(r, label, "graph")
            row += [_us(g), _ratio(g, r.get("floor_ms")), _ratio(fla_g, g)]
        rows.append(row)
    return cols, rows


def format_decode_table(results: dict) -> str:
    """The plain-text decode table with its summary lines (and the per-kernel table of a
    --decode-kernel run)."""
    text = _padded(DECODE_COLUMNS, decode_rows(results)) + [""]
    kcols, krows = decode_kernel_rows(results)
    if krows:
        text += ["decode kernels (CUDA graph):"] + _padded(kcols, krows) + [""]
    text += decode_summary(results) + [DECODE_NOTE] + _decode_errors(results)
    return "\n".join(text)


#: How to read the decode table.
DECODE_NOTE = ("decode: N sequences of T tokens over a pool ([N] slot indices for T = 1, [N, T] for T > 1), "
               "K = V = 128, bf16 inputs, safe gate; times are medians (us); graph = per call in a CUDA graph of "
               f"{GRAPH_CALLS} back-to-back calls (a captured decode step; one call alone would time the graph launch); "
               "host us = wall-clock per eager call "
               "over many calls without synchronising (Python + binding + launch: a graph time near it is "
               "host-bound, not the kernel's); floor = state read + writes + "
               "inputs at the measured copy bandwidth; fla is fused_recurrent_kda_fwd (Triton) in the same run")


def decode_markdown(results: dict) -> list[str]:
    """The Markdown decode section (empty without decode points). With a merged record the
    decode run's own metadata (decode_run) is listed, as it differs from the forward's."""
    if not results.get("decode"):
        return []
    run = results.get("decode_run", results)
    md = _section_head("## Decode (`python -m flash_kda.bench --decode`)", run)
    if run.get("copy_bandwidth"):
        md.append(f"- device-to-device copy bandwidth (this run): {run['copy_bandwidth'] / 1e12:.2f} TB/s")
    md += [""] + _table(DECODE_COLUMNS, decode_rows(results))
    md += [""] + [f"- {line}" for line in decode_summary(results) + [DECODE_NOTE] + _decode_errors(results)]
    return md


#: A decode run's own metadata, kept as the record's `decode_run` beside the forward run's.
DECODE_RUN_KEYS = ("meta", "copy_bandwidth", "settings", "planned_decode")


def merge_decode(record: dict, decode_results: dict) -> dict:
    """The record with the decode run's points as its top-level `decode` list and the decode
    run's meta, copy bandwidth and settings as `decode_run`; the forward `cases` are kept."""
    return _merge_section(record, decode_results, "decode", DECODE_RUN_KEYS)


def _merge_section(record: dict, results: dict, key: str, run_keys: tuple) -> dict:
    """The record (its forward `cases` kept, an empty list where it has none) with the run's
    `key` list in place of its own and the run's run_keys entries as `{key}_run`."""
    merged = dict(record)
    merged.setdefault("cases", [])
    merged[key] = results.get(key, [])
    merged[f"{key}_run"] = {k: results[k] for k in run_keys if k in results}
    return merged


# --- the training table (python -m flash_kda.bench --train) ------------------------------------

TRAIN_COLUMNS = [
    "case", "T total", "H", "seqs", "flash_kda fwd+bwd ms", "fla fwd+bwd ms", "speedup vs fla",
    "flash_kda saved MB", "fla saved MB", "grad check",
]


def _mb(v: int | None) -> str:
    return "-" if v is None else f"{v / 1e6:.1f}"


def train_check_label(r: dict) -> str:
    """"ok"/"FAIL" with flash_kda's worst gradient error vs the fp64 autograd reference,
    "error", or "-" when skipped (check_note says why)."""
    c = r.get("check")
    if c is None:
        return "error" if "check" in r.get("errors", {}) else "-"
    return f"{'ok' if c.get('passed') else 'FAIL'} {c.get('worst', float('nan')):.1e}"


def train_rows(results: dict) -> list[list[str]]:
    """One row of strings per training case, in TRAIN_COLUMNS order (times in ms, bytes saved
    for the backward in MB)."""
    out = []
    for r in results.get("train", []):
        c = r["case"]
        ours, fla = _median(r, "flash_kda", "eager"), _median(r, "fla", "eager")
        saved = r.get("saved_bytes", {})
        out.append([c["name"], str(c["T_total"]), str(c["heads"]), str(c["num_seqs"]), _ms(ours), _ms(fla),
                    _ratio(fla, ours), _mb(saved.get("flash_kda")), _mb(saved.get("fla")), train_check_label(r)])
    return out


def train_summary(results: dict) -> list[str]:
    """Geometric means of both implementations' step times over the cases both ran, checks
    passed, a partial run, skipped checks' reason, and errors."""
    pts = results.get("train", [])
    lines = []
    pairs = [(_median(r, "flash_kda", "eager"), _median(r, "fla", "eager")) for r in pts]
    pairs = [(a, b) for a, b in pairs if a and b]
    if pairs:
        ours, fla = _geomean([a for a, _ in pairs]), _geomean([b for _, b in pairs])
        lines.append(f"geomean over {len(pairs)} case(s), forward + backward, eager: flash_kda {_ms(ours)} ms, "
                     f"fla {_ms(fla)} ms (fla / flash_kda {fla / ours:.2f}x)")
    checked = [r for r in pts if r.get("check")]
    if checked:
        ok = sum(1 for r in checked if r["check"].get("passed"))
        lines.append(f"gradient checks passed: {ok} of {len(checked)}")
    notes_seen = sorted({r["check_note"] for r in pts if r.get("check_note")})
    lines += [f"gradient check {n}" for n in notes_seen]
    planned = results.get("planned_train")
    if planned is not None and len(pts) < planned:
        lines.append(f"PARTIAL: {len(pts)} of {planned} training cases finished")
    lines.append(TRAIN_NOTE)
    lines += [f"{r['case']['name']}: {what} failed: {msg}" for r in pts for what, msg in r.get("errors", {}).items()]
    return lines


#: How to read the training table.
TRAIN_NOTE = ("train: one forward + backward of chunk_kda (torch.autograd.grad of out and the final state against "
              "fixed random gradients) per timed call, eager, medians of event-timed calls (ms); fla is its Triton "
              "chunk_kda (FLA_FLASH_KDA=0) on the same inputs in the same run; saved MB = unique storages autograd "
              "saves for the backward (inputs included); grad check = flash_kda's worst relative error over every "
              "gradient against autograd through the fp64 reference on a slice (first tokens of the first sequence, "
              f"first heads), passing at <= {check.GRAD_BOUND:g} or <= {check.FLA_RATIO_BOUND:g}x fla's")


def format_train_table(results: dict) -> str:
    """The plain-text training table with its summary lines."""
    return "\n".join(_padded(TRAIN_COLUMNS, train_rows(results)) + [""] + train_summary(results))


def train_markdown(results: dict) -> list[str]:
    """The Markdown training section (empty without training cases); with a merged record the
    training run's own metadata (train_run) is listed."""
    if not results.get("train"):
        return []
    run = results.get("train_run", results)
    md = _section_head("## Training (`python -m flash_kda.bench --train`)", run)
    s = run.get("settings", {})
    if s:
        md.append(f"- settings: {s.get('iters')} timed steps after {s.get('warmup')} warm-up, seed {s.get('seed')}")
    md += [""] + _table(TRAIN_COLUMNS, train_rows(results))
    md += [""] + [f"- {line}" for line in train_summary(results)]
    return md


#: A training run's own metadata, kept as the record's `train_run`.
TRAIN_RUN_KEYS = ("meta", "settings", "planned_train")


def merge_train(record: dict, train_results: dict) -> dict:
    """The record with the training run's cases as its top-level `train` list and the training
    run's meta and settings as `train_run`; the forward `cases` and the decode table are kept."""
    return _merge_section(record, train_results, "train", TRAIN_RUN_KEYS)
