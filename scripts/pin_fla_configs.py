#!/usr/bin/env python3
"""Writes tests/python/fla_configs.json: one Triton configuration per fla kernel, for the tests.

fla's chunk_kda autotunes ~100 Triton configurations per new head count and flag combination
(H and the flags are compile-time constants), which made one run of the GPU accuracy suite take
longer than a 10-minute device call. The accuracy comparison does not depend on fla's tile
configuration, so the tests pin each kernel to the configuration that won most often when
`python -m flash_kda.bench` autotuned fla on the H200 (tests/python/fwd_cases.py,
pin_fla_configs). The benchmark itself always autotunes fla fully.

Input: Triton autotune results (`*.autotune.json` under a TRITON_CACHE_DIR, or the
triton-autotune.tgz that scripts/gpu-check.sh returns).

    python3 scripts/pin_fla_configs.py TRITON_CACHE_DIR_OR_TGZ [-o tests/python/fla_configs.json]
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys
import tarfile


def _results(src: pathlib.Path):
    """(kernel name, autotune result dict) for every *.autotune.json in a folder or .tgz."""
    if src.is_dir():
        for p in sorted(src.rglob("*.autotune.json")):
            yield p.name.split(".")[0], json.loads(p.read_text())
        return
    with tarfile.open(src) as tar:
        for m in sorted(tar.getmembers(), key=lambda m: m.name):
            if m.isfile() and m.name.endswith(".autotune.json"):
                yield pathlib.Path(m.name).name.split(".")[0], json.load(tar.extractfile(m))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=pathlib.Path, help="a TRITON_CACHE_DIR or triton-autotune.tgz")
    ap.add_argument("-o", "--output", type=pathlib.Path, default=pathlib.Path("tests/python/fla_configs.json"))
    a = ap.parse_args()
    wins: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for kernel, res in _results(a.source):
        timed = [(t[0], c) for c, t in res["configs_timings"] if t and t[0] == t[0]]  # drop NaN timings
        if not timed:
            continue
        best = min(timed, key=lambda x: x[0])[1]
        keep = {k: best.get(k) for k in ("kwargs", "num_warps", "num_stages", "num_ctas", "maxnreg")}
        wins[kernel][json.dumps(keep, sort_keys=True)] += 1
    if not wins:
        print(f"pin_fla_configs: no *.autotune.json in {a.source}", file=sys.stderr)
        return 1
    kernels = {k: json.loads(c.most_common(1)[0][0]) for k, c in sorted(wins.items())}
    doc = {"source": "fla 0.6.0 autotuned by python -m flash_kda.bench on an H200 (triton 3.6); "
                     "written by scripts/pin_fla_configs.py",
           "kernels": kernels}
    a.output.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"pin_fla_configs: {len(kernels)} kernels -> {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
