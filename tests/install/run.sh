#!/usr/bin/env bash
# Install check: configure, build and `cmake --install` flash_kda (CPU only) into a temporary
# prefix, then build examples/cpp standalone against it with find_package(flash_kda) and run it.
# Usage: tests/install/run.sh        (exit 0 when the installed package works)
# Parallelism follows CMAKE_BUILD_PARALLEL_LEVEL (default 1). Set FLASH_KDA_INSTALL_KEEP=1 to
# keep the temporary directory for inspection.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/flash_kda_install.XXXXXX")"
if [[ "${FLASH_KDA_INSTALL_KEEP:-0}" != 1 ]]; then trap 'rm -rf "$work"' EXIT; fi
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-1}"
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi

echo "== configure + build flash_kda (FLASH_KDA_CUDA=OFF) in $work/build"
cmake -S "$repo" -B "$work/build" "${generator[@]}" -DFLASH_KDA_CUDA=OFF -DFLASH_KDA_TESTS=OFF \
  -DFLASH_KDA_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/build"

echo "== install to $work/prefix"
cmake --install "$work/build" --prefix "$work/prefix" >/dev/null
for f in include/flash_kda/flash_kda.h include/flash_kda/forward.h; do
  [[ -f "$work/prefix/$f" ]] || { echo "FAIL: $f not installed"; exit 1; }
done
config="$(find "$work/prefix" -name flash_kdaConfig.cmake | head -n1)"
[[ -n "$config" ]] || { echo "FAIL: flash_kdaConfig.cmake not installed"; exit 1; }
ls "$work/prefix"/lib*/libflash_kda.* >/dev/null || { echo "FAIL: library not installed"; exit 1; }

echo "== build examples/cpp against the installed package (find_package)"
cmake -S "$repo/examples/cpp" -B "$work/example" "${generator[@]}" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/example"

echo "== run the example"
output="$("$work/example/flash_kda_example")"
echo "$output"
# The example prints "out norm: <x>"; a working reference gives a finite, positive norm.
norm="$(sed -n 's/^out norm: //p' <<<"$output")"
python3 - "$norm" <<'PY'
import math, sys
x = float(sys.argv[1])
if not (math.isfinite(x) and x > 0):
    sys.exit(f"FAIL: out norm {x} is not finite and positive")
PY
echo "install check: OK"
