"""Interleaved samples, their spread, and a verdict that tells a win from noise.

One sample per engine per round, the engine order rotated each round, all in one process: drift (clocks,
temperature, a neighbour on the machine) then lands on every engine alike instead of on whichever ran last. A
row is a win (or a loss) only when the engines' min-max ranges do not overlap; overlapping ranges are a tie,
whatever the medians say. The bf16 matmul ceiling (torch.matmul of a large square GEMM, event-timed) measured in
the same run says how far each kernel is from what the tensor cores deliver on this machine today.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

MIN_SAMPLES = 5


@dataclass(frozen=True)
class Spread:
    median: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, samples) -> "Spread":
        xs = [float(x) for x in samples]
        if not xs:
            raise ValueError("no samples")
        return cls(statistics.median(xs), min(xs), max(xs), len(xs))

    def overlaps(self, other: "Spread") -> bool:
        return self.lo <= other.hi and other.lo <= self.hi


def rotated(keys: list, r: int) -> list:
    """Round r's order: the keys rotated by r (each key leads once every len(keys) rounds)."""
    if not keys:
        return []
    r %= len(keys)
    return keys[r:] + keys[:r]


def interleave(samplers: dict, rounds: int = MIN_SAMPLES, order_log: list | None = None) -> dict:
    """{key: [samples]}: `rounds` rounds, each calling every sampler once (a sampler returns one sample, e.g.
    milliseconds per call), in an order rotated by one each round. `order_log` collects each round's order."""
    keys = list(samplers)
    out = {k: [] for k in keys}
    for r in range(max(1, rounds)):
        order = rotated(keys, r)
        if order_log is not None:
            order_log.append(order)
        for k in order:
            out[k].append(samplers[k]())
    return out


def compare_ms(mine: Spread, peer: Spread) -> dict:
    """`mine` against `peer` as a speed ratio (> 1: mine is faster): the medians' ratio, its range from the
    extremes (peer's fastest over mine's slowest, peer's slowest over mine's fastest), and the verdict: "win" /
    "loss" only when the time ranges do not overlap, else "tie"."""
    ratio = peer.median / mine.median
    lo, hi = peer.lo / mine.hi, peer.hi / mine.lo
    verdict = "tie" if mine.overlaps(peer) else ("win" if mine.hi < peer.lo else "loss")
    return {"ratio": ratio, "ratio_lo": lo, "ratio_hi": hi, "verdict": verdict}


def matmul_flops(n: int) -> float:
    return 2.0 * n**3


def matmul_ceiling(n: int = 8192, rounds: int = MIN_SAMPLES, inner: int = 10, device: str = "cuda") -> dict:
    """The bf16 GEMM ceiling: TFLOP/s of torch.matmul on (n, n) x (n, n) bf16, event-timed over `inner` calls per
    sample; {"n", "tflops": median, "tflops_lo", "tflops_hi", "samples_ms"}. On the CPU (harness self-test) a
    float32 matmul timed by the wall clock stands in."""
    import torch

    from frost.bench.timing import _event_ms, is_cuda, sync

    dtype = torch.bfloat16 if is_cuda(device) else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=gen).to(dtype)
    b = torch.randn(n, n, device=device, generator=gen).to(dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)

    def loop():
        for _ in range(inner):
            torch.matmul(a, b, out=c)

    loop()
    sync(device)
    samples = [_event_ms(loop, device) / inner for _ in range(max(1, rounds))]
    s = Spread.of(samples)
    tf = matmul_flops(n) / 1e9
    return {"n": n, "tflops": tf / s.median, "tflops_lo": tf / s.hi, "tflops_hi": tf / s.lo, "samples_ms": samples}
