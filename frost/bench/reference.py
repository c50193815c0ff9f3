"""A float32 math reference, used only when no peer library runs to check frost against.

Works sequence by sequence and in groups of KV heads so that the score matrix
of one step stays under a memory budget; gives O (and the natural-log LSE) for
forward, dQ/dK/dV for backward, all in the inputs' storage shapes.
"""

from __future__ import annotations

from frost.bench.inputs import cu_seqlens_of
from frost.bench.workloads import Workload

BUDGET_BYTES = 1 << 30


def _segments(w: Workload):
    """(q slice, kv slice) selectors for each sequence, on flattened-token storage."""
    if w.is_thd:
        cu = cu_seqlens_of(w.seqlens)
        return [(slice(cu[i], cu[i + 1]), slice(cu[i], cu[i + 1])) for i in range(len(w.seqlens))]
    return [(b, b) for b in range(w.batch)]


def _attend(q, k, v, w: Workload, ratio: int):
    """q (Hq', Sq, D) fp32, k/v (Hkv', Skv, D) fp32 -> o (Hq', Sq, Dv), lse (Hq', Sq)."""
    import torch

    kx = k.repeat_interleave(ratio, dim=0)
    vx = v.repeat_interleave(ratio, dim=0)
    s = torch.matmul(q, kx.transpose(-1, -2)) * w.scale
    if w.causal:
        sq, skv = s.shape[-2], s.shape[-1]
        keep = torch.ones(sq, skv, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    return torch.matmul(p, vx), lse


def _kv_group(w: Workload, sq: int, skv: int) -> int:
    per_kv_head = max(1, w.gqa_ratio * sq * skv * 4 * 3)
    return max(1, min(w.heads_kv, BUDGET_BYTES // per_kv_head))


def paged_dense(w: Workload, cache, table):
    """A paged cache (num_blocks, block_size, H, D) gathered through its table into (B, S_kv, H, D)."""
    b, m = table.shape
    rows = cache[table.long()].reshape(b, m * w.block_size, *cache.shape[2:])
    return rows[:, : w.seqlen_kv]


def reference_forward(w: Workload, q, k, v, table=None):
    """O in storage shape (input dtype) and LSE (Hq, total_q) fp32; paged caches are read through `table`."""
    import torch

    if w.is_paged:
        k, v = paged_dense(w, k, table), paged_dense(w, v, table)
    o = torch.empty(q.shape[:-1] + (w.d_v,), dtype=q.dtype, device=q.device)
    if w.is_thd:
        lse = torch.empty(w.heads_q, w.total_q, dtype=torch.float32, device=q.device)
    else:
        lse = torch.empty(w.batch, w.heads_q, w.seqlen_q, dtype=torch.float32, device=q.device)
    r = w.gqa_ratio
    for qs, ks in _segments(w):
        qq, kk, vv = q[qs], k[ks], v[ks]  # (S, H, D)
        if qq.shape[0] == 0:
            continue
        g = _kv_group(w, qq.shape[0], kk.shape[0])
        for h0 in range(0, w.heads_kv, g):
            h1 = min(w.heads_kv, h0 + g)
            oq, lq = _attend(
                qq[:, h0 * r : h1 * r].transpose(0, 1).float(),
                kk[:, h0:h1].transpose(0, 1).float(),
                vv[:, h0:h1].transpose(0, 1).float(),
                w,
                r,
            )
            o[qs][:, h0 * r : h1 * r] = oq.transpose(0, 1).to(o.dtype)
            if w.is_thd:
                lse[h0 * r : h1 * r, qs] = lq
            else:
                lse[qs, h0 * r : h1 * r] = lq
    return o, lse


def reference_backward(w: Workload, q, k, v, do):
    """dQ, dK, dV in storage shapes (input dtype)."""
    import torch

    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    r = w.gqa_ratio
    for qs, ks in _segments(w):
        qq, kk, vv, dd = q[qs], k[ks], v[ks], do[qs]
        if qq.shape[0] == 0:
            continue
        g = _kv_group(w, qq.shape[0], kk.shape[0])
        for h0 in range(0, w.heads_kv, g):
            h1 = min(w.heads_kv, h0 + g)
            ql = qq[:, h0 * r : h1 * r].transpose(0, 1).float().requires_grad_(True)
            kl = kk[:, h0:h1].transpose(0, 1).float().requires_grad_(True)
            vl = vv[:, h0:h1].transpose(0, 1).float().requires_grad_(True)
            with torch.enable_grad():
                oq, _ = _attend(ql, kl, vl, w, r)
                gq, gk, gv = torch.autograd.grad(oq, (ql, kl, vl), dd[:, h0 * r : h1 * r].transpose(0, 1).float())
            dq[qs][:, h0 * r : h1 * r] = gq.transpose(0, 1).to(dq.dtype)
            dk[ks][:, h0:h1] = gk.transpose(0, 1).to(dk.dtype)
            dv[ks][:, h0:h1] = gv.transpose(0, 1).to(dv.dtype)
    return dq, dk, dv
