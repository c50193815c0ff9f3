"""Ring attention: each rank keeps its queries and passes K/V to the next rank, W steps; partial results merge in
fp32. The backward passes K/V around again with an fp32 dK/dV accumulator that returns home after W steps.

Under a causal mask and the head-tail split, step s pairs this rank's chunks (r, 2W-1-r) with the chunks of rank
j = r - s: j = r is the local causal block, j < r lets every local query see j's head chunk, j > r lets the tail
chunk's queries see both of j's chunks; the other pairs are masked out whole, so every step costs half a block.
"""

from __future__ import annotations

import torch

from frost.distributed import blocks
from frost.distributed.comm import Ring
from frost.distributed.merge import merge_rows

_FWD_TAG, _BWD_KV_TAG, _BWD_DKV_TAG = 11, 12, 13
_CAUSAL, _FULL = (-1, 0, False), (-1, -1, False)


def _pack(k, v):
    return torch.cat([k.reshape(-1), v.reshape(-1)])


def _unpack(buf, k_shape, v_shape):
    nk = k_shape.numel()
    return buf[:nk].view(k_shape), buf[nk:].view(v_shape)


def _step(call, s: int):
    """Step s's block: (query rows or None for all, key rows or None for all, cu_q, cu_k, max_q, max_k, band)."""
    ix = call.ix
    local = (ix["cu_local"], ix["max_local"])
    half = (ix["cu_halves"], ix["max_chunk"])
    if not call.causal:
        return None, None, local[0], local[0], local[1], local[1], _FULL
    if s == 0:
        return None, None, local[0], local[0], local[1], local[1], _CAUSAL
    if (call.rank - s) % call.world < call.rank:  # its head chunk, to every local query
        return None, ix["heads"], local[0], half[0], local[1], half[1], _FULL
    return ix["tails"], None, half[0], local[0], half[1], local[1], _FULL  # all of it, to the tail queries


def _rows(t, rows, dim=0):
    return t if rows is None else t.index_select(dim, rows)


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, call):
        o_acc = lse_acc = None
        kv = _pack(k, v)
        ring = Ring(call.group, kv, _FWD_TAG) if call.world > 1 else None
        for s in range(call.world):
            if s + 1 < call.world:
                ring.start(kv)
            kj, vj = _unpack(kv, k.shape, v.shape)
            qr, kr, cu_q, cu_k, mq, mk, band = _step(call, s)
            o, lse = blocks.forward(
                _rows(q, qr),
                _rows(kj, kr),
                _rows(vj, kr),
                cu_q,
                cu_k,
                mq,
                mk,
                sinks if s == 0 else None,
                call.scale,
                band,
                call.deterministic,
            )
            if s == 0:  # every row sees its own block: the accumulators start from it
                o_acc, lse_acc = o.float(), lse.float().clone()
            else:
                merge_rows(o_acc, lse_acc, o, lse, qr)
            if s + 1 < call.world:
                kv = ring.wait()
        out = o_acc.to(q.dtype)
        ctx.call = call
        ctx.save_for_backward(q, k, v, out, lse_acc, sinks)
        ctx.mark_non_differentiable(lse_acc)
        return out, lse_acc

    @staticmethod
    def backward(ctx, dout, _dlse):
        call = ctx.call
        q, k, v, out, lse, sinks = ctx.saved_tensors
        dout = dout.contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = _pack(k, v)
        dkv = torch.zeros(kv.shape, dtype=torch.float32, device=q.device)
        multi = call.world > 1
        ring = Ring(call.group, kv, _BWD_KV_TAG) if multi else None
        home = Ring(call.group, dkv, _BWD_DKV_TAG) if multi else None
        dsinks = None
        for s in range(call.world):
            if s + 1 < call.world:
                ring.start(kv)
            kj, vj = _unpack(kv, k.shape, v.shape)
            qr, kr, cu_q, cu_k, mq, mk, band = _step(call, s)
            dq_b, dk_b, dv_b, ds = blocks.backward(
                _rows(dout, qr),
                _rows(q, qr),
                _rows(kj, kr),
                _rows(vj, kr),
                _rows(out, qr),
                _rows(lse, qr, 1),
                cu_q,
                cu_k,
                mq,
                mk,
                sinks if s == 0 else None,
                call.scale,
                band,
                call.deterministic,
            )
            if qr is None:
                dq.add_(dq_b)
            else:
                dq.index_add_(0, qr, dq_b.float())
            if s == 0:
                dsinks = ds
            else:
                dkv = home.wait()  # block j's accumulator, from the rank before
            dk_acc, dv_acc = _unpack(dkv, k.shape, v.shape)
            for acc, g in ((dk_acc, dk_b), (dv_acc, dv_b)):
                if kr is None:
                    acc.add_(g)
                else:
                    acc.index_add_(0, kr, g.float())
            if multi:
                home.start(dkv)  # on to the next rank; after the last step, home
            if s + 1 < call.world:
                kv = ring.wait()
        if multi:
            dkv = home.wait()
        dk, dv = _unpack(dkv, k.shape, v.shape)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dsinks, None
