"""Reference SDPA math in torch, on the canonical views of `frost.engines.sdpa_args`.

This is the numerics oracle for the GPU engines and the body of the reference
adapter. It is plain torch, runs on any device, and reads `cu_seqlens` /
`seqused` to the host: it is never on a GPU engine's execute path.
"""
from __future__ import annotations

import math

import torch


def _ranges(num_batches: int, s_q: int, s_kv: int, cu_q, cu_kv, used_q, used_kv):
    """Per batch: (q_start, q_len, kv_start, kv_len), host ints."""
    if cu_q is not None:
        cq = [int(x) for x in cu_q.tolist()]
        ck = [int(x) for x in cu_kv.tolist()]
        return [(cq[b], cq[b + 1] - cq[b], ck[b], ck[b + 1] - ck[b]) for b in range(len(cq) - 1)]
    uq = used_q.tolist() if used_q is not None else [s_q] * num_batches
    uk = used_kv.tolist() if used_kv is not None else [s_kv] * num_batches
    return [(0, int(uq[b]), 0, int(uk[b])) for b in range(num_batches)]


def allowed_mask(len_q: int, len_kv: int, *, window_left=None, window_right=None, bottom_right=False,
                 device=None) -> torch.Tensor:
    """Boolean (len_q, len_kv) mask of the contract in sdpa_args.py."""
    i = torch.arange(len_q, device=device).unsqueeze(1)
    j = torch.arange(len_kv, device=device).unsqueeze(0)
    off = (len_kv - len_q) if bottom_right else 0
    ok = torch.ones(len_q, len_kv, dtype=torch.bool, device=device)
    if window_left is not None:
        ok &= j >= i + off - window_left
    if window_right is not None:
        ok &= j <= i + off + window_right
    return ok


def _attend(qb, kb, vb, *, scale, sink, mask):
    """One sequence: qb (Sq, Hq, D), kb (Skv, Hkv, D) -> o (Sq, Hq, Dv), lse (Hq, Sq)."""
    hq, hkv = qb.shape[1], kb.shape[1]
    g = hq // hkv
    kb = kb.repeat_interleave(g, dim=1)
    vb = vb.repeat_interleave(g, dim=1)
    s = torch.einsum("qhd,khd->hqk", qb, kb) * scale
    s = s.masked_fill(~mask.unsqueeze(0), float("-inf"))
    if sink is not None:
        col = sink.view(hq, 1, 1).to(s.dtype).expand(hq, s.shape[1], 1)
        s = torch.cat([s, col], dim=2)
    lse = torch.logsumexp(s, dim=2)  # -inf where the row is empty
    p = torch.exp(s - lse.unsqueeze(2))
    p = torch.nan_to_num(p, nan=0.0)  # empty rows: exp(-inf - -inf)
    if sink is not None:
        p = p[..., :-1]
    o = torch.einsum("hqk,khd->qhd", p, vb)
    return o, lse


def sdpa_fwd_reference(q, k, v, *, softmax_scale, cu_seqlens_q=None, cu_seqlens_kv=None, seqused_q=None,
                       seqused_kv=None, sinks=None, window_left=None, window_right=None, bottom_right=False,
                       compute_dtype=torch.float32):
    """Forward on canonical views; returns (o, lse) in `compute_dtype`.

    Dense views: q (B, Sq, Hq, D) -> o (B, Sq, Hq, Dv), lse (B, Hq, Sq).
    THD views:   q (Tq, Hq, D)    -> o (Tq, Hq, Dv),    lse (Hq, Tq).
    Rows past a sequence's length (padding) and empty rows get O = 0, LSE = -inf.
    """
    thd = cu_seqlens_q is not None
    cd = compute_dtype
    q, k, v = q.to(cd), k.to(cd), v.to(cd)
    sink = sinks.to(cd) if sinks is not None else None
    dv = v.shape[-1]
    if thd:
        tq, hq = q.shape[0], q.shape[1]
        o = torch.zeros(tq, hq, dv, dtype=cd, device=q.device)
        lse = torch.full((hq, tq), float("-inf"), dtype=cd, device=q.device)
        batches = len(cu_seqlens_q) - 1
    else:
        bsz, sq, hq = q.shape[0], q.shape[1], q.shape[2]
        o = torch.zeros(bsz, sq, hq, dv, dtype=cd, device=q.device)
        lse = torch.full((bsz, hq, sq), float("-inf"), dtype=cd, device=q.device)
        batches = bsz
    s_q = 0 if thd else q.shape[1]
    s_kv = 0 if thd else k.shape[1]
    for b, (q0, lq, k0, lk) in enumerate(_ranges(batches, s_q, s_kv, cu_seqlens_q, cu_seqlens_kv,
                                                 seqused_q, seqused_kv)):
        if lq == 0:
            continue
        mask = allowed_mask(lq, lk, window_left=window_left, window_right=window_right,
                            bottom_right=bottom_right, device=q.device)
        if thd:
            ob, lb = _attend(q[q0:q0 + lq], k[k0:k0 + lk], v[k0:k0 + lk], scale=softmax_scale, sink=sink, mask=mask)
            o[q0:q0 + lq] = ob
            lse[:, q0:q0 + lq] = lb
        else:
            ob, lb = _attend(q[b, :lq], k[b, :lk], v[b, :lk], scale=softmax_scale, sink=sink, mask=mask)
            o[b, :lq] = ob
            lse[b, :, :lq] = lb
    return o, lse


def sdpa_bwd_reference(q, k, v, do, *, softmax_scale, compute_dtype=torch.float64, **mask_kwargs):
    """Gradients by autograd through `sdpa_fwd_reference` in `compute_dtype`.

    Returns (dq, dk, dv, dsinks or None) on the canonical views' shapes.
    """
    cd = compute_dtype
    leaves = [t.detach().to(cd).requires_grad_(True) for t in (q, k, v)]
    sinks = mask_kwargs.pop("sinks", None)
    sink_leaf = sinks.detach().to(cd).requires_grad_(True) if sinks is not None else None
    o, _ = sdpa_fwd_reference(*leaves, softmax_scale=softmax_scale, sinks=sink_leaf, compute_dtype=cd, **mask_kwargs)
    wrt = leaves + ([sink_leaf] if sink_leaf is not None else [])
    if o.requires_grad:
        grads = torch.autograd.grad(o, wrt, grad_outputs=do.to(cd), allow_unused=True)
    else:  # every sequence is empty: O does not depend on the inputs, every gradient is zero
        grads = [None] * len(wrt)
    grads = [g if g is not None else torch.zeros_like(t) for g, t in zip(grads, wrt)]
    dq, dk, dv = grads[:3]
    dsink = grads[3] if sink_leaf is not None else None
    return dq, dk, dv, dsink


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
