"""Correctness of one case: flash_kda (and fla) against the fp64 reference on every head.

The fp64 CPU reference (flash_kda.reference, the recurrence of docs/kda-spec.md, threaded
over (sequence, head) pairs) runs on all heads: about a second for 96 heads x 8192 tokens on
16 cores. Its result is moved to the GPU once and the errors are reduced there in float64,
because copying ~100M-element outputs to the host and widening them there costs seconds per
tensor.

Besides the relative Frobenius error over all heads, the error of each head is kept: heads
are independent, so one broken head is diluted by sqrt(H) in the all-head norm (a head 5%
off among 96 reads as 0.5%) and would pass a 1e-2 bound; the worst head is held to the same
bound.
"""

from __future__ import annotations

import math

#: Accuracy contract (docs/kda-spec.md): relative Frobenius error vs the fp64 reference at most 1e-2.
REF_BOUND = 1e-2
#: The accuracy contract: flash_kda's error at most this multiple of fla chunk_kda's on the same inputs.
FLA_RATIO_BOUND = 1.5
#: The training check's bound (bench/train.py): a gradient passes at a relative Frobenius error
#: vs the fp64 autograd reference of at most this, or at most FLA_RATIO_BOUND times fla's on the
#: same slice: gradients carry the forward's bf16 rounding through the backward (twice the
#: forward's REF_BOUND).
GRAD_BOUND = 2e-2


def combine_head_errors(num: list[float], den: list[float]) -> dict:
    """All-head and per-head relative errors from per-head Frobenius norms.

    num[h] = ||x_h - ref_h||_F, den[h] = ||ref_h||_F (float64 norms of head h over every
    other axis). Returns {"err": ||x - ref||_F / ||ref||_F over all heads, "per_head":
    [num[h] / den[h]], "worst": max per-head error, "worst_head": its index}. A zero
    denominator gives 0.0 when its numerator is 0, else inf; NaN norms give NaN errors
    (they must fail, so they are kept, not dropped by max()).
    """
    if len(num) != len(den) or not num:
        raise ValueError(f"need one numerator and denominator per head, got {len(num)} and {len(den)}")

    def ratio(n: float, d: float) -> float:
        if math.isnan(n) or math.isnan(d):
            return float("nan")
        if d == 0.0:
            return 0.0 if n == 0.0 else float("inf")
        return n / d

    per_head = [ratio(n, d) for n, d in zip(num, den)]
    total = ratio(math.sqrt(math.fsum(n * n for n in num)), math.sqrt(math.fsum(d * d for d in den)))
    nan_heads = [h for h, e in enumerate(per_head) if math.isnan(e)]
    worst_head = nan_heads[0] if nan_heads else max(range(len(per_head)), key=per_head.__getitem__)
    return {"err": total, "per_head": per_head, "worst": per_head[worst_head], "worst_head": worst_head}


def head_errors(x, ref, head_axis: int) -> dict:
    """combine_head_errors of torch tensor x against float64 tensor ref (same shape, same device).

    x of any float dtype is widened to float64 before subtracting, and the norms accumulate in
    float64 on ref's device (the GPU in the benchmark). head_axis: the heads axis (2 for out
    [B, T, H, V], 1 for states [N, H, V, K]).
    """
    import torch

    if tuple(x.shape) != tuple(ref.shape):
        raise ValueError(f"shape {tuple(x.shape)} does not match the reference's {tuple(ref.shape)}")
    other = tuple(d for d in range(ref.dim()) if d != head_axis)
    diff = x.to(device=ref.device, dtype=torch.float64) - ref
    num = torch.linalg.vector_norm(diff, dim=other)
    del diff
    den = torch.linalg.vector_norm(ref, dim=other)
    return combine_head_errors(num.tolist(), den.tolist())


def rel_err(x, ref) -> float:
    """||x - ref||_F / ||ref||_F of torch tensors, in float64 on ref's device (inf when ref
    is all zeros and x is not)."""
    import torch

    ref = ref.to(torch.float64)
    num = torch.linalg.vector_norm((x.to(device=ref.device, dtype=torch.float64) - ref).flatten()).item()
    den = torch.linalg.vector_norm(ref.flatten()).item()
    return combine_head_errors([num], [den])["err"]


#: flash_kda.reference's name of each bench gate (cases.GATES).
REFERENCE_GATE = {"safe": "safe", "softplus": "softplus", "pre": "none"}


def reference_on_device(x):
    """flash_kda.reference on every head of Inputs x, moved to x.q's device as float64 tensors.

    The gate and state layout are x.case's (the safe gate and v-first without a case).
    Returns (out [B, T, H, V], final_state [N, H, V, K] ([N, H, K, V] k-first) or None when the
    case has no state).
    """
    import torch
    import flash_kda

    with_state = x.initial_state is not None
    case = x.case
    gate = "safe" if case is None else case.gate
    out, fs = flash_kda.reference(
        x.q, x.k, x.v, x.g, x.beta,
        scale=x.scale, A_log=None if gate == "pre" else x.A_log, dt_bias=None if gate == "pre" else x.dt_bias,
        lower_bound=x.lower_bound, gate=REFERENCE_GATE[gate], use_qk_l2norm=True, use_beta_sigmoid=True,
        initial_state=x.initial_state, cu_seqlens=x.cu_seqlens_cpu,
        state_layout="v_first" if case is None else case.state_layout,
        output_final_state=with_state,
    )
    device = x.q.device
    ref_out = torch.from_numpy(out).to(device)
    del out
    ref_state = torch.from_numpy(fs).to(device) if fs is not None else None
    return ref_out, ref_state


def check_case(x, ours_out, ours_state, fla_out=None, fla_state=None) -> dict:
    """Errors of one case against the fp64 reference on all heads (relative Frobenius).

    ours_*/fla_* are device tensors over all heads (fla_* None when fla did not run or
    failed). fla's final state (always fp32) is first rounded to the case's state dtype
    (ours_state's), so a bf16 state is judged against fla's state as a bf16 caller would
    receive it. Returns a dict:
      out_err / state_err: ours vs reference, all heads;
      out_err_worst_head / state_err_worst_head, out_worst_head / state_worst_head: the
        worst head's error and its index;
      fla_out_err / fla_state_err: fla vs reference (present when fla ran);
      out_vs_fla / state_vs_fla: ours vs fla, all heads (information only, not judged);
      bound, fla_ratio_bound, passed (see verdict).
    """
    ref_out, ref_state = reference_on_device(x)
    r: dict = {"heads": "all", "bound": REF_BOUND, "fla_ratio_bound": FLA_RATIO_BOUND}

    def put(prefix: str, e: dict) -> None:
        r[f"{prefix}_err"], r[f"{prefix}_err_worst_head"], r[f"{prefix}_worst_head"] = e["err"], e["worst"], e["worst_head"]

    put("out", head_errors(ours_out, ref_out, 2))
    r["state_err"] = None
    if ref_state is not None:
        put("state", head_errors(ours_state, ref_state, 1))
    if fla_out is not None:
        r["fla_out_err"] = head_errors(fla_out, ref_out, 2)["err"]
        r["out_vs_fla"] = rel_err(ours_out, fla_out)
        if ref_state is not None and fla_state is not None:
            fla_state = fla_state.to(ours_state.dtype)
            r["fla_state_err"] = head_errors(fla_state, ref_state, 1)["err"]
            r["state_vs_fla"] = rel_err(ours_state, fla_state)
    r["passed"] = verdict(r)
    return r


def _bad(e: float) -> bool:
    return not math.isfinite(e) or e > REF_BOUND


def verdict(r: dict) -> bool:
    """True when each present error of ours (out_err, state_err, and their worst heads) is
    finite and <= REF_BOUND, and, where fla's error on the same reference is present, the
    all-head error is <= FLA_RATIO_BOUND times fla's. out_vs_fla / state_vs_fla are not
    judged: fla is a peer, not the reference."""
    for what in ("out", "state"):
        ours = r.get(f"{what}_err")
        if ours is None:
            continue
        worst = r.get(f"{what}_err_worst_head")
        if _bad(ours) or (worst is not None and _bad(worst)):
            return False
        fla = r.get(f"fla_{what}_err")
        if fla is not None and ours > FLA_RATIO_BOUND * fla:
            return False
    return True
