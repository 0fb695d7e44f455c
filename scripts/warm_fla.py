#!/usr/bin/env python3
"""Compiles fla `chunk_kda`'s Triton kernels for the benchmark's cases, several cases at once.

On a fresh machine `python -m flash_kda.bench` spends most of its time in fla's autotuner
compiling every candidate configuration, one after another (~100 s per new head count). Run
this first and the compiled kernels are in TRITON_CACHE_DIR when the benchmark autotunes, so
it only times the candidates. The autotune choices made here, with several processes sharing
the GPU, are not kept (FLA_CACHE_RESULTS=0): the benchmark makes its own on a quiet GPU.

    python3 scripts/warm_fla.py [--jobs 8] [--cases h96_fixed_8192,...] [--train]

With --train it runs fla's forward + backward, the step of `python -m flash_kda.bench --train`,
whose Triton backward compiles far longer than the forward (minutes per case on a fresh
machine): run it beside the GPU tests, then the training benchmark in the same session.
Exit status: 0 when every case ran, 1 otherwise, 2 without torch/fla/CUDA.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import functools
import multiprocessing as mp
import os
import sys
import time


def _warm(name: str, train: bool = False) -> tuple[str, float, str]:
    t0 = time.monotonic()
    try:
        import torch
        from flash_kda.bench import cases, impls, inputs

        x = inputs.make_inputs(cases.select_cases([name])[0])
        if train:
            from flash_kda.bench import train as bench_train

            kw, names = bench_train.differentiable(impls.chunk_kda_kwargs(x))
            with torch.no_grad():
                out, final_state = bench_train.fla_call(
                    **{n: t.detach() if isinstance(t, torch.Tensor) else t for n, t in kw.items()})[:2]
            d_out, d_final = bench_train.output_gradients(out, final_state)
            bench_train.step(bench_train.fla_call, kw, names, d_out, d_final)
        else:
            call, _ = impls.fla_fn(x)
            call()
        torch.cuda.synchronize()
        return name, time.monotonic() - t0, "ok"
    except Exception as err:  # reported per case; the others still run
        return name, time.monotonic() - t0, f"{type(err).__name__}: {err}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=8, help="processes at once")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: the standard suite)")
    ap.add_argument("--train", action="store_true", help="fla's forward + backward (the --train benchmark's step)")
    a = ap.parse_args()
    try:
        import torch  # noqa: F401
        import fla  # noqa: F401
        from flash_kda.bench import cases
    except ImportError as err:
        print(f"warm_fla: cannot run: {err}")
        return 2
    names = [n for n in a.cases.split(",") if n] or [c.name for c in cases.standard_suite()]
    os.environ["FLA_CACHE_RESULTS"] = "0"  # read by fla at import, in the spawned children
    failed = 0
    with cf.ProcessPoolExecutor(max_workers=a.jobs, mp_context=mp.get_context("spawn")) as ex:
        for name, secs, status in ex.map(functools.partial(_warm, train=a.train), names):
            failed += status != "ok"
            print(f"warm_fla: {name}: {status} in {secs:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
