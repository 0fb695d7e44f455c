"""flash_kda.fwd is bitwise deterministic: identical inputs give identical out and
final_state, whatever the scratch memory held before and whichever stream runs the call."""
from __future__ import annotations

import pytest

from fwd_cases import Case, base_seed, make_inputs, run_fwd

pytestmark = pytest.mark.cuda_sm90  # conftest.py skips these without an sm_90 GPU and CUDA build

CASES = [
    Case("det_fixed_T2048_H96_fp32", heads=96, seqlen=2048, state="fp32"),
    Case("det_fixed_T8192_H4_bf16", heads=4, seqlen=8192, state="bf16"),
    Case("det_varlen_H8_bf16", heads=8, seq_lens=(0, 1, 517, 0, 16, 2049, 33, 1), state="bf16"),
    Case("det_fixed_T17_H4_nostate", heads=4, seqlen=17, batch=3),
    # Several of the kernel's record windows (~17k tokens each at H = 96), with carried states.
    Case("det_varlen_H96_fp32_multiwindow", heads=96, seq_lens=(12000, 0, 1, 9001, 20000), state="fp32"),
]


def _dirty_the_allocator(nbytes: int) -> None:
    """Leaves NaN bytes in PyTorch's cached blocks, so a workspace allocated next starts dirty
    and a result that depended on uninitialised scratch would change."""
    import torch

    junk = torch.full((nbytes // 4,), float("nan"), dtype=torch.float32, device="cuda")
    del junk


def _assert_same_bits(case, first, second, how: str):
    """first and second are (out, final_state or None) of two calls: no NaN, bitwise equal."""
    import torch

    where = f"{case.name} (seed {base_seed()})"
    assert not torch.isnan(first[0]).any(), f"{where}: out has NaN"
    assert torch.equal(first[0], second[0]), f"{where}: out differs {how}"
    if first[1] is not None:
        assert torch.equal(first[1], second[1]), f"{where}: final_state differs {how}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_two_calls_are_bitwise_identical(case):
    import torch

    x = make_inputs(case)
    out1, state1 = run_fwd(x)
    torch.cuda.synchronize()
    _dirty_the_allocator(1 << 30)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out2, state2 = run_fwd(x)
    torch.cuda.synchronize()
    _assert_same_bits(case, (out1, state1), (out2, state2), "between two identical calls")


@pytest.mark.parametrize("case", CASES[2:4], ids=lambda c: c.name)
def test_fast_path_and_dlpack_path_agree_bitwise(monkeypatch, case):
    """flash_kda.fwd hands CUDA torch tensors to the extension as raw descriptions
    (_core.forward_raw); anything else goes through DLPack (_core.forward). Both must describe
    the same memory the same way: bitwise identical results, and the torch call must really
    take the fast path."""
    import torch

    import flash_kda
    from flash_kda import _core

    x = make_inputs(case)
    calls = []
    real_raw = _core.forward_raw
    monkeypatch.setattr(_core, "forward_raw", lambda *a, **kw: (calls.append(1), real_raw(*a, **kw))[1])
    out_fast, state_fast = run_fwd(x)
    assert calls == [1], "flash_kda.fwd on CUDA torch tensors did not take the raw-description path"
    monkeypatch.setattr(_core, "forward_raw", real_raw)
    # Through DLPack: the same call with every tensor wrapped in an object that only has
    # __dlpack__ / __dlpack_device__, so the fast path cannot apply.
    class _DLPackOnly:
        def __init__(self, t):
            self.t, self.device = t, t.device

        def __dlpack__(self, *args, **kwargs):
            return self.t.__dlpack__(*args, **kwargs)

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    def wrap(t):
        return None if t is None else _DLPackOnly(t)

    out_dl = torch.full_like(x.v, float("nan"))
    state_dl = None if state_fast is None else torch.full_like(state_fast, float("nan"))
    flash_kda.fwd(wrap(x.q), wrap(x.k), wrap(x.v), wrap(x.g), wrap(x.beta), x.scale, wrap(out_dl), wrap(x.A_log),
                  wrap(x.dt_bias), x.lower_bound, initial_state=wrap(x.initial_state), final_state=wrap(state_dl),
                  cu_seqlens=wrap(x.cu_seqlens))
    torch.cuda.synchronize()
    _assert_same_bits(case, (out_fast, state_fast), (out_dl, state_dl), "between the raw and the DLPack path")
