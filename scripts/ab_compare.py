#!/usr/bin/env python3
"""Compare the rounds of scripts/ab-bench.sh (AB_ROUNDS >= 2): per case and mode, the median
time of each build over its rounds, the run-to-run spread of each build (largest minus smallest
of its rounds, over their median), and B against A. A case passes when B is at most
2% + the larger spread slower than A (the restructure issue's rule).

Every section of the benchmark's results is compared: the forward cases ("cases"), the
training steps ("train", --train) and the decode points ("decode", --decode), each by its case
name, in every timing mode it has (eager, graph).

    scripts/ab_compare.py DIR   # DIR holds A-1/ B-1/ A-2/ B-2/ ... results.json
With --kernels runs (per-kernel device time, results.json kernels_us), a second table compares
each case's kernels the same way, to tell which kernel moved; it does not enter the verdict.
Prints a Markdown table; exit status 1 when a case fails the rule or only one build timed it
(B failing a case is no speed-up), 2 when DIR holds fewer than two rounds of each build or no
case both builds timed.
"""
import json
import statistics
import sys
from pathlib import Path

SECTIONS = ("cases", "train", "decode")
MODES = ("eager", "graph")


def load(d: Path, side: str) -> list[dict]:
    """The results of rounds side-1, side-2, ... in round order (other folders are ignored)."""
    runs = [p for p in d.glob(f"{side}-*/results.json") if p.parent.name.split("-", 1)[1].isdigit()]
    runs.sort(key=lambda p: int(p.parent.name.split("-", 1)[1]))
    return [json.loads(p.read_text()) for p in runs]


def medians(runs: list[dict], section: str, name: str, mode: str) -> list[float]:
    """flash_kda's median time of entry `name` of `section` in `mode`, one per run that has it."""
    out = []
    for r in runs:
        for c in r.get(section) or []:
            if c["case"]["name"] == name:
                m = c.get("times", {}).get("flash_kda", {}).get(mode, {}).get("median")
                if m is not None:
                    out.append(m)
    return out


def rows(a: list[dict], b: list[dict]) -> list[dict]:
    """One row per (section, case, mode) that either build timed, in the first runs' order; a
    row that only one build timed has None for the other's figures and fails."""
    out = []
    for section in SECTIONS:
        names = [c["case"]["name"] for r in (a[0], b[0]) for c in r.get(section) or []]
        for name in dict.fromkeys(names):
            for mode in MODES:
                ta, tb = medians(a, section, name, mode), medians(b, section, name, mode)
                if not ta and not tb:
                    continue
                if not ta or not tb:
                    out.append({"section": section, "case": name, "mode": mode, "a": None, "b": None,
                                "spread_a": None, "spread_b": None, "ok": False,
                                "missing": "A" if not ta else "B"})
                    continue
                ma, mb = statistics.median(ta), statistics.median(tb)
                sa, sb = (max(ta) - min(ta)) / ma, (max(tb) - min(tb)) / mb
                out.append({"section": section, "case": name, "mode": mode, "a": ma, "b": mb,
                            "spread_a": sa, "spread_b": sb, "ok": mb / ma - 1 <= 0.02 + max(sa, sb)})
    return out


def _kernel_figures(runs: list[dict]) -> dict[str, dict[str, list[float]]]:
    """case name -> kernel -> its mean us a call in each round that has it (--kernels), over
    every round, in first-seen order; a --train step's case is named "<case> (train step)"."""
    out: dict[str, dict[str, list[float]]] = {}
    for r in runs:
        for section, suffix in (("cases", ""), ("train", " (train step)")):
            for c in r.get(section) or []:
                for label, us in ((c.get("kernels_us") or {}).get("flash_kda") or {}).items():
                    out.setdefault(c["case"]["name"] + suffix, {}).setdefault(label, []).append(us)
    return out


def _base(label: str) -> str:
    """A kernel's name without its template arguments."""
    return label.split("<", 1)[0]


def kernel_rows(a: list[dict], b: list[dict]) -> list[dict]:
    """One row per (case, kernel) of either build's --kernels rounds: the median over the
    rounds of each build's mean us a call, and each build's spread. A kernel is paired with the
    same name in the other build, else with the one kernel of the same name but other template
    arguments that the other build alone launches (a change that makes a kernel a template:
    "k" in A, "k<false>" in B), and its row's kernel reads "A's / B's"; a kernel the other build
    does not launch has None for that build's figures."""
    fa, fb = _kernel_figures(a), _kernel_figures(b)
    out = []
    for name in dict.fromkeys([*fa, *fb]):
        ka, kb = fa.get(name, {}), fb.get(name, {})
        only_b = [lab for lab in kb if lab not in ka]
        pairs = []
        for la in ka:
            if la in kb:
                pairs.append((la, la))
                continue
            same = [lb for lb in only_b if _base(lb) == _base(la)]
            alone = sum(_base(x) == _base(la) for x in ka if x not in kb) == 1
            if len(same) == 1 and alone:
                pairs.append((la, same[0]))
                only_b.remove(same[0])
            else:
                pairs.append((la, None))
        pairs += [(None, lb) for lb in only_b]
        for la, lb in pairs:
            label = la if la == lb else f"{la or '-'} / {lb or '-'}" if la and lb else la or lb
            row = {"case": name, "kernel": label, "a": None, "b": None, "spread_a": None, "spread_b": None}
            for side, t in (("a", ka.get(la) if la else None), ("b", kb.get(lb) if lb else None)):
                if t:
                    m = statistics.median(t)
                    row[side], row["spread_" + side] = m, (max(t) - min(t)) / m if m else 0.0
            out.append(row)
    return out


def main() -> int:
    d = Path(sys.argv[1])
    a, b = load(d, "A"), load(d, "B")
    if len(a) < 2 or len(b) < 2:
        print("need at least two rounds of each build", file=sys.stderr)
        return 2
    print("| section | case | mode | A ms | B ms | B / A | spread A | spread B | verdict |")
    print("|---|---|---|---:|---:|---:|---:|---:|---|")
    table = rows(a, b)
    if not any(r["a"] is not None for r in table):
        print("no case that both builds timed", file=sys.stderr)
        return 2
    for r in table:
        if r["a"] is None:
            print(f"| {r['section']} | {r['case']} | {r['mode']} | | | | | | not timed by {r['missing']} |")
            continue
        print(f"| {r['section']} | {r['case']} | {r['mode']} | {r['a']:.4f} | {r['b']:.4f} | {r['b'] / r['a']:.3f} | "
              f"{r['spread_a'] * 100:.1f}% | {r['spread_b'] * 100:.1f}% | {'ok' if r['ok'] else 'SLOWER'} |")
    ktable = kernel_rows(a, b)
    if ktable:
        print("\nPer-kernel device time (--kernels; mean us a call, median over the rounds):\n")
        print("| case | kernel | A us | B us | B / A | spread A | spread B |")
        print("|---|---|---:|---:|---:|---:|---:|")
        f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        p = lambda v: "-" if v is None else f"{v * 100:.1f}%"  # noqa: E731
        for r in ktable:
            ratio = f"{r['b'] / r['a']:.3f}" if r["a"] and r["b"] is not None else "-"
            print(f"| {r['case']} | `{r['kernel']}` | {f(r['a'])} | {f(r['b'])} | {ratio} | {p(r['spread_a'])} | "
                  f"{p(r['spread_b'])} |")
    return 0 if all(r["ok"] for r in table) else 1


if __name__ == "__main__":
    raise SystemExit(main())
