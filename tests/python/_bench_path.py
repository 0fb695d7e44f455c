"""Loads the in-tree benchmark (python/flash_kda/bench) for its CPU tests.

In the pytest process the in-tree bench package is imported under the alias
`flash_kda_bench` (its modules import each other relatively and import `flash_kda` only for
GPU work), so the `flash_kda` module other tests use is left untouched.

`use_in_tree_flash_kda()` is for child processes only: it puts python/ first on sys.path and,
when that flash_kda cannot be imported (its compiled _core is not built in python/),
registers a stand-in `flash_kda` package (cuda_available() False) whose __path__ is
python/flash_kda, so `runpy.run_module("flash_kda.bench")` runs the in-tree CLI.
"""

import importlib
import importlib.util
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYTHON_DIR = REPO / "python"
BENCH_DIR = PYTHON_DIR / "flash_kda" / "bench"
ALIAS = "flash_kda_bench"


def load_bench():
    """The in-tree bench package as module `flash_kda_bench` (imported once)."""
    if ALIAS in sys.modules:
        return sys.modules[ALIAS]
    spec = importlib.util.spec_from_file_location(ALIAS, BENCH_DIR / "__init__.py",
                                                  submodule_search_locations=[str(BENCH_DIR)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[ALIAS] = module
    spec.loader.exec_module(module)
    return module


def use_in_tree_flash_kda() -> None:
    """Child processes only: make `flash_kda` the in-tree package (stand-in if it cannot load)."""
    sys.path.insert(0, str(PYTHON_DIR))
    try:
        importlib.import_module("flash_kda")
    except ImportError:
        for name in [m for m in sys.modules if m == "flash_kda" or m.startswith("flash_kda.")]:
            del sys.modules[name]
        stub = types.ModuleType("flash_kda")
        stub.__path__ = [str(PYTHON_DIR / "flash_kda")]
        stub.__version__ = "0+cpu-test-stub"
        stub.cuda_available = lambda: False
        sys.modules["flash_kda"] = stub


load_bench()
