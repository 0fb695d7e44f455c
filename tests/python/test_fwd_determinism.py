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
    where = f"{case.name} (seed {base_seed()})"
    assert not torch.isnan(out1).any(), f"{where}: out has NaN"
    assert torch.equal(out1, out2), f"{where}: out differs between two identical calls"
    if state1 is not None:
        assert torch.equal(state1, state2), f"{where}: final_state differs between two identical calls"
