"""flash_kda.fwd at any length: T = 1, T < 16, T off the 16-token chunk grid, zero-length
sequences inside a varlen batch, thousands of sequences, and 1M+ tokens x 96 heads (element
offsets past 2^31, so 32-bit indexing would fail).

Outputs are NaN-filled before each call and every element must come back finite (written).
Accuracy bound: relative Frobenius error <= 1e-2 against the fp64 reference. A zero-length
sequence writes no output and passes its state through unchanged: final_state equals
initial_state bitwise (zero without an initial state).
"""
from __future__ import annotations

import numpy as np
import pytest

from fwd_cases import (HEAD_DIM, Case, Inputs, Sample, all_finite, base_seed, call_fwd, check_against_reference,
                       make_inputs, new_outputs, random_lengths, run_fwd)

pytestmark = pytest.mark.cuda_sm90  # conftest.py skips these without an sm_90 GPU and CUDA build

BOUND = 1e-2


def _check_against_reference(x: Inputs, out, final_state, sample: Sample = Sample()) -> None:
    where = f"{x.case.name} (seed {base_seed()})"
    assert all_finite(out), f"{where}: out has NaN/Inf: some element was not written"
    if final_state is not None:
        assert all_finite(final_state), f"{where}: final_state has NaN/Inf: some element was not written"
    check_against_reference(x, out, final_state, sample, BOUND)


def _check_empty_sequences_pass_state(x: Inputs, final_state) -> None:
    import torch

    if final_state is None:
        return
    for n in range(x.case.num_seqs):
        if x.starts[n + 1] != x.starts[n]:
            continue
        if x.initial_state is None:
            assert torch.count_nonzero(final_state[n]) == 0, \
                f"{x.case.name}: empty sequence {n} without initial_state must end in the zero state"
        else:
            assert torch.equal(final_state[n], x.initial_state[n]), \
                f"{x.case.name}: empty sequence {n} must pass its initial_state through unchanged"


SHORT = [Case(f"fixed_T{T}_H4_B3_{state}", heads=4, seqlen=T, batch=3, state=state)
         for T, state in ((1, "fp32"), (2, "bf16"), (7, "fp32"), (15, "bf16"), (31, "fp32"), (33, "bf16"),
                          (47, None), (1, None))]


@pytest.mark.parametrize("case", SHORT, ids=lambda c: c.name)
def test_short_and_unaligned_fixed_lengths(case):
    x = make_inputs(case)
    out, final_state = run_fwd(x)
    _check_against_reference(x, out, final_state)


EMPTY = [Case(f"varlen_empty_{state}_{'init' if init else 'noinit'}", heads=4,
              seq_lens=(0, 0, 5, 0, 1, 0, 31, 16, 0), state=state, with_initial=init)
         for state, init in (("fp32", True), ("bf16", True), ("fp32", False), ("bf16", False), (None, False))]
EMPTY.append(Case("varlen_empty_first_and_last_fp32", heads=2, seq_lens=(0, 70, 0), state="fp32"))
EMPTY.append(Case("varlen_single_token_seqs_bf16", heads=4, seq_lens=(1,) * 50, state="bf16"))
# T_total = 0 is a valid call (docs/errors.md): nothing to write but the passed-through states.
EMPTY.append(Case("varlen_all_empty_fp32", heads=4, seq_lens=(0, 0, 0), state="fp32"))
EMPTY.append(Case("fixed_T0_B2_bf16", heads=4, seqlen=0, batch=2, state="bf16"))


@pytest.mark.parametrize("case", EMPTY, ids=lambda c: c.name)
def test_zero_length_sequences_in_varlen(case):
    x = make_inputs(case)
    out, final_state = run_fwd(x)
    _check_against_reference(x, out, final_state)
    _check_empty_sequences_pass_state(x, final_state)


def test_thousands_of_sequences():
    rng = np.random.default_rng(base_seed())
    lens = random_lengths(rng, 3000, 0, 40, force=(0, 1, 15, 16, 17, 40))
    case = Case("varlen_3000_seqs_H8_fp32", heads=8, seq_lens=lens, state="fp32")
    x = make_inputs(case)
    out, final_state = run_fwd(x)
    _check_against_reference(x, out, final_state)
    _check_empty_sequences_pass_state(x, final_state)


MILLION_HEADS = 96
MILLION_TOKENS = (1 << 20) + 3  # past 2^20 and off the 16-token grid


def _million_token_lengths(rng) -> tuple:
    """~64 sequences summing to MILLION_TOKENS: random cut points, two of them doubled (zero-length
    sequences) and one followed by a cut one token later (a 1-token sequence)."""
    cuts = [int(c) for c in rng.integers(1, MILLION_TOKENS - 1, size=60)]
    cuts += [cuts[0], cuts[1], cuts[2] + 1]
    bounds = [0] + sorted(cuts) + [MILLION_TOKENS]
    return tuple(b - a for a, b in zip(bounds[:-1], bounds[1:]))


@pytest.mark.large_memory  # ~124 GiB of the GPU: run alone (scripts/gpu-check.sh does)
def test_million_tokens_96_heads():
    """1M+ tokens x 96 heads (each bf16 tensor ~24 GiB; element offsets beyond 2^34). The
    reference checks three sequences (the first, the one holding element offset 2^31, the
    last) on three heads; every element of out and final_state must be written."""
    import torch

    rng = np.random.default_rng(base_seed())
    lens = _million_token_lengths(rng)
    assert sum(lens) == MILLION_TOKENS
    case = Case("varlen_1M_tokens_H96_fp32", heads=MILLION_HEADS, seq_lens=lens, state="fp32")
    per_tensor = MILLION_TOKENS * MILLION_HEADS * HEAD_DIM * 2
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    # q, k, v, g, out are ~24 GiB each; the workspace is bounded (~2 GiB), the states ~0.4 GiB.
    need = 5 * per_tensor + (4 << 30)
    if free < need:
        pytest.skip(f"needs ~{need >> 30} GiB free on the GPU, has {free >> 30} GiB")

    x = make_inputs(case)
    out, final_state = new_outputs(x)
    call_fwd(x, out, final_state)
    torch.cuda.synchronize()

    starts = x.starts
    boundary_token = (1 << 31) // (MILLION_HEADS * HEAD_DIM) + 1  # first token whose offsets pass 2^31
    nonempty = [n for n in range(case.num_seqs) if starts[n + 1] > starts[n]]
    crossing = next(n for n in nonempty if starts[n + 1] > boundary_token)
    seqs = tuple(sorted({nonempty[0], crossing, nonempty[-1]}))
    try:
        _check_against_reference(x, out, final_state, Sample(heads=(0, 47, 95), seqs=seqs))
        _check_empty_sequences_pass_state(x, final_state)
    finally:
        del x, out, final_state
        torch.cuda.empty_cache()
