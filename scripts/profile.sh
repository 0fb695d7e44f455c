#!/usr/bin/env bash
# Profiles the forward's kernels with Nsight Compute on a GPU machine (run after `pip install .`):
# per kernel the warp-state (stall reason) and source-counter sections, and the SASS of the
# recurrence with its per-instruction stall samples, as text small enough to read back.
#   scripts/profile.sh [--T 1024 --heads 4 ...]   (arguments go to scripts/profile_case.py)
# With --train (passed on to profile_case.py) it profiles the last of the training steps instead:
# the forwards' recurrences (the recompute's, with intermediate states, among them) and every
# backward kernel, with the SASS of the chain, the chunk gradients and the record kernel too.
# Output: $OUT (or ./profile-out)/{details.txt,<kernel>-sass.csv} and their summaries
# (scripts/profile_summary.py: stall reasons, opcodes, hottest instructions), printed last.
# ncu runs with --clock-control none: leave the card's clocks as they are.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
dest=${OUT:-profile-out}
mkdir -p "$dest"
PY=${PYTHON:-python3}
NCU=${NCU:-ncu}
rep=$(mktemp -d)/fwd
kernels='prepare_kernel|recurrence_kernel|segment_scan_kernel'
sass=(recurrence prepare)
if [[ " $* " == *" --train "* ]]; then
  kernels='recurrence_kernel|chain_kernel|chunk_grad_kernel|records_kernel|finish_keys_kernel|finish_gate_kernel'
  sass=(recurrence chain chunk_grad records)
fi
# The last of the calls is profiled (profile_case.py brackets it for --profile-from-start off:
# warm caches, no first-launch setup).
"$NCU" --clock-control none --set full --import-source yes --profile-from-start off \
  --kernel-name regex:"$kernels" -o "$rep" -f \
  "$PY" scripts/profile_case.py --calls 2 "$@" >"$dest/ncu.log" 2>&1 || { tail -20 "$dest/ncu.log"; exit 1; }
"$NCU" -i "$rep.ncu-rep" --page details --section WarpStateStats --section SourceCounters \
  --section SpeedOfLight --section Occupancy --section LaunchStats >"$dest/details.txt" 2>&1
for k in "${sass[@]}"; do  # the first launch of each
  # With --train, the recurrence's page is the recompute's: the instantiation with intermediate
  # states, whose demangled name ends in (bool)1.
  filter=(--kernel-name regex:"${k}_kernel")
  if [[ " $* " == *" --train "* && $k == recurrence ]]; then
    filter=(--kernel-name-base demangled --kernel-name 'regex:recurrence_kernel<.*\(bool\)1>')
  fi
  "$NCU" -i "$rep.ncu-rep" --page source --print-source sass --csv "${filter[@]}" \
    --launch-count 1 >"$dest/$k-sass.csv" 2>&1 || echo "profile: no source page for $k (see $dest/$k-sass.csv)"
done
grep -E "^  .*kernel.*Context [0-9]|Duration|Warp Cycles Per Issued|Stall|Achieved Occupancy|Registers" "$dest/details.txt" | head -80
for k in "${sass[@]}"; do  # stall reasons, opcodes and hottest instructions of each kernel
  "$PY" scripts/profile_summary.py "$dest/$k-sass.csv" --top 12 >"$dest/$k-summary.txt" 2>&1 && cat "$dest/$k-summary.txt"
done
