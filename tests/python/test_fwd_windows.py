"""flash_kda.fwd through the launch paths that the standard shapes rarely take.

Each path is forced with flash_kda.LaunchOptions (fwd's launch_options):

- Windows: long inputs are processed in windows of chunk slots with the state of the sequence
  crossing a window boundary carried between windows (src/sm90/). window_slots forces windows
  of 1, 3 or 7 slots so that small problems cross many windows, sequences span 3+ windows and
  windows start inside empty sequences.
- Block widths: both recurrence block widths (recurrence_warps = 4, 8: one or two
  warpgroups), which the plan otherwise picks from the shape.
- Segments: segments forces the segment-parallel path (each sequence cut into
  segments whose affine state maps are combined by a scan, src/sm90/segment_scan.cu) that the
  heuristic picks for few heads and long sequences; with segment counts that do and do not
  divide the chunk count, varlen batches with empty and 1-token sequences, every state dtype
  and the in-place state update.
- cu_seqlens values out of range on the GPU (unchecked there: no synchronisation allowed) are
  clamped: the call completes without a fault, and the well-formed sequences before the first
  bad offset are still exact.

Accuracy bound: relative Frobenius error <= 1e-2 against the fp64 reference.
"""
from __future__ import annotations

import pytest

from fwd_cases import Case, Sample, all_finite, call_fwd, check_against_reference, make_inputs, new_outputs, run_fwd

from flash_kda import LaunchOptions

pytestmark = pytest.mark.cuda_sm90

BOUND = 1e-2
LENS = (40, 0, 1, 70, 0, 33)


@pytest.mark.parametrize("window", [1, 3, 7])
@pytest.mark.parametrize("warps", [4, 8])
def test_windows_and_block_widths(window, warps):
    case = Case(f"varlen_window{window}_warps{warps}_fp32", heads=3, seq_lens=LENS, state="fp32")
    x = make_inputs(case)
    out, final_state = run_fwd(x, LaunchOptions(window_slots=window, recurrence_warps=warps))
    assert all_finite(out) and all_finite(final_state), f"{case.name}: an element was not written"
    check_against_reference(x, out, final_state, bound=BOUND)


@pytest.mark.parametrize("warps", [4, 8])
def test_fixed_length_over_windows(warps):
    case = Case(f"fixed_T100_B3_window5_warps{warps}_bf16", heads=2, seqlen=100, batch=3, state="bf16")
    x = make_inputs(case)
    out, final_state = run_fwd(x, LaunchOptions(window_slots=5, recurrence_warps=warps))
    check_against_reference(x, out, final_state, bound=BOUND)


@pytest.mark.parametrize("bad", ["past_end", "negative", "decreasing", "overlapping"])
def test_out_of_range_cu_seqlens_are_clamped(bad):
    import torch

    case = Case(f"varlen_bad_cu_{bad}_fp32", heads=2, seq_lens=(20, 30, 10), state="fp32")
    x = make_inputs(case)
    # Clamped, the bad offsets below give ranges that overlap no good sequence's rows (an
    # overlapping range, e.g. a negative start clamped to 0, makes every overlapped row
    # unspecified: docs/errors.md), so the leading sequences must come out right.
    # "overlapping" (sequence 2 clamped to rows 0..60) only has to run without a fault.
    cu = {"past_end": [0, 20, 50, 1 << 40], "negative": [0, 20, 50, -7],
          "decreasing": [0, 20, 60, 50], "overlapping": [0, 20, -7, 60]}[bad]
    good = {"past_end": 2, "negative": 2, "decreasing": 1, "overlapping": 0}[bad]
    x.cu_seqlens = torch.tensor(cu, dtype=torch.int64, device=x.v.device)
    out, final_state = new_outputs(x, fill=0.0)
    call_fwd(x, out, final_state)
    torch.cuda.synchronize()  # raises on a device fault
    if good:
        check_against_reference(x, out, final_state, Sample(seqs=tuple(range(good))), BOUND)


SEGMENT_CASES = [
    Case("fixed_T1000_B2_H2_fp32", heads=2, seqlen=1000, batch=2, state="fp32"),
    Case("fixed_T777_B1_H3_bf16", heads=3, seqlen=777, state="bf16"),
    Case("fixed_T512_B2_H2_nostate", heads=2, seqlen=512, batch=2),
    Case("fixed_T600_B1_H2_fp32_final_only", heads=2, seqlen=600, state="fp32", with_initial=False),
    Case("varlen_mix_H2_fp32", heads=2, seq_lens=(300, 0, 1, 17, 700, 0), state="fp32"),
]


@pytest.mark.parametrize("segments", [2, 3, 8])
@pytest.mark.parametrize("case", SEGMENT_CASES, ids=lambda c: c.name)
def test_segment_parallel_path(case, segments):
    x = make_inputs(case)
    out, final_state = run_fwd(x, LaunchOptions(segments=segments))
    assert all_finite(out), f"{case.name}: an element of out was not written"
    if final_state is not None:
        assert all_finite(final_state), f"{case.name}: an element of final_state was not written"
    check_against_reference(x, out, final_state, bound=BOUND)


def test_segment_parallel_in_place_state():
    import torch

    x = make_inputs(Case("fixed_T900_B2_H2_fp32_inplace", heads=2, seqlen=900, batch=2, state="fp32"))
    state = x.initial_state.clone()
    out, _ = new_outputs(x)
    call_fwd(x, out, state, initial_state=state, launch_options=LaunchOptions(segments=4))  # in place
    torch.cuda.synchronize()
    check_against_reference(x, out, state, bound=BOUND)
