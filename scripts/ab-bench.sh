#!/usr/bin/env bash
# A/B timing of two revisions of flash_kda in one GPU session: builds each revision's package
# into its own folder and runs `python -m flash_kda.bench` (flash_kda only: no fla, no check,
# same seed, so the same inputs) under each, then prints both tables. For "before a change,
# write down what it should move; after, check" without two device calls.
#   scripts/ab-bench.sh REV_A REV_B [bench args, e.g. --cases h4_fixed_1024,h32_fixed_8192]
# REV_A/REV_B: a source folder (e.g. an exported checkout carried to a machine without .git),
# or anything `git worktree add` accepts (a branch, a commit, HEAD). Needs nvcc and
# CUTLASS headers as for `pip install .` (CUTLASS_INCLUDE_DIR, default .cutlass/include).
# AB_ROUNDS=n (default 1) runs A, B, A, B, ... n times each, so that the spread between two runs
# of the same build is measured in the same session as the difference between the builds.
# The two builds run at once, each on half the cores. Each build runs its own benchmark, so a bench
# flag must exist in both (--kernels, for the per-kernel table, does from commit c3d1ee5 on).
# Output: the rounds' results.{json,md} under {A,B}[-round]/, and with AB_ROUNDS >= 2
# compare.md (scripts/ab_compare.py: every case, training step and decode point, B against A),
# in ./ab-out; under the device tool ($OUT set) the rounds go to $OUT/ab-results.tgz and
# compare.md beside it, so that what comes back stays two files however many rounds ran. The
# tables also go to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
(($# >= 2)) || { echo "usage: $0 REV_A REV_B [bench args]" >&2; exit 2; }
# shellcheck disable=SC2034  # A and B are read indirectly below, as ${!side}
A=$1 B=$2
shift 2
tmp=$(mktemp -d)
dest=ab-out
[[ -n ${OUT:-} ]] && dest=$tmp/ab
export CUTLASS_INCLUDE_DIR=${CUTLASS_INCLUDE_DIR:-$PWD/.cutlass/include}
jobs=$(nproc)
export PIP_BREAK_SYSTEM_PACKAGES=1 CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(((jobs + 1) / 2))}
pids=()
# On any exit: a build still running is stopped before its folder goes.
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; git worktree remove --force "$tmp/A" 2>/dev/null;
  git worktree remove --force "$tmp/B" 2>/dev/null; rm -rf "$tmp"' EXIT
# Earlier rounds in ./ab-out would enter this run's comparison.
rm -rf "$dest"/A "$dest"/B "$dest"/A-* "$dest"/B-* "$dest/compare.md"
for side in A B; do
  rev=${!side} src=$tmp/$side
  if [[ -d $rev ]]; then src=$rev; else git worktree add -q --detach "$src" "$rev"; fi
  python3 -m pip install -q --no-build-isolation --no-deps --target "$tmp/site-$side" "$src" \
    >"$tmp/build-$side.log" 2>&1 &
  pids+=($!)
done
for i in 0 1; do
  side=$([[ $i == 0 ]] && echo A || echo B)
  wait "${pids[$i]}" || { echo "build of $side failed:"; tail -30 "$tmp/build-$side.log"; exit 1; }
done
status=0
rounds=${AB_ROUNDS:-1}
for ((round = 1; round <= rounds; round++)); do
  for side in A B; do
    out=$dest/$side
    ((rounds > 1)) && out=$dest/$side-$round
    mkdir -p "$out"
    echo "== $side (round $round of $rounds): ${!side} ($(git rev-parse --short "${!side}" 2>/dev/null || echo folder))"
    PYTHONPATH="$tmp/site-$side${PYTHONPATH:+:$PYTHONPATH}" python3 -m flash_kda.bench --no-fla --no-check \
      --no-plot --out-dir "$out" "$@" || status=$?
  done
done
if ((rounds > 1)); then
  python3 scripts/ab_compare.py "$dest" | tee "$dest/compare.md" || true
fi
if [[ -n ${OUT:-} ]]; then
  tar -czf "$OUT/ab-results.tgz" -C "$dest" .
  [[ -f $dest/compare.md ]] && cp "$dest/compare.md" "$OUT/"
fi
exit "$status"
