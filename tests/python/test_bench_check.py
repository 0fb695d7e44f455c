"""check.py's error arithmetic and verdict on CPU torch tensors (skipped where torch is absent).

The fp64 reference is replaced by known float64 tensors, so each test knows the exact error:
bf16 rounding of the reference (~1e-3) is a passing kernel; a scaled head or NaN is a broken one.
"""

import pytest

import _bench_path  # noqa: F401
from flash_kda_bench import check

torch = pytest.importorskip("torch")


def _randn(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def test_head_errors_are_relative_frobenius_in_fp64():
    ref = _randn((2, 64, 6, 16), 0)
    x = (ref + 1e-3 * _randn(ref.shape, 1)).to(torch.bfloat16)
    e = check.head_errors(x, ref, head_axis=2)
    xd = x.double()
    assert e["err"] == pytest.approx(float((xd - ref).norm() / ref.norm()), rel=1e-12)
    per = [float((xd[:, :, h] - ref[:, :, h]).norm() / ref[:, :, h].norm()) for h in range(6)]
    assert e["per_head"] == pytest.approx(per, rel=1e-12)
    assert 1e-4 < e["err"] < 1e-2
    assert check.rel_err(x, ref) == pytest.approx(e["err"], rel=1e-12)
    with pytest.raises(ValueError, match="does not match"):
        check.head_errors(x[:, :, :5], ref, head_axis=2)


def _case(monkeypatch, H=96, with_state=True):
    ref_out = _randn((1, 32, H, 8), 2)
    ref_state = _randn((2, H, 8, 8), 3) if with_state else None
    monkeypatch.setattr(check, "reference_on_device", lambda x: (ref_out, ref_state))
    return ref_out, ref_state


def test_bf16_state_is_judged_against_fla_rounded_to_bf16(monkeypatch):
    ref_out, ref_state = _case(monkeypatch)
    # Through fp32 as check_case rounds fla's state (fp64 -> bf16 directly could differ by a
    # double rounding on rare elements).
    ours_out, ours_state = ref_out.to(torch.bfloat16), ref_state.float().to(torch.bfloat16)
    # fla returns an fp32 state: unrounded it would be ~1e-8 off and ours (~1e-3, bf16) would
    # fail the 1.5x ratio; rounded to the case's bf16 it is as far off as ours.
    r = check.check_case(None, ours_out, ours_state, ref_out.to(torch.bfloat16), ref_state.float())
    assert r["fla_state_err"] == pytest.approx(r["state_err"], rel=1e-12)
    assert 1e-4 < r["state_err"] < 1e-2
    assert r["state_vs_fla"] == 0.0
    assert r["passed"], r


def test_a_wrong_middle_head_fails(monkeypatch):
    ref_out, ref_state = _case(monkeypatch)
    bad = ref_out.clone()
    bad[:, :, 40] *= 1.05
    r = check.check_case(None, bad.to(torch.bfloat16), ref_state.float())
    assert r["out_err"] < check.REF_BOUND  # diluted over 96 heads it would pass ...
    assert r["out_worst_head"] == 40 and r["out_err_worst_head"] == pytest.approx(5e-2, rel=0.05)
    assert not r["passed"]  # ... the worst head does not


def test_unwritten_output_fails_and_fla_columns_are_information(monkeypatch):
    ref_out, _ = _case(monkeypatch, with_state=False)
    nan = torch.full_like(ref_out, float("nan"), dtype=torch.bfloat16)
    r = check.check_case(None, nan, None)
    assert r["state_err"] is None and not r["passed"]
    # A far-off fla changes only fla's columns: ours is judged against the reference.
    r = check.check_case(None, ref_out.to(torch.bfloat16), None, (2 * ref_out).to(torch.bfloat16), None)
    assert r["out_vs_fla"] == pytest.approx(0.5, rel=1e-2) and r["fla_out_err"] == pytest.approx(1.0, rel=1e-2)
    assert r["passed"]
