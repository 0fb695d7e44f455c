"""flash_kda._core's decode conversion on CPU: raw tensor descriptions (the form
fused_recurrent_kda_fwd's fast path builds from torch tensors) of CUDA tensors at made-up,
aligned addresses go through _core.validate_decode_raw, which validates for the GPU without
reading any data. A well-formed call returns its sizes; each bad argument raises
flash_kda.Error naming it."""
from __future__ import annotations

import pytest

import flash_kda
from flash_kda import _core

N, T, H, K = 4, 2, 2, 128
SAFE = (_core.decode_gates["safe"], True, True, True, False, None, -5.0)
SOFTPLUS = (_core.decode_gates["softplus"],) + SAFE[1:]
NONE = (_core.decode_gates["none"],) + SAFE[1:]


class Alloc:
    """Made-up CUDA addresses, 64 MiB apart (so no two tensors overlap), 256-byte aligned."""

    def __init__(self):
        self.next = 1 << 32

    def __call__(self, shape, dtype="bfloat16", device=0, offset=0, strides=None):
        packed, acc = [], 1
        for s in reversed(shape):
            packed.insert(0, acc)
            acc *= s
        self.next += 1 << 26
        code = _core.dtype_codes.get(dtype, dtype)
        return (self.next + offset, code, tuple(shape), tuple(strides or packed), device)


def _call(**change):
    a = Alloc()
    t = dict(q=a((N, T, H, K)), k=a((N, T, H, K)), v=a((N, T, H, K)), g=a((N, T, H, K)), beta=a((N, T, H)),
             out=a((N, T, H, K)), A_log=a((H,), "float32"), dt_bias=a((H, K), "float32"), cu_seqlens=None,
             initial_state=a((3 * N, H, K, K), "float32"), final_state=None,
             ssm_state_indices=a((N, T), "int32"), num_accepted_tokens=a((N,), "int32"))
    settings = change.pop("settings", SAFE)
    for name, value in change.items():
        t[name] = value(a, t) if callable(value) else value
    if "final_state" not in change:
        t["final_state"] = t["initial_state"]  # the pool, in place
    return tuple(t[n] for n in _core.decode_tensors), settings


def test_a_serving_call_validates_and_returns_its_sizes():
    tensors, settings = _call()
    batch, seqlen, num_seqs, heads, value_heads, kd, vd, varlen, scale = _core.validate_decode_raw(tensors, settings)
    assert (batch, seqlen, num_seqs, heads, value_heads, kd, vd, varlen) == (N, T, N, H, H, K, K, False)
    assert scale == pytest.approx(K ** -0.5)


def test_the_table_order_is_the_python_functions_locals():
    assert _core.decode_tensors == ("q", "k", "v", "g", "beta", "out", "A_log", "dt_bias", "cu_seqlens",
                                    "initial_state", "final_state", "ssm_state_indices", "num_accepted_tokens")
    assert sorted(_core.decode_gates.items()) == [("none", 2), ("safe", 0), ("softplus", 1)]


@pytest.mark.parametrize("change, argument", [
    (dict(q=lambda a, t: a((N, T, H, 64)), k=lambda a, t: a((N, T, H, 64)), g=lambda a, t: a((N, T, H, 64)),
          dt_bias=lambda a, t: a((H, 64), "float32"), initial_state=lambda a, t: a((3 * N, H, K, 64), "float32")), "q"),
    (dict(q=lambda a, t: a((N, T, H, K), "float16")), "q"),
    (dict(q=lambda a, t: a((N, T, H, K), "bool")), "q"),
    (dict(q=lambda a, t: a((N, T, H, K), offset=2)), "q"),
    (dict(v=lambda a, t: a((N, T, H, K), device=-1)), "v"),
    (dict(beta=lambda a, t: a((N, T, H, 1))), "beta"),
    (dict(out=None), "out"),
    (dict(out=lambda a, t: t["v"]), "out"),
    (dict(initial_state=None, final_state=None), "initial_state"),
    (dict(final_state=lambda a, t: a((3 * N, H, K, K), "float32")), "final_state"),
    (dict(ssm_state_indices=lambda a, t: a((N, T), "float32")), "ssm_state_indices"),
    (dict(ssm_state_indices=lambda a, t: a((N,), "int32")), "num_accepted_tokens"),
    (dict(A_log=lambda a, t: a((H + 1,), "float32")), "A_log"),
    (dict(dt_bias=lambda a, t: a((H, K), "bfloat16")), "dt_bias"),
    (dict(settings=SAFE[:6] + (-6.0,)), "lower_bound"),
    (dict(settings=SOFTPLUS, A_log=None), "A_log"),
    (dict(settings=NONE), "A_log"),
    (dict(settings=(7,) + SAFE[1:]), "gate"),
    (dict(settings=SAFE[:4] + (True,) + SAFE[5:], ), None),  # allow_neg_eigval with the sigmoid: fine
])
def test_bad_arguments_are_named(change, argument):
    tensors, settings = _call(**change)
    if argument is None:
        _core.validate_decode_raw(tensors, settings)
        return
    with pytest.raises(flash_kda.Error) as e:
        _core.validate_decode_raw(tensors, settings)
    assert e.value.argument == argument, str(e.value)


def test_fixed_length_batches_take_at_most_16_tokens():
    a = Alloc()
    tensors, _ = _call()
    long = dict(zip(_core.decode_tensors, tensors))
    for name in ("q", "k", "v", "g", "out"):
        long[name] = a((N, 17, H, K))
    long["beta"] = a((N, 17, H))
    long["ssm_state_indices"] = a((N,), "int32")
    long["num_accepted_tokens"] = None
    with pytest.raises(flash_kda.Error) as e:
        _core.validate_decode_raw(tuple(long[n] for n in _core.decode_tensors), SAFE)
    assert e.value.argument == "q" and "16" in str(e.value)


def test_wrong_number_of_tensors_is_named():
    tensors, settings = _call()
    with pytest.raises(flash_kda.Error) as e:
        _core.validate_decode_raw(tensors[:-1], settings)
    assert e.value.argument == "tensors"
