"""Package-level facts: version, cuda_available, importing without PyTorch."""
from __future__ import annotations

import importlib.metadata
import pathlib
import re
import subprocess
import sys

import flash_kda

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_version_matches_the_cpp_header_and_the_distribution():
    header = (ROOT / "include" / "flash_kda" / "version.h").read_text()
    assert flash_kda.__version__ == re.search(r'kVersion = "([^"]+)"', header).group(1)
    assert importlib.metadata.version("flash-kda") == flash_kda.__version__


def test_cuda_available_is_a_bool_and_false_without_a_cuda_device():
    available = flash_kda.cuda_available()
    assert isinstance(available, bool)
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = None  # unknown without torch: only the type is checked
    if has_cuda is False:
        assert available is False


def test_package_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None; import flash_kda; "
            "print(flash_kda.__version__, flash_kda.cuda_available())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == flash_kda.__version__
