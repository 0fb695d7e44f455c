#!/usr/bin/env bash
# The whole test suite in one command, from a fresh clone:
#   scripts/test.sh
# It first obtains what is missing, from the registries, without touching what is installed:
#   - the flash_kda package: `pip install .` from this checkout unless the installed one was
#     installed from this checkout after its sources last changed;
#   - CMake >= 3.24: `pip install cmake` when the one on PATH is missing or older;
#   - pytest and matplotlib (the benchmark chart's tests): `pip install` when they do not import;
#   - CUTLASS headers for the kernel build: cmake/cutlass.cmake (pip download of the
#     nvidia-cutlass wheel, headers unpacked into the build directory, nothing installed);
#   - GoogleTest: cmake/googletest.cmake (libgtest-dev, or `apt-get download` of it unpacked
#     into the build directory).
# Then: C++ configure + build of the library, GoogleTest suite and examples, ctest; the install
# test (tests/install/run.sh); pytest tests/python. GPU tests skip themselves, saying why,
# without an sm_90 GPU. What cannot be obtained is skipped and named in a "skipped:" line.
# Environment: FLASH_KDA_CUDA=ON|OFF (default ON: compiles the sm_90a kernels), BUILD_DIR
# (default build-test), CMAKE_BUILD_PARALLEL_LEVEL (build jobs), PYTHON (default python3),
# CUTLASS_INCLUDE_DIR (headers to use instead of fetching them).
# Ends with one line: "tests: C++ N ran, S skipped; Python M ran, S skipped; failed: F" (ran =
# passed + failed). Exit status 0 when nothing failed.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build-test}
py=${PYTHON:-python3}
cd "$root"
# ctest resolves a relative --output-junit path against the build dir: keep every path absolute.
[[ $build == /* ]] || build=$root/$build
skipped=()  # "what: why" for each part that could not be obtained
# The CUDA toolkit's usual place, for a shell that does not have it on PATH.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

imports() { "$py" -c "import $1" >/dev/null 2>&1; }

# pip_get MODULE REQUIREMENT: installs REQUIREMENT when MODULE does not import; on failure
# records why and returns 1.
pip_get() {
  imports "$1" && return 0
  echo "scripts/test.sh: $1 is missing; pip install $2"
  local log
  if ! log=$("$py" -m pip install -q --disable-pip-version-check "$2" 2>&1) || ! imports "$1"; then
    skipped+=("$1: pip install $2 failed: $(tail -n 1 <<<"$log")")
    return 1
  fi
}

# Why the installed flash_kda cannot be the one under test (empty when it can): not installed,
# installed from elsewhere (pip's direct_url.json), or older than this checkout's sources.
install_problem=$("$py" - "$root" <<'PY'
import importlib.metadata as md, json, pathlib, sys
root = pathlib.Path(sys.argv[1]).resolve()
try:
    dist = md.distribution("flash-kda")
except md.PackageNotFoundError:
    sys.exit(print("it is not installed"))
url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
if url.rstrip("/") != root.as_uri():
    sys.exit(print(f"the installed one comes from {url or 'a package index'}"))
record = next((f for f in dist.files or [] if f.name == "RECORD"), None)
installed = pathlib.Path(dist.locate_file(record)).stat().st_mtime if record else 0.0
sources = [p for d in ("src", "include", "python", "cmake") for p in (root / d).rglob("*") if p.is_file()]
sources += [root / "CMakeLists.txt", root / "pyproject.toml"]
newest = max(p.stat().st_mtime for p in sources if p.exists())
if newest > installed:
    print("the installed one is older than this checkout's sources")
PY
)
if [[ -n $install_problem ]]; then
  echo "scripts/test.sh: pip install $root (compiles the package): $install_problem"
  if ! "$py" -m pip install --disable-pip-version-check "$root"; then
    echo "scripts/test.sh: 'pip install $root' failed; nothing can be tested without the package" >&2
    exit 1
  fi
fi
# CMake >= 3.24 (with ctest): the one on PATH, else the cmake package from PyPI.
# (The version is read from `cmake --version`: `cmake -P /dev/stdin` fails where bash passes a
# here-string through a pipe, which CMake cannot seek. The pip package is imported from / so
# that the repository's own cmake/ folder cannot stand in for it.)
cmake_version=$(cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9.]*\).*/\1/p')
if [[ -z $cmake_version || $(printf '%s\n' 3.24 "$cmake_version" | sort -V | head -n 1) != 3.24 ]]; then
  if ! (cd / && "$py" -c "import cmake; cmake.CMAKE_BIN_DIR") >/dev/null 2>&1 &&
    ! "$py" -m pip install -q --disable-pip-version-check "cmake>=3.24"; then
    echo "scripts/test.sh: no CMake >= 3.24 on PATH and pip install cmake failed" >&2
    exit 1
  fi
  PATH=$(cd / && "$py" -c "import cmake; print(cmake.CMAKE_BIN_DIR)"):$PATH
fi
have_pytest=1
pip_get pytest pytest || have_pytest=0
pip_get matplotlib matplotlib || true  # without it the chart tests skip, saying so

# Counts come from these files: never report a previous run's.
rm -f "$build/junit-cpp.xml" "$build/junit-python.xml"

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DFLASH_KDA_CUDA="${FLASH_KDA_CUDA:-ON}" \
  -DFLASH_KDA_TESTS=ON -DFLASH_KDA_EXAMPLES=ON
cmake --build "$build"
status=0
ctest --test-dir "$build" --output-on-failure --output-junit "$build/junit-cpp.xml" || status=1
if [[ -f $build/cpp-suite-skipped.txt ]]; then
  skipped+=("C++ GoogleTest suite: $(<"$build/cpp-suite-skipped.txt")")
fi

bash tests/install/run.sh || status=1

if ((have_pytest)); then
  # The in-tree package lives in python/, so `import flash_kda` here is the installed one.
  "$py" -m pytest -ra --rootdir "$root" -c "$root/pyproject.toml" --junitxml "$build/junit-python.xml" \
    "$root/tests/python" || status=1
fi

for s in "${skipped[@]}"; do echo "skipped: $s"; done
"$py" - "$build/junit-cpp.xml" "$build/junit-python.xml" "$have_pytest" <<'PY'
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

def cpp_skip_reasons(path):
    """(test, reason) of each skipped ctest test: the example's "SKIP: ..." line or the line
    after GoogleTest's "Skipped"."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return []
    found = []
    for case in root.iter("testcase"):
        if case.find("skipped") is None:
            continue
        lines = (case.findtext("system-out") or "").splitlines()
        reason = next((l[len("SKIP: "):] for l in lines if l.startswith("SKIP: ")), None)
        if reason is None:
            after = [lines[i + 1] for i, l in enumerate(lines[:-1]) if l.endswith(": Skipped")]
            reason = after[0].strip() if after else case.find("skipped").get("message", "")
        found.append((case.get("name"), reason))
    return found

for name, reason in cpp_skip_reasons(sys.argv[1]):
    print(f"C++ test skipped: {name}: {reason}")
cpp, py = counts(sys.argv[1]), counts(sys.argv[2])
py_wanted = sys.argv[3] == "1"
fmt = lambda c: "did not run" if c is None else f"{c[0] - c[1]} ran, {c[1]} skipped"
failed = (1 if cpp is None else cpp[2]) + (0 if py is None and not py_wanted else 1 if py is None else py[2])
py_text = fmt(py) if py_wanted else "not run (pytest unavailable, see skipped:)"
print(f"tests: C++ {fmt(cpp)}; Python {py_text}; failed: {failed}")
PY
exit $status
