#!/usr/bin/env bash
# One device call: the GPU test suite, plan/host time, and a benchmark; at most 8 files land in $OUT.
#   bash benchmarks/device_run.sh [tests] [plan] [bench PRESET] [-k EXPR] [--budget SECONDS] [--commit SHA]
# Run from the repository root on the GPU machine with the package kit carried (.kit; see AGENTS.md).
# Compiles happen there (CuTe DSL, 16 cores); pytest-xdist spreads them over processes.
set -uo pipefail
source .kit/env.sh
export PYTHONPATH="$PWD:$PYTHONPATH"
export FROST_CACHE_DIR="${FROST_CACHE_DIR:-/tmp/frost-cache}"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
kexpr=""; preset=""; run_tests=0; run_plan=0; budget=240; commit="${FROST_COMMIT:-unknown}"
while [ $# -gt 0 ]; do
  case "$1" in
    tests) run_tests=1 ;;
    plan) run_plan=1 ;;
    bench) preset="$2"; shift ;;
    -k) kexpr="$2"; shift ;;
    --budget) budget="$2"; shift ;;
    --commit) commit="$2"; shift ;;
  esac
  shift
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/misc.log" 2>&1
if [ "$run_tests" = 1 ]; then
  timeout 300 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider -n 12 -rfE ${kexpr:+-k "$kexpr"} \
    > "$OUT/gpu-tests.log" 2>&1
  tail -4 "$OUT/gpu-tests.log"
fi
if [ "$run_plan" = 1 ]; then
  timeout 90 python3 -m pytest -q -s -m gpu tests/gpu/test_cache_gpu.py -p no:cacheprovider >> "$OUT/misc.log" 2>&1
  timeout 90 python3 benchmarks/plan_time.py --repeats 3 >> "$OUT/misc.log" 2>&1
fi
if [ -n "$preset" ]; then
  FROST_COMMIT="$commit" timeout $((budget + 60)) python3 -m frost.bench --preset "$preset" --probe \
    --time-budget "$budget" --results-dir "$OUT" --name "h200_${preset}" 2> "$OUT/bench-progress.log" | tail -40
fi
