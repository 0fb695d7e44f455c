#!/usr/bin/env python3
"""Compare the rounds of scripts/ab-bench.sh (AB_ROUNDS >= 2): per case and mode, the median
time of each build over its rounds, the run-to-run spread of each build (largest minus smallest
of its rounds, over their mean), and B against A. A case passes when B is at most
2% + the larger spread slower than A (the restructure issue's rule).

    scripts/ab_compare.py DIR   # DIR holds A-1/ B-1/ A-2/ B-2/ ... results.json
Prints a Markdown table; exit status 1 when a case fails the rule.
"""
import json
import statistics
import sys
from pathlib import Path


def load(d: Path, side: str) -> list[dict]:
    runs = sorted(d.glob(f"{side}-*/results.json"), key=lambda p: int(p.parent.name.split("-")[1]))
    return [json.loads(p.read_text()) for p in runs]


def medians(runs: list[dict], name: str, mode: str) -> list[float]:
    out = []
    for r in runs:
        for c in r["cases"]:
            if c["case"]["name"] == name:
                m = c.get("times", {}).get("flash_kda", {}).get(mode, {}).get("median")
                if m is not None:
                    out.append(m)
    return out


def main() -> int:
    d = Path(sys.argv[1])
    a, b = load(d, "A"), load(d, "B")
    if len(a) < 2 or len(b) < 2:
        print("need at least two rounds of each build", file=sys.stderr)
        return 2
    names = [c["case"]["name"] for c in a[0]["cases"]]
    print("| case | mode | A ms | B ms | B / A | spread A | spread B | verdict |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    failed = 0
    for name in names:
        for mode in ("eager", "graph"):
            ta, tb = medians(a, name, mode), medians(b, name, mode)
            if not ta or not tb:
                continue
            ma, mb = statistics.mean(ta), statistics.mean(tb)
            sa, sb = (max(ta) - min(ta)) / ma, (max(tb) - min(tb)) / mb
            ok = mb / ma - 1 <= 0.02 + max(sa, sb)
            failed += not ok
            print(f"| {name} | {mode} | {ma:.4f} | {mb:.4f} | {mb / ma:.3f} | {sa * 100:.1f}% | {sb * 100:.1f}% | "
                  f"{'ok' if ok else 'SLOWER'} |")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
