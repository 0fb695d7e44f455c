#!/usr/bin/env bash
# The whole test suite in one command (run it after `pip install .`):
#   C++: configure + build the library, GoogleTest suite and example, run ctest;
#   the install test (tests/install/run.sh) when present;
#   Python: pytest tests/python (GPU tests skip themselves, saying why, without an sm_90 GPU).
# Environment: FLASH_KDA_CUDA=ON|OFF (default ON: compiles the sm_90a kernels), BUILD_DIR
# (default build-test), CMAKE_BUILD_PARALLEL_LEVEL (build jobs), PYTHON (default python3).
# Prerequisites beyond `pip install .`: pytest, and CUTLASS headers for the kernel build
# (`pip install --no-deps nvidia-cutlass`, or CUTLASS_INCLUDE_DIR, or FLASH_KDA_CUDA=OFF).
# Ends with one line: "tests: C++ N ran, S skipped; Python M ran, S skipped; failed: F" (ran =
# passed + failed).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build-test}
py=${PYTHON:-python3}
cd "$root"
# ctest resolves a relative --output-junit path against the build dir: keep every path absolute.
[[ $build == /* ]] || build=$root/$build

# Check what the run needs before spending minutes on the build.
if ! "$py" -c "import flash_kda" 2>/dev/null; then
  echo "scripts/test.sh: the flash_kda package is not installed; run 'pip install .' first" >&2
  exit 1
fi
if ! err=$("$py" -c "import pytest" 2>&1); then
  echo "scripts/test.sh: pytest does not import for $py (run '$py -m pip install pytest'): ${err##*$'\n'}" >&2
  exit 1
fi
# Counts come from these files: never report a previous run's.
rm -f "$build/junit-cpp.xml" "$build/junit-python.xml"

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DFLASH_KDA_CUDA="${FLASH_KDA_CUDA:-ON}" \
  -DFLASH_KDA_TESTS=ON -DFLASH_KDA_EXAMPLES=ON
cmake --build "$build"
status=0
ctest --test-dir "$build" --output-on-failure --output-junit "$build/junit-cpp.xml" || status=1

if [[ -f tests/install/run.sh ]]; then
  bash tests/install/run.sh || status=1
fi

# The in-tree package lives in python/, so `import flash_kda` here is the installed one.
"$py" -m pytest -ra --rootdir "$root" -c "$root/pyproject.toml" --junitxml "$build/junit-python.xml" \
  "$root/tests/python" || status=1

"$py" - "$build/junit-cpp.xml" "$build/junit-python.xml" <<'PY'
import sys
import xml.etree.ElementTree as ET

def counts(path):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None  # the suite never got to write its report: a failure, not zero tests
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = sum(int(s.get("tests", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    return total, skipped, failed

cpp, py = counts(sys.argv[1]), counts(sys.argv[2])
fmt = lambda c: "did not run" if c is None else f"{c[0] - c[1]} ran, {c[1]} skipped"
failed = sum(1 if c is None else c[2] for c in (cpp, py))
print(f"tests: C++ {fmt(cpp)}; Python {fmt(py)}; failed: {failed}")
PY
exit $status
