"""Without a usable GPU the benchmark prints one sentence and exits with code 2 (CPU only)."""

import os
import subprocess
import sys
import types

import pytest

import _bench_path
from flash_kda_bench import environment
from flash_kda_bench.main import main as bench_main

HERE = os.path.dirname(os.path.abspath(__file__))


def _env_without_cuda(pythonpath):
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONPATH"] = os.pathsep.join([pythonpath, env.get("PYTHONPATH", "")])
    return env


def _assert_one_sentence(proc):
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(environment.NEED) and lines[0].endswith(".")
    assert proc.stdout == ""


def test_module_run_without_cuda_exits_2():
    # runpy executes flash_kda.bench as __main__, as `python -m` does, after _bench_path makes
    # the in-tree package importable even when its extension is not built here.
    code = "import _bench_path, runpy; _bench_path.use_in_tree_flash_kda(); runpy.run_module('flash_kda.bench', run_name='__main__', alter_sys=True)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=HERE, env=_env_without_cuda(HERE),
                          capture_output=True, text=True, timeout=300)
    _assert_one_sentence(proc)


def test_python_dash_m_without_cuda_exits_2():
    env = _env_without_cuda(str(_bench_path.PYTHON_DIR))
    probe = subprocess.run([sys.executable, "-c", "import flash_kda"], env=env, capture_output=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip("the in-tree flash_kda package does not import here (its _core extension is not built in python/)")
    proc = subprocess.run([sys.executable, "-m", "flash_kda.bench", "--cases", "h4_fixed_1024"], env=env,
                          capture_output=True, text=True, timeout=300)
    _assert_one_sentence(proc)


def test_help_needs_no_gpu():
    proc = subprocess.run([sys.executable, "-c", "import _bench_path, runpy; _bench_path.use_in_tree_flash_kda(); "
                           "runpy.run_module('flash_kda.bench', run_name='__main__', alter_sys=True)", "--help"],
                          cwd=HERE, env=_env_without_cuda(HERE), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0
    for flag in ("--T", "--heads", "--seqlens", "--batch", "--state", "--cases", "--iters", "--warmup",
                 "--no-fla", "--no-check", "--out-dir", "--markdown", "--write-record", "--layer"):
        assert flag in proc.stdout, flag


def _fake_torch(available=True, capability=(9, 0)):
    cuda = types.SimpleNamespace(is_available=lambda: available, get_device_capability=lambda: capability,
                                 get_device_name=lambda: "Fake GPU")
    return types.SimpleNamespace(cuda=cuda)


def test_messages_name_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(available=False))
    assert environment.unmet_requirement().endswith("no CUDA device is visible here.")
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(capability=(8, 0)))
    assert environment.unmet_requirement().endswith("the visible GPU is Fake GPU (sm_80).")
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())
    fk = types.SimpleNamespace(cuda_available=lambda: False)
    monkeypatch.setitem(sys.modules, "flash_kda", fk)
    assert "flash_kda.cuda_available() is False" in environment.unmet_requirement()
    fk.cuda_available = lambda: True
    assert environment.unmet_requirement() is None


def test_main_returns_2_before_touching_the_gpu(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(environment, "unmet_requirement", lambda: "needs a GPU; none here.")
    assert bench_main(["--out-dir", str(tmp_path / "o")]) == 2
    captured = capsys.readouterr()
    assert captured.err == "needs a GPU; none here.\n" and captured.out == ""
    assert not (tmp_path / "o").exists()
