"""flash_kda.fwd with more value heads than q/k heads (GVA: value head hv reads q/k head
hv / (HV / H), include/flash_kda/forward.h) and with fp32 g and beta, both accepted by the sm_90
forward; the standard cases use HV = H and bf16 gates.

Outputs are NaN-filled before each call and every element must come back finite (written).
Accuracy bound: relative Frobenius error <= 1e-2 against the fp64 reference (which takes the
same GVA shapes and dtypes); fla's chunk_kda is not run here.
"""
from __future__ import annotations

import pytest

from fwd_cases import Case, all_finite, check_against_reference, make_inputs, run_fwd

pytestmark = pytest.mark.cuda_sm90  # conftest.py skips these without an sm_90 GPU and CUDA build

BOUND = 1e-2

CASES = [
    Case("gva_H2_HV4_fixed_T100_B2_fp32", heads=2, value_heads=4, seqlen=100, batch=2, state="fp32"),
    Case("gva_H1_HV8_varlen_bf16", heads=1, value_heads=8, seq_lens=(0, 33, 1, 200), state="bf16"),
    Case("gva_H3_HV6_fixed_T47_nostate", heads=3, value_heads=6, seqlen=47),
    Case("gate_fp32_H4_fixed_T100_fp32", heads=4, seqlen=100, state="fp32", gate_dtype="fp32"),
    Case("gva_gate_fp32_H2_HV4_varlen_fp32", heads=2, value_heads=4, seq_lens=(17, 0, 64), state="fp32",
         gate_dtype="fp32"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_reference(case):
    x = make_inputs(case)
    assert x.v.shape[2] == case.hv and x.q.shape[2] == case.heads
    out, final_state = run_fwd(x)
    assert all_finite(out), f"{case.name}: an element of out was not written"
    if final_state is not None:
        assert all_finite(final_state), f"{case.name}: an element of final_state was not written"
    check_against_reference(x, out, final_state, bound=BOUND)
