"""The gradient grid: flash_kda.chunk_kda's backward against the fp64 yardstick, beside fla's.

Every point is one chunk_kda call (fla 0.6.0's keywords, chunk_cases.make_call: bf16 q, k, v,
beta, g bf16 (fp32 for the pre-computed decay), fp32 A_log and dt_bias, the initial state in
the point's dtype) with every input requiring grad, and the loss
sum(o * do) + sum(final_state * dht) for random do (bf16, like o) and dht (fp32, like the final
state). Its gradients dq, dk, dv, dg, dbeta, dA_log, ddt_bias, d initial_state (those of the
inputs the call has) come from
- flash_kda.chunk_kda (ours: torch.autograd through flash_kda's backward);
- fla's own Triton chunk_kda (the function behind fla's dispatch wrapper, so fla never hands
  the call to flash_kda; a bf16 initial state widened exactly to the fp32 fla requires);
- flash_kda.autograd_reference on fp64 copies of the same inputs, do and dht (the yardstick:
  exact fp64 autograd through the recurrence of docs/kda-spec.md, on the GPU).
Each gradient's relative Frobenius error against the yardstick's, at every point:
- ours has no NaN/Inf and each error <= BOUND (2e-2);
- ours <= FLA_FACTOR (1.1) x max(fla's error, the floor) + FLA_SLACK (1e-4) for each gradient
  fla gives with a finite error <= BOUND (the issue's rule, "ours at most fla's", with a 10%
  slack factor for run-to-run noise). The floor is the error of the yardstick's own gradient
  rounded to the dtype ours is returned in (bf16 for bf16 inputs): no gradient of that dtype
  can be closer, so where fla's error is below it (fla's gradient of an exactly representable
  value, or by luck on a tiny case) ours is held to the floor instead;
  where fla's gradient is missing, non-finite or above BOUND, or fla raises, ours is held to
  BOUND alone and the table says why.
Without fla (not importable) the fla columns say so and only BOUND is checked
(FLASH_KDA_REQUIRE_FLA=1 fails instead, as in test_chunk_accuracy.py).

The grid (GRID, 44 points):
- gate x length: each gate (safe: lower_bound -5 with A_log; safe without A_log; softplus:
  A_log = log U(1, 16); the pre-computed log decay of the softplus gate) at every T in
  {1, 15, 16, 17, 100, 1024, 8192} (B = 2 up to 1024, else 1), H in {1, 4, 32} and the initial
  state (none, bf16, fp32) rotating so that every T meets every H and every state;
- varlen: test_chunk_accuracy.VARLEN_MIX (zero-length and 1-token sequences among lengths off and
  on the 16-grid, 1646 tokens) for each gate;
- extremes (test_chunk_accuracy.EXTREME's laws): softplus with A_log = log 16, g ~ N(0, 3^2)
  (tens of nats a token); the pre-computed decay of A_log = log U(16, 500) (hundreds); the safe
  gate saturated; at T = 17 / 1024 and on the varlen mix;
- GVA (HV = 2H), the k-first state layout, beta already activated, allow_neg_eigval, and no
  in-kernel L2 norm.

The table goes to $FLASH_KDA_REPORT_DIR/backward-grid.md (when set) and to the terminal at the
end of the module (grid_report.py; pytest-xdist workers' rows merged). Inputs are fresh random
draws each run (seed in the table and in failure messages; FLASH_KDA_TEST_SEED replays one).
Cost: the yardstick runs in fp64 on the GPU (T = 8192 x 32 heads: 128 chunks of 64 tokens, a
few seconds forward and backward); fla's backward kernels autotune once per head count and flag
set on first use (its forward kernels are pinned as in test_chunk_accuracy.py).
"""
from __future__ import annotations

import math

import pytest

from chunk_cases import ChunkCase, make_call
from fwd_cases import base_seed
from grid_report import GridReport, fmt_err
from test_chunk_accuracy import (EXTREME, VARLEN_MIX, Point, flags_label, fla_guarded, gate_label, point_seed,
                                 shape_label)

BOUND = 2e-2        # the issue's bound on each gradient's rel. Frobenius error vs the fp64 yardstick
FLA_FACTOR = 1.1    # ours <= 1.1 x fla's error (+ FLA_SLACK): "at most fla's", with 10% for noise
FLA_SLACK = 1e-4    # absolute slack: both errors at the bf16 rounding floor on tiny cases

GATES = ("safe", "safe_no_A", "softplus", "none")
LENGTHS = (1, 15, 16, 17, 100, 1024, 8192)
HEADS = (1, 4, 32)
STATES = (None, "bf16", "fp32")
#: The gradients compared, by the input they belong to (d initial_state is "dh0" in the table).
GRADS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state")
GRAD_LABELS = {"q": "dq", "k": "dk", "v": "dv", "g": "dg", "beta": "dbeta", "A_log": "dA_log",
               "dt_bias": "ddt_bias", "initial_state": "dh0"}
GATE_NAMES = {"safe": "safe (lb -5)", "safe_no_A": "safe, no A_log", "softplus": "softplus", "none": "log decay"}


def _fixed(name: str, gate: str, H: int, T: int, state, **kw) -> ChunkCase:
    return ChunkCase(name, gate=gate, heads=H, batch=2 if T <= 1024 else 1, seqlen=T, state=state, **kw)


def _grid() -> list:
    points = []
    for gi, gate in enumerate(GATES):
        for ti, T in enumerate(LENGTHS):
            H = HEADS[(gi + ti) % 3]
            state = STATES[(gi + 2 * ti) % 3]
            points.append(Point(_fixed(f"{gate}_T{T}_H{H}_{state or 'nostate'}", gate, H, T, state)))
    for gi, gate in enumerate(GATES):
        state = STATES[(gi + 1) % 3]
        points.append(Point(ChunkCase(f"{gate}_varlen_mix_H4_{state or 'nostate'}", gate=gate, heads=4,
                                      lens=VARLEN_MIX, state=state)))
    points += [
        Point(_fixed("softplus_extreme_T17_H4_fp32", "softplus", 4, 17, "fp32", **EXTREME["softplus"]), True),
        Point(_fixed("softplus_extreme_T1024_H4_bf16", "softplus", 4, 1024, "bf16", **EXTREME["softplus"]), True),
        Point(ChunkCase("softplus_extreme_varlen_mix_H4_nostate", gate="softplus", heads=4, lens=VARLEN_MIX,
                        state=None, **EXTREME["softplus"]), True),
        Point(_fixed("none_extreme_T1024_H4_fp32", "none", 4, 1024, "fp32", **EXTREME["none"]), True),
        Point(ChunkCase("none_extreme_varlen_mix_H4_bf16", gate="none", heads=4, lens=VARLEN_MIX, state="bf16",
                        **EXTREME["none"]), True),
        Point(_fixed("safe_extreme_T1024_H4_fp32", "safe", 4, 1024, "fp32", **EXTREME["safe"]), True),
        Point(ChunkCase("softplus_gva_T1024_H2_HV4_bf16", gate="softplus", heads=2, value_heads=4, batch=1,
                        seqlen=1024, state="bf16")),
        Point(ChunkCase("safe_gva_varlen_mix_H16_HV32_fp32", gate="safe", heads=16, value_heads=32, lens=VARLEN_MIX,
                        state="fp32")),
        Point(_fixed("safe_kfirst_T1024_H4_fp32", "safe", 4, 1024, "fp32", state_v_first=False)),
        Point(_fixed("safe_beta_activated_T100_H4_bf16", "safe", 4, 100, "bf16", beta_sigmoid=False)),
        Point(_fixed("softplus_neg_eigval_T1024_H4_fp32", "softplus", 4, 1024, "fp32", allow_neg_eigval=True)),
        Point(ChunkCase("none_no_l2norm_varlen_mix_H4_fp32", gate="none", heads=4, lens=VARLEN_MIX, state="fp32",
                        l2norm=False)),
    ]
    return points


GRID = _grid()
COLUMNS = ("case", "gate", "shape / lengths", "heads (H/HV)", "state", "flags",
           *(f"{GRAD_LABELS[n]} ours / fla" for n in GRADS), "verdict")
REPORT = GridReport("backward-grid", COLUMNS)


def differentiable(kw: dict) -> tuple:
    """The names (GRADS order) of the inputs of a chunk_kda call that take part in it: q, k, v, g,
    beta always; A_log and dt_bias with the fused gate when given; initial_state when given."""
    gate = kw.get("use_gate_in_kernel", False)
    return tuple(n for n in GRADS if n in ("q", "k", "v", "g", "beta")
                 or (n in ("A_log", "dt_bias") and gate and kw.get(n) is not None)
                 or (n == "initial_state" and kw.get(n) is not None))


def verdict(ours: dict, fla, finite: bool = True, bound: float = BOUND, factor: float = FLA_FACTOR,
            slack: float = FLA_SLACK, floors: dict | None = None) -> tuple[str, list[str]]:
    """(the table's verdict, the failed checks) for our errors {input name: error} and fla's (a
    dict of errors, None where fla gives no gradient, or a string saying why there are none).
    finite: ours has no NaN/Inf. floors: {input name: the rounding floor of its gradient's dtype}
    (absent: 0)."""
    failures = [] if finite else ["NaN/Inf in ours"]
    notes = []
    ratios = []
    for n, e in ours.items():
        label = GRAD_LABELS[n]
        if not (math.isfinite(e) and e <= bound):
            failures.append(f"{label} error {e:.3e} > {bound}" if math.isfinite(e) else f"{label} error non-finite")
        if isinstance(fla, str):
            continue
        f = fla.get(n)
        if f is None:
            notes.append(f"fla: no {label}")
        elif not math.isfinite(f):
            notes.append(f"fla {label} non-finite")
        elif f > bound:
            notes.append(f"fla {label} > bound")
        else:
            floor = (floors or {}).get(n, 0.0)
            if not e <= factor * max(f, floor) + slack:
                failures.append(f"{label} error {e:.3e} > {factor} x max(fla's {f:.3e}, floor {floor:.3e}) + {slack:g}")
            ratios.append(e / f if f > 0 else (math.inf if e > 0 else 0.0))
    if isinstance(fla, str):
        notes.append(fla)
    elif ratios:
        notes.insert(0, f"max {max(ratios):.2f} x fla")
    note = "; ".join(notes) or "-"
    return ("FAIL: " + "; ".join(failures) + f" ({note})" if failures else f"ok ({note})"), failures


@pytest.fixture(scope="module", autouse=True)
def _write_table(request):
    yield
    REPORT.finish(request, f"Gradients of flash_kda.chunk_kda vs fla chunk_kda (Triton): relative Frobenius error of "
                  f"each gradient against the fp64 yardstick flash_kda.autograd_reference (loss sum(o * do) + "
                  f"sum(final_state * dht)), ours / fla; bound {BOUND:g} and ours <= {FLA_FACTOR} x max(fla, the "
                  f"rounding floor of the gradient's dtype) + {FLA_SLACK:g} where fla is finite and within the "
                  f"bound; seed {base_seed()}.",
                  (p.name for p in GRID))


def _rel(x, ref) -> float:
    """||x - ref|| / ||ref|| (Frobenius, fp64, on the device; ||x - ref|| when ref is zero)."""
    import torch

    d = torch.linalg.vector_norm(x.detach().double() - ref)
    n = torch.linalg.vector_norm(ref)
    return float(d / n) if float(n) > 0 else float(d)


def _call_grads(fn, args, kw, names, dtypes, do, dht, cast_in_graph=False):
    """Gradients {name: tensor} of sum(o * do) + sum(final_state * dht) for fn(*args, **kw), the
    inputs `names` taking part copied to leaves of dtypes[name] (default: their own). With
    cast_in_graph the leaves keep their own dtype and fn gets them cast to dtypes[name] inside
    the graph, so each gradient reaches its leaf in the leaf's dtype, as the caller's own tensor
    would get it (fla takes a bf16 initial state as an fp32 copy: its fp32 gradient is rounded
    to bf16 on the way back, like ours)."""
    import torch

    leaves = {}
    args = list(args)
    kw = dict(kw)

    def leaf(x, n):
        if cast_in_graph:
            leaves[n] = x.detach().requires_grad_()
            return leaves[n].to(dtypes.get(n, x.dtype))
        leaves[n] = x.detach().to(dtypes.get(n, x.dtype)).requires_grad_()
        return leaves[n]

    for i, n in enumerate(("q", "k", "v", "g", "beta")):
        args[i] = leaf(args[i], n)
    for n in names[5:]:
        kw[n] = leaf(kw[n], n)
    o, ht = fn(*args, **kw)
    grads = torch.autograd.grad((o, ht), [leaves[n] for n in names], (do.to(o.dtype), dht.to(ht.dtype)))
    return dict(zip(names, grads))


def run_fla(args, kw, names, do, dht):
    """fla's gradients {name: tensor or None}, or a string saying why there are none."""
    import torch

    def run(fn):
        with torch.enable_grad():
            return _call_grads(fn, args, kw, names, {"initial_state": torch.float32}, do, dht, cast_in_graph=True)

    return fla_guarded(run)


@pytest.mark.cuda_sm90
@pytest.mark.parametrize("point", GRID, ids=lambda p: p.name)
def test_backward_vs_yardstick_and_fla(cuda_sm90, point):
    import torch

    import flash_kda

    case = point.case
    seed = point_seed(point)
    where = f"{case.name} (seed {base_seed()})"
    args, kw, _ = make_call(case, cuda_sm90, seed=seed)
    names = differentiable(kw)
    gen = torch.Generator(device=cuda_sm90).manual_seed(seed)
    do = torch.randn(args[2].shape, generator=gen, device=cuda_sm90).bfloat16()
    N = kw["cu_seqlens"].numel() - 1 if kw.get("cu_seqlens") is not None else case.batch
    K, V = case.k_dim, args[2].shape[-1]
    dht = torch.randn((N, case.hv, *((V, K) if case.state_v_first else (K, V))), generator=gen, device=cuda_sm90)

    ours = _call_grads(flash_kda.chunk_kda, args, kw, names, {}, do, dht)
    finite = all(bool(torch.isfinite(x).all()) for x in ours.values())
    fla = run_fla(args, kw, names, do, dht)
    ref = _call_grads(flash_kda.autograd_reference, args, kw, names, dict.fromkeys(names, torch.float64),
                      do.double(), dht.double())
    for n in names:  # each gradient comes back like its input (shape, dtype)
        assert ours[n].shape == ref[n].shape, (n, ours[n].shape, ref[n].shape)

    ours_err = {n: _rel(ours[n], ref[n]) for n in names}
    fla_err = fla if isinstance(fla, str) else {
        n: (None if fla.get(n) is None else _rel(fla[n], ref[n])) for n in names}
    floors = {n: _rel(ref[n].to(ours[n].dtype), ref[n]) for n in names}
    text, failures = verdict(ours_err, fla_err, finite, floors=floors)

    def cell(n):
        if n not in names:
            return "-"
        f = fla_err if isinstance(fla_err, str) else fla_err[n]
        return f"{fmt_err(ours_err[n])} / {'-' if isinstance(f, str) else fmt_err(f)}"

    REPORT.keep(case.name, [case.name, gate_label(point, GATE_NAMES), shape_label(case), f"{case.heads}/{case.hv}",
                            case.state or "none", flags_label(case), *(cell(n) for n in GRADS), text])
    assert not failures, f"{where}: " + "; ".join(failures)


# ---- The grid's own checks (CPU, no torch needed).

def test_grid_names_are_unique_and_cover_the_issue():
    names = [p.name for p in GRID]
    assert len(names) == len(set(names)) == 44
    fixed = [p.case for p in GRID if p.case.lens is None and not p.extreme]
    for T in LENGTHS:
        at = [c for c in fixed if c.seqlen == T]
        assert {c.gate for c in at} >= set(GATES), T
        assert {c.heads for c in at} >= set(HEADS), T
        assert {c.state for c in at} >= set(STATES), T
    varlen = [p.case for p in GRID if p.case.lens is not None]
    assert {c.gate for c in varlen} == set(GATES) and all(0 in c.lens for c in varlen)
    assert {c.state for c in varlen} == set(STATES)
    assert {p.case.gate for p in GRID if p.extreme} == {"safe", "softplus", "none"}
    assert any(c.hv == 2 * c.heads for c in (p.case for p in GRID))
    assert any(not p.case.state_v_first for p in GRID)
    assert any(not p.case.beta_sigmoid for p in GRID) and any(p.case.allow_neg_eigval for p in GRID)
    assert any(not p.case.l2norm for p in GRID)
    assert any(p.case.seqlen == 8192 and p.case.heads == 32 and p.case.lens is None for p in GRID)


def test_differentiable_inputs():
    base = dict(use_gate_in_kernel=True, A_log=1, dt_bias=1, initial_state=1)
    assert differentiable(base) == GRADS
    assert differentiable({**base, "use_gate_in_kernel": False}) == ("q", "k", "v", "g", "beta", "initial_state")
    assert differentiable({**base, "A_log": None, "initial_state": None}) == ("q", "k", "v", "g", "beta", "dt_bias")


def test_verdict():
    ours = {"q": 3e-3, "k": 4e-3}
    assert verdict(ours, {"q": 3e-3, "k": 4e-3}) == ("ok (max 1.00 x fla)", [])
    text, failures = verdict(ours, {"q": 2e-3, "k": 4e-3})
    assert failures == ["dq error 3.000e-03 > 1.1 x max(fla's 2.000e-03, floor 0.000e+00) + 0.0001"] and text.startswith("FAIL: ")
    assert verdict({"q": 5e-5}, {"q": 1e-6})[1] == []  # both at the rounding floor: the slack decides
    # fla without a gradient, non-finite, above the bound, or raising: ours against the bound alone.
    text, failures = verdict({"A_log": 1e-3, "q": 1e-3}, {"A_log": None, "q": math.nan})
    assert failures == [] and "fla: no dA_log" in text and "fla dq non-finite" in text
    assert verdict({"q": 1e-2}, {"q": 5e-2})[0] == "ok (fla dq > bound)"
    assert verdict({"q": 1e-2}, "fla raised ValueError: x") == ("ok (fla raised ValueError: x)", [])
    assert verdict({"q": 3e-2}, "fla.ops.kda is not importable")[1] == ["dq error 3.000e-02 > 0.02"]
    assert "dg error non-finite" in verdict({"g": math.inf}, {"g": 1e-3})[1]
    assert verdict({"q": 1e-3}, {"q": 1e-3}, finite=False)[1] == ["NaN/Inf in ours"]
    # fla below the rounding floor of the gradient's dtype: ours is held to the floor
    assert verdict({"beta": 1.6e-3}, {"beta": 2e-4}, floors={"beta": 1.6e-3})[1] == []
    assert verdict({"beta": 1.6e-3}, {"beta": 2e-4}, floors={"beta": 1e-3})[1] != []
