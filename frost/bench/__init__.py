"""frost's benchmark harness: frost engines against cuDNN, FlashAttention-2 and -4 on one GPU.

Run `python -m frost.bench --help`. Nothing here imports torch.cuda state or
cutlass at import time; the GPU is touched only when a run starts.
"""
