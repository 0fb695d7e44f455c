"""`python -m flash_kda.bench --decode` on CPU: its flags, the case list, the floor arithmetic,
the report on fake results, and --write-record merging the decode list into a record that
keeps its forward cases. Nothing here touches torch or a GPU."""
from __future__ import annotations

import json
import pytest

import importlib

import _bench_path  # noqa: F401
from flash_kda_bench import cli, decode, report
from test_bench_report import fake_results

main = importlib.import_module("flash_kda_bench.main")


def test_decode_defaults_are_the_whole_sweep():
    a = cli.parse_args(["--decode"])
    assert len(a.decode_cases) == 7 * 4 * 3 * 2
    assert a.cases == [] and a.check_seqs == 8
    assert {c.num_seqs for c in a.decode_cases} == {1, 8, 32, 128, 256, 512, 1024}
    assert {c.heads for c in a.decode_cases} == {4, 8, 32, 96}
    assert {c.T for c in a.decode_cases} == {1, 2, 4}
    assert [c.state for c in a.decode_cases[:84]] == ["fp32"] * 84  # fp32 pool first, then bf16
    assert a.decode_cases[0].name == "n1_h4_t1_fp32" and a.decode_cases[-1].name == "n1024_h96_t4_bf16"


def test_decode_flags_narrow_the_sweep():
    a = cli.parse_args(["--decode", "--decode-seqs", "1,32", "--decode-heads", "32", "--decode-tokens", "1,4",
                        "--decode-states", "bf16", "--check-seqs", "3"])
    assert [c.name for c in a.decode_cases] == ["n1_h32_t1_bf16", "n32_h32_t1_bf16", "n1_h32_t4_bf16",
                                                "n32_h32_t4_bf16"]
    assert a.check_seqs == 3


def test_decode_layouts_add_k_first_points_after_the_v_first_ones():
    a = cli.parse_args(["--decode", "--decode-seqs", "8", "--decode-heads", "32", "--decode-tokens", "1",
                        "--decode-states", "fp32", "--decode-layouts", "v_first,k_first"])
    assert [c.name for c in a.decode_cases] == ["n8_h32_t1_fp32", "n8_h32_t1_fp32_kfirst"]
    assert [c.layout for c in a.decode_cases] == ["v_first", "k_first"]
    assert a.decode_cases[1].to_dict()["layout"] == "k_first"
    # The default sweep is v-first only, its names unchanged.
    assert {c.layout for c in cli.parse_args(["--decode"]).decode_cases} == {"v_first"}
    with pytest.raises(ValueError, match="unknown state layout"):
        decode.decode_cases([1], [1], [1], ["fp32"], ["kv"])


def test_k_first_points_are_marked_in_the_table_and_summary():
    r = fake_decode()
    for entry in r["decode"]:
        c = decode.DecodeCase(entry["case"]["num_seqs"], entry["case"]["heads"], entry["case"]["T"],
                              entry["case"]["state"], layout="k_first")
        entry["case"] = c.to_dict()
    rows = [dict(zip(report.DECODE_COLUMNS, row)) for row in report.decode_rows(r)]
    assert rows[0]["point"] == "n1_h32_t1_fp32_kfirst" and rows[0]["state"] == "fp32 k-first"
    assert "1 x 32 heads, T = 1, fp32 k-first pool: 4.0 us (graph)" in report.decode_summary(r)


@pytest.mark.parametrize("argv, fragment", [
    (["--decode-heads", "4"], "give --decode too"),
    (["--decode", "--T", "8"], "do not combine it with forward case flags"),
    (["--decode", "--layer"], "do not combine it with forward case flags"),
    (["--decode", "--num-sms", "64"], "--num-sms"),
    (["--decode", "--decode-tokens", "17"], "out of range"),
    (["--decode", "--decode-states", "fp16"], "pool dtypes"),
    (["--decode", "--decode-layouts", "k_first,k_first"], "distinct state layouts"),
    (["--decode-layouts", "k_first"], "give --decode too"),
    (["--decode", "--decode-seqs", "1,,2"], "comma-separated"),
    (["--decode", "--decode-seqs", "0"], "must be >= 1"),
    (["--decode-kernel", "direct"], "give --decode too"),
    (["--decode", "--decode-kernel", "fast"], "unknown kernel 'fast'"),
    (["--decode", "--decode-kernel", "direct,direct"], "listed twice"),
    (["--decode", "--decode-kernel", ","], "comma list"),
])
def test_bad_decode_flags_exit_2(capsys, argv, fragment):
    with pytest.raises(SystemExit) as e:
        cli.parse_args(argv)
    assert e.value.code == 2
    assert fragment in capsys.readouterr().err


def test_case_dict_and_pool():
    c = decode.DecodeCase(32, 8, 4, "bf16")
    d = c.to_dict()
    assert (d["num_seqs"], d["heads"], d["T"], d["state"], d["name"]) == (32, 8, 4, "bf16", "n32_h8_t4_bf16")
    assert (d["pool_slots"], d["indices"]) == (128, "[N, T]")
    assert decode.DecodeCase(5, 8, 1).to_dict()["pool_slots"] == 5


def test_floor_bytes():
    # T = 1, fp32: state 32 heads x 128 x 128 x 4 bytes read and written, plus the token data.
    c = decode.DecodeCase(1, 32, 1, "fp32")
    state = 32 * 128 * 128 * 4
    tokens = 32 * (128 * 5 + 1) * 2
    params = 32 * 4 + 32 * 128 * 4 + 4
    assert decode.floor_bytes(c) == 2 * state + tokens + params
    assert decode.floor_ms(c, 4e12) == pytest.approx((2 * state + tokens + params) / 4e12 * 1e3)
    # T = 4 keeps a state per token: one read and four writes; bf16 halves the state bytes.
    c4 = decode.DecodeCase(8, 4, 4, "bf16")
    assert decode.floor_bytes(c4) == 5 * 8 * 4 * 128 * 128 * 2 + 8 * 4 * 4 * (128 * 5 + 1) * 2 + 4 * 4 + 4 * 128 * 4 + 8 * 4 * 4


def test_sample_indices():
    assert decode.sample_indices(3, 8) == [0, 1, 2]
    assert decode.sample_indices(1024, 1) == [0]
    s = decode.sample_indices(1024, 8)
    assert len(s) == 8 and s[0] == 0 and s[-1] == 1023 and s == sorted(set(s))


def test_verdict():
    assert decode.verdict({"out_err": 3e-3, "state_err": 1e-7, "fla_out_err": 3e-3, "fla_state_err": 1e-7})
    assert not decode.verdict({"out_err": 2e-2, "state_err": 1e-7})
    assert not decode.verdict({"out_err": float("nan"), "state_err": 1e-7})
    assert not decode.verdict({"out_err": 3e-3, "state_err": 1e-6, "fla_out_err": 3e-3, "fla_state_err": 1e-7})


def _times(median):
    return {"median": median, "min": median, "max": median, "n": 3}


def fake_decode(points=((1, 32, 1, "fp32", 0.004, 0.012), (1024, 96, 1, "fp32", 1.4, 3.0))):
    out = []
    for n, h, t, state, ours, fla in points:
        c = decode.DecodeCase(n, h, t, state)
        chk = {"out_err": 3e-3, "state_err": 2e-7, "fla_out_err": 3e-3, "fla_state_err": 2e-7, "sampled_seqs": 8}
        chk["passed"] = decode.verdict(chk)
        out.append({"case": c.to_dict(), "floor_bytes": decode.floor_bytes(c), "floor_ms": decode.floor_ms(c, 4e12),
                    "times": {"flash_kda": {"eager": _times(ours * 2), "graph": _times(ours)},
                              "fla": {"eager": _times(fla * 2), "graph": _times(fla)}},
                    "host_us": {"flash_kda": 6.25, "fla": 21.0}, "errors": {}, "check": chk})
    return {"meta": {"gpu": "NVIDIA H200", "fla": "0.6.0", "date": "2026-12-01 12:00 UTC"}, "copy_bandwidth": 4e12,
            "settings": {"iters": 3}, "planned_decode": len(out), "cases": [], "decode": out}


def test_decode_rows_and_summary():
    r = fake_decode()
    rows = [dict(zip(report.DECODE_COLUMNS, row)) for row in report.decode_rows(r)]
    assert rows[0]["point"] == "n1_h32_t1_fp32" and rows[0]["flash_kda graph us"] == "4.0"
    assert rows[0]["fla graph us"] == "12.0" and rows[0]["speedup vs fla (graph)"] == "3.00x"
    assert rows[0]["check"] == "ok 3.0e-03/2.0e-07"
    assert rows[0]["flash_kda host us"] == "6.2" and rows[0]["fla host us"] == "21.0"
    big = r["decode"][1]
    assert rows[1]["x floor (graph)"] == f"{1.4 / big['floor_ms']:.2f}x"
    summary = report.decode_summary(r)
    assert "faster than fla (CUDA graph): 2 of 2 points" in summary
    assert "1 x 32 heads, T = 1, fp32 pool: 4.0 us (graph)" in summary
    floor_line = next(s for s in summary if s.startswith("within 1.1x"))
    assert "of 1 points" in floor_line  # only the big point's floor is >= 30 us
    assert any(s.startswith("checks passed: 2 of 2") for s in summary)
    text = report.format_table(r)
    assert text.splitlines()[0].startswith("point") and "n1024_h96_t1_fp32" in text


def test_decode_markdown_and_json_shape(tmp_path):
    r = fake_decode()
    md = report.to_markdown(r)
    assert "## Decode (`python -m flash_kda.bench --decode`)" in md and "| n1_h32_t1_fp32 | 1 | 32 | 1 | fp32 |" in md
    report.write_json(r, tmp_path / "d.json")
    entry = json.loads((tmp_path / "d.json").read_text())["decode"][0]
    assert {"num_seqs", "heads", "T", "state"} <= set(entry["case"])
    assert set(entry["times"]) == {"flash_kda", "fla"}
    assert set(entry["times"]["fla"]) == {"eager", "graph"} and "median" in entry["times"]["fla"]["graph"]
    assert "floor_ms" in entry and "check" in entry
    assert entry["host_us"] == {"flash_kda": 6.25, "fla": 21.0}
    assert "| flash_kda eager us | flash_kda host us | fla graph us | fla eager us | fla host us |" in md


def test_decode_rows_without_host_times():
    """Records written before host_us existed (or a point whose host timing raised) show "-"."""
    r = fake_decode()
    del r["decode"][0]["host_us"]
    r["decode"][1]["host_us"] = {"flash_kda": 7.0}
    rows = [dict(zip(report.DECODE_COLUMNS, row)) for row in report.decode_rows(r)]
    assert rows[0]["flash_kda host us"] == "-" and rows[0]["fla host us"] == "-"
    assert rows[1]["flash_kda host us"] == "7.0" and rows[1]["fla host us"] == "-"
    assert report.DECODE_COLUMNS.index("flash_kda host us") == report.DECODE_COLUMNS.index("flash_kda eager us") + 1


def test_host_us_per_call_is_wall_clock_per_call_without_sync_inside():
    from flash_kda_bench import timing

    events = []
    now = [0.0]

    def clock():
        return now[0]

    def fn():
        events.append("call")
        now[0] += 5e-6  # each call takes 5 us of host time

    def sync():
        events.append("sync")

    assert timing.host_us_per_call(fn, 4, sync=sync, clock=clock) == pytest.approx(5.0)
    assert events == ["sync"] + ["call"] * 4 + ["sync"]  # no sync between calls
    with pytest.raises(ValueError, match="calls must be >= 1"):
        timing.host_us_per_call(fn, 0, sync=sync, clock=clock)


def test_write_record_merges_decode_and_keeps_cases(tmp_path, monkeypatch):
    record = fake_results()
    (tmp_path / cli.RECORD_JSON).write_text(json.dumps(record))
    written = []
    main.write_decode_record(fake_decode(), tmp_path, written)
    merged = json.loads((tmp_path / cli.RECORD_JSON).read_text())
    assert merged["cases"] == record["cases"] and merged["meta"] == record["meta"]
    assert [p["case"]["name"] for p in merged["decode"]] == ["n1_h32_t1_fp32", "n1024_h96_t1_fp32"]
    assert merged["decode_run"]["copy_bandwidth"] == 4e12
    md = (tmp_path / cli.RECORD_NAME).read_text()
    assert "## Decode" in md and "| h96_fixed_8192 |" in md  # the forward table stays
    # a second decode run replaces the decode list, not appends to it
    main.write_decode_record(fake_decode(points=((8, 4, 2, "bf16", 0.01, 0.02),)), tmp_path, written)
    merged = json.loads((tmp_path / cli.RECORD_JSON).read_text())
    assert [p["case"]["name"] for p in merged["decode"]] == ["n8_h4_t2_bf16"] and merged["cases"] == record["cases"]


def test_point_failed():
    r = fake_decode()["decode"][0]
    assert not decode.point_failed(r)
    assert decode.point_failed({**r, "check": {**r["check"], "passed": False}})
    assert decode.point_failed({**r, "errors": {"flash_kda graph": "RuntimeError"}})
    assert not decode.point_failed({**r, "errors": {"fla graph": "RuntimeError"}})


def test_from_json_rerenders_a_decode_run(tmp_path, capsys):
    path = tmp_path / "results.json"
    report.write_json(fake_decode(), path)
    args = cli.parse_args(["--from-json", str(path), "--out-dir", str(tmp_path / "out"), "--no-plot"])
    assert main.rerender(args) == 0
    assert "n1024_h96_t1_fp32" in capsys.readouterr().out
    assert "## Decode" in (tmp_path / "out" / "results.md").read_text()


def test_decode_without_a_gpu_exits_2_before_touching_it(monkeypatch, capsys, tmp_path):
    from flash_kda_bench import environment

    monkeypatch.setattr(environment, "unmet_requirement", lambda: "needs a GPU; none here.")
    assert main.main(["--decode", "--decode-heads", "4", "--out-dir", str(tmp_path / "o")]) == 2
    captured = capsys.readouterr()
    assert captured.err == "needs a GPU; none here.\n" and captured.out == ""
    assert not (tmp_path / "o").exists()


def test_decode_run_writes_outputs_and_exit_code(monkeypatch, capsys, tmp_path):
    """main's --decode flow on a stand-in sweep: outputs written, table printed, exit 1 when a
    point's check failed."""
    from flash_kda_bench import environment

    monkeypatch.setattr(environment, "unmet_requirement", lambda: None)
    monkeypatch.setattr(environment, "collect_meta", lambda: {"gpu": "stand-in", "fla": "0.6.0"})
    monkeypatch.setattr(environment, "fla_available", lambda: True)
    results = fake_decode()
    monkeypatch.setattr(decode, "run_decode_suite", lambda args, meta, on_point=None: results)
    out = tmp_path / "o"
    assert main.main(["--decode", "--out-dir", str(out), "--no-plot"]) == 0
    assert "n1_h32_t1_fp32" in capsys.readouterr().out
    assert json.loads((out / "results.json").read_text())["decode"] == results["decode"]
    results["decode"][0]["check"]["passed"] = False
    assert main.main(["--decode", "--out-dir", str(out), "--no-plot"]) == 1


def test_decode_kernel_flag():
    assert cli.parse_args(["--decode"]).decode_kernels == ["auto"]
    a = cli.parse_args(["--decode", "--decode-kernel", "auto,persistent,direct"])
    assert a.decode_kernels == ["auto", "persistent", "direct"]
    assert cli.parse_args(["--decode", "--decode-kernel", "direct"]).decode_kernels == ["direct"]
    assert [decode.kernel_label(k) for k in decode.KERNELS] == ["flash_kda", "flash_kda_persistent",
                                                                  "flash_kda_direct", "flash_kda_direct_columns",
                                                                  "flash_kda_direct_rows"]
    assert cli.parse_args(["--decode", "--decode-kernel", "auto,direct_rows,direct_columns"]).decode_kernels == [
        "auto", "direct_rows", "direct_columns"]


def test_decode_kernel_table():
    r = fake_decode()
    assert report.decode_kernel_rows(r) == ([], [])  # auto alone: no per-kernel table
    assert "decode kernels" not in report.format_decode_table(r)
    for p in r["decode"]:
        g = p["times"]["flash_kda"]["graph"]
        p["times"]["flash_kda_persistent"] = {"graph": {k: v * 2 if isinstance(v, float) else v
                                                        for k, v in g.items()}}
        p["times"]["flash_kda_direct"] = {"graph": dict(g)}
    cols, rows = report.decode_kernel_rows(r)
    assert cols[0] == "point" and cols[1:4] == ["flash_kda graph us", "flash_kda x floor", "fla / flash_kda"]
    assert "flash_kda_persistent graph us" in cols and "fla / flash_kda_direct" in cols
    first = dict(zip(cols, rows[0]))
    assert first["flash_kda_persistent graph us"] == "8.0" and first["flash_kda_direct graph us"] == "4.0"
    assert first["fla / flash_kda_direct"] == "3.00x" and first["fla / flash_kda_persistent"] == "1.50x"
    assert "decode kernels (CUDA graph):" in report.format_decode_table(r)


def test_forward_write_record_keeps_the_decode_table(tmp_path, monkeypatch):
    decode_record = report.merge_decode(fake_results(), fake_decode())
    (tmp_path / cli.RECORD_JSON).write_text(json.dumps(decode_record))
    monkeypatch.setattr(cli, "repo_root", lambda: tmp_path)
    monkeypatch.setattr(report, "update_readme", lambda path, results: False)
    fresh = fake_results()
    fresh["meta"] = {**fresh["meta"], "date": "a later run"}
    args = cli.parse_args(["--write-record", "--no-plot", "--out-dir", str(tmp_path / "out")])
    main.write_outputs(fresh, args)
    record = json.loads((tmp_path / cli.RECORD_JSON).read_text())
    assert record["meta"]["date"] == "a later run"
    assert [p["case"]["name"] for p in record["decode"]] == ["n1_h32_t1_fp32", "n1024_h96_t1_fp32"]
    assert record["decode_run"]["copy_bandwidth"] == 4e12
    assert "## Decode" in (tmp_path / cli.RECORD_NAME).read_text()
    # the run's own results.json has no decode points: only the record keeps them
    assert not json.loads((tmp_path / "out" / "results.json").read_text()).get("decode")


def test_forward_write_record_over_a_decode_only_record_keeps_its_metadata(tmp_path, monkeypatch):
    # a record written by a decode run alone (no forward cases): its meta is the decode run's
    (tmp_path / cli.RECORD_JSON).write_text(json.dumps(fake_decode()))
    monkeypatch.setattr(cli, "repo_root", lambda: tmp_path)
    monkeypatch.setattr(report, "update_readme", lambda path, results: False)
    main.write_outputs(fake_results(), cli.parse_args(["--write-record", "--no-plot", "--out-dir", str(tmp_path / "out")]))
    record = json.loads((tmp_path / cli.RECORD_JSON).read_text())
    assert record["decode_run"]["copy_bandwidth"] == 4e12
    assert record["decode_run"]["meta"] == fake_decode()["meta"]
