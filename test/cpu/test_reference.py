"""The reference engine through the public Graph API against the independent float64 oracle."""

from __future__ import annotations

import math

import pytest
import torch

from frost.target import CPU
from test import oracle
from test.helpers import (
    Case,
    assert_bwd_matches_oracle,
    assert_close,
    assert_fwd_matches_oracle,
    make_inputs,
    oracle_bwd,
    oracle_fwd,
    rel_err,
    run_bwd,
    run_fwd,
)

CAUSAL = (("use_causal_mask", True),)
CAUSAL_BR = (("use_causal_mask_bottom_right", True),)

CASES = {
    "mha-bhsd": Case(hq=3, hkv=3),
    "mha-bshd": Case(hq=3, hkv=3, layout="bshd"),
    "gqa-bshd": Case(hq=4, hkv=2, layout="bshd"),
    "mqa-bhsd": Case(hq=4, hkv=1),
    "dv-differs": Case(d=16, dv=8, layout="bshd"),
    "scale-omitted-is-one": Case(omit_scale=True, d=8),
    "sinks": Case(sink=True),
    "sinks-4d-causal": Case(sink=True, sink_4d=True, mask=CAUSAL),
    "causal-square": Case(mask=CAUSAL),
    "causal-topleft-sq<skv": Case(sq=5, skv=9, mask=CAUSAL),
    "causal-topleft-sq>skv": Case(sq=9, skv=5, mask=CAUSAL),
    "causal-bottomright-sq<skv": Case(sq=5, skv=9, mask=CAUSAL_BR, layout="bshd"),
    "causal-bottomright-sq>skv": Case(sq=9, skv=5, mask=CAUSAL_BR),
    "causal-br-by-alignment": Case(
        sq=4, skv=7, mask=(("diagonal_alignment", "BOTTOM_RIGHT"), ("diagonal_band_right_bound", 0))
    ),
    "sliding-window": Case(sq=10, skv=10, mask=(("sliding_window_length", 3),) + CAUSAL),
    "left-bound-only": Case(sq=10, skv=10, mask=(("diagonal_band_left_bound", 2),)),
    "window-bottomright": Case(sq=6, skv=11, mask=(("sliding_window_length", 4),) + CAUSAL_BR),
    "band-right-bound": Case(sq=8, skv=8, mask=(("diagonal_band_right_bound", 2),)),
    "band-both-bounds": Case(
        sq=8,
        skv=12,
        mask=(
            ("diagonal_band_left_bound", 3),
            ("diagonal_band_right_bound", 1),
            ("diagonal_alignment", "BOTTOM_RIGHT"),
        ),
    ),
    "padding": Case(sq=8, skv=9, lens_q=(5, 8), lens_kv=(9, 2)),
    "padding-zero-lengths": Case(batch=3, sq=6, skv=6, lens_q=(0, 6, 3), lens_kv=(4, 0, 6), sink=True),
    "padding-causal-br": Case(sq=8, skv=9, lens_q=(3, 8), lens_kv=(7, 9), mask=CAUSAL_BR, layout="bshd"),
    "thd": Case(thd=True, batch=3, lens_q=(3, 5, 2), lens_kv=(4, 5, 6)),
    "thd-empty-and-single": Case(thd=True, batch=4, lens_q=(0, 1, 4, 1), lens_kv=(3, 1, 0, 5)),
    "thd-head-major-stats": Case(thd=True, batch=3, lens_q=(2, 0, 6), lens_kv=(5, 1, 6), stats_head_major=True),
    "thd-causal-br-sinks-gqa": Case(
        thd=True, batch=3, hq=4, hkv=1, lens_q=(4, 1, 3), lens_kv=(2, 6, 3), mask=CAUSAL_BR, sink=True
    ),
    "thd-window-tail-tokens": Case(
        thd=True,
        batch=2,
        lens_q=(5, 3),
        lens_kv=(5, 7),
        extra_q=3,
        extra_kv=2,
        mask=(("sliding_window_length", 2),) + CAUSAL,
        stats_head_major=True,
    ),
    "thd-every-sequence-empty": Case(thd=True, batch=2, lens_q=(0, 0), lens_kv=(0, 3), extra_q=1, sink=True),
    "padding-every-row-empty": Case(batch=2, sq=4, skv=4, lens_q=(0, 0), lens_kv=(2, 4), sink=True),
    "no-stats": Case(stats=False, mask=CAUSAL),
}


@pytest.mark.parametrize("name", list(CASES))
def test_forward_matches_oracle(name):
    assert_fwd_matches_oracle(name, CASES[name])


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.stats])
def test_backward_matches_autograd(name):
    case = CASES[name]
    _, (_, _, _, dsink), want = assert_bwd_matches_oracle(name, case)
    if case.sink:
        assert_close(dsink, want[5], rtol=1e-5, atol=1e-6, what=f"{name} dSink")
    else:
        assert dsink is None


def test_backward_deterministic_and_without_dsink():
    case = Case(sink=True, mask=CAUSAL)
    t = make_inputs(case)
    dq, dk, dv, dsink = run_bwd(case, t, deterministic=True, dsink=False)
    _, _, want_dq, want_dk, want_dv, _ = oracle_bwd(case, t)
    assert dsink is None
    for got, want in ((dq, want_dq), (dk, want_dk), (dv, want_dv)):
        assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_stats_values_by_hand():
    """One head, one query: LSE is log(sum exp(scaled logits)) (+ the sink), natural log."""
    case = Case(batch=1, hq=1, hkv=1, sq=1, skv=3, d=2, scale=0.5, sink=True)
    t = make_inputs(case)
    t["q"] = torch.tensor([[[[1.0, 2.0]]]])
    t["k"] = torch.tensor([[[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]]])
    t["sink"] = torch.tensor([0.25])
    o, stats = run_fwd(case, t)
    logits = [0.5, 1.0, 1.5]
    want = math.log(sum(math.exp(x) for x in logits) + math.exp(0.25))
    assert stats.shape == (1, 1, 1, 1)
    assert stats.item() == pytest.approx(want, rel=1e-6)


def test_fully_masked_rows_without_and_with_sinks():
    """Rows whose sequence has no key: O = 0 and LSE = -inf, or LSE = the sink logit with sinks."""
    case = Case(batch=1, sq=4, skv=4, lens_q=(4,), lens_kv=(0,))
    t = make_inputs(case)
    o, stats = run_fwd(case, t)
    assert torch.equal(o, torch.zeros_like(o))
    assert torch.isneginf(stats).all()
    case = case.with_(sink=True)
    t = make_inputs(case)
    o, stats = run_fwd(case, t)
    assert torch.equal(o, torch.zeros_like(o))
    sink = t["sink"].view(1, -1, 1, 1).expand_as(stats)
    assert_close(stats, sink, rtol=0, atol=1e-6)


def test_bf16_forward_and_backward():
    case = Case(dtype=torch.bfloat16, hq=4, hkv=2, sq=16, skv=16, d=32, layout="bshd", mask=CAUSAL, sink=True)
    t = make_inputs(case)
    o, stats = run_fwd(case, t)
    want_o, want_lse = oracle_fwd(case, t)
    assert o.dtype == torch.bfloat16 and stats.dtype == torch.float32
    assert rel_err(o, want_o) < 1e-2
    assert_close(stats, want_lse, rtol=1e-4, atol=1e-4, what="bf16 Stats")
    dq, dk, dv, dsink = run_bwd(case, t)
    _, _, want_dq, want_dk, want_dv, want_dsink = oracle_bwd(case, t)
    for got, want in ((dq, want_dq), (dk, want_dk), (dv, want_dv)):
        assert got.dtype == torch.bfloat16
        assert rel_err(got, want) < 1e-2
    assert rel_err(dsink, want_dsink) < 1e-3


def test_bound_thd_totals_may_be_smaller_than_declared():
    """A THD graph declared with an envelope executes with fewer packed tokens."""
    import frost
    from test.helpers import empty_like_decl, fwd_graph

    big = Case(thd=True, batch=2, lens_q=(6, 6), lens_kv=(6, 6), stats_head_major=True)
    small = big.with_(lens_q=(2, 3), lens_kv=(4, 1))
    g, _, o, stats = fwd_graph(big, make_inputs(big), CPU)
    g.validate().build_plans()
    t = make_inputs(small)
    pack = {h: t[h.name] for h in g.tensors if h.name in t and not h.is_virtual}
    o_t = torch.full((small.total_q, small.hq, small.d), float("nan"))
    stats_t = torch.full((small.hq, small.total_q, 1), float("nan")).permute(1, 0, 2)  # head-major
    pack.update({o: o_t, stats: stats_t})
    g.execute(pack, None, frost.ExecutionContext())
    want_o, want_lse = oracle_fwd(small, t)
    assert_close(o_t, want_o, rtol=1e-6, atol=1e-6, what="O")
    assert_close(stats_t, want_lse, rtol=1e-6, atol=1e-6, what="Stats")
    assert empty_like_decl(o).shape == (12, big.hq, big.d)


def test_oracle_agrees_with_torch_sdpa():
    """The oracle itself against torch's math SDPA on a plain causal GQA problem."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 7, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 2, 7, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 2, 7, 8, generator=gen, dtype=torch.float64)
    o, _ = oracle.attention(q, k, v, scale=0.3, causal=True)
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True, scale=0.3
    )
    torch.testing.assert_close(o, want, rtol=1e-12, atol=1e-12)
