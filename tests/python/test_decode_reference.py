"""flash_kda.reference_decode (CPU, no torch): the pool semantics of docs/kda-spec.md "Decode
and speculative verification" checked against flash_kda.reference (the forward's fp64
reference, tested on its own in test_python_reference.py) run sequence by sequence from the
start state each sequence should get; and its named errors.

Both sides are fp64 on the same fp32 inputs; reference_decode returns out in fp32, so out is
compared at 1e-6 relative and states at 1e-10.
"""
from __future__ import annotations

import numpy as np
import pytest

import flash_kda

OUT_TOL, STATE_TOL = 1e-6, 1e-10
GATES = {  # fla's keywords -> flash_kda.reference's gate
    "safe": dict(use_gate_in_kernel=True, lower_bound=-5.0),
    "softplus": dict(use_gate_in_kernel=True, lower_bound=None),
    "none": dict(use_gate_in_kernel=False, lower_bound=None),
}


def _rel(x, ref):
    den = np.linalg.norm(np.ravel(ref))
    return float(np.linalg.norm(np.ravel(x) - np.ravel(ref)) / (den if den else 1.0))


def _inputs(rng, B, T, H, HV, K, V, gate):
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    g = f(B, T, HV, K)
    if gate == "none":
        g = -np.abs(g) * 0.3  # a log decay <= 0
    return dict(q=f(B, T, H, K), k=f(B, T, H, K), v=f(B, T, HV, V), g=g, beta=f(B, T, HV),
                A_log=(0.3 * f(HV)) if gate != "none" else None,
                dt_bias=(0.1 * f(HV, K)) if gate != "none" else None)


def _forward_of(x, n, start, gate, v_first, t_slice=slice(None)):
    """flash_kda.reference on sequence n (tokens t_slice) from `start` ([HV, ...] or None)."""
    sl = lambda a: a[n:n + 1, t_slice]
    kw = dict(gate=gate, state_layout="v_first" if v_first else "k_first", use_qk_l2norm=True,
              use_beta_sigmoid=True, output_final_state=True)
    if gate == "safe":
        kw["lower_bound"] = -5.0
    if gate != "none":
        kw.update(A_log=x["A_log"], dt_bias=x["dt_bias"])
    init = None if start is None else start[None].astype(np.float64)
    return flash_kda.reference(sl(x["q"]), sl(x["k"]), sl(x["v"]), sl(x["g"]), sl(x["beta"]), initial_state=init, **kw)


def _decode_kw(x, gate, v_first):
    kw = dict(GATES[gate], state_v_first=v_first, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
              A_log=x["A_log"], dt_bias=x["dt_bias"])
    return kw


@pytest.mark.parametrize("gate", sorted(GATES))
@pytest.mark.parametrize("v_first", [True, False], ids=["v_first", "k_first"])
def test_pool_with_token_indices_accepted_counts_and_padding(gate, v_first):
    rng = np.random.default_rng()
    N, T, H, HV, K, V = 4, 3, 1, 2, 8, 4
    x = _inputs(rng, N, T, H, HV, K, V, gate)
    P = 14
    dims = (V, K) if v_first else (K, V)
    pool = rng.standard_normal((P, HV, *dims)).astype(np.float32)
    idx = np.array([[0, 1, 2], [-1, -1, -1], [5, 6, 7], [9, 10, 11]], dtype=np.int64)
    accepted = np.array([1, 2, 3, 2], dtype=np.int32)
    out, after = flash_kda.reference_decode(**{k: x[k] for k in "q k v g beta".split()}, initial_state=pool,
                                            ssm_state_indices=idx, num_accepted_tokens=accepted,
                                            **_decode_kw(x, gate, v_first))
    assert out.shape == x["v"].shape and after.shape == pool.shape and after.dtype == np.float64
    touched = set()
    for n in (0, 2, 3):
        start = pool[idx[n, accepted[n] - 1]]
        for t in range(T):  # the state after token t goes to idx[n, t]
            o, s = _forward_of(x, n, start, gate, v_first, slice(0, t + 1))
            assert _rel(after[idx[n, t]], s[0]) < STATE_TOL
            touched.add(int(idx[n, t]))
        assert _rel(out[n], o[0]) < OUT_TOL
    assert np.all(out[1] == 0.0)  # the padded sequence: zero rows, no slot touched
    for slot in set(range(P)) - touched:
        assert np.array_equal(after[slot], pool[slot].astype(np.float64))


def test_sequence_indices_write_the_last_state_only():
    rng = np.random.default_rng()
    N, T, H, K, V = 3, 4, 2, 8, 8
    x = _inputs(rng, N, T, H, H, K, V, "safe")
    pool = rng.standard_normal((5, H, V, K)).astype(np.float32)
    idx = np.array([4, -1, 1], dtype=np.int32)
    out, after = flash_kda.reference_decode(**{k: x[k] for k in "q k v g beta".split()}, initial_state=pool,
                                            ssm_state_indices=idx, **_decode_kw(x, "safe", True))
    for n in (0, 2):
        o, s = _forward_of(x, n, pool[idx[n]], "safe", True)
        assert _rel(out[n], o[0]) < OUT_TOL and _rel(after[idx[n]], s[0]) < STATE_TOL
    assert np.all(out[1] == 0.0)
    for slot in (0, 2, 3):
        assert np.array_equal(after[slot], pool[slot].astype(np.float64))


@pytest.mark.parametrize("with_state", [True, False], ids=["initial_state", "zero_state"])
def test_varlen_without_pool_matches_the_forward(with_state):
    rng = np.random.default_rng()
    lens = [2, 0, 5, 1]
    H, HV, K, V = 2, 4, 8, 8
    x = _inputs(rng, 1, sum(lens), H, HV, K, V, "softplus")
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    h0 = rng.standard_normal((len(lens), HV, K, V)).astype(np.float32) if with_state else None
    out, fs = flash_kda.reference_decode(**{k: x[k] for k in "q k v g beta".split()}, initial_state=h0,
                                         cu_seqlens=cu, **_decode_kw(x, "softplus", False))
    assert fs.shape == (len(lens), HV, K, V)
    for n, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        start = h0[n] if with_state else None
        if a == b:
            expect = np.zeros((HV, K, V)) if start is None else start
            assert np.array_equal(fs[n], expect)
            continue
        o, s = _forward_of(x, 0, start, "softplus", False, slice(a, b))
        assert _rel(out[0, a:b], o[0]) < OUT_TOL and _rel(fs[n], s[0]) < STATE_TOL


def test_the_precomputed_gate_ignores_A_log_and_dt_bias_as_fla_does():
    rng = np.random.default_rng()
    x = _inputs(rng, 2, 3, 1, 2, 8, 8, "none")
    kw = _decode_kw(x, "none", True)
    plain = flash_kda.reference_decode(**{k: x[k] for k in "q k v g beta".split()}, **kw)
    kw.update(A_log=rng.standard_normal(2).astype(np.float32), dt_bias=rng.standard_normal((2, 8)).astype(np.float32))
    ignored = flash_kda.reference_decode(**{k: x[k] for k in "q k v g beta".split()}, **kw)
    assert np.array_equal(plain[0], ignored[0]) and np.array_equal(plain[1], ignored[1])


def test_inputs_are_not_modified():
    rng = np.random.default_rng()
    x = _inputs(rng, 2, 2, 1, 1, 8, 8, "safe")
    pool = rng.standard_normal((2, 1, 8, 8)).astype(np.float32)
    before = pool.copy()
    flash_kda.reference_decode(**{k: x[k] for k in "q k v g beta".split()}, initial_state=pool,
                               ssm_state_indices=np.array([1, 0], dtype=np.int32), **_decode_kw(x, "safe", True))
    assert np.array_equal(pool, before)


def _small(rng=None):
    rng = rng or np.random.default_rng(0)
    return _inputs(rng, 2, 2, 1, 1, 8, 8, "safe")


@pytest.mark.parametrize("change, argument", [
    (dict(ssm_state_indices=np.array([0, 7], dtype=np.int32)), "ssm_state_indices"),
    (dict(ssm_state_indices=np.array([0.0, 1.0])), "ssm_state_indices"),
    (dict(num_accepted_tokens=np.array([1, 1], dtype=np.int32)), "num_accepted_tokens"),
    (dict(ssm_state_indices=np.array([[0, 1], [1, 0]], dtype=np.int32),
          num_accepted_tokens=np.array([1, 3], dtype=np.int32)), "num_accepted_tokens"),
    (dict(lower_bound=-6.0), "lower_bound"),
    (dict(lower_bound="low"), "lower_bound"),
    (dict(scale="x"), "scale"),
    (dict(state_v_first=1), "state_v_first"),
    (dict(use_gate_in_kernel="yes"), "use_gate_in_kernel"),
    (dict(num_threads=-1), "num_threads"),
    (dict(dt_bias=np.zeros(3, np.float32)), "dt_bias"),
    (dict(A_log=np.zeros(1, np.float64)), "A_log"),
])
def test_errors_name_the_argument(change, argument):
    x = _small()
    pool = np.zeros((2, 1, 8, 8), np.float32)
    kw = dict(initial_state=pool, ssm_state_indices=np.array([0, 1], dtype=np.int32), **_decode_kw(x, "safe", True))
    kw.update(change)
    with pytest.raises(flash_kda.Error) as e:
        flash_kda.reference_decode(**{k: x[k] for k in "q k v g beta".split()}, **kw)
    assert e.value.argument == argument, str(e.value)


def test_missing_and_malformed_tensors_are_named():
    x = _small()
    with pytest.raises(flash_kda.Error) as e:
        flash_kda.reference_decode(x["q"], x["k"], None, x["g"], x["beta"])
    assert e.value.argument == "v"
    with pytest.raises(flash_kda.Error) as e:
        flash_kda.reference_decode(x["q"], x["k"], x["v"], x["g"], x["beta"][:, :, :, None])
    assert e.value.argument == "beta"
    with pytest.raises(flash_kda.Error) as e:
        flash_kda.reference_decode(x["q"], x["k"], x["v"], x["g"], "beta")
    assert e.value.argument == "beta"
