"""flash_kda.chunk_kda's intermediate states on an sm_90 GPU:
- return_intermediate_states=True returns fla 0.6.0's (o, final_state, h): h [B, NT, HV, V, K]
  (state_v_first) or [B, NT, HV, K, V] in k's dtype, h[:, i] the state before the i-th 64-token
  chunk of its sequence (varlen: B = 1, sequence n's entries from fla's chunk_offsets[n]);
  against the fp64 reference, relative Frobenius error <= 1e-2, and, where fla imports, fla's
  own h on the same inputs: the same shape and dtype, our error at most fla's (x 1.05 + 1e-4,
  the noise of two bf16 roundings of nearly equal fp32 states);
- intermediate_state_every=n returns (o, final_state, states, offsets): the states after n,
  2n, ... tokens of each sequence in initial_state's dtype, offsets cumsum(len // n), against
  the reference (<= 1e-2);
- o and final_state are those of the same call without intermediate states, bit for bit.
"""
from __future__ import annotations

import numpy as np
import pytest

from chunk_cases import ChunkCase, make_call
from fwd_cases import fla_skip_reason, fla_triton_only, pin_fla_configs

pytestmark = pytest.mark.cuda_sm90

BOUND = 1e-2
CASES = [ChunkCase("inter_fixed", batch=2, seqlen=300), ChunkCase("inter_varlen", lens=(70, 0, 1, 150, 33, 64, 200)),
         ChunkCase("inter_kfirst", lens=(130, 0, 65), state_v_first=False),
         ChunkCase("inter_bf16_state", lens=(100, 48, 0), state="bf16")]


def _lens(args, kw):
    cu = kw.get("cu_seqlens")
    if cu is None:
        return [args[0].shape[1]] * args[0].shape[0]
    cu = cu.cpu().tolist()
    return [b - a for a, b in zip(cu[:-1], cu[1:])]


def _reference_states(args, kw, every, include_initial, offsets):
    """The fp64 reference's intermediate states of a make_call call ([S, HV, ..] float64)."""
    import flash_kda

    q, k, v, g, beta = args
    HV, Kd = v.shape[2], q.shape[3]
    _, _, states, _ = flash_kda.reference(
        q, k, v, g, beta, A_log=kw.get("A_log"), dt_bias=kw["dt_bias"].view(HV, Kd), lower_bound=kw["lower_bound"],
        gate="safe", initial_state=kw.get("initial_state"), cu_seqlens=kw.get("cu_seqlens"),
        state_layout="v_first" if kw["state_v_first"] else "k_first", intermediate_every=every,
        intermediate_include_initial=include_initial, intermediate_offsets=np.asarray(offsets, np.int64))
    return np.asarray(states)


def _err(x, ref):
    x = x.float().cpu().numpy().astype(np.float64)
    return float(np.linalg.norm((x - ref).ravel()) / np.linalg.norm(ref.ravel()))


def _fla_h(args, kw):
    """fla's own chunk_kda h (Triton path) on the same call, or None when fla does not import."""
    if fla_skip_reason():
        return None
    import torch
    from fla.ops.kda import chunk_kda

    pin_fla_configs()
    fkw = dict(kw)
    if fkw.get("initial_state") is not None:
        fkw["initial_state"] = fkw["initial_state"].float()  # fla's Triton path takes fp32 states
    with fla_triton_only(), torch.inference_mode():
        return chunk_kda(*args, **fkw, return_intermediate_states=True)[2]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_return_intermediate_states_is_flas_h(case, cuda_sm90):
    import torch

    import flash_kda

    args, kw, _ = make_call(case, cuda_sm90)
    with torch.inference_mode():
        o, final_state, h = flash_kda.chunk_kda(*args, **kw, return_intermediate_states=True)
        o_plain, state_plain = flash_kda.chunk_kda(*args, **kw)
    torch.cuda.synchronize()
    assert torch.equal(o, o_plain) and torch.equal(final_state, state_plain)
    lens = _lens(args, kw)
    counts = [-(-n // 64) for n in lens]
    B = 1 if kw.get("cu_seqlens") is not None else len(lens)
    HV = args[2].shape[2]
    assert h.shape == (B, sum(counts) // B, HV, 128, 128) and h.dtype == args[1].dtype == torch.bfloat16
    offsets = np.concatenate([[0], np.cumsum(counts)])
    ref = _reference_states(args, kw, 64, True, offsets).reshape(h.shape)
    ours = _err(h, ref)
    assert ours <= BOUND, f"h error {ours:.3e}"
    fla_h = _fla_h(args, kw)
    if fla_h is not None:
        assert fla_h.shape == h.shape and fla_h.dtype == h.dtype
        theirs = _err(fla_h, ref)
        assert ours <= 1.05 * theirs + 1e-4, f"ours {ours:.3e} vs fla {theirs:.3e}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("every", [16, 48])
def test_intermediate_state_every(case, every, cuda_sm90):
    import torch

    import flash_kda

    args, kw, _ = make_call(case, cuda_sm90)
    with torch.inference_mode():
        o, final_state, states, offsets = flash_kda.chunk_kda(*args, **kw, intermediate_state_every=every)
        o_plain, state_plain = flash_kda.chunk_kda(*args, **kw)
    torch.cuda.synchronize()
    assert torch.equal(o, o_plain) and torch.equal(final_state, state_plain)
    counts = [n // every for n in _lens(args, kw)]
    want = np.concatenate([[0], np.cumsum(counts)])
    assert offsets.device == args[0].device and offsets.dtype == torch.int64
    assert offsets.cpu().tolist() == want.tolist()
    init = kw.get("initial_state")
    assert states.dtype == (init.dtype if init is not None else torch.float32)
    assert states.shape == (want[-1], args[2].shape[2], 128, 128)
    ref = _reference_states(args, kw, every, False, want)
    err = _err(states, ref)
    assert err <= BOUND, f"states error {err:.3e}"
