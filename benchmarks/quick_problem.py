"""What the quick kernel scripts share: the dense BSHD problem they time and their timer."""

from __future__ import annotations

import math

import torch

from frost.bench.flops import sdpa_pair_flops


def timed(fn, warmup=3, reps=15, inner=4, min_sample_ms=1e9) -> float:
    """Median ms per call over `reps` samples of up to `inner` back-to-back calls (frost.bench's event timer)."""
    from frost.bench.timing import TimingOptions, time_calls

    opts = TimingOptions(warmup=warmup, reps=reps, min_sample_ms=min_sample_ms, max_inner=inner)
    return time_calls([fn], opts).median_ms


def bshd_problem(b: int, s: int, h: int, d: int, causal: bool, seed: int = 0):
    """(q, k, v, o, lse, scale, flops) for B x S x H x D bf16 on the GPU; FLOPs by design.md's convention."""
    torch.manual_seed(seed)
    q, k, v = (torch.randn(b, s, h, d, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    o = torch.empty_like(q)
    lse = torch.empty(b, h, s, dtype=torch.float32, device="cuda")
    flops = b * sdpa_pair_flops(h, s, s, d, d, causal)
    return q, k, v, o, lse, 1.0 / math.sqrt(d), flops
