"""The benchmark's --kernels: kernel names shortened to their variant, per-call aggregation,
the flag's combinations, the report's table and ab_compare's per-kernel rows (no GPU)."""
import importlib.util
import json
import os

import pytest

import _bench_path  # noqa: F401
from flash_kda_bench import cli, kernels, report

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "ab_compare.py")
_spec = importlib.util.spec_from_file_location("ab_compare_k", _PATH)
ab_compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ab_compare)

RECURRENCE = ("void flash_kda::sm90::(anonymous namespace)::recurrence_kernel<flash_kda::sm90::Traits<8, true>>"
              "(flash_kda::sm90::RecurrenceParams)")
FINISH = ("void flash_kda::sm90::(anonymous namespace)::recurrence_kernel<flash_kda::sm90::Traits<4, false>>"
          "(flash_kda::sm90::RecurrenceParams)")


@pytest.mark.parametrize("name, label", [
    (RECURRENCE, "recurrence_kernel<Traits<8, true>>"),
    ("flash_kda::sm90::(anonymous namespace)::segment_scan_kernel(flash_kda::sm90::ScanParams const&)",
     "segment_scan_kernel"),
    ("Memset (Device)", "Memset (Device)"),
    ("Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD (Pageable -> Device)"),
    ("void  at::native::f<(int)4>(int,\n float*)", "at::native::f<(int)4>"),
])
def test_kernel_label_keeps_the_variant_and_drops_the_rest(name, label):
    assert kernels.kernel_label(name) == label


def test_two_instances_of_one_kernel_stay_apart_and_repeats_sum_per_call():
    events = [(RECURRENCE, 50.0), (FINISH, 75.0), (RECURRENCE, 54.0), (FINISH, 81.0), ("Memset (Device)", 1.0)]
    assert kernels.aggregate(events, 2) == {"recurrence_kernel<Traits<8, true>>": 52.0,
                                            "recurrence_kernel<Traits<4, false>>": 78.0,
                                            "Memset (Device)": 0.5}
    with pytest.raises(ValueError, match="calls must be >= 1"):
        kernels.aggregate(events, 0)


def test_the_flag_profiles_forward_cases_only(capsys):
    assert cli.parse_args(["--kernels", "--cases", "h16_fixed_8192"]).kernels
    assert not cli.parse_args([]).kernels
    for other in (["--decode"], ["--train"], ["--layer"], ["--from-json", "r.json"]):
        with pytest.raises(SystemExit) as e:
            cli.parse_args(["--kernels", *other])
        assert e.value.code == 2
        assert "--kernels profiles the forward cases" in capsys.readouterr().err


def _case(name, eager_ms, kern):
    return {"case": {"name": name}, "times": {"flash_kda": {"eager": {"median": eager_ms}}},
            "kernels_us": {"flash_kda": kern}}


def test_report_lists_each_kernel_with_its_share_of_the_eager_time():
    results = {"settings": {"kernel_calls": 20},
               "cases": [_case("h16_fixed_8192", 0.25, {"prepare_kernel<Dense>": 63.0, "segment_scan_kernel": 31.5})]}
    lines = report.kernels_section(results)
    assert "| h16_fixed_8192 | `prepare_kernel<Dense>` | 63.0 | 25% |" in lines
    assert "| h16_fixed_8192 | `segment_scan_kernel` | 31.5 | 13% |" in lines
    assert any("over 20 profiled calls" in line for line in lines)
    assert report.kernels_section({"cases": [{"case": {"name": "x"}, "times": {}}]}) == []


def test_ab_compare_puts_each_kernel_of_both_builds_side_by_side(tmp_path, capsys, monkeypatch):
    for rnd, (sa, sb) in enumerate(((31.5, 32.8), (31.6, 32.9)), start=1):
        for side, scan, extra in (("A", sa, {}), ("B", sb, {"zero_kernel": 1.0})):
            d = tmp_path / f"{side}-{rnd}"
            d.mkdir()
            entry = _case("h16_fixed_8192", 0.25, {"segment_scan_kernel": scan, **extra})
            entry["times"]["flash_kda"]["graph"] = {"median": 0.224}
            (d / "results.json").write_text(json.dumps({"cases": [entry]}))
    a, b = ab_compare.load(tmp_path, "A"), ab_compare.load(tmp_path, "B")
    rows = ab_compare.kernel_rows(a, b)
    assert [(r["case"], r["kernel"]) for r in rows] == [("h16_fixed_8192", "segment_scan_kernel"),
                                                        ("h16_fixed_8192", "zero_kernel")]
    assert rows[0]["a"] == pytest.approx(31.55) and rows[0]["b"] == pytest.approx(32.85)
    assert rows[1]["a"] is None and rows[1]["b"] == 1.0
    monkeypatch.setattr("sys.argv", ["ab_compare.py", str(tmp_path)])
    assert ab_compare.main() == 0  # the kernels do not enter the verdict
    out = capsys.readouterr().out
    assert "| h16_fixed_8192 | `segment_scan_kernel` | 31.55 | 32.85 | 1.041 | 0.3% | 0.3% |" in out
    assert "| h16_fixed_8192 | `zero_kernel` | - | 1.00 | - | - | 0.0% |" in out
