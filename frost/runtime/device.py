"""The plan's device: bound tensors must live on it, and launches run with it current.

A plan built for a GPU records the CUDA device current at `build_plans` (`plan_device`). Execute
raises a BindingError when the bound tensors are on another device (a kernel launched on device 0
with device 1's pointers faults, or worse), and launches under a device guard when the caller's
current device is another one (as FlashAttention does), so the launch stream is the plan device's.
The guard costs one C call to read the current device when nothing needs switching.
"""

from __future__ import annotations

import contextlib
from typing import Optional

from frost.errors import BindingError


def plan_device(target) -> Optional[int]:
    """The CUDA device index a plan for `target` runs on: the current one, or None (CPU, or no CUDA here)."""
    if target.is_cpu:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.current_device()


def _getter():
    import torch

    get = getattr(torch._C, "_cuda_getDevice", None)
    return get if get is not None else torch.cuda.current_device


def check_device(index: int, want: Optional[int], who: str) -> None:
    """Raise when tensors on CUDA device `index` (-1: not on a GPU) are bound to a plan for device `want`."""
    if want is not None and index >= 0 and index != want:
        raise BindingError(
            f"{who} is on cuda:{index}, but this plan was built for cuda:{want}; build a plan "
            f"on that device (torch.cuda.set_device({index}) before build_plans) or move the tensors"
        )


class DeviceGuard:
    """Run a launch with the plan's device current (switching only when another one is)."""

    __slots__ = ("index", "_get")

    def __init__(self, index: Optional[int]):
        self.index = index
        self._get = _getter() if index is not None else None

    def current(self) -> Optional[int]:
        return self._get() if self._get is not None else None

    def run(self, fn, *args) -> None:
        if self.index is None or self._get() == self.index:
            fn(*args)
            return
        with _switch(self.index):
            fn(*args)


@contextlib.contextmanager
def _switch(index: int):
    import torch

    with torch.cuda.device(index):
        yield
