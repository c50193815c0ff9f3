"""Forward engines through the public graph API on a GPU: numerics vs the float64 oracle, and the execute contract."""

from __future__ import annotations

import pytest
import torch

import frost
from test.gpu.graph_cases import (
    FwdCase,
    assert_executes_clean,
    assert_runs_on_side_stream,
    extra_cols,
    make_fwd,
    oracle_fwd,
    pack,
    plan_or_skip,
)
from test.oracle import assert_close_to_oracle

pytestmark = pytest.mark.gpu

ENGINES = ["sm90", "sm80"]

CASES = [
    FwdCase(d=128),
    FwdCase(d=128, causal=True),
    FwdCase(d=64, causal=True, layout="bhsd"),
    FwdCase(d=96),
    FwdCase(d=256, causal=True, sq=192, skv=192),
    FwdCase(d=192, dv=128, causal=True),
    FwdCase(d=128, hq=8, hkv=2, causal=True),
    FwdCase(d=128, hq=8, hkv=1),
    FwdCase(d=128, causal=True, bottom_right=True, sq=100, skv=300),
    FwdCase(d=128, causal=True, sq=300, skv=100),
    FwdCase(d=128, causal=True, left=64),
    FwdCase(d=64, bottom_right=True, left=33, sq=130, skv=260),
    FwdCase(d=128, sinks=True, causal=True),
    FwdCase(d=128, padding=True, causal=True, sq=200, skv=200),
    FwdCase(d=128, stats=False),
    FwdCase(d=128, dtype=torch.float16, causal=True),
    FwdCase(d=128, thd_lens=[(0, 0), (1, 1), (37, 37), (300, 300), (128, 128), (5, 200)], causal=True),
    FwdCase(d=64, hq=8, hkv=2, thd_lens=[(513, 513), (1, 7), (0, 3), (64, 64)], sinks=True),
    # GQA shapes the SM90 adapter packs (query heads of a kv head in one M tile): decode-like and padded
    FwdCase(d=128, hq=32, hkv=4, sq=7, skv=4096, causal=True, bottom_right=True, sinks=True),
    FwdCase(d=128, hq=16, hkv=4, sq=300, skv=300, padding=True, causal=True),
    # head dims outside the wgmma set (the mma.sync engine pads 72 to 96-wide tiles, 40 to 64, 8 to 32)
    FwdCase(d=72, causal=True),
    FwdCase(d=40, hq=8, hkv=2, thd_lens=[(513, 513), (1, 7), (0, 3), (64, 64)], sinks=True),
    FwdCase(d=192, dv=64, hq=4, hkv=1, causal=True),
    FwdCase(d=80, left=64, causal=True, layout="bhsd"),
    FwdCase(d=112, padding=True, causal=True, sq=200, skv=200),
    FwdCase(d=32),
    FwdCase(d=48, causal=True, bottom_right=True, sq=100, skv=300),
    FwdCase(d=160, causal=True, sq=192, skv=192),
    FwdCase(d=8, dv=24),
    FwdCase(d=64, dv=256, causal=True, sq=192, skv=192),
    FwdCase(d=72, hq=8, hkv=2, causal=True, layout="wide"),
]


def _valid_rows(case, t):
    """Boolean mask over o's canonical rows that lie inside a sequence."""
    if case.thd_lens is not None:
        return None  # every bound token lies in a sequence (totals are exact here)
    if case.padding:
        b, sq = case.b, case.sq
        lens = t["seq_len_q"].view(-1)
        rows = torch.arange(sq, device=lens.device).view(1, sq) < lens.view(b, 1)
        return rows
    return None


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_fwd_matches_reference(engine, case):
    """O and Stats against the float64 oracle (test/oracle.py) on the same inputs."""
    g, decl, t = make_fwd(case)
    plan_or_skip(g, engine)
    want = oracle_fwd(case, t)
    t["o"].fill_(float("nan"))
    if "stats" in t:
        t["stats"].fill_(float("nan"))
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
    g.execute(pack(decl, t), ws, frost.ExecutionContext())
    torch.cuda.synchronize()
    o, ro = t["o"], want["o"]
    rows = _valid_rows(case, t)
    if rows is not None:  # dense (B, H, S, D): pick valid (b, s)
        rows = rows.cpu()
        o, ro = o.cpu().permute(0, 2, 1, 3)[rows], ro.permute(0, 2, 1, 3)[rows]
    assert_close_to_oracle(o, ro, rel=1e-2, name="O")
    if case.layout == "wide":
        assert torch.isnan(extra_cols(t["o"])).all(), "O written past its head dim"
    if case.stats:
        s, rs = t["stats"], want["stats"]
        if rows is not None:
            s, rs = s.cpu()[..., 0].permute(0, 2, 1)[rows], rs[..., 0].permute(0, 2, 1)[rows]
        assert_close_to_oracle(s, rs, rel=2e-3, max_abs=2e-2, name="Stats")  # empty rows: -inf in both


@pytest.mark.parametrize("engine", ENGINES + ["cudnn"])  # cuDNN: its handle for that stream is made on first use
def test_non_default_stream_is_honored(engine):
    case = FwdCase(d=128, b=4, sq=1024, skv=1024, causal=True)
    g, decl, t = make_fwd(case)
    plan_or_skip(g, engine)
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
    side = torch.cuda.Stream()
    g.execute(pack(decl, t), ws, frost.ExecutionContext(stream=side))  # loads the module / makes the stream's handle
    torch.cuda.synchronize()
    t["o"].fill_(float("nan"))
    torch.cuda.synchronize()
    assert_runs_on_side_stream(lambda: g.execute(pack(decl, t), ws, frost.ExecutionContext(stream=side)), side)
    assert not torch.isnan(t["o"]).any()


@pytest.mark.parametrize("engine", ENGINES)
def test_thd_cuda_graph_replay_follows_new_lengths(engine):
    lens_a = [(100, 100), (300, 300), (17, 17), (0, 0)]
    case = FwdCase(d=128, hq=4, hkv=4, thd_lens=lens_a, causal=True)
    g, decl, t = make_fwd(case)
    plan_or_skip(g, engine)
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
    vp = pack(decl, t)
    s = torch.cuda.Stream()
    g.execute(vp, ws, frost.ExecutionContext(stream=s))  # warm-up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        g.execute(vp, ws, frost.ExecutionContext(stream=s))
    # new lengths (same total, longest 250 <= the envelope 300) written into the same device tensors
    tot = sum(a for a, _ in lens_a)
    new = [(250, 250), (1, 1), (166, 166), (0, 0)]
    assert sum(a for a, _ in new) == tot
    cu = torch.tensor([0, 250, 251, 417, 417], dtype=torch.int32, device="cuda")
    t["cu_seq_len_q"].copy_(cu)
    t["cu_seq_len_kv"].copy_(cu)
    t["o"].fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    replayed = t["o"].clone()
    t["o"].fill_(float("nan"))
    g.execute(vp, ws, frost.ExecutionContext(stream=s))
    torch.cuda.synchronize()
    assert not torch.isnan(replayed).any()
    assert torch.equal(replayed, t["o"]), "replay did not follow the new lengths"


@pytest.mark.parametrize("engine", ENGINES)
def test_execute_has_no_sync_and_no_allocation(engine):
    case = FwdCase(d=128, hq=8, hkv=2, thd_lens=[(100, 100), (7, 9), (256, 256)], causal=True, sinks=True)
    g, decl, t = make_fwd(case)
    plan_or_skip(g, engine)
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
    vp = pack(decl, t)
    ctx = frost.ExecutionContext(stream=torch.cuda.current_stream())
    g.execute(vp, ws, ctx)
    torch.cuda.synchronize()
    assert_executes_clean(g, vp, ws, ctx)
