"""Execute-time binding: check each bound tensor against its declaration. Checks only, no copies."""
from __future__ import annotations

import operator
from typing import NamedTuple, Optional

from frost.errors import BindingError
from frost.ir.facts import IO_TENSOR_ROLES
from frost.runtime.aliasing import AliasGuard, span_length
from frost.runtime.device import check_device
from frost.ir.tensor import Tensor

# roles whose first dim is the packed token count in THD graphs, by token group
THD_Q_ROLES = ("q", "o", "dO", "dQ", "stats", "score_max", "score_sum_exp")
THD_KV_ROLES = ("k", "v", "dK", "dV")


def _who(role: str, t: Tensor) -> str:
    return f"tensor {t.name!r} ({role})" if t.name != role else f"tensor {t.name!r}"


def lookup(variant_pack: dict, decl: Tensor):
    """Find a declared tensor in a variant pack keyed by handle, uid or name."""
    for key in (decl, decl.uid, decl.name):
        try:
            if key in variant_pack:
                return variant_pack[key]
        except TypeError:
            continue
    return None


def check_tensor(role: str, decl: Tensor, t, *, device, is_thd: bool, vector_bytes: int):
    import torch

    if t is None:
        raise BindingError(f"{_who(role, decl)} is missing from the variant pack (key it by the tensor handle, "
                           f"its uid {decl.uid} or its name)")
    if not isinstance(t, torch.Tensor):
        raise BindingError(f"{_who(role, decl)}: expected a torch.Tensor, got {type(t).__name__}")
    want = decl.data_type.to_torch()
    if t.dtype != want:
        raise BindingError(f"{_who(role, decl)}: declared {want}, bound {t.dtype}")
    if device is not None and t.device != device:
        raise BindingError(f"{_who(role, decl)}: on {t.device}, expected {device}")
    dims, strides = tuple(decl.dim), tuple(decl.stride)
    got_dims, got_strides = tuple(t.shape), tuple(t.stride())
    thd_token = is_thd and (role in THD_Q_ROLES or role in THD_KV_ROLES)
    if thd_token:
        ok = len(got_dims) == len(dims) and got_dims[1:] == dims[1:] and got_dims[0] <= dims[0]
        if not ok:
            raise BindingError(f"{_who(role, decl)}: declared dim {dims} (packed tokens up to {dims[0]}), "
                               f"bound {got_dims}")
    elif got_dims != dims:
        raise BindingError(f"{_who(role, decl)}: declared dim {dims}, bound {got_dims}")
    for axis, (d, s, gs) in enumerate(zip(got_dims, strides, got_strides)):
        if d <= 1 or s == gs:
            continue
        derived = thd_token and s == dims[0] and gs == got_dims[0]  # e.g. head-major THD stats
        if not derived:
            raise BindingError(f"{_who(role, decl)}: declared strides {strides}, bound {got_strides} "
                               f"(dim {got_dims}); frost never copies to fix a layout")
    if vector_bytes > 1 and t.numel() > 0 and t.data_ptr() % vector_bytes != 0:
        raise BindingError(f"{_who(role, decl)}: address {t.data_ptr():#x} is not {vector_bytes}-byte aligned")
    return t


def check_thd_totals(bound: dict) -> None:
    """The packed totals of one token group must agree across its tensors."""
    for group in (THD_Q_ROLES, THD_KV_ROLES):
        seen = {r: bound[r].shape[0] for r in group if r in bound}
        if len(set(seen.values())) > 1:
            raise BindingError(f"packed token counts disagree: {seen}")


def _stride_picker(dims: tuple):
    """A C-level getter of the strides of a tensor's non-unit dims (the only ones that address memory)."""
    nonunit = [i for i, d in enumerate(dims) if d > 1]
    return operator.itemgetter(*nonunit) if nonunit else (lambda strides: ())


_CUDA_DEVICES: dict = {}


class TensorSpec(NamedTuple):
    """What the binder's fast path compares one bound tensor with, computed at plan time."""

    role: str
    decl: object  # the declared tensor (frost.ir.tensor.Tensor)
    dtype: object  # its torch dtype
    dims: tuple
    packed: bool  # a packed token dim, bound up to its envelope dims[0]
    strides: tuple  # as declared
    pick: object  # strides -> the non-unit dims' strides
    picked: tuple  # pick(strides)
    misalign: int  # address bits that must be clear (the vector width less one)


def matches_spec(t, spec: TensorSpec, device: int, first):
    """The fast path's test of one tensor against a `Binder` spec: dtype, dims (a packed token dim up to its
    envelope), declared strides (the non-unit dims'), device index (off the GPU: the device `first`) and
    alignment. Its address + 1 when it passes (always true; the aliasing check reads it), False for
    anything else, which `check_tensor` then judges."""
    _, _, dtype, dims, packed, strides, pick, picked, misalign = spec
    try:
        # the whole stride tuple as declared is the common case; comparing it costs less than
        # picking out the non-unit dims' strides
        return (t.dtype is dtype
                and ((shape := t.shape) == dims or (packed and shape[1:] == dims[1:] and 0 <= shape[0] <= dims[0]))
                and ((st := t.stride()) == strides or pick(st) == picked) and t.get_device() == device
                and (device >= 0 or t.device == first) and not (p := t.data_ptr()) & misalign and p + 1)
    except (AttributeError, IndexError, TypeError):  # not keyed by handle, or not a tensor
        return False


def _cuda_device(index: int):
    """torch.device("cuda", index), made once per index."""
    d = _CUDA_DEVICES.get(index)
    if d is None:
        import torch

        d = _CUDA_DEVICES[index] = torch.device("cuda", index)
    return d


class Binder:
    """Built once per plan: binds a variant pack with one cheap comparison per tensor.

    The fast path compares dtype, dims (packed token dims up to their
    envelope), the strides of non-unit dims, device index and alignment against
    values precomputed at plan time (under 1 us per tensor); anything else goes
    through `check_tensor`, which accepts the remaining legal variations or
    raises the detailed error.
    """

    def __init__(self, roles: dict, *, vector_bytes: int, is_thd: bool, wants_cuda: bool, engine: str,
                 workspace_size: int, device: Optional[int] = None):
        self.device = device  # the plan's CUDA device (frost/runtime/device.py), None off the GPU
        self.is_thd = is_thd
        self.wants_cuda = wants_cuda
        self.engine = engine
        self.workspace_size = workspace_size  # the plan's closed form, fixed at plan time
        self.specs = []
        for role, decl in roles.items():
            vec = vector_bytes if role in IO_TENSOR_ROLES else (4 if vector_bytes > 1 else 1)
            dims, strides = tuple(decl.dim), tuple(decl.stride)
            pick = _stride_picker(dims)  # a unit dim's stride is free: compare the others only
            packed = is_thd and (role in THD_Q_ROLES or role in THD_KV_ROLES)  # token dim up to dims[0]
            dtype = decl.data_type.to_torch()
            self.specs.append(TensorSpec(role, decl, dtype, dims, packed, strides, pick, pick(strides), vec - 1))
        self.aliasing = self.alias_guard(self.specs)

    def alias_guard(self, specs) -> AliasGuard:
        """The aliasing check (`aliasing.py`) for tensors given in the order of `specs`."""
        return AliasGuard([_who(s.role, s.decl) for s in specs],
                          [bool(s.decl.is_output or s.decl.is_virtual) for s in specs],
                          [None if s.packed else span_length(s.dims, s.strides, s.dtype.itemsize) for s in specs],
                          self.workspace_size)

    def bind(self, variant_pack: dict, workspace) -> dict:
        get = variant_pack.get
        device, first = self._first_device(variant_pack)
        bound = {}
        ptrs = []  # addresses + 1 of the tensors that matched their declaration
        for spec in self.specs:
            role, decl = spec.role, spec.decl
            t = get(decl)
            p = matches_spec(t, spec, device, first)
            if p:
                bound[role] = t
                ptrs.append(p)
                continue
            bound[role] = check_tensor(role, decl, lookup(variant_pack, decl), device=first, is_thd=self.is_thd,
                                       vector_bytes=spec.misalign + 1)
        if self.is_thd:
            check_thd_totals(bound)
        need = self.workspace_size
        if need:
            from frost.runtime.workspace import check_workspace

            check_workspace(workspace, need, first)
        if len(ptrs) != len(bound):  # an output sharing memory with another tensor or the workspace raises
            self.aliasing.full(bound.values(), workspace)
        else:
            self.aliasing.fast(ptrs, bound.values(), workspace)
        return bound

    def _first_device(self, variant_pack: dict):
        """(device index, device) every tensor must share: the first declared tensor's (-1 = off the GPU).

        The fast path compares indices on the GPU; the device object (one per index, made once) serves
        the detailed checks and the CPU path.
        """
        decl = self.specs[0].decl
        t = variant_pack.get(decl)
        if t is None:
            t = lookup(variant_pack, decl)
        try:
            index = t.get_device()
        except AttributeError:
            return None, None  # the loop's slow path reports it
        if index < 0:
            if self.wants_cuda:
                raise BindingError(f"engine {self.engine} runs on the GPU; tensors are on {t.device} "
                                   f"(first: {decl.name!r})")
            return index, t.device
        if index != self.device and self.device is not None:
            check_device(index, self.device, _who(self.specs[0].role, decl))
        return index, _cuda_device(index)
