"""Makes the in-tree flash_kda.bench importable for the CPU tests of the benchmark CLI.

Puts python/ first on sys.path. When the in-tree flash_kda package cannot be imported
(its compiled _core is built elsewhere or not at all), a stand-in `flash_kda` package module
whose __path__ is python/flash_kda is registered instead, with cuda_available() False, so
flash_kda.bench (which needs no extension to parse flags or write reports) still imports.
"""

import importlib
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYTHON_DIR = REPO / "python"
PACKAGE_DIR = PYTHON_DIR / "flash_kda"
if str(PYTHON_DIR) not in sys.path:
    sys.path.insert(0, str(PYTHON_DIR))

STUBBED = False
try:
    importlib.import_module("flash_kda")
except ImportError:
    for name in [m for m in sys.modules if m == "flash_kda" or m.startswith("flash_kda.")]:
        del sys.modules[name]
    stub = types.ModuleType("flash_kda")
    stub.__path__ = [str(PACKAGE_DIR)]
    stub.__version__ = "0+cpu-test-stub"
    stub.cuda_available = lambda: False

    class Error(ValueError):
        """Stand-in for flash_kda.Error."""

    stub.Error = Error
    sys.modules["flash_kda"] = stub
    STUBBED = True
