"""--train: one training step (forward + backward) of flash_kda.chunk_kda against fla's
chunk_kda (Triton path, FLA_FLASH_KDA=0), per case, on the same inputs in the same run.

Per case (inputs as the forward's: inputs.make_inputs, each differentiable input copied into a
leaf that requires grad, the same values for both implementations): the eager time of
forward + backward (torch.autograd.grad of out and the final state against fixed random
gradients, so that nothing accumulates into .grad between calls; timing.time_eager: CUDA
events, warm-up, medians); the bytes each forward saves for its backward (unique storages of
the tensors autograd saves, torch.autograd.graph.saved_tensors_hooks; in total and beyond the
call's own inputs); and a light gradient check on a slice of the case (its first
CHECK_TOKENS tokens of the first sequence, CHECK_HEADS heads): every gradient of both
implementations against autograd through flash_kda.autograd_reference, the fp64 evaluation
of the recurrence (docs/kda-spec.md "Backward"), skipped with a note when this flash_kda has
none.

Result entries (the record's `train` list): {"case": Case.to_dict(), "times": {"flash_kda" |
"fla": {"eager": summary}} (ms of forward + backward), "saved_bytes": {impl: bytes},
"saved_bytes_beyond_inputs": {impl: bytes}, "check": {"tokens", "heads", "errors": {impl:
{grad name: rel. error}}, "worst": ours' worst, "bound", "passed"} | None, "check_note": why
the check did not run | absent, "errors": {what: message}}.
"""

from __future__ import annotations

import dataclasses
import math

from . import check as check_mod
from . import impls, inputs, timing

#: The differentiable inputs of chunk_kda, in its gradients' order.
GRAD_INPUTS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state")
#: The gradient check's slice of a case: tokens of its first sequence and heads.
CHECK_TOKENS = 256
CHECK_HEADS = 4
#: Seed of the random output gradients (d out, d final state).
GRAD_SEED = 1234


def differentiable(kw: dict) -> tuple[dict, list[str]]:
    """chunk_kda keyword arguments with each differentiable input (GRAD_INPUTS present and read
    by the call: A_log and dt_bias only with use_gate_in_kernel) replaced by a detached copy
    that requires grad; returns (kwargs, the names of those inputs)."""
    kw = dict(kw)
    names = []
    for name in GRAD_INPUTS:
        t = kw.get(name)
        if t is None or (name in ("A_log", "dt_bias") and not kw.get("use_gate_in_kernel")):
            continue
        kw[name] = t.detach().clone().requires_grad_()
        names.append(name)
    return kw, names


def output_gradients(out, final_state, seed: int = GRAD_SEED) -> tuple:
    """Fixed random gradients for out (its dtype) and the final state (fp32, or None)."""
    import torch

    gen = torch.Generator(out.device).manual_seed(seed)
    d_out = torch.randn(out.shape, generator=gen, device=out.device, dtype=torch.float32).to(out.dtype)
    d_final = None
    if final_state is not None:
        d_final = torch.randn(final_state.shape, generator=gen, device=final_state.device,
                              dtype=torch.float32).to(final_state.dtype)
    return d_out, d_final


def fixed_output_gradients(fn, kw: dict) -> tuple:
    """output_gradients for the outputs of one no-grad call fn(**kw) (kw's tensors detached):
    the gradients a case's steps are timed and profiled with."""
    import torch

    with torch.no_grad():
        out, final_state = fn(**{n: t.detach() if isinstance(t, torch.Tensor) else t for n, t in kw.items()})[:2]
    return output_gradients(out, final_state)


def step(fn, kw: dict, names: list[str], d_out, d_final) -> tuple:
    """One forward + backward: fn(**kw) then torch.autograd.grad of (out, final state) against
    (d_out, d_final) with respect to kw's inputs `names`. Returns the gradients."""
    import torch

    out, final_state = fn(**kw)[:2]
    outs, grads = [out], [d_out]
    if final_state is not None and d_final is not None:
        outs.append(final_state)
        grads.append(d_final)
    return torch.autograd.grad(outs, [kw[n] for n in names], grads)


def saved_bytes(fn, kw: dict) -> tuple[int, int]:
    """(bytes autograd saves for the backward of fn(**kw), those beyond kw's own tensors): the
    unique storages of every saved tensor (torch.autograd.graph.saved_tensors_hooks), so that
    views and a tensor saved twice count once."""
    import torch

    storages: dict = {}

    def pack(t):
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn(**kw)
    del result
    own = {t.untyped_storage().data_ptr() for t in kw.values() if isinstance(t, torch.Tensor)}
    total = sum(storages.values())
    return total, sum(n for p, n in storages.items() if p not in own)


def flash_kda_call(**kw):
    """flash_kda.chunk_kda (looked up at call time)."""
    import flash_kda

    return flash_kda.chunk_kda(**kw)


def fla_call(**kw):
    """fla's chunk_kda with its FlashKDA backend switched off (the Triton path, forward and
    backward)."""
    from fla.ops.kda import chunk_kda

    with impls.fla_flash_kda_backend(False):
        return chunk_kda(**kw)


def check_slice(x: inputs.Inputs, tokens: int = CHECK_TOKENS, heads: int = CHECK_HEADS) -> inputs.Inputs:
    """The gradient check's inputs: the first `tokens` tokens of x's first sequence and its
    first `heads` heads, as one fixed-length sequence (contiguous copies)."""
    case = x.case
    first = case.seqlens[0] if case is not None and case.seqlens else (case.T if case is not None else x.q.shape[1])
    t, h = min(tokens, first), min(heads, x.q.shape[2])
    cut = lambda a: a[:1, :t, :h].contiguous()
    state = x.initial_state[:1, :h].contiguous() if x.initial_state is not None else None
    return dataclasses.replace(x, q=cut(x.q), k=cut(x.k), v=cut(x.v), g=cut(x.g), beta=cut(x.beta),
                               A_log=x.A_log[:h].contiguous(), dt_bias=x.dt_bias[:h].contiguous(),
                               initial_state=state, cu_seqlens=None, cu_seqlens_cpu=None)


def _host64(kw: dict) -> dict:
    import torch

    return {n: (t.detach().to("cpu", torch.float64) if t.is_floating_point() else t.cpu())
            if isinstance(t, torch.Tensor) else t for n, t in kw.items()}


def check_gradients(x: inputs.Inputs, use_fla: bool) -> tuple[dict | None, str | None]:
    """(check, None), or (None, why it did not run): every gradient of flash_kda (and fla) on
    check_slice(x) against autograd through flash_kda.autograd_reference in fp64 on the host."""
    import flash_kda

    reference = getattr(flash_kda, "autograd_reference", None)
    if reference is None:
        return None, "skipped: flash_kda.autograd_reference (the fp64 autograd yardstick) is not in this build"
    small = check_slice(x)
    base = impls.chunk_kda_kwargs(small)
    if base["initial_state"] is not None:
        base["initial_state"] = base["initial_state"].float()  # fla's rule; the check's state is fp32
    kw, names = differentiable(base)
    out, final_state = flash_kda_call(**{n: t.detach() if hasattr(t, "detach") else t for n, t in kw.items()})[:2]
    d_out, d_final = output_gradients(out, final_state)
    ref_kw, _ = differentiable(_host64(base))
    try:
        ref = step(reference, ref_kw, names, d_out.double().cpu(),
                   None if d_final is None else d_final.double().cpu())
    except Exception as e:  # the yardstick's call differs from chunk_kda's: say so, judge nothing
        return None, f"skipped: flash_kda.autograd_reference raised {type(e).__name__}: {e}"
    impl_fns = [("flash_kda", flash_kda_call)] + ([("fla", fla_call)] if use_fla else [])
    errors = {}
    for label, fn in impl_fns:
        kw, _ = differentiable(base)
        grads = step(fn, kw, names, d_out, d_final)
        errors[label] = {f"d{n}": check_mod.rel_err(g, r) for n, g, r in zip(names, grads, ref)}
    ours = errors["flash_kda"]
    worst = max(ours.values())
    passed = all(math.isfinite(e) and (e <= check_mod.GRAD_BOUND or ("fla" in errors and e <= check_mod.FLA_RATIO_BOUND
                                                          * errors["fla"][n]))
                 for n, e in ours.items())
    return {"tokens": int(small.q.shape[1]), "heads": int(small.q.shape[2]), "errors": errors, "worst": worst,
            "bound": check_mod.GRAD_BOUND, "fla_ratio_bound": check_mod.FLA_RATIO_BOUND, "passed": passed}, None


def run_train_case(case, args, use_fla: bool) -> dict:
    """Time, measure and check one case's training step; returns its `train` entry."""
    import torch

    from . import suite

    x = inputs.make_inputs(case, seed=args.seed)
    base = impls.chunk_kda_kwargs(x)
    result: dict = {"case": case.to_dict(), "times": {}, "saved_bytes": {}, "saved_bytes_beyond_inputs": {},
                    "check": None, "errors": {}}
    impl_fns = [("flash_kda", flash_kda_call)] + ([("fla", fla_call)] if use_fla else [])
    d_out = d_final = None
    for label, fn in impl_fns:
        kw, names = differentiable(base)
        try:
            with impls.count_flash_kda_calls() as calls:
                if d_out is None:
                    d_out, d_final = fixed_output_gradients(fn, kw)
                # The first step of a shape also pays fla's Triton autotuning, out of the timings.
                step(fn, kw, names, d_out, d_final)
                torch.cuda.synchronize()
            if label == "fla" and calls[0]:
                raise RuntimeError(f"fla dispatched to flash_kda although {impls.FLA_ENV}=0; not timed")
            result["saved_bytes"][label], result["saved_bytes_beyond_inputs"][label] = saved_bytes(fn, kw)
            suite.progress(f"{case.name}: timing {label} forward + backward")
            ms = timing.time_eager(lambda: step(fn, kw, names, d_out, d_final), args.warmup, args.iters)
            result["times"][label] = {"eager": timing.summarize(ms)}
        except Exception as e:
            result["errors"][label] = f"{type(e).__name__}: {e}"
        del kw
    if not args.no_check and "flash_kda" not in result["errors"]:
        try:
            result["check"], note = check_gradients(x, use_fla and "fla" not in result["errors"])
            if note is not None:
                result["check_note"] = note
        except Exception as e:
            result["errors"]["check"] = f"{type(e).__name__}: {e}"
    for what, msg in result["errors"].items():
        suite.progress(f"{case.name}: {what} failed: {msg}")
    del x, base
    torch.cuda.empty_cache()
    return result


def profile_train_kernels(case, args, result: dict) -> None:
    """--kernels with --train, for one timed case: the per-kernel device time of flash_kda's
    forward + backward step on the inputs and output gradients run_train_case timed, through
    suite.profile_into (its result keys and failure rule)."""
    from . import suite

    x = inputs.make_inputs(case, seed=args.seed)

    def step_fn():
        kw, names = differentiable(impls.chunk_kda_kwargs(x))
        d_out, d_final = fixed_output_gradients(flash_kda_call, kw)
        return lambda: step(flash_kda_call, kw, names, d_out, d_final)
    suite.profile_into(result, case.name, step_fn)


def run_train_suite(args, meta: dict, on_case=None) -> dict:
    """Every case of args.cases as a training step. Returns {"meta", "settings", "planned_train",
    "cases": [], "train": [run_train_case results]}; on_case(results) after each case. With
    args.kernels, every case timed is then profiled (profile_train_kernels), after all the
    timings, as the forward suite does."""
    import torch

    from . import suite

    use_fla = not args.no_fla and meta.get("fla") not in (None, "not installed")
    profile = getattr(args, "kernels", False)
    torch.manual_seed(args.seed)
    results = {"meta": meta, "settings": {"iters": args.iters, "warmup": args.warmup, "seed": args.seed,
                                          "fla": use_fla, "check_tokens": CHECK_TOKENS, "check_heads": CHECK_HEADS,
                                          **({"kernel_calls": suite.KERNEL_CALLS} if profile else {})},
               "planned_train": len(args.cases), "cases": [], "train": []}
    for i, case in enumerate(args.cases, 1):
        suite.progress(f"[{i}/{len(args.cases)}] train {case.name}: T_total {case.total_tokens}, H {case.heads}, "
                       f"{case.num_seqs} seq(s), {case.variant_label()}")
        results["train"].append(run_train_case(case, args, use_fla))
        if on_case is not None:
            on_case(results)
    if profile:
        suite.profile_pass(args, results, "train", profile_train_kernels, on_case)
    return results


def case_failed(r: dict) -> bool:
    """A training case fails when its gradient check failed or errored, or flash_kda's own
    step raised; fla's errors are reported, not failures."""
    if r.get("check") is not None and not r["check"].get("passed", False):
        return True
    return any(what in ("check", "flash_kda") for what in r.get("errors", {}))
