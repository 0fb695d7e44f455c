"""In-place state update: final_state passed as the very tensor given as initial_state gives
bitwise the same out and final state as separate buffers (each sequence's state must be read
completely before it is overwritten, including across the kernel's internal windows)."""
from __future__ import annotations

import pytest

from fwd_cases import Case, base_seed, call_fwd, make_inputs, new_outputs, run_fwd

pytestmark = pytest.mark.cuda_sm90  # conftest.py skips these without an sm_90 GPU and CUDA build

CASES = [
    Case("inplace_fixed_T100_H4_bf16", heads=4, seqlen=100, batch=2, state="bf16"),
    Case("inplace_fixed_T1_H4_fp32", heads=4, seqlen=1, batch=3, state="fp32"),
    Case("inplace_fixed_T8192_H96_fp32", heads=96, seqlen=8192, state="fp32"),
    Case("inplace_varlen_H4_fp32", heads=4, seq_lens=(0, 33, 1, 0, 2000, 16), state="fp32"),
    Case("inplace_varlen_H8_bf16", heads=8, seq_lens=(700, 0, 17, 5000), state="bf16"),
    # Past the kernel's ~2 GiB record window (about 17k tokens at H = 96): a sequence's state is
    # carried across windows while the in-place buffer is being overwritten.
    Case("inplace_fixed_T20000_H96_fp32_multiwindow", heads=96, seqlen=20000, state="fp32"),
    Case("inplace_varlen_H96_bf16_multiwindow", heads=96, seq_lens=(9000, 0, 15000, 1), state="bf16"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_in_place_state_equals_separate_buffers(case):
    import torch

    x = make_inputs(case)
    out_sep, state_sep = run_fwd(x)

    state = x.initial_state.clone()
    out_inp, _ = new_outputs(x)
    call_fwd(x, out_inp, state, initial_state=state)
    torch.cuda.synchronize()

    where = f"{case.name} (seed {base_seed()})"
    assert torch.isfinite(state_sep).all() and torch.isfinite(out_sep).all(), f"{where}: NaN/Inf"
    assert torch.equal(out_inp, out_sep), f"{where}: out differs when the state is updated in place"
    assert torch.equal(state, state_sep), f"{where}: final state differs when updated in place"
    assert not torch.equal(state, x.initial_state), f"{where}: the in-place state was not updated"
