"""frost's compiled-kernel cache, publicly: counters and housekeeping.

Compiled kernels persist under $FROST_CACHE_DIR (default: the user's cache dir,
$XDG_CACHE_HOME/frost or ~/.cache/frost; private, see docs/troubleshooting.md), capped
at $FROST_CACHE_MAX_BYTES (default 2 GiB); FROST_CACHE_DISABLE=1 keeps them in
memory only. `stats()` counts this process's hits, misses, compiles and the
seconds spent loading and compiling. Importing this module does not import cutlass.
"""

from __future__ import annotations

from frost.compiler.cache import cache_dir, clear, describe, disk_enabled, max_bytes, prune, reset_stats, stats

__all__ = ["stats", "reset_stats", "cache_dir", "disk_enabled", "max_bytes", "describe", "prune", "clear"]
