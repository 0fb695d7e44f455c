"""main() and the suite's bookkeeping on fakes (CPU only: no GPU, torch or fla needed).

The GPU work (run_case, run_layer, the reference) is replaced by stand-ins, so these tests
pin what main does with their results: exit codes, which errors fail a case, the files left
behind after each case, and the --layer bound.
"""

import contextlib
import importlib
import json
import sys
import types

import pytest

import _bench_path  # noqa: F401
from flash_kda_bench import environment, impls, layer, suite

main_mod = importlib.import_module("flash_kda_bench.main")  # the package's `main` is the function
from flash_kda_bench.cases import Case, floor_ms, hbm_floor_bytes

BW = 4.0e12


@pytest.fixture
def gpu_machine(monkeypatch):
    """main() believes it runs on a usable GPU machine without fla; torch is a stand-in."""
    monkeypatch.setattr(environment, "unmet_requirement", lambda: None)
    monkeypatch.setattr(environment, "collect_meta", lambda: {"gpu": "Fake H200", "fla": "0.6.0"})
    monkeypatch.setattr(environment, "fla_available", lambda: False)
    fake_torch = types.SimpleNamespace(manual_seed=lambda seed: None,
                                       cuda=types.SimpleNamespace(synchronize=lambda: None))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setattr(suite.timing, "copy_bandwidth", lambda: BW)


def _case_result(case, out_err=3e-3, errors=None):
    chk = {"heads": "all", "out_err": out_err, "state_err": 2e-3, "bound": 1e-2, "fla_ratio_bound": 1.5}
    chk["passed"] = suite.check.verdict(chk)
    return {"case": case.to_dict(), "floor_bytes": hbm_floor_bytes(case), "floor_ms": floor_ms(case, BW),
            "anchor": None, "times": {"flash_kda": {"eager": {"median": 0.5, "min": 0.4, "max": 0.6, "n": 5}}},
            "errors": dict(errors or {}), "check": chk}


class Stopped(Exception):
    """Stands for the run being killed by a time limit in the middle of a case."""


def test_results_are_written_after_each_case(gpu_machine, monkeypatch, tmp_path):
    done = []

    def run_case(case, args, copy_bw, use_fla):
        if done:
            # The first case's files must already be on disk while the second one runs.
            on_disk = json.loads((tmp_path / "results.json").read_text())
            assert [c["case"]["name"] for c in on_disk["cases"]] == ["h4_fixed_1024"]
            raise Stopped
        done.append(case.name)
        return _case_result(case)

    monkeypatch.setattr(suite, "run_case", run_case)
    with pytest.raises(Stopped):
        main_mod.main(["--cases", "h4_fixed_1024,h96_fixed_512", "--out-dir", str(tmp_path), "--no-plot"])
    left = json.loads((tmp_path / "results.json").read_text())
    assert left["planned_cases"] == 2 and len(left["cases"]) == 1
    assert left["copy_bandwidth"] == BW
    md = (tmp_path / "results.md").read_text()
    assert "| h4_fixed_1024 |" in md and "PARTIAL: 1 of 2 cases finished" in md


def test_full_run_exit_codes(gpu_machine, monkeypatch, tmp_path, capsys):
    results = {"h4_fixed_1024": _case_result(Case("h4_fixed_1024", 4, T=1024),
                                             errors={"fla check": "RuntimeError: fla broke"}),
               "h96_fixed_512": _case_result(Case("h96_fixed_512", 96, T=512))}
    monkeypatch.setattr(suite, "run_case", lambda case, *a: results[case.name])
    argv = ["--cases", "h4_fixed_1024,h96_fixed_512", "--out-dir", str(tmp_path), "--no-plot"]
    assert main_mod.main(argv) == 0  # an fla error is reported, never a failure
    out = capsys.readouterr().out
    assert "h4_fixed_1024: fla check failed: RuntimeError: fla broke" in out and "PARTIAL" not in out
    results["h96_fixed_512"] = _case_result(Case("h96_fixed_512", 96, T=512), out_err=5e-2)
    assert main_mod.main(argv) == 1
    assert "FAIL 5.0e-02" in capsys.readouterr().out


def test_case_failed_keys():
    ok = {"check": {"passed": True}, "errors": {}}
    assert not main_mod.case_failed(ok)
    assert not main_mod.case_failed({**ok, "errors": {"fla check": "x", "fla eager": "y", "fla graph": "z"}})
    assert main_mod.case_failed({**ok, "errors": {"check": "x"}})
    assert main_mod.case_failed({**ok, "errors": {"flash_kda graph": "x"}})
    assert main_mod.case_failed({"check": {"passed": False}, "errors": {}})


def _layer_result(rel_diff, dispatched=True):
    res = {"hidden_size": 2304, "num_heads": 32, "head_dim": 128, "batch": 1, "T": 8192,
           "triton_ms": 3.0, "flash_kda_ms": 2.0, "rel_diff": rel_diff, "dispatched": dispatched,
           "rel_diff_bound": layer.REL_DIFF_BOUND}
    res["passed"] = layer.layer_passed(res)
    return res


@pytest.mark.parametrize("rel_diff, dispatched, code", [
    (5e-3, True, 0),
    (1.9e-2, True, 0),
    (2.5e-2, True, 1),          # over the 2e-2 bound
    (float("nan"), True, 1),
    (5e-3, False, 1),           # fla never called flash_kda: the comparison means nothing
])
def test_layer_bound_sets_the_exit_code(gpu_machine, monkeypatch, tmp_path, capsys, rel_diff, dispatched, code):
    monkeypatch.setattr(environment, "fla_layer_unavailable", lambda: None)
    monkeypatch.setattr(layer, "run_layer", lambda *a: _layer_result(rel_diff, dispatched))
    assert main_mod.main(["--layer", "--out-dir", str(tmp_path), "--no-plot"]) == code
    text = capsys.readouterr().out
    assert ("(bound 2e-02: ok)" in text) == (code == 0)
    saved = json.loads((tmp_path / "results.json").read_text())["layer"]
    assert saved["passed"] == (code == 0)


def test_layer_passed_needs_a_finished_run():
    assert layer.layer_passed({"rel_diff": 1e-3, "dispatched": True})
    assert not layer.layer_passed({"rel_diff": 1e-3, "dispatched": True, "error": "RuntimeError: x"})
    assert not layer.layer_passed({"dispatched": True})
    assert not layer.layer_passed({"rel_diff": float("inf"), "dispatched": True})


def test_layer_without_fla_layers_exits_2_with_one_sentence(gpu_machine, monkeypatch, tmp_path, capsys):
    # fla-core alone has fla.ops.kda (so fla_available() is true) but no fla.layers.
    monkeypatch.setattr(environment, "fla_available", lambda: True)
    def import_module(name):
        if name.startswith("fla.layers"):
            raise ModuleNotFoundError("No module named 'fla.layers'")
        return importlib.import_module(name)

    # Patched in environment only, so a real fla is never imported under the fake torch.
    monkeypatch.setattr(environment, "importlib", types.SimpleNamespace(import_module=import_module))
    assert main_mod.main(["--layer", "--out-dir", str(tmp_path / "o")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = [l for l in captured.err.splitlines() if l.strip()]
    assert line.startswith("--layer needs fla's KimiDeltaAttention layer (fla.layers.kda") and line.endswith(".")
    assert not (tmp_path / "o").exists()


class _Buffers:
    """Stand-ins for the checked calls' outputs: only identity matters here."""


def _check_with(monkeypatch, ours, fla_call, dispatched=0):
    seen = {}

    def check_case(x, ours_out, ours_state, fla_out, fla_state):
        seen["fla_out"] = fla_out
        return {"passed": True, "out_err": 1e-3}

    @contextlib.contextmanager
    def counter():
        yield [dispatched]

    monkeypatch.setattr(suite.check, "check_case", check_case)
    monkeypatch.setattr(impls, "count_flash_kda_calls", counter)
    result = {"errors": {}, "check": None}
    fla_res = {"out": _Buffers(), "final_state": None}
    outputs = (_Buffers(), None)
    kept = suite._check(None, ours, lambda: outputs, fla_call, fla_res, result)
    return result, kept, seen, fla_res


def _raises(exc):
    def call():
        raise exc
    return call


def test_fla_errors_in_the_check_are_fla_s_own(gpu_machine, monkeypatch):
    result, kept, seen, _ = _check_with(monkeypatch, lambda: None, _raises(RuntimeError("triton OOM")))
    assert result["errors"] == {"fla check": "RuntimeError: triton OOM"}
    assert result["check"]["passed"] and seen["fla_out"] is None  # ours still checked, without fla
    assert kept is None  # a failed fla is not timed
    assert not main_mod.case_failed(result)


def test_fla_dispatching_to_flash_kda_is_reported_and_not_timed(gpu_machine, monkeypatch):
    result, kept, seen, _ = _check_with(monkeypatch, lambda: None, lambda: None, dispatched=1)
    assert "dispatched to flash_kda" in result["errors"]["fla check"]
    assert kept is None and seen["fla_out"] is None


def test_our_errors_in_the_check_fail_the_case(gpu_machine, monkeypatch):
    fla = lambda: None  # noqa: E731
    result, kept, seen, _ = _check_with(monkeypatch, _raises(ValueError("bad shape")), fla)
    assert result["errors"] == {"check": "ValueError: bad shape"} and result["check"] is None
    assert main_mod.case_failed(result)
    result, kept, seen, fla_res = _check_with(monkeypatch, lambda: None, fla)
    assert result["errors"] == {} and kept is fla and seen["fla_out"] is fla_res["out"]


def test_from_json_rerenders_without_a_gpu(monkeypatch, tmp_path, capsys):
    # No GPU: --from-json must not even ask for one.
    monkeypatch.setattr(environment, "unmet_requirement", lambda: "needs a GPU")
    cases = [Case("h4_fixed_1024", heads=4, T=1024), Case("h96_fixed_512", heads=96, T=512)]
    results = {"meta": {"gpu": "Fake H200"}, "copy_bandwidth": BW, "settings": {"iters": 5, "warmup": 1, "seed": 0},
               "cases": [_case_result(c) for c in cases]}
    src = tmp_path / "earlier.json"
    src.write_text(json.dumps(results))
    out = tmp_path / "out"
    code = main_mod.main(["--from-json", str(src), "--out-dir", str(out), "--no-plot"])
    assert code == main_mod.EXIT_OK
    assert json.loads((out / "results.json").read_text())["cases"] == results["cases"]
    md = (out / "results.md").read_text()
    assert "h4_fixed_1024" in md and "h96_fixed_512" in md
    assert "h96_fixed_512" in capsys.readouterr().out


def test_from_json_failed_check_exits_1(tmp_path):
    results = {"meta": {}, "copy_bandwidth": BW, "settings": {"iters": 5, "warmup": 1, "seed": 0},
               "cases": [_case_result(Case("h4_fixed_1024", heads=4, T=1024), out_err=0.5)]}
    src = tmp_path / "earlier.json"
    src.write_text(json.dumps(results))
    assert main_mod.main(["--from-json", str(src), "--out-dir", str(tmp_path / "o"), "--no-plot"]) == main_mod.EXIT_FAILED


@pytest.mark.parametrize("content", [None, "{not json", '{"meta": {}}'])
def test_from_json_unreadable_exits_2(tmp_path, capsys, content):
    src = tmp_path / "earlier.json"
    if content is not None:
        src.write_text(content)
    assert main_mod.main(["--from-json", str(src), "--out-dir", str(tmp_path / "o")]) == main_mod.EXIT_UNSUPPORTED
    assert "--from-json: cannot read" in capsys.readouterr().err
