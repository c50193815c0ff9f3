"""ExecutionContext and stream resolution.

A stream may be a torch stream, a `cuda.bindings` CUstream, a raw integer
handle, or None (torch's current stream). Raw handles 0 and 1 mean the default
stream. Every launch and every torch operation on the execute path uses the
resolved stream.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class ExecutionContext:
    stream: Any = None
    handle: Optional[Any] = None  # accepted for cuDNN-style call sites; frost needs none


def stream_handle(stream: Any) -> int:
    """The raw integer handle of any accepted stream object (0 = default stream)."""
    if stream is None:
        return _CURRENT_RAW() if _CURRENT_RAW is not None else _current_stream()
    if isinstance(stream, (bool, str, bytes, float)):
        raise TypeError(f"not a stream: {stream!r} (use a torch stream, a CUstream, an int handle or None)")
    return _normalized(stream if isinstance(stream, int) else _raw_handle(stream), stream)


_CURRENT_RAW = None  # torch's C getter of the current stream, or a stand-in without CUDA; set at first use


def _current_stream() -> int:
    """torch's current stream on the current device (0 without CUDA), through torch's C entry points."""
    global _CURRENT_RAW
    if _CURRENT_RAW is None:
        _CURRENT_RAW = _current_stream_getter()
    return _CURRENT_RAW()


def _current_stream_getter():
    import torch

    if not torch.cuda.is_available():  # fixed for the process's lifetime
        return lambda: 0
    raw, device = getattr(torch._C, "_cuda_getCurrentRawStream", None), getattr(torch._C, "_cuda_getDevice", None)
    if raw is None or device is None:  # older torch: the public, slower path
        return lambda: int(torch.cuda.current_stream().cuda_stream)
    return lambda: raw(device())


def _raw_handle(stream: Any) -> int:
    raw = getattr(stream, "cuda_stream", None)  # torch.cuda.Stream / ExternalStream
    if raw is not None:
        return int(raw)
    try:
        return int(stream)  # cuda.bindings CUstream supports int()
    except (TypeError, ValueError):
        pass
    getptr = getattr(stream, "getPtr", None)
    if getptr is not None:
        return int(getptr())
    raise TypeError(f"not a stream: {stream!r} (use a torch stream, a CUstream, an int handle or None)")


def _normalized(handle: int, stream: Any) -> int:
    """Raw handles 0 and 1 (the legacy default stream) both mean the default stream, 0."""
    if handle < 0:
        raise ValueError(f"stream handle must be >= 0, got {handle} from {stream!r}")
    return 0 if handle in (0, 1) else handle


def torch_stream(stream: Any, device=None):
    """A torch stream object for the same stream, for torch work on the execute path."""
    import torch

    if isinstance(stream, torch.cuda.Stream):
        return stream
    h = stream_handle(stream)
    if h == 0:
        return torch.cuda.default_stream(device)
    return torch.cuda.ExternalStream(h, device=device)


@contextlib.contextmanager
def on_stream(stream: Any, device=None):
    """Run torch operations on `stream` (no-op on CPU)."""
    import torch

    if device is not None and getattr(device, "type", str(device)) == "cpu":
        yield
        return
    if not torch.cuda.is_available():
        yield
        return
    with torch.cuda.device(device), torch.cuda.stream(torch_stream(stream, device)):
        yield
