"""K and V with their own head counts, and the score_max / score_sum_exp outputs, through the graph API on a GPU,
against the float64 oracle (test/oracle.py).

Forward: every engine that plans the graph (sm90, sm80, cudnn) writes O, Stats, score_max and score_sum_exp over
poisoned (NaN) outputs, dense and packed (THD), causal and not, with declared strides (BHSD, token-major, THD
head-major), fully masked rows (bottom-right causal with S_q > S_kv: max -inf, sum 0) and padding rows.
Backward with split heads: the mma.sync chain (`sm80`) and the wgmma chain (`sm90`) serve them, nested or not (a
CTA walks whole K groups and whole V groups and writes each head's tile where its group ends; the wgmma chain then
loads the next head's tile by TMA) and must match the oracle's gradients, deterministic mode (bitwise stable) and
padded head dims included; cuDNN and the reference by name match too when they plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

import frost
from test.oracle import assert_close_to_oracle
from test import oracle

pytestmark = pytest.mark.gpu
DEV = "cuda"  # the same checks run on the CPU reference engine with DEV = "cpu"


@dataclass(frozen=True)
class Problem:
    hq: int
    hk: int
    hv: int
    d: int = 128
    dv: int | None = None
    b: int = 2
    sq: int = 256
    skv: int = 256
    causal: bool = False
    bottom_right: bool = False
    thd_lens: tuple | None = None  # per-sequence (len_q, len_kv)
    padding: tuple | None = None  # dense: per-batch (len_q, len_kv)
    sinks: bool = False
    row_stats: bool = True  # declare score_max and score_sum_exp
    stats: bool = True
    stats_layout: str = "bhs"  # dense: "bhs" (B, H, S, 1) row-major or "bsh" token-major; THD: "th" or "ht"

    @property
    def id(self) -> str:
        parts = [f"h{self.hq}-{self.hk}-{self.hv}", f"d{self.d}" + (f"x{self.dv}" if self.dv else "")]
        for on, tag in (
            (self.causal, "causal"),
            (self.bottom_right, "br"),
            (self.thd_lens is not None, "thd"),
            (self.padding is not None, "pad"),
            (self.sinks, "sink"),
            (self.row_stats, "rowstats"),
            (not self.stats, "nostats"),
        ):
            if on:
                parts.append(tag)
        if self.sq != self.skv:
            parts.append(f"s{self.sq}x{self.skv}")
        return "-".join(parts + [self.stats_layout])

    def mask_kw(self) -> dict:
        if self.causal:
            return {"use_causal_mask_bottom_right": True} if self.bottom_right else {"use_causal_mask": True}
        return {}

    def oracle_mask(self) -> dict:
        if self.causal:
            return {"causal_bottom_right": True} if self.bottom_right else {"causal": True}
        return {}


FWD = [
    Problem(6, 6, 1),
    Problem(6, 6, 1, causal=True, stats_layout="bsh"),
    Problem(8, 2, 4),
    Problem(8, 2, 4, causal=True, sinks=True),
    Problem(8, 2, 4, d=64, thd_lens=((1, 1), (300, 300), (0, 5), (77, 129)), causal=True, stats_layout="ht"),
    Problem(6, 6, 1, thd_lens=((129, 64), (7, 7)), stats_layout="th"),
    Problem(4, 4, 4, causal=True),
    Problem(4, 4, 4, thd_lens=((200, 200), (33, 90)), causal=True, stats_layout="ht"),
    Problem(4, 4, 4, causal=True, bottom_right=True, sq=300, skv=100),  # rows 0..199 have no key
    Problem(4, 4, 4, padding=((200, 256), (37, 5)), causal=True),
    Problem(32, 8, 8, d=128, sq=7, skv=2048, causal=True, bottom_right=True, sinks=True),  # packed GQA (sm90)
    Problem(8, 2, 4, d=128, sq=7, skv=2048, causal=True, bottom_right=True, sinks=True),  # packs head pairs
    Problem(8, 2, 4, stats=False),
    Problem(6, 6, 1, d=96, row_stats=False, causal=True),
]

FWD_ENGINES = ["sm90", "sm80", "cudnn"]


def _inputs(p: Problem, dtype=torch.bfloat16, seed=0) -> dict:
    g = torch.Generator(device=DEV).manual_seed(seed)
    dv = p.dv or p.d

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device=DEV, dtype=torch.float32).to(dtype)

    t = {}
    if p.thd_lens is not None:
        tq, tk = sum(a for a, _ in p.thd_lens), sum(b for _, b in p.thd_lens)
        t["q"], t["k"], t["v"] = rnd(tq, p.hq, p.d), rnd(tk, p.hk, p.d), rnd(tk, p.hv, dv)
        t["do"] = rnd(tq, p.hq, dv)
        t["cu_seq_len_q"] = torch.tensor(_prefix(a for a, _ in p.thd_lens), device=DEV, dtype=torch.int32)
        t["cu_seq_len_kv"] = torch.tensor(_prefix(b for _, b in p.thd_lens), device=DEV, dtype=torch.int32)
    else:  # BSHD memory, (B, H, S, D) logical
        t["q"] = rnd(p.b, p.sq, p.hq, p.d).permute(0, 2, 1, 3)
        t["k"] = rnd(p.b, p.skv, p.hk, p.d).permute(0, 2, 1, 3)
        t["v"] = rnd(p.b, p.skv, p.hv, dv).permute(0, 2, 1, 3)
        t["do"] = rnd(p.b, p.sq, p.hq, dv).permute(0, 2, 1, 3)
        if p.padding is not None:
            t["seq_len_q"] = torch.tensor([a for a, _ in p.padding], device=DEV, dtype=torch.int32)
            t["seq_len_kv"] = torch.tensor([b for _, b in p.padding], device=DEV, dtype=torch.int32)
    if p.sinks:
        t["sink_token"] = torch.randn(p.hq, generator=g, device=DEV, dtype=torch.float32) * 2
    return t


def _prefix(lens) -> list:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


def _row_tensor(p: Problem, t: dict) -> torch.Tensor:
    """A poisoned fp32 per-row tensor with the problem's declared strides."""
    if p.thd_lens is not None:
        tq = t["q"].shape[0]
        x = torch.full((tq, p.hq, 1), float("nan"), device=DEV)
        if p.stats_layout == "ht":  # head-major (H, T) memory
            x = torch.full((p.hq, tq, 1), float("nan"), device=DEV).permute(1, 0, 2)
        return x
    if p.stats_layout == "bsh":  # token-major (B, S, H) memory
        return torch.full((p.b, p.sq, p.hq, 1), float("nan"), device=DEV).permute(0, 2, 1, 3)
    return torch.full((p.b, p.hq, p.sq, 1), float("nan"), device=DEV)


def _sdpa_keywords(p: Problem, g: frost.Graph, t: dict) -> tuple[dict, dict]:
    kw = dict(attn_scale=1.0 / math.sqrt(p.d), **p.mask_kw())
    decl = {}
    for role in ("cu_seq_len_q", "cu_seq_len_kv", "seq_len_q", "seq_len_kv", "sink_token"):
        if role in t:
            decl[role] = kw[role] = g.tensor_like(t[role], name=role)
    if p.thd_lens is not None:
        kw.update(
            max_seq_len_q=max(1, max(a for a, _ in p.thd_lens)), max_seq_len_kv=max(1, max(b for _, b in p.thd_lens))
        )
    if p.padding is not None:
        kw["use_padding_mask"] = True
    return kw, decl


def _oracle_kw(p: Problem, t: dict) -> dict:
    kw = dict(scale=1.0 / math.sqrt(p.d), sink=t.get("sink_token"), **p.oracle_mask())
    if p.thd_lens is not None:
        kw.update(cu_seq_len_q=_prefix(a for a, _ in p.thd_lens), cu_seq_len_kv=_prefix(b for _, b in p.thd_lens))
    elif p.padding is not None:
        kw.update(seq_len_q=[a for a, _ in p.padding], seq_len_kv=[b for _, b in p.padding])
    return kw


def _close(got, want, what, tol, strict=True):
    """Infinities at the same places (same sign), no NaN left, finite entries within `tol` relative (norm) and
    each within `assert_close_to_oracle`'s bound. Not `strict`: only the entries the oracle finds finite are compared
    (cuDNN's own rows without a key)."""
    if strict:  # the float64 oracle's norm check and per-element bound (bf16 io)
        kind = "grad" if what in ("dq", "dk", "dv") else "fwd"
        assert_close_to_oracle(got, want, rel=tol, kind=kind, io_dtype=torch.bfloat16, name=what)
        return
    got, want = got.double().reshape(want.shape), want.double()
    inf = torch.isinf(want)
    fin = ~inf
    if fin.any():
        err = ((got[fin] - want[fin]).norm() / want[fin].norm().clamp_min(1e-30)).item()
        assert err < tol, f"{what}: relative error {err:.2e} >= {tol}"


@pytest.mark.parametrize("engine", FWD_ENGINES)
@pytest.mark.parametrize("p", FWD, ids=lambda p: p.id)
def test_fwd_split_heads_and_row_stats_match_the_oracle(engine, p):
    if engine == "cudnn" and p.padding is not None:
        pytest.skip("cuDNN leaves rows past seq_len_q unspecified")
    t = _inputs(p)
    g = frost.Graph(io_data_type=torch.bfloat16, intermediate_data_type=torch.float32, compute_data_type=torch.float32)
    q, k, v = (g.tensor_like(t[r], name=r) for r in ("q", "k", "v"))
    kw, pack = _sdpa_keywords(p, g, t)
    pack = {h: t[r] for r, h in pack.items()}
    outs = {}
    if p.row_stats:
        for role in ("score_max", "score_sum_exp"):
            outs[role] = _row_tensor(p, t)
            kw[role] = g.tensor_like(outs[role], name=role)
            pack[kw[role]] = outs[role]
    o, stats = g.sdpa(q, k, v, generate_stats=p.stats, **kw)
    outs["o"] = torch.full_like(t["do"], float("nan"))
    o.set_output(True).set_dim(tuple(outs["o"].shape)).set_stride(tuple(outs["o"].stride()))
    pack[o] = outs["o"]
    if p.stats:
        outs["stats"] = _row_tensor(p, t)
        stats.set_output(True).set_dim(tuple(outs["stats"].shape)).set_stride(tuple(outs["stats"].stride()))
        pack[stats] = outs["stats"]
    pack.update({q: t["q"], k: t["k"], v: t["v"]})
    g.validate()
    try:
        g.build_plans(engine=engine)
    except frost.NotSupportedError as e:
        pytest.skip(f"{engine} declines: {e.declines}")
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device=DEV)
    g.execute(pack, ws, frost.ExecutionContext())
    if DEV == "cuda":
        torch.cuda.synchronize()
    ref_o, ref_lse, ref_max, ref_sum = oracle.attention(t["q"], t["k"], t["v"], row_stats=True, **_oracle_kw(p, t))
    strict = engine != "cudnn"  # frost's rows without a key are defined (sdpa_args); cuDNN's are its own
    _close(outs["o"], ref_o, "o", 1e-2, strict)
    if p.stats:
        _close(outs["stats"][..., 0], ref_lse, "stats", 2e-3, strict)
    if p.row_stats:  # (B, H, S, 1) / (T, H, 1) against the oracle's (B, H, S) / (T, H)
        _close(outs["score_max"][..., 0], ref_max, "score_max", 2e-3, strict)
        _close(outs["score_sum_exp"][..., 0], ref_sum, "score_sum_exp", 1e-2, strict)
        # the two halves make up the LSE (log 0 = -inf where a row has no key and no sink)
        got = outs["score_max"][..., 0].double() + torch.log(outs["score_sum_exp"][..., 0].double())
        _close(got, ref_lse, "score_max + log(score_sum_exp)", 2e-3, strict)


BWD = [
    Problem(6, 6, 1, row_stats=False),  # K finer: the CTA of the one V head walks 6 K heads
    Problem(6, 6, 1, causal=True, row_stats=False),
    Problem(8, 2, 4, row_stats=False),  # V finer: each K head's CTA writes 2 dV heads
    Problem(8, 2, 4, causal=True, sinks=True, row_stats=False),
    Problem(8, 2, 4, d=64, thd_lens=((1, 1), (300, 300), (77, 129)), causal=True, row_stats=False),
    Problem(6, 6, 1, d=72, thd_lens=((0, 40), (129, 64), (7, 300)), row_stats=False),
    Problem(8, 4, 1, d=128, padding=((200, 256), (37, 5)), causal=True, row_stats=False),
    Problem(8, 2, 4, causal=True, bottom_right=True, sq=100, skv=300, row_stats=False),
    # counts that do not nest: K groups of 3 query heads, V groups of 2, walked 6 at a time (both tiles change)
    Problem(12, 4, 6, row_stats=False),
    Problem(6, 2, 3, d=64, causal=True, sinks=True, row_stats=False),
    Problem(6, 2, 3, d=96, thd_lens=((1, 1), (300, 300), (77, 129)), causal=True, row_stats=False),
    Problem(12, 4, 6, d=72, padding=((200, 256), (37, 5)), row_stats=False),
]


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("engine", ["sm90", "sm80", "cudnn", "reference"])
@pytest.mark.parametrize("p", BWD, ids=lambda p: p.id)
def test_bwd_split_heads_matches_the_oracle_or_is_declined_by_name(engine, p, deterministic):
    if engine == "cudnn" and p.padding is not None:
        pytest.skip("cuDNN's padding-row gradients are its own")
    t = _inputs(p)
    okw = _oracle_kw(p, t)
    ref_o, ref_lse, ref_dq, ref_dk, ref_dv, _ = oracle.attention_grads(t["q"], t["k"], t["v"], t["do"], **okw)
    o_in, lse_in = ref_o.to(torch.bfloat16), ref_lse.float().unsqueeze(-1)
    g = frost.Graph(io_data_type=torch.bfloat16, intermediate_data_type=torch.float32, compute_data_type=torch.float32)
    q, k, v = (g.tensor_like(t[r], name=r) for r in ("q", "k", "v"))
    o, do, stats = g.tensor_like(o_in, name="o"), g.tensor_like(t["do"], name="dO"), g.tensor_like(lse_in, name="st")
    kw, pack = _sdpa_keywords(p, g, t)
    pack = {h: t[r] for r, h in pack.items()}
    grads = g.sdpa_backward(q, k, v, o, do, stats, use_deterministic_algorithm=deterministic, **kw)
    outs = [torch.full_like(t[r], float("nan")) for r in ("q", "k", "v")]
    for h, x in zip(grads, outs):
        h.set_output(True).set_dim(tuple(x.shape)).set_stride(tuple(x.stride()))
        pack[h] = x
    pack.update({q: t["q"], k: t["k"], v: t["v"], o: o_in, do: t["do"], stats: lse_in})
    g.validate()
    try:
        g.build_plans(engine=engine)
    except frost.NotSupportedError as e:
        reason = dict(e.declines)
        assert engine not in ("sm80", "sm90"), reason  # both DSL chains serve split head counts, nested or not
        pytest.skip(f"{engine} declines: {reason}")
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device=DEV)
    g.execute(pack, ws, frost.ExecutionContext())
    if DEV == "cuda":
        torch.cuda.synchronize()
    for got, want, what in zip(outs, (ref_dq, ref_dk, ref_dv), ("dq", "dk", "dv")):
        _close(got, want, what, 2e-2)
    if deterministic and engine in ("sm80", "sm90"):  # bitwise the same on a second run
        again = [torch.full_like(x, float("nan")) for x in outs]
        g.execute({**pack, **dict(zip(grads, again))}, ws, frost.ExecutionContext())
        torch.cuda.synchronize()
        for a, b in zip(outs, again):
            assert torch.equal(a, b)
