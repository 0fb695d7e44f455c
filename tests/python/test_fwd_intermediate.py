"""flash_kda.fwd's intermediate (prefix-cache) states: intermediate_states / intermediate_offsets /
intermediate_every / intermediate_include_initial (C++ ForwardArgs, include/flash_kda/forward.h).

- Every recurrence path (the plan's; windows of 3 slots that sequences cross; 3 segments;
  4-warp blocks), fixed length with a partial last chunk and varlen with empty, 1-token and
  partial sequences, bf16 and fp32 states, fla's form (every 64 with the initial state, one row
  per started 64-token chunk) and the every-n form (without the initial state, one spare row
  per sequence that must stay untouched): the written rows against the fp64 reference
  (flash_kda.reference(intermediate_every=...)), relative Frobenius error <= 1e-2; out and
  final_state bit-identical to the same call without intermediate states.
- fla's own h (chunk_kda(return_intermediate_states=True), fla 0.6.0, Triton path): ours in
  the same shape [B, NT, HV, V, K] and dtype (bf16), and its error against the fp64 reference at
  most fla's (x 1.05 + 1e-4, for the rounding noise of two bf16 roundings of nearly equal fp32
  states).
"""
from __future__ import annotations

import numpy as np
import pytest

from fwd_cases import (Case, call_fwd, fla_skip_reason, fla_triton_only, make_inputs, new_outputs, pin_fla_configs,
                       rel_err)

from flash_kda import LaunchOptions

pytestmark = pytest.mark.cuda_sm90

BOUND = 1e-2
PATHS = {"plan": None, "windows3": LaunchOptions(window_slots=3), "segments3": LaunchOptions(segments=3),
         "warps4": LaunchOptions(segments=1, recurrence_warps=4)}
CASES = {"fixed": dict(seqlen=300, batch=2), "varlen": dict(seq_lens=(70, 0, 1, 150, 33, 64, 200))}


def _lens(x):
    return [x.starts[n + 1] - x.starts[n] for n in range(len(x.starts) - 1)]


def _rows(x, every, include_initial, fla_rows):
    """(offsets [N + 1] int64, reached [S] bool): fla's ceil(len / 64) rows, or every reachable
    state plus one spare row per sequence."""
    counts, reached = [], []
    for n in _lens(x):
        reach = n // every + (1 if include_initial else 0)
        count = -(-n // 64) if fla_rows else reach + 1
        counts.append(count)
        reached += [j < reach for j in range(count)]
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), np.array(reached, dtype=bool)


def _run(x, every, include_initial, offsets, dtype, launch_options):
    """flash_kda.fwd with NaN-filled intermediate states of S = offsets[-1] rows; returns
    (out, final_state, states) on the device."""
    import torch
    import flash_kda

    out, final_state = new_outputs(x)
    states = torch.full((int(offsets[-1]), x.case.hv, 128, 128), float("nan"), dtype=dtype, device=x.v.device)
    flash_kda.fwd(x.q, x.k, x.v, x.g, x.beta, x.scale, out, x.A_log, x.dt_bias, x.lower_bound,
                  initial_state=x.initial_state, final_state=final_state, cu_seqlens=x.cu_seqlens,
                  launch_options=launch_options, intermediate_states=states,
                  intermediate_offsets=torch.as_tensor(offsets, device=x.v.device), intermediate_every=every,
                  intermediate_include_initial=include_initial)
    torch.cuda.synchronize()
    return out, final_state, states


def _reference_states(x, every, include_initial, offsets):
    """The fp64 reference's intermediate states [S, HV, V, K] (v-first)."""
    import flash_kda

    def host(t):
        return None if t is None else t.detach().to("cpu").contiguous()

    cu = None if x.cu_seqlens is None else np.asarray(x.starts, dtype=np.int64)
    _, _, states, _ = flash_kda.reference(
        host(x.q), host(x.k), host(x.v), host(x.g), host(x.beta), scale=x.scale, A_log=host(x.A_log),
        dt_bias=host(x.dt_bias), lower_bound=x.lower_bound, initial_state=host(x.initial_state), cu_seqlens=cu,
        intermediate_every=every, intermediate_include_initial=include_initial, intermediate_offsets=offsets)
    return np.asarray(states)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("kind", list(CASES))
@pytest.mark.parametrize("state", ["bf16", "fp32"])
@pytest.mark.parametrize("form", ["fla", "every48"])
def test_against_reference_on_every_path(path, kind, state, form):
    import torch

    every, include_initial, fla_rows = (64, True, True) if form == "fla" else (48, False, False)
    x = make_inputs(Case(f"inter_{kind}_{state}_{form}", heads=2, state=state, **CASES[kind]))
    offsets, reached = _rows(x, every, include_initial, fla_rows)
    dtype = torch.bfloat16 if state == "bf16" else torch.float32
    out, final_state, states = _run(x, every, include_initial, offsets, dtype, PATHS[path])
    plain_out, plain_state = new_outputs(x)
    call_fwd(x, plain_out, plain_state, launch_options=PATHS[path])
    torch.cuda.synchronize()
    assert torch.equal(out, plain_out), "out changed by asking for intermediate states"
    assert torch.equal(final_state, plain_state), "final_state changed by asking for intermediate states"

    got = states.float().cpu().numpy().astype(np.float64)
    assert np.isnan(got[~reached]).all(), "a row no state reaches was written"
    assert np.isfinite(got[reached]).all(), "a reached row was not (fully) written"
    ref = _reference_states(x, every, include_initial, offsets)
    err = rel_err(got[reached], ref[reached])
    assert err <= BOUND, f"intermediate states error {err:.3e} > {BOUND}"


def _fla_h(x):
    """fla chunk_kda's h ([B, NT, HV, V, K] bf16 with state_v_first) on x, Triton path."""
    import torch
    from fla.ops.kda import chunk_kda

    pin_fla_configs()
    init = None if x.initial_state is None else x.initial_state.float()
    with fla_triton_only(), torch.inference_mode():
        _, _, h = chunk_kda(
            x.q, x.k, x.v, x.g, x.beta, scale=x.scale, initial_state=init, output_final_state=True,
            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
            safe_gate=True, lower_bound=x.lower_bound, state_v_first=True,
            cu_seqlens=None if x.cu_seqlens is None else x.cu_seqlens.long(),
            A_log=x.A_log, dt_bias=x.dt_bias, return_intermediate_states=True)
    return h


@pytest.mark.parametrize("kind", list(CASES))
def test_fla_form_matches_fla_h(kind):
    reason = fla_skip_reason()
    if reason:
        pytest.skip(reason)
    import torch

    x = make_inputs(Case(f"inter_fla_{kind}", heads=2, state="fp32", **CASES[kind]))
    offsets, _ = _rows(x, 64, True, True)
    h = _fla_h(x)
    _, _, states = _run(x, 64, True, offsets, torch.bfloat16, None)
    ours = states.view(h.shape[0], -1, *states.shape[1:])  # [B, NT, HV, V, K]
    assert ours.shape == h.shape and ours.dtype == h.dtype == torch.bfloat16
    ref = _reference_states(x, 64, True, offsets).reshape(ours.shape)
    ours_err = rel_err(ours.float().cpu().numpy().astype(np.float64), ref)
    fla_err = rel_err(h.float().cpu().numpy().astype(np.float64), ref)
    assert ours_err <= BOUND
    assert ours_err <= 1.05 * fla_err + 1e-4, f"ours {ours_err:.3e} vs fla {fla_err:.3e}"
