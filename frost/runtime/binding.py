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


def _check_identity(role: str, decl: Tensor, t, device) -> None:
    """What every bound tensor must be, whatever its shape: present, a torch tensor of the declared dtype, on the
    plan's device."""
    import torch

    if t is None:
        raise BindingError(
            f"{_who(role, decl)} is missing from the variant pack (key it by the tensor handle, "
            f"its uid {decl.uid} or its name)"
        )
    if not isinstance(t, torch.Tensor):
        raise BindingError(f"{_who(role, decl)}: expected a torch.Tensor, got {type(t).__name__}")
    want = decl.data_type.to_torch()
    if t.dtype != want:
        raise BindingError(f"{_who(role, decl)}: declared {want}, bound {t.dtype}")
    if device is not None and t.device != device:
        raise BindingError(f"{_who(role, decl)}: on {t.device}, expected {device}")


def check_tensor(role: str, decl: Tensor, t, *, device, is_thd: bool, vector_bytes: int):
    _check_identity(role, decl, t, device)
    dims, strides = tuple(decl.dim), tuple(decl.stride)
    got_dims, got_strides = tuple(t.shape), tuple(t.stride())
    thd_token = is_thd and (role in THD_Q_ROLES or role in THD_KV_ROLES)
    if thd_token:
        ok = len(got_dims) == len(dims) and got_dims[1:] == dims[1:] and got_dims[0] <= dims[0]
        if not ok:
            raise BindingError(
                f"{_who(role, decl)}: declared dim {dims} (packed tokens up to {dims[0]}), bound {got_dims}"
            )
    elif got_dims != dims:
        raise BindingError(f"{_who(role, decl)}: declared dim {dims}, bound {got_dims}")
    for axis, (d, s, gs) in enumerate(zip(got_dims, strides, got_strides)):
        if d <= 1 or s == gs:
            continue
        derived = thd_token and s == dims[0] and gs == got_dims[0]  # e.g. head-major THD stats
        if not derived:
            raise BindingError(
                f"{_who(role, decl)}: declared strides {strides}, bound {got_strides} "
                f"(dim {got_dims}); frost never copies to fix a layout"
            )
    if vector_bytes > 1 and t.numel() > 0 and t.data_ptr() % vector_bytes != 0:
        raise BindingError(f"{_who(role, decl)}: address {t.data_ptr():#x} is not {vector_bytes}-byte aligned")
    return t


def check_thd_totals(bound: dict) -> None:
    """The packed totals of one token group must agree across its tensors."""
    for group in (THD_Q_ROLES, THD_KV_ROLES):
        seen = {r: bound[r].shape[0] for r in group if r in bound}
        if len(set(seen.values())) > 1:
            raise BindingError(f"packed token counts disagree: {seen}")


class RaggedSpec(NamedTuple):
    """A tensor declared in cuDNN's ragged form, (B, H, S, D) with a ragged offset: what its memory must hold."""

    dims: tuple  # as declared, (B, H, S, D)
    strides: tuple  # as declared; the S stride is the token stride
    tokens: int  # the declared max_total_seq_len_* the memory must cover (1 where none is declared)


def ragged_specs(facts, node) -> dict:
    """{role: RaggedSpec} of a graph's ragged-declared tensors (empty for other graphs).

    Without `max_total_seq_len_q/kv` the tokens a buffer needs depend on offsets only the device holds (cuDNN's
    forward has no such keyword), so one token is all that is checked then."""
    r = getattr(facts, "ragged", None)
    if r is None:
        return {}
    a = node.attrs
    declared = {t.name: t for t in r.declared}
    out = {}
    for role, _ in r.token_strides:
        t = declared[role]
        total = a.max_total_seq_len_q if role in THD_Q_ROLES else a.max_total_seq_len_kv
        out[role] = RaggedSpec(tuple(t.dim), tuple(t.stride), total or 1)
    return out


def _ragged_tokens(role: str, decl: Tensor, t, spec: RaggedSpec) -> int:
    """How many whole tokens of the declared (H, D) layout `t`'s memory holds from its first element.

    A 3-d buffer must be (T, H, D) with the declared token, head and dim strides; any other shape must be
    contiguous (its elements are the memory)."""
    _, h, _, d = spec.dims
    _, hs, ts, ds = spec.strides
    got_dims, got_strides = tuple(t.shape), tuple(t.stride())
    if t.dim() == 3:
        if got_dims[1:] != (h, d) or any(n > 1 and a != b for n, a, b in zip(got_dims, got_strides, (ts, hs, ds))):
            raise BindingError(
                f"{_who(role, decl)}: declared (B, H, S, D) {spec.dims} in the ragged form, tokens "
                f"(H, D) = ({h}, {d}) with strides (S, H, D) = ({ts}, {hs}, {ds}); bound {got_dims} "
                f"with strides {got_strides}, which hold tokens of another layout"
            )
        return got_dims[0]
    if not t.is_contiguous():
        raise BindingError(
            f"{_who(role, decl)}: bound {got_dims} with strides {got_strides} to a ragged "
            f"declaration; bind the packed tokens as (T, {h}, {d}) or a contiguous buffer"
        )
    token = (h - 1) * hs + (d - 1) * ds + 1  # the elements one token spans
    n = t.numel()
    return 0 if n < token else (n - token) // ts + 1


def bind_ragged(role: str, decl: Tensor, t, spec: RaggedSpec, *, device, vector_bytes: int):
    """A tensor bound to a ragged-declared one whose shape is not the declared (B, H, S, D): the packed buffer
    (T, H, D) cuDNN programs allocate, or any buffer holding the tokens as declared (cuDNN binds by pointer).

    Checks dtype, device, alignment, the layout of its tokens and that it holds `spec.tokens` tokens; returns a
    view of its memory as (B, H, S', D) with the declared strides (a zero batch stride: the offsets place the
    batches), S' the tokens it holds. A view, never a copy; nothing is read."""
    _check_identity(role, decl, t, device)
    if vector_bytes > 1 and t.numel() > 0 and t.data_ptr() % vector_bytes != 0:
        raise BindingError(f"{_who(role, decl)}: address {t.data_ptr():#x} is not {vector_bytes}-byte aligned")
    tokens = _ragged_tokens(role, decl, t, spec)
    if tokens < spec.tokens:
        raise BindingError(
            f"{_who(role, decl)}: the bound {tuple(t.shape)} buffer holds {tokens} tokens of the "
            f"declared layout; the ragged form needs {spec.tokens} (max_total_seq_len)"
        )
    b, h, _, d = spec.dims
    _, hs, ts, ds = spec.strides
    return t.as_strided((b, h, tokens, d), (0, hs, ts, ds), t.storage_offset())


def unit_dims_view(decl: Tensor, t):
    """`t` as the declared dims when the two differ only in dims of extent 1 (cuDNN binds by pointer: a (B + 1,)
    offsets tensor for a declared (B + 1, 1, 1, 1), a (B, H, S) Stats for (B, H, S, 1)): the same elements at the
    same addresses, the non-unit dims' strides as declared. A view of its memory, or None where they differ
    otherwise."""
    shape = getattr(t, "shape", None)
    if shape is None or tuple(shape) == tuple(decl.dim):
        return None
    dims, strides = tuple(decl.dim), tuple(decl.stride)
    want = [(d, s) for d, s in zip(dims, strides) if d != 1]
    got = [(d, s) for d, s in zip(shape, t.stride()) if d != 1]
    if want != got:
        return None
    return t.as_strided(dims, strides, t.storage_offset())


#: the bound dict's entry {"q": tokens, "kv": tokens}: the fewest tokens a packed buffer bound to a ragged
#: declaration holds in each token group (present only when one was bound so); kernels take the smaller of it and
#: the plan's envelope as T, so no load reaches past the memory bound
RAGGED_TOKENS = "ragged_tokens"


def ragged_tokens(bound: dict, roles) -> dict:
    """The RAGGED_TOKENS entry for the `roles` bound through `bind_ragged` (their views' S is the tokens held)."""
    out = {}
    for role in roles:
        group = "q" if role in THD_Q_ROLES else "kv"
        n = bound[role].shape[2]
        out[group] = min(out.get(group, n), n)
    return out


def ragged_totals(facts, bound: dict) -> dict:
    """The ragged form's T of each token group: the plan's envelope, or fewer where a packed buffer bound by
    pointer holds fewer tokens (the binder's RAGGED_TOKENS), so the kernels' (T, H, D) views and their loads
    stay inside the bound memory. Tensor metadata only, read on the host."""
    held = bound.get(RAGGED_TOKENS)
    if held is None:
        return {"total_q": facts.total_q, "total_kv": facts.total_kv}
    return {
        "total_q": min(facts.total_q, held.get("q", facts.total_q)),
        "total_kv": min(facts.total_kv, held.get("kv", facts.total_kv)),
    }


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
        return (
            t.dtype is dtype
            and ((shape := t.shape) == dims or (packed and shape[1:] == dims[1:] and 0 <= shape[0] <= dims[0]))
            and ((st := t.stride()) == strides or pick(st) == picked)
            and t.get_device() == device
            and (device >= 0 or t.device == first)
            and not (p := t.data_ptr()) & misalign
            and p + 1
        )
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

    def __init__(
        self,
        roles: dict,
        *,
        vector_bytes: int,
        is_thd: bool,
        wants_cuda: bool,
        engine: str,
        workspace_size: int,
        ragged: dict = None,
        device: Optional[int] = None,
    ):
        self.device = device  # the plan's CUDA device (frost/runtime/device.py), None off the GPU
        self.is_thd = is_thd
        self.ragged = ragged or {}  # role -> RaggedSpec: cuDNN's ragged form, bound by pointer (bind_ragged)
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
        return AliasGuard(
            [_who(s.role, s.decl) for s in specs],
            [bool(s.decl.is_output or s.decl.is_virtual) for s in specs],
            [None if s.packed else span_length(s.dims, s.strides, s.dtype.itemsize) for s in specs],
            self.workspace_size,
        )

    def bind(self, variant_pack: dict, workspace) -> dict:
        get = variant_pack.get
        device, first = self._first_device(variant_pack)
        bound = {}
        ptrs = []  # addresses + 1 of the tensors that matched their declaration
        by_pointer = []
        for spec in self.specs:
            role, decl = spec.role, spec.decl
            t = get(decl)
            p = matches_spec(t, spec, device, first)
            if p:
                bound[role] = t
                ptrs.append(p)
                continue
            t = lookup(variant_pack, decl)
            rspec = self.ragged.get(role)
            if rspec is not None and getattr(t, "shape", None) != spec.dims:
                bound[role] = bind_ragged(role, decl, t, rspec, device=first, vector_bytes=spec.misalign + 1)
                by_pointer.append(role)
                continue
            view = None if spec.packed else unit_dims_view(decl, t)
            if view is not None:
                t = view
            bound[role] = check_tensor(role, decl, t, device=first, is_thd=self.is_thd, vector_bytes=spec.misalign + 1)
        if self.is_thd:
            check_thd_totals(bound)
        need = self.workspace_size
        if need:
            from frost.runtime.workspace import check_workspace

            check_workspace(workspace, need, first)
        # an output sharing memory with another tensor or the workspace raises (spans of ragged buffers from
        # their (B, H, S', D) views: their own storage offset, sizes and strides)
        aliasing = self.aliasing
        if len(ptrs) != len(bound):
            aliasing.full(list(bound.values()), workspace)
        elif ptrs != aliasing.clear or need or aliasing.exact:  # else: these very addresses were found clear
            aliasing.fast(ptrs, bound.values(), workspace)
        if by_pointer:
            bound[RAGGED_TOKENS] = ragged_tokens(bound, by_pointer)
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
                raise BindingError(
                    f"engine {self.engine} runs on the GPU; tensors are on {t.device} (first: {decl.name!r})"
                )
            return index, t.device
        if index != self.device and self.device is not None:
            check_device(index, self.device, _who(self.specs[0].role, decl))
        return index, _cuda_device(index)
