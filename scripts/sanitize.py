#!/usr/bin/env python3
"""Runs small cases of every flash_kda.fwd variant under NVIDIA compute-sanitizer.

Variants (the forward; chunk_kda's with its backward; the decode): fixed length (T = 1, T < 16, T off the 16-token grid), varlen with zero-length and
1-token sequences (int64 and int32 cu_seqlens), states none / bf16 / fp32, final state without
initial state, and the in-place state update; and one 4096-token backward whose reverse chain
runs in segments (the chain-segments part, in a sanitized process of its own that instruments
only the chain's passes and the segment scan). Each case is also checked against the fp64
reference (relative Frobenius error <= 1e-2), so a case that silently did nothing fails too.

Tools: memcheck (out-of-bounds and misaligned global/shared accesses, launch errors) and
racecheck (shared-memory data races). PyTorch's caching allocator is switched off in the
sanitized process (PYTORCH_NO_CUDA_MEMORY_CACHING=1) so every tensor is its own allocation and
an overrun past one is reported instead of landing silently in a neighbour.

Exit status: 0 when every tool reports 0 errors and every case passed; 1 when a tool reported
errors or a case failed; 2 when compute-sanitizer or the GPU is missing.

    python3 scripts/sanitize.py                     # both tools, logs under ./sanitize-logs
    python3 scripts/sanitize.py --tool memcheck --log-dir $OUT
    python3 scripts/sanitize.py --tool racecheck --parts backward --shard 1/2   # half the backward's cases
"""
from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

TOOLS = ("memcheck", "racecheck")
#: The case sets, in the order they run: flash_kda.fwd's and chunk_kda's forward cases, the
#: decode over a pool, the backward's cases (chunk_kda with grad; the slowest under racecheck),
#: and one backward whose reverse chain runs in segments (src/sm90/backward/layout.h
#: chain_segments takes them only from 256 chunks on).
PARTS = ("forward", "decode", "backward", "chain-segments")
#: The chain-segments case runs in a sanitized process of its own that instruments only the
#: kernels it is there for (the chain's passes and the segment scan): the whole backward of 4096
#: tokens instrumented takes longer than a sanitizer step may (racecheck: over 7 minutes), and
#: its other kernels are the backward part's, checked there.
SEGMENT_KERNELS = ("chain_kernel", "segment_scan_kernel")
DONE_MARK = "sanitize: all cases ran"


def _cases():
    from fwd_cases import Case

    mix = (0, 5, 1, 0, 17, 16, 0)
    return [
        Case("san_fixed_T33_H2_nostate", heads=2, seqlen=33, batch=2),
        Case("san_fixed_T16_H2_bf16", heads=2, seqlen=16, batch=1, state="bf16"),
        Case("san_fixed_T1_H1_fp32", heads=1, seqlen=1, batch=2, state="fp32"),
        Case("san_fixed_T7_H2_fp32", heads=2, seqlen=7, batch=2, state="fp32"),
        Case("san_fixed_T47_H2_fp32_final_only", heads=2, seqlen=47, batch=1, state="fp32", with_initial=False),
        Case("san_varlen_H2_nostate", heads=2, seq_lens=mix),
        Case("san_varlen_H2_bf16", heads=2, seq_lens=mix, state="bf16"),
        Case("san_varlen_H2_fp32_int32", heads=2, seq_lens=mix, state="fp32", cu_dtype="int32"),
        Case("san_varlen_H2_bf16_final_only", heads=2, seq_lens=mix, state="bf16", with_initial=False),
    ]


def judge_errors(label: str, errs) -> bool:
    """Prints a case's relative errors against the reference; True when all are <= 1e-2."""
    ok = all(e <= 1e-2 for e in errs)  # NaN compares False
    print(f"sanitize: {label}: {'ok' if ok else 'WRONG'} rel. errors " + ", ".join(f"{e:.2e}" for e in errs),
          flush=True)
    return ok


def run_variant_cases(torch) -> int:
    """The other entry points' forward variants, small: every chunk_kda case of
    tests/python/chunk_cases.py (gates, GVA, state layouts and dtypes, strided views, flags,
    varlen, padding) and extreme softplus and pre-computed decays (the re-based Gram forms), with
    intermediate states. Returns the number of wrong results."""
    import dataclasses

    import flash_kda
    from chunk_cases import CASES, ChunkCase, make_call, reference, rel_err

    dev = torch.device("cuda")
    wrong = 0

    def judge(label, errs) -> None:
        nonlocal wrong
        wrong += not judge_errors(label, errs)

    extreme = [ChunkCase("san_softplus_A16_large_g", gate="softplus", seqlen=40, batch=1),
               ChunkCase("san_pre_gated_unbounded", gate="none", seqlen=40, batch=1)]
    for case in [dataclasses.replace(c, seqlen=min(c.seqlen, 40)) for c in CASES] + extreme:
        args, kw, real = make_call(case, dev)
        if case.name == "san_softplus_A16_large_g":
            kw["A_log"] = torch.full_like(kw["A_log"], 2.772588722239781)  # log 16
            args = (*args[:3], args[3] * 8 + 8, *args[4:])  # softplus(g + dt_bias) of up to ~50 a token
        if case.name == "san_pre_gated_unbounded":
            args = (*args[:3], -(args[3].float().abs() * 200), *args[4:])  # log decays down to ~-1e3 a token
        with torch.inference_mode():
            out, final = flash_kda.chunk_kda(*args, **kw)
        torch.cuda.synchronize()
        ref_o, ref_s = reference(args, kw, real)
        out = out[:, :real] if kw.get("cu_seqlens") is not None else out  # rows past `real` are use_graph padding
        judge(f"chunk_kda {case.name}", [rel_err(out, ref_o)] + ([rel_err(final, ref_s)] if final is not None else []))
    # Intermediate states: fla's form (before every 64-token chunk) on a varlen batch.
    case = ChunkCase("san_intermediate", lens=(70, 0, 1, 40))
    args, kw, real = make_call(case, dev)
    with torch.inference_mode():
        out, final, h = flash_kda.chunk_kda(*args, **kw, return_intermediate_states=True)
    torch.cuda.synchronize()
    ok = bool(torch.isfinite(h.float()).all())
    wrong += not ok
    print(f"sanitize: chunk_kda intermediate states: {'ok' if ok else 'WRONG'} (finite, {tuple(h.shape)})", flush=True)
    return wrong


def run_decode_cases(torch) -> int:
    """The decode over a pool: [N] slots with padded entries and [N, T] slots with accepted
    counts, each layout and pool dtype; finite outputs and zero padded rows. Returns the number
    of wrong results."""
    import flash_kda

    dev = torch.device("cuda")
    wrong = 0
    # The decode over a pool: [N] slots with a padded (-1) entry, each layout and pool dtype,
    # one token (the one-token kernels) and two, on 10 heads (8-row warp tiles) and 136 (a bf16
    # pool's wide tiles on 132 SMs: packed for one token, split for two); k-first bf16 with two
    # tokens: the warp columns at 10 heads, the row blocks' split form at 136.
    slots = 7
    g = torch.Generator(device=dev).manual_seed(5)
    r = lambda *shape: torch.randn(*shape, generator=g, device=dev).bfloat16()
    for v_first, dtype, T, (n, heads) in itertools.product((False, True), (torch.float32, torch.bfloat16), (1, 2),
                                                           ((5, 2), (17, 8))):
        idx = torch.tensor(([3, -1, 0, 6, 2] * 4)[:n - 1] + [-1], dtype=torch.int32, device=dev)
        pool = torch.randn(slots, heads, 128, 128, generator=g, device=dev).to(dtype)
        o, _ = flash_kda.fused_recurrent_kda_fwd(
            q=r(n, T, heads, 128), k=r(n, T, heads, 128), v=r(n, T, heads, 128), g=r(n, T, heads, 128),
            beta=r(n, T, heads), A_log=torch.rand(heads, device=dev),
            dt_bias=torch.rand(heads * 128, device=dev), initial_state=pool, inplace_final_state=True,
            state_v_first=v_first, ssm_state_indices=idx, use_qk_l2norm_in_kernel=True,
            use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, lower_bound=-5.0)
        torch.cuda.synchronize()
        ok = bool(torch.isfinite(o.float()).all()) and bool((o[1] == 0).all())
        wrong += not ok
        print(f"sanitize: decode over a pool with a padded slot ({'v' if v_first else 'k'}-first, "
              f"{str(dtype).removeprefix('torch.')} pool, T = {T}, {n} x {heads} heads): "
              f"{'ok' if ok else 'WRONG'} (finite, padded row zero)", flush=True)
    # [N, T] slots with -1 and >= P entries (a skipped start, skipped token stores) and
    # accepted counts, fp32 inputs, each layout.
    n, heads, T = 5, 2, 3
    tok = torch.tensor([[0, 1, 2], [-1, 3, 4], [5, slots, 6], [slots + 2, 0, 1], [2, -1, slots]], dtype=torch.int64,
                       device=dev)
    accepted = torch.tensor([1, 2, 3, 1, 2], dtype=torch.int64, device=dev)
    f = lambda *shape: torch.randn(*shape, generator=g, device=dev)
    for v_first in (False, True):
        pool = torch.randn(slots, heads, 128, 128, generator=g, device=dev).bfloat16()
        o, _ = flash_kda.fused_recurrent_kda_fwd(
            q=f(n, T, heads, 128), k=f(n, T, heads, 128), v=f(n, T, heads, 128), g=f(n, T, heads, 128),
            beta=f(n, T, heads), A_log=torch.rand(heads, device=dev), dt_bias=torch.rand(heads * 128, device=dev),
            initial_state=pool, inplace_final_state=True, state_v_first=v_first, ssm_state_indices=tok,
            num_accepted_tokens=accepted, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
            use_beta_sigmoid_in_kernel=True, lower_bound=-5.0)
        torch.cuda.synchronize()
        ok = bool(torch.isfinite(o.float()).all()) and bool(torch.isfinite(pool.float()).all())
        wrong += not ok
        print(f"sanitize: decode with [N, T] slots, -1 and >= P entries, accepted counts, fp32 inputs "
              f"({'v' if v_first else 'k'}-first): {'ok' if ok else 'WRONG'} (finite)", flush=True)
    return wrong


def shard_cases(cases: list, shard: tuple[int, int]) -> list:
    """The cases of shard (i, n): those whose index is i modulo n, in order."""
    return [c for j, c in enumerate(cases) if j % shard[1] == shard[0]]


def run_backward_cases(torch, shard: tuple[int, int] = (0, 1)) -> int:
    """The backward (chunk_kda with grad): every chunk_kda case of tests/python/chunk_cases.py
    that the backward serves, short, each gradient against autograd through the fp64 yardstick;
    each reported by judge_errors. shard (i, n): only the cases whose index is i modulo n.
    Returns the number of wrong results."""
    import dataclasses

    from chunk_cases import CASES

    dev = torch.device("cuda")
    wrong = 0
    for case in [dataclasses.replace(c, seqlen=min(c.seqlen, 40)) for c in shard_cases(CASES, shard)]:
        wrong += check_backward_case(torch, case, dev)
    return wrong


def run_chain_segment_cases(torch) -> int:
    """One backward of 4096 tokens and one head (chunk_kda's "safe" case), whose reverse chain
    runs in eight segments of 32 chunks: its map, scan and finish launches. Returns 1 on a wrong
    result."""
    import dataclasses

    from chunk_cases import CASES

    case = dataclasses.replace(CASES[0], name="san_chain_segments_T4096_H1", seqlen=4096, batch=1, heads=1)
    return check_backward_case(torch, case, torch.device("cuda"))


def check_backward_case(torch, case, dev) -> int:
    """chunk_kda's gradients of `case` against autograd through the fp64 yardstick (judge_errors);
    1 on a wrong result, 0 otherwise or where the backward does not serve the call."""
    import flash_kda
    from chunk_cases import make_call, rel_err

    args, kw, real = make_call(case, dev)
    if kw.get("cu_seqlens") is not None and real != args[0].shape[1]:
        return 0  # use_graph padding rows: the training path takes exact batches
    extra = [n for n in ("A_log", "dt_bias", "initial_state") if kw.get(n) is not None
             and (n == "initial_state" or kw.get("use_gate_in_kernel"))]
    grads = []
    for fn, dt in ((flash_kda.chunk_kda, None), (flash_kda.autograd_reference, torch.float64)):
        leaves = [a.detach().to(dt or a.dtype).requires_grad_() for a in args[:5]]
        kws = dict(kw, **{n: kw[n].detach().to(dt or kw[n].dtype).requires_grad_() for n in extra})
        try:
            o, ht = fn(*leaves, *args[5:], **kws)
        except flash_kda.Error:
            break  # a call the backward does not serve (named error): nothing to sanitize
        gen = torch.Generator(device=dev).manual_seed(11)
        do = torch.randn(o.shape, generator=gen, device=dev)
        loss = (o.double() * do.double()).sum()
        if ht is not None:
            loss = loss + (ht.double() * torch.randn(ht.shape, generator=gen, device=dev).double()).sum()
        grads.append(torch.autograd.grad(loss, leaves + [kws[n] for n in extra]))
    torch.cuda.synchronize()
    if len(grads) == 2:
        return int(not judge_errors(f"chunk_kda backward {case.name}",
                                    [rel_err(a, b.detach().cpu().numpy()) for a, b in zip(*grads)]))
    return 0


def run_cases(parts=PARTS, shard: tuple[int, int] = (0, 1)) -> int:
    """The sanitized process: every case of the parts named (PARTS) once, the forward's with
    in-place state updates too; the backward's cases of `shard` only (run_backward_cases). 1 on
    a wrong result."""
    from fwd_cases import sm90_skip_reason

    reason = sm90_skip_reason()
    if reason:
        print(f"sanitize: cannot run: {reason}", flush=True)
        return 2
    import torch

    failures = 0
    if "forward" in parts:
        failures += run_forward_cases(torch)
    if "decode" in parts:
        failures += run_decode_cases(torch)
    if "backward" in parts:
        failures += run_backward_cases(torch, shard)
    if "chain-segments" in parts:
        failures += run_chain_segment_cases(torch)
    print(DONE_MARK if failures == 0 else f"sanitize: {failures} case(s) gave wrong results", flush=True)
    return 1 if failures else 0


def run_forward_cases(torch) -> int:
    """flash_kda.fwd's cases (fixed, varlen, states, in place), its forced launch paths, the
    chunk_kda variants (run_variant_cases) and cu_seqlens values past the end. Returns the
    number of wrong results."""
    from fwd_cases import Case, call_fwd, make_inputs, new_outputs, reference_errors

    wrong = 0

    def judge(label, x, out, final_state) -> None:
        nonlocal wrong
        wrong += not judge_errors(label, [e for e in reference_errors(x, out, final_state) if e is not None])

    for case in _cases():
        x = make_inputs(case)
        runs = [("separate", None)]
        if x.initial_state is not None:
            runs.append(("in-place", x.initial_state.clone()))
        for how, state in runs:
            out, final_state = new_outputs(x)
            if state is not None:
                final_state = state
                call_fwd(x, out, final_state, initial_state=state)
            else:
                call_fwd(x, out, final_state)
            judge(f"{case.name} ({how})", x, out, final_state)
    # Launch paths forced through fwd's launch_options: windows of 3 chunk slots (sequences
    # crossing several windows, carried state) at every recurrence block width, and the
    # segment-parallel path (3 segments, varlen with empty and 1-token sequences, both state
    # dtypes).
    from flash_kda import LaunchOptions

    forced = [(LaunchOptions(window_slots=3, recurrence_warps=w),
               Case(f"san_window3_warps{w}_fp32", heads=2, seq_lens=(40, 0, 1, 37), state="fp32"))
              for w in (4, 8)]
    forced += [(LaunchOptions(segments=3), Case(f"san_segments3_{st}", heads=2, seq_lens=(70, 0, 1, 40), state=st))
               for st in ("fp32", "bf16")]
    for options, case in forced:
        x = make_inputs(case)
        out, final_state = new_outputs(x)
        call_fwd(x, out, final_state, launch_options=options)
        torch.cuda.synchronize()
        judge(case.name, x, out, final_state)
    wrong += run_variant_cases(torch)
    # cu_seqlens values past the end (clamped on the device: no fault, results not checked).
    x = make_inputs(Case("san_bad_cu_seqlens_fp32", heads=2, seq_lens=(20, 30, 10), state="fp32"))
    x.cu_seqlens = torch.tensor([0, 20, 1 << 40, 3], dtype=torch.int64, device=x.v.device)
    out, final_state = new_outputs(x, fill=0.0)
    call_fwd(x, out, final_state)
    torch.cuda.synchronize()
    print("sanitize: san_bad_cu_seqlens_fp32: ran (values clamped; results not checked)", flush=True)
    return wrong


def _parts(text: str) -> tuple[str, ...]:
    """Parse "forward,decode" into ("forward", "decode") (names of PARTS, each once, in PARTS'
    order)."""
    names = {n.strip() for n in text.split(",") if n.strip()}
    if not names or names - set(PARTS):
        raise argparse.ArgumentTypeError(f"want case sets among {', '.join(PARTS)}; got {text!r}")
    return tuple(n for n in PARTS if n in names)


def _shard(text: str) -> tuple[int, int]:
    """Parse "1/3" into (1, 3): 0 <= I < N."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"want I/N like 0/2; got {text!r}") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"want 0 <= I < N; got {text!r}")
    return i, n


def _log_suffix(parts: tuple[str, ...], shard: tuple[int, int]) -> str:
    """What a tool's log name gets for a subset of the cases ("" for all of them), so that
    processes sharing a log folder (gpu-check's racecheck shards) keep their own logs:
    "-backward-1of2" for --parts backward --shard 1/2."""
    if parts == PARTS and shard == (0, 1):
        return ""
    return "-" + "+".join(parts) + (f"-{shard[0]}of{shard[1]}" if shard[1] > 1 else "")


def _summary_errors(tool: str, text: str):
    """Error count from compute-sanitizer's closing summary, or None if it printed none."""
    if tool == "racecheck":
        m = re.findall(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?, (\d+) warnings?\)", text)
        if m:
            return int(m[-1][0])
    m = re.findall(r"ERROR SUMMARY: (\d+) errors?", text)
    return int(m[-1]) if m else None


def _sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and os.path.exists(os.path.join(root, "bin", "compute-sanitizer")):
            return os.path.join(root, "bin", "compute-sanitizer")
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tool", choices=TOOLS, action="append", help="tool to run (repeatable; default: all)")
    ap.add_argument("--log-dir", default="sanitize-logs", help="where each tool's full output is written")
    ap.add_argument("--timeout", type=float, default=420.0, help="seconds allowed per tool")
    ap.add_argument("--parts", type=_parts, default=PARTS, metavar="PART,...",
                    help="case sets to run, among " + ", ".join(PARTS) + " (default all), e.g. backward after "
                    "a backward-only change: racecheck takes seconds for the forward's and minutes for the "
                    "backward's")
    ap.add_argument("--shard", type=_shard, default=(0, 1), metavar="I/N",
                    help="with --parts backward: only the backward cases whose index is I modulo N (default "
                    "0/1: all), so that N processes share them")
    ap.add_argument("--run-cases", action="store_true", help=argparse.SUPPRESS)  # the sanitized child
    args = ap.parse_args()
    if args.shard[1] > 1 and args.parts != ("backward",):
        ap.error("--shard splits the backward's cases: give it with --parts backward")
    if args.run_cases:
        return run_cases(args.parts, args.shard)
    suffix = _log_suffix(args.parts, args.shard)

    sanitizer = _sanitizer()
    if sanitizer is None:
        print("sanitize: compute-sanitizer not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
        return 2
    os.makedirs(args.log_dir, exist_ok=True)
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1", CUDA_MODULE_LOADING="LAZY")
    # One sanitized process per tool, but the chain-segments case gets its own, which
    # instruments only SEGMENT_KERNELS.
    specs = []
    for tool in args.tool or TOOLS:
        parts = args.parts
        if "chain-segments" in parts and len(parts) > 1:
            parts = tuple(x for x in parts if x != "chain-segments")
            specs.append((tool, ("chain-segments",), "-chain-segments"))
        # The rest keeps the plain names when it is everything else, else its own subset's name.
        specs.append((tool, parts, suffix if args.parts == PARTS else _log_suffix(parts, args.shard)))
    procs = {}
    for tool, parts, sfx in specs:
        log_path = os.path.join(args.log_dir, f"sanitize-{tool}{sfx}.log")
        cmd = [sanitizer, "--tool", tool, "--error-exitcode", "86", "--print-limit", "100"]
        if tool == "racecheck":
            cmd += ["--racecheck-report", "all"]
        if parts == ("chain-segments",):  # the filters add up: a kernel matching either is checked
            for name in SEGMENT_KERNELS:
                cmd += ["--kernel-name", f"kns={name}"]
        cmd += [sys.executable, os.path.abspath(__file__), "--run-cases", "--parts", ",".join(parts),
                "--shard", "/".join(map(str, args.shard))]
        log = open(log_path, "w")
        # The tools at once: each is bound by one process's instrumented launches, not the GPU.
        procs[tool + sfx] = (tool, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log,
                             log_path, time.monotonic())

    # A caller's own limit (timeout(1) in gpu-check's steps) sends SIGTERM: the tools still
    # running are then stopped as at --timeout, and each still gets its verdict line.
    stopped = []

    def on_term(signum, frame):
        stopped.append(signum)
        for _, proc, *_ in procs.values():
            if proc.poll() is None:
                proc.kill()

    signal.signal(signal.SIGTERM, on_term)
    status = 0
    for name, (tool, proc, log, log_path, t0) in procs.items():
        try:
            rc = proc.wait(timeout=max(1.0, args.timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
            print(f"sanitize: {name}: timed out after {args.timeout:.0f} s", flush=True)
        if stopped and rc == -signal.SIGKILL:
            print(f"sanitize: {name}: stopped by SIGTERM after {time.monotonic() - t0:.0f} s", flush=True)
        log.close()
        text = open(log_path, errors="replace").read()
        errors = _summary_errors(tool, text)
        ran = DONE_MARK in text
        ok = rc == 0 and errors == 0 and ran
        if not ok:
            status = max(status, 2 if "cannot run" in text else 1)
        print(f"sanitize: {name}: {'PASS' if ok else 'FAIL'} (exit {rc}, errors {errors}, "
              f"cases {'ran' if ran else 'did not all run'}; {time.monotonic() - t0:.0f} s; log {log_path})")
        if not ok:
            print("\n".join(text.splitlines()[-30:]))
    return status


if __name__ == "__main__":
    sys.exit(main())
