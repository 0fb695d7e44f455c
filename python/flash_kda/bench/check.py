"""Correctness of one case: flash_kda (and fla) against the fp64 reference on sampled heads.

The fp64 CPU reference (flash_kda.reference, the recurrence of docs/kda-spec.md) costs
O(T_total * heads * K * V) on the host, so it runs on a few heads only. Heads are
independent (HV = H, each value head has its own q/k head, A_log and dt_bias entry), so the
reference on sliced heads is exact for those heads' outputs and final states; a token prefix
would not be (the final state needs every token).
"""

from __future__ import annotations

import numpy as np

#: Accuracy contract of issue 3: relative Frobenius error vs the fp64 reference at most 1e-2.
REF_BOUND = 1e-2
#: Issue 3: flash_kda's error at most this multiple of fla chunk_kda's on the same inputs.
FLA_RATIO_BOUND = 1.5


def rel_err(x, ref) -> float:
    """||x - ref||_F / ||ref||_F in float64 (inf when ref is all zeros and x is not)."""
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    den = np.linalg.norm(ref)
    num = np.linalg.norm(x - ref)
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return float(num / den)


def sample_heads(heads: int, count: int = 2) -> list[int]:
    """Heads the reference checks: the first and the last (spreads across blocks), up to `count`."""
    if heads <= count:
        return list(range(heads))
    picks = [round(i * (heads - 1) / (count - 1)) for i in range(count)]
    return sorted(set(picks))


def _host(t):
    return t.detach().to("cpu").float().numpy() if t is not None else None


def reference_on_heads(x, heads: list[int]):
    """flash_kda.reference on heads `heads` of Inputs x. Returns (out, final_state) float64
    numpy arrays shaped like out[..., heads, :] and final_state[:, heads] (state None if absent)."""
    import flash_kda

    idx = list(heads)
    init = x.initial_state[:, idx].contiguous().cpu() if x.initial_state is not None else None
    out, fs = flash_kda.reference(
        x.q[:, :, idx].contiguous().cpu(), x.k[:, :, idx].contiguous().cpu(),
        x.v[:, :, idx].contiguous().cpu(), x.g[:, :, idx].contiguous().cpu(),
        x.beta[:, :, idx].contiguous().cpu(),
        scale=x.scale, A_log=x.A_log[idx].contiguous().cpu(), dt_bias=x.dt_bias[idx].contiguous().cpu(),
        lower_bound=x.lower_bound, gate="safe", use_qk_l2norm=True, use_beta_sigmoid=True,
        initial_state=init, cu_seqlens=x.cu_seqlens_cpu, state_layout="v_first",
        output_final_state=init is not None,
    )
    return np.asarray(out), (np.asarray(fs) if fs is not None else None)


def check_case(x, ours_out, ours_state, fla_out=None, fla_state=None, heads: list[int] | None = None) -> dict:
    """Errors of one case (all relative Frobenius).

    ours_*/fla_* are device tensors over all heads (fla_* None when fla did not run). Returns
    a dict: heads, out_err / state_err (ours vs fp64 reference on `heads`), fla_out_err /
    fla_state_err (fla vs reference), out_vs_fla / state_vs_fla (ours vs fla, all heads),
    bound, passed (ours within REF_BOUND and, with fla, within FLA_RATIO_BOUND x fla's error).
    """
    heads = heads if heads is not None else sample_heads(x.q.shape[2])
    ref_out, ref_state = reference_on_heads(x, heads)
    r: dict = {"heads": heads, "bound": REF_BOUND, "fla_ratio_bound": FLA_RATIO_BOUND}
    r["out_err"] = rel_err(_host(ours_out[:, :, heads]), ref_out)
    r["state_err"] = rel_err(_host(ours_state[:, heads]), ref_state) if ref_state is not None else None
    if fla_out is not None:
        r["fla_out_err"] = rel_err(_host(fla_out[:, :, heads]), ref_out)
        r["out_vs_fla"] = rel_err(_host(ours_out), _host(fla_out))
        if ref_state is not None and fla_state is not None:
            r["fla_state_err"] = rel_err(_host(fla_state[:, heads]), ref_state)
            r["state_vs_fla"] = rel_err(_host(ours_state), _host(fla_state))
    r["passed"] = verdict(r)
    return r


def verdict(r: dict) -> bool:
    """True when every present error of ours is finite, <= REF_BOUND, and (with fla) <=
    FLA_RATIO_BOUND times fla's error on the same reference."""
    pairs = [("out_err", "fla_out_err"), ("state_err", "fla_state_err")]
    for ours_key, fla_key in pairs:
        ours = r.get(ours_key)
        if ours is None:
            continue
        if not np.isfinite(ours) or ours > REF_BOUND:
            return False
        fla = r.get(fla_key)
        if fla is not None and ours > FLA_RATIO_BOUND * fla:
            return False
    return True
