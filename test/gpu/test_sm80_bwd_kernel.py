"""The mma.sync SDPA backward chain, called directly with canonical views, against float64 autograd.

O and LSE come from the reference forward; dQ / dK / dV / dSink are compared
with a local float64 autograd oracle. Outputs and the whole workspace are
poisoned (0xFF bytes: NaN floats, -1 semaphores) before each run, so every
element that must be written is, and the chain clears its own scratch.
Deterministic mode is checked bitwise across two runs, and strided Stats
against contiguous Stats bitwise. Timings against FlashAttention-2 are
`benchmarks/sm80_bwd_sweep.py`'s job.
"""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.gpu

from frost.adapters.reference_math import allowed_mask  # noqa: E402
from frost.engines.sm80.sdpa_bwd_knobs import default_knobs  # noqa: E402
from frost.engines.sm80.sdpa_bwd_params import Sm80BwdParams  # noqa: E402
from frost.testing.bwd_chain import compile_chains, workspace_views  # noqa: E402
from frost.testing.cases import params_kwargs  # noqa: E402

DT = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _p(**kw):
    return Sm80BwdParams(**params_kwargs(default_knobs, **kw))


class Case:
    """One problem: params, geometry, mask band and input layout."""

    def __init__(
        self,
        name,
        params,
        b=2,
        sq=300,
        skv=300,
        wl=None,
        wr=None,
        thd_lens=None,
        used=None,
        strided_lse=False,
        runs=1,
        wide=False,
    ):
        self.name, self.p, self.b, self.sq, self.skv = name, params, b, sq, skv
        self.wl, self.wr, self.thd_lens, self.used = wl, wr, thd_lens, used
        self.strided_lse, self.runs = strided_lse, runs
        self.wide = wide  # every io tensor's rows WIDE elements longer than its head dim, the extra columns NaN


# the main table: masks and bands, GQA / MQA, sinks, packed and padded batches, deterministic turns (dq_splits,
# the rotated order, late release), fused loads, 16 warps, sm120
BASE_CASES = [
    Case("d128_plain", _p(), sq=300, skv=300),
    Case("d128_causal_tl_sq<skv", _p(has_window_right=True), sq=200, skv=333, wr=0),
    Case("d128_causal_br", _p(has_window_right=True, bottom_right=True), sq=200, skv=450, wr=0),
    Case("d128_causal_br_sq>skv", _p(has_window_right=True, bottom_right=True), sq=300, skv=130, wr=0),
    Case(
        "d64_window_br_gqa",
        _p(d=64, hq=8, hk=2, has_window_left=True, has_window_right=True, bottom_right=True),
        sq=513,
        skv=600,
        wl=64,
        wr=0,
    ),
    Case("d128_band_wl40_wr17", _p(has_window_left=True, has_window_right=True), sq=257, skv=257, wl=40, wr=17),
    Case("d96_fp16_sinks", _p(d=96, dtype="fp16", has_sinks=True, has_dsinks=True), sq=190, skv=250),
    Case("d192x128_causal_mqa", _p(d=192, dv=128, hq=4, hk=1, has_window_right=True), sq=260, skv=260, wr=0),
    Case("d256_causal", _p(d=256, hq=2, hk=2, has_window_right=True), sq=200, skv=200, wr=0),
    Case(
        "thd_d128_causal_gqa_sinks",
        _p(hq=4, hk=2, is_thd=True, has_window_right=True, has_sinks=True, has_dsinks=True),
        thd_lens=[(0, 0), (1, 1), (37, 37), (300, 300), (129, 129), (5, 200)],
        wr=0,
    ),
    Case(
        "thd_d64_det",
        _p(d=64, hq=2, hk=2, is_thd=True, deterministic=True),
        thd_lens=[(513, 513), (1, 7), (0, 3), (64, 64)],
        runs=2,
    ),
    Case(
        "pad_d128_causal",
        _p(has_seqused=True, has_window_right=True),
        b=4,
        sq=256,
        skv=256,
        wr=0,
        used=[(256, 256), (100, 180), (1, 1), (0, 0)],
    ),
    Case("det_d128_causal", _p(has_window_right=True, deterministic=True), b=2, sq=520, skv=520, wr=0, runs=2),
    Case("det_d128_strided_lse", _p(deterministic=True, hq=4, hk=2), b=2, sq=300, skv=300, strided_lse=True),
    Case(
        "det_d64_window_br_gqa",
        _p(d=64, hq=8, hk=2, has_window_left=True, has_window_right=True, bottom_right=True, deterministic=True),
        sq=513,
        skv=600,
        wl=64,
        wr=0,
        runs=2,
    ),
    Case("d128_causal_fused", _p(has_window_right=True, knobs=dict(fused_prefetch=True)), sq=333, skv=333, wr=0),
    Case(
        "thd_d64_w16",
        _p(
            d=64,
            hq=4,
            hk=2,
            is_thd=True,
            has_window_right=True,
            knobs=dict(num_warps=16, sdp_warps_m=4, dkv_warps_n=8, dq_warps_m=4),
        ),
        thd_lens=[(0, 0), (1, 1), (300, 300), (129, 200)],
        wr=0,
    ),
    Case("d64_gqa_window_left", _p(d=64, hq=8, hk=2, has_window_left=True), sq=300, skv=450, wl=200),
    Case(
        "det_late_release_d128_causal_gqa",
        _p(hq=4, hk=2, has_window_right=True, deterministic=True, knobs=dict(det_late_release=True)),
        b=2,
        sq=520,
        skv=520,
        wr=0,
        runs=2,
    ),
    Case(
        "thd_d64_det_late_release",
        _p(d=64, hq=2, hk=2, is_thd=True, deterministic=True, knobs=dict(det_late_release=True)),
        thd_lens=[(513, 513), (1, 7), (0, 3), (64, 64)],
        runs=2,
    ),
    Case("d128_w16", _p(knobs=dict(num_warps=16, sdp_warps_m=4, dkv_warps_n=8, dq_warps_m=4)), sq=300, skv=300),
    # dense dQ accumulator in 8x8 blocks: rows not a multiple of 8 (padding rows), deterministic turns,
    # sinks, seqused padding
    Case(
        "det_d64_acc_blocks_causal_sinks",
        _p(d=64, hq=4, hk=2, has_window_right=True, has_sinks=True, has_dsinks=True, deterministic=True),
        b=2,
        sq=517,
        skv=517,
        wr=0,
        runs=2,
    ),
    Case("pad_d128_acc_blocks", _p(has_seqused=True), b=3, sq=203, skv=203, used=[(203, 203), (9, 150), (0, 0)]),
    Case(
        "thd_d128_det",
        _p(hq=2, hk=2, is_thd=True, deterministic=True),
        thd_lens=[(513, 513), (1, 7), (0, 3), (200, 64)],
        runs=3,
    ),
    # deterministic through split accumulator copies (dq_splits): uneven and empty splits, padding, windows,
    # sinks, more splits than key tiles
    Case(
        "det_splits3_d128_causal_gqa_sinks",
        _p(
            hq=4,
            hk=2,
            has_window_right=True,
            has_sinks=True,
            has_dsinks=True,
            deterministic=True,
            knobs=dict(dq_splits=3),
        ),
        b=2,
        sq=520,
        skv=520,
        wr=0,
        runs=3,
    ),
    Case(
        "det_splits2_d64_pad",
        _p(d=64, has_seqused=True, deterministic=True, knobs=dict(dq_splits=2)),
        b=3,
        sq=203,
        skv=203,
        used=[(203, 203), (9, 150), (0, 0)],
        runs=2,
    ),
    Case(
        "det_splits1_d64_window_br_gqa",
        _p(
            d=64,
            hq=8,
            hk=2,
            has_window_left=True,
            has_window_right=True,
            bottom_right=True,
            deterministic=True,
            knobs=dict(dq_splits=1),
        ),
        sq=513,
        skv=600,
        wl=64,
        wr=0,
        runs=2,
    ),
    Case(
        "det_splits8_d128_more_splits_than_tiles",
        _p(deterministic=True, knobs=dict(dq_splits=8)),
        b=2,
        sq=300,
        skv=300,
        runs=2,
    ),
    Case(
        "det_splits4_d64_skv>sq",
        _p(d=64, hq=4, hk=4, deterministic=True, knobs=dict(dq_splits=4)),
        sq=333,
        skv=700,
        runs=2,
    ),
    # deterministic turns in the rotated order (rotated walks, turns by arrival): GQA, more key tiles than query
    # tiles (ties in a step), fewer, padding with sinks, THD, both release points
    Case(
        "det_cyc_d128_gqa",
        _p(hq=4, hk=2, deterministic=True, knobs=dict(det_order="rotated")),
        b=2,
        sq=520,
        skv=520,
        runs=3,
    ),
    Case("det_cyc_d64_skv>sq", _p(d=64, deterministic=True, knobs=dict(det_order="rotated")), sq=200, skv=900, runs=2),
    Case(
        "det_cyc_d128_sq>skv",
        _p(deterministic=True, knobs=dict(det_order="rotated", det_late_release=True)),
        sq=900,
        skv=130,
        runs=2,
    ),
    Case(
        "det_cyc_d64_pad_sinks",
        _p(
            d=64,
            has_seqused=True,
            has_sinks=True,
            has_dsinks=True,
            deterministic=True,
            knobs=dict(det_order="rotated", det_late_release=False),
        ),
        b=3,
        sq=300,
        skv=300,
        used=[(300, 300), (9, 150), (0, 0)],
        runs=2,
    ),
    Case(
        "thd_d64_det_cyc_gqa",
        _p(d=64, hq=4, hk=2, is_thd=True, deterministic=True, knobs=dict(det_order="rotated")),
        thd_lens=[(513, 513), (1, 7), (0, 3), (64, 64), (100, 700)],
        runs=3,
    ),
    Case("thd_d128_plain", _p(is_thd=True), thd_lens=[(77, 77), (1, 1), (200, 150)]),
    Case("sm120_d128_causal_s1", _p(family="sm120", has_window_right=True), sq=300, skv=300, wr=0),
    Case("sm120_d256_thd", _p(family="sm120", d=256, hq=2, hk=2, is_thd=True), thd_lens=[(70, 70), (1, 1), (33, 90)]),
]


# head dims outside the tuned set: tiles padded past the head dim (72 on 96 columns, 40 on 64, 8 on 32), tile
# widths off the tuned ones (160), d_qk != d_v both ways, and rows wider than the head dim holding NaN
HEAD_DIM_CASES = [
    Case("hd_d72_causal_br", _p(d=72, has_window_right=True, bottom_right=True), sq=200, skv=333, wr=0),
    Case(
        "hd_thd_d40_causal_gqa_sinks",
        _p(d=40, hq=4, hk=2, is_thd=True, has_window_right=True, has_sinks=True, has_dsinks=True),
        thd_lens=[(0, 0), (1, 1), (37, 37), (300, 300), (5, 200)],
        wr=0,
    ),
    Case("hd_d192v64_mqa", _p(d=192, dv=64, hq=4, hk=1), sq=260, skv=260),
    Case(
        "hd_d80_fp16_band",
        _p(dtype="fp16", d=80, has_window_left=True, has_window_right=True),
        sq=257,
        skv=257,
        wl=40,
        wr=17,
    ),
    Case(
        "hd_pad_d112_sinks",
        _p(d=112, has_seqused=True, has_sinks=True, has_dsinks=True),
        b=3,
        sq=203,
        skv=203,
        used=[(203, 203), (9, 150), (0, 0)],
    ),
    Case("hd_d32_gqa", _p(d=32, hq=8, hk=2), sq=300, skv=300),
    Case("hd_d48_causal", _p(d=48, has_window_right=True), sq=333, skv=333, wr=0),
    Case("hd_d160_causal", _p(d=160, has_window_right=True), sq=200, skv=200, wr=0),
    Case("hd_d8v24", _p(d=8, dv=24), sq=130, skv=190),
    Case(
        "hd_thd_d64v256_causal",
        _p(d=64, dv=256, is_thd=True, has_window_right=True),
        thd_lens=[(70, 70), (1, 1), (33, 90)],
        wr=0,
    ),
    Case(
        "hd_det_d72_causal_gqa",
        _p(d=72, hq=4, hk=2, has_window_right=True, deterministic=True),
        sq=520,
        skv=520,
        wr=0,
        runs=2,
    ),
    Case("hd_det_splits2_d8v24", _p(d=8, dv=24, deterministic=True, knobs=dict(dq_splits=2)), sq=300, skv=300, runs=2),
    Case(
        "hd_thd_d80_det",
        _p(d=80, hq=2, hk=2, is_thd=True, deterministic=True),
        thd_lens=[(513, 513), (1, 7), (0, 3), (200, 64)],
        runs=2,
    ),
    Case("hd_sm120_d136v128_causal", _p(family="sm120", d=136, dv=128, has_window_right=True), sq=300, skv=300, wr=0),
    Case("hd_wide_d72_causal_gqa", _p(d=72, hq=4, hk=2, has_window_right=True), sq=300, skv=300, wr=0, wide=True),
    Case("hd_wide_thd_d40v104", _p(d=40, dv=104, is_thd=True), thd_lens=[(77, 77), (1, 1), (200, 150)], wide=True),
]

WIDE = 8  # extra elements per row of a `wide` case (a 16-byte multiple, as every declared stride must be)


def _widen(x, fill=float("nan")):
    """x's values in a buffer whose rows are WIDE elements longer, the extra columns `fill`: the same view with
    longer row strides."""
    buf = torch.full(x.shape[:-1] + (x.shape[-1] + WIDE,), fill, dtype=x.dtype, device=x.device)
    buf[..., : x.shape[-1]] = x
    return buf[..., : x.shape[-1]]


def extra_cols(x):
    """The WIDE columns past a `_widen` view's head dim."""
    return torch.as_strided(x, x.shape[:-1] + (WIDE,), x.stride(), x.storage_offset() + x.shape[-1])


# ------------------------------------------------------------------------------------ oracle
def _seq_loss(qb, kb, vb, dob, scale, sink, mask):
    """sum(O * dO) of one sequence in float64, NaN-free for empty rows."""
    hq, hk = qb.shape[1], kb.shape[1]
    kb = kb.repeat_interleave(hq // hk, dim=1)
    vb = vb.repeat_interleave(hq // hk, dim=1)
    s = torch.einsum("qhd,khd->hqk", qb, kb) * scale
    s = s.masked_fill(~mask.unsqueeze(0), float("-inf"))
    if sink is not None:
        s = torch.cat([s, sink.view(-1, 1, 1).expand(-1, s.shape[1], 1)], dim=2)
    m = s.amax(dim=2, keepdim=True).clamp(min=-1e30).detach()
    e = torch.exp(s - m)
    p = e / e.sum(dim=2, keepdim=True).clamp(min=1e-300)
    if sink is not None:
        p = p[..., :-1]
    o = torch.einsum("hqk,khd->qhd", p, vb)
    return (o * dob).sum()


def _ranges(case, dev_lens):
    if case.thd_lens is not None:
        out, oq, ok = [], 0, 0
        for lq, lk in case.thd_lens:
            out.append((oq, lq, ok, lk))
            oq += lq
            ok += lk
        return out
    if case.used is not None:
        return [(0, lq, 0, lk) for lq, lk in case.used]
    return [(0, case.sq, 0, case.skv)] * case.b


def oracle(case, q, k, v, do, sinks, scale):
    """float64 autograd gradients (dq, dk, dv, dsinks) on canonical views."""
    p = case.p
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    s64 = sinks.detach().double().requires_grad_() if sinks is not None else None
    do64 = do.double()
    loss = q64.new_zeros(())
    for b, (oq, lq, ok, lk) in enumerate(_ranges(case, None)):
        if lq == 0 or lk == 0 and s64 is None:
            continue
        mask = allowed_mask(
            lq, lk, window_left=case.wl, window_right=case.wr, bottom_right=p.bottom_right, device=q.device
        )
        if p.is_thd:
            sl = (slice(oq, oq + lq),)
            skl = (slice(ok, ok + lk),)
        else:
            sl = (b, slice(0, lq))
            skl = (b, slice(0, lk))
        loss = loss + _seq_loss(q64[sl], k64[skl], v64[skl], do64[sl], scale, s64, mask)
    wrt = [q64, k64, v64] + ([s64] if s64 is not None else [])
    grads = torch.autograd.grad(loss, wrt, allow_unused=True)
    grads = [g if g is not None else torch.zeros_like(w) for g, w in zip(grads, wrt)]
    return grads + ([None] if s64 is None else [])


# ------------------------------------------------------------------------------------ inputs
def make_inputs(case, device="cuda", seed=0):
    from frost.adapters.reference_math import RefArgs, sdpa_fwd_reference

    p = case.p
    g = torch.Generator(device=device).manual_seed(seed)
    dt = DT[p.dtype]
    hq, hk, d, dv = p.num_heads_q, p.num_heads_kv, p.head_dim, p.head_dim_v

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dt)

    t = {}
    if p.is_thd:
        lens = case.thd_lens
        tq, tk = sum(a for a, _ in lens), sum(b for _, b in lens)
        t["q"], t["k"], t["v"] = rnd(tq, hq, d), rnd(tk, hk, d), rnd(tk, hk, dv)
        t["do"] = rnd(tq, hq, dv)
        cq = [0]
        ck = [0]
        for a, b in lens:
            cq.append(cq[-1] + a)
            ck.append(ck[-1] + b)
        t["cu_seqlens_q"] = torch.tensor(cq, dtype=torch.int32, device=device)
        t["cu_seqlens_kv"] = torch.tensor(ck, dtype=torch.int32, device=device)
        t["dq"] = torch.empty(tq, hq, d, dtype=dt, device=device)
        # dK / dV declared head-major: (H, T, D) memory, (T, H, D) view
        t["dk"] = torch.empty(hk, tk, d, dtype=dt, device=device).transpose(0, 1)
        t["dv"] = torch.empty(hk, tk, dv, dtype=dt, device=device).transpose(0, 1)
    else:
        b, sq, skv = case.b, case.sq, case.skv
        t["q"] = rnd(b, sq, hq, d)  # BSHD memory
        t["k"] = rnd(b, hk, skv, d).transpose(1, 2)  # BHSD memory
        t["v"] = rnd(b, hk, skv, dv).transpose(1, 2)
        t["do"] = rnd(b, hq, sq, dv).transpose(1, 2)
        t["dq"] = torch.empty(b, hq, sq, d, dtype=dt, device=device).transpose(1, 2)
        t["dk"] = torch.empty(b, skv, hk, d, dtype=dt, device=device)
        t["dv"] = torch.empty(b, hk, skv, dv, dtype=dt, device=device).transpose(1, 2)
        if case.used is not None:
            t["seqused_q"] = torch.tensor([a for a, _ in case.used], dtype=torch.int32, device=device)
            t["seqused_kv"] = torch.tensor([x for _, x in case.used], dtype=torch.int32, device=device)
    sinks = None
    if p.has_sinks:
        sinks = torch.randn(hq, generator=g, device=device, dtype=torch.float32)
        t["sinks"] = sinks
        t["dsinks"] = torch.empty(hq, dtype=torch.float32, device=device)
    scale = 1.0 / math.sqrt(d)
    o, lse = sdpa_fwd_reference(
        t["q"],
        t["k"],
        t["v"],
        RefArgs(
            scale,
            cu_seqlens_q=t.get("cu_seqlens_q"),
            cu_seqlens_kv=t.get("cu_seqlens_kv"),
            seqused_q=t.get("seqused_q"),
            seqused_kv=t.get("seqused_kv"),
            sinks=sinks,
            window_left=case.wl,
            window_right=case.wr,
            bottom_right=p.bottom_right,
        ),
    )
    t["o"] = o.to(dt)
    if case.wide:  # NaN in the columns past the head dim: a kernel reading them would spread NaN
        for n in ("q", "k", "v", "do", "o", "dq", "dk", "dv"):
            t[n] = _widen(t[n])
    if case.strided_lse:
        # Stats declared (B, S, H) in memory: the (B, H, S) view has strides (S*H, 1, H)
        buf = torch.empty(lse.shape[0], lse.shape[2], lse.shape[1], dtype=torch.float32, device=device)
        buf.copy_(lse.transpose(1, 2))
        t["lse"] = buf.transpose(1, 2)
        t["lse_contig"] = lse.contiguous()
    else:
        t["lse"] = lse.contiguous()
    scalars = dict(softmax_scale=scale)
    if p.has_window_left:
        scalars["window_left"] = case.wl
    if p.has_window_right:
        scalars["window_right"] = case.wr
    if p.is_thd:
        scalars["max_seqlen_q"] = max(a for a, _ in case.thd_lens)
        scalars["max_seqlen_kv"] = max(b for _, b in case.thd_lens)
    return t, scalars, sinks, scale


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def run_case(case, chain, device="cuda"):
    """Returns (ok, message)."""
    p = case.p
    t, scalars, sinks, scale = make_inputs(case, device)
    outs = ["dq", "dk", "dv"] + (["dsinks"] if p.has_dsinks else [])
    results = []
    lse_variants = [("lse", t["lse"])] + ([("lse_contig", t["lse_contig"])] if case.strided_lse else [])
    for tag, lse in lse_variants:
        for r in range(case.runs):
            for n in outs:
                t[n].fill_(float("nan"))
            views = workspace_views(p, t, poison=True)
            chain({**t, "lse": lse}, scalars, views)
            torch.cuda.synchronize()
            results.append({n: t[n].clone() for n in outs})
    ref = oracle(case, t["q"], t["k"], t["v"], t["do"], sinks, scale)
    refs = dict(dq=ref[0], dk=ref[1], dv=ref[2])
    if p.has_dsinks:
        refs["dsinks"] = ref[3]
    msgs, ok = [], True
    got = results[0]
    if case.wide:
        for n in ("dq", "dk", "dv"):
            if not torch.isnan(extra_cols(t[n])).all():
                ok = False
                msgs.append(f"{n}: written past its head dim")
    for n in outs:
        if torch.isnan(got[n]).any():
            ok = False
            msgs.append(f"{n}: {int(torch.isnan(got[n]).sum())} NaN (unwritten?)")
            continue
        e = rel(got[n], refs[n])
        tol = 2e-2
        msgs.append(f"{n} {e:.2e}")
        if not e < tol:
            ok = False
    if len(results) > 1:
        same = all(torch.equal(results[0][n], r[n]) for r in results[1:] for n in outs)
        msgs.append("bitwise-identical" if same else "NOT bitwise-identical")
        ok = ok and same
    return ok, ", ".join(msgs)


def run_graph_replay(case, chain, new_lens, device="cuda"):
    """Capture the THD chain in a CUDA graph, write new lengths into the same device tensors, replay, and check
    against the oracle. The new lengths keep both packed totals: the inputs are drawn again for them (the same
    draws, since the shapes are the same) to refresh O and LSE, and every dK / dV row stays inside a sequence.
    Every new length stays within the captured max_seqlen_q / max_seqlen_kv: a longer one is capped at them
    (docs/lengths.md)."""
    p = case.p
    for i in (0, 1):
        assert sum(x[i] for x in new_lens) == sum(x[i] for x in case.thd_lens), "new lengths must keep the totals"
    t, scalars, _, _ = make_inputs(case, device)
    views = workspace_views(p, t, poison=False)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        chain(t, scalars, views, stream=stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        chain(t, scalars, views, stream=stream)
    new = Case(case.name + "_replay", p, thd_lens=new_lens, wl=case.wl, wr=case.wr)
    t2, _, sinks2, scale2 = make_inputs(new, device)
    for n in ("cu_seqlens_q", "cu_seqlens_kv", "o", "lse"):
        t[n].copy_(t2[n])
    outs = ["dq", "dk", "dv"] + (["dsinks"] if p.has_dsinks else [])
    for n in outs:
        t[n].fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref = oracle(new, t["q"], t["k"], t["v"], t["do"], sinks2, scale2)
    refs = dict(dq=ref[0], dk=ref[1], dv=ref[2], dsinks=ref[3])
    msgs, ok = [], True
    for n in outs:
        e = rel(t[n], refs[n]) if not torch.isnan(t[n]).any() else float("nan")
        msgs.append(f"{n} {e:.2e}")
        ok = ok and e < 2e-2
    return ok, ", ".join(msgs)


REPLAY_LENS = [(300, 300), (129, 129), (37, 137), (1, 96), (5, 5), (0, 0)]


# ------------------------------------------------------------------------------------ pytest
CASES = BASE_CASES + HEAD_DIM_CASES


@pytest.fixture(scope="module")
def chains():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return dict(zip([c.name for c in CASES], compile_chains([c.p for c in CASES])))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_bwd_chain_matches_float64_autograd(case, chains):
    ok, msg = run_case(case, chains[case.name])
    assert ok, msg


def test_thd_graph_replay_honors_new_lengths(chains):
    name = "thd_d128_causal_gqa_sinks"
    case = [c for c in CASES if c.name == name][0]
    ok, msg = run_graph_replay(case, chains[name], REPLAY_LENS)
    assert ok, msg


# ------------------------------------------------------------------------------------ NaN in padding
def run_nan_padding(case, chain, tail=96, device="cuda"):
    """Padding rows of every input (dense: past seqused; THD: `tail` tokens after the last sequence)
    hold NaN / Inf, as uninitialized user buffers do; gradients of valid rows must be finite and match
    the oracle on the clean inputs, dQ of padding rows must be 0, dense dK / dV padding rows 0."""
    p = case.p
    t, scalars, sinks, scale = make_inputs(case, device)
    clean = {n: t[n].clone() for n in ("q", "k", "v", "do")}
    nan = float("nan")
    if p.is_thd:
        tq, tk = t["q"].shape[0], t["k"].shape[0]

        def grow(x, dim=0, value=nan):
            shape = list(x.shape)
            shape[dim] = tail
            return torch.cat([x, torch.full(shape, value, dtype=x.dtype, device=device)], dim=dim)

        for n in ("q", "do", "o", "v"):
            t[n] = grow(t[n])
        t["k"] = grow(t["k"], value=float("inf"))
        t["lse"] = grow(t["lse"], 1)
        t["dq"] = torch.empty(tq + tail, *t["dq"].shape[1:], dtype=t["dq"].dtype, device=device)
        t["dk"] = torch.empty(
            t["k"].shape[1], tk + tail, t["k"].shape[2], dtype=t["dk"].dtype, device=device
        ).transpose(0, 1)
        t["dv"] = torch.empty(
            t["v"].shape[1], tk + tail, t["v"].shape[2], dtype=t["dv"].dtype, device=device
        ).transpose(0, 1)
    else:
        for b, (lq, lk) in enumerate(case.used):
            for n in ("q", "do", "o"):
                t[n][b, lq:] = nan
            t["lse"][b, :, lq:] = nan
            t["k"][b, lk:] = float("inf")
            t["v"][b, lk:] = nan
    outs = ["dq", "dk", "dv"] + (["dsinks"] if p.has_dsinks else [])
    for n in outs:
        t[n].fill_(nan)
    chain(t, scalars, workspace_views(p, t, poison=True))
    torch.cuda.synchronize()
    ref = oracle(case, clean["q"], clean["k"], clean["v"], clean["do"], sinks, scale)
    refs = dict(dq=ref[0], dk=ref[1], dv=ref[2], dsinks=ref[3])
    got = {n: t[n] for n in outs}
    if p.is_thd:
        assert (got["dq"][tq:] == 0).all(), "dQ of tokens outside every sequence must be 0"
        got["dq"], got["dk"], got["dv"] = got["dq"][:tq], got["dk"][:tk], got["dv"][:tk]  # dK/dV tail: unwritten
    msgs, ok = [], True
    for n in outs:
        if not torch.isfinite(got[n]).all():
            ok = False
            msgs.append(f"{n}: {int((~torch.isfinite(got[n])).sum())} non-finite")
            continue
        e = rel(got[n], refs[n])
        msgs.append(f"{n} {e:.2e}")
        ok = ok and e < 2e-2
    return ok, ", ".join(msgs)


@pytest.mark.parametrize("name", ["pad_d128_causal", "thd_d128_causal_gqa_sinks", "thd_d64_det", "pad_d128_acc_blocks"])
def test_nan_in_padding_does_not_leak(name, chains):
    case = [c for c in CASES if c.name == name][0]
    ok, msg = run_nan_padding(case, chains[name])
    assert ok, msg


# ------------------------------------------------------------------------------------ bench
