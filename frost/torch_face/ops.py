"""frost's functional custom ops: `torch.ops.frost.sdpa_fwd / sdpa_bwd` (dense) and `sdpa_varlen_fwd /
sdpa_varlen_bwd` (packed), with fake kernels and autograd.

Every argument is explicit and none is mutated. Dense tensors are (B, H, S, D); packed ones (T, H, D)
with int32 `cu_seqlens` and static `max_seqlen` envelopes. The window is FlashAttention's (-1 is
unbounded, causal is right = 0) around the top-left or bottom-right diagonal. The forward returns
(out, lse): out `empty_like(q)` (q's layout), lse fp32 (B, H, S) dense or (H, T) packed. lse carries no
gradient. `deterministic` is the backward's (the forward only records it for autograd). The backward
returns (dq, dk, dv, dsinks); dsinks is (H,) fp32 with sinks and an empty (0,) tensor without.

The ops are registered through `torch.library.Library` rather than `torch.library.custom_op`, whose
Python wrappers cost tens of microseconds a call (its autograd kernel rebuilds the argument list
from the schema, looks the op up again to redispatch, and its backend kernel runs through a
`torch._dynamo.disable` wrapper and an aliasing check). Here each op has the same schema (pt2-compliant),
a `CompositeExplicitAutograd` kernel (the `block.py` call), a fake kernel and an `Autograd` kernel of its
own: it records the autograd node (forwards) or refuses a double backward (backwards), and runs the op's
kernel directly when nothing lies between autograd and the CPU/CUDA kernel (no mode, subclass or
functionalization: the dispatcher would call that same function), else redispatches below autograd
as any Autograd kernel does. `torch.library.opcheck` checks the registrations.

The lean path: in eager mode with nothing to trace (`lean(...)`: not compiling, no mode, no functorch
transform, plain tensors) the same autograd nodes are made without the dispatcher (`fwd_autograd`,
`varlen_fwd_autograd`) and their backwards call the backward kernels directly; the ops' Python kernels
(`sdpa_fwd`, `sdpa_bwd`, `sdpa_varlen_fwd`, `sdpa_varlen_bwd`) are the lean block calls of
context-parallel code (`torch.ops.frost.*` where `lean` says no). Both give the same outputs.
"""

from __future__ import annotations

import torch

from frost.torch_face import block

_LIB = torch.library.Library("frost", "DEF")  # kept for the process: the registrations live while it does

_FWD = (
    "(Tensor q, Tensor k, Tensor v, Tensor? sinks, float? scale, SymInt window_left, SymInt window_right, "
    "bool bottom_right, bool deterministic) -> (Tensor, Tensor)"
)
_BWD = (
    "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? sinks, float? scale, "
    "SymInt window_left, SymInt window_right, bool bottom_right, bool deterministic) "
    "-> (Tensor, Tensor, Tensor, Tensor)"
)
_VARLEN_FWD = (
    "(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, "
    "SymInt max_seqlen_k, Tensor? sinks, float? scale, SymInt window_left, SymInt window_right, "
    "bool bottom_right, bool deterministic) -> (Tensor, Tensor)"
)
_VARLEN_BWD = (
    "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens_q, "
    "Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, Tensor? sinks, float? scale, "
    "SymInt window_left, SymInt window_right, bool bottom_right, bool deterministic) "
    "-> (Tensor, Tensor, Tensor, Tensor)"
)

_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
_AFTER_AD_INPLACE = torch._C._after_ADInplaceOrView_keyset
_KERNEL_KEYS = frozenset((torch._C.DispatchKey.CPU, torch._C.DispatchKey.CUDA))
_below_autograd = torch._C._AutoDispatchBelowAutograd
_grad_enabled = torch._C.is_grad_enabled
_any_requires_grad = torch._C._any_requires_grad


def _kernel_is_next(keyset) -> bool:
    """Whether below autograd only the op's own CPU/CUDA kernel runs (ADInplaceOrView passes functional ops on)."""
    return (keyset & _AFTER_AD_INPLACE).highestPriorityTypeId() in _KERNEL_KEYS


def _define(name: str, schema: str, kernel, fake) -> object:
    _LIB.define(name + schema, tags=(torch.Tag.pt2_compliant_tag,))
    _LIB.impl(name, kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"frost::{name}", fake, lib=_LIB)
    return torch._C._dispatch_find_schema_or_throw(f"frost::{name}", "")


# the kernels: `block.py` (looked up per call, so a patched `block.forward` is what runs)
def sdpa_fwd(q, k, v, sinks, scale, window_left, window_right, bottom_right, deterministic):
    return block.forward(q, k, v, sinks, scale, window_left, window_right, bottom_right)


def _sdpa_fwd_fake(q, k, v, sinks, scale, window_left, window_right, bottom_right, deterministic):
    return block.out_like(q, v.shape[-1]), block.dense_lse(q)


#: the backward ops' kernels take the op's arguments as they are: the block calls themselves
sdpa_bwd = block.backward


def _sdpa_bwd_fake(dout, q, k, v, out, lse, sinks, scale, window_left, window_right, bottom_right, deterministic):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), block.dsinks_like(q, sinks)


def sdpa_varlen_fwd(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    sinks,
    scale,
    window_left,
    window_right,
    bottom_right,
    deterministic,
):
    return block.packed_forward(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        sinks,
        scale,
        window_left,
        window_right,
        bottom_right,
    )


def _sdpa_varlen_fwd_fake(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    sinks,
    scale,
    window_left,
    window_right,
    bottom_right,
    deterministic,
):
    return block.out_like(q, v.shape[-1]), block.packed_lse(q)


sdpa_varlen_bwd = block.packed_backward


def _sdpa_varlen_bwd_fake(
    dout,
    q,
    k,
    v,
    out,
    lse,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    sinks,
    scale,
    window_left,
    window_right,
    bottom_right,
    deterministic,
):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), block.dsinks_like(q, sinks)


_SDPA_FWD = _define("sdpa_fwd", _FWD, sdpa_fwd, _sdpa_fwd_fake)
_SDPA_BWD = _define("sdpa_bwd", _BWD, sdpa_bwd, _sdpa_bwd_fake)
_SDPA_VARLEN_FWD = _define("sdpa_varlen_fwd", _VARLEN_FWD, sdpa_varlen_fwd, _sdpa_varlen_fwd_fake)
_SDPA_VARLEN_BWD = _define("sdpa_varlen_bwd", _VARLEN_BWD, sdpa_varlen_bwd, _sdpa_varlen_bwd_fake)


def _lean_probes():
    """`lean(*tensors)`: may a call skip the dispatcher now? (Not compiling, no dispatch or function mode, no
    functorch transform, every tensor a plain `torch.Tensor`; None entries allowed.) Another torch: never."""
    try:
        modes = torch._C._len_torch_dispatch_stack
        fmodes = torch._C._is_torch_function_mode_enabled
        functorch = torch._C._functorch.peek_interpreter_stack
    except AttributeError:
        return lambda *tensors: False
    compiling = torch.compiler.is_compiling
    plain = torch.Tensor

    def lean(*tensors) -> bool:
        if compiling() or modes() or fmodes() or functorch() is not None:
            return False
        for t in tensors:
            if t is not None and type(t) is not plain:
                return False
        return True

    return lean


lean = _lean_probes()


def _below(handle, kernel, keyset, args):
    """The op below autograd: its kernel directly when nothing else would run first (or `keyset` is None: the
    lean path, no dispatcher), else a redispatch."""
    if keyset is None or _kernel_is_next(keyset):
        return kernel(*args)
    with _below_autograd():
        return handle.redispatch_boxed(keyset & _AFTER_AUTOGRAD, *args)


def overlaps(shape, stride) -> bool:
    """The graph's overlap rule (a declaration it refuses): some stride does not clear the span of a dim
    with a smaller or equal stride (size-1 dims aside). Pairwise, without sorting (torch.compile traces it)."""
    dims = [(s, d) for d, s in zip(shape, stride) if d > 1]
    for i, (si, _) in enumerate(dims):
        if si < 1:
            return True
        for j, (sj, dj) in enumerate(dims):
            if i != j and sj <= si < sj * dj:
                return True
    return False


def servable(t):
    """`t` when frost can bind it as laid out (unit last stride, other strides whole 16-byte vectors, no
    overlap: two indices never address one element); otherwise a contiguous copy, as the README promises.
    Autograd's gradients (an expanded `sum()` grad, say) need it."""
    if t.is_contiguous():
        return t
    st = t.stride()
    if st[-1] != 1:
        return t.contiguous()
    vec = max(16 // t.element_size(), 1)
    for d, s in zip(t.shape[:-1], st[:-1]):
        if d > 1 and (s == 0 or s % vec):
            return t.contiguous()
    if overlaps(t.shape, st):
        return t.contiguous()
    return t


class _SdpaFwd(torch.autograd.Function):
    """The dense forward's autograd node: saves what the backward op needs; lse is non-differentiable."""

    @staticmethod
    def forward(ctx, keyset, q, k, v, sinks, scale, wl, wr, br, det):
        if type(keyset) is block.EagerForward:  # a memoized training forward (the lean path)
            out, lse = keyset.outputs(q, k, v)
            ctx.grads = keyset.grads
        else:
            out, lse = _below(_SDPA_FWD, sdpa_fwd, keyset, (q, k, v, sinks, scale, wl, wr, br, det))
            ctx.grads = None
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.attrs = (scale, wl, wr, br, det)
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # lse's gradient stays None (no zeros made per backward)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        if dout is None:
            return (None,) * 10
        dout = servable(dout)
        if not _grad_enabled() and lean(dout, q):  # no double backward, nothing to trace: the kernel itself
            if ctx.grads is not None:
                dq, dk, dv, dsinks = block.backward_memo(ctx.grads, dout, q, k, v, out, lse, *ctx.attrs)
            else:
                dq, dk, dv, dsinks = block.backward(dout, q, k, v, out, lse, sinks, *ctx.attrs)
        else:
            dq, dk, dv, dsinks = torch.ops.frost.sdpa_bwd(dout, q, k, v, out, lse, sinks, *ctx.attrs)
        return None, dq, dk, dv, (dsinks if sinks is not None else None), None, None, None, None, None


class _SdpaVarlenFwd(torch.autograd.Function):
    """The packed forward's autograd node."""

    @staticmethod
    def forward(ctx, keyset, q, k, v, cu_q, cu_k, max_q, max_k, sinks, scale, wl, wr, br, det):
        out, lse = _below(
            _SDPA_VARLEN_FWD,
            sdpa_varlen_fwd,
            keyset,
            (q, k, v, cu_q, cu_k, max_q, max_k, sinks, scale, wl, wr, br, det),
        )
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, sinks)
        ctx.attrs = (max_q, max_k, sinks is not None, scale, wl, wr, br, det)
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, cu_q, cu_k, sinks = ctx.saved_tensors
        max_q, max_k, has_sinks, *attrs = ctx.attrs
        if dout is None:
            return (None,) * 14
        dout = servable(dout)
        args = (dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, sinks, *attrs)
        if not _grad_enabled() and lean(dout, q):
            dq, dk, dv, dsinks = block.packed_backward(*args)
        else:
            dq, dk, dv, dsinks = torch.ops.frost.sdpa_varlen_bwd(*args)
        return (None, dq, dk, dv, None, None, None, None, dsinks if has_sinks else None) + (None,) * 5


class _NoDerivative(torch.autograd.Function):
    """A backward op called on tensors that require grad (a double backward): its outputs get a node that
    raises when differentiated, as `custom_op` without a registered formula does."""

    @staticmethod
    def forward(ctx, handle, kernel, keyset, *args):
        ctx.op = handle.schema().name
        return _below(handle, kernel, keyset, args)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(
            f"{ctx.op} has no derivative: frost attention does not serve double backward "
            f"(create_graph=True through its gradients)"
        )


def _fwd_autograd(function, handle, kernel):
    def autograd_kernel(keyset, *args):
        if _grad_enabled() and _any_requires_grad(*args):
            return function.apply(keyset, *args)
        return _below(handle, kernel, keyset, args)

    return autograd_kernel


def _bwd_autograd(handle, kernel):
    def autograd_kernel(keyset, *args):
        if _grad_enabled() and _any_requires_grad(*args):
            return _NoDerivative.apply(handle, kernel, keyset, *args)
        return _below(handle, kernel, keyset, args)

    return autograd_kernel


_LIB.impl("sdpa_fwd", _fwd_autograd(_SdpaFwd, _SDPA_FWD, sdpa_fwd), "Autograd", with_keyset=True)
_LIB.impl(
    "sdpa_varlen_fwd", _fwd_autograd(_SdpaVarlenFwd, _SDPA_VARLEN_FWD, sdpa_varlen_fwd), "Autograd", with_keyset=True
)
_LIB.impl("sdpa_bwd", _bwd_autograd(_SDPA_BWD, sdpa_bwd), "Autograd", with_keyset=True)
_LIB.impl("sdpa_varlen_bwd", _bwd_autograd(_SDPA_VARLEN_BWD, sdpa_varlen_bwd), "Autograd", with_keyset=True)

# the lean path's autograd entries: `Function.apply` without its Python wrapper (whose work, functorch's
# and setup_context's, `lean` has ruled out), the op's kernel called below with no keyset
_apply_fwd = torch._C._FunctionBase.__dict__["apply"].__get__(None, _SdpaFwd)
_apply_varlen_fwd = torch._C._FunctionBase.__dict__["apply"].__get__(None, _SdpaVarlenFwd)


def fwd_autograd(q, k, v, sinks, scale, window_left, window_right, bottom_right, deterministic):
    """`torch.ops.frost.sdpa_fwd` with autograd, without the dispatcher: only where `lean(q, k, v, sinks)`."""
    return _apply_fwd(None, q, k, v, sinks, scale, window_left, window_right, bottom_right, deterministic)


def memo_autograd(memo, q, k, v, deterministic):
    """`fwd_autograd` of a memoized training forward (`block.EagerForward` with `grads`) on (B, H, S, D) views."""
    return _apply_fwd(memo, q, k, v, None, *memo.attrs, deterministic)


def varlen_fwd_autograd(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    sinks,
    scale,
    window_left,
    window_right,
    bottom_right,
    deterministic,
):
    """`torch.ops.frost.sdpa_varlen_fwd` with autograd, without the dispatcher: only where `lean(...)`."""
    return _apply_varlen_fwd(
        None,
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        sinks,
        scale,
        window_left,
        window_right,
        bottom_right,
        deterministic,
    )
