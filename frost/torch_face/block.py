"""One attention block on frost: allocate its outputs, find its cached plan, launch it.

These are the custom ops' kernels (`ops.py` registers them), and what every other caller runs: the
eager fast path of `attention`, the lean autograd path, the SDPA provider and context-parallel code
calling a block's forward and backward. A call flows down once: its key -> the plan cache
(`plans.PLANS`; on a miss `graphs.build_*` declares and plans it) -> the graph's executor
(`graphs.Planned.run`). Outputs and the workspace are `torch.empty` on the tensors' device and the
current stream, allocated here, outside `execute` (which never allocates).

Dense tensors are (B, H, S, D) with any strides frost serves; packed ones are (T, H, D). Windows use
FlashAttention's convention (`spec.Band`): -1 is unbounded, causal is right = 0.

Eager `attention` calls memoize an `EagerForward` per exact argument signature (`PLANS.memo`): the
cached plan, its executor and the recipe of its outputs, so a repeated call allocates its outputs and
launches with nothing else between (see `EagerForward`).
"""

from __future__ import annotations

import torch

from frost.torch_face.graphs import build_backward, build_forward, current_device, envelope
from frost.torch_face.plans import PLANS, TICKS
from frost.torch_face.spec import Band

_F32 = torch.float32
_lookup = PLANS.lookup  # the hit path: no lock
_build = PLANS.build


def out_like(q, head_dim_v):
    """The output of a forward: `empty_like(q)` (q's layout, as aten's flash ops), or q's stride order with
    another last dim."""
    if head_dim_v == q.shape[-1]:
        return torch.empty_like(q)
    st = q.stride()
    order = sorted(range(q.dim()), key=lambda a: (-st[a], a))
    return torch.empty_permuted((*q.shape[:-1], head_dim_v), order, dtype=q.dtype, device=q.device)


def dense_lse(q):
    """(B, H, S) fp32, contiguous."""
    b, h, s, _ = q.shape
    return torch.empty((b, h, s), dtype=_F32, device=q.device)


def packed_lse(q):
    """(H, T) fp32, contiguous: head-major, as FlashAttention's varlen lse."""
    return torch.empty((q.shape[1], q.shape[0]), dtype=_F32, device=q.device)


def dsinks_like(q, sinks):
    """fp32 (H,) sink gradient, or an empty (0,) tensor when there are no sinks (a fixed op schema)."""
    return torch.empty(q.shape[1] if sinks is not None else 0, dtype=_F32, device=q.device)


def _forward_key(q, k, v, ostride, sinks, scale, window_left, window_right, bottom_right, lse):
    return (
        "fwd",
        q.dtype,
        k.dtype,
        v.dtype,
        q.device,
        q.shape,
        q.stride(),
        k.shape,
        k.stride(),
        v.shape,
        v.stride(),
        ostride,
        sinks is None,
        scale,
        window_left,
        window_right,
        bottom_right,
        lse,
    )


def forward(
    q, k, v, sinks, scale, window_left, window_right, bottom_right, out=None, *, lse: bool = True, remember=None
):
    """Dense forward -> (out, lse (B, H, S) fp32); `out` may be given (written in place).

    lse=False: a plan without Stats (nothing writes an lse) and (out, None). `remember`: (memo key,
    bshd) of an eager `attention` call whose inputs are these tensors (`bshd`: their (B, S, H, D)
    transposes): its launch is memoized under that key (see `EagerForward`).
    """
    dev = q.device
    ostride = None
    if out is None:
        out = torch.empty_like(q) if v.shape[-1] == q.shape[-1] else out_like(q, v.shape[-1])
    else:
        ostride = out.stride()  # a given output's layout is part of the plan
    if lse:
        lse_t = torch.empty(q.shape[:3], dtype=_F32, device=dev)  # dense_lse
        lse4 = lse_t.unsqueeze(-1)
        tensors = (q, k, v, out, lse4)
    else:
        lse_t = lse4 = None
        tensors = (q, k, v, out)
    key = _forward_key(q, k, v, ostride, sinks, scale, window_left, window_right, bottom_right, lse)
    plan = _lookup(key)
    if plan is None:
        plan = _build(
            key, build_forward, q, k, v, out, lse4, sinks, scale, Band(window_left, window_right, bottom_right)
        )
    if sinks is None:  # the key pins q, k, v; out and lse are made from q here (a given out is checked)
        plan.run(tensors, dev, ostride is None)
    else:
        plan.run((*tensors, sinks), dev)
    if remember is not None and sinks is None:
        PLANS.remember(remember[0], EagerForward(plan, q, out, lse_t, bshd=remember[1]))
    return out, lse_t


class EagerForward:
    """A memoized eager dense forward: `attention(q, k, v, ...)` for one exact signature of its arguments.

    Made after a call with that signature went the whole way (argument checks, a plan, every binding
    check of execute) and needed no copy of its inputs; the memo key (`api.attention`) holds the dims,
    strides and dtypes of q, k and v, q's device, whether autograd records the call, and every other
    argument, so a call that finds it has nothing left to decide. It allocates the outputs as that call
    did (out `empty_like(q)`, or q's stride order when Dv != D; lse fp32 when returned or trained), binds
    through the plan's executor `launch` (devices and alignment checked: the rest is pinned by the key; a
    failure takes the checked path and its errors) and counts as a plan-cache hit.

    A training entry (`grads` a dict) is run by the ops' autograd node (`ops.fwd_autograd`), which hands
    `grads` to its backward: the backward plans of this forward by the gradient's strides
    (`backward_memo`), so a repeated training step finds both plans without building a key.
    """

    __slots__ = (
        "plan",
        "launch",
        "bshd",
        "out_shape",
        "out_stride",
        "lse_shape",
        "cuda",
        "workspace_size",
        "attrs",
        "grads",
    )

    def __init__(self, plan, q, out, lse, *, bshd: bool, attrs=(), train: bool = False):
        self.plan = plan
        self.launch = plan.executor.launch
        self.bshd = bshd
        like = out.shape == q.shape
        self.out_shape = None if like else tuple(out.shape)  # None: empty_like(q), as out_like does
        self.out_stride = None if like else out.stride()
        self.lse_shape = None if lse is None else tuple(lse.shape)
        self.cuda = q.device.index if q.device.type == "cuda" else -1
        self.workspace_size = plan.workspace_size
        self.attrs = attrs  # (scale, window_left, window_right, bottom_right) of the ops' schema
        self.grads = {} if train else None

    def outputs(self, q, k, v):
        """Allocate and launch for (B, H, S, D) q, k, v -> (out, lse or None)."""
        plan = self.plan
        plan.used = next(TICKS)
        PLANS.stats.hits += 1
        if self.out_shape is None:
            out = torch.empty_like(q)
        else:
            out = torch.empty_strided(self.out_shape, self.out_stride, dtype=q.dtype, device=q.device)
        if self.lse_shape is None:
            lse, tensors = None, (q, k, v, out)
        else:
            lse = torch.empty(self.lse_shape, dtype=_F32, device=q.device)
            tensors = (q, k, v, out, lse.unsqueeze(-1))
        ws = torch.empty(self.workspace_size, dtype=torch.uint8, device=q.device) if self.workspace_size else None
        cuda = self.cuda
        if cuda >= 0 and current_device() != cuda:
            with torch.cuda.device(cuda):
                self.launch(tensors, ws)
        else:
            self.launch(tensors, ws)
        return out, lse

    def __call__(self, q, k, v):
        if self.bshd:
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        out, lse = self.outputs(q, k, v)
        if self.bshd:
            out = out.transpose(1, 2)
        return out if lse is None else (out, lse)


def memoize_training(key, q, k, v, out, lse, scale, window_left, window_right, bottom_right, *, bshd: bool) -> None:
    """Memoize a training forward that went the whole way (no sinks, no copy, lse written) under `key`."""
    plan = _lookup(_forward_key(q, k, v, None, None, scale, window_left, window_right, bottom_right, True))
    if plan is not None:
        PLANS.remember(
            key,
            EagerForward(
                plan, q, out, lse, bshd=bshd, train=True, attrs=(scale, window_left, window_right, bottom_right)
            ),
        )


def backward(dout, q, k, v, out, lse, sinks, scale, window_left, window_right, bottom_right, deterministic):
    """Dense backward -> (dq, dk, dv, dsinks); each gradient `empty_like` its input."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dsinks = dsinks_like(q, sinks)
    lse4 = lse.unsqueeze(-1)
    plan = _backward_plan(
        dout,
        q,
        k,
        v,
        out,
        lse4,
        (dq, dk, dv),
        sinks,
        dsinks,
        scale,
        window_left,
        window_right,
        bottom_right,
        deterministic,
    )
    tensors = (q, k, v, out, dout, lse4, dq, dk, dv)
    if sinks is None:  # the key pins every input; the gradients are made from them here
        plan.run(tensors, q.device, True)
    else:
        plan.run((*tensors, sinks, dsinks), q.device)
    return dq, dk, dv, dsinks


def _backward_plan(
    dout, q, k, v, out, lse4, grads, sinks, dsinks, scale, window_left, window_right, bottom_right, deterministic
):
    """The cached backward plan of these tensors (built on a miss); its key holds every bound tensor's dtype,
    dims and strides."""
    key = (
        "bwd",
        q.dtype,
        k.dtype,
        v.dtype,
        out.dtype,
        dout.dtype,
        q.device,
        q.shape,
        q.stride(),
        k.shape,
        k.stride(),
        v.shape,
        v.stride(),
        out.shape,
        out.stride(),
        dout.shape,
        dout.stride(),
        lse4.shape,
        lse4.stride(),
        sinks is None,
        scale,
        window_left,
        window_right,
        bottom_right,
        deterministic,
    )
    plan = _lookup(key)
    if plan is None:
        plan = _build(
            key,
            build_backward,
            dout,
            q,
            k,
            v,
            out,
            lse4,
            grads,
            sinks,
            dsinks,
            scale,
            Band(window_left, window_right, bottom_right),
            deterministic,
        )
    return plan


def backward_memo(grads, dout, q, k, v, out, lse, scale, window_left, window_right, bottom_right, deterministic):
    """The backward of a memoized training forward (`EagerForward.grads`, no sinks) -> (dq, dk, dv, None).

    q, k, v, out and lse are that forward's (pinned by its memo key and its allocation), and autograd hands
    a gradient of out's dims; `grads` maps the gradient's strides, dtype and `deterministic` to the backward
    plan, built the whole way on the first use."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    lse4 = lse.unsqueeze(-1)
    key = (dout.stride(), dout.dtype, dout.shape, deterministic)
    plan = grads.get(key)
    if plan is None or not plan.live:
        if len(grads) > 8:
            grads.clear()
        plan = grads[key] = _backward_plan(
            dout,
            q,
            k,
            v,
            out,
            lse4,
            (dq, dk, dv),
            None,
            None,
            scale,
            window_left,
            window_right,
            bottom_right,
            deterministic,
        )
    else:
        plan.used = next(TICKS)
        PLANS.stats.hits += 1
    plan.run((q, k, v, out, dout, lse4, dq, dk, dv), q.device, True)
    return dq, dk, dv, None


def _envelopes(q, k, max_seqlen_q, max_seqlen_k):
    """Token envelopes (q, kv) and sequence envelopes, rounded up so that nearby totals share a plan."""
    tq, tk = envelope(max(q.shape[0], max_seqlen_q)), envelope(max(k.shape[0], max_seqlen_k))
    return (tq, tk), (min(envelope(max_seqlen_q), tq), min(envelope(max_seqlen_k), tk))


def packed_forward(
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
    out=None,
):
    """Packed forward -> (out (T, H, Dv), lse (H, T) fp32)."""
    dev = q.device
    ostride = None
    if out is None:
        out = out_like(q, v.shape[-1])
    else:
        ostride = out.stride()
    lse = packed_lse(q)
    lse3 = lse.t().unsqueeze(-1)
    totals, maxes = _envelopes(q, k, max_seqlen_q, max_seqlen_k)
    key = (
        "pfwd",
        q.dtype,
        dev,
        q.shape[1:],
        q.stride(),
        k.shape[1:],
        k.stride(),
        v.shape[1:],
        v.stride(),
        ostride,
        cu_seqlens_q.shape[0],
        totals,
        maxes,
        sinks is None,
        scale,
        window_left,
        window_right,
        bottom_right,
    )
    cu = (cu_seqlens_q, cu_seqlens_k)
    plan = _lookup(key)
    if plan is None:
        plan = _build(
            key,
            build_forward,
            q,
            k,
            v,
            out,
            lse3,
            sinks,
            scale,
            Band(window_left, window_right, bottom_right),
            cu,
            maxes,
            totals,
        )
    tensors = (q, k, v, out, lse3) if sinks is None else (q, k, v, out, lse3, sinks)
    plan.run((*tensors, *cu), dev)
    return out, lse


def packed_backward(
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
    """Packed backward -> (dq, dk, dv, dsinks)."""
    dev = q.device
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dsinks = dsinks_like(q, sinks)
    if not lse.is_contiguous():  # the plan declares the (H, T) lse head-major at its envelope
        lse = lse.contiguous()
    lse3 = lse.t().unsqueeze(-1)
    totals, maxes = _envelopes(q, k, max_seqlen_q, max_seqlen_k)
    key = (
        "pbwd",
        q.dtype,
        dev,
        q.shape[1:],
        q.stride(),
        k.shape[1:],
        k.stride(),
        v.shape[1:],
        v.stride(),
        out.stride(),
        dout.stride(),
        cu_seqlens_q.shape[0],
        totals,
        maxes,
        sinks is None,
        scale,
        window_left,
        window_right,
        bottom_right,
        deterministic,
    )
    cu = (cu_seqlens_q, cu_seqlens_k)
    grads = (dq, dk, dv)
    plan = _lookup(key)
    if plan is None:
        plan = _build(
            key,
            build_backward,
            dout,
            q,
            k,
            v,
            out,
            lse3,
            grads,
            sinks,
            dsinks,
            scale,
            Band(window_left, window_right, bottom_right),
            deterministic,
            cu,
            maxes,
            totals,
        )
    tensors = (q, k, v, out, dout, lse3, dq, dk, dv)
    plan.run((*tensors, *((sinks, dsinks) if sinks is not None else ()), *cu), dev)
    return dq, dk, dv, dsinks
