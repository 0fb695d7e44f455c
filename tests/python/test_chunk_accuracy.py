"""Accuracy of flash_kda.chunk_kda over the chunk accuracy grid, side by side with fla's chunk_kda.

Every point is one chunk_kda call (fla 0.6.0's keywords, chunk_cases.make_call) run by flash_kda
and by fla's own Triton chunk_kda (the function behind fla's dispatch wrapper, so fla never
hands the call back to flash_kda) on the same inputs; both are measured against the fp64 CPU
reference (flash_kda.reference with the call's gate and flags, chunk_cases.reference). Relative
Frobenius error, out and final state (always asked for; fp32) at every point:
- ours has no NaN/Inf, ours <= 1e-2, and ours <= fla's error + 1e-4;
- where fla's own result is NaN/Inf or above 1e-2 (the extremes may do that to fla), or fla
  raises, ours is still finite and <= 1e-2, and the row says "fla non-finite" / "fla > bound" /
  "fla raised ..." instead of a ratio.
Inputs are fresh random draws each run (seed printed on failure and in the table;
FLASH_KDA_TEST_SEED replays one).

The grid (GRID below; 44 points):
- gate x length: every gate (safe: lower_bound -5 with A_log; softplus: A_log = log U(1, 16), fla's
  KimiDeltaAttention init; pre-computed log decay: use_gate_in_kernel=False, the softplus gate's
  decay) at every fixed length T in {1, 15, 16, 17, 100, 1024, 4096} (B = 2 up to 1024, else 1);
  the head count H in {1, 4, 32} and the initial state (none, bf16, fp32) rotate so that every T
  meets every H, every state and every gate, and every gate every H and every state;
- varlen: the VARLEN_MIX of test_fwd_accuracy.py (zero-length and 1-token sequences between
  lengths off and on the 16-grid, 1646 tokens) with each gate and state;
- extremes: softplus with A_log = log 16 and g ~ N(0, 3^2) (decays of -62 nats a token at the
  10% quantile, -112 at 1%, ~-230 at the worst); the pre-computed log decay of A_log = log U(16,
  500) (-460 nats at 10%, -870 at 1%, ~-2e3 at the worst); the safe gate saturated (A_log up to
  log 1e3, g ~ N(0, 20^2)); at T = 17, T = 1024 and the varlen mix;
- GVA (HV = 2H: 2/4 at T = 1024, 16/32 on the varlen mix), k-first state layout (2 points),
  beta already activated (use_beta_sigmoid_in_kernel=False), allow_neg_eigval (2 points) and
  no in-kernel l2norm (unit q/k rows, 2 points);
- the safe gate without A_log (fla's `lower_bound * sigmoid(g + dt_bias)`) and strided q, k, v,
  g, beta (views of one fused projection), 2 points each.
For HV > 4 value heads the reference runs on a spread of 4 of them (q/k heads sliced to match),
on inputs sliced to those heads: heads never interact, so this is the same comparison at a
fraction of the CPU cost.

CPU cost: the reference is the cost. Summed over the grid it takes ~1.5e5 (token, value head)
steps (MAX_REFERENCE_STEPS bounds it; every step four passes over the 128 x 128 fp64 state,
~130 kflop), ~36 us a step on one core. Measured for the whole grid on the 2-core development
machine: the reference 7.6 s of wall time on both cores (the longest point, T = 4096 x 4 heads,
0.8 s), the input draws (on the CPU, then copied to the GPU) 8.5 s. The reference threads over
(sequence, head) pairs; under gpu-check.sh's pytest-xdist (-n 8 on 16 cores) both together are
~2-3 s of wall time. fla's Triton compiles for the unbounded-gate path come on top (once per
worker and head count); fla's kernels of that path missing from fla_configs.json are pinned to
one configuration here (EXTRA_FLA_CONFIGS), so that they do not autotune. Estimate for the
module on the H200 under -n 8: 30-60 s, most of it Triton compiles.

The side-by-side table goes to $FLASH_KDA_REPORT_DIR/chunk-accuracy.md (when set) and to the
terminal at the end of the module; under pytest-xdist the workers' rows are merged as in
test_fwd_accuracy.py (grid_report.py). Set FLASH_KDA_REQUIRE_FLA=1 to fail, instead of skipping
the comparison, when fla cannot be imported (scripts/gpu-check.sh does).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import zlib

import numpy as np
import pytest

from chunk_cases import ChunkCase, make_call, reference
from fwd_cases import base_seed, rel_err, spread_heads
from grid_report import GridReport, fmt_err

pytestmark = pytest.mark.cuda_sm90  # conftest.py skips these without an sm_90 GPU and CUDA build

BOUND = 1e-2            # docs/kda-spec.md: rel. Frobenius error vs the fp64 reference
FLA_FACTOR = 1.0        # the accuracy target: ours at most fla's error on the same inputs
FLA_SLACK = 1e-4        # absolute slack: where both errors are the bf16 rounding of the result (ties)
SAMPLED_HEADS = 4       # value heads compared when HV is larger
MAX_REFERENCE_STEPS = 200_000  # the grid's (token, value head) steps of the fp64 reference

GATES = ("safe", "softplus", "none")
LENGTHS = (1, 15, 16, 17, 100, 1024, 4096)
HEADS = (1, 4, 32)
STATES = (None, "bf16", "fp32")
# Zero-length and 1-token sequences between ordinary ones, lengths off and on the 16-grid.
VARLEN_MIX = (0, 1, 37, 0, 16, 300, 1, 17, 1024, 0, 250)
# The extremes' gate laws (chunk_cases.ChunkCase's a_log_range, g_std).
EXTREME = {"softplus": dict(a_log_range=(16.0, 16.0), g_std=3.0),
           "none": dict(a_log_range=(16.0, 500.0)),
           "safe": dict(a_log_range=(16.0, 1e3), g_std=20.0)}

# fla's Triton kernels of the unbounded-gate path (safe_gate=False) that fla_configs.json (taken
# from the benchmark's safe-gate autotuning) does not name: one configuration of each one's own
# autotune list, so that every new head count does not autotune them (fla's numerics do not depend
# on the tile configuration).
EXTRA_FLA_CONFIGS = {
    "chunk_kda_fwd_kernel_intra_token_parallel": {"kwargs": {"BH": 4}, "num_warps": 4, "num_stages": 3},
    "chunk_local_cumsum_vector_kernel": {"kwargs": {"BS": 32}, "num_warps": 4, "num_stages": 3},
}

GATE_NAMES = {"safe": "safe (lb -5)", "safe_no_A": "safe, no A_log", "softplus": "softplus", "none": "log decay"}


@dataclasses.dataclass(frozen=True)
class Point:
    """One grid point: the chunk_kda call (case) and whether its gate law is an extreme."""

    case: ChunkCase
    extreme: bool = False

    @property
    def name(self) -> str:
        return self.case.name


def _case(name: str, gate: str, heads: int, T: int | None = None, lens: tuple | None = None,
          state: str | None = None, value_heads: int | None = None, **kw) -> ChunkCase:
    if lens is not None:
        return ChunkCase(name, gate=gate, heads=heads, value_heads=value_heads, lens=lens, state=state, **kw)
    return ChunkCase(name, gate=gate, heads=heads, value_heads=value_heads, batch=2 if T <= 1024 else 1,
                     seqlen=T, state=state, **kw)


def _grid() -> list:
    points = []
    # Every gate at every T; H and the state rotate (a Latin square: each T meets all three of
    # each, and so does each gate).
    for gi, gate in enumerate(GATES):
        for ti, T in enumerate(LENGTHS):
            H = HEADS[(gi + ti) % 3]
            state = STATES[(gi + 2 * ti) % 3]
            points.append(Point(_case(f"{gate}_T{T}_H{H}_{state or 'nostate'}", gate, H, T=T, state=state)))
    for gi, gate in enumerate(GATES):
        state = STATES[(gi + 1) % 3]
        points.append(Point(_case(f"{gate}_varlen_mix_H4_{state or 'nostate'}", gate, 4, lens=VARLEN_MIX,
                                  state=state)))
    for gate in ("softplus", "none"):
        law = EXTREME[gate]
        points.append(Point(_case(f"{gate}_extreme_T17_H4_fp32", gate, 4, T=17, state="fp32", **law), True))
        points.append(Point(ChunkCase(f"{gate}_extreme_T1024_H4_bf16", gate=gate, heads=4, batch=1, seqlen=1024,
                                      state="bf16", **law), True))
        points.append(Point(_case(f"{gate}_extreme_varlen_mix_H4_{'nostate' if gate == 'softplus' else 'fp32'}",
                                  gate, 4, lens=VARLEN_MIX, state=None if gate == "softplus" else "fp32",
                                  **law), True))
    points.append(Point(ChunkCase("safe_extreme_T1024_H4_fp32", gate="safe", heads=4, batch=1, seqlen=1024,
                                  state="fp32", **EXTREME["safe"]), True))
    # GVA, k-first, beta and l2norm flags.
    points += [
        Point(ChunkCase("softplus_gva_T1024_H2_HV4_bf16", gate="softplus", heads=2, value_heads=4, batch=1,
                        seqlen=1024, state="bf16")),
        Point(_case("safe_gva_varlen_mix_H16_HV32_fp32", "safe", 16, value_heads=32, lens=VARLEN_MIX,
                    state="fp32")),
        Point(ChunkCase("safe_kfirst_T1024_H4_fp32", gate="safe", heads=4, batch=1, seqlen=1024, state="fp32",
                        state_v_first=False)),
        Point(_case("none_kfirst_varlen_mix_H4_bf16", "none", 4, lens=VARLEN_MIX, state="bf16",
                    state_v_first=False)),
        Point(ChunkCase("safe_beta_activated_T1024_H4_bf16", gate="safe", heads=4, batch=1, seqlen=1024,
                        state="bf16", beta_sigmoid=False)),
        Point(ChunkCase("softplus_neg_eigval_T1024_H4_fp32", gate="softplus", heads=4, batch=1, seqlen=1024,
                        state="fp32", allow_neg_eigval=True)),
        Point(_case("none_neg_eigval_varlen_mix_H4_nostate", "none", 4, lens=VARLEN_MIX, allow_neg_eigval=True)),
        Point(ChunkCase("none_no_l2norm_T1024_H4_fp32", gate="none", heads=4, batch=1, seqlen=1024, state="fp32",
                        l2norm=False)),
        Point(_case("safe_no_l2norm_varlen_mix_H4_bf16", "safe", 4, lens=VARLEN_MIX, state="bf16", l2norm=False)),
        Point(_case("safe_no_A_T100_H4_bf16", "safe_no_A", 4, T=100, state="bf16")),
        Point(_case("safe_no_A_varlen_mix_H4_fp32", "safe_no_A", 4, lens=VARLEN_MIX, state="fp32")),
        Point(ChunkCase("softplus_strided_T1024_H4_fp32", gate="softplus", heads=4, batch=1, seqlen=1024,
                        state="fp32", strided=True)),
        Point(_case("safe_strided_varlen_mix_H4_bf16", "safe", 4, lens=VARLEN_MIX, state="bf16", strided=True)),
    ]
    return points


GRID = _grid()
COLUMNS = ("case", "gate", "shape / lengths", "heads (H/HV)", "state", "flags", "ours: out / state",
           "fla: out / state", "verdict")
REPORT = GridReport("chunk-accuracy", COLUMNS)


def reference_steps(point: Point) -> int:
    """(token, value head) steps the fp64 reference takes for `point` (the CPU cost)."""
    c = point.case
    tokens = sum(c.lens) if c.lens is not None else c.batch * c.seqlen
    return tokens * (len(spread_heads(c.hv, SAMPLED_HEADS) or range(c.hv)))


def gate_label(point: Point, names: dict = GATE_NAMES) -> str:
    return names[point.case.gate] + (" extreme" if point.extreme else "")


def shape_label(case: ChunkCase) -> str:
    if case.lens is None:
        return f"B{case.batch} x T{case.seqlen}"
    mix = " (varlen mix)" if tuple(case.lens) == VARLEN_MIX else ""
    return f"varlen {len(case.lens)} seqs, {sum(case.lens)} tok{mix}"


def heads_label(case: ChunkCase) -> str:
    sampled = spread_heads(case.hv, SAMPLED_HEADS)
    return f"{case.heads}/{case.hv}" + (f" ({len(sampled)} sampled)" if sampled else "")


def flags_label(case: ChunkCase) -> str:
    flags = [name for name, on in (("k-first", not case.state_v_first), ("no l2norm", not case.l2norm),
                                   ("beta activated", not case.beta_sigmoid),
                                   ("neg eigval", case.allow_neg_eigval), ("strided", case.strided)) if on]
    return ", ".join(flags) or "-"


def pair(a, b) -> str:
    return f"{fmt_err(a)} / {fmt_err(b)}"


def verdict(ours: tuple, fla, finite: bool = True, bound: float = BOUND, factor: float = FLA_FACTOR,
            slack: float = FLA_SLACK) -> tuple[str, list[str]]:
    """(the table's verdict, the failed checks) for our (out, state) errors and fla's: a pair of
    errors, or a string saying why there is none (fla not importable, fla raised). finite: ours
    has no NaN/Inf anywhere (the errors may cover sampled heads only)."""
    failures = [] if finite else ["NaN/Inf in ours"]
    failures += [f"{what} error {e:.3e} > {bound}" if math.isfinite(e) else f"{what} error non-finite"
                 for what, e in zip(("out", "state"), ours) if not (math.isfinite(e) and e <= bound)]
    if isinstance(fla, str):
        note = fla
    elif not all(math.isfinite(e) for e in fla):
        note = "fla non-finite"
    elif max(fla) > bound:
        note = "fla > bound"
    else:
        ratios = []
        for what, e, f in zip(("out", "state"), ours, fla):
            if not e <= factor * f + slack:
                failures.append(f"{what} error {e:.3e} > {factor} x fla's {f:.3e} + {slack:g}")
            ratios.append(e / f if f > 0 else (math.inf if e > 0 else 0.0))
        note = f"{max(ratios):.2f} x fla"
    return ("FAIL: " + "; ".join(failures) + f" ({note})" if failures else f"ok ({note})"), failures


@pytest.fixture(scope="module", autouse=True)
def _write_table(request):
    yield
    REPORT.finish(request, f"Accuracy of flash_kda.chunk_kda vs fla chunk_kda (Triton), relative Frobenius error "
                  f"against the fp64 reference (out / final state); bound {BOUND:g} and ours <= {FLA_FACTOR} x fla "
                  f"+ {FLA_SLACK:g} where fla is finite and within the bound; seed {base_seed()}.",
                  (p.name for p in GRID))


def point_seed(point: Point) -> int:
    """Per-point seed derived from the run seed, so points differ but a run replays."""
    return (base_seed() ^ zlib.crc32(point.name.encode())) & 0x7FFFFFFF


def sliced_call(args, kw, heads):
    """(args, kw) of the same call on value heads `heads` only (None: all), q/k heads matched to
    them (value head hv reads q/k head hv // (HV / H)), for the reference."""
    import torch

    if heads is None:
        return args, kw
    q, k, v, g, beta = args
    H, HV, Kd = q.shape[2], v.shape[2], q.shape[3]
    sel = torch.tensor(heads, device=v.device)
    qk = torch.tensor([hv // (HV // H) for hv in heads], device=v.device)
    kw = dict(kw)
    if kw.get("A_log") is not None:
        kw["A_log"] = kw["A_log"][sel]
    if kw.get("dt_bias") is not None:
        kw["dt_bias"] = kw["dt_bias"].view(HV, Kd)[sel].reshape(-1)
    if kw.get("initial_state") is not None:
        kw["initial_state"] = kw["initial_state"][:, sel]
    return (q[:, :, qk], k[:, :, qk], v[:, :, sel], g[:, :, sel], beta[:, :, sel]), kw


def _f64(t) -> np.ndarray:
    import torch

    return t.detach().to("cpu", dtype=torch.float64).numpy()


@functools.lru_cache(maxsize=None)
def fla_triton():
    """fla's undecorated chunk_kda (its Triton path, no backend dispatch) with its kernels pinned,
    or the reason it cannot be had."""
    import inspect

    try:
        from fla.ops.kda import chunk_kda
    except Exception as err:  # ImportError, or a Triton/einops import failure inside fla
        return f"fla.ops.kda is not importable: {err!r}"
    from fwd_cases import pin_fla_configs, pin_fla_kernels

    pin_fla_configs()
    if os.environ.get("FLASH_KDA_TEST_FLA_AUTOTUNE") != "1":
        pin_fla_kernels(EXTRA_FLA_CONFIGS, only_autotuning=True)
    return inspect.unwrap(chunk_kda)


def fla_or_reason():
    """fla_triton(): fla's Triton chunk_kda, or the reason it cannot be had, which fails the test
    under FLASH_KDA_REQUIRE_FLA=1."""
    fn = fla_triton()
    if isinstance(fn, str) and os.environ.get("FLASH_KDA_REQUIRE_FLA") == "1":
        pytest.fail(f"FLASH_KDA_REQUIRE_FLA=1 but {fn}")
    return fn


def fla_guarded(run):
    """run(fn) with fn fla's Triton chunk_kda (fla_or_reason), or a string saying why there is
    no result (fla not to be had, or run raising). Asserts that no call reached flash_kda: a
    comparison with ourselves would make the bounds relative to fla vacuous."""
    from flash_kda.bench.impls import count_flash_kda_calls

    fn = fla_or_reason()
    if isinstance(fn, str):
        return fn
    try:
        with count_flash_kda_calls() as calls:
            result = run(fn)
    except Exception as err:  # recorded in the table: fla's own limits are not our failure
        return f"fla raised {type(err).__name__}: {str(err)[:80]}"
    assert not calls[0], "fla's Triton chunk_kda dispatched to flash_kda: no Triton reference"
    return result


def run_fla(args, kw):
    """fla's (out, final state) on the same call, or a string saying why there is none. fla's
    Triton path asserts an fp32 initial state: a bf16 one is widened (exactly) for fla only."""
    import torch

    kw = dict(kw)
    if kw.get("initial_state") is not None:
        kw["initial_state"] = kw["initial_state"].float()

    def run(fn):
        with torch.inference_mode():
            out, final = fn(*args, **kw)
        return out, final

    return fla_guarded(run)


@pytest.mark.parametrize("point", GRID, ids=lambda p: p.name)
def test_chunk_accuracy_vs_reference_and_fla(cuda_sm90, point):
    import torch

    import flash_kda

    case = point.case
    seed = point_seed(point)
    where = f"{case.name} (seed {base_seed()})"
    args, kw, _ = make_call(case, cuda_sm90, seed=seed)
    with torch.inference_mode():
        out, final = flash_kda.chunk_kda(*args, **kw)
    fla = run_fla(args, kw)
    torch.cuda.synchronize(cuda_sm90)
    finite = bool(torch.isfinite(out).all()) and bool(torch.isfinite(final).all())

    heads = spread_heads(case.hv, SAMPLED_HEADS)
    ref_o, ref_s = (np.asarray(r, dtype=np.float64) for r in reference(*sliced_call(args, kw, heads)))

    def errors(o, s):
        if heads is not None:
            sel = torch.tensor(heads, device=o.device)
            o, s = o[:, :, sel], s[:, sel]
        return rel_err(_f64(o), ref_o), rel_err(_f64(s), ref_s)

    ours = errors(out, final)
    fla_err = fla if isinstance(fla, str) else errors(*fla)
    text, failures = verdict(ours, fla_err, finite)
    REPORT.keep(case.name, [case.name, gate_label(point), shape_label(case), heads_label(case),
                            case.state or "none", flags_label(case), pair(*ours),
                            fla_err if isinstance(fla_err, str) else pair(*fla_err), text])
    assert not failures, f"{where}: " + "; ".join(failures)
