"""scripts/sanitize.py's command line on the CPU: case sets, shards and their log names (the
sanitized runs themselves need compute-sanitizer and an sm_90 GPU: scripts/gpu-check.sh)."""
import argparse
import importlib.util
import subprocess
import sys
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
