"""Is a usable CuTe DSL installed? Answered from package metadata, without importing cutlass."""

from __future__ import annotations

import functools
from importlib import metadata
from typing import Optional

MIN_DSL = (4, 8, 1)


def _parse(v: str) -> tuple:
    out = []
    for part in v.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def dsl_decline_reason() -> Optional[str]:
    """None when nvidia-cutlass-dsl >= 4.8.1 and apache-tvm-ffi are installed, else why not."""
    want = ".".join(map(str, MIN_DSL))
    try:
        have = metadata.version("nvidia-cutlass-dsl")
    except metadata.PackageNotFoundError:
        return f"needs nvidia-cutlass-dsl >= {want}, which is not installed (pip install 'frost[kernels]')"
    if _parse(have) < MIN_DSL:
        return f"needs nvidia-cutlass-dsl >= {want}; found {have}"
    try:
        metadata.version("apache-tvm-ffi")
    except metadata.PackageNotFoundError:
        return "needs apache-tvm-ffi, which is not installed (pip install 'frost[kernels]')"
    return None
