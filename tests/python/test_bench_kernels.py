"""The benchmark's --kernels: kernel names shortened to their variant, per-call aggregation,
the profiler's device events (a stand-in torch), the suite's and --train's profile passes after
the timings, the flag's combinations, the report's table and ab_compare's per-kernel rows (no
GPU)."""
import contextlib
import importlib
import json
import sys
import types

import pytest

import _bench_path  # noqa: F401
from flash_kda_bench import cli, kernels, report, suite, train
from test_ab_compare import ab_compare

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
    ("plain_kernel(int, float*)", "plain_kernel"),
    ("void my_flash_kda::k<flash_kda::A>(int)", "my_flash_kda::k<A>"),
])
def test_short_kernel_name_keeps_the_variant_and_drops_the_rest(name, label):
    assert kernels.short_kernel_name(name) == label


def test_two_instances_of_one_kernel_stay_apart_and_repeats_sum_per_call():
    events = [(RECURRENCE, 50.0), (FINISH, 75.0), (RECURRENCE, 54.0), (FINISH, 81.0), ("Memset (Device)", 1.0)]
    assert kernels.aggregate(events, 2) == {"recurrence_kernel<Traits<8, true>>": 52.0,
                                            "recurrence_kernel<Traits<4, false>>": 78.0,
                                            "Memset (Device)": 0.5}
    with pytest.raises(ValueError, match="calls must be >= 1"):
        kernels.aggregate(events, 0)


def _fake_torch(monkeypatch, events):
    """A stand-in torch with a profiler that records `events` (name, device type, us) and
    counts the calls and synchronisations it sees."""
    cuda_type, cpu_type = object(), object()
    seen = {"calls": 0, "syncs": 0}

    class Profile:
        def __init__(self, activities):
            assert activities == ["CUDA"]

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def events(self):
            return [types.SimpleNamespace(name=n, device_type=cuda_type if dev == "cuda" else cpu_type,
                                          time_range=types.SimpleNamespace(elapsed_us=lambda us=us: us))
                    for n, dev, us in events]

    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(synchronize=lambda: seen.__setitem__("syncs", seen["syncs"] + 1))
    profiler = types.ModuleType("torch.profiler")
    profiler.profile = Profile
    profiler.ProfilerActivity = types.SimpleNamespace(CUDA="CUDA")
    autograd = types.ModuleType("torch.autograd")
    autograd.DeviceType = types.SimpleNamespace(CUDA=cuda_type, CPU=cpu_type)
    for name, mod in (("torch", torch), ("torch.profiler", profiler), ("torch.autograd", autograd)):
        monkeypatch.setitem(sys.modules, name, mod)

    def fn():
        seen["calls"] += 1
    return fn, seen


def test_kernel_times_take_the_device_events_only_per_profiled_call(monkeypatch):
    fn, seen = _fake_torch(monkeypatch, [(RECURRENCE, "cuda", 40.0), ("aten::empty", "cpu", 99.0),
                                         (RECURRENCE, "cuda", 44.0), ("Memset (Device)", "cuda", 2.0)])
    assert kernels.kernel_times_us(fn, calls=2, warmup=3) == {"recurrence_kernel<Traits<8, true>>": 42.0,
                                                              "Memset (Device)": 1.0}
    assert seen == {"calls": 5, "syncs": 2}


def test_a_profile_without_device_events_is_an_error(monkeypatch):
    fn, _ = _fake_torch(monkeypatch, [("aten::empty", "cpu", 5.0)])
    with pytest.raises(RuntimeError, match="no device event"):
        kernels.kernel_times_us(fn, calls=1, warmup=0)


def test_the_suite_profiles_each_timed_case_and_a_failure_does_not_fail_it(monkeypatch):
    fn, _ = _fake_torch(monkeypatch, [(FINISH, "cuda", 7.0)])
    monkeypatch.setattr(sys.modules["torch"], "inference_mode", lambda: __import__("contextlib").nullcontext(),
                        raising=False)
    monkeypatch.setattr(sys.modules["torch"].cuda, "empty_cache", lambda: None, raising=False)
    monkeypatch.setattr(suite.inputs, "make_inputs", lambda case, seed: object())
    monkeypatch.setattr(suite.impls, "flash_kda_fn", lambda x, num_sms: (fn, None))
    args = types.SimpleNamespace(seed=0, num_sms=None)
    result = {"times": {"flash_kda": {}}, "errors": {}}
    suite.profile_kernels(cli.parse_args(["--cases", "h16_fixed_8192"]).cases[0], args, result)
    assert result["kernels_us"] == {"flash_kda": {"recurrence_kernel<Traits<4, false>>": 7.0 / suite.KERNEL_CALLS}}

    def broken(x, num_sms):
        raise RuntimeError("CUPTI busy")
    monkeypatch.setattr(suite.impls, "flash_kda_fn", broken)
    failed = {"times": {"flash_kda": {}}, "errors": {}, "check": None}
    suite.profile_kernels(cli.parse_args(["--cases", "h16_fixed_8192"]).cases[0], args, failed)
    assert failed["errors"] == {"kernels": "RuntimeError: CUPTI busy"} and "kernels_us" not in failed
    assert not importlib.import_module("flash_kda_bench.main").case_failed(failed)


def test_the_flag_profiles_forward_cases_and_training_steps_only(capsys):
    assert cli.parse_args(["--kernels", "--cases", "h16_fixed_8192"]).kernels
    assert cli.parse_args(["--kernels", "--train", "--cases", "h16_fixed_8192"]).kernels
    assert not cli.parse_args([]).kernels
    for other in (["--decode"], ["--layer"], ["--from-json", "r.json"], ["--write-record"]):
        with pytest.raises(SystemExit) as e:
            cli.parse_args(["--kernels", *other])
        assert e.value.code == 2
        assert "--kernels profiles the forward cases (or --train's steps) after their timings" in capsys.readouterr().err


def test_train_profiles_each_timed_step_after_every_timing(monkeypatch):
    _fake_torch(monkeypatch, [])
    monkeypatch.setattr(sys.modules["torch"], "manual_seed", lambda seed: None, raising=False)
    order = []

    def run_case(case, args, use_fla):
        order.append(("time", case.name))
        timed = {} if case.name == "h4_fixed_1024" else {"flash_kda": {"eager": {"median": 1.0}}}
        return {"case": {"name": case.name}, "times": timed, "errors": {}}
    monkeypatch.setattr(train, "run_train_case", run_case)
    monkeypatch.setattr(train, "profile_train_kernels", lambda case, args, r: order.append(("profile", case.name)))
    args = cli.parse_args(["--train", "--kernels", "--no-fla", "--cases", "h16_fixed_8192,h4_fixed_1024,h32_fixed_8192"])
    results = train.run_train_suite(args, {"fla": "not installed"})
    assert order == [("time", "h16_fixed_8192"), ("time", "h4_fixed_1024"), ("time", "h32_fixed_8192"),
                     ("profile", "h16_fixed_8192"), ("profile", "h32_fixed_8192")]  # h4: flash_kda was not timed
    assert results["settings"]["kernel_calls"] == suite.KERNEL_CALLS
    order.clear()
    train.run_train_suite(cli.parse_args(["--train", "--no-fla", "--cases", "h16_fixed_8192"]), {"fla": None})
    assert order == [("time", "h16_fixed_8192")]


def test_a_train_step_profile_lands_in_its_case_and_a_failure_does_not_fail_it(monkeypatch):
    _fake_torch(monkeypatch, [])
    torch = sys.modules["torch"]
    for name, value in (("no_grad", contextlib.nullcontext), ("Tensor", type("Tensor", (), {}))):
        monkeypatch.setattr(torch, name, value, raising=False)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None, raising=False)
    monkeypatch.setattr(train.inputs, "make_inputs", lambda case, seed: object())
    monkeypatch.setattr(train.impls, "chunk_kda_kwargs", lambda x: {"q": "q0"})
    monkeypatch.setattr(train, "differentiable", lambda kw: ({**kw, "q": "q-leaf"}, ["q"]))
    monkeypatch.setattr(train, "flash_kda_call", lambda **kw: ("out", "final"))
    monkeypatch.setattr(train, "output_gradients", lambda out, final: (f"d {out}", f"d {final}"))
    steps = []
    monkeypatch.setattr(train, "step", lambda fn, kw, names, d_out, d_final: steps.append((kw, names, d_out, d_final)))

    def profiled(fn, calls):
        assert calls == suite.KERNEL_CALLS
        fn()
        return {"chain_kernel": 5.0}
    monkeypatch.setattr(kernels, "kernel_times_us", profiled)
    case = cli.parse_args(["--cases", "h16_fixed_8192"]).cases[0]
    args = types.SimpleNamespace(seed=0)
    result = {"times": {"flash_kda": {}}, "errors": {}}
    train.profile_train_kernels(case, args, result)
    assert result["kernels_us"] == {"flash_kda": {"chain_kernel": 5.0}}
    assert steps == [({"q": "q-leaf"}, ["q"], "d out", "d final")]  # the timed step: leaves, fixed gradients

    def busy(fn, calls):
        raise RuntimeError("CUPTI busy")
    monkeypatch.setattr(kernels, "kernel_times_us", busy)
    failed = {"times": {"flash_kda": {}}, "errors": {}, "check": None}
    train.profile_train_kernels(case, args, failed)
    assert failed["errors"] == {"kernels": "RuntimeError: CUPTI busy"} and "kernels_us" not in failed
    assert not train.case_failed(failed)


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


def test_report_names_a_training_step_rows_and_shows_them_in_a_train_run():
    results = {"settings": {"kernel_calls": 20}, "cases": [],
               "train": [_case("h32_fixed_8192", 5.0, {"chain_kernel": 1000.0})]}
    results["train"][0]["case"].update(T_total=8192, heads=32, num_seqs=1)
    assert "| h32_fixed_8192 (train step) | `chain_kernel` | 1000.0 | 20% |" in report.kernels_section(results)
    assert "## Per-kernel device time (`--kernels`)" in report.to_markdown(results)


def _round(tmp_path, side, rnd, kern):
    d = tmp_path / f"{side}-{rnd}"
    d.mkdir()
    entry = _case("h16_fixed_8192", 0.25, kern)
    entry["times"]["flash_kda"]["graph"] = {"median": 0.224}
    (d / "results.json").write_text(json.dumps({"cases": [entry]}))


def test_ab_compare_puts_each_kernel_of_both_builds_side_by_side(tmp_path, capsys, monkeypatch):
    for rnd, (sa, sb) in enumerate(((31.5, 32.8), (31.6, 32.9)), start=1):
        _round(tmp_path, "A", rnd, {"segment_scan_kernel": sa})
        _round(tmp_path, "B", rnd, {"segment_scan_kernel": sb, "zero_kernel": 1.0})
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


def test_a_kernel_made_a_template_is_paired_with_its_old_self_over_every_round(tmp_path):
    _round(tmp_path, "A", 1, {"segment_scan_kernel": 32.8})
    _round(tmp_path, "A", 2, {"segment_scan_kernel": 32.9, "late_kernel": 3.0})  # absent from round 1
    _round(tmp_path, "B", 1, {"segment_scan_kernel<false>": 31.5, "f<1>": 1.0, "f<2>": 2.0})
    _round(tmp_path, "B", 2, {"segment_scan_kernel<false>": 31.6, "f<1>": 1.0, "f<2>": 2.0})
    rows = ab_compare.kernel_rows(ab_compare.load(tmp_path, "A"), ab_compare.load(tmp_path, "B"))
    by = {r["kernel"]: r for r in rows}
    assert list(by) == ["segment_scan_kernel / segment_scan_kernel<false>", "late_kernel", "f<1>", "f<2>"]
    scan = by["segment_scan_kernel / segment_scan_kernel<false>"]
    assert scan["a"] == pytest.approx(32.85) and scan["b"] == pytest.approx(31.55)
    assert by["late_kernel"]["a"] == 3.0 and by["late_kernel"]["b"] is None
    assert by["f<1>"]["a"] is None and by["f<2>"]["b"] == 2.0  # two candidates: no guess


def test_ab_compare_names_a_training_step_kernels_apart_from_the_forward_case(tmp_path):
    for side, us in (("A", 1000.0), ("B", 900.0)):
        d = tmp_path / f"{side}-1"
        d.mkdir()
        (d / "results.json").write_text(json.dumps({
            "cases": [_case("h32_fixed_8192", 0.3, {"chain_kernel": 1.0})],
            "train": [_case("h32_fixed_8192", 5.0, {"chain_kernel": us})]}))
    rows = ab_compare.kernel_rows(ab_compare.load(tmp_path, "A"), ab_compare.load(tmp_path, "B"))
    assert [(r["case"], r["a"], r["b"]) for r in rows] == [("h32_fixed_8192", 1.0, 1.0),
                                                           ("h32_fixed_8192 (train step)", 1000.0, 900.0)]
