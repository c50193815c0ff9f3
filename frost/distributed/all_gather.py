"""All-gather attention: every rank gathers the whole K/V (one all_gather_into_tensor) and attends its own
query chunks to exactly the keys they may see: a causal chunk at positions [p0, p1) sees keys [0, p1) (a
sliding window of `left`: [p0 - left, p1)), as a bottom-right band. Each row is computed in one block, so no
merge; the backward gathers K/V again, scatters dK/dV in fp32 and reduce-scatters them to their owners.
Windows run here because a chunk's keys are one contiguous range however far the window reaches back.
"""

from __future__ import annotations

import torch

from frost.distributed import blocks
from frost.distributed.comm import all_gather, reduce_scatter


def _gather_kv(k, v, group, world):
    """(K, V) of the whole sequence in shard order: (W * T, H, D)."""
    buf = all_gather(torch.cat([k.reshape(-1), v.reshape(-1)]), group).view(world, -1)
    nk = k.numel()
    return (
        buf[:, :nk].reshape(world * k.shape[0], *k.shape[1:]),
        buf[:, nk:].reshape(world * v.shape[0], *v.shape[1:]),
    )


class AllGatherAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, call):
        ix = call.ix
        k_all, v_all = _gather_kv(k, v, call.group, call.world)
        keys = ix["keys"]
        out, lse = blocks.forward(
            q,
            k_all.index_select(0, keys),
            v_all.index_select(0, keys),
            ix["cu_chunks"],
            ix["cu_keys"],
            ix["max_chunk"],
            ix["max_keys"],
            sinks,
            call.scale,
            call.band,
            call.deterministic,
        )
        ctx.call = call
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        call = ctx.call
        ix = call.ix
        q, k, v, out, lse, sinks = ctx.saved_tensors
        k_all, v_all = _gather_kv(k, v, call.group, call.world)
        keys = ix["keys"]
        dq, dk_b, dv_b, dsinks = blocks.backward(
            dout,
            q,
            k_all.index_select(0, keys),
            v_all.index_select(0, keys),
            out,
            lse,
            ix["cu_chunks"],
            ix["cu_keys"],
            ix["max_chunk"],
            ix["max_keys"],
            sinks,
            call.scale,
            call.band,
            call.deterministic,
        )
        grads = []
        for g, like in ((dk_b, k_all), (dv_b, v_all)):
            acc = torch.zeros(like.shape, dtype=torch.float32, device=like.device)
            # head chunks' and tail chunks' key ranges overlap, so each half lands on its own (unique) rows
            for rows, src in (("key_head_rows", "key_head_src"), ("key_tail_rows", "key_tail_src")):
                acc.index_add_(0, ix[src], g.index_select(0, ix[rows]).float())
            grads.append(acc.view(call.world, -1))
        mine = reduce_scatter(torch.cat(grads, dim=1).reshape(-1), call.group)
        nk = k.numel()
        dk, dv = mine[:nk].view(k.shape), mine[nk:].view(v.shape)
        return dq, dk.to(k.dtype), dv.to(v.dtype), dsinks, None
