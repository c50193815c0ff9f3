"""Reference SDPA math in torch, on the canonical views of `frost.engines.sdpa_args`.

This is the numerics oracle for the GPU engines and the body of the reference
adapter. It is plain torch, runs on any device, and reads `cu_seqlens` /
`seqused` to the host: it is never on a GPU engine's execute path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from frost.engines.sdpa_args import BLOCK_MASK_BITS, BLOCK_MASK_TILE, alibi_slopes


@dataclass(frozen=True, eq=False)
class RefArgs:
    """What the reference math takes beside the io tensors, one field per kernel contract argument (the names of
    `frost.engines.sdpa_args`): the scale; the packed prefix sums (THD) or the used lengths of a padded batch
    (None: none); the sinks; the band (windows None: unbounded); the score modifiers (`bias`: the declared
    (B or 1, Hq or 1, S_q, S_kv) additive bias; `alibi`: cuDNN's ALiBi); the forward's block mask (cuDNN's uint8
    (B, Hq, ceil(S_q/128), ceil(ceil(S_kv/128)/8)) tile bits, `block_mask_allowed`)."""

    softmax_scale: float
    cu_seqlens_q: Any = None
    cu_seqlens_kv: Any = None
    seqused_q: Any = None
    seqused_kv: Any = None
    sinks: Any = None
    window_left: Any = None
    window_right: Any = None
    bottom_right: bool = False
    bias: Any = None
    alibi: bool = False
    block_mask: Any = None


def _ranges(num_batches: int, s_q: int, s_kv: int, cu_q, cu_kv, used_q, used_kv):
    """Per batch: (q_start, q_len, kv_start, kv_len), host ints."""
    if cu_q is not None:
        cq = [int(x) for x in cu_q.tolist()]
        ck = [int(x) for x in cu_kv.tolist()]
        return [(cq[b], cq[b + 1] - cq[b], ck[b], ck[b + 1] - ck[b]) for b in range(len(cq) - 1)]
    uq = used_q.tolist() if used_q is not None else [s_q] * num_batches
    uk = used_kv.tolist() if used_kv is not None else [s_kv] * num_batches
    return [(0, int(uq[b]), 0, int(uk[b])) for b in range(num_batches)]


def _sequences(q, k, a: RefArgs, block_mask=None):
    """Per non-empty sequence: (batch index, query rows, key rows, mask, score terms), the rows as index tuples
    into the canonical views (THD: token slices; dense: the batch entry's leading rows), the mask (len_q, len_kv),
    or (H, len_q, len_kv) with a block mask, the score terms `score_mods`' (in q's dtype; None without a bias or
    ALiBi)."""
    thd = a.cu_seqlens_q is not None
    batches = len(a.cu_seqlens_q) - 1 if thd else q.shape[0]
    s_q, s_kv = (0, 0) if thd else (q.shape[1], k.shape[1])
    ranges = _ranges(batches, s_q, s_kv, a.cu_seqlens_q, a.cu_seqlens_kv, a.seqused_q, a.seqused_kv)
    for b, (q0, lq, k0, lk) in enumerate(ranges):
        if lq == 0:
            continue
        mask = allowed_mask(
            lq, lk, window_left=a.window_left, window_right=a.window_right, bottom_right=a.bottom_right, device=q.device
        )
        if block_mask is not None:
            mask = mask & block_mask_allowed(block_mask[b], lq, lk)
        mods = score_mods(
            q.shape[-2],
            lq,
            lk,
            bias_block=_bias_block(a.bias, b, lq, lk),
            alibi=a.alibi,
            dtype=q.dtype,
            device=q.device,
        )
        if thd:
            yield b, (slice(q0, q0 + lq),), (slice(k0, k0 + lk),), mask, mods
        else:
            yield b, (b, slice(0, lq)), (b, slice(0, lk)), mask, mods


def batch_entry(t, b: int):
    """Batch entry b of a (B or 1, ...) tensor that may broadcast over its batch mode (a bias, dBias), that
    mode kept: t[b:b + 1], or t itself where B is 1. A view."""
    return t[b : b + 1] if t.shape[0] > 1 else t


def _bias_block(bias, b: int, len_q: int, len_kv: int):
    """Sequence b's (H or 1, len_q, len_kv) block (a view) of a declared (B or 1, H or 1, S_q, S_kv) bias or
    dBias: positions are sequence-local, unit dims broadcast."""
    if bias is None:
        return None
    return batch_entry(bias, b)[0, :, :len_q, :len_kv]


def score_mods(
    hq: int, len_q: int, len_kv: int, *, bias_block=None, alibi: bool = False, dtype=torch.float32, device=None
):
    """The additive score terms of one sequence, (H or 1, len_q, len_kv) or None: the bias block plus ALiBi's
    slope(h) * (j - i) (cuDNN's slopes, `sdpa_args.alibi_slopes`)."""
    out = None if bias_block is None else bias_block.to(dtype)
    if alibi:
        i = torch.arange(len_q, device=device).view(len_q, 1)
        j = torch.arange(len_kv, device=device).view(1, len_kv)
        slopes = torch.tensor(alibi_slopes(hq), dtype=dtype, device=device).view(hq, 1, 1)
        term = slopes * (j - i).to(dtype)
        out = term if out is None else out + term
    return out


def block_mask_allowed(block_mask, len_q: int, len_kv: int) -> torch.Tensor:
    """Boolean (H, len_q, len_kv) of one batch entry's cuDNN block_mask, uint8 (H, q tiles, key-tile bytes): bit j
    (LSB first) of byte [h, i, k] lets query rows 128 i .. 128 i + 127 see keys 128 (8 k + j) .. + 127. Positions
    are sequence-local (a packed sequence's tiles count from its first token)."""
    dev = block_mask.device
    qt = torch.arange(len_q, device=dev) // BLOCK_MASK_TILE
    kt = torch.arange(len_kv, device=dev) // BLOCK_MASK_TILE
    rows = block_mask[:, qt].to(torch.int32)  # (H, len_q, bytes)
    byte = rows[:, :, kt // BLOCK_MASK_BITS]  # (H, len_q, len_kv)
    return ((byte >> (kt % BLOCK_MASK_BITS).to(torch.int32)) & 1).bool()


def _by_head(mask):
    """A (len_q, len_kv) or (H, len_q, len_kv) mask as (1 or H, len_q, len_kv)."""
    return mask if mask.dim() == 3 else mask.unsqueeze(0)


def allowed_mask(
    len_q: int, len_kv: int, *, window_left=None, window_right=None, bottom_right=False, device=None
) -> torch.Tensor:
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


def _logits(qb, kk, *, scale, mods, mask):
    """scale * q.k^T (Hq, Sq, Skv), plus the score terms `mods`, masked after."""
    s = torch.einsum("qhd,khd->hqk", qb, kk) * scale
    if mods is not None:
        s = s + mods
    return s.masked_fill(~_by_head(mask), float("-inf"))


def _attend(qb, kb, vb, *, scale, sink, mask, mods=None):
    """One sequence: qb (Sq, Hq, D), kb (Skv, Hk, D), vb (Skv, Hv, Dv) -> o (Sq, Hq, Dv), lse, row max, row
    sum of exp(score - max) (each (Hq, Sq); an empty row without a sink: -inf, -inf, 0); `mods` (`score_mods`)
    join the scores before the max, so the row max is that of the final logits (cuDNN's score_max)."""
    hq = qb.shape[1]
    kb = kb.repeat_interleave(hq // kb.shape[1], dim=1)
    vb = vb.repeat_interleave(hq // vb.shape[1], dim=1)
    s = _logits(qb, kb, scale=scale, mods=mods, mask=mask)
    if sink is not None:
        col = sink.view(hq, 1, 1).to(s.dtype).expand(hq, s.shape[1], 1)
        s = torch.cat([s, col], dim=2)
    lse = torch.logsumexp(s, dim=2)  # -inf where the row is empty
    p = torch.exp(s - lse.unsqueeze(2))
    p = torch.nan_to_num(p, nan=0.0)  # empty rows: exp(-inf - -inf)
    top = s.amax(dim=2) if s.shape[2] else torch.full_like(lse, float("-inf"))
    sum_exp = torch.nan_to_num(torch.exp(s - top.unsqueeze(2)), nan=0.0).sum(dim=2)
    if sink is not None:
        p = p[..., :-1]
    o = torch.einsum("hqk,khd->qhd", p, vb)
    return o, lse, top, sum_exp


def sdpa_fwd_reference(q, k, v, args: RefArgs, *, compute_dtype=torch.float32, row_stats=False):
    """Forward on canonical views with the contract's other arguments `args`; returns (o, lse) in
    `compute_dtype`, with `row_stats` (o, lse, score_max,
    score_sum_exp): the row max of the scaled, modified, masked scores (the sink included) and the row sum of
    exp(score - max), so lse = score_max + log(score_sum_exp).

    Dense views: q (B, Sq, Hq, D) -> o (B, Sq, Hq, Dv), lse (B, Hq, Sq).
    THD views:   q (Tq, Hq, D)    -> o (Tq, Hq, Dv),    lse (Hq, Tq).
    K and V may have different head counts, each dividing Hq.
    Rows past a sequence's length (padding) and empty rows get O = 0, LSE = -inf (score_max -inf, sum 0).
    A block mask's cleared tiles join the mask, so a row left with no key is an empty row.
    """
    thd = args.cu_seqlens_q is not None
    cd = compute_dtype
    q, k, v = q.to(cd), k.to(cd), v.to(cd)
    sink = args.sinks.to(cd) if args.sinks is not None else None
    dv = v.shape[-1]
    if thd:
        tq, hq = q.shape[0], q.shape[1]
        o = torch.zeros(tq, hq, dv, dtype=cd, device=q.device)
        shape = (hq, tq)
    else:
        bsz, sq, hq = q.shape[0], q.shape[1], q.shape[2]
        o = torch.zeros(bsz, sq, hq, dv, dtype=cd, device=q.device)
        shape = (bsz, hq, sq)
    lse, top = (torch.full(shape, float("-inf"), dtype=cd, device=q.device) for _ in range(2))
    sum_exp = torch.zeros(shape, dtype=cd, device=q.device)
    for _, qs, ks, mask, mods in _sequences(q, k, args, block_mask=args.block_mask):
        ob, *rows = _attend(q[qs], k[ks], v[ks], scale=args.softmax_scale, sink=sink, mask=mask, mods=mods)
        o[qs] = ob
        for out, rb in zip((lse, top, sum_exp), rows):
            if thd:
                out[:, qs[0]] = rb
            else:
                out[qs[0], :, qs[1]] = rb
    return (o, lse, top, sum_exp) if row_stats else (o, lse)


def _attend_bwd(qb, kb, vb, dob, *, scale, sink, mask, mods=None, ob=None, lseb=None):
    """Gradients of one sequence in closed form (no autograd: it works under any grad mode or dispatch state).

    qb (Sq, Hq, D), kb/vb (Skv, Hk/Hv, D/Dv), dob (Sq, Hq, Dv) -> dq, dk, dv (same shapes), dsink (Hq,) or None,
    ds (Hq, Sq, Skv): the gradient of the logits after the scale (the bias gradient before any broadcast sum).
    `ob` (Sq, Hq, Dv) and `lseb` (Hq, Sq) are the forward's O and LSE as given (the backward contract: a block of
    a longer row, as in a ring, is handed the row's merged O and LSE); each left None is recomputed from the block.
    """
    hq, hk, hv = qb.shape[1], kb.shape[1], vb.shape[1]
    kk = kb.repeat_interleave(hq // hk, dim=1)
    vv = vb.repeat_interleave(hq // hv, dim=1)
    if ob is None or lseb is None:
        own_o, own_lse = _attend(qb, kb, vb, scale=scale, sink=sink, mask=mask, mods=mods)[:2]
        ob = own_o if ob is None else ob
        lseb = own_lse if lseb is None else lseb
    o, lse = ob, lseb  # o (Sq, Hq, Dv), lse (Hq, Sq)
    s = _logits(qb, kk, scale=scale, mods=mods, mask=mask)
    p = torch.exp(s - lse.unsqueeze(2)).masked_fill(~_by_head(mask), 0.0)
    p = torch.nan_to_num(p, nan=0.0)  # empty rows: lse = -inf
    dv = torch.einsum("hqk,qhd->khd", p, dob)
    dp = torch.einsum("qhd,khd->hqk", dob, vv)
    di = torch.einsum("qhd,qhd->hq", dob, o)  # rowsum(dO * O)
    ds = p * (dp - di.unsqueeze(2))
    dq = torch.einsum("hqk,khd->qhd", ds, kk) * scale
    dk = torch.einsum("hqk,qhd->khd", ds, qb) * scale
    fold = lambda t, h: t.reshape(t.shape[0], h, hq // h, t.shape[-1]).sum(2)  # noqa: E731  (GQA: sum each group)
    dsink = None
    if sink is not None:
        dsink = -(torch.nan_to_num(torch.exp(sink.view(hq, 1) - lse), nan=0.0) * di).sum(1)
    return dq, fold(dk, hk), fold(dv, hv), dsink, ds


def sdpa_bwd_reference(q, k, v, do, args: RefArgs, *, compute_dtype=torch.float64, dbias=False, o=None, lse=None):
    """Gradients of `sdpa_fwd_reference` in `compute_dtype`, in closed form per sequence (`args` without a block
    mask: the backward has none).

    `o` (the canonical view of O, shaped like q's with Dv) and `lse` (the forward's `lse` shape: dense (B, Hq, Sq),
    THD (Hq, Tq)) are used as given, as every engine's backward uses its bound O and Stats; left None, they are
    recomputed from q, k, v. Returns (dq, dk, dv, dsinks or None, dbias or None) on the canonical views' shapes;
    rows and keys outside every sequence get zero gradients. With `dbias`, the bias gradient has the declared
    bias's shape: dS (the logits' gradient, before the scale) summed over the batch entries and heads the bias
    broadcasts over, zero at masked and padding positions.
    """
    if args.block_mask is not None:
        raise ValueError("sdpa_bwd_reference: the backward takes no block mask")
    thd = args.cu_seqlens_q is not None
    cd = compute_dtype
    q, k, v, do = q.to(cd), k.to(cd), v.to(cd), do.to(cd)
    o = o.to(cd) if o is not None else None
    lse = lse.to(cd) if lse is not None else None
    sink = args.sinks.to(cd) if args.sinks is not None else None
    hq = q.shape[-2]
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dsink = torch.zeros(hq, dtype=cd, device=q.device) if sink is not None else None
    dbias_out = torch.zeros(tuple(args.bias.shape), dtype=cd, device=q.device) if dbias else None
    for b, qs, ks, mask, mods in _sequences(q, k, args):
        lq, lk = mask.shape[-2:]
        lseb = None if lse is None else (lse[:, qs[0]] if thd else lse[qs[0], :, qs[1]])
        parts = _attend_bwd(
            q[qs],
            k[ks],
            v[ks],
            do[qs],
            scale=args.softmax_scale,
            sink=sink,
            mask=mask,
            mods=mods,
            ob=None if o is None else o[qs],
            lseb=lseb,
        )
        dq[qs], dk[ks], dv[ks] = parts[:3]
        if sink is not None:
            dsink += parts[3]
        if dbias:
            ds = parts[4] if dbias_out.shape[1] > 1 else parts[4].sum(0, keepdim=True)
            _bias_block(dbias_out, b, lq, lk).add_(ds)
    return dq, dk, dv, dsink, dbias_out


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
