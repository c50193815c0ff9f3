"""frost's benchmark harness: frost engines against cuDNN, FlashAttention-2 and -4 on one GPU.

    python -m frost.bench --dry-run                      # what would run (no GPU needed)
    python -m frost.bench --preset quick                 # a few minutes: D=128, S 1k/4k/16k, THD
    python -m frost.bench --head-dim 128,192x128 --gqa 1,4 --causal yes --direction fwd
    python -m frost.bench --preset anchors --results-dir benchmarks/results   # <name>.json/.md/.png
    python -m frost.bench --preset quick --direction bwd --deterministic both   # det / non-det time ratio

Every row is checked (frost against cuDNN, else FA4, else FA2, else fp32 math)
before it is timed; TFLOP/s follow the FLOP convention in `frost.bench.flops`.
Nothing here touches CUDA or imports cutlass at import time; the frost side is
isolated in `frost.bench.frost_runner`.
"""
