#!/usr/bin/env bash
# The whole test suite in one command (run it after `pip install .`):
#   C++: configure + build the library, GoogleTest suite and example, run ctest;
#   the install test (tests/install/run.sh) when present;
#   Python: pytest tests/python (GPU tests skip themselves, saying why, without an sm_90 GPU).
# Environment: FLASH_KDA_CUDA=ON|OFF (default ON: compiles the sm_90a kernels), BUILD_DIR
# (default build-test), CMAKE_BUILD_PARALLEL_LEVEL (build jobs), PYTHON (default python3).
# Ends with one line: "tests run: C++ N, Python M (S skipped), failed: F".
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build-test}
py=${PYTHON:-python3}
cd "$root"
# ctest resolves a relative --output-junit path against the build dir: keep every path absolute.
[[ $build == /* ]] || build=$root/$build

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DFLASH_KDA_CUDA="${FLASH_KDA_CUDA:-ON}" \
  -DFLASH_KDA_TESTS=ON -DFLASH_KDA_EXAMPLES=ON
cmake --build "$build"
status=0
ctest --test-dir "$build" --output-on-failure --output-junit "$build/junit-cpp.xml" || status=1

if [[ -f tests/install/run.sh ]]; then
  bash tests/install/run.sh || status=1
fi

if ! "$py" -c "import flash_kda" 2>/dev/null; then
  echo "scripts/test.sh: the flash_kda package is not installed; run 'pip install .' first" >&2
  exit 1
fi
# Run from outside the checkout so `import flash_kda` is the installed package.
"$py" -m pytest -ra --rootdir "$root" -c "$root/pyproject.toml" --junitxml "$build/junit-python.xml" \
  "$root/tests/python" || status=1

"$py" - "$build/junit-cpp.xml" "$build/junit-python.xml" <<'PY'
import sys
import xml.etree.ElementTree as ET

def counts(path):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return 0, 0, 0
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = sum(int(s.get("tests", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    return total, skipped, failed

cpp, py = counts(sys.argv[1]), counts(sys.argv[2])
print(f"tests run: C++ {cpp[0] - cpp[1]} ({cpp[1]} skipped), Python {py[0] - py[1]} ({py[1]} skipped), "
      f"failed: {cpp[2] + py[2]}")
PY
exit $status
