"""The plan cache of the torch face: one built frost graph per exact call shape, least recently used first out.

A frost plan binds tensors of exactly its declared dims and strides (packed graphs: token totals up
to an envelope), so a dense call with another batch or length needs its own plan. Its kernels are
shared: they compile per specialization (`spec.py`) and frost keeps them for the process, so a new
shape with a known specialization plans in about a millisecond and compiles nothing.

A hit takes no lock and hashes its key once: recency is a tick stamped on the entry (eviction, on a
miss, looks for the oldest stamp). A miss plans under a lock, one plan at a time, and never while the
current stream captures a CUDA graph (the call raises `PlanDuringCaptureError`: run it once before
capture). `memo` maps the raw arguments of eager `attention` calls to prepared launches of cached
entries (`block.EagerForward`); an evicted entry is marked dead, and the memo forgets what pointed to it.

The cache sits between the ops and the graphs: `lookup(key)` finds an entry, `build(key, declare, *args)`
declares and plans one with `declare(*args)` (a `graphs.build_*` function) on a miss; the caller then
launches it (`graphs.Planned.run`).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from frost.errors import PlanDuringCaptureError
from frost.torch_face.graphs import Planned

DEFAULT_SIZE = 256
TICKS = itertools.count(1)  # recency stamps: `next(TICKS)` is one C call


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
        self._entries: dict = {}
        self._lock = threading.Lock()
        self._build_lock = threading.Lock()
        self.stats = CacheStats()
        self.memo: dict = {}  # eager attention arguments -> block.EagerForward (of a live entry)

    def lookup(self, key) -> Optional[Planned]:
        """The cached entry of `key` (now the most recent), or None.

        No lock: the dict's get is atomic under the GIL, and an entry evicted meanwhile is still a
        valid plan to run.
        """
        entry = self._entries.get(key)
        if entry is not None:
            entry.used = next(TICKS)
            self.stats.hits += 1
        return entry

    def remember(self, key, launch) -> None:
        """Memoize an eager call's prepared launch under its raw arguments (bounded: cleared when full)."""
        if len(self.memo) >= 4 * self.max_size + 64:
            self.memo.clear()
        self.memo[key] = launch

    def _evict_to(self, size: int) -> None:
        """Drop the least recently used entries until `size` are left (under the lock)."""
        if len(self._entries) <= size:
            return
        for key, entry in sorted(self._entries.items(), key=lambda kv: kv[1].used)[: len(self._entries) - size]:
            del self._entries[key]
            entry.live = False
            self.stats.evictions += 1
        for key, launch in list(self.memo.items()):
            if not launch.plan.live:
                self.memo.pop(key, None)

    def build(self, key, declare: Callable[..., Planned], *args) -> Planned:
        """Plan `key` with `declare(*args)` (one plan at a time) unless another thread just did."""
        if capturing():
            raise PlanDuringCaptureError(
                f"frost needs a new plan for {describe(declare, args)} while the current stream captures a CUDA "
                f"graph; planning is host work that capture cannot record. Run the same call once before capture "
                f"(a warm-up step) so its plan is cached; torch.compile's mode='reduce-overhead' warms up by itself."
            )
        with self._build_lock:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None:
                    self.stats.hits += 1
                    return entry
            t0 = time.perf_counter()
            entry = declare(*args)
            entry.plan_seconds = time.perf_counter() - t0
            entry.used = next(TICKS)
            with self._lock:
                self.stats.misses += 1
                self.stats.plan_seconds += entry.plan_seconds
                specs = self.stats.specializations
                specs[entry.spec] = specs.get(entry.spec, 0) + 1
                self._entries[key] = entry
                self._evict_to(self.max_size)
        return entry

    def resize(self, max_size: int) -> None:
        with self._lock:
            self.max_size = max(int(max_size), 1)
            self._evict_to(self.max_size)

    def clear(self) -> None:
        with self._lock:
            for entry in self._entries.values():
                entry.live = False
            self._entries.clear()
            self.memo.clear()
            self.stats = CacheStats()

    def entries(self) -> list[Planned]:
        """The cached entries, least recently used first."""
        with self._lock:
            return sorted(self._entries.values(), key=lambda e: e.used)

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
    return {
        "size": len(PLANS),
        "max_size": PLANS.max_size,
        "hits": s.hits,
        "misses": s.misses,
        "evictions": s.evictions,
        "plan_seconds": s.plan_seconds,
        "specializations": dict(s.specializations),
    }


def describe(declare, args) -> str:
    """Names a call that needs a plan: what `declare` plans and the shapes and dtypes of its first tensors."""
    what = getattr(declare, "what", declare.__name__)
    tensors = [a for a in args[:4] if isinstance(a, torch.Tensor)]
    return f"{what} on " + ", ".join(f"{tuple(t.shape)}/{t.dtype}" for t in tensors)
