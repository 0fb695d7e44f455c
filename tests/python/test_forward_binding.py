"""flash_kda._core's forward binding on CPU: _core.validate_forward_raw (the C++
flash_kda::validate_forward on raw descriptions of CUDA tensors at made-up, aligned addresses,
reading no data) accepts FlashKDA's call and returns its sizes, names every bad argument, and
takes the same settings as _core.forward_raw, which checks them before any allocation."""
from __future__ import annotations

import pytest

import flash_kda
from flash_kda import _core

B, T, H, K = 2, 32, 2, 128
SAFE = (None, -5.0, "safe", "v_first", True, True, False)


class Alloc:
    """Made-up CUDA addresses, 64 MiB apart (so no two tensors overlap), 256-byte aligned."""

    def __init__(self):
        self.next = 1 << 32

    def __call__(self, shape, dtype="bfloat16", device=0, strides=None):
        packed, acc = [], 1
        for s in reversed(shape):
            packed.insert(0, acc)
            acc *= s
        self.next += 1 << 26
        return (self.next, _core.dtype_codes.get(dtype, dtype), tuple(shape), tuple(strides or packed), device)


def _call(**change):
    a = Alloc()
    t = dict(q=a((B, T, H, K)), k=a((B, T, H, K)), v=a((B, T, H, K)), g=a((B, T, H, K)), beta=a((B, T, H)),
             out=a((B, T, H, K)), A_log=a((H,), "float32"), dt_bias=a((H, K), "float32"),
             initial_state=a((B, H, K, K), "float32"), final_state=a((B, H, K, K), "float32"))
    for name, value in change.items():
        t[name] = value(a) if callable(value) else value
    return tuple(t.get(n) for n in _core.forward_tensors)


def test_flashkda_call_validates_and_returns_its_sizes(kernels_built):
    sizes = _core.validate_forward_raw(_call(), *SAFE)
    assert sizes[:8] == (B, T, B, H, H, K, K, False)
    assert sizes[8] == pytest.approx(K ** -0.5)
    assert _core.validate_forward_raw(_call(), 0.5, -2.0, "safe", "v_first", True, True, False)[8] == 0.5


@pytest.mark.parametrize("settings, argument, words", [
    ((None, -5.0, "sigmoid", "v_first", True, True, False), "gate", "'safe', 'softplus', 'none'"),
    ((None, -5.0, "safe", "transposed", True, True, False), "state_layout", "'v_first' or 'k_first'"),
    ((None, -6.0, "safe", "v_first", True, True, False), "lower_bound", "[-5, 0)"),
    ((-1.0, -5.0, "safe", "v_first", True, True, False), "scale", "finite and > 0"),
    ((None, -5.0, "safe", "v_first", True, False, True), "allow_neg_eigval", "needs use_beta_sigmoid"),
])
def test_settings_are_checked_by_name(settings, argument, words):
    with pytest.raises(flash_kda.Error) as e:
        _core.validate_forward_raw(_call(), *settings)
    assert e.value.argument == argument and words in str(e.value), str(e.value)


@pytest.mark.parametrize("change, argument", [
    (dict(q=lambda a: a((B, T, H, 64)), k=lambda a: a((B, T, H, 64)), g=lambda a: a((B, T, H, 64)),
          dt_bias=lambda a: a((H, 64), "float32"), initial_state=None, final_state=None), "q"),
    (dict(q=lambda a: a((B, T, H, K), device=-1)), "q"),
    (dict(out=lambda a: a((B, T, H, K), "float64")), "out"),
    (dict(beta=None), "beta"),
    (dict(initial_state=lambda a: a((B + 1, H, K, K), "float32")), "initial_state"),
])
def test_tensors_are_checked_by_name(change, argument):
    with pytest.raises(flash_kda.Error) as e:
        _core.validate_forward_raw(_call(**change), *SAFE)
    assert e.value.argument == argument, str(e.value)


def test_launch_options_are_checked(kernels_built):
    with pytest.raises(flash_kda.Error) as e:
        _core.validate_forward_raw(_call(), *SAFE, (0, 0, 0, 5))
    assert e.value.argument == "launch_options.recurrence_warps"
    assert _core.validate_forward_raw(_call(), *SAFE, (0, 0, 1, 4))[0] == B


def test_outputs_overlapping_inputs_are_refused():
    """What the fla verifier relies on when it describes the outputs at made-up addresses:
    the aliasing rule is checked on the descriptions' addresses."""
    tensors = list(_call())
    tensors[_core.forward_tensors.index("out")] = tensors[_core.forward_tensors.index("v")]
    with pytest.raises(flash_kda.Error) as e:
        _core.validate_forward_raw(tuple(tensors), *SAFE)
    assert e.value.argument == "out" and "overlaps input v" in str(e.value)


def test_forward_raw_takes_the_settings_and_checks_them_before_allocating():
    allocs = []
    with pytest.raises(flash_kda.Error) as e:
        _core.forward_raw(_call(), None, -5.0, lambda n: allocs.append(n), 0, None, gate="sigmoid")
    assert e.value.argument == "gate" and allocs == []
    with pytest.raises(flash_kda.Error) as e:
        _core.forward_raw(_call(), None, -5.0, lambda n: allocs.append(n), 0, None, "safe", "v_first", True, False,
                          True)
    assert e.value.argument == "allow_neg_eigval" and allocs == []
