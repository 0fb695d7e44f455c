"""Table, JSON, Markdown and chart writers on fake results (CPU only)."""

import json

import pytest

import _bench_path  # noqa: F401
from flash_kda_bench import check, report
from flash_kda_bench.anchors import anchor_for
from flash_kda_bench.cases import Case, floor_ms, hbm_floor_bytes

BW = 4.0e12


def _times(median):
    return {"median": median, "min": median * 0.9, "max": median * 1.2, "n": 5}


def fake_results(with_fla=True, failing=False):
    std = Case("h96_fixed_8192", 96, T=8192)
    custom = Case("h4_varlen_2x300", 4, seqlens=(100, 200), state="bf16")
    cases = []
    for c, ours in ((std, 0.5), (custom, 0.02)):
        times = {"flash_kda": {"eager": _times(ours), "graph": _times(ours * 0.8)}}
        if with_fla:
            times["fla"] = {"eager": _times(2.0), "graph": _times(1.6)}
        chk = {"heads": "all", "out_err": 3e-3 if not failing else 0.2, "state_err": 2e-3,
               "bound": 1e-2, "fla_ratio_bound": 1.5}
        chk["passed"] = check.verdict(chk)
        cases.append({"case": c.to_dict(), "floor_bytes": hbm_floor_bytes(c), "floor_ms": floor_ms(c, BW),
                      "anchor": anchor_for(c.name), "times": times, "errors": {}, "check": chk})
    cases[1]["errors"]["fla graph"] = "RuntimeError: capture failed"
    return {"meta": {"gpu": "NVIDIA H200", "driver": "580.1", "torch": "2.11.0", "triton": "3.6.0",
                     "fla": "0.6.0", "flash_kda": "0.1.0", "date": "2026-11-30 10:00 UTC"},
            "copy_bandwidth": BW, "anchor_source": "anchors-h200.md (test)",
            "settings": {"iters": 5, "warmup": 2, "seed": 0, "fla": with_fla}, "cases": cases}


def test_rows_values():
    r = fake_results()
    row = dict(zip(report.COLUMNS, report.rows(r)[0]))
    floor = r["cases"][0]["floor_ms"]
    assert floor == pytest.approx(1_020_838_272 / BW * 1e3)
    assert row["case"] == "h96_fixed_8192" and row["T total"] == "8192" and row["H"] == "96" and row["seqs"] == "1"
    assert row["flash_kda ms"] == "0.500"
    assert row["x floor"] == f"{0.5 / floor:.2f}x"
    assert row["speedup vs fla"] == "4.00x / 4.00x"  # 2.0/0.5 eager, 1.6/0.4 graph
    assert row["anchor FlashKDA ms"] == "1.464" and row["anchor fla ms"] == "2.659"
    assert row["check"] == "ok 3.0e-03"
    custom = dict(zip(report.COLUMNS, report.rows(r)[1]))
    assert custom["anchor FlashKDA ms"] == "-" and custom["seqs"] == "2" and custom["flash_kda ms"] == "0.0200"


def test_rows_show_the_host_time_per_eager_call_when_measured():
    r = fake_results()
    r["cases"][0]["host_us"] = {"flash_kda": 23.44}
    first, second = (dict(zip(report.COLUMNS, row)) for row in report.rows(r))
    assert first["flash_kda host us"] == "23.4"
    assert second["flash_kda host us"] == "-"  # not measured (records from before the column)
    assert report.COLUMNS.index("flash_kda host us") == report.COLUMNS.index("flash_kda graph ms") + 1


def test_rows_without_fla_and_failing_check():
    row = dict(zip(report.COLUMNS, report.rows(fake_results(with_fla=False, failing=True))[0]))
    assert row["fla ms"] == "-" and row["speedup vs fla"] == "-"
    assert row["check"] == "FAIL 2.0e-01"


def test_notes_name_the_cases_of_a_merged_record_from_other_runs(tmp_path):
    r = fake_results()
    assert not any(line.startswith("from another run") for line in report.notes(r))
    r["cases"][1]["from_run"] = "2026-12-02 00:35 UTC (an earlier session)"
    lines = [line for line in report.notes(r) if line.startswith("from another run")]
    assert lines == ["from another run than the others: h4_varlen_2x300 (safe gate): 2026-12-02 00:35 UTC "
                     "(an earlier session)"]
    report.write_markdown(r, tmp_path / "r.md")
    assert "- " + lines[0] in (tmp_path / "r.md").read_text()
    assert report.readme_table(r)[-2:] == ["", f"Note: {lines[0]}."]
    del r["cases"][1]["from_run"]
    assert report.readme_table(r)[-1].startswith("| geometric mean")


def test_verdict_uses_fla_ratio():
    assert check.verdict({"out_err": 5e-3, "fla_out_err": 4e-3, "state_err": None})
    assert not check.verdict({"out_err": 7e-3, "fla_out_err": 4e-3})  # > 1.5x fla
    assert not check.verdict({"out_err": float("nan")})
    assert not check.verdict({"out_err": 1e-3, "state_err": 2e-2})


def test_verdict_holds_the_worst_head_to_the_bound():
    # One head 5% off among 96 reads as ~0.5% over all heads; the worst head must fail it.
    assert not check.verdict({"out_err": 5e-3, "out_err_worst_head": 5e-2})
    assert not check.verdict({"out_err": 1e-3, "state_err": 1e-3, "state_err_worst_head": float("inf")})
    assert check.verdict({"out_err": 2e-3, "out_err_worst_head": 4e-3, "state_err": 2e-3,
                          "state_err_worst_head": 3e-3, "out_vs_fla": 0.5, "state_vs_fla": 0.5})


def test_combine_head_errors_all_heads_and_worst():
    # 96 heads with ||ref_h|| = 1: 95 exact to 1e-3, head 40 off by 5e-2.
    num = [1e-3] * 96
    num[40] = 5e-2
    e = check.combine_head_errors(num, [1.0] * 96)
    expected_total = ((95 * 1e-6 + 25e-4) / 96) ** 0.5
    assert e["err"] == pytest.approx(expected_total, rel=1e-12)
    assert e["err"] < check.REF_BOUND  # the diluted all-head error alone would pass ...
    assert (e["worst_head"], e["worst"]) == (40, pytest.approx(5e-2))  # ... the worst head does not
    assert e["per_head"][0] == pytest.approx(1e-3) and len(e["per_head"]) == 96


def test_combine_head_errors_edge_values():
    assert check.combine_head_errors([0.0], [0.0])["err"] == 0.0
    assert check.combine_head_errors([1.0, 0.0], [0.0, 0.0])["worst"] == float("inf")
    e = check.combine_head_errors([1e-3, float("nan"), 1.0], [1.0, 1.0, 1.0])
    assert e["worst_head"] == 1 and e["worst"] != e["worst"]  # NaN is kept, so verdict fails it
    assert not check.verdict({"out_err": e["err"], "out_err_worst_head": e["worst"]})
    with pytest.raises(ValueError, match="one numerator and denominator per head"):
        check.combine_head_errors([1.0], [1.0, 2.0])


def test_table_prints_every_case_and_errors():
    text = report.format_table(fake_results())
    lines = text.splitlines()
    assert lines[0].split()[0] == "case"
    assert lines[2].startswith("h96_fixed_8192") and lines[3].startswith("h4_varlen_2x300")
    assert "copy bandwidth 4.00 TB/s" in text
    assert "anchors-h200.md (test)" in text
    assert "h4_varlen_2x300: fla graph failed: RuntimeError: capture failed" in text
    assert report.CHECK_NOTE in text and report.L2_NOTE in text and report.AUTOTUNE_NOTE in text
    assert report.BF16_FLA_NOTE in text  # the custom case has bf16 states and fla ran
    assert "PARTIAL" not in text


def test_notes_follow_the_run():
    r = fake_results(with_fla=False)
    for c in r["cases"]:
        c["errors"] = {}
    text = report.format_table(r)
    assert report.AUTOTUNE_NOTE not in text and report.BF16_FLA_NOTE not in text
    r = fake_results()
    r["cases"][1]["case"]["state"] = "fp32"
    assert report.BF16_FLA_NOTE not in report.format_table(r)
    r["planned_cases"] = 5
    assert "PARTIAL: 2 of 5 cases finished" in report.format_table(r)
    assert "PARTIAL: 2 of 5 cases finished" in report.to_markdown(r)
    r["planned_cases"] = 2
    assert "PARTIAL" not in report.format_table(r)


def test_json_roundtrip(tmp_path):
    r = fake_results()
    path = tmp_path / "sub" / "results.json"
    report.write_json(r, path)
    back = json.loads(path.read_text())
    assert back == json.loads(json.dumps(r))
    assert back["cases"][0]["times"]["fla"]["graph"]["median"] == 1.6
    assert back["cases"][1]["case"]["seqlens"] == [100, 200]


def test_markdown_has_meta_table_and_anchor_note(tmp_path):
    path = tmp_path / "BENCH.md"
    report.write_markdown(fake_results(), path, "chart.png")
    md = path.read_text()
    assert md.startswith("# flash_kda benchmark on NVIDIA H200\n")
    for fragment in ("- driver: 580.1", "- torch: 2.11.0", "- triton: 3.6.0", "- fla: 0.6.0",
                     "- flash_kda: 0.1.0", "- date: 2026-11-30 10:00 UTC", "NOT from this run",
                     "![time per case](chart.png)", f"- {report.CHECK_NOTE}", f"- {report.L2_NOTE}"):
        assert fragment in md, fragment
    timing, accuracy = md.split("## Accuracy against the fp64 reference")
    table = [line for line in timing.splitlines() if line.startswith("|")]
    assert len(table) == 2 + 2  # header, rule, two cases
    assert table[0].count("|") == len(report.COLUMNS) + 1
    assert table[2].startswith("| h96_fixed_8192 | 8192 | 96 | 1 | 0.500 |")
    acc = [line for line in accuracy.splitlines() if line.startswith("|")]
    assert len(acc) == 2 + 2
    assert acc[0] == "| case | flash_kda out | flash_kda state | fla out | fla state |"
    assert "- settings: " in md and ", states " in md


def test_accuracy_section_values():
    r = fake_results()
    r["cases"][0]["check"].update(out_err=1.9e-3, out_err_worst_head=2.5e-3, state_err=2.4e-3,
                                  state_err_worst_head=3e-3, fla_out_err=4.1e-3, fla_state_err=2.8e-3)
    lines = report.accuracy_section(r)
    row = next(line for line in lines if line.startswith("| h96_fixed_8192 |"))
    assert row == "| h96_fixed_8192 | 1.9e-03 (2.5e-03) | 2.4e-03 (3.0e-03) | 4.1e-03 | 2.8e-03 |"
    for c in r["cases"]:
        c["check"] = None
    assert report.accuracy_section(r) == []


def test_layer_only_report():
    layer = {"hidden_size": 2304, "num_heads": 32, "head_dim": 128, "batch": 1, "T": 8192,
             "triton_ms": 3.0, "flash_kda_ms": 2.0, "rel_diff": 4e-3, "dispatched": True}
    text = report.format_table({"meta": {}, "cases": [], "layer": layer})
    assert "fla Triton 3.000 ms" in text and "flash_kda 2.000 ms" in text and "speedup 1.50x" in text
    assert "4.00e-03" in text and "WARNING" not in text
    layer.update(rel_diff_bound=2e-2, passed=True)
    assert "(bound 2e-02: ok)" in report.format_layer(layer)
    layer.update(rel_diff=3e-2, passed=False)
    assert "3.00e-02 (bound 2e-02: FAIL)" in report.format_layer(layer)
    layer["dispatched"] = False
    assert "WARNING: fla did not dispatch" in report.format_layer(layer)


def test_chart_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from flash_kda_bench import plotting

    path = tmp_path / "chart.png"
    plotting.plot(fake_results(), path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_geomean_line_over_cases_with_every_column():
    # Only h96_fixed_8192 has anchors (the custom case has none): the means are that case's values.
    line = report.geomean_line(fake_results())
    assert line == ("geomean over 1 case(s), eager: flash_kda 0.500 ms, fla 2.000 ms, "
                    "anchor FlashKDA 1.464 ms, anchor fla 2.659 ms")
    r = fake_results()
    r["cases"][1]["anchor"] = {"flash_kda_ms": 0.08, "fla_ms": 0.5, "floor_ms": 0.001}
    line = report.geomean_line(r)
    assert line.startswith("geomean over 2 case(s), eager: flash_kda 0.100 ms, fla 2.000 ms")
    assert report.geomean_line(fake_results(with_fla=False)) is None
    assert "geomean over 1 case(s)" in report.format_table(fake_results())
