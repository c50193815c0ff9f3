"""The plan cache of the torch face: one built frost graph per exact call shape, least recently used first out.

A frost plan binds tensors of exactly its declared dims and strides (packed graphs: token totals up
to an envelope), so a dense call with another batch or length needs its own plan. Its kernels are
shared: they compile per specialization (`spec.py`) and frost keeps them for the process, so a new
shape with a known specialization plans in about a millisecond and compiles nothing.

A hit takes no lock; a miss plans under a lock, one plan at a time, and never while the current stream
captures a CUDA graph (the call raises `PlanDuringCaptureError`: run it once before capture).
"""
from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from frost.errors import PlanDuringCaptureError

DEFAULT_SIZE = 256


@dataclass
class Planned:
    """A built graph and the handles of its ports, in the order `run` takes tensors."""

    graph: object
    handles: tuple
    workspace_size: int
    spec: object  # spec.Specialization
    plan_seconds: float = 0.0

    def run(self, tensors, device) -> None:
        """Bind `tensors` (in handle order), allocate the workspace on the current stream, execute there."""
        ws = torch.empty(self.workspace_size, dtype=torch.uint8, device=device) if self.workspace_size else None
        self.graph.execute(dict(zip(self.handles, tensors)), ws)

    @property
    def engine_name(self) -> str:
        return self.graph.engine_name


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    plan_seconds: float = 0.0  # total time spent planning
    specializations: dict = field(default_factory=dict)  # Specialization -> plans built for it


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False without CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class PlanCache:
    """Thread-safe LRU of Planned entries keyed by exact call shape."""

    def __init__(self, max_size: int = DEFAULT_SIZE):
        self.max_size = max(int(max_size), 1)
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self._build_lock = threading.Lock()
        self.stats = CacheStats()

    def lookup(self, key) -> Optional[Planned]:
        """The cached entry of `key` (now the most recent), or None.

        No lock: OrderedDict's get and move_to_end are each atomic under the GIL, and an entry
        evicted between the two is still a valid plan to run.
        """
        entry = self._entries.get(key)
        if entry is not None:
            try:
                self._entries.move_to_end(key)
            except KeyError:  # evicted meanwhile by another thread
                pass
            self.stats.hits += 1
        return entry

    def build(self, key, build: Callable[[], Planned], what: Callable[[], str]) -> Planned:
        """Plan `key` with `build()` (one plan at a time) unless another thread just did; `what()` names
        the call in the error raised during capture."""
        if capturing():
            raise PlanDuringCaptureError(
                f"frost needs a new plan for {what()} while the current stream captures a CUDA graph; planning "
                f"is host work that capture cannot record. Run the same call once before capture (a warm-up "
                f"step) so its plan is cached; torch.compile's mode='reduce-overhead' warms up by itself.")
        with self._build_lock:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None:
                    self.stats.hits += 1
                    return entry
            t0 = time.perf_counter()
            entry = build()
            entry.plan_seconds = time.perf_counter() - t0
            with self._lock:
                self.stats.misses += 1
                self.stats.plan_seconds += entry.plan_seconds
                specs = self.stats.specializations
                specs[entry.spec] = specs.get(entry.spec, 0) + 1
                self._entries[key] = entry
                while len(self._entries) > self.max_size:
                    self._entries.popitem(last=False)
                    self.stats.evictions += 1
        return entry

    def get(self, key, build: Callable[[], Planned], what: Callable[[], str]) -> Planned:
        """The entry of `key`, built on a miss."""
        return self.lookup(key) or self.build(key, build, what)

    def resize(self, max_size: int) -> None:
        with self._lock:
            self.max_size = max(int(max_size), 1)
            while len(self._entries) > self.max_size:
                self._entries.popitem(last=False)
                self.stats.evictions += 1

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.stats = CacheStats()

    def entries(self) -> list[Planned]:
        with self._lock:
            return list(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)


PLANS = PlanCache(int(os.environ.get("FROST_TORCH_PLAN_CACHE_SIZE", DEFAULT_SIZE)))


def set_plan_cache_size(max_size: int) -> None:
    """Bound the number of cached plans (default 256, or $FROST_TORCH_PLAN_CACHE_SIZE); evicts the oldest."""
    PLANS.resize(max_size)


def clear_plan_cache() -> None:
    """Drop every cached plan (compiled kernels stay in frost's kernel cache)."""
    PLANS.clear()


def plan_cache_info() -> dict:
    """Counters of the plan cache: size, hits, misses, evictions, planning time, plans per specialization."""
    s = PLANS.stats
    return {"size": len(PLANS), "max_size": PLANS.max_size, "hits": s.hits, "misses": s.misses,
            "evictions": s.evictions, "plan_seconds": s.plan_seconds, "specializations": dict(s.specializations)}


def target_of(device) -> Optional[object]:
    """frost's Target for a torch device: the CPU record for CPU tensors, the device's record otherwise."""
    from frost.target import CPU, discover_target

    if device.type == "cpu":
        return CPU
    return discover_target(device.index if device.index is not None else None)
