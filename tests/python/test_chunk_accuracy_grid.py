"""The CPU side of test_chunk_accuracy.py (whose points need the GPU): the grid's coverage and
reference cost, the verdict of a row, the row labels, the head-sliced call the reference
runs on (equal to the slice of the whole reference, GVA included), the extreme gate laws of
chunk_cases.make_call, and that the extra fla kernel pins are configurations of fla's own."""
from __future__ import annotations

import math

import numpy as np
import pytest

import test_chunk_accuracy as grid
from chunk_cases import ChunkCase
from test_fwd_accuracy import VARLEN_MIX as FWD_VARLEN_MIX


def _points(**where):
    return [p for p in grid.GRID if all(getattr(p.case, k) == v for k, v in where.items())]


def test_names_are_unique_and_the_cost_is_bounded():
    names = [p.name for p in grid.GRID]
    assert len(names) == len(set(names)) == 44
    steps = sum(grid.reference_steps(p) for p in grid.GRID)
    assert 1e5 < steps <= grid.MAX_REFERENCE_STEPS, steps


def test_every_length_meets_every_gate_head_count_and_state():
    fixed = [p for p in grid.GRID if p.case.lens is None]
    for T in grid.LENGTHS:
        at = [p.case for p in fixed if p.case.seqlen == T and not p.extreme]
        assert {c.gate for c in at} >= set(grid.GATES), T
        assert {c.heads for c in at} >= set(grid.HEADS), T
        assert {c.state for c in at} >= set(grid.STATES), T
    for gate in grid.GATES:
        at = [p.case for p in fixed if p.case.gate == gate]
        assert {c.heads for c in at} >= set(grid.HEADS) and {c.state for c in at} >= set(grid.STATES), gate


def test_varlen_extremes_and_flags_are_covered():
    assert grid.VARLEN_MIX == FWD_VARLEN_MIX and 0 in grid.VARLEN_MIX and 1 in grid.VARLEN_MIX
    varlen = [p for p in grid.GRID if p.case.lens is not None]
    assert {p.case.gate for p in varlen} == set(grid.GATES) | {"safe_no_A"}
    assert {p.case.state for p in varlen} == set(grid.STATES)
    extreme = [p for p in grid.GRID if p.extreme]
    assert {p.case.gate for p in extreme} == set(grid.GATES)
    for gate in ("softplus", "none"):
        shapes = {p.case.seqlen if p.case.lens is None else "varlen" for p in extreme if p.case.gate == gate}
        assert shapes == {17, 1024, "varlen"}, gate
    assert len([p for p in grid.GRID if p.case.hv == 2 * p.case.heads]) == 2
    assert len(_points(state_v_first=False)) == 2
    assert len(_points(beta_sigmoid=False)) == 1
    assert len(_points(allow_neg_eigval=True)) == 2
    assert len(_points(l2norm=False)) == 2
    assert all(p.case.beta_sigmoid for p in _points(allow_neg_eigval=True))  # fla's rule
    assert len(_points(gate="safe_no_A")) == 2 and len(_points(strided=True)) == 2
    assert {p.case.lens is None for p in _points(strided=True)} == {True, False}


def test_verdict():
    ok, failures = grid.verdict((1e-3, 2e-3), (1.2e-3, 1.95e-3))  # a state tie within the slack
    assert failures == [] and ok == "ok (1.03 x fla)"
    text, failures = grid.verdict((1.2e-3, 1e-3), (1e-3, 1e-3))  # 20% over fla's: over the slack
    assert len(failures) == 1 and "out error 1.200e-03 > 1.0 x fla's" in failures[0] and text.startswith("FAIL: ")
    # fla's own result unusable: ours against the bound alone, and the row says why.
    assert grid.verdict((5e-3, 5e-3), (math.nan, 1e-3)) == ("ok (fla non-finite)", [])
    assert grid.verdict((5e-3, 5e-3), (2e-2, 1e-3)) == ("ok (fla > bound)", [])
    assert grid.verdict((5e-3, 5e-3), "fla raised ValueError: x") == ("ok (fla raised ValueError: x)", [])
    text, failures = grid.verdict((2e-2, 1e-3), (math.inf, 1e-3))
    assert failures == ["out error 2.000e-02 > 0.01"] and text.endswith("(fla non-finite)")
    text, failures = grid.verdict((math.nan, 1e-3), (1e-3, 1e-3))
    assert "out error non-finite" in failures
    _, failures = grid.verdict((1e-3, 1e-3), (1e-3, 1e-3), finite=False)  # NaN outside the sampled heads
    assert failures == ["NaN/Inf in ours"]
    # Both at the rounding floor: the absolute slack decides; a zero fla error gives no ratio error.
    assert grid.verdict((5e-5, 0.0), (1e-6, 0.0))[1] == []


def test_labels():
    p = next(p for p in grid.GRID if p.name == "safe_gva_varlen_mix_H16_HV32_fp32")
    assert grid.gate_label(p) == "safe (lb -5)"
    assert grid.shape_label(p.case) == "varlen 11 seqs, 1646 tok (varlen mix)"
    assert grid.heads_label(p.case) == "16/32 (4 sampled)"
    assert grid.flags_label(p.case) == "-"
    p = next(p for p in grid.GRID if p.name == "none_extreme_T1024_H4_bf16")
    assert grid.gate_label(p) == "log decay extreme" and grid.shape_label(p.case) == "B1 x T1024"
    assert grid.heads_label(p.case) == "4/4"
    case = ChunkCase("x", state_v_first=False, l2norm=False, beta_sigmoid=False, allow_neg_eigval=True)
    assert grid.flags_label(case) == "k-first, no l2norm, beta activated, neg eigval"
    assert grid.pair(1e-3, None) == "1.00e-03 / -"


def test_point_seed_follows_the_run_seed(monkeypatch):
    from fwd_cases import base_seed

    p, q = grid.GRID[:2]
    assert grid.point_seed(p) != grid.point_seed(q)
    assert grid.point_seed(p) == (base_seed() ^ grid.zlib.crc32(p.name.encode())) & 0x7FFFFFFF


@pytest.mark.parametrize("case", [
    ChunkCase("gva_sliced", gate="softplus", heads=2, value_heads=8, lens=(20, 0, 1, 19), state="bf16"),
    ChunkCase("kfirst_sliced", gate="none", heads=8, batch=2, seqlen=18, state="fp32", state_v_first=False),
    ChunkCase("safe_sliced_nostate", gate="safe", heads=6, batch=1, seqlen=17, state=None),
], ids=lambda c: c.name)
def test_the_sliced_call_is_the_slice_of_the_reference(case):
    pytest.importorskip("torch")
    from chunk_cases import make_call, reference

    args, kw, _ = make_call(case, "cpu", seed=7)
    heads = grid.spread_heads(case.hv, grid.SAMPLED_HEADS)
    assert heads is not None and len(heads) == grid.SAMPLED_HEADS
    full_o, full_s = (np.asarray(r, dtype=np.float64) for r in reference(args, kw))
    o, s = (np.asarray(r, dtype=np.float64) for r in reference(*grid.sliced_call(args, kw, heads)))
    np.testing.assert_allclose(o, full_o[:, :, list(heads)], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(s, full_s[:, list(heads)], rtol=1e-12, atol=1e-14)
    assert grid.sliced_call(args, kw, None) == (args, kw)


def test_the_extreme_gate_laws():
    torch = pytest.importorskip("torch")
    from chunk_cases import make_call

    def decays(point):
        args, kw, _ = make_call(point.case, "cpu", seed=3)
        g = args[3].double()
        if point.case.gate == "none":
            return g, kw
        A = torch.exp(kw["A_log"].double())[:, None]
        x = g + kw["dt_bias"].double().view(point.case.hv, -1)
        return -A * torch.nn.functional.softplus(x), kw

    by_name = {p.name: p for p in grid.GRID}
    a, kw = decays(by_name["softplus_extreme_T1024_H4_bf16"])
    assert torch.allclose(kw["A_log"], torch.full_like(kw["A_log"], math.log(16.0)))
    assert -100 > a.min() and a.quantile(0.1) < -40  # tens of nats a token, past -100 at the tail
    a, _ = decays(by_name["none_extreme_T1024_H4_bf16"])
    assert a.min() < -800 and a.quantile(0.1) < -300 and a.max() <= 0
    a, _ = decays(by_name["softplus_T1024_H1_fp32"])
    assert a.min() > -120 and a.quantile(0.5) > -15  # fla's KimiDeltaAttention init: moderate decays
    args, kw, _ = make_call(by_name["safe_extreme_T1024_H4_fp32"].case, "cpu", seed=3)
    assert args[3].float().std() > 15 and kw["A_log"].min() >= math.log(16.0) - 1e-6


def test_the_extra_fla_pins_are_fla_configurations():
    pytest.importorskip("fla.ops.kda", reason="flash-linear-attention is not installed")
    import sys

    from triton.runtime.autotuner import Autotuner

    from fwd_cases import pin_fla_kernels

    def tuners():
        found = {}
        for name, module in list(sys.modules.items()):
            if not name.startswith("fla.") or module is None:
                continue
            for obj in list(vars(module).values()):
                for _ in range(4):
                    if isinstance(obj, Autotuner):
                        found[obj.base_fn.__name__] = obj
                        break
                    obj = getattr(obj, "fn", None)
        return found

    found = tuners()
    for name, c in grid.EXTRA_FLA_CONFIGS.items():
        assert name in found, name
        own = [(cfg.kwargs, cfg.num_warps, cfg.num_stages) for cfg in found[name].configs]
        if len(own) > 1:  # not pinned yet in this process
            assert (c["kwargs"], c["num_warps"], c["num_stages"]) in own, (name, own)
    pin_fla_kernels(grid.EXTRA_FLA_CONFIGS, only_autotuning=True)
    for name in grid.EXTRA_FLA_CONFIGS:
        assert len(found[name].configs) == 1, name
