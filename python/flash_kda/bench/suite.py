"""Runs the kernel benchmark: per case, check then time flash_kda and fla on the same inputs."""

from __future__ import annotations

import sys

import contextlib

from . import anchors, cases as cases_mod, check, impls, inputs, kernels, timing

#: Back-to-back eager calls whose wall-clock time gives a case's host time per call: well below
#: the launch queue's depth, so that a device-bound call does not make the host wait.
HOST_CALLS = 100
#: Profiled eager calls of --kernels (kernels.kernel_times_us): their mean per kernel.
KERNEL_CALLS = 20


def progress(msg: str) -> None:
    """One progress line on stderr (the table goes to stdout)."""
    print(f"[flash_kda.bench] {msg}", file=sys.stderr, flush=True)


def _timed(label: str, fn, args, graph_calls: int = 1) -> tuple[dict, dict]:
    """Eager and graph timing summaries of fn (graph_calls calls captured per graph, the time
    per call; timing.time_graph); an exception becomes an "error" entry."""
    res: dict = {}
    errors: dict = {}
    try:
        res["eager"] = timing.summarize(timing.time_eager(fn, args.warmup, args.iters))
    except Exception as e:
        errors[f"{label} eager"] = f"{type(e).__name__}: {e}"
    if not args.no_graph:
        try:
            res["graph"] = timing.summarize(timing.time_graph(fn, args.warmup, args.iters, graph_calls))
        except Exception as e:
            errors[f"{label} graph"] = f"{type(e).__name__}: {e}"
    return res, errors


def _check(x, ours, ours_outputs, fla_call, fla_res, result: dict):
    """The checked calls and check_case, filling result["check"] and result["errors"].

    Our call and the check share the "check" error key (a failure there fails the case);
    fla's checked call has its own key, "fla check" (reported, never a failure: see
    main.case_failed), and a failing fla leaves our check to run without fla's columns.
    Returns fla_call, or None when fla raised or did not take its Triton path (so that it is
    not timed: its times would not be fla's).
    """
    import torch

    try:
        ours()
        torch.cuda.synchronize()
        ours_out, ours_state = ours_outputs()
    except Exception as e:
        result["errors"]["check"] = f"{type(e).__name__}: {e}"
        return fla_call
    fla_out = fla_state = None
    if fla_call is not None:
        try:
            # This first call of the shape also pays fla's Triton autotuning, out of the timings.
            with impls.count_flash_kda_calls() as calls:
                fla_call()
            torch.cuda.synchronize()
            if calls[0]:
                raise RuntimeError(f"fla dispatched to flash_kda although {impls.FLA_ENV}=0; not timed")
            fla_out, fla_state = fla_res["out"], fla_res["final_state"]
        except Exception as e:
            result["errors"]["fla check"] = f"{type(e).__name__}: {e}"
            fla_call = None
    try:
        result["check"] = check.check_case(x, ours_out, ours_state, fla_out, fla_state)
    except Exception as e:
        result["errors"]["check"] = f"{type(e).__name__}: {e}"
    return fla_call


def run_case(case: cases_mod.Case, args, copy_bw: float, use_fla: bool) -> dict:
    """Check and time one case. Returns its JSON-ready result (see report.py for the fields)."""
    import torch

    x = inputs.make_inputs(case, seed=args.seed)
    result: dict = {
        "case": case.to_dict(),
        "floor_bytes": cases_mod.hbm_floor_bytes(case),
        "floor_ms": cases_mod.floor_ms(case, copy_bw),
        "anchor": anchors.anchor_for(case.name) if case.state == "fp32" and case.plain else None,
        "times": {},
        "errors": {},
        "check": None,
    }
    fla_call, fla_res = impls.fla_fn(x) if use_fla else (None, None)
    try:
        ours, ours_outputs = impls.flash_kda_fn(x, getattr(args, "num_sms", None))
    except ValueError as e:  # a variant flash_kda's entry points cannot express
        result["errors"]["flash_kda"] = str(e)
        ours = ours_outputs = None

    with torch.inference_mode():
        if not args.no_check:
            progress(f"{case.name}: checking against the fp64 reference (all {case.heads} heads)")
            if ours is not None:
                fla_call = _check(x, ours, ours_outputs, fla_call, fla_res, result)
        if ours is not None:
            progress(f"{case.name}: timing flash_kda")
            result["times"]["flash_kda"], errs = _timed("flash_kda", ours, args)
            result["errors"].update(errs)
            try:  # what an eager call costs the host: beside the eager time, says if it is host-bound
                result["host_us"] = {"flash_kda": timing.host_us_per_call(ours, HOST_CALLS)}
            except Exception as e:
                result["errors"]["flash_kda host"] = f"{type(e).__name__}: {e}"
        if fla_call is not None:
            progress(f"{case.name}: timing fla chunk_kda (Triton)")
            result["times"]["fla"], errs = _timed("fla", fla_call, args)
            result["errors"].update(errs)
    for k, msg in result["errors"].items():
        progress(f"{case.name}: {k} failed: {msg}")
    del x, ours, ours_outputs, fla_res
    torch.cuda.empty_cache()
    return result


def profile_into(result: dict, name: str, make_fn) -> None:
    """result["kernels_us"]["flash_kda"] = kernels.kernel_times_us of the call make_fn() returns,
    over KERNEL_CALLS calls; a failure (e.g. CUPTI held by another profiler) goes to
    result["errors"]["kernels"], which is reported but does not fail the case
    (main.case_failed, train.case_failed)."""
    import torch

    try:
        result["kernels_us"] = {"flash_kda": kernels.kernel_times_us(make_fn(), KERNEL_CALLS)}
    except Exception as e:
        result["errors"]["kernels"] = f"{type(e).__name__}: {e}"
        progress(f"{name}: kernels failed: {result['errors']['kernels']}")
    torch.cuda.empty_cache()


def profile_kernels(case: cases_mod.Case, args, result: dict) -> None:
    """--kernels for one timed case: flash_kda's per-kernel device time on the case's inputs
    (the same seed, so the same inputs), eager calls under inference mode (profile_into)."""
    import torch

    x = inputs.make_inputs(case, seed=args.seed)

    def inference_fn():
        ours, _ = impls.flash_kda_fn(x, getattr(args, "num_sms", None))

        def call():
            with torch.inference_mode():
                return ours()
        return call
    profile_into(result, case.name, inference_fn)


def profile_pass(args, results: dict, section: str, profile_one, on_case=None) -> None:
    """The --kernels pass after every timing (the profiler's CUPTI setup would otherwise sit
    between the timed calls of the cases after it): profile_one(case, args, result) for each
    case of results[section] that flash_kda was timed on, on_case(results) after each."""
    entries = results[section]
    for i, (case, result) in enumerate(zip(args.cases, entries), 1):
        if "flash_kda" not in result["times"]:
            continue
        progress(f"[{i}/{len(entries)}] {case.name}: per-kernel device time of flash_kda (torch.profiler)")
        profile_one(case, args, result)
        if on_case is not None:
            on_case(results)


def run_suite(args, meta: dict, on_case=None) -> dict:
    """The whole kernel benchmark: copy bandwidth, then every case of args.cases.

    Returns {"meta", "copy_bandwidth", "anchor_source", "settings", "cases": [run_case
    results], "planned_cases"}. on_case(results), when given, is called after each case with
    the results so far (so a run stopped by a time limit still leaves the finished cases).
    """
    import torch

    profile = getattr(args, "kernels", False)
    use_fla = not args.no_fla and meta.get("fla") not in (None, "not installed")
    if not args.no_fla and not use_fla:
        progress("fla is not installed: timing flash_kda only (pip install flash-linear-attention to compare)")
    progress("measuring device-to-device copy bandwidth")
    copy_bw = timing.copy_bandwidth()
    progress(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + write)")
    torch.manual_seed(args.seed)
    results = {
        "meta": meta,
        "copy_bandwidth": copy_bw,
        "anchor_source": anchors.ANCHOR_SOURCE,
        "settings": {"iters": args.iters, "warmup": args.warmup, "seed": args.seed, "fla": use_fla,
                     "num_sms": getattr(args, "num_sms", None),
                     **({"kernel_calls": KERNEL_CALLS} if profile else {})},
        "planned_cases": len(args.cases),
        "cases": [],
    }
    stream_ctx = contextlib.nullcontext()
    if getattr(args, "num_sms", None) is not None:
        from . import partition

        part = partition.Partition(args.num_sms)
        results["partition"] = partition.confinement(part)
        progress(f"green context of {args.num_sms} SMs: bf16 matmul {results['partition']['ratio']:.2f}x "
                 f"slower than on the whole device ({results['partition']['sm_ratio']:.2f}x fewer SMs)")
        stream_ctx = torch.cuda.stream(part.stream)
    with stream_ctx:
        for i, case in enumerate(args.cases, 1):
            progress(f"[{i}/{len(args.cases)}] {case.name}: T_total {case.total_tokens}, H {case.heads}, "
                     f"{case.num_seqs} seq(s), {case.variant_label()}")
            results["cases"].append(run_case(case, args, copy_bw, use_fla))
            if on_case is not None:
                on_case(results)
        if profile:
            profile_pass(args, results, "cases", profile_kernels, on_case)
    return results
