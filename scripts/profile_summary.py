"""Summarises the per-instruction stall samples of one kernel's SASS source page, as exported by
scripts/profile.sh (`ncu --page source --print-source sass --csv`): the share of each stall
reason, the share of samples and the executed count per opcode, the hottest instructions, and the
samples per region between synchronisation points (barriers, warpgroup arrive/wait, cp.async
waits), so that a chain's time can be read segment by segment.

    python3 scripts/profile_summary.py profile-out/recurrence-sass.csv [--top 25]

Why: the source page has ~4,700 rows and ~80 columns; what a tuning step needs from it is which
stall dominates and at which instructions (docs/performance.md)."""
from __future__ import annotations

import argparse
import collections
import csv
from typing import Iterable

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def read_rows(lines: Iterable[str]) -> list[dict[str, str]]:
    """The instruction rows of an ncu source-page CSV (the first line names the kernel, the
    second holds the column names)."""
    reader = csv.reader(lines)
    header = None
    rows = []
    for fields in reader:
        if header is None:
            if SAMPLES in fields:
                header = fields
            continue
        if len(fields) == len(header):
            rows.append(dict(zip(header, fields)))
    if header is None:
        raise ValueError(f"no '{SAMPLES}' column: not an ncu source page with stall sampling")
    return rows


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0


def opcode(source: str) -> str:
    """'@!P0  HMMA.16816.F32.BF16 R36, ...' -> 'HMMA'."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def summarise(rows: list[dict[str, str]]) -> dict:
    """Totals: samples, per stall reason (all samples), per opcode (samples, executed)."""
    stall_cols = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c] if rows else []
    total = sum(_int(r[SAMPLES]) for r in rows)
    stalls = collections.Counter({c[len("stall_"):]: sum(_int(r[c]) for r in rows) for c in stall_cols})
    ops_samples, ops_exec = collections.Counter(), collections.Counter()
    for r in rows:
        op = opcode(r["Source"])
        ops_samples[op] += _int(r[SAMPLES])
        ops_exec[op] += _int(r[EXECUTED])
    return {"total": total, "stalls": stalls, "ops_samples": ops_samples, "ops_exec": ops_exec}


# Opcodes that start a region: where warps wait for each other, for wgmma or for copies.
SYNC_OPCODES = ("BAR", "WARPGROUP", "DEPBAR")


def regions(rows: list[dict[str, str]]) -> list[dict]:
    """The rows in address order cut before each synchronisation instruction (SYNC_OPCODES).
    Each region: its first instruction's address and source, how often that instruction ran,
    its samples (all instructions), and its most sampled stall reason."""
    def address(r: dict[str, str]) -> int:
        try:
            return int(r.get("Address", "0"), 16)
        except ValueError:
            return 0
    stall_cols = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c] if rows else []
    out: list[dict] = []
    for r in sorted(rows, key=address):
        if not out or opcode(r["Source"]) in SYNC_OPCODES:
            out.append({"address": r.get("Address", ""), "source": r["Source"].strip(),
                        "entered": _int(r[EXECUTED]), "samples": 0, "stalls": collections.Counter()})
        out[-1]["samples"] += _int(r[SAMPLES])
        for c in stall_cols:
            out[-1]["stalls"][c[len("stall_"):]] += _int(r[c])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv", help="a *-sass.csv written by scripts/profile.sh")
    p.add_argument("--top", type=int, default=20, help="rows of each table")
    args = p.parse_args(argv)
    with open(args.csv, newline="") as f:
        rows = read_rows(f)
    s = summarise(rows)
    total = max(s["total"], 1)
    print(f"{args.csv}: {s['total']} samples over {len(rows)} instructions")
    print("stall reason        share")
    for name, n in s["stalls"].most_common(args.top):
        print(f"  {name:18s} {100 * n / total:5.1f}%")
    print("opcode      samples  executed")
    for op, n in s["ops_samples"].most_common(args.top):
        print(f"  {op:10s} {100 * n / total:5.1f}%  {s['ops_exec'][op]}")
    print("hottest instructions (samples, address, source)")
    for r in sorted(rows, key=lambda r: -_int(r[SAMPLES]))[:args.top]:
        print(f"  {_int(r[SAMPLES]):7d}  {r.get('Address', '')[-5:]}  {r['Source'].strip()[:70]}")
    print("regions from a sync point (share, executed at its start, top stall, address, first instruction)")
    for g in sorted(regions(rows), key=lambda g: -g["samples"])[:args.top]:
        top = g["stalls"].most_common(1)
        reason = f"{top[0][0]} {100 * top[0][1] / max(g['samples'], 1):.0f}%" if top and top[0][1] else "-"
        print(f"  {100 * g['samples'] / total:5.1f}%  {g['entered']:8d}  {reason:18s} {g['address'][-5:]}  {g['source'][:50]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
