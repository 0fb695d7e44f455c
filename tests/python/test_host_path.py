"""The shortcuts of the Python host path answer as the general checks do, on CPU: chunk_kda's
flags (one type test when all are bools, else each checked in order), the raw descriptions of
torch tensors (is_cpu standing for device.type == "cpu"), _cuda_device, and the int and float
fast paths of fwd's scalars. Skips without torch."""
from __future__ import annotations

import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flash_kda  # noqa: E402
from flash_kda import _chunk, _core, _forward  # noqa: E402

FLAGS = (True, False, True, True, False, True, False, False, True, False)


def _checked(values):
    """What the general path gives: _flag on each value, in _FLAGS' order."""
    return tuple(_chunk._flag(n, x) for n, x in zip(_chunk._FLAGS, values))


def test_flags_of_bools_are_the_checked_flags():
    assert _chunk._flags(FLAGS) == _checked(FLAGS) == FLAGS


def test_numpy_bool_flags_become_python_bools():
    got = _chunk._flags(tuple(np.bool_(x) for x in FLAGS))
    assert got == FLAGS and all(type(x) is bool for x in got)


@pytest.mark.parametrize("bad", [0, 1, 1.0, None, "True", np.int64(1)])
def test_the_first_flag_that_is_not_a_bool_is_named(bad):
    for i, name in enumerate(_chunk._FLAGS):
        values = list(FLAGS)
        values[i] = bad
        if i + 1 < len(values):
            values[-1] = bad  # a later bad flag too: the first is named
        with pytest.raises(flash_kda.Error) as fast:
            _chunk._flags(tuple(values))
        with pytest.raises(flash_kda.Error) as general:
            _checked(tuple(values))
        assert fast.value.argument == general.value.argument == name
        assert str(fast.value) == str(general.value)


def test_chunk_kda_names_a_non_bool_flag_before_the_tensors():
    x = torch.zeros(1, 16, 2, 128, dtype=torch.bfloat16)
    with pytest.raises(flash_kda.Error) as e:
        flash_kda.chunk_kda(x, x, x, x, x[..., 0], output_final_state=True, use_graph=1)
    assert e.value.argument == "use_graph" and "expected a bool, got int 1" in str(e.value)


def test_raw_description_of_a_host_view():
    t = torch.zeros(2, 3, dtype=torch.bfloat16)[:, 1:]
    (raw,) = _forward._raw_descriptions((t,), torch)
    assert raw == (t.data_ptr(), _core.dtype_codes["bfloat16"], (2, 2), (3, 1), -1)


def test_raw_descriptions_keep_none_and_name_dtypes_without_a_code():
    raw = _forward._raw_descriptions((None, torch.zeros(2, dtype=torch.bool), torch.zeros(2)), torch)
    assert raw[0] is None and raw[1][1] == "bool" and raw[2][1] == _core.dtype_codes["float32"]


@pytest.mark.parametrize("other", [torch.empty(2, device="meta"), np.zeros(2), [0.0]])
def test_raw_descriptions_leave_other_devices_and_types_to_dlpack(other):
    assert _forward._raw_descriptions((torch.zeros(2), other), torch) is None


def test_cuda_device_is_none_off_the_gpu_and_reads_device_type_of_other_objects():
    assert _forward._cuda_device(torch.zeros(1), torch) is None
    assert _forward._cuda_device(torch.empty(1, device="meta"), torch) is None
    assert _forward._cuda_device(np.zeros(1), torch) is None
    gpu_like = types.SimpleNamespace(device=types.SimpleNamespace(type="cuda", index=0))
    assert _forward._cuda_device(gpu_like, torch) is gpu_like.device


@pytest.mark.parametrize("value, expected", [(0.5, 0.5), (np.float32(0.5), 0.5), (-3, -3.0), (np.int64(2), 2.0)])
def test_real_gives_a_float(value, expected):
    got = _forward._real("scale", value)
    assert got == expected and type(got) is float


@pytest.mark.parametrize("value", [True, "0.5", None])
def test_real_refuses_what_is_not_a_real_number(value):
    with pytest.raises(flash_kda.Error) as e:
        _forward._real("scale", value)
    assert e.value.argument == "scale"


def _fwd(**extra):
    x = torch.zeros(1, 16, 2, 128, dtype=torch.bfloat16)
    with pytest.raises(flash_kda.Error) as e:
        flash_kda.fwd(x, x, x, x, x[..., 0], None, torch.empty_like(x), torch.zeros(2), torch.zeros(256), -5.0, **extra)
    return e.value


@pytest.mark.parametrize("every", [0, 16, np.int64(16)])
def test_fwd_takes_int_intermediate_every_to_the_cpp_validation(every):
    assert _fwd(intermediate_every=every).argument == "q"  # host q: the C++ validation's first error


@pytest.mark.parametrize("every, words", [(True, "got bool"), (16.0, "got float"), (1 << 63, "got 9223372036854775808")])
def test_fwd_refuses_intermediate_every_that_is_not_an_int64(every, words):
    e = _fwd(intermediate_every=every)
    assert e.argument == "intermediate_every" and words in str(e), str(e)
