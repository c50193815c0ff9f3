"""GPU timing: CUDA-event medians over loops of calls, and wall-clock host time per call.

A sample times `inner` back-to-back calls (rotating through the buffer sets)
between two events on the current stream and divides by `inner`, so launch
latency is amortized the way a training step sees it. `mode="graph"` captures
the same loop in a CUDA graph and times replays (falls back to the loop, with a
note, when capture fails).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    samples_ms: list = field(default_factory=list)
    inner: int = 1
    mode: str = "loop"
    note: str = ""


@dataclass
class TimingOptions:
    warmup: int = 3
    reps: int = 20
    min_sample_ms: float = 2.0
    max_inner: int = 100
    mode: str = "loop"


def is_cuda(device) -> bool:
    return str(getattr(device, "type", device)).startswith("cuda")


def sync(device="cuda") -> None:
    """Drain the device (a no-op for the CPU harness self-test)."""
    if is_cuda(device):
        import torch

        torch.cuda.synchronize()


def _event_ms(run, device="cuda") -> float:
    """Milliseconds of `run` between two CUDA events on the current stream (wall clock on the CPU)."""
    if not is_cuda(device):
        t0 = time.perf_counter()
        run()
        return (time.perf_counter() - t0) * 1e3
    import torch

    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    run()
    e.record()
    e.synchronize()
    return s.elapsed_time(e)


def choose_inner(per_call_ms: float, min_sample_ms: float, max_inner: int) -> int:
    if per_call_ms <= 0:
        return max_inner
    return max(1, min(max_inner, math.ceil(min_sample_ms / per_call_ms)))


def time_calls(calls, opts: TimingOptions, bind_stream=None, device="cuda") -> Timing:
    """Median per-call milliseconds of `calls` (one per buffer set), rotating through them."""
    n = len(calls)
    state = {"i": 0}

    def loop(count):
        i = state["i"]
        for _ in range(count):
            calls[i % n]()
            i += 1
        state["i"] = i

    for _ in range(max(1, opts.warmup)):
        loop(n)
    sync(device)
    per_call = _event_ms(lambda: loop(n), device) / n
    inner = choose_inner(per_call, opts.min_sample_ms, opts.max_inner)

    note = ""
    if opts.mode == "graph" and is_cuda(device):
        try:
            return _time_graph(loop, inner, opts, bind_stream)
        except Exception as e:
            note = f"graph capture failed ({type(e).__name__}); timed a loop"
            sync(device)
    samples = [_event_ms(lambda: loop(inner), device) / inner for _ in range(max(1, opts.reps))]
    return Timing(statistics.median(samples), min(samples), samples, inner, "loop", note)


def _time_graph(loop, inner: int, opts: TimingOptions, bind_stream) -> Timing:
    import torch

    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            if bind_stream:
                bind_stream(side)
            loop(inner)  # warm the side stream before capture
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph, stream=side):
            loop(inner)
    finally:
        if bind_stream:
            bind_stream(torch.cuda.current_stream())
    graph.replay()
    sync()
    samples = [_event_ms(graph.replay) / inner for _ in range(opts.reps)]
    return Timing(statistics.median(samples), min(samples), samples, inner, "graph")


def host_time_us(call, calls: int = 500, warmup: int = 20, device="cuda") -> tuple[float, float]:
    """(wall, issue) microseconds per call over `calls` back-to-back calls, the GPU drained first.

    wall: until the GPU has drained again (bounded below by the GPU time of a
    launch); issue: until the last call returned on the host, before that sync —
    the host time proper while the launch queue has room.
    """
    for _ in range(warmup):
        call()
    sync(device)
    n = max(1, calls)
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    t_issue = time.perf_counter()
    sync(device)
    t_wall = time.perf_counter()
    return (t_wall - t0) / n * 1e6, (t_issue - t0) / n * 1e6
