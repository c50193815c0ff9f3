"""frost's compiled-kernel cache, publicly: counters and housekeeping.

Compiled kernels persist under $FROST_CACHE_DIR (default ~/.cache/frost), capped
at $FROST_CACHE_MAX_BYTES (default 2 GiB); FROST_CACHE_DISABLE=1 keeps them in
memory only. `stats()` counts this process's hits, misses, compiles and the
seconds spent loading and compiling. Importing this module does not import cutlass.
"""
from __future__ import annotations

from typing import Optional

from frost.engines.cache import cache_dir, describe, disk_enabled, max_bytes, reset_stats, stats

__all__ = ["stats", "reset_stats", "cache_dir", "disk_enabled", "max_bytes", "describe", "prune", "clear"]


def prune(limit: Optional[int] = None) -> int:
    """Apply the size cap now (stale fingerprints first, then least recently used); returns evictions."""
    from frost.engines.cache import disk

    dc = disk()
    return dc.prune(limit) if dc is not None else 0


def clear() -> None:
    """Delete every cached artifact (all fingerprints) under the cache directory."""
    from frost.engines.cache import disk

    dc = disk()
    if dc is not None:
        dc.clear()
