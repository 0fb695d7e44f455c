"""flash_kda.fwd inside a CUDA graph: capture once, copy new values into the captured input
buffers, replay, and compare with an eager call on the same values (bitwise: the forward is
deterministic) and with the fp64 reference (relative Frobenius error <= 1e-2).

Capture fails if the call synchronises with the host or allocates outside PyTorch's caching
allocator; replaying with new cu_seqlens values (same N and total) fails if the launch
depended on the sequence lengths read on the host at capture time.
"""
from __future__ import annotations

import dataclasses

import pytest

from fwd_cases import (Case, Sample, base_seed, call_fwd, make_inputs, new_outputs, reference, rel_err,
                       run_fwd, sliced_outputs, spread_heads)

pytestmark = pytest.mark.cuda_sm90  # conftest.py skips these without an sm_90 GPU and CUDA build

BOUND = 1e-2
LENS = (0, 40, 1, 0, 100, 17, 16, 300)

CASES = [
    (Case("graph_fixed_T100_H4_fp32", heads=4, seqlen=100, batch=2, state="fp32"), None),
    (Case("graph_fixed_T1024_H96_nostate", heads=96, seqlen=1024, state=None), None),
    (Case("graph_varlen_H4_bf16", heads=4, seq_lens=LENS, state="bf16"), None),
    # Replay with the same N and total tokens but other lengths (reversed), zero-length ones moved.
    (Case("graph_varlen_H4_fp32_new_lengths", heads=4, seq_lens=LENS, state="fp32"), tuple(reversed(LENS))),
    # Several record windows (~17k tokens each at H = 96), so several launches per call.
    (Case("graph_varlen_H96_fp32_multiwindow_new_lengths", heads=96, seq_lens=(12000, 0, 1, 9001, 3),
          state="fp32"), (3, 9001, 1, 0, 12000)),
]


@pytest.mark.parametrize("case,replay_lens", CASES, ids=[c.name for c, _ in CASES])
def test_graph_replay_matches_eager_and_reference(case, replay_lens):
    import torch

    static = make_inputs(case)
    out, final_state = new_outputs(static)

    # Warm-up on a side stream first, as torch.cuda.graph's documentation requires.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call_fwd(static, out, final_state)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call_fwd(static, out, final_state)

    new_case = case if replay_lens is None else dataclasses.replace(case, seq_lens=replay_lens)
    fresh = make_inputs(new_case, seed=case.seed() + 1)
    for name in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens"):
        dst, src = getattr(static, name), getattr(fresh, name)
        if dst is not None:
            dst.copy_(src)
    out.fill_(float("nan"))
    if final_state is not None:
        final_state.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()

    eager_out, eager_state = run_fwd(fresh)
    torch.cuda.synchronize()
    where = f"{case.name} (seed {base_seed()})"
    assert torch.equal(out, eager_out), f"{where}: replayed out differs from the eager call"
    if final_state is not None:
        assert torch.equal(final_state, eager_state), f"{where}: replayed final_state differs from the eager call"

    sample = Sample(heads=spread_heads(case.heads, 6))
    ref_o, ref_s = reference(fresh, sample)
    o, s = sliced_outputs(fresh, out, final_state, sample)
    assert rel_err(o, ref_o) <= BOUND, f"{where}: replayed out error {rel_err(o, ref_o):.3e}"
    if s is not None:
        assert rel_err(s, ref_s) <= BOUND, f"{where}: replayed final_state error {rel_err(s, ref_s):.3e}"
    del graph
