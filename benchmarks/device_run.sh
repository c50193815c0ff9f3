#!/usr/bin/env bash
# One device call: the GPU test suite and a benchmark, summaries written to $OUT.
#   bash benchmarks/device_run.sh [tests] [bench PRESET] [pytest -k EXPR]
# Run from the repository root on the GPU machine, with the package kit carried (.kit).
set -uo pipefail
source .kit/env.sh
export PYTHONPATH="$PWD:$PYTHONPATH"
export FROST_CACHE_DIR="${FROST_CACHE_DIR:-/tmp/frost-cache}"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
commit="${FROST_COMMIT:-unknown}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt" 2>&1
kexpr=""; preset=""; run_tests=0
while [ $# -gt 0 ]; do
  case "$1" in
    tests) run_tests=1 ;;
    bench) preset="$2"; shift ;;
    -k) kexpr="$2"; shift ;;
  esac
  shift
done
if [ "$run_tests" = 1 ]; then
  # compile all specializations first, in parallel, then run the tests against the warm cache
  python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider -n 8 ${kexpr:+-k "$kexpr"} \
    --junitxml="$OUT/gpu-tests.xml" 2>&1 | tail -60 > "$OUT/gpu-tests.log"
  tail -3 "$OUT/gpu-tests.log"
fi
if [ -n "$preset" ]; then
  FROST_COMMIT="$commit" python3 -m frost.bench --preset "$preset" --time-budget "${BENCH_BUDGET:-300}" \
    --results-dir "$OUT" --name "h200_${preset}" 2> "$OUT/bench-progress.log"
fi
