#!/usr/bin/env bash
# Profiles the forward's kernels with Nsight Compute on a GPU machine (run after `pip install .`):
# per kernel the warp-state (stall reason) and source-counter sections, and the SASS of the
# recurrence with its per-instruction stall samples, as text small enough to read back.
#   scripts/profile.sh [--T 1024 --heads 4 ...]   (arguments go to scripts/profile_case.py)
# Output: $OUT (or ./profile-out)/{details.txt,recurrence-sass.csv,prepare-sass.csv} and their
# summaries (scripts/profile_summary.py: stall reasons, opcodes, hottest instructions), printed last.
# ncu runs with --clock-control none: leave the card's clocks as they are.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
dest=${OUT:-profile-out}
mkdir -p "$dest"
PY=${PYTHON:-python3}
NCU=${NCU:-ncu}
rep=$(mktemp -d)/fwd
# The last of the calls is profiled (warm caches, no first-launch setup).
"$NCU" --clock-control none --set full --import-source yes --launch-skip 2 --launch-count 2 \
  --kernel-name regex:'prepare_kernel|recurrence_kernel|segment_scan_kernel' -o "$rep" -f \
  "$PY" scripts/profile_case.py --calls 2 "$@" >"$dest/ncu.log" 2>&1 || { tail -20 "$dest/ncu.log"; exit 1; }
"$NCU" -i "$rep.ncu-rep" --page details --section WarpStateStats --section SourceCounters \
  --section SpeedOfLight --section Occupancy --section LaunchStats >"$dest/details.txt" 2>&1
for k in recurrence prepare; do
  "$NCU" -i "$rep.ncu-rep" --page source --print-source sass --csv --kernel-name regex:"${k}_kernel" \
    >"$dest/$k-sass.csv" 2>&1 || echo "profile: no source page for $k (see $dest/$k-sass.csv)"
done
grep -E "^  [a-z_:]+kernel|Duration|Warp Cycles Per Issued|Stall|Achieved Occupancy|Registers" "$dest/details.txt" | head -60
for k in recurrence prepare; do  # stall reasons, opcodes and hottest instructions of each kernel
  "$PY" scripts/profile_summary.py "$dest/$k-sass.csv" --top 12 >"$dest/$k-summary.txt" 2>&1 && cat "$dest/$k-summary.txt"
done
