"""scripts/sanitize.py's command line on the CPU: case sets, shards and their log names (the
sanitized runs themselves need compute-sanitizer and an sm_90 GPU: scripts/gpu-check.sh)."""
import argparse
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "sanitize.py"
_spec = importlib.util.spec_from_file_location("sanitize_script", SCRIPT)
sanitize = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sanitize)


def test_parts_parse_into_the_run_order():
    assert sanitize._parts("backward,forward") == ("forward", "backward")
    assert sanitize._parts("decode") == ("decode",)
    for bad in ("", "forward,bogus", ","):
        with pytest.raises(argparse.ArgumentTypeError, match="among forward, decode, backward"):
            sanitize._parts(bad)


def test_shards_parse_and_partition_the_cases():
    assert sanitize._shard("1/3") == (1, 3)
    for bad in ("2/2", "-1/2", "1", "a/b", "0/0"):
        with pytest.raises(argparse.ArgumentTypeError):
            sanitize._shard(bad)
    cases = list(range(7))
    shards = [sanitize.shard_cases(cases, (i, 3)) for i in range(3)]
    assert shards == [[0, 3, 6], [1, 4], [2, 5]]
    assert sanitize.shard_cases(cases, (0, 1)) == cases


def test_each_subset_has_its_own_log_name():
    assert sanitize._log_suffix(sanitize.PARTS, (0, 1)) == ""
    names = {sanitize._log_suffix(("backward",), (i, 2)) for i in range(2)}
    names.add(sanitize._log_suffix(("forward", "decode"), (0, 1)))
    assert names == {"-backward-0of2", "-backward-1of2", "-forward+decode"}


def test_bad_arguments_exit_2_naming_the_flag():
    res = subprocess.run([sys.executable, str(SCRIPT), "--shard", "3/2"], capture_output=True, text=True)
    assert res.returncode == 2 and "--shard" in res.stderr


def test_shard_needs_the_backward_alone():
    res = subprocess.run([sys.executable, str(SCRIPT), "--parts", "forward,backward", "--shard", "1/2"],
                         capture_output=True, text=True)
    assert res.returncode == 2 and "--parts backward" in res.stderr


FAKE_SANITIZER = """import sys
# compute-sanitizer --tool T ... python sanitize.py --run-cases ...: record the sanitized command
# and end as a clean run of every case would.
tool = sys.argv[sys.argv.index("--tool") + 1]
print("sanitizer argv:", " ".join(sys.argv[1:sys.argv.index("--run-cases")]))
print("child argv:", " ".join(sys.argv[sys.argv.index("--run-cases"):]))
print("sanitize: all cases ran")
print("========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)" if tool == "racecheck"
      else "========= ERROR SUMMARY: 0 errors")
"""


def _fake_sanitizer_env(tmp_path, body: str) -> dict:
    """An environment whose PATH finds a stand-in compute-sanitizer running `body` (Python)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "compute-sanitizer"
    fake.write_text(f"#!{sys.executable}\n" + body)
    fake.chmod(0o755)
    return {"PATH": f"{bindir}:/usr/bin:/bin"}


def _run_with_fake_sanitizer(tmp_path, *args):
    return subprocess.run([sys.executable, str(SCRIPT), "--log-dir", str(tmp_path / "logs"), *args],
                          capture_output=True, text=True, env=_fake_sanitizer_env(tmp_path, FAKE_SANITIZER),
                          timeout=60)


def test_the_sanitized_child_gets_the_subset_and_its_own_log(tmp_path):
    res = _run_with_fake_sanitizer(tmp_path, "--tool", "racecheck", "--parts", "backward", "--shard", "1/2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "sanitize: racecheck-backward-1of2: PASS" in res.stdout
    log = (tmp_path / "logs" / "sanitize-racecheck-backward-1of2.log").read_text()
    assert "child argv: --run-cases --parts backward --shard 1/2" in log


def test_all_cases_by_default_under_the_plain_log_names(tmp_path):
    res = _run_with_fake_sanitizer(tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    for tool in sanitize.TOOLS:
        assert f"sanitize: {tool}: PASS" in res.stdout
        log = (tmp_path / "logs" / f"sanitize-{tool}.log").read_text()
        assert "child argv: --run-cases --parts forward,decode,backward --shard 0/1" in log
        assert "--kernel-name" not in log
        # The chain-segments case in a process of its own, instrumenting only its kernels.
        assert f"sanitize: {tool}-chain-segments: PASS" in res.stdout
        log = (tmp_path / "logs" / f"sanitize-{tool}-chain-segments.log").read_text()
        assert "child argv: --run-cases --parts chain-segments --shard 0/1" in log
        assert "--kernel-name kns=chain_kernel --kernel-name kns=segment_scan_kernel" in log


def test_a_subset_with_the_segment_case_names_each_process_after_its_own_cases(tmp_path):
    res = _run_with_fake_sanitizer(tmp_path, "--tool", "racecheck", "--parts", "forward,decode,chain-segments")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "sanitize: racecheck-forward+decode: PASS" in res.stdout
    assert "sanitize: racecheck-chain-segments: PASS" in res.stdout
    log = (tmp_path / "logs" / "sanitize-racecheck-forward+decode.log").read_text()
    assert "child argv: --run-cases --parts forward,decode --shard 0/1" in log and "--kernel-name" not in log
    log = (tmp_path / "logs" / "sanitize-racecheck-chain-segments.log").read_text()
    assert "child argv: --run-cases --parts chain-segments --shard 0/1" in log


def test_a_sigterm_stops_the_tools_and_still_reports_each(tmp_path):
    env = _fake_sanitizer_env(tmp_path, "import time\ntime.sleep(60)\n")  # a tool that outlasts its caller
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--log-dir", str(tmp_path / "logs")],
                            stdout=subprocess.PIPE, text=True, env=env)
    time.sleep(2)
    proc.terminate()
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1, out
    for tool in sanitize.TOOLS:
        assert f"sanitize: {tool}: stopped by SIGTERM" in out and f"sanitize: {tool}: FAIL" in out, out


def test_run_cases_runs_the_parts_in_order_and_sums_their_failures(monkeypatch, capsys):
    import types

    calls = []
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    monkeypatch.setitem(sys.modules, "fwd_cases", types.SimpleNamespace(sm90_skip_reason=lambda: None))
    monkeypatch.setattr(sanitize, "run_forward_cases", lambda torch: calls.append("forward") or 1)
    monkeypatch.setattr(sanitize, "run_decode_cases", lambda torch: calls.append("decode") or 0)
    monkeypatch.setattr(sanitize, "run_backward_cases", lambda torch, shard: calls.append(("backward", shard)) or 2)
    monkeypatch.setattr(sanitize, "run_chain_segment_cases", lambda torch: calls.append("chain-segments") or 1)
    assert sanitize.run_cases() == 1
    assert calls == ["forward", "decode", ("backward", (0, 1)), "chain-segments"]
    assert "sanitize: 4 case(s) gave wrong results" in capsys.readouterr().out
    calls.clear()
    monkeypatch.setattr(sanitize, "run_forward_cases", lambda torch: calls.append("forward") or 0)
    monkeypatch.setattr(sanitize, "run_backward_cases", lambda torch, shard: calls.append(("backward", shard)) or 0)
    assert sanitize.run_cases(("decode", "backward"), (1, 2)) == 0
    assert calls == ["decode", ("backward", (1, 2))]
    assert sanitize.DONE_MARK in capsys.readouterr().out
