"""scripts/ab_compare.py: the A/B table of scripts/ab-bench.sh's rounds, on hand-written
results (no GPU): every section (forward cases, training steps, decode points) and mode, medians
over rounds, the spread, and the verdict that B is at most 2% + the larger spread slower."""
import importlib.util
import json
import os

import pytest

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "ab_compare.py")
_spec = importlib.util.spec_from_file_location("ab_compare", _PATH)
ab_compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ab_compare)


def _entry(name, **modes):
    return {"case": {"name": name}, "times": {"flash_kda": {m: {"median": t} for m, t in modes.items()}}}


def _write(tmp_path, side, rnd, cases=(), train=(), decode=()):
    d = tmp_path / f"{side}-{rnd}"
    d.mkdir()
    (d / "results.json").write_text(json.dumps({"cases": list(cases), "train": list(train), "decode": list(decode)}))


def _rounds(tmp_path, a_times, b_times, section="train", mode="eager"):
    for rnd, (ta, tb) in enumerate(zip(a_times, b_times), start=1):
        _write(tmp_path, "A", rnd, **{section: [_entry("h32_fixed_8192", **{mode: ta})]})
        _write(tmp_path, "B", rnd, **{section: [_entry("h32_fixed_8192", **{mode: tb})]})


def test_every_section_and_mode_is_compared(tmp_path):
    for rnd in (1, 2):
        for side, t in (("A", 1.0), ("B", 1.1)):
            _write(tmp_path, side, rnd, cases=[_entry("h96_fixed_8192", eager=t, graph=t / 2)],
                   train=[_entry("h32_fixed_8192", eager=5 * t)],
                   decode=[_entry("n1_h32_T1_fp32", eager=t / 100, graph=t / 200)])
    a, b = ab_compare.load(tmp_path, "A"), ab_compare.load(tmp_path, "B")
    rows = ab_compare.rows(a, b)
    assert [(r["section"], r["case"], r["mode"]) for r in rows] == [
        ("cases", "h96_fixed_8192", "eager"), ("cases", "h96_fixed_8192", "graph"),
        ("train", "h32_fixed_8192", "eager"),
        ("decode", "n1_h32_T1_fp32", "eager"), ("decode", "n1_h32_T1_fp32", "graph")]
    assert rows[2]["a"] == pytest.approx(5.0) and rows[2]["b"] == pytest.approx(5.5)
    assert not any(r["ok"] for r in rows)  # 10% slower with no spread


def test_median_spread_and_verdict(tmp_path):
    # A: 5.0, 5.2, 5.1 (median 5.1, spread 0.2 / 5.1); B 4% slower: within 2% + 3.9%.
    _rounds(tmp_path, [5.0, 5.2, 5.1], [5.3, 5.304, 5.31])
    (r,) = ab_compare.rows(ab_compare.load(tmp_path, "A"), ab_compare.load(tmp_path, "B"))
    assert r["a"] == pytest.approx(5.1) and r["b"] == pytest.approx(5.304)
    assert r["spread_a"] == pytest.approx(0.2 / 5.1)
    assert r["ok"]


def test_exit_status(tmp_path, capsys, monkeypatch):
    _rounds(tmp_path, [5.14, 5.137], [5.566, 5.571])  # 8.4% slower
    monkeypatch.setattr("sys.argv", ["ab_compare.py", str(tmp_path)])
    assert ab_compare.main() == 1
    assert "| train | h32_fixed_8192 | eager | 5.1385 | 5.5685 | 1.084 |" in capsys.readouterr().out


def test_needs_two_rounds(tmp_path, monkeypatch):
    _rounds(tmp_path, [1.0], [1.0])
    monkeypatch.setattr("sys.argv", ["ab_compare.py", str(tmp_path)])
    assert ab_compare.main() == 2


def test_a_case_only_one_build_timed_fails(tmp_path, capsys, monkeypatch):
    for rnd in (1, 2):
        _write(tmp_path, "A", rnd, train=[_entry("h32_fixed_8192", eager=5.0), _entry("h96_fixed_8192", eager=14.0)])
        _write(tmp_path, "B", rnd, train=[_entry("h32_fixed_8192", eager=5.0)])
    (tmp_path / "A-old").mkdir()  # not a round: ignored
    monkeypatch.setattr("sys.argv", ["ab_compare.py", str(tmp_path)])
    assert ab_compare.main() == 1
    assert "| train | h96_fixed_8192 | eager | | | | | | not timed by B |" in capsys.readouterr().out


def test_nothing_both_builds_timed(tmp_path, monkeypatch):
    for rnd in (1, 2):
        _write(tmp_path, "A", rnd)
        _write(tmp_path, "B", rnd)
    monkeypatch.setattr("sys.argv", ["ab_compare.py", str(tmp_path)])
    assert ab_compare.main() == 2
