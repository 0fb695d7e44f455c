"""`python -m flash_kda.bench --train` on CPU: its flags, the training table on fake results,
--write-record merging the `train` list into the record while the forward cases and the decode
table stay (and a forward or decode --write-record keeping it), --from-json, main's exit code;
and the step's pieces on host tensors (the differentiable copies, the saved-bytes count, the
check's slice). Nothing here needs a GPU."""
from __future__ import annotations

import importlib
import json

import pytest

import _bench_path  # noqa: F401
from flash_kda_bench import cli, report, train
from flash_kda_bench.cases import Case
from test_bench_decode import fake_decode
from test_bench_report import _times, fake_results

main = importlib.import_module("flash_kda_bench.main")


def fake_train(cases=(("h96_fixed_8192", 96, 8192, 3.0, 13.3), ("h32_fixed_8192", 32, 8192, 1.0, 4.9))):
    out = []
    for name, h, t, ours, fla in cases:
        c = Case(name, h, T=t, entry="chunk_kda")
        chk = {"tokens": 256, "heads": 4, "errors": {"flash_kda": {"dq": 4e-3, "dg": 6e-3}, "fla": {"dq": 5e-3,
                                                                                                  "dg": 7e-3}},
               "worst": 6e-3, "bound": 2e-2, "fla_ratio_bound": 1.5, "passed": True}
        out.append({"case": c.to_dict(), "times": {"flash_kda": {"eager": _times(ours)}, "fla": {"eager": _times(fla)}},
                    "saved_bytes": {"flash_kda": 1_234_000_000, "fla": 2_500_000_000},
                    "saved_bytes_beyond_inputs": {"flash_kda": 0, "fla": 1_266_000_000}, "check": chk, "errors": {}})
    return {"meta": {"gpu": "NVIDIA H200", "fla": "0.6.0", "date": "2026-12-03 09:00 UTC"},
            "settings": {"iters": 30, "warmup": 5, "seed": 0, "fla": True}, "planned_train": len(out), "cases": [],
            "train": out}


def test_train_flag_takes_the_suite_through_chunk_kda():
    a = cli.parse_args(["--train"])
    assert a.train and len(a.cases) == 13 and {c.entry for c in a.cases} == {"chunk_kda"}
    a = cli.parse_args(["--train", "--cases", "h32_fixed_8192", "--gate", "safe,softplus"])
    assert [(c.name, c.gate) for c in a.cases] == [("h32_fixed_8192", "safe"), ("h32_fixed_8192", "softplus")]
    assert not cli.parse_args([]).train


@pytest.mark.parametrize("argv, fragment", [
    (["--train", "--decode"], "--train runs training steps"),
    (["--train", "--layer"], "--train runs training steps"),
    (["--train", "--num-sms", "80"], "--train runs training steps"),
    (["--train", "--strided"], "not with --strided"),
    (["--train", "--entry", "fwd"], "not with --strided, --entry"),
    (["--train", "--state", "bf16"], "fp32 states"),
    (["--train", "--state-dtypes", "bf16,fp32"], "fp32 states"),
])
def test_bad_train_flags_exit_2(capsys, argv, fragment):
    with pytest.raises(SystemExit) as e:
        cli.parse_args(argv)
    assert e.value.code == 2 and fragment in capsys.readouterr().err


def test_train_rows_and_summary():
    r = fake_train()
    rows = [dict(zip(report.TRAIN_COLUMNS, row)) for row in report.train_rows(r)]
    assert rows[0]["case"] == "h96_fixed_8192" and rows[0]["flash_kda fwd+bwd ms"] == "3.000"
    assert rows[0]["fla fwd+bwd ms"] == "13.300" and rows[0]["speedup vs fla"] == "4.43x"
    assert rows[0]["flash_kda saved MB"] == "1234.0" and rows[0]["fla saved MB"] == "2500.0"
    assert rows[0]["grad check"] == "ok 6.0e-03"
    summary = report.train_summary(r)
    geo_ours, geo_fla = (3.0 * 1.0) ** 0.5, (13.3 * 4.9) ** 0.5
    assert summary[0] == (f"geomean over 2 case(s), forward + backward, eager: flash_kda {geo_ours:.3f} ms, "
                          f"fla {geo_fla:.3f} ms (fla / flash_kda {geo_fla / geo_ours:.2f}x)")
    assert "gradient checks passed: 2 of 2" in summary and report.TRAIN_NOTE in summary
    # a skipped check shows "-" and its reason once
    for p in r["train"]:
        p["check"], p["check_note"] = None, "skipped: no yardstick"
    assert report.train_rows(r)[0][-1] == "-"
    assert report.train_summary(r).count("gradient check skipped: no yardstick") == 1
    r["planned_train"] = 5
    assert "PARTIAL: 2 of 5 training cases finished" in report.train_summary(r)


def test_train_table_and_markdown():
    r = fake_train()
    text = report.format_table(r)
    assert text.splitlines()[0].startswith("case") and "h32_fixed_8192" in text
    md = report.to_markdown(r)
    assert "## Training (`python -m flash_kda.bench --train`)" in md
    assert "| h96_fixed_8192 | 8192 | 96 | 1 | 3.000 | 13.300 | 4.43x | 1234.0 | 2500.0 | ok 6.0e-03 |" in md


def test_case_failed():
    r = fake_train()["train"][0]
    assert not train.case_failed(r)
    assert train.case_failed({**r, "check": {**r["check"], "passed": False}})
    assert train.case_failed({**r, "errors": {"flash_kda": "RuntimeError"}})
    assert train.case_failed({**r, "errors": {"check": "RuntimeError"}})
    assert not train.case_failed({**r, "errors": {"fla": "RuntimeError"}})
    assert not train.case_failed({**r, "check": None, "check_note": "skipped"})


def test_train_write_record_keeps_cases_and_decode(tmp_path):
    record = report.merge_decode(fake_results(), fake_decode())
    (tmp_path / cli.RECORD_JSON).write_text(json.dumps(record))
    written = []
    main.write_train_record(fake_train(), tmp_path, written)
    merged = json.loads((tmp_path / cli.RECORD_JSON).read_text())
    assert merged["cases"] == record["cases"] and merged["decode"] == record["decode"]
    assert merged["meta"] == record["meta"] and merged["decode_run"] == record["decode_run"]
    assert [p["case"]["name"] for p in merged["train"]] == ["h96_fixed_8192", "h32_fixed_8192"]
    assert merged["train"][0]["times"]["flash_kda"]["eager"]["median"] == 3.0
    assert merged["train"][0]["saved_bytes"] == {"flash_kda": 1_234_000_000, "fla": 2_500_000_000}
    assert merged["train_run"]["meta"]["date"] == "2026-12-03 09:00 UTC"
    md = (tmp_path / cli.RECORD_NAME).read_text()
    assert "## Training" in md and "## Decode" in md and "| h96_fixed_8192 |" in md
    # a second training run replaces the list
    main.write_train_record(fake_train(cases=(("h4_fixed_1024", 4, 1024, 0.2, 0.5),)), tmp_path, written)
    merged = json.loads((tmp_path / cli.RECORD_JSON).read_text())
    assert [p["case"]["name"] for p in merged["train"]] == ["h4_fixed_1024"] and merged["cases"] == record["cases"]


def test_forward_and_decode_write_record_keep_the_training_table(tmp_path, monkeypatch):
    (tmp_path / cli.RECORD_JSON).write_text(json.dumps(report.merge_train(fake_results(), fake_train())))
    monkeypatch.setattr(cli, "repo_root", lambda: tmp_path)
    monkeypatch.setattr(report, "update_readme", lambda path, results: False)
    main.write_outputs(fake_results(), cli.parse_args(["--write-record", "--no-plot", "--out-dir",
                                                       str(tmp_path / "out")]))
    record = json.loads((tmp_path / cli.RECORD_JSON).read_text())
    assert [p["case"]["name"] for p in record["train"]] == ["h96_fixed_8192", "h32_fixed_8192"]
    assert record["train_run"]["settings"]["iters"] == 30
    assert "## Training" in (tmp_path / cli.RECORD_NAME).read_text()
    main.write_decode_record(fake_decode(), tmp_path, [])
    record = json.loads((tmp_path / cli.RECORD_JSON).read_text())
    assert record["train"] and record["decode"] and record["cases"]
    md = (tmp_path / cli.RECORD_NAME).read_text()
    assert "## Training" in md and "## Decode" in md


def test_train_run_writes_outputs_and_exit_code(monkeypatch, capsys, tmp_path):
    from flash_kda_bench import environment

    monkeypatch.setattr(environment, "unmet_requirement", lambda: None)
    monkeypatch.setattr(environment, "collect_meta", lambda: {"gpu": "stand-in", "fla": "0.6.0"})
    monkeypatch.setattr(environment, "fla_available", lambda: True)
    results = fake_train()
    seen = []
    monkeypatch.setattr(train, "run_train_suite", lambda args, meta, on_case=None: seen.append(args) or results)
    out = tmp_path / "o"
    assert main.main(["--train", "--cases", "h96_fixed_8192", "--out-dir", str(out), "--no-plot"]) == 0
    assert [c.name for c in seen[0].cases] == ["h96_fixed_8192"]
    assert "h32_fixed_8192" in capsys.readouterr().out
    assert json.loads((out / "results.json").read_text())["train"] == results["train"]
    results["train"][1]["check"]["passed"] = False
    assert main.main(["--train", "--out-dir", str(out), "--no-plot"]) == 1
    # --from-json re-renders it (and judges it the same way)
    args = cli.parse_args(["--from-json", str(out / "results.json"), "--out-dir", str(tmp_path / "r"), "--no-plot"])
    assert main.rerender(args) == 1
    assert "## Training" in (tmp_path / "r" / "results.md").read_text()


# --- the step's pieces on host tensors ---------------------------------------------------------


def test_differentiable_copies_the_inputs_the_call_reads():
    torch = pytest.importorskip("torch")
    q, A_log, h0, cu = torch.ones(1, 4, 1, 8), torch.zeros(1), torch.zeros(1, 1, 8, 8), torch.tensor([0, 4])
    kw, names = train.differentiable(dict(q=q, A_log=A_log, initial_state=h0, cu_seqlens=cu, use_gate_in_kernel=True))
    assert names == ["q", "A_log", "initial_state"]
    assert kw["q"].requires_grad and kw["q"] is not q and not q.requires_grad and torch.equal(kw["q"], q)
    assert kw["cu_seqlens"] is cu
    kw, names = train.differentiable(dict(q=q, A_log=A_log, use_gate_in_kernel=False))
    assert names == ["q"] and kw["A_log"] is A_log  # ignored without the fused gate: no gradient


def test_saved_bytes_counts_unique_storages_and_those_beyond_the_inputs():
    torch = pytest.importorskip("torch")

    def fn(a, b):
        c = a * 2  # a new tensor the product below saves
        return (c * b).sum() + (a.view(-1) * a.view(-1)).sum()  # saves c, b, and a's views (a's storage)

    a = torch.ones(4, 4, requires_grad=True)
    b = torch.ones(4, 4, requires_grad=True)
    total, beyond = train.saved_bytes(fn, dict(a=a, b=b))
    assert beyond == 64 and total == 3 * 64  # a, b and c, each 16 fp32 once


def test_step_returns_the_gradients_without_accumulating():
    torch = pytest.importorskip("torch")

    def fn(q, initial_state):
        return q * 3, initial_state * 2

    kw, names = train.differentiable(dict(q=torch.ones(1, 2, 1, 4), initial_state=torch.ones(1, 1, 4, 4)))
    d_out, d_final = train.output_gradients(torch.zeros(1, 2, 1, 4), torch.zeros(1, 1, 4, 4))
    grads = train.step(fn, kw, names, d_out, d_final)
    assert torch.equal(grads[0], 3 * d_out) and torch.equal(grads[1], 2 * d_final)
    assert kw["q"].grad is None
    again, _ = train.output_gradients(torch.zeros(1, 2, 1, 4), torch.zeros(1, 1, 4, 4))
    assert torch.equal(again, d_out)  # fixed seed: the same gradients for both implementations


def test_check_slice_is_the_first_tokens_and_heads_of_the_first_sequence():
    torch = pytest.importorskip("torch")
    from flash_kda_bench.inputs import Inputs

    case = Case("v", 8, seqlens=(300, 50), entry="chunk_kda")
    t, h = 350, 8
    x = Inputs(q=torch.arange(t * h * 2.0).view(1, t, h, 2), k=torch.zeros(1, t, h, 2), v=torch.zeros(1, t, h, 2),
               g=torch.zeros(1, t, h, 2), beta=torch.zeros(1, t, h), A_log=torch.arange(h * 1.0),
               dt_bias=torch.zeros(h, 2), initial_state=torch.zeros(2, h, 2, 2), cu_seqlens=torch.tensor([0, 300, 350]),
               cu_seqlens_cpu=torch.tensor([0, 300, 350]), scale=0.5, case=case)
    s = train.check_slice(x)
    assert s.q.shape == (1, 256, 4, 2) and s.beta.shape == (1, 256, 4) and s.initial_state.shape == (1, 4, 2, 2)
    assert torch.equal(s.q, x.q[:, :256, :4]) and torch.equal(s.A_log, torch.arange(4.0))
    assert s.cu_seqlens is None and s.cu_seqlens_cpu is None and s.case is case and s.scale == 0.5
    assert train.check_slice(x, tokens=1000).q.shape[1] == 300  # never past the first sequence
