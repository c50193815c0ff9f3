"""ExecutionContext and stream resolution.

A stream may be a torch stream, a `cuda.bindings` CUstream, a raw integer
handle, or None (torch's current stream). Raw handles 0 and 1 mean the default
stream. Every launch and every torch operation on the execute path uses the
resolved stream.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class ExecutionContext:
    stream: Any = None
    handle: Optional[Any] = None  # accepted for cuDNN-style call sites; frost needs none


class Handle:
    """cuDNN's handle, as far as frost needs one: the stream its executes launch on.

    A new handle launches on the default stream (raw 0), as a new cuDNN handle does, until
    `set_stream(handle, stream)`; `execute(pack, workspace, handle)` then launches on that stream.
    `int(handle)` is its id: cuDNN programs that keep the integer can pass that back.
    """

    __slots__ = ("_stream", "_id", "__weakref__")

    def __init__(self):
        self._stream = 0
        self._id = next(_HANDLE_IDS)
        _HANDLES[self._id] = self

    @property
    def stream(self) -> int:
        if self._stream is None:
            raise ValueError(f"frost handle {self._id} was destroyed (destroy_handle)")
        return self._stream

    def __int__(self) -> int:
        return self._id

    __index__ = __int__

    def __repr__(self) -> str:
        state = "destroyed" if self._stream is None else f"stream={self._stream:#x}"
        return f"frost.Handle({self._id}, {state})"


_HANDLE_IDS = itertools.count(1)
_HANDLES: "weakref.WeakValueDictionary[int, Handle]" = weakref.WeakValueDictionary()


def as_handle(handle: Any) -> Handle:
    """A Handle from a Handle or the int id of a live one; anything else raises TypeError."""
    if isinstance(handle, Handle):
        return handle
    if isinstance(handle, int) and not isinstance(handle, bool):
        found = _HANDLES.get(handle)
        if found is not None:
            return found
    raise TypeError(
        f"not a frost handle: {handle!r} (make one with create_handle(); to launch on a stream pass "
        f"frost.ExecutionContext(stream=...))"
    )


def create_handle() -> Handle:
    """cuDNN's create_handle(): a handle whose executes launch on the default stream until set_stream."""
    return Handle()


def set_stream(handle: Any, stream: Any) -> None:
    """cuDNN's set_stream(handle, stream): executes given this handle launch on `stream` (any accepted stream)."""
    h = as_handle(handle)
    h.stream  # noqa: B018  (raises when destroyed)
    if stream is None:
        raise TypeError("set_stream: stream must be a stream (a torch stream, a CUstream or an int handle), not None")
    h._stream = stream_handle(stream)


def get_stream(handle: Any) -> int:
    """cuDNN's get_stream(handle): the raw stream handle executes given this handle launch on (0 = default)."""
    return as_handle(handle).stream


def destroy_handle(handle: Any) -> None:
    """cuDNN's destroy_handle(handle): later executes with it raise."""
    h = as_handle(handle)
    h._stream = None
    _HANDLES.pop(h._id, None)


def launch_stream(launch: Any) -> Any:
    """The stream an execute launches on, from what it was given: an ExecutionContext, a Handle (or its id),
    or None (torch's current stream). A context without a stream but with a handle uses the handle's."""
    if launch is None:
        return None
    if isinstance(launch, ExecutionContext):
        if launch.stream is None and launch.handle is not None:
            return as_handle(launch.handle).stream
        return launch.stream
    try:
        return as_handle(launch).stream
    except TypeError:
        raise TypeError(
            f"execute: expected a handle from create_handle() or a frost.ExecutionContext, got {launch!r}"
        ) from None


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
