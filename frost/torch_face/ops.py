"""frost's functional custom ops: `torch.ops.frost.sdpa_fwd / sdpa_bwd` (dense) and `sdpa_varlen_fwd /
sdpa_varlen_bwd` (packed), with fake kernels and autograd.

Every argument is explicit and none is mutated. Dense tensors are (B, H, S, D); packed ones (T, H, D)
with int32 `cu_seqlens` and static `max_seqlen` envelopes. The window is FlashAttention's (-1 is
unbounded, causal is right = 0) around the top-left or bottom-right diagonal. The forward returns
(out, lse): out `empty_like(q)` (q's layout), lse fp32 (B, H, S) dense or (H, T) packed. lse carries no
gradient. `deterministic` is the backward's (the forward only records it for autograd). The backward
returns (dq, dk, dv, dsinks); dsinks is (H,) fp32 with sinks and an empty (0,) tensor without.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from frost.torch_face import run


@torch.library.custom_op("frost::sdpa_fwd", mutates_args=())
def sdpa_fwd(q: Tensor, k: Tensor, v: Tensor, sinks: Optional[Tensor], scale: Optional[float], window_left: int,
             window_right: int, bottom_right: bool, deterministic: bool) -> tuple[Tensor, Tensor]:
    return run.forward(q, k, v, sinks, scale, window_left, window_right, bottom_right)


@sdpa_fwd.register_fake
def _sdpa_fwd_fake(q, k, v, sinks, scale, window_left, window_right, bottom_right, deterministic):
    return run.out_like(q, v.shape[-1]), run.dense_lse(q)


@torch.library.custom_op("frost::sdpa_bwd", mutates_args=())
def sdpa_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, sinks: Optional[Tensor],
             scale: Optional[float], window_left: int, window_right: int, bottom_right: bool,
             deterministic: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return run.backward(dout, q, k, v, out, lse, sinks, scale, window_left, window_right, bottom_right, deterministic)


@sdpa_bwd.register_fake
def _sdpa_bwd_fake(dout, q, k, v, out, lse, sinks, scale, window_left, window_right, bottom_right, deterministic):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), run.dsinks_like(q, sinks)


@torch.library.custom_op("frost::sdpa_varlen_fwd", mutates_args=())
def sdpa_varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                    max_seqlen_k: int, sinks: Optional[Tensor], scale: Optional[float], window_left: int,
                    window_right: int, bottom_right: bool, deterministic: bool) -> tuple[Tensor, Tensor]:
    return run.packed_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sinks, scale,
                              window_left, window_right, bottom_right)


@sdpa_varlen_fwd.register_fake
def _sdpa_varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sinks, scale, window_left,
                          window_right, bottom_right, deterministic):
    return run.out_like(q, v.shape[-1]), run.packed_lse(q)


@torch.library.custom_op("frost::sdpa_varlen_bwd", mutates_args=())
def sdpa_varlen_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_seqlens_q: Tensor,
                    cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int, sinks: Optional[Tensor],
                    scale: Optional[float], window_left: int, window_right: int, bottom_right: bool,
                    deterministic: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return run.packed_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               sinks, scale, window_left, window_right, bottom_right, deterministic)


@sdpa_varlen_bwd.register_fake
def _sdpa_varlen_bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sinks,
                          scale, window_left, window_right, bottom_right, deterministic):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), run.dsinks_like(q, sinks)


def servable(t):
    """`t` when frost can bind it as laid out (unit last stride, other strides whole 16-byte vectors, no
    overlap); otherwise a contiguous copy. Autograd's gradients (an expanded `sum()` grad, say) need it."""
    if t.is_contiguous():
        return t
    st = t.stride()
    if st[-1] != 1:
        return t.contiguous()
    vec = max(16 // t.element_size(), 1)
    for d, s in zip(t.shape[:-1], st[:-1]):
        if d > 1 and (s == 0 or s % vec):
            return t.contiguous()
    return t


def _setup_fwd(ctx, inputs, output):
    q, k, v, sinks, scale, wl, wr, br, det = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, sinks)
    ctx.attrs = (scale, wl, wr, br, det)
    ctx.mark_non_differentiable(lse)


def _backward_fwd(ctx, dout, _dlse):
    q, k, v, out, lse, sinks = ctx.saved_tensors
    if dout is None:
        return None, None, None, None, None, None, None, None, None
    dq, dk, dv, dsinks = torch.ops.frost.sdpa_bwd(servable(dout), q, k, v, out, lse, sinks, *ctx.attrs)
    return dq, dk, dv, (dsinks if sinks is not None else None), None, None, None, None, None


def _setup_varlen(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, sinks, scale, wl, wr, br, det = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, sinks)
    ctx.attrs = (max_q, max_k, sinks is not None, scale, wl, wr, br, det)
    ctx.mark_non_differentiable(lse)


def _backward_varlen(ctx, dout, _dlse):
    q, k, v, out, lse, cu_q, cu_k, sinks = ctx.saved_tensors
    max_q, max_k, has_sinks, *attrs = ctx.attrs
    if dout is None:
        return (None,) * 13
    dq, dk, dv, dsinks = torch.ops.frost.sdpa_varlen_bwd(servable(dout), q, k, v, out, lse, cu_q, cu_k, max_q,
                                                         max_k, sinks, *attrs)
    return (dq, dk, dv, None, None, None, None, dsinks if has_sinks else None) + (None,) * 5


sdpa_fwd.register_autograd(_backward_fwd, setup_context=_setup_fwd)
sdpa_varlen_fwd.register_autograd(_backward_varlen, setup_context=_setup_varlen)
