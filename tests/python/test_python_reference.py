"""flash_kda.reference against an independent fp64 numpy evaluation of the recurrence of
docs/kda-spec.md, on fresh random small shapes: every gate mode, flags, varlen (with a
zero-length sequence), GVA, both state layouts, with and without initial state.

Both sides are fp64 on identical (fp32) inputs, so they may differ only by rounding order:
the bound is a relative Frobenius error of 1e-10.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import flash_kda

TOL = 1e-10


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def numpy_kda(q, k, v, g, beta, *, scale, A_log, dt_bias, lower_bound, gate, use_qk_l2norm,
              use_beta_sigmoid, allow_neg_eigval, initial_state, cu_seqlens, state_layout):
    """Token-by-token fp64 KDA (spec "Pre-processing" and "Recurrence"). Returns (out, final_state)
    with final_state in `state_layout`."""
    q, k, v, g, beta = (np.asarray(x, np.float64) for x in (q, k, v, g, beta))
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    group = HV // H
    if use_qk_l2norm:
        q = q / np.sqrt(np.sum(q * q, -1, keepdims=True) + 1e-6)
        k = k / np.sqrt(np.sum(k * k, -1, keepdims=True) + 1e-6)
    rate = np.exp(np.asarray(A_log, np.float64))[:, None] if A_log is not None else np.ones((HV, 1))
    x = g + (np.asarray(dt_bias, np.float64).reshape(HV, K) if dt_bias is not None else 0.0)
    if gate == "safe":
        a = lower_bound * _sigmoid(rate * x)
    elif gate == "softplus":
        a = -rate * np.logaddexp(0.0, x)
    else:
        a = g
    b = (2.0 if allow_neg_eigval else 1.0) * _sigmoid(beta) if use_beta_sigmoid else beta

    if cu_seqlens is None:
        spans = [(n, 0, T) for n in range(B)]
    else:
        cu = [int(c) for c in cu_seqlens]
        spans = [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    out = np.zeros((B, T, HV, V))
    final = np.zeros((len(spans), HV, K, V))
    for n, (row, start, end) in enumerate(spans):
        for hv in range(HV):
            h = hv // group
            if initial_state is None:
                S = np.zeros((K, V))
            else:
                s0 = np.asarray(initial_state[n, hv], np.float64)
                S = s0.T.copy() if state_layout == "v_first" else s0.copy()
            for t in range(start, end):
                kt, qt = k[row, t, h], q[row, t, h]
                S = np.exp(a[row, t, hv])[:, None] * S
                S = S + b[row, t, hv] * np.outer(kt, v[row, t, hv] - S.T @ kt)
                out[row, t, hv] = scale * (S.T @ qt)
            final[n, hv] = S
    if state_layout == "v_first":
        final = final.transpose(0, 1, 3, 2)
    return out, final


def _rel(x, ref):
    return float(np.linalg.norm((x - ref).ravel()) / np.linalg.norm(ref.ravel()))


def _make_case(rng, *, gate, varlen, group, with_state, state_layout, use_beta_sigmoid=True):
    H = int(rng.integers(1, 3))
    HV = H * group
    K, V = int(rng.integers(3, 7)), int(rng.integers(2, 6))
    if varlen:
        lens = [int(rng.integers(1, 6)), 0, int(rng.integers(1, 6))]  # a zero-length sequence inside
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        B, T, N = 1, int(cu[-1]), len(lens)
    else:
        cu = None
        B, T = int(rng.integers(1, 3)), int(rng.integers(1, 8))
        N = B
    f32 = np.float32
    case = dict(
        q=rng.standard_normal((B, T, H, K)).astype(f32),
        k=rng.standard_normal((B, T, H, K)).astype(f32),
        v=rng.standard_normal((B, T, HV, V)).astype(f32),
        beta=(rng.standard_normal((B, T, HV)) if use_beta_sigmoid else rng.uniform(0.05, 1.0, (B, T, HV))).astype(f32),
        scale=float(rng.uniform(0.2, 1.5)),
        lower_bound=float(rng.uniform(-5.0, -0.1)),
        cu_seqlens=cu,
        A_log=None,
        dt_bias=None,
    )
    if gate == "none":
        case["g"] = (-rng.uniform(0.01, 2.0, (B, T, HV, K))).astype(f32)
    else:
        case["g"] = rng.standard_normal((B, T, HV, K)).astype(f32)
        case["A_log"] = np.log(rng.uniform(1.0, 16.0, HV)).astype(f32)
        case["dt_bias"] = (0.1 * rng.standard_normal((HV, K))).astype(f32)
    dims = (V, K) if state_layout == "v_first" else (K, V)
    case["initial_state"] = rng.standard_normal((N, HV, *dims)).astype(f32) if with_state else None
    return case


GRID = list(itertools.product(["safe", "softplus", "none"], [False, True], [1, 2], [False, True], ["v_first", "k_first"]))


@pytest.mark.parametrize("gate,varlen,group,with_state,state_layout", GRID)
def test_reference_matches_numpy_recurrence(gate, varlen, group, with_state, state_layout):
    seed = int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    c = _make_case(rng, gate=gate, varlen=varlen, group=group, with_state=with_state, state_layout=state_layout)
    flags = dict(use_qk_l2norm=True, use_beta_sigmoid=True, allow_neg_eigval=False)
    out, final = flash_kda.reference(
        c["q"], c["k"], c["v"], c["g"], c["beta"], scale=c["scale"], A_log=c["A_log"], dt_bias=c["dt_bias"],
        lower_bound=c["lower_bound"], gate=gate, initial_state=c["initial_state"], cu_seqlens=c["cu_seqlens"],
        state_layout=state_layout, output_final_state=True, **flags)
    want_out, want_final = numpy_kda(**c, gate=gate, state_layout=state_layout, **flags)
    assert out.dtype == np.float64 and out.shape == c["v"].shape
    assert final.shape == want_final.shape
    assert _rel(out, want_out) <= TOL, f"seed {seed}"
    assert _rel(final, want_final) <= TOL, f"seed {seed}"


@pytest.mark.parametrize("use_qk_l2norm,use_beta_sigmoid,allow_neg_eigval",
                         [(False, True, False), (True, False, False), (True, True, True), (False, False, False)])
def test_reference_flags(use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval):
    seed = int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    c = _make_case(rng, gate="safe", varlen=False, group=2, with_state=True, state_layout="v_first",
                   use_beta_sigmoid=use_beta_sigmoid)
    flags = dict(use_qk_l2norm=use_qk_l2norm, use_beta_sigmoid=use_beta_sigmoid, allow_neg_eigval=allow_neg_eigval)
    out, final = flash_kda.reference(
        c["q"], c["k"], c["v"], c["g"], c["beta"], scale=c["scale"], A_log=c["A_log"], dt_bias=c["dt_bias"],
        lower_bound=c["lower_bound"], initial_state=c["initial_state"], output_final_state=True, **flags)
    want_out, want_final = numpy_kda(**c, gate="safe", state_layout="v_first", **flags)
    assert _rel(out, want_out) <= TOL, f"seed {seed}"
    assert _rel(final, want_final) <= TOL, f"seed {seed}"


def test_reference_defaults_scale_and_omits_final_state():
    rng = np.random.default_rng()
    c = _make_case(rng, gate="safe", varlen=False, group=1, with_state=False, state_layout="v_first")
    out, final = flash_kda.reference(c["q"], c["k"], c["v"], c["g"], c["beta"], A_log=c["A_log"],
                                     dt_bias=c["dt_bias"].reshape(-1), lower_bound=c["lower_bound"])
    assert final is None
    K = c["q"].shape[-1]
    c["scale"] = K**-0.5
    want_out, _ = numpy_kda(**c, gate="safe", state_layout="v_first", use_qk_l2norm=True,
                            use_beta_sigmoid=True, allow_neg_eigval=False)
    assert _rel(out, want_out) <= TOL


def test_reference_reads_int32_cu_seqlens_and_noncontiguous_numpy():
    rng = np.random.default_rng()
    c = _make_case(rng, gate="softplus", varlen=True, group=1, with_state=True, state_layout="k_first")
    kwargs = dict(scale=c["scale"], A_log=c["A_log"], dt_bias=c["dt_bias"], gate="softplus",
                  initial_state=c["initial_state"], state_layout="k_first", output_final_state=True)
    want_out, want_final = flash_kda.reference(c["q"], c["k"], c["v"], c["g"], c["beta"],
                                               cu_seqlens=c["cu_seqlens"], **kwargs)
    q_strided = np.asfortranarray(c["q"])  # same values, other memory order: copied to contiguous
    out, final = flash_kda.reference(q_strided, c["k"], c["v"], c["g"], c["beta"],
                                     cu_seqlens=c["cu_seqlens"].astype(np.int32), **kwargs)
    np.testing.assert_array_equal(out, want_out)
    np.testing.assert_array_equal(final, want_final)


def test_reference_accepts_torch_bf16_and_widens_exactly():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng()
    c = _make_case(rng, gate="safe", varlen=False, group=1, with_state=True, state_layout="v_first")
    bf = {n: torch.from_numpy(c[n]).to(torch.bfloat16) for n in ("q", "k", "v", "g", "beta", "initial_state")}
    kwargs = dict(scale=c["scale"], A_log=c["A_log"], dt_bias=c["dt_bias"], lower_bound=c["lower_bound"],
                  output_final_state=True)
    out, final = flash_kda.reference(bf["q"], bf["k"], bf["v"], bf["g"], bf["beta"],
                                     initial_state=bf["initial_state"], **kwargs)
    widened = {n: t.float().numpy() for n, t in bf.items()}  # bf16 -> fp32 is exact
    want_out, want_final = flash_kda.reference(widened["q"], widened["k"], widened["v"], widened["g"],
                                               widened["beta"], initial_state=widened["initial_state"], **kwargs)
    np.testing.assert_array_equal(out, want_out)
    np.testing.assert_array_equal(final, want_final)
