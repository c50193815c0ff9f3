"""Ulysses attention: an all-to-all trades the sequence split for a head split, so each rank holds the whole
sequence for H / W heads and attends it in one block (any mask, window or sink, no merge); a second all-to-all
trades back. Needs the head counts divisible by W (K/V heads are repeated up to W where fewer: `api.py`)."""

from __future__ import annotations

import torch

from frost.distributed import blocks
from frost.distributed.comm import all_to_all


def _to_heads(x, call):
    """Local tokens, all heads (T, H, D) -> every token in natural order, this rank's H / W heads."""
    t, h = x.shape[0], x.shape[1] // call.world
    parts = all_to_all(x.view(t, call.world, h, *x.shape[2:]).transpose(0, 1), call.group)
    return parts.reshape(call.world * t, h, *x.shape[2:]).index_select(0, call.ix["to_natural"])


def _to_tokens(y, call):
    """The inverse of `_to_heads`: (W T, H / W, D) in natural order -> local tokens, all heads."""
    t = y.shape[0] // call.world
    parts = all_to_all(y.index_select(0, call.ix["to_shard"]).view(call.world, t, *y.shape[1:]), call.group)
    return parts.transpose(0, 1).reshape(t, call.world * y.shape[1], *y.shape[2:])


class UlyssesAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, call):
        ix = call.ix
        h = q.shape[1] // call.world
        mine = sinks[call.rank * h : (call.rank + 1) * h].contiguous() if sinks is not None else None
        qf, kf, vf = (_to_heads(t, call) for t in (q, k, v))
        out_f, lse_f = blocks.forward(
            qf,
            kf,
            vf,
            ix["cu_global"],
            ix["cu_global"],
            ix["max_global"],
            ix["max_global"],
            mine,
            call.scale,
            call.band,
            call.deterministic,
        )
        out = _to_tokens(out_f, call)
        lse = _to_tokens(lse_f.t().unsqueeze(-1).contiguous(), call)[..., 0].t().contiguous()
        ctx.call = call
        ctx.save_for_backward(qf, kf, vf, out_f, lse_f, mine, sinks)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        call = ctx.call
        ix = call.ix
        qf, kf, vf, out_f, lse_f, mine, sinks = ctx.saved_tensors
        dq, dk, dv, ds = blocks.backward(
            _to_heads(dout.contiguous(), call),
            qf,
            kf,
            vf,
            out_f,
            lse_f,
            ix["cu_global"],
            ix["cu_global"],
            ix["max_global"],
            ix["max_global"],
            mine,
            call.scale,
            call.band,
            call.deterministic,
        )
        dsinks = None
        if sinks is not None:
            h = mine.shape[0]
            dsinks = torch.zeros_like(sinks)
            dsinks[call.rank * h : (call.rank + 1) * h] = ds
        return _to_tokens(dq, call), _to_tokens(dk, call), _to_tokens(dv, call), dsinks, None
