"""Workspace carving: scratch views cut from the caller's workspace, never allocated by frost."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from frost.errors import WorkspaceError

ALIGN = 256


def align_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class ScratchBuffer:
    name: str
    dtype: str  # torch dtype name, e.g. "float32"
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        size = {"float32": 4, "int32": 4, "float16": 2, "bfloat16": 2, "uint8": 1, "int64": 8, "float64": 8}
        n = 1
        for s in self.shape:
            n *= int(s)
        return n * size[self.dtype]


def layout_bytes(buffers) -> int:
    """Closed-form workspace size of a scratch layout (each buffer 256-byte aligned)."""
    return sum(align_up(b.nbytes) for b in buffers)


def layout_offsets(buffers, start: int = 0) -> dict:
    """{buffer name: its byte offset} of a scratch layout carved from byte `start` (what `carve` cuts)."""
    at, off = {}, start
    for b in buffers:
        at[b.name] = off
        off += align_up(b.nbytes)
    return at


def check_workspace(workspace, needed: int, device=None) -> None:
    if needed == 0:
        return
    import torch

    if workspace is None:
        raise WorkspaceError(
            f"this plan needs a workspace of {needed} bytes; got None "
            f"(allocate torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device=...))"
        )
    if not isinstance(workspace, torch.Tensor):
        raise WorkspaceError(f"workspace must be a torch.Tensor of uint8, got {type(workspace).__name__}")
    if workspace.dtype != torch.uint8 or not workspace.is_contiguous():
        raise WorkspaceError(
            f"workspace must be a contiguous uint8 tensor, got {workspace.dtype} "
            f"(contiguous={workspace.is_contiguous()})"
        )
    if workspace.numel() < needed:
        raise WorkspaceError(f"workspace too small: this plan needs {needed} bytes, got {workspace.numel()}")
    if workspace.data_ptr() % ALIGN != 0:
        raise WorkspaceError(f"workspace must be {ALIGN}-byte aligned; its address is {workspace.data_ptr():#x}")
    if device is not None and workspace.device != device:
        raise WorkspaceError(f"workspace is on {workspace.device}, the plan's tensors are on {device}")


def carve(workspace, buffers, *, checked: bool = False, start: int = 0) -> dict:
    """Views into `workspace` for each buffer, in order from byte `start` (256-byte aligned), each 256-byte
    aligned. No allocation.

    `checked`: the caller has already validated the workspace against a size at least
    `start + layout_bytes(buffers)` (the binder checks the plan's closed form on every execute).
    """
    import torch

    if not checked:
        check_workspace(workspace, start + layout_bytes(buffers))
    at, views = layout_offsets(buffers, start), {}
    for b in buffers:
        off = at[b.name]
        views[b.name] = workspace[off : off + b.nbytes].view(getattr(torch, b.dtype)).view(b.shape)
    return views


class CarvedViews:
    """The views `carve` cuts for a plan-time layout, re-carved only when the caller's workspace changes.

    `derive` (optional): views -> {name: tensor} of further views of them, made with the carve and kept beside it.
    It holds no view once the caller's workspace tensor is gone, so it never keeps workspace memory alive.
    """

    __slots__ = ("buffers", "start", "derive", "_cached", "__weakref__")

    def __init__(self, buffers, start: int = 0, derive=None):
        self.buffers = tuple(buffers)
        self.start = start
        self.derive = derive
        self._cached = None  # (weakref to the workspace, its address, the views)

    @property
    def held(self) -> bool:
        return self._cached is not None

    def __call__(self, workspace) -> dict:
        """The views of `workspace` (already checked against the plan's size by the binder)."""
        cached = self._cached
        if cached is not None and cached[0]() is workspace and cached[1] == workspace.data_ptr():
            return cached[2]
        views = carve(workspace, self.buffers, checked=True, start=self.start)
        if self.derive is not None:
            views.update(self.derive(views))
        me = weakref.ref(self)

        def forget(ref, me=me):
            owner = me()
            if owner is not None and (owner._cached or (None,))[0] is ref:
                owner._cached = None

        self._cached = (weakref.ref(workspace, forget), workspace.data_ptr(), views)
        return views
