"""flash_kda.Error through Python: a ValueError whose message and .argument name the bad
argument; and flash_kda.fwd on a machine (or tensors) without a GPU fails with a clear error."""
from __future__ import annotations

import re
import sys

import numpy as np
import pytest

import flash_kda


def _inputs(rng, B=1, T=6, H=2, K=4, V=3):
    f32 = np.float32
    return dict(
        q=rng.standard_normal((B, T, H, K)).astype(f32),
        k=rng.standard_normal((B, T, H, K)).astype(f32),
        v=rng.standard_normal((B, T, H, V)).astype(f32),
        g=rng.standard_normal((B, T, H, K)).astype(f32),
        beta=rng.standard_normal((B, T, H)).astype(f32),
    )


def _raises(argument, **overrides):
    x = _inputs(np.random.default_rng())
    kwargs = {name: overrides.pop(name, x[name]) for name in ("q", "k", "v", "g", "beta")}
    with pytest.raises(flash_kda.Error) as info:
        flash_kda.reference(**kwargs, **overrides)
    err = info.value
    assert isinstance(err, ValueError)
    assert err.argument == argument
    assert str(err).startswith(f"flash_kda: {argument}: ")
    return str(err)


def test_error_is_a_value_error_exported_by_the_package():
    assert issubclass(flash_kda.Error, ValueError)
    assert flash_kda.Error.__module__ == "flash_kda"


def test_wrong_dtype_names_the_argument():
    x = _inputs(np.random.default_rng())
    _raises("q", q=x["q"].astype(np.float16))
    _raises("beta", beta=x["beta"].astype(np.int32))


def test_dtype_without_a_library_name_is_rejected_by_the_converter():
    x = _inputs(np.random.default_rng())
    msg = _raises("k", k=x["k"].astype(np.complex64))
    assert "bf16" in msg  # lists what is accepted


def test_shape_mismatch_names_the_argument():
    x = _inputs(np.random.default_rng())
    _raises("k", k=x["k"][:, :-1].copy())  # T differs from q's
    _raises("g", g=x["g"][..., :-1].copy())  # K differs


def test_bad_cu_seqlens_values_name_cu_seqlens():
    msg_decreasing = _raises("cu_seqlens", cu_seqlens=np.array([0, 4, 2, 6], np.int64))
    msg_last = _raises("cu_seqlens", cu_seqlens=np.array([0, 2, 5], np.int64))  # T_total is 6
    msg_start = _raises("cu_seqlens", cu_seqlens=np.array([1, 3, 6], np.int64))
    assert len({msg_decreasing, msg_last, msg_start}) == 3  # each says what is wrong
    _raises("cu_seqlens", cu_seqlens=np.array([0.0, 6.0], np.float32))


def test_unknown_gate_and_layout_names():
    assert "softplus" in _raises("gate", gate="sigmoid")
    assert "k_first" in _raises("state_layout", state_layout="kv")


def test_zero_dim_array_is_rejected():
    _raises("A_log", A_log=np.array(0.5, np.float32))


def _fwd_args(make):
    x = _inputs(np.random.default_rng())
    t = {n: make(a) for n, a in x.items()}
    H, K = x["q"].shape[2], x["q"].shape[3]
    return (t["q"], t["k"], t["v"], t["g"], t["beta"], None, make(np.zeros_like(x["v"])),
            make(np.zeros(H, np.float32)), make(np.zeros((H, K), np.float32)), -5.0)


def test_fwd_without_torch_says_torch_is_needed(monkeypatch):
    from flash_kda import _forward

    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    monkeypatch.setattr(_forward, "_torch_module", None)  # as when flash_kda was imported without torch
    with pytest.raises(ImportError, match="PyTorch"):
        flash_kda.fwd(*_fwd_args(lambda a: a))


def test_fwd_on_host_tensors_raises_a_named_error():
    torch = pytest.importorskip("torch")
    args = _fwd_args(lambda a: torch.from_numpy(a).to(torch.bfloat16))
    with pytest.raises(flash_kda.Error) as info:
        flash_kda.fwd(*args)
    assert re.search("cuda", str(info.value), re.IGNORECASE), str(info.value)


def test_fwd_requires_lower_bound():
    torch = pytest.importorskip("torch")
    args = list(_fwd_args(lambda a: torch.from_numpy(a)))
    args[9] = None
    with pytest.raises(flash_kda.Error) as info:
        flash_kda.fwd(*args)
    assert info.value.argument == "lower_bound"


def _raw(shape, code=0):
    return (0, code, shape, tuple(1 for _ in shape), 0)


@pytest.mark.parametrize("bad, argument, expected", [
    (lambda raw: raw.__setitem__(0, _raw(())), "q", "expected rank 4 [B, T, H, K], got a 0-d array"),
    (lambda raw: raw.__setitem__(2, _raw((1, 2, 3, 4, 5))), "v",
     "expected rank 4 [B, T, HV, V], got rank 5 [1, 2, 3, 4, 5]"),
    (lambda raw: raw.__setitem__(4, _raw((1, 2, 3), code=99)), "beta", "expected dtype bf16 or fp32, got dtype code 99"),
    (lambda raw: raw.__setitem__(1, _raw((1, 16, 2, 128), code="bool")), "k", "expected dtype bf16, got bool"),
    (lambda raw: raw.__setitem__(3, None), "g", "is required ([B, T, HV, K]), got None"),
])
def test_raw_descriptions_are_checked_before_anything_runs(bad, argument, expected):
    """_core.forward_raw (flash_kda.fwd's path for torch tensors) rejects a malformed
    description with the argument's name, before validation or any allocation."""
    from flash_kda import _core

    raw = [_raw((1, 16, 2, 128)) for _ in range(6)] + [None] * (len(_core.forward_tensors) - 6)
    bad(raw)
    allocs = []
    with pytest.raises(flash_kda.Error) as info:
        _core.forward_raw(tuple(raw), None, -5.0, lambda n: allocs.append(n), 0, None)
    assert info.value.argument == argument
    assert f"flash_kda: {argument}: {expected}" == str(info.value)
    assert allocs == []
