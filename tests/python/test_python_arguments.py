"""Every bad argument of the public functions raises flash_kda.Error naming it, with the
expected form in the message: tensors that are None or not arrays, dtypes the library has no
name for, ranks beyond 4, non-numeric scalars, flags and counts of the wrong type, and
launch_options. Also the one rule on fp64 (activations rejected, fp64 states accepted by the
reference), and fwd's signature (FlashKDA's, then keyword-only additions).

fwd needs PyTorch; where it is missing, a stand-in module lets fwd run up to the extension,
which rejects host arrays by name before any use of torch (the calls here never get further).
"""
from __future__ import annotations

import inspect
import sys
import types

import numpy as np
import pytest

import flash_kda


def _inputs(B=1, T=6, H=2, K=4, V=3, seed=0):
    rng = np.random.default_rng(seed)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    return dict(q=f32(B, T, H, K), k=f32(B, T, H, K), v=f32(B, T, H, V), g=f32(B, T, H, K), beta=f32(B, T, H))


def _reference_error(**overrides) -> flash_kda.Error:
    kw = {**_inputs(), **overrides}
    with pytest.raises(flash_kda.Error) as info:
        flash_kda.reference(**kw)
    return info.value


def _assert_names(err: flash_kda.Error, argument: str, *fragments: str) -> None:
    assert isinstance(err, ValueError)
    assert err.argument == argument, str(err)
    assert str(err).startswith(f"flash_kda: {argument}: "), str(err)
    for f in fragments:
        assert f in str(err), f"missing {f!r} in: {err}"
    assert "::" not in str(err), f"a C++ name in a Python message: {err}"
    assert "incompatible function arguments" not in str(err)


@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta"])
def test_reference_required_tensor_none(name):
    _assert_names(_reference_error(**{name: None}), name, "is required", "got None")


@pytest.mark.parametrize("value, got", [("hello", "got str"), (5, "got int"), ({"a": 1}, "got dict")])
def test_reference_tensor_not_an_array(value, got):
    _assert_names(_reference_error(q=value), "q", "expected an array", got)


@pytest.mark.parametrize("name", ["A_log", "dt_bias", "initial_state", "cu_seqlens"])
def test_reference_optional_tensor_not_an_array(name):
    _assert_names(_reference_error(**{name: "x"}), name, "expected an array", "got str")


@pytest.mark.parametrize("dtype, name", [(np.bool_, "bool"), (np.uint64, "uint64"), (np.int8, "int8"),
                                         (np.complex64, "complex64"), (np.float16, "fp16")])
def test_reference_dtype_named(dtype, name):
    x = _inputs()
    err = _reference_error(g=x["g"].astype(dtype))
    _assert_names(err, "g", f"expected dtype bf16 or fp32, got {name}")
    assert "DLPack" not in str(err) and "code" not in str(err)


def test_reference_rank_errors_read_alike():
    """Rank 3 (judged by the validator) and rank 5 (too many for the library's views, judged by
    the binding) give the same form of message."""
    x = _inputs()
    low = _reference_error(v=x["v"][0])
    high = _reference_error(v=x["v"][None])
    _assert_names(low, "v", "expected rank 4 [B, T, HV, V], got rank 3 [6, 2, 3]")
    _assert_names(high, "v", "expected rank 4 [B, T, HV, V], got rank 5 [1, 1, 6, 2, 3]")


@pytest.mark.parametrize("name", ["scale", "lower_bound"])
@pytest.mark.parametrize("value", ["x", "0.5", True, None, [1.0]])
def test_reference_scalars(name, value):
    if name == "scale" and value is None:
        return  # scale=None is valid (K**-0.5); the good call below checks it
    _assert_names(_reference_error(**{name: value}), name, "expected a real number")


def test_reference_numpy_scalars_are_real():
    out, _ = flash_kda.reference(**_inputs(), scale=np.float32(0.25), lower_bound=np.float64(-5.0))
    assert out.shape == (1, 6, 2, 3) and np.isfinite(out).all()


def test_reference_scale_none_is_valid():
    out, _ = flash_kda.reference(**_inputs(), scale=None)
    assert out.shape == (1, 6, 2, 3) and np.isfinite(out).all()


@pytest.mark.parametrize("name, value, fragment", [
    ("gate", 5, "expected one of 'safe', 'softplus', 'none', got int"),
    ("gate", "sigmoid", "expected one of 'safe', 'softplus', 'none', got 'sigmoid'"),
    ("state_layout", None, "expected one of 'v_first', 'k_first', got NoneType"),
    ("state_layout", "kv", "expected 'v_first' or 'k_first', got 'kv'"),
    ("use_qk_l2norm", "yes", "expected a bool, got str"),
    ("use_beta_sigmoid", 1, "expected a bool, got int"),
    ("allow_neg_eigval", None, "expected a bool, got NoneType"),
    ("output_final_state", "no", "expected a bool, got str"),
    ("num_threads", -1, "must be >= 0"),
    ("num_threads", 1 << 40, "< 2^31"),
    ("num_threads", 1.5, "expected an int >= 0"),
    ("num_threads", True, "expected an int >= 0"),
])
def test_reference_options(name, value, fragment):
    _assert_names(_reference_error(**{name: value}), name, fragment)


def test_reference_numpy_bool_flags_and_int_threads_accepted():
    a, _ = flash_kda.reference(**_inputs(), use_qk_l2norm=np.bool_(True), num_threads=np.int64(2))
    b, _ = flash_kda.reference(**_inputs(), num_threads=1)
    np.testing.assert_array_equal(a, b)


def test_reference_messages_use_python_names():
    x = _inputs()
    state = np.zeros((1, 2, 3, 4), np.float32)  # v-first [N, HV, V, K]
    err = _reference_error(initial_state=state, state_layout="k_first")
    _assert_names(err, "initial_state", "[N, HV, K, V] (k-first state layout)")
    err = _reference_error(gate="none", A_log=np.zeros(2, np.float32), g=-np.abs(x["g"]))
    _assert_names(err, "A_log", "unused when the gate is pre-computed")


# One story on fp64 (README, docs/errors.md, help(flash_kda.reference), the C++ table): inputs
# the kernels read are bf16 or fp32 only; the reference also takes an fp64 initial_state, so
# that a final state it returned can start the next call.

@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta"])
def test_fp64_activation_rejected(name):
    x = _inputs()
    _assert_names(_reference_error(**{name: x[name].astype(np.float64)}), name,
                  "expected dtype bf16 or fp32, got fp64")


def test_fp64_gate_parameters_rejected():
    _assert_names(_reference_error(A_log=np.zeros(2, np.float64)), "A_log", "expected dtype fp32, got fp64")


def test_fp64_initial_state_accepted_and_chains():
    """Two calls chained through the returned fp64 state equal one call over both halves."""
    x = _inputs(T=8)
    first = {n: a[:, :4].copy() for n, a in x.items()}
    second = {n: a[:, 4:].copy() for n, a in x.items()}
    state0 = np.random.default_rng(1).standard_normal((1, 2, 3, 4)).astype(np.float32)
    whole, whole_state = flash_kda.reference(**x, initial_state=state0, output_final_state=True)
    out1, s1 = flash_kda.reference(**first, initial_state=state0, output_final_state=True)
    assert s1.dtype == np.float64
    out2, s2 = flash_kda.reference(**second, initial_state=s1, output_final_state=True)
    np.testing.assert_allclose(np.concatenate([out1, out2], axis=1), whole, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(s2, whole_state, rtol=1e-12, atol=1e-12)
    # fp64 without output_final_state too (nothing to pair it with)
    out_only, none = flash_kda.reference(**second, initial_state=s1)
    assert none is None
    np.testing.assert_array_equal(out_only, out2)


def test_fp64_story_in_the_docstring():
    doc = flash_kda.reference.__doc__
    assert "fp64 is rejected" in doc
    assert "bf16, fp32 or fp64 [N, HV, V, K]" in doc


# fwd


@pytest.fixture
def torch_module(monkeypatch):
    """PyTorch, or a stand-in with what fwd touches before the extension rejects host arrays."""
    try:
        import torch
        return torch
    except ImportError:
        stub = types.ModuleType("torch")

        class Tensor:  # nothing here is one: fwd takes the DLPack path
            pass

        stub.Tensor = Tensor
        from flash_kda import _core

        for name in _core.dtype_codes:  # torch.bfloat16, ...: fwd maps them to the library's codes
            setattr(stub, name, f"torch.{name}")
        monkeypatch.setitem(sys.modules, "torch", stub)
        return stub


def _fwd_args(**overrides):
    x = _inputs(K=128, V=128, T=16)
    H = 2
    kw = dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], scale=None, out=np.zeros_like(x["v"]),
              A_log=np.zeros(H, np.float32), dt_bias=np.zeros((H, 128), np.float32), lower_bound=-5.0)
    kw.update(overrides)
    return kw


def _fwd_error(**overrides) -> flash_kda.Error:
    kw = _fwd_args(**overrides)
    positional = [kw.pop(n) for n in ("q", "k", "v", "g", "beta", "scale", "out", "A_log", "dt_bias", "lower_bound")]
    with pytest.raises(flash_kda.Error) as info:
        flash_kda.fwd(*positional, **kw)
    return info.value


@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta", "out"])
def test_fwd_required_tensor_none(torch_module, name):
    _assert_names(_fwd_error(**{name: None}), name, "is required", "got None")


@pytest.mark.parametrize("name", ["q", "initial_state", "cu_seqlens", "cu_seqlens_cpu"])
def test_fwd_tensor_not_an_array(torch_module, name):
    _assert_names(_fwd_error(**{name: "hello"}), name, "expected an array", "got str")


def test_fwd_host_arrays_rejected_by_name(torch_module):
    _assert_names(_fwd_error(), "q", "is on the host, a CUDA tensor is needed")


def test_fwd_dtype_named(torch_module):
    x = _fwd_args()
    _assert_names(_fwd_error(beta=x["beta"].astype(np.bool_)), "beta", "expected dtype bf16 or fp32, got bool")


@pytest.mark.parametrize("name, value", [("lower_bound", "x"), ("lower_bound", "-5"), ("lower_bound", False),
                                         ("scale", "x"), ("scale", "0.5"), ("scale", True), ("scale", [1.0])])
def test_fwd_scalars(torch_module, name, value):
    _assert_names(_fwd_error(**{name: value}), name, "expected a real number")


def test_fwd_lower_bound_none(torch_module):
    _assert_names(_fwd_error(lower_bound=None), "lower_bound", "got None")


def test_fwd_check_cu_seqlens_must_be_bool(torch_module):
    _assert_names(_fwd_error(check_cu_seqlens="yes"), "check_cu_seqlens", "expected a bool")


def test_fwd_launch_options_type(torch_module):
    _assert_names(_fwd_error(launch_options={"num_sms": 8}), "launch_options",
                  "expected a flash_kda.LaunchOptions or None, got dict")


@pytest.mark.parametrize("field", ["num_sms", "window_slots", "segments", "recurrence_warps"])
@pytest.mark.parametrize("value, fragment", [(-1, "got -1"), (1.5, "got float"), (True, "got bool"),
                                             ("4", "got str"), (1 << 63, "expected an int in [0, ")])
def test_launch_options_fields(field, value, fragment):
    with pytest.raises(flash_kda.Error) as info:
        flash_kda.LaunchOptions(**{field: value})
    _assert_names(info.value, f"launch_options.{field}", fragment)


def test_launch_options_defaults_and_values():
    assert flash_kda.LaunchOptions()._as_tuple() == (0, 0, 0, 0)
    o = flash_kda.LaunchOptions(num_sms=66, window_slots=np.int64(3), segments=2, recurrence_warps=8)
    assert o._as_tuple() == (66, 3, 2, 8)
    assert all(type(v) is int for v in o._as_tuple())
    assert "launch_options.<field>" in flash_kda.LaunchOptions.__doc__


def test_fwd_keeps_flashkda_signature():
    """FlashKDA's positional order, names and defaults, then keyword-only additions."""
    params = list(inspect.signature(flash_kda.fwd).parameters.values())
    positional = [(p.name, p.default) for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    empty = inspect.Parameter.empty
    assert positional == [("q", empty), ("k", empty), ("v", empty), ("g", empty), ("beta", empty),
                          ("scale", empty), ("out", empty), ("A_log", empty), ("dt_bias", empty),
                          ("lower_bound", empty), ("initial_state", None), ("final_state", None),
                          ("cu_seqlens", None)]
    keyword_only = {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY}
    assert keyword_only == {"cu_seqlens_cpu": None, "check_cu_seqlens": False, "launch_options": None,
                            "ssm_state_indices": None,
                            "intermediate_states": None, "intermediate_offsets": None, "intermediate_every": 0,
                            "intermediate_include_initial": True}


def test_every_table_tensor_is_a_parameter():
    """The binding takes tensors in the call table's order, picked by name from fwd's and
    reference's locals: every name must be one of fwd's parameters."""
    from flash_kda import _core

    names = _core.forward_tensors
    assert names[:6] == ("q", "k", "v", "g", "beta", "out")
    assert names[-3:] == ("ssm_state_indices", "intermediate_states", "intermediate_offsets")
    assert set(names) <= set(inspect.signature(flash_kda.fwd).parameters)
    assert inspect.signature(flash_kda.fwd).parameters["ssm_state_indices"].kind is inspect.Parameter.KEYWORD_ONLY
