#!/usr/bin/env bash
# Whole check of flash_kda on an offline sm_90 GPU machine, in about 9 minutes on 16 cores:
#   1. installs the carried wheels (.whl/*.whl: fla) into /tmp/site, no registry needed;
#   2. builds and installs the package (pip, scikit-build-core, CUTLASS from .cutlass/include or
#      $CUTLASS_INCLUDE_DIR) while the C++ GoogleTest suite builds alongside (build-gpucheck/);
#   3. runs ctest, scripts/sanitize.py (compute-sanitizer memcheck + racecheck), the GPU forward
#      suite (tests/python/test_fwd_*.py, -n with pytest-xdist) while scripts/warm_fla.py compiles
#      fla's Triton kernels for the benchmark's shapes on the other cores, then
#      `python -m flash_kda.bench` alone on the GPU, the rest of the pytest suite, the backward's
#      gradient grid (tests/python/test_backward_grid.py, its own step) and the
#      large_memory test alone;
#   4. prints the accuracy tables (flash_kda.fwd's grid, accuracy.md; flash_kda.chunk_kda's,
#      chunk-accuracy.md) and, last, a summary table (passed/failed/skipped per suite,
#      sanitizer result, benchmark headline).
# Logs go to a temporary directory; when $OUT is set (the device tool), what comes back is kept
# to at most 7 files there (the tool returns 8): gpu-check-logs.tgz (every log and junit XML),
# accuracy.md, chunk-accuracy.md, the benchmark's results.json with results.md and chart.png
# (BENCHMARK_H200.md and .png in their place when GPU_CHECK_BENCH_ARGS=--write-record wrote
# them: the same table and chart), and triton-autotune.tgz (fla's autotune choices; unpack it at
# the repository root and carry .triton-cache/ next time to skip the tuning).
# Exit status: 0 when every step passed, 1 otherwise.
#
# Knobs (environment): GPU_CHECK_STEPS (a comma list of the steps to run, e.g.
# ctest,sanitize,sanitize-racecheck-forward,pytest-gpu for one device call and
# pytest-rest,pytest-backward,pytest-gpu-large
# for the next: the whole suite does not fit one 10-minute call), GPU_CHECK_BUDGET_S (whole-run deadline, default 575), GPU_CHECK_SKIP_BUILD=1
# (reuse the installed package and build-gpucheck/), GPU_CHECK_PYTEST_ARGS (extra pytest args),
# GPU_CHECK_SKIP_BENCH=1, GPU_CHECK_SKIP_SANITIZE=1, GPU_CHECK_SKIP_TESTS=1 (no pytest steps: a
# benchmark-only call), GPU_CHECK_BENCH_ARGS (e.g. --write-record), GPU_CHECK_PARALLEL=1 (the
# whole suite in one call: ctest, both sanitizers and pytest at once, no benchmark; step 3 below),
# GPU_CHECK_PYTEST_ITEMS=FILE (with GPU_CHECK_PARALLEL=1: pytest runs only the node ids in FILE,
# e.g. the pytest-unfinished.txt that a run cut at its limit leaves in its logs),
# GPU_CHECK_CTEST_ALL=1 (ctest runs the kernels' CPU models too, which CI runs anyway),
# GPU_CHECK_FLA_WARM=1 (compile fla's kernels ahead even with autotune choices in the cache).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
LOG=$(mktemp -d /tmp/gpu-check.XXXXXX)
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$ROOT/.triton-cache}
mkdir -p "$TRITON_CACHE_DIR"
# fla's autotune choices of an earlier H200 run (scripts/fla-autotune-h200.tgz; docs/testing.md
# says which shapes), when the cache holds none: the benchmark then compiles only the chosen
# configurations instead of timing ~100 a kernel (minutes on a fresh machine); what it lacks,
# it tunes. Another fla, Triton or CUDA toolkit keys its cache differently and ignores them.
if [[ -f $ROOT/scripts/fla-autotune-h200.tgz &&
  -z $(find "$TRITON_CACHE_DIR" -name '*.autotune.json' -print -quit 2>/dev/null) ]]; then
  tar xzf "$ROOT/scripts/fla-autotune-h200.tgz" -C "$TRITON_CACHE_DIR" --strip-components=1
fi
JOBS=$(nproc)
BUDGET=${GPU_CHECK_BUDGET_S:-575}
export FLASH_KDA_REPORT_DIR=$LOG FLASH_KDA_REQUIRE_FLA=1
export PIP_BREAK_SYSTEM_PACKAGES=1  # a GPU image's system Python may be marked externally managed
export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS
export CUTLASS_INCLUDE_DIR=${CUTLASS_INCLUDE_DIR:-$ROOT/.cutlass/include}
PY=${PYTHON:-python3}
# One seed for every pytest process and worker of the run (tests/python/fwd_cases.py
# base_seed), printed here and in the summary: a step cut at its limit never prints its failure
# messages, and the seed is what replays a failed grid point (FLASH_KDA_TEST_SEED=<seed>).
export FLASH_KDA_TEST_SEED=${FLASH_KDA_TEST_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
echo "gpu-check: logs in $LOG, $JOBS cores, budget ${BUDGET}s, test seed $FLASH_KDA_TEST_SEED"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$LOG/gpu.txt"

declare -A STATUS SECS
ORDER=()
skip_step() { ORDER+=("$1"); STATUS[$1]="skipped: $2"; SECS[$1]=0; }
# run_step NAME CAP_SECONDS CMD...: runs CMD under a timeout (the smaller of CAP and what is left
# of the budget, keeping 20 s for the summary), logs to $LOG/NAME.log, records status and time.
# A step GPU_CHECK_STEPS leaves out is recorded as skipped (the wheels and the package build
# always run; the C++ build runs when ctest does).
run_step() {
  local name=$1 cap=$2; shift 2
  if [[ -n ${GPU_CHECK_STEPS:-} && ",$GPU_CHECK_STEPS," != *",$name,"* ]] &&
    [[ $name != wheels && $name != build ]]; then
    skip_step "$name" "not in GPU_CHECK_STEPS"; return 0
  fi
  local left=$((BUDGET - SECONDS - 20))
  local limit=$((cap < left ? cap : left))
  ORDER+=("$name")
  if ((limit < 10)); then
    STATUS[$name]="not run (out of time)"; SECS[$name]=0; return 1
  fi
  local t0=$SECONDS rc
  echo "gpu-check: == $name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" "$@" >"$LOG/$name.log" 2>&1
  rc=$?
  # pytest-xdist's workers can outlive a pytest cut at its limit and keep the GPU busy under
  # the steps after it (a profile and a benchmark measured 4x slow so). Only a pytest step's
  # cut kills them: every pytest one after another, or with GPU_CHECK_PARALLEL=1 (two pytest
  # steps at once) only this step's controller, by its own junit path (timeout signals the
  # step's process group, its workers among them).
  if ((rc == 124 || rc == 137)) && [[ " $* " == *" -m pytest "* ]]; then
    if [[ ${GPU_CHECK_PARALLEL:-0} == 1 ]]; then pkill -KILL -f -- "--junitxml=$LOG/$name.xml" 2>/dev/null
    else pkill -KILL -f -- "-m pytest" 2>/dev/null; fi
    sleep 1
  fi
  SECS[$name]=$((SECONDS - t0))
  if ((rc == 0)); then STATUS[$name]=pass
  elif ((rc == 124 || rc == 137)); then STATUS[$name]="timeout (${limit}s)"
  else STATUS[$name]="FAIL (exit $rc)"; fi
  echo "gpu-check:    $name: ${STATUS[$name]} in ${SECS[$name]}s"
  if ((rc != 0)); then tail -n 25 "$LOG/$name.log"; fi
  return $rc
}

# 1. Carried wheels (fla for the accuracy comparison and the dispatch test).
run_step wheels 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}

# 2. Package build (foreground) and C++ test build (background) share the cores: each is mostly
#    a handful of long nvcc compiles.
# shellcheck disable=SC2317  # run through `bash -c build_cpp` below
build_cpp() {
  cmake -S "$ROOT" -B "$ROOT/build-gpucheck" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DFLASH_KDA_CUDA=ON -DFLASH_KDA_TESTS=ON -DFLASH_KDA_EXAMPLES=ON \
    -DFLASH_KDA_CUTLASS_INCLUDE_DIR="$CUTLASS_INCLUDE_DIR" &&
    cmake --build "$ROOT/build-gpucheck" -j "$JOBS"
}
export -f build_cpp
export ROOT JOBS
if [[ -n ${GPU_CHECK_STEPS:-} && ",$GPU_CHECK_STEPS," != *",ctest,"* ]]; then
  skip_step ctest-build "ctest is not in GPU_CHECK_STEPS"
  if [[ ${GPU_CHECK_SKIP_BUILD:-0} == 1 ]]; then skip_step build "GPU_CHECK_SKIP_BUILD=1"
  else run_step build 360 "$PY" -m pip install --no-index --no-build-isolation --no-deps -v "$ROOT"; fi
elif [[ ${GPU_CHECK_SKIP_BUILD:-0} == 1 ]]; then
  skip_step build "GPU_CHECK_SKIP_BUILD=1"
  run_step ctest-build 300 bash -c build_cpp
else
  CPP_T0=$SECONDS
  (timeout 360 bash -c build_cpp >"$LOG/ctest-build.log" 2>&1; echo $? >"$LOG/ctest-build.rc") &
  CPP_PID=$!
  run_step build 360 "$PY" -m pip install --no-index --no-build-isolation --no-deps -v "$ROOT"
  wait "$CPP_PID"
  ORDER+=(ctest-build); SECS[ctest-build]=$((SECONDS - CPP_T0))
  rc=$(cat "$LOG/ctest-build.rc" 2>/dev/null || echo 1)
  if [[ $rc == 0 ]]; then STATUS[ctest-build]=pass; else STATUS[ctest-build]="FAIL (exit $rc)"; tail -n 25 "$LOG/ctest-build.log"; fi
fi

# 3. With GPU_CHECK_PARALLEL=1: ctest, each sanitizer tool and the whole pytest suite but the
#    large-memory test at once, each under its own limit, then the large-memory test alone; no
#    benchmark (its timings need the GPU alone). One 10-minute device call instead of two:
#    every step is correctness only, so sharing the GPU slows it but changes no result. pytest
#    reads fla's carried autotune choices from a copy of the cache, so that choices made on a
#    shared GPU never reach the cache a later benchmark reads.
if [[ ${GPU_CHECK_PARALLEL:-0} == 1 ]]; then
  BG_PIDS=()
  BG_NAMES=()
  # run_bg NAME CAP CMD...: run_step in the background; its status and seconds land in
  # $LOG/NAME.step for collect_bg.
  run_bg() {
    local name=$1
    (
      run_step "$@"
      printf '%s\t%s\n' "${STATUS[$name]:-FAIL (no status)}" "${SECS[$name]:-0}" >"$LOG/$name.step"
    ) &
    BG_PIDS+=($!)
    BG_NAMES+=("$name")
  }
  if [[ ${STATUS[ctest-build]} == pass ]]; then
    # Not the kernels' CPU models (tests/emu, label cpu-model: ~250 s of the suite's ~1700
    # test-seconds), which need no GPU and which CI runs on every submission;
    # GPU_CHECK_CTEST_ALL=1 runs them here too.
    CTEST_FILTER=(-LE cpu-model)
    [[ ${GPU_CHECK_CTEST_ALL:-0} == 1 ]] && CTEST_FILTER=()
    run_bg ctest 420 ctest --test-dir "$ROOT/build-gpucheck" -j "$((JOBS / 4 > 0 ? JOBS / 4 : 1))" "${CTEST_FILTER[@]}" \
      --output-on-failure --output-junit "$LOG/ctest.xml"
  else
    skip_step ctest "the C++ build: ${STATUS[ctest-build]}"
  fi
  if [[ ${GPU_CHECK_SKIP_SANITIZE:-0} == 1 ]]; then
    skip_step sanitize "GPU_CHECK_SKIP_SANITIZE=1"
  else
    # The tools' own logs go to sanitize/: $LOG/sanitize-<tool>.log is the step's log, which
    # would otherwise overwrite them.
    # racecheck takes seconds for the forward's cases and minutes for the backward's: three
    # processes share them, so that it ends inside the budget beside the other steps.
    run_bg sanitize-memcheck 430 "$PY" scripts/sanitize.py --tool memcheck --log-dir "$LOG/sanitize" --timeout 420
    run_bg sanitize-racecheck-forward 450 "$PY" scripts/sanitize.py --tool racecheck --parts forward,decode,chain-segments \
      --log-dir "$LOG/sanitize" --timeout 440
    for shard in 0/2 1/2; do
      run_bg "sanitize-racecheck-backward-${shard%/*}" 450 "$PY" scripts/sanitize.py --tool racecheck --parts backward \
        --shard "$shard" --log-dir "$LOG/sanitize" --timeout 440
    done
  fi
  if [[ ${GPU_CHECK_SKIP_TESTS:-0} == 1 ]]; then
    skip_step pytest-all "GPU_CHECK_SKIP_TESTS=1"
    skip_step pytest-backward "GPU_CHECK_SKIP_TESTS=1"
  else
    rm -rf /tmp/gpu-check-triton && cp -r "$TRITON_CACHE_DIR" /tmp/gpu-check-triton
    # Two pytest steps at once: the backward's gradient grid (pytest-backward, 2 workers) and
    # everything else (pytest-all). Each grid point autotunes and compiles fla's Triton
    # backward for its shape; workers that start on grid points together compile the same
    # kernels side by side before any of them reaches the shared cache, which starves the
    # CPU the other steps share. Two workers mostly reuse each other's compiles (the
    # measurements: docs/notes/2026-12-03_suite-ab-and-profile.md).
    # What each step runs: its files, or its node ids of GPU_CHECK_PYTEST_ITEMS (a file, one
    # id a line, e.g. an earlier run's pytest-unfinished.txt), read by pytest's @file argument.
    GRID=tests/python/test_backward_grid.py
    SEL_ALL=(tests/python --ignore="$GRID") SEL_GRID=("$GRID") RUN_ALL=1 RUN_GRID=1
    ITEMS_OK=1
    if [[ -n ${GPU_CHECK_PYTEST_ITEMS:-} ]]; then
      # Blank lines dropped (pytest reads one as "" and collects everything); an id of the grid
      # file (with or without ::) goes to pytest-backward. A file that cannot be read fails both
      # steps instead of leaving nothing to run.
      if [[ -r $GPU_CHECK_PYTEST_ITEMS ]]; then
        grep -v '^[[:space:]]*$' "$GPU_CHECK_PYTEST_ITEMS" >"$LOG/items.txt"
        grep -vE 'test_backward_grid\.py(::|$)' "$LOG/items.txt" >"$LOG/items-all.txt"
        grep -E 'test_backward_grid\.py(::|$)' "$LOG/items.txt" >"$LOG/items-backward.txt"
        [[ -s $LOG/items-all.txt ]] || RUN_ALL=0
        [[ -s $LOG/items-backward.txt ]] || RUN_GRID=0
      else
        ITEMS_OK=0 RUN_ALL=0 RUN_GRID=0
      fi
      SEL_ALL=("@$LOG/items-all.txt") SEL_GRID=("@$LOG/items-backward.txt")
    fi
    # The grid's two workers come out of the step's share only when that step runs.
    grid_workers=0
    if ((RUN_GRID)) && [[ -z ${GPU_CHECK_STEPS:-} || ",$GPU_CHECK_STEPS," == *",pytest-backward,"* ]]; then
      grid_workers=2
    fi
    # The collected ids, for the list of those a cut run leaves unfinished (below).
    { ((RUN_ALL)) && "$PY" -m pytest "${SEL_ALL[@]}" --collect-only -q -p no:cacheprovider -m "not large_memory" 2>/dev/null
      ((RUN_GRID)) && "$PY" -m pytest "${SEL_GRID[@]}" --collect-only -q -p no:cacheprovider 2>/dev/null; } |
      grep '::' >"$LOG/pytest-collected.txt" &
    COLLECT_PID=$!
    # worksteal: idle workers take queued items from busy ones, so that long items do not wait
    # behind them when the step nears its limit.
    # The limits leave the large-memory step (~10 s) 25 s of the budget.
    pytest_cap=$((BUDGET - SECONDS - 45))
    ((pytest_cap > 470)) && pytest_cap=470
    workers=$((JOBS * 5 / 8 > 3 ? JOBS * 5 / 8 : 3))
    # pytest_bg NAME RUN WORKERS WHY_SKIPPED ARGS...: pytest ARGS as step NAME in the background
    # when RUN is 1; else skipped with WHY_SKIPPED, or failed when the items file is unreadable.
    pytest_bg() {
      local name=$1 run=$2 n=$3 why=$4; shift 4
      if ((run)); then
        # shellcheck disable=SC2086
        run_bg "$name" "$pytest_cap" env TRITON_CACHE_DIR=/tmp/gpu-check-triton "$PY" -m pytest "$@" -v -rs \
          -p no:cacheprovider -n "$n" --dist worksteal --timeout=420 --junitxml="$LOG/$name.xml" ${GPU_CHECK_PYTEST_ARGS:-}
      elif ((ITEMS_OK)); then
        skip_step "$name" "$why"
      else
        ORDER+=("$name"); STATUS[$name]="FAIL (GPU_CHECK_PYTEST_ITEMS=$GPU_CHECK_PYTEST_ITEMS cannot be read)"
        SECS[$name]=0
      fi
    }
    pytest_bg pytest-all "$RUN_ALL" "$((workers - grid_workers))" "no GPU_CHECK_PYTEST_ITEMS outside the backward grid" \
      "${SEL_ALL[@]}" -m "not large_memory"
    pytest_bg pytest-backward "$RUN_GRID" 2 "no GPU_CHECK_PYTEST_ITEMS in the backward grid" "${SEL_GRID[@]}"
  fi
  wait "${BG_PIDS[@]}"
  for name in "${BG_NAMES[@]}"; do
    ORDER+=("$name")
    st="FAIL (no status)" secs=0
    [[ -f $LOG/$name.step ]] && IFS=$'\t' read -r st secs <"$LOG/$name.step"
    STATUS[$name]=$st
    SECS[$name]=$secs
    echo "gpu-check:    $name: $st in ${secs}s"
  done
  # A pytest step cut at its limit: the collected ids the two did not finish, for a second call with
  # GPU_CHECK_PYTEST_ITEMS (xdist's -v lines: "[gwN] [ nn%] PASSED <id>").
  [[ -n ${COLLECT_PID:-} ]] && wait "$COLLECT_PID"
  if [[ ${STATUS[pytest-all]:-} == timeout* || ${STATUS[pytest-backward]:-} == timeout* ]] &&
    [[ -s $LOG/pytest-collected.txt ]]; then
    cat "$LOG/pytest-all.log" "$LOG/pytest-backward.log" 2>/dev/null |
      sed -nE 's/^\[gw[0-9]+\] \[ *[0-9]+%\] (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) (.*[^ ]) *$/\2/p' |
      sort -u >"$LOG/pytest-finished.txt"
    sort -u "$LOG/pytest-collected.txt" | comm -23 - "$LOG/pytest-finished.txt" >"$LOG/pytest-unfinished.txt"
    echo "gpu-check:    pytest left $(wc -l <"$LOG/pytest-unfinished.txt") of" \
      "$(wc -l <"$LOG/pytest-collected.txt") items unfinished: pytest-unfinished.txt in the logs;" \
      "GPU_CHECK_PYTEST_ITEMS=<that file> runs them"
  fi
  if [[ ${GPU_CHECK_SKIP_TESTS:-0} == 1 ]]; then
    skip_step pytest-gpu-large "GPU_CHECK_SKIP_TESTS=1"
  else
    # shellcheck disable=SC2086
    run_step pytest-gpu-large 120 env FLA_CACHE_RESULTS=0 "$PY" -m pytest tests/python/test_fwd_*.py -q -rs \
      -p no:cacheprovider -m large_memory --junitxml="$LOG/pytest-gpu-large.xml" ${GPU_CHECK_PYTEST_ARGS:-}
  fi
else
# 3. Tests, one step after another; the benchmark runs alone at the end. fla's autotune
#    choices made while the pytest workers share the GPU are not persisted
#    (FLA_CACHE_RESULTS=0), so they never skew the benchmark's fla timings.
if [[ ${STATUS[ctest-build]} == pass ]]; then
  run_step ctest 120 ctest --test-dir "$ROOT/build-gpucheck" -j "$JOBS" --output-on-failure \
    --output-junit "$LOG/ctest.xml"
elif [[ ${STATUS[ctest-build]} == skipped* ]]; then
  skip_step ctest "not in GPU_CHECK_STEPS"
else
  skip_step ctest "the C++ build failed"
fi

# compute-sanitizer alone (beside the GPU tests it crawled): memcheck of every case (~100 s), and
# racecheck of the forward's and decode's (~20 s): racecheck of the backward's takes minutes,
# which GPU_CHECK_PARALLEL=1 spends beside the other steps.
if [[ ${GPU_CHECK_SKIP_SANITIZE:-0} == 1 ]]; then
  skip_step sanitize "GPU_CHECK_SKIP_SANITIZE=1"
else
  run_step sanitize 200 "$PY" scripts/sanitize.py --tool memcheck --log-dir "$LOG/sanitize" --timeout 190
  run_step sanitize-racecheck-forward 120 "$PY" scripts/sanitize.py --tool racecheck --parts forward,decode,chain-segments \
    --log-dir "$LOG/sanitize" --timeout 110
fi

XDIST=()
if "$PY" -c "import xdist" 2>/dev/null; then XDIST=(-n "$((JOBS / 2))"); fi
HAVE_BENCH=0
if [[ ${GPU_CHECK_SKIP_BENCH:-0} != 1 ]] &&
  "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('flash_kda.bench') is None)" 2>/dev/null; then
  HAVE_BENCH=1
fi
# fla's kernels for the benchmark's shapes compile (scripts/warm_fla.py) on the other half of
# the cores while the GPU tests run: on a fresh machine that compile is most of the benchmark.
# With fla's autotune choices for every shape carried in .triton-cache/ (triton-autotune.tgz of
# an earlier run of the whole benchmark) the benchmark compiles only the chosen configurations:
# no warm-up needed. GPU_CHECK_FLA_WARM=1 warms anyway (a cache of some shapes only).
CARRIED_TUNING=$(find "$TRITON_CACHE_DIR" -name '*.autotune.json' 2>/dev/null | wc -l)
[[ ${GPU_CHECK_FLA_WARM:-0} == 1 ]] && CARRIED_TUNING=0
if ((HAVE_BENCH && CARRIED_TUNING == 0)); then
  WARM_T0=$SECONDS
  (timeout 300 "$PY" scripts/warm_fla.py --jobs "$((JOBS / 2))" >"$LOG/fla-warm.log" 2>&1; echo $? >"$LOG/fla-warm.rc") &
  WARM_PID=$!
fi
# GPU tests in parallel (the CPU reference and Triton compiles are the slow part).
TESTS=1
[[ ${GPU_CHECK_SKIP_TESTS:-0} == 1 ]] && TESTS=0
if ((TESTS)); then
  # shellcheck disable=SC2086
  run_step pytest-gpu 300 env FLA_CACHE_RESULTS=0 "$PY" -m pytest tests/python/test_fwd_*.py -v -rs -p no:cacheprovider "${XDIST[@]}" \
    -m "not large_memory" --durations=10 --junitxml="$LOG/pytest-gpu.xml" ${GPU_CHECK_PYTEST_ARGS:-}
else
  skip_step pytest-gpu "GPU_CHECK_SKIP_TESTS=1"
fi
if ((HAVE_BENCH)); then
  if ((CARRIED_TUNING == 0)); then
    wait "$WARM_PID"
    ORDER+=(fla-warm); SECS[fla-warm]=$((SECONDS - WARM_T0))
    rc=$(cat "$LOG/fla-warm.rc" 2>/dev/null || echo 1)
    if [[ $rc == 0 ]]; then STATUS[fla-warm]=pass; else STATUS[fla-warm]="FAIL (exit $rc)"; tail -n 15 "$LOG/fla-warm.log"; fi
  else
    skip_step fla-warm "$CARRIED_TUNING fla autotune results carried in $TRITON_CACHE_DIR"
  fi
  # The benchmark alone on the GPU: its timings and fla's autotune choices must be uncontended.
  # shellcheck disable=SC2086
  run_step bench 300 "$PY" -m flash_kda.bench --out-dir "$LOG/bench" ${GPU_CHECK_BENCH_ARGS:-}
  # The consumer path: fla's KimiDeltaAttention layer, Triton vs dispatched to flash_kda.
  run_step bench-layer 120 "$PY" -m flash_kda.bench --layer --out-dir "$LOG/layer"
else
  skip_step bench "GPU_CHECK_SKIP_BENCH=1 or flash_kda.bench is not installed"
fi
if ((TESTS)); then
  # shellcheck disable=SC2086
  run_step pytest-rest 240 env FLA_CACHE_RESULTS=0 "$PY" -m pytest tests/python -v -rs -p no:cacheprovider "${XDIST[@]}" \
    --ignore-glob='*/test_fwd_*.py' --ignore=tests/python/test_backward_grid.py --timeout=150 \
    --junitxml="$LOG/pytest-rest.xml" ${GPU_CHECK_PYTEST_ARGS:-}
  # The backward's gradient grid on its own: fla's Triton backward compiles per shape family
  # (minutes on a fresh machine), so it gets all the cores and its own limit; a run cut short
  # still leaves each finished point's row in backward-grid-rows-*.json.
  # shellcheck disable=SC2086
  run_step pytest-backward 300 env FLA_CACHE_RESULTS=0 "$PY" -m pytest tests/python/test_backward_grid.py -v -rs \
    -p no:cacheprovider ${XDIST:+-n "$JOBS"} --timeout=200 --junitxml="$LOG/pytest-backward.xml" ${GPU_CHECK_PYTEST_ARGS:-}
  # The test that needs most of the GPU's memory, alone.
  # shellcheck disable=SC2086
  run_step pytest-gpu-large 120 env FLA_CACHE_RESULTS=0 "$PY" -m pytest tests/python/test_fwd_*.py -q -rs -p no:cacheprovider \
    -m large_memory --junitxml="$LOG/pytest-gpu-large.xml" ${GPU_CHECK_PYTEST_ARGS:-}
else
  skip_step pytest-rest "GPU_CHECK_SKIP_TESTS=1"
  skip_step pytest-backward "GPU_CHECK_SKIP_TESTS=1"
  skip_step pytest-gpu-large "GPU_CHECK_SKIP_TESTS=1"
fi

fi

# 4. Report: bring back a few files (the device tool returns at most 8), print the accuracy
#    tables, then the summary table last.
if [[ -n ${OUT:-} ]]; then
  tar czf "$OUT/gpu-check-logs.tgz" -C "$LOG" . 2>/dev/null
  for f in accuracy.md chunk-accuracy.md backward-grid.md bench/results.json; do
    [[ -f $LOG/$f ]] && cp "$LOG/$f" "$OUT/"
  done
  RECORD=0
  for f in BENCHMARK_H200.md BENCHMARK_H200.png; do  # written by GPU_CHECK_BENCH_ARGS=--write-record
    [[ -f $ROOT/$f && $ROOT/$f -nt $LOG/gpu.txt ]] && cp "$ROOT/$f" "$OUT/" && RECORD=1
  done
  if ((!RECORD)); then  # the record is the same table and chart; both stay in gpu-check-logs.tgz
    for f in bench/results.md bench/chart.png; do
      [[ -f $LOG/$f ]] && cp "$LOG/$f" "$OUT/"
    done
  fi
  # fla's autotune choices from the benchmark (small JSON files; the compiled kernels are
  # tens of MB): carried back in .triton-cache/, they spare the next machine the tuning. The
  # pytest steps tuned in their own copy of the cache (/tmp/gpu-check-triton: fla's backward for
  # each grid shape, the slowest tuning of all), so their choices join the cache first.
  if [[ -d /tmp/gpu-check-triton ]]; then
    (cd /tmp/gpu-check-triton && find . -name '*.autotune.json' -print0 |
      xargs -0 -r cp --parents -n -t "$TRITON_CACHE_DIR") 2>/dev/null
  fi
  (cd "$(dirname "$TRITON_CACHE_DIR")" && find "$(basename "$TRITON_CACHE_DIR")" -name '*.autotune.json' -print0 |
    tar czf "$OUT/triton-autotune.tgz" --null -T -) 2>/dev/null
fi
for f in accuracy.md chunk-accuracy.md backward-grid.md; do
  if [[ -f $LOG/$f ]]; then echo; cat "$LOG/$f"; fi
done
STATUS_DUMP=$(for n in "${ORDER[@]}"; do printf '%s\t%s\t%s\n' "$n" "${STATUS[$n]}" "${SECS[$n]}"; done)
STATUS_DUMP=$STATUS_DUMP LOG=$LOG "$PY" - <<'PYEOF'
# Summary table: one row per step; test counts from the junit XML that ctest and pytest wrote.
import os, re, xml.etree.ElementTree as ET
log = os.environ["LOG"]
junit = {"ctest": "ctest.xml", "pytest-rest": "pytest-rest.xml", "pytest-backward": "pytest-backward.xml",
         "pytest-all": "pytest-all.xml",
         "pytest-gpu": "pytest-gpu.xml",
         "pytest-gpu-large": "pytest-gpu-large.xml"}

def counts(path):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    get = lambda s, k: int(float(s.get(k, 0) or 0))
    tests = sum(get(s, "tests") for s in suites)
    failed = sum(get(s, "failures") + get(s, "errors") for s in suites)
    skipped = sum(get(s, "skipped") + get(s, "disabled") for s in suites)
    return tests - failed - skipped, failed, skipped

def note(step):
    path = os.path.join(log, step + ".log")
    text = open(path, errors="replace").read() if os.path.exists(path) else ""
    if step.startswith("sanitize"):
        return "; ".join(l.split(": ", 1)[1].split(" (")[0] for l in text.splitlines()
                         if re.match(r"sanitize: (memcheck|racecheck)\S*: ", l)) or (text.strip().splitlines() or [""])[-1][:110]
    if step == "bench-layer":
        lines = [l.strip() for l in text.splitlines() if re.search(r"rel|diff|layer", l, re.I)]
        return (lines or [""])[-1][:110]
    if step == "bench":
        lines = [l.strip() for l in text.splitlines() if l.strip()]
        head = [l for l in lines if re.search(r"geo|geomean|headline", l, re.I)]
        return (head or lines or [""])[-1][:110]
    return ""

rows, failed_steps = [], 0
for line in os.environ["STATUS_DUMP"].splitlines():
    step, status, secs = line.split("\t")
    c = counts(os.path.join(log, junit[step])) if step in junit else None
    if step == "pytest-gpu" and status == "pass" and (c is None or c[0] == 0):
        status = "FAIL (no GPU test ran)"  # every test skipped: no sm_90 GPU or no CUDA build
    failed_steps += not (status == "pass" or status.startswith("skipped"))
    p, f, s = (str(x) for x in c) if c else ("", "", "")
    rows.append((step, status, secs, p, f, s, note(step)))
head = ("step", "result", "s", "passed", "failed", "skipped", "note")
w = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
fmt = lambda r: "| " + " | ".join(x.ljust(w[i]) for i, x in enumerate(r)) + " |"
print("\ngpu-check summary (logs: %s; test seed %s)" % (log, os.environ.get("FLASH_KDA_TEST_SEED", "-")))
print(fmt(head)); print("|" + "|".join("-" * (n + 2) for n in w) + "|")
for r in rows:
    print(fmt(r))
print("gpu-check: %s" % ("PASS" if failed_steps == 0 else "FAIL (%d step(s))" % failed_steps))
raise SystemExit(1 if failed_steps else 0)
PYEOF
