#!/usr/bin/env bash
# One device call: the GPU test suite, plan/host time, a benchmark, an ncu profile; their files land in $OUT
# (more than 7 of them: packed into $OUT/device-run.tar.gz, as the device tool returns at most 8 files).
#   bash benchmarks/device_run.sh [tests] [plan] [host] [sweeps] [bench PRESET] [--bench-args "..."]
#                                 [ncu "ARGS"] [ncubwd "ARGS"] [-k EXPR] [--budget SECONDS] [--commit SHA]
#                                 [torchface] [gpt STEPS] [cudnn] [suite I/N [--suite-timeout SECONDS] [--files "F ..."]]
# `suite I/N` runs shard I of N of the whole GPU suite (the test files of test/gpu in sorted order, every Nth from
# the Ith) with junit XML (junit-suite-I.xml) and its per-file table with skip reasons (gpu-suite-I.md, printed;
# benchmarks/gpu_suite_summary.py). Summarize all shards at home: gpu_suite_summary.py junit-suite-*.xml.
# `--files "F ..."` runs those test files instead of a shard (I names the output files: `suite new/1 --files ...`).
# `cudnn` runs the cuDNN engine's GPU tests (cudnn-tests.log, skip reasons listed) and benchmarks/cudnn_host.py
# (cudnn-host.md/json: its execute's host time against torch's cuDNN SDPA call); time it against cuDNN through
# torch with `bench cudnn --bench-args "--impl cudnn,frost --frost-engines cudnn"`.
# `torchface` runs the torch face's GPU tests and benchmarks/torch_face.py (torch-face-*.log/json);
# `gpt STEPS` trains examples/train_gpt.py with sdpa, then frost (same seed), overlaying both loss curves.
# `ncu "ARGS"` profiles benchmarks/profile_fwd.py ARGS (frost and FA4, one call each) with ncu.
# `ncubwd "ARGS"` profiles benchmarks/profile_bwd.py ARGS (the frost and FA2, or with --peer fa4 FA4, main backward kernels): stall
# reasons, L2 reduction requests, shared-memory bank conflicts and source counters (ncu-bwd-N.txt), and the SASS
# instructions with excess shared wavefronts or the most stall samples (ncu-bwd-N-sass.txt, ncu_sass_hot.py);
# it may be given more than once.
# `sweeps` re-times knob alternatives against the peers in the same process (sweeps.log): the SM90 forward
# at D=256 (early O rescale, one CTA per tile) and the SM80 backward's variant set (sm80_bwd_variants.json);
# their last measurements are in benchmarks/results/2026-11-30-h200-run3 (SM90), -run5 and -run6 (backward).
# Run from the repository root on the GPU machine with the package kit carried (.kit; see AGENTS.md).
# Compiles happen there (CuTe DSL, 16 cores); pytest-xdist spreads them over processes.
set -uo pipefail
source .kit/env.sh
export PYTHONPATH="$PWD:$PYTHONPATH"
# the kernel cache: the caller's FROST_CACHE_DIR, else frost's per-user default (never a fixed name in a shared
# temp dir, where another user could plant native code); scratch files in a private directory of this run
WORK="$(mktemp -d "${TMPDIR:-/tmp}/frost-device-run.XXXXXX")"; trap 'rm -rf "$WORK"' EXIT
OUT="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/frost-out.XXXXXX")}"; mkdir -p "$OUT"; echo "# results in $OUT"
kexpr=""; preset=""; run_tests=0; run_plan=0; run_host=0; run_sweeps=0; budget=240; commit="${FROST_COMMIT:-}"
run_cudnn=0; suite=""; suite_timeout=540; suite_files=""
bench_args=""; ncu_args=""; ncubwd_list=(); run_torchface=0; gpt_steps=""
while [ $# -gt 0 ]; do
  case "$1" in
    sweeps) run_sweeps=1 ;;
    tests) run_tests=1 ;;
    torchface) run_torchface=1 ;;
    cudnn) run_cudnn=1 ;;
    suite) suite="$2"; shift ;;
    --suite-timeout) suite_timeout="$2"; shift ;;
    --files) suite_files="$2"; shift ;;
    gpt) gpt_steps="$2"; shift ;;
    plan) run_plan=1 ;;
    host) run_host=1 ;;
    bench) preset="$2"; shift ;;
    --bench-args) bench_args="$2"; shift ;;
    ncu) ncu_args="$2"; shift ;;
    ncubwd) ncubwd_list+=("$2"); shift ;;
    -k) kexpr="$2"; shift ;;
    --budget) budget="$2"; shift ;;
    --commit) commit="$2"; shift ;;
  esac
  shift
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/misc.log" 2>&1
if [ "$run_tests" = 1 ]; then
  timeout 330 python3 -m pytest -q -m gpu test/gpu -p no:cacheprovider -n 12 -rfE ${kexpr:+-k "$kexpr"} \
    > "$OUT/gpu-tests.log" 2>&1
  tail -4 "$OUT/gpu-tests.log"
fi
if [ -n "$suite" ]; then
  si="${suite%/*}"; sn="${suite#*/}"
  files="$suite_files"
  [ -n "$files" ] || files=$(ls test/gpu/test_*.py | sort | awk -v i="$si" -v n="$sn" '(NR - i) % n == 0')
  # SIGINT first: pytest then still writes the junit file for the tests that ran
  env ${commit:+FROST_COMMIT=$commit} timeout -s INT -k 30 "$suite_timeout" python3 -m pytest -q -m gpu $files \
    -p no:cacheprovider -n 12 -rfEs --junitxml="$OUT/junit-suite-$si.xml" ${kexpr:+-k "$kexpr"} \
    > "$OUT/gpu-suite-$si.log" 2>&1
  tail -3 "$OUT/gpu-suite-$si.log"
  python3 benchmarks/gpu_suite_summary.py "$OUT/junit-suite-$si.xml" --commit "${commit:-$(git rev-parse --short HEAD 2>/dev/null)}" \
    --gpu "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" > "$OUT/gpu-suite-$si.md"
  cat "$OUT/gpu-suite-$si.md"
fi
if [ "$run_cudnn" = 1 ]; then
  timeout 300 python3 -m pytest -q -m gpu test/gpu/test_cudnn_engine.py test/gpu/test_cudnn_programs_gpu.py \
    "test/gpu/test_sdpa_fwd_gpu.py::test_non_default_stream_is_honored[cudnn]" -p no:cacheprovider -n 8 -rfEs \
    > "$OUT/cudnn-tests.log" 2>&1
  grep -E "^(SKIPPED|FAILED|ERROR)" "$OUT/cudnn-tests.log" | cut -c1-300 | head -30
  tail -2 "$OUT/cudnn-tests.log"
  timeout 120 python3 benchmarks/cudnn_host.py --json "$OUT/cudnn-host.json" > "$OUT/cudnn-host.md" 2>&1
  cat "$OUT/cudnn-host.md"
fi
if [ "$run_torchface" = 1 ]; then
  timeout 240 python3 -m pytest -q -m gpu test/gpu/test_torch_face.py -p no:cacheprovider -rfE \
    > "$OUT/torch-face-tests.log" 2>&1
  tail -4 "$OUT/torch-face-tests.log"
  timeout 180 python3 benchmarks/torch_face.py --json "$OUT/torch-face-bench.json" > "$OUT/torch-face-bench.log" 2>&1
  cat "$OUT/torch-face-bench.log"
fi
if [ -n "$gpt_steps" ]; then
  for att in sdpa frost; do
    timeout 280 python3 examples/train_gpt.py --attention "$att" --steps "$gpt_steps" --seed 0 --out-dir "$OUT/gpt" \
      --compare-with "$OUT/gpt/sdpa_summary.json" > "$OUT/gpt-$att.log" 2>&1
    tail -3 "$OUT/gpt-$att.log"
  done
fi
if [ "$run_plan" = 1 ]; then
  timeout 90 python3 -m pytest -q -s -m gpu test/gpu/test_cache_gpu.py -p no:cacheprovider >> "$OUT/misc.log" 2>&1
  timeout 90 python3 benchmarks/plan_time.py --repeats 3 >> "$OUT/misc.log" 2>&1
fi
if [ "$run_host" = 1 ]; then
  timeout 120 python3 benchmarks/host_time.py > "$OUT/host-time.md" 2>&1
  cat "$OUT/host-time.md"
fi
if [ "$run_sweeps" = 1 ]; then
  (cd benchmarks && timeout 150 python3 sm90_fwd_quick.py --d 256 --s 4096,16384 --causal 0,1 \
     --variants '[{}, {"persistent": false}]') > "$OUT/sweeps.log" 2>&1
  timeout 240 python3 benchmarks/sm80_bwd_sweep.py --d 64,128 --s 4096,16384 --causal 0,1 \
    --variants "$(cat benchmarks/sm80_bwd_variants.json)" >> "$OUT/sweeps.log" 2>&1
  grep -v "^#" "$OUT/sweeps.log" | tail -30
fi
ncu_bin="$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)"
if [ -n "$ncu_args" ]; then
  python3 benchmarks/profile_fwd.py $ncu_args > /dev/null 2>&1  # compile outside the profiler
  timeout 240 "$ncu_bin" --profile-from-start off --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
    --section MemoryWorkloadAnalysis python3 benchmarks/profile_fwd.py $ncu_args > "$OUT/ncu.txt" 2>&1
  grep -E "frost_|flash|Duration|Throughput|Issue Slots|Stall|Registers" "$OUT/ncu.txt" | head -40
fi
i=0
for args in ${ncubwd_list[@]+"${ncubwd_list[@]}"}; do  # ncubwd may be given more than once: ncu-bwd-1.txt, ncu-bwd-1-sass.txt, ...
  i=$((i + 1))
  python3 benchmarks/profile_bwd.py $args > /dev/null 2>&1  # compile outside the profiler
  timeout 240 "$ncu_bin" --profile-from-start off --kernel-name regex:"frost_sdpa_bwd_main|flash_bwd_dq_dk_dv|BackwardSm90" \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --import-source no \
    --metrics lts__t_requests_op_red.sum,lts__t_sectors_op_red.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum \
    -f -o "$WORK/ncu-bwd-$i" python3 benchmarks/profile_bwd.py $args > "$WORK/ncu-bwd-$i.log" 2>&1
  { echo "# profile_bwd.py $args"; tail -5 "$WORK/ncu-bwd-$i.log"
    "$ncu_bin" -i "$WORK/ncu-bwd-$i.ncu-rep" --print-details all; } > "$OUT/ncu-bwd-$i.txt" 2>&1
  "$ncu_bin" -i "$WORK/ncu-bwd-$i.ncu-rep" --page source --csv --print-source sass > "$WORK/ncu-bwd-$i.csv" 2>&1
  python3 benchmarks/ncu_sass_hot.py "$WORK/ncu-bwd-$i.csv" > "$OUT/ncu-bwd-$i-sass.txt" 2>&1
  grep -E "frost_|flash_bwd|Duration|Stall|lts__|l1tex__|Excessive|excessive|Uncoalesced" "$OUT/ncu-bwd-$i.txt" | head -40
  grep -E "^##|^###" "$OUT/ncu-bwd-$i-sass.txt" | head
done
if [ -n "$preset" ]; then
  # the results' name says which card ran them (h100, h200, ...): the device may lend either
  gpu_tag=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h[0-9]{3}|a100|b200' | head -1 | tr A-Z a-z)
  env ${commit:+FROST_COMMIT=$commit} timeout $((budget + 60)) python3 -m frost.bench --preset "$preset" --probe \
    --time-budget "$budget" --results-dir "$OUT" --name "${gpu_tag:-gpu}_${preset}" $bench_args 2> "$OUT/bench-progress.log" \
    | tail -40
fi
# the device tool brings back at most 8 files: past 7, everything goes into one archive (untar it under the run's
# results folder; nothing is left behind)
n_out=$(find "$OUT" -maxdepth 1 -type f | wc -l)
if [ "$n_out" -gt 7 ]; then
  tar -C "$OUT" -czf "$WORK/device-run.tar.gz" . && find "$OUT" -mindepth 1 -delete && mv "$WORK/device-run.tar.gz" "$OUT/"
  echo "# $n_out files packed into device-run.tar.gz"
fi
