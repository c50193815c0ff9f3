"""Score modifiers on the mma.sync engine and the wgmma forward through the public graph API: the additive bias,
dBias and ALiBi against the float64 oracle (test/oracle.py), the execute contract for the chain's dBias
accumulator, and agreement with the cuDNN engine on the same graphs where cuDNN serves them.

On an H200 the mma.sync line (`engine="sm80"`) serves cc 9.0 below the wgmma engines (the wgmma forward and
backward, `engine="sm90"`, serve the bias, dBias and ALiBi too, the backward but for K and V head counts apart); on
cc 8.x it is the native line.
The bias is declared (B or 1, H or 1, S_q, S_kv) with its own strides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import pytest
import torch

import frost
from test.oracle import assert_close_to_oracle
from test import oracle
from test.gpu.graph_cases import assert_executes_clean, plan_or_skip, rel_err

pytestmark = pytest.mark.gpu

ENGINE = "sm80"
DEV = "cuda"


@dataclass(frozen=True)
class ScoreCase:
    b: int = 2
    hq: int = 4
    hkv: int = 4
    hv: Optional[int] = None  # V's heads where they differ from K's (split K/V heads)
    sq: int = 256
    skv: int = 256
    d: int = 128
    dtype: torch.dtype = torch.bfloat16
    bias: Optional[str] = "bh"  # the bias is full along these of "b" (batch) and "h" (heads); None: no bias
    bias_layout: str = "compact"  # "transposed": the query dim unit-strided; "padded": rows longer than S_kv
    neg_inf: bool = False  # a quarter of the bias is -inf (a mask given as a bias)
    alibi: bool = False
    causal: bool = False
    bottom_right: bool = False
    left: Optional[int] = None  # sliding_window_length
    padding: Optional[tuple] = None  # (seq_len_q, seq_len_kv) per batch entry
    thd: Optional[tuple] = None  # packed: ((len_q, len_kv), ...) per sequence
    sinks: bool = False
    dbias: bool = True  # the backward writes dBias (when there is a bias)
    deterministic: bool = False
    row_stats: bool = False  # the forward also writes score_max / score_sum_exp

    @property
    def heads_v(self) -> int:
        return self.hv or self.hkv

    @property
    def id(self) -> str:
        heads = f"h{self.hq}-{self.hkv}" + (f"-v{self.hv}" if self.hv else "")
        bits = [f"d{self.d}", heads, f"s{self.sq}x{self.skv}", "fp16" if self.dtype == torch.float16 else "bf16"]
        if self.bias is not None:
            bits.append(f"bias{self.bias or '1'}" + ("" if self.bias_layout == "compact" else f"-{self.bias_layout}"))
        for flag, name in (
            (self.neg_inf, "neginf"),
            (self.alibi, "alibi"),
            (self.causal, "causal"),
            (self.bottom_right, "br"),
            (self.padding is not None, "pad"),
            (self.thd is not None, "thd"),
            (self.sinks, "sinks"),
            (self.bias is not None and not self.dbias, "nodbias"),
            (self.deterministic, "det"),
            (self.row_stats, "rowstats"),
        ):
            if flag:
                bits.append(name)
        if self.left:
            bits.append(f"win{self.left}")
        return "-".join(bits)

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.d)

    @property
    def bias_dim(self) -> tuple:
        sq = max(a for a, _ in self.thd) if self.thd else self.sq
        skv = max(b for _, b in self.thd) if self.thd else self.skv
        nb = len(self.thd) if self.thd else self.b
        return (nb if "b" in self.bias else 1, self.hq if "h" in self.bias else 1, sq, skv)


def _bias(case: ScoreCase, dev) -> torch.Tensor:
    dim = case.bias_dim
    if case.bias_layout == "transposed":
        x = torch.randn(dim[0], dim[1], dim[3], dim[2], device=dev, dtype=case.dtype).transpose(2, 3)
    elif case.bias_layout == "padded":
        x = torch.randn(dim[0], dim[1], dim[2], dim[3] + 24, device=dev, dtype=case.dtype)[..., : dim[3]]
    else:
        x = torch.randn(dim, device=dev, dtype=case.dtype)
    if case.neg_inf:
        x.masked_fill_(torch.rand(dim, device=dev) < 0.25, float("-inf"))
    return x


def make_inputs(case: ScoreCase, seed: int = 0) -> dict:
    """Torch tensors by role (dense io tensors BSHD in memory, logical (B, H, S, D))."""
    torch.manual_seed(seed)
    dev = DEV
    t = {}
    if case.thd:
        tq, tk = sum(a for a, _ in case.thd), sum(b for _, b in case.thd)
        for role, n, h in (("q", tq, case.hq), ("k", tk, case.hkv), ("v", tk, case.heads_v), ("dO", tq, case.hq)):
            t[role] = torch.randn(n, h, case.d, device=dev, dtype=case.dtype)

        def cu(lens):
            return torch.tensor([0] + [sum(lens[: i + 1]) for i in range(len(lens))], device=dev, dtype=torch.int32)

        t["cu_seq_len_q"] = cu([a for a, _ in case.thd])
        t["cu_seq_len_kv"] = cu([b for _, b in case.thd])
    else:
        for role, h, s in (
            ("q", case.hq, case.sq),
            ("k", case.hkv, case.skv),
            ("v", case.heads_v, case.skv),
            ("dO", case.hq, case.sq),
        ):
            t[role] = torch.randn(case.b, s, h, case.d, device=dev, dtype=case.dtype).permute(0, 2, 1, 3)
        if case.padding:
            lq, lk = case.padding
            t["seq_len_q"] = torch.tensor(lq, device=dev, dtype=torch.int32).view(-1, 1, 1, 1)
            t["seq_len_kv"] = torch.tensor(lk, device=dev, dtype=torch.int32).view(-1, 1, 1, 1)
    if case.sinks:
        t["sink_token"] = torch.randn(1, case.hq, 1, 1, device=dev, dtype=torch.float32)
    if case.bias is not None:
        t["bias"] = _bias(case, dev)
    return t


def _sdpa_keywords(case: ScoreCase, g: frost.Graph, t: dict) -> tuple[dict, dict]:
    kw = dict(attn_scale=case.scale)
    if case.causal:
        kw["use_causal_mask_bottom_right" if case.bottom_right else "use_causal_mask"] = True
    if case.left:
        kw["sliding_window_length"] = case.left
    if case.alibi:
        kw["use_alibi_mask"] = True
    decl = {}
    for role in ("cu_seq_len_q", "cu_seq_len_kv", "seq_len_q", "seq_len_kv", "sink_token", "bias"):
        if role in t:
            decl[role] = g.tensor_like(t[role], name=role)
            kw[role] = decl[role]
    if case.thd:
        kw.update(
            max_seq_len_q=case.bias_dim[2] if case.bias is not None else max(a for a, _ in case.thd),
            max_seq_len_kv=case.bias_dim[3] if case.bias is not None else max(b for _, b in case.thd),
        )
    if case.padding:
        kw["use_padding_mask"] = True
    return kw, decl


def oracle_kwargs(case: ScoreCase, t: dict) -> dict:
    kw = dict(scale=case.scale, sink=t.get("sink_token"), bias=t.get("bias"), alibi=case.alibi)
    if case.causal:
        kw["causal_bottom_right" if case.bottom_right else "causal"] = True
    if case.left:
        kw["sliding_window_length"] = case.left
    if case.thd:
        kw.update(cu_seq_len_q=t["cu_seq_len_q"].tolist(), cu_seq_len_kv=t["cu_seq_len_kv"].tolist())
    if case.padding:
        kw.update(seq_len_q=list(case.padding[0]), seq_len_kv=list(case.padding[1]))
    return kw


def run_fwd(case: ScoreCase, t: dict, engine: str = ENGINE, rows: Optional[dict] = None):
    """(O, Stats without its unit dim); with `case.row_stats`, score_max / score_sum_exp (Stats' dims, fp32,
    poisoned before) go into `rows` by role."""
    g = frost.Graph(io_data_type=case.dtype, intermediate_data_type=torch.float32, compute_data_type=torch.float32)
    q, k, v = (g.tensor_like(t[r], name=r) for r in ("q", "k", "v"))
    kw, decl = _sdpa_keywords(case, g, t)
    if case.row_stats:
        for role in ("score_max", "score_sum_exp"):
            rows[role] = torch.full(t["q"].shape[:-1] + (1,), float("nan"), device=DEV, dtype=torch.float32)
            kw[role] = decl[role] = g.tensor_like(rows[role], name=role)
            t = dict(t, **{role: rows[role]})
    o, stats = g.sdpa(q, k, v, generate_stats=True, **kw)
    out = {
        "o": torch.full(t["q"].shape, float("nan"), device=DEV, dtype=case.dtype),
        "stats": torch.full(t["q"].shape[:-1] + (1,), float("nan"), device=DEV, dtype=torch.float32),
    }
    o.set_output(True).set_dim(tuple(out["o"].shape)).set_stride(tuple(out["o"].stride()))
    stats.set_output(True).set_dim(tuple(out["stats"].shape)).set_stride(tuple(out["stats"].stride()))
    plan_or_skip(g, engine)
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device=DEV)
    pack = {q: t["q"], k: t["k"], v: t["v"], o: out["o"], stats: out["stats"], **{decl[r]: t[r] for r in decl}}
    g.execute(pack, ws, frost.ExecutionContext())
    torch.cuda.synchronize()
    return out["o"], out["stats"][..., 0]


def bwd_graph(case: ScoreCase, t: dict, engine: str = ENGINE, strict: bool = False):
    """The backward over the oracle's O and Stats: (graph, variant pack, outputs by role, workspace); `strict`:
    the engine must plan it (a decline fails the test instead of skipping it)."""
    o_ref, lse_ref = oracle.attention(t["q"], t["k"], t["v"], **oracle_kwargs(case, t))
    t = dict(t, o=o_ref.to(case.dtype), stats=lse_ref.float().unsqueeze(-1))
    g = frost.Graph(io_data_type=case.dtype, intermediate_data_type=torch.float32, compute_data_type=torch.float32)
    h = {r: g.tensor_like(t[r], name=r) for r in ("q", "k", "v", "o", "dO", "stats")}
    kw, decl = _sdpa_keywords(case, g, t)
    out = {}
    if case.bias is not None and case.dbias:
        out["dBias"] = torch.full_like(t["bias"], float("nan"))  # the bias's own strides
        kw["dBias"] = decl["dBias"] = g.tensor_like(out["dBias"], name="dBias")
    grads = g.sdpa_backward(
        h["q"], h["k"], h["v"], h["o"], h["dO"], h["stats"], use_deterministic_algorithm=case.deterministic, **kw
    )
    for role, src, gh in zip(("dQ", "dK", "dV"), ("q", "k", "v"), grads):
        out[role] = torch.full_like(t[src], float("nan"))
        gh.set_output(True).set_dim(tuple(out[role].shape)).set_stride(tuple(out[role].stride()))
        decl[role] = gh
    if strict:
        g.validate()
        g.build_plans(engine=engine)
    else:
        plan_or_skip(g, engine)
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device=DEV)
    ws.fill_(255)  # poisoned scratch: the chain initializes what it uses (the dBias accumulator too)
    pack = {h[r]: t[r] for r in h}
    pack.update({decl[r]: (out[r] if r in out else t[r]) for r in decl})
    return g, pack, out, ws


def run_bwd(case: ScoreCase, t: dict, engine: str = ENGINE, strict: bool = False) -> dict:
    g, pack, out, ws = bwd_graph(case, t, engine, strict)
    g.execute(pack, ws, frost.ExecutionContext())
    torch.cuda.synchronize()
    return out


FWD_CASES = [
    ScoreCase(bias="bh"),
    ScoreCase(bias="h", causal=True),
    ScoreCase(bias="b", causal=True, hq=8, hkv=2),
    ScoreCase(bias="", sq=200, skv=333),
    ScoreCase(bias="bh", bias_layout="transposed", causal=True, dtype=torch.float16),
    ScoreCase(bias="h", bias_layout="padded", d=64, sq=300, skv=300, left=64, causal=True),
    ScoreCase(bias="bh", padding=((200, 37), (150, 256)), causal=True),
    ScoreCase(bias="h", padding=((256, 1), (0, 256))),
    ScoreCase(bias="bh", bottom_right=True, causal=True, sq=100, skv=300),
    ScoreCase(bias="bh", neg_inf=True),
    ScoreCase(bias="h", sinks=True, causal=True, d=96),
    ScoreCase(bias="bh", thd=((100, 100), (1, 7), (0, 3), (300, 300)), causal=True, hq=8, hkv=2),
    ScoreCase(bias="h", thd=((77, 130), (256, 256)), d=64, dtype=torch.float16),
    ScoreCase(bias=None, alibi=True, causal=True),
    ScoreCase(bias=None, alibi=True, causal=True, hq=6, hkv=2, dtype=torch.float16),  # H not a power of two
    ScoreCase(bias=None, alibi=True, causal=True, left=100, sq=400, skv=400, d=64),
    ScoreCase(bias=None, alibi=True, causal=True, bottom_right=True, sq=100, skv=300),
    ScoreCase(bias="h", alibi=True, causal=True, padding=((256, 100), (200, 256)), hq=12, hkv=4),
    ScoreCase(bias=None, alibi=True, causal=True, thd=((100, 100), (1, 1), (300, 300)), hq=5, hkv=1, d=64),
    # beside K and V head counts apart and score_max / score_sum_exp (the max of the final logits, bias and
    # ALiBi included)
    ScoreCase(bias="h", alibi=True, causal=True, hq=8, hkv=2, hv=4, row_stats=True),
    ScoreCase(bias="bh", causal=True, hq=6, hkv=6, hv=1, padding=((200, 37), (150, 256)), row_stats=True),
    ScoreCase(bias="bh", neg_inf=True, hq=4, hkv=1, hv=2, d=64, row_stats=True),
    ScoreCase(bias="h", thd=((100, 100), (1, 7), (300, 300)), causal=True, hq=8, hkv=4, hv=1, row_stats=True),
]


@pytest.mark.parametrize("case", FWD_CASES, ids=lambda c: c.id)
def test_fwd_matches_the_oracle(case):
    check_fwd(case)


#: the wgmma forward (cc 9.0): bias full or broadcast (a strided key dim, padded rows), -inf entries, padding,
#: packed sequences, GQA (served unpacked), ALiBi (a head count not a power of two, bottom-right), causal and not
SM90_FWD_CASES = [
    ScoreCase(bias="bh"),
    ScoreCase(bias="h", causal=True, hq=8, hkv=2),
    ScoreCase(bias="", bias_layout="transposed", sq=200, skv=333),
    ScoreCase(bias="bh", padding=((200, 37), (150, 256)), causal=True),
    ScoreCase(bias="b", bias_layout="padded", neg_inf=True, sinks=True, d=64, sq=300, skv=300),
    ScoreCase(bias="h", left=64, causal=True, sq=300, skv=300, d=96),
    ScoreCase(bias="bh", thd=((100, 100), (1, 7), (0, 3), (300, 300)), causal=True, hq=8, hkv=2),
    ScoreCase(bias="h", thd=((77, 130), (256, 256)), d=64, dtype=torch.float16),
    ScoreCase(bias=None, alibi=True, causal=True, hq=8, hkv=2),
    ScoreCase(bias=None, alibi=True, causal=True, bottom_right=True, hq=6, hkv=2, sq=100, skv=300),
    ScoreCase(bias=None, alibi=True, causal=True, thd=((100, 100), (1, 1), (300, 300)), hq=5, hkv=1, d=64),
    ScoreCase(bias="h", alibi=True, causal=True, hq=8, hkv=2, d=256, row_stats=True),
]


@pytest.mark.parametrize("case", SM90_FWD_CASES, ids=lambda c: c.id)
def test_sm90_fwd_matches_the_oracle(case):
    check_fwd(case, engine="sm90")


def check_fwd(case: ScoreCase, engine: str = ENGINE):
    t = make_inputs(case)
    rows = {}
    o, lse = run_fwd(case, t, engine=engine, rows=rows)
    want = oracle.attention(t["q"], t["k"], t["v"], row_stats=True, **oracle_kwargs(case, t))
    want_o, want_lse = want[:2]
    assert not torch.isnan(o).any(), "some output elements were not written"
    assert_close_to_oracle(o, want_o, rel=1e-2, name="O")
    fin = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), fin), "empty and padding rows must have LSE = -inf"
    assert (lse[fin].double() - want_lse[fin]).abs().max().item() < 2e-2
    if case.row_stats:
        got_max, got_sum = rows["score_max"][..., 0], rows["score_sum_exp"][..., 0]
        assert not torch.isnan(got_max).any() and not torch.isnan(got_sum).any(), "row statistics not written"
        fin = torch.isfinite(want[2])
        assert torch.equal(torch.isfinite(got_max), fin), "score_max: -inf exactly where the oracle has it"
        assert (got_max[fin].double() - want[2][fin]).abs().max().item() < 2e-2
        assert_close_to_oracle(got_sum, want[3], rel=1e-2, io_dtype=t["q"].dtype, name="score_sum_exp")
        assert torch.all(got_sum[~fin] == 0), "rows without a score: score_sum_exp = 0"


BWD_CASES = [
    ScoreCase(bias="bh"),  # dBias written directly
    ScoreCase(bias="bh", causal=True, hq=8, hkv=2),  # direct, zeros above the band
    ScoreCase(bias="h", causal=True),  # cuDNN's usual dBias (1, H, S_q, S_kv): the fp32 accumulator
    ScoreCase(bias="b", hq=8, hkv=2, dtype=torch.float16),  # summed over heads
    ScoreCase(bias="", causal=True, sq=200, skv=333),  # summed over both
    ScoreCase(bias="bh", padding=((200, 37), (150, 256)), causal=True),  # direct: padding rows and keys zero
    ScoreCase(bias="h", padding=((256, 1), (0, 256)), d=64),
    ScoreCase(bias="bh", bias_layout="transposed", causal=True, left=64, sq=300, skv=300),
    ScoreCase(bias="h", bias_layout="padded", dtype=torch.float16, sq=200, skv=200),
    ScoreCase(bias="bh", neg_inf=True, d=64),
    ScoreCase(bias="bh", bottom_right=True, causal=True, sq=100, skv=300),
    ScoreCase(bias="h", sinks=True, causal=True, d=96),
    ScoreCase(bias="bh", thd=((100, 100), (1, 7), (0, 3), (300, 300)), causal=True, hq=8, hkv=2),  # accumulator
    ScoreCase(bias="h", thd=((77, 130), (256, 256)), d=64, dtype=torch.float16),
    ScoreCase(bias="h", dbias=False, causal=True),  # a bias without its gradient
    ScoreCase(bias="bh", deterministic=True, causal=True, hq=8, hkv=2),
    # deterministic dBias summed over broadcast dims: a copy per (batch entry, head), summed in order
    ScoreCase(bias="h", deterministic=True, causal=True, hq=8, hkv=2),
    ScoreCase(bias="", deterministic=True, sq=200, skv=333, d=64),
    ScoreCase(bias="bh", deterministic=True, thd=((100, 100), (1, 7), (300, 300)), causal=True),
    ScoreCase(bias=None, alibi=True, causal=True),
    ScoreCase(bias=None, alibi=True, causal=True, hq=6, hkv=3, dtype=torch.float16),
    ScoreCase(bias="h", alibi=True, causal=True, padding=((256, 100), (200, 256)), hq=12, hkv=4, d=64),
    ScoreCase(bias=None, alibi=True, causal=True, thd=((100, 100), (1, 1), (300, 300)), hq=5, hkv=1, d=64),
    # beside K and V head counts apart (nested): K finer, V finer, direct dBias and through the accumulator
    ScoreCase(bias="bh", alibi=True, causal=True, hq=6, hkv=6, hv=1),
    ScoreCase(bias="h", causal=True, hq=8, hkv=2, hv=4, d=64),
    ScoreCase(bias="bh", thd=((100, 100), (1, 7), (300, 300)), causal=True, hq=8, hkv=4, hv=1),
]


@pytest.mark.parametrize("case", BWD_CASES, ids=lambda c: c.id)
def test_bwd_matches_the_oracle(case):
    check_bwd(case)


#: the wgmma backward serves every dBias case of the mma.sync backward's list but K and V head counts apart
SM90_DBIAS_CASES = [c for c in BWD_CASES if c.hv is None and c.bias is not None and c.dbias]


@pytest.mark.parametrize("case", SM90_DBIAS_CASES, ids=lambda c: c.id)
def test_sm90_bwd_with_dbias_matches_the_oracle(case):
    check_bwd(case, engine="sm90", strict=True)


def check_bwd(case: ScoreCase, engine: str = ENGINE, strict: bool = False):
    t = make_inputs(case)
    got = run_bwd(case, t, engine=engine, strict=strict)
    if case.deterministic:  # bitwise the same on a second run
        again = run_bwd(case, t, engine=engine, strict=strict)
        for name in got:
            assert torch.equal(got[name].nan_to_num(), again[name].nan_to_num()), f"{name} differs between runs"
    want = (
        oracle.attention_grads(t["q"], t["k"], t["v"], t["dO"], with_dbias=True, **oracle_kwargs(case, t))
        if case.bias is not None
        else oracle.attention_grads(t["q"], t["k"], t["v"], t["dO"], **oracle_kwargs(case, t))
    )
    for name, ref in zip(("dQ", "dK", "dV"), want[2:5]):
        x = got[name]
        assert not torch.isnan(x).any(), f"{name}: some elements were not written"
        assert_close_to_oracle(x, ref, rel=2e-2, kind="grad", name=name)
    if "dBias" in got:
        db, ref = got["dBias"], want[6]
        assert not torch.isnan(db).any(), "dBias: some elements were not written"
        assert torch.all(db[~scored(case, t).expand_as(db)] == 0), "dBias must be exactly 0 where no score exists"
        assert_close_to_oracle(db, ref, rel=2e-2, kind="grad", io_dtype=t["q"].dtype, name="dBias")


#: the wgmma backward (cc 9.0), besides the dBias cases above: a bias without its gradient (full or broadcast,
#: transposed or padded rows, -inf entries), ALiBi (a head count not a power of two, bottom-right), both; dense,
#: padded and packed, GQA, sinks, deterministic turns, d = 64 (128-row steps), 96, 128 (64 and packed 80 rows) and
#: 256 (shared keys)
SM90_BWD_CASES = [
    ScoreCase(bias="bh", dbias=False),
    ScoreCase(bias="h", dbias=False, causal=True, hq=8, hkv=2),
    ScoreCase(bias="", dbias=False, bias_layout="transposed", sq=200, skv=333, d=64),
    ScoreCase(bias="b", dbias=False, bias_layout="padded", neg_inf=True, d=96, sq=300, skv=300),
    ScoreCase(bias="bh", dbias=False, padding=((200, 37), (150, 256)), causal=True),
    ScoreCase(bias="h", dbias=False, sinks=True, causal=True, left=64, sq=300, skv=300),
    ScoreCase(bias="bh", dbias=False, thd=((100, 100), (1, 7), (0, 3), (300, 300)), causal=True, hq=8, hkv=2),
    ScoreCase(bias="h", dbias=False, thd=((77, 130), (256, 256)), d=64, dtype=torch.float16),
    ScoreCase(bias="h", dbias=False, deterministic=True, causal=True, hq=8, hkv=2),
    ScoreCase(bias=None, alibi=True, causal=True, hq=8, hkv=2),
    ScoreCase(bias=None, alibi=True, causal=True, bottom_right=True, hq=6, hkv=2, sq=100, skv=300),
    ScoreCase(bias=None, alibi=True, causal=True, thd=((100, 100), (1, 1), (300, 300)), hq=5, hkv=1, d=64),
    ScoreCase(bias="h", dbias=False, alibi=True, causal=True, hq=8, hkv=2, d=256),
]


@pytest.mark.parametrize("case", SM90_BWD_CASES, ids=lambda c: c.id)
def test_sm90_bwd_matches_the_oracle(case):
    check_bwd(case, engine="sm90", strict=True)


def scored(case: ScoreCase, t: dict) -> torch.Tensor:
    """(B or 1, 1, S_q, S_kv) bool: the bias positions some sequence scores (inside it and its mask band); the
    others (masked, padding, past a packed sequence) get dBias = 0 exactly."""
    nb, _, sq, skv = case.bias_dim
    mask = dict(
        causal=case.causal and not case.bottom_right,
        causal_bottom_right=case.causal and case.bottom_right,
        sliding_window_length=case.left,
    )
    if case.thd:
        lens = list(case.thd)
    elif case.padding:
        lens = list(zip(*case.padding))
    else:
        lens = [(case.sq, case.skv)] * case.b
    out = torch.zeros(len(lens), 1, sq, skv, dtype=torch.bool)
    for i, (n, m) in enumerate(lens):
        out[i, 0, :n, :m] = oracle.band(n, m, **mask)
    return (out if nb > 1 else out.any(0, keepdim=True)).to(DEV)


def test_deterministic_full_dbias_is_bitwise_reproducible():
    case = ScoreCase(bias="bh", deterministic=True, causal=True, hq=8, hkv=2, sq=1024, skv=1024)
    t = make_inputs(case)
    g, pack, out, ws = bwd_graph(case, t)
    runs = []
    for _ in range(3):
        for x in out.values():
            x.fill_(float("nan"))
        g.execute(pack, ws, frost.ExecutionContext())
        torch.cuda.synchronize()
        runs.append({n: x.clone() for n, x in out.items()})
    for again in runs[1:]:
        for n in runs[0]:
            assert torch.equal(runs[0][n], again[n]), n


@pytest.mark.parametrize("bias", ["h", "bh"], ids=["accumulator", "direct"])
def test_dbias_execute_has_no_sync_no_allocation_and_reuses_its_workspace(bias):
    """The accumulator is zeroed by the chain itself: a second execute over the same (now dirty) workspace gives
    the same dBias; no execute synchronizes or allocates."""
    case = ScoreCase(bias=bias, causal=True, hq=8, hkv=2)
    t = make_inputs(case)
    g, pack, out, ws = bwd_graph(case, t)
    ctx = frost.ExecutionContext(stream=torch.cuda.current_stream())
    g.execute(pack, ws, ctx)
    torch.cuda.synchronize()
    first = out["dBias"].clone()
    assert_executes_clean(g, pack, ws, ctx)
    if bias == "bh":
        assert torch.equal(out["dBias"], first)  # written directly, once per element
    else:  # atomics may reorder the sums (a last-bit flip after rounding); a dirty accumulator would double them
        assert rel_err(out["dBias"], first) < 1e-2


def test_bwd_cuda_graph_capture_and_replay_with_a_bias():
    case = ScoreCase(bias="h", causal=True)
    t = make_inputs(case)
    g, pack, out, ws = bwd_graph(case, t)
    ctx = frost.ExecutionContext(stream=torch.cuda.current_stream())
    g.execute(pack, ws, ctx)  # loads the kernels
    torch.cuda.synchronize()
    want = {n: x.clone() for n, x in out.items()}
    cg = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cg):
        g.execute(pack, ws, frost.ExecutionContext(stream=torch.cuda.current_stream()))
    for x in out.values():
        x.fill_(float("nan"))
    cg.replay()
    torch.cuda.synchronize()
    for n in want:  # dQ and dBias add with atomics: the replay may round a sum differently, never double it
        assert not torch.isnan(out[n]).any(), n
        assert rel_err(out[n], want[n]) < 1e-2, n


# --- the same graphs on cuDNN: its kernels define the semantics frost ports ------------------------------------

CUDNN_CASES = [
    ("fwd", ScoreCase(bias="h", causal=True, d=64)),
    ("fwd", ScoreCase(bias="bh", d=64, sq=128, skv=256)),
    ("fwd", ScoreCase(bias=None, alibi=True, causal=True, d=64, hq=8, hkv=8)),
    ("fwd", ScoreCase(bias=None, alibi=True, causal=True, d=64, hq=6, hkv=6)),
    ("bwd", ScoreCase(bias="h", causal=True, d=64)),
    ("bwd", ScoreCase(bias=None, alibi=True, causal=True, d=64, hq=8, hkv=8)),
]


@pytest.mark.parametrize("direction,case", CUDNN_CASES, ids=lambda x: x if isinstance(x, str) else x.id)
def test_the_mma_sync_engine_agrees_with_cudnn(direction, case):
    check_cudnn(direction, case, ENGINE)


@pytest.mark.parametrize("case", [c for d, c in CUDNN_CASES if d == "fwd"], ids=lambda c: c.id)
def test_the_wgmma_forward_agrees_with_cudnn(case):
    check_cudnn("fwd", case, "sm90")


def check_cudnn(direction: str, case: ScoreCase, engine: str):
    t = make_inputs(case)
    if direction == "fwd":
        ours, theirs = run_fwd(case, t, engine=engine), run_fwd(case, t, engine="cudnn")
        assert rel_err(ours[0], theirs[0]) < 1e-2
        fin = torch.isfinite(theirs[1])
        assert (ours[1][fin] - theirs[1][fin]).abs().max().item() < 2e-2
    else:
        ours, theirs = run_bwd(case, t, engine=engine), run_bwd(case, t, engine="cudnn")
        for n in theirs:
            assert rel_err(ours[n], theirs[n]) < 3e-2, n
