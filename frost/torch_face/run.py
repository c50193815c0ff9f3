"""The one path from torch tensors to a frost execute: allocate outputs, find the cached plan, launch.

The custom ops' real kernels, the eager fast path and the SDPA provider all call these functions;
nothing else plans or launches. Outputs, the workspace and scratch are `torch.empty` on the tensors'
device and the current stream, allocated here, outside `execute` (which never allocates).

Dense tensors are (B, H, S, D) with any strides frost serves; packed ones are (T, H, D). Windows use
FlashAttention's convention (`spec.Band`): -1 is unbounded, causal is right = 0.
"""
from __future__ import annotations

import torch

from frost.torch_face.graphs import build_backward, build_forward, envelope
from frost.torch_face.plans import PLANS
from frost.torch_face.spec import Band

_F32 = torch.float32
_lookup = PLANS.lookup  # the hit path: no closures, no lock


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


def _describe(kind, *tensors) -> str:
    return f"{kind} on " + ", ".join(f"{tuple(t.shape)}/{t.dtype}" for t in tensors if t is not None)


def _current_device():
    return torch.cuda.current_device()


def _launch(plan, tensors, device) -> None:
    """Run on the tensors' device: the current stream of that device is the launch stream."""
    if device.type == "cuda" and device.index != _current_device():
        with torch.cuda.device(device):
            plan.run(tensors, device)
    else:
        plan.run(tensors, device)


def forward(q, k, v, sinks, scale, window_left, window_right, bottom_right, out=None):
    """Dense forward -> (out, lse (B, H, S) fp32); `out` may be given (written in place)."""
    dev = q.device
    ostride = None
    if out is None:
        out = out_like(q, v.shape[-1])
    else:
        ostride = out.stride()  # a given output's layout is part of the plan
    lse = dense_lse(q)
    lse4 = lse.unsqueeze(-1)
    key = ("fwd", q.dtype, dev, q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), ostride,
           sinks is None, scale, window_left, window_right, bottom_right)
    plan = _lookup(key)
    if plan is None:
        band = Band(window_left, window_right, bottom_right)
        plan = PLANS.build(key, lambda: build_forward(q, k, v, out, lse4, sinks, scale, band),
                           lambda: _describe("the attention forward", q, k, v))
    _launch(plan, (q, k, v, out, lse4) if sinks is None else (q, k, v, out, lse4, sinks), dev)
    return out, lse


def backward(dout, q, k, v, out, lse, sinks, scale, window_left, window_right, bottom_right, deterministic):
    """Dense backward -> (dq, dk, dv, dsinks); each gradient `empty_like` its input."""
    dev = q.device
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dsinks = dsinks_like(q, sinks)
    lse4 = lse.unsqueeze(-1)
    key = ("bwd", q.dtype, dev, q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), out.stride(),
           dout.stride(), lse.stride(), sinks is None, scale, window_left, window_right, bottom_right, deterministic)
    grads = (dq, dk, dv)
    plan = _lookup(key)
    if plan is None:
        plan = PLANS.build(key, lambda: build_backward(dout, q, k, v, out, lse4, grads, sinks, dsinks, scale,
                                                       Band(window_left, window_right, bottom_right), deterministic),
                           lambda: _describe("the attention backward", q, k, v, dout))
    tensors = (q, k, v, out, dout, lse4, dq, dk, dv)
    _launch(plan, tensors if sinks is None else (*tensors, sinks, dsinks), dev)
    return dq, dk, dv, dsinks


def _envelopes(q, k, max_seqlen_q, max_seqlen_k):
    """Token envelopes (q, kv) and sequence envelopes, rounded up so that nearby totals share a plan."""
    tq, tk = envelope(max(q.shape[0], max_seqlen_q)), envelope(max(k.shape[0], max_seqlen_k))
    return (tq, tk), (min(envelope(max_seqlen_q), tq), min(envelope(max_seqlen_k), tk))


def packed_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sinks, scale, window_left,
                   window_right, bottom_right, out=None):
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
    key = ("pfwd", q.dtype, dev, q.shape[1:], q.stride(), k.shape[1:], k.stride(), v.shape[1:], v.stride(), ostride,
           cu_seqlens_q.shape[0], totals, maxes, sinks is None, scale, window_left, window_right, bottom_right)
    cu = (cu_seqlens_q, cu_seqlens_k)
    plan = _lookup(key)
    if plan is None:
        band = Band(window_left, window_right, bottom_right)
        plan = PLANS.build(key, lambda: build_forward(q, k, v, out, lse3, sinks, scale, band, cu=cu,
                                                      max_seqlens=maxes, totals=totals),
                           lambda: _describe("the packed attention forward", q, k, v))
    tensors = (q, k, v, out, lse3) if sinks is None else (q, k, v, out, lse3, sinks)
    _launch(plan, (*tensors, *cu), dev)
    return out, lse


def packed_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sinks, scale,
                    window_left, window_right, bottom_right, deterministic):
    """Packed backward -> (dq, dk, dv, dsinks)."""
    dev = q.device
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dsinks = dsinks_like(q, sinks)
    if not lse.is_contiguous():  # the plan declares the (H, T) lse head-major at its envelope
        lse = lse.contiguous()
    lse3 = lse.t().unsqueeze(-1)
    totals, maxes = _envelopes(q, k, max_seqlen_q, max_seqlen_k)
    key = ("pbwd", q.dtype, dev, q.shape[1:], q.stride(), k.shape[1:], k.stride(), v.shape[1:], v.stride(),
           out.stride(), dout.stride(), cu_seqlens_q.shape[0], totals, maxes, sinks is None, scale,
           window_left, window_right, bottom_right, deterministic)
    cu = (cu_seqlens_q, cu_seqlens_k)
    grads = (dq, dk, dv)
    plan = _lookup(key)
    if plan is None:
        plan = PLANS.build(key, lambda: build_backward(dout, q, k, v, out, lse3, grads, sinks, dsinks, scale,
                                                       Band(window_left, window_right, bottom_right), deterministic,
                                                       cu=cu, max_seqlens=maxes, totals=totals),
                           lambda: _describe("the packed attention backward", q, k, v, dout))
    tensors = (q, k, v, out, dout, lse3, dq, dk, dv)
    _launch(plan, (*tensors, *((sinks, dsinks) if sinks is not None else ()), *cu), dev)
    return dq, dk, dv, dsinks
