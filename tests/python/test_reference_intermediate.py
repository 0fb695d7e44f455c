"""flash_kda.reference(intermediate_every=...): the intermediate (prefix-cache) states of the
fp64 reference, which the GPU tests compare against. Row j of sequence n is, bit for bit, the
final state of the same sequence cut after j * every tokens (fp64 on both sides, the same
operations); the default offsets give one row per state reached; bad arguments are named.
"""
from __future__ import annotations

import numpy as np
import pytest

import flash_kda

RNG = np.random.default_rng(7)
H, K, V = 2, 8, 4


def _inputs(lens):
    T = int(sum(lens))
    x = dict(q=RNG.standard_normal((1, T, H, K)).astype(np.float32),
             k=RNG.standard_normal((1, T, H, K)).astype(np.float32),
             v=RNG.standard_normal((1, T, H, V)).astype(np.float32),
             g=RNG.standard_normal((1, T, H, K)).astype(np.float32),
             beta=RNG.standard_normal((1, T, H)).astype(np.float32))
    init = RNG.standard_normal((len(lens), H, V, K))
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    return x, init, cu


def _call(x, init, cu, **kw):
    return flash_kda.reference(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=np.zeros(H, np.float32),
                               dt_bias=np.zeros((H, K), np.float32), initial_state=init, cu_seqlens=cu, **kw)


@pytest.mark.parametrize("every,include_initial", [(16, True), (16, False), (48, True), (64, False)])
def test_rows_are_final_states_of_prefixes(every, include_initial):
    lens = [70, 0, 1, 130, 48]
    x, init, cu = _inputs(lens)
    _, _, states, offsets = _call(x, init, cu, intermediate_every=every,
                                  intermediate_include_initial=include_initial)
    counts = [n // every + (1 if include_initial else 0) for n in lens]
    assert offsets.tolist() == np.concatenate([[0], np.cumsum(counts)]).tolist()
    assert states.shape == (sum(counts), H, V, K) and states.dtype == np.float64
    for n, L in enumerate(lens):
        for j in range(counts[n]):
            tokens = (j + (0 if include_initial else 1)) * every
            s = int(cu[n])
            sub = {name: t[:, s:s + tokens] for name, t in x.items()}
            _, fin = _call(sub, init[n:n + 1], np.array([0, tokens], np.int64), output_final_state=True)
            np.testing.assert_array_equal(states[offsets[n] + j], fin[0], err_msg=f"sequence {n} row {j}")


def test_given_offsets_and_untouched_rows_are_nan():
    lens = [40, 100]
    x, init, cu = _inputs(lens)
    _, _, states, offsets = _call(x, init, cu, intermediate_every=16, intermediate_include_initial=False,
                                  intermediate_offsets=np.array([1, 5, 6], np.int32))
    assert offsets.tolist() == [1, 5, 6] and states.shape[0] == 6
    assert np.isnan(states[[0, 3, 4]]).all()  # row 0 no sequence's; rows 3, 4 past 40 tokens
    assert np.isfinite(states[[1, 2, 5]]).all()


@pytest.mark.parametrize("every", [0, 8, 24])
def test_every_must_be_a_positive_multiple_of_16(every):
    x, init, cu = _inputs([32])
    with pytest.raises(flash_kda.Error) as e:
        _call(x, init, cu, intermediate_every=every)
    assert e.value.argument == "intermediate_every"


def test_bad_offsets_are_named():
    x, init, cu = _inputs([32, 16])
    with pytest.raises(flash_kda.Error) as e:
        _call(x, init, cu, intermediate_every=16, intermediate_offsets=np.array([1, 0, 2], np.int64))
    assert e.value.argument == "intermediate_offsets" and "below the entry before it" in str(e.value)
    with pytest.raises(flash_kda.Error) as e:
        _call(x, init, cu, intermediate_offsets=np.array([0, 1, 2], np.int64))
    assert e.value.argument == "intermediate_offsets"
