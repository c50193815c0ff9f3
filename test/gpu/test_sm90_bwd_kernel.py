"""The wgmma SDPA backward chain (shared preprocess, SM90 main kernel, shared dQ convert), called directly,
against float64 autograd.

Inputs, oracle and poisoning come from the mma.sync chain's kernel test: outputs and the whole workspace
are NaN before each run, so every element that must be written is, and the chain clears its own scratch.
"""

from __future__ import annotations

import pytest
import torch

from frost.engines.sm90.sdpa_bwd_params import Sm90BwdParams
from frost.testing.cases import sm90_bwd_kwargs
from frost.testing.bwd_chain import compile_chains, workspace_views
from test.gpu.test_sm80_bwd_kernel import Case, extra_cols, make_inputs, oracle, rel, run_graph_replay, run_nan_padding

pytestmark = pytest.mark.gpu


def _p(**kw) -> Sm90BwdParams:
    return Sm90BwdParams(**sm90_bwd_kwargs(**kw))


CASES = [
    Case("d128_plain", _p(), sq=300, skv=300),
    Case("d128_gqa_big", _p(hq=8, hk=2), b=2, sq=1024, skv=1024),
    Case("d128_causal_tl_sq<skv", _p(has_window_right=True), sq=200, skv=333, wr=0),
    Case("d128_causal_br", _p(has_window_right=True, bottom_right=True), sq=200, skv=450, wr=0),
    Case("d128_causal_br_sq>skv", _p(has_window_right=True, bottom_right=True), sq=300, skv=130, wr=0),
    Case("d128_causal_1024", _p(hq=2, hk=2, has_window_right=True), b=2, sq=1024, skv=1024, wr=0),
    Case(
        "d64_window_br_gqa",
        _p(d=64, hq=8, hk=2, has_window_left=True, has_window_right=True, bottom_right=True),
        sq=513,
        skv=600,
        wl=64,
        wr=0,
    ),
    Case("d64_m128_causal", _p(d=64, has_window_right=True, knobs=dict(tile_m=128)), sq=700, skv=700, wr=0),
    Case("d64_m128_plain_mqa", _p(d=64, hq=4, hk=1, knobs=dict(tile_m=128)), sq=333, skv=517),
    Case("d128_band_wl40_wr17", _p(has_window_left=True, has_window_right=True), sq=257, skv=257, wl=40, wr=17),
    Case("d96_fp16", _p(d=96, dtype="fp16"), sq=190, skv=250),
    Case("d128_fp16_left_only", _p(dtype="fp16", has_window_left=True), sq=400, skv=300, wl=100),
    Case("d128_strided_lse", _p(hq=4, hk=2), b=2, sq=300, skv=300, strided_lse=True),
    Case("d128_one_row", _p(), b=3, sq=1, skv=77),
    # 80-row steps: dQ^T = K^T dS^T (head dim on the wgmma M axis)
    Case("d128_m80_plain_gqa", _p(hq=8, hk=2, knobs=dict(tile_m=80)), b=2, sq=333, skv=517),
    Case(
        "d128_m80_causal_br", _p(has_window_right=True, bottom_right=True, knobs=dict(tile_m=80)), sq=700, skv=650, wr=0
    ),
    Case(
        "d128_m80_band",
        _p(has_window_left=True, has_window_right=True, knobs=dict(tile_m=80)),
        sq=257,
        skv=257,
        wl=40,
        wr=17,
    ),
    Case(
        "d128_m80_fp16_causal_mqa",
        _p(dtype="fp16", hq=4, hk=1, has_window_right=True, knobs=dict(tile_m=80)),
        sq=190,
        skv=250,
        wr=0,
    ),
    # deterministic: the key tiles add into each query tile in a fixed order; three runs bitwise equal
    Case(
        "det_d128_causal_gqa",
        _p(hq=4, hk=2, has_window_right=True, deterministic=True),
        b=2,
        sq=1000,
        skv=1000,
        wr=0,
        runs=3,
    ),
    Case("det_d128_plain", _p(deterministic=True), b=2, sq=700, skv=900, runs=3),
    Case(
        "det_d64_window_br_gqa",
        _p(d=64, hq=8, hk=2, has_window_left=True, has_window_right=True, bottom_right=True, deterministic=True),
        sq=513,
        skv=600,
        wl=64,
        wr=0,
        runs=3,
    ),
    Case(
        "det_d128_m64_left",
        _p(has_window_left=True, deterministic=True, knobs=dict(tile_m=64)),
        sq=500,
        skv=400,
        wl=100,
        runs=3,
    ),
]

# Lengths from the device: packed THD (empty sequences, sequences shorter than a tile, a key tile with no query
# tile in its band, key tiles past a short sequence), padding masks (an empty batch), sinks with dSink, and
# deterministic turns of both orders. Their own fixture, so a run of these compiles only these.
LENGTH_CASES = [
    Case(
        "thd_d128_causal_gqa_sinks",
        _p(hq=4, hk=2, is_thd=True, has_window_right=True, has_sinks=True, has_dsinks=True),
        thd_lens=[(0, 0), (1, 1), (37, 37), (300, 450), (129, 129), (5, 200)],
        wr=0,
    ),
    Case(
        "thd_d64_det",
        _p(d=64, hq=2, hk=2, is_thd=True, deterministic=True),
        thd_lens=[(513, 513), (1, 7), (0, 3), (64, 64)],
        runs=3,
    ),
    Case(
        "thd_d96_det_causal_gqa",
        _p(d=96, hq=4, hk=2, is_thd=True, has_window_right=True, deterministic=True),
        thd_lens=[(200, 200), (1, 1), (0, 5), (130, 70), (64, 300)],
        wr=0,
        runs=3,
    ),
    Case(
        "thd_d128_band_br",
        _p(is_thd=True, has_window_left=True, has_window_right=True, bottom_right=True),
        thd_lens=[(70, 300), (200, 90), (1, 1)],
        wl=50,
        wr=10,
    ),
    Case(
        "thd_d128_m64_s1_fp16",
        _p(dtype="fp16", is_thd=True, knobs=dict(tile_m=64, num_stages=1)),
        thd_lens=[(77, 77), (1, 1), (200, 150), (0, 0), (129, 64)],
    ),
    # packed batches with fragment-order dQ tiles (each sequence's own tiles; the knob, not yet the default)
    Case(
        "thd_d64_frag",
        _p(d=64, hq=2, hk=2, is_thd=True, knobs=dict(dq_fragments=True)),
        thd_lens=[(513, 513), (1, 7), (0, 3), (130, 64), (128, 128)],
    ),
    Case(
        "thd_d128_m64_frag_det_causal_sinks",
        _p(
            hq=4,
            hk=2,
            is_thd=True,
            has_window_right=True,
            deterministic=True,
            has_sinks=True,
            has_dsinks=True,
            knobs=dict(tile_m=64, dq_fragments=True),
        ),
        thd_lens=[(200, 200), (1, 1), (0, 5), (65, 70), (64, 300)],
        wr=0,
        runs=3,
    ),
    # GQA: the longest sequences launch first (`ranked_batch`): 45 sequences with tied and empty lengths put
    # entries past the first 32 in play; 70 keep their index order (more than RANKED_BATCH_MAX)
    Case(
        "thd_d64_ranked_45_det_gqa",
        _p(d=64, hq=4, hk=2, is_thd=True, deterministic=True),
        thd_lens=[((i * 7) % 20 * 13, (i * 7) % 20 * 13) for i in range(45)],
        runs=3,
    ),
    Case(
        "thd_d128_causal_70_seqs_gqa",
        _p(hq=4, hk=2, is_thd=True, has_window_right=True),
        thd_lens=[((i * 11) % 30 + 1, (i * 11) % 30 + 1) for i in range(70)],
        wr=0,
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
    Case(
        "pad_d96_sinks_det",
        _p(d=96, has_seqused=True, has_sinks=True, has_dsinks=True, deterministic=True),
        b=3,
        sq=203,
        skv=203,
        used=[(203, 203), (9, 150), (0, 0)],
        runs=3,
    ),
    Case(
        "pad_d64_left_det_mqa",
        _p(d=64, hq=4, hk=1, has_seqused=True, has_window_left=True, deterministic=True),
        b=3,
        sq=300,
        skv=300,
        used=[(300, 260), (0, 0), (130, 300)],
        wl=100,
        runs=3,
    ),
]
# Head dims above 128: both warpgroups share 64 keys (tile_n=64), P^T and dS^T through shared memory, dQ through
# the shared dQ tile (the defaults) or from registers by red.global.add (a knob); dense, masks, GQA, deterministic
# turns with the register adds, packed and padded lengths, fp16, and the other dQ paths as knobs.
WIDE_CASES = [
    Case("d256_plain", _p(d=256), sq=300, skv=333),
    Case("d256_causal_gqa", _p(d=256, hq=8, hk=2, has_window_right=True), b=2, sq=700, skv=700, wr=0),
    Case(
        "d256_band_br_fp16",
        _p(d=256, dtype="fp16", has_window_left=True, has_window_right=True, bottom_right=True),
        sq=257,
        skv=400,
        wl=60,
        wr=5,
    ),
    Case("d256_red_s2", _p(d=256, knobs=dict(num_stages=2, dq_red=True)), sq=333, skv=200),
    Case(
        "d256_red_det_band",
        _p(
            d=256,
            has_window_left=True,
            has_window_right=True,
            deterministic=True,
            knobs=dict(num_stages=2, dq_red=True),
        ),
        sq=300,
        skv=300,
        wl=70,
        wr=20,
        runs=3,
    ),
    Case(
        "d256_det_causal_gqa",
        _p(d=256, hq=4, hk=2, has_window_right=True, deterministic=True),
        b=2,
        sq=500,
        skv=500,
        wr=0,
        runs=3,
    ),
    Case("d192_plain_mqa", _p(d=192, dv=128, hq=4, hk=1), sq=300, skv=517),
    Case("d192_causal_br", _p(d=192, dv=128, has_window_right=True, bottom_right=True), sq=200, skv=450, wr=0),
    Case("d192_red_det", _p(d=192, dv=128, deterministic=True, knobs=dict(dq_red=True)), sq=400, skv=300, runs=3),
    Case("d128_n64_causal", _p(has_window_right=True, knobs=dict(tile_m=64, tile_n=64)), sq=300, skv=300, wr=0),
    Case(
        "thd_d256_causal_gqa_sinks",
        _p(d=256, hq=4, hk=2, is_thd=True, has_window_right=True, has_sinks=True, has_dsinks=True),
        thd_lens=[(0, 0), (1, 1), (37, 37), (300, 450), (65, 65), (5, 200)],
        wr=0,
    ),
    Case(
        "thd_d192_det",
        _p(d=192, dv=128, hq=2, hk=2, is_thd=True, deterministic=True),
        thd_lens=[(200, 200), (1, 7), (0, 3), (64, 64)],
        runs=3,
    ),
    Case(
        "pad_d256_causal",
        _p(d=256, has_seqused=True, has_window_right=True),
        b=3,
        sq=256,
        skv=256,
        wr=0,
        used=[(256, 256), (100, 180), (0, 0)],
    ),
]

# The other head dims (multiples of 8 up to 256): tiles padded past the head dim (80 on 96 columns, 112 on 128 with 80
# and 64 rows, 72x40 on 96x48, 40 on 48 with 128 rows, 200 on 224 with register adds), pairs on whole tiles (128x64,
# 192x64, 160), dense and packed, causal and not; `wide` rows hold NaN past the head dim, which must stay unread and
# unwritten.
HEAD_DIM_CASES = [
    Case("hd_d80_causal_gqa_wide", _p(d=80, hq=8, hk=2, has_window_right=True), sq=300, skv=333, wr=0, wide=True),
    Case("hd_d112_m80_plain", _p(d=112), sq=300, skv=517),
    Case("hd_d112_m64_causal_br", _p(d=112, has_window_right=True, bottom_right=True), sq=200, skv=450, wr=0),
    Case("hd_d72v40_fp16_wide", _p(d=72, dv=40, dtype="fp16"), sq=190, skv=250, wide=True),
    Case("hd_d40_m128_det_causal", _p(d=40, has_window_right=True, deterministic=True), sq=500, skv=500, wr=0, runs=3),
    Case("hd_d128v64_causal", _p(d=128, dv=64, hq=4, hk=1, has_window_right=True), sq=333, skv=333, wr=0),
    Case("hd_d192v64_plain", _p(d=192, dv=64), sq=300, skv=300),
    Case(
        "hd_d160_det_causal_gqa",
        _p(d=160, hq=4, hk=2, has_window_right=True, deterministic=True),
        sq=400,
        skv=400,
        wr=0,
        runs=3,
    ),
    Case(
        "hd_d200_red_band_wide",
        _p(d=200, has_window_left=True, has_window_right=True, knobs=dict(dq_red=True)),
        sq=257,
        skv=300,
        wl=60,
        wr=5,
        wide=True,
    ),
    Case(
        "hd_thd_d80_causal_gqa_sinks",
        _p(d=80, hq=4, hk=2, is_thd=True, has_window_right=True, has_sinks=True, has_dsinks=True),
        thd_lens=[(0, 0), (1, 1), (37, 37), (300, 450), (129, 129), (5, 200)],
        wr=0,
    ),
    Case(
        "hd_thd_d72v40_det_wide",
        _p(d=72, dv=40, hq=2, hk=2, is_thd=True, deterministic=True),
        thd_lens=[(200, 200), (1, 7), (0, 3), (64, 64)],
        runs=3,
        wide=True,
    ),
    Case(
        "hd_thd_d192v64_causal",
        _p(d=192, dv=64, is_thd=True, has_window_right=True),
        thd_lens=[(70, 300), (200, 90), (1, 1)],
        wr=0,
    ),
    Case("hd_thd_d112_plain", _p(d=112, is_thd=True), thd_lens=[(77, 77), (1, 1), (200, 150), (0, 0), (129, 64)]),
    # d_qk over d_v on packed tiles: 64 rows (80 rows gave wrong gradients on the H200, run 20)
    Case(
        "hd_thd_d128v64_gqa",
        _p(d=128, dv=64, hq=6, hk=3, is_thd=True),
        thd_lens=[(100, 130), (0, 17), (257, 200), (64, 1)],
    ),
]

#: new lengths for the replay of each case (the same totals; keys within the captured max_seqlen_kv)
REPLAY = {
    "thd_d128_causal_gqa_sinks": [(5, 5), (300, 449), (129, 129), (0, 0), (37, 138), (1, 96)],
    "thd_d64_det": [(0, 0), (64, 300), (513, 286), (1, 1)],
}


@pytest.fixture(scope="module")
def chains():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return dict(zip([c.name for c in CASES], compile_chains([c.p for c in CASES])))


@pytest.fixture(scope="module")
def wide_chains():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return dict(zip([c.name for c in WIDE_CASES], compile_chains([c.p for c in WIDE_CASES])))


@pytest.fixture(scope="module")
def head_dim_chains():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return dict(zip([c.name for c in HEAD_DIM_CASES], compile_chains([c.p for c in HEAD_DIM_CASES])))


@pytest.fixture(scope="module")
def length_chains():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return dict(zip([c.name for c in LENGTH_CASES], compile_chains([c.p for c in LENGTH_CASES])))


def valid_rows(case, name, x):
    """Packed dK / dV rows past the last sequence are not written (the contract); everything else is."""
    if case.thd_lens is not None and name in ("dk", "dv"):
        return x[: sum(b for _, b in case.thd_lens)]
    return x


ALL_CASES = CASES + LENGTH_CASES + WIDE_CASES + HEAD_DIM_CASES


@pytest.mark.parametrize("case", ALL_CASES, ids=[c.name for c in ALL_CASES])
def test_sm90_bwd_chain(case, request):
    fixture = (
        "length_chains"
        if case in LENGTH_CASES
        else "wide_chains"
        if case in WIDE_CASES
        else "head_dim_chains"
        if case in HEAD_DIM_CASES
        else "chains"
    )
    chains = request.getfixturevalue(fixture)
    p = case.p
    t, scalars, sinks, scale = make_inputs(case)
    lse_variants = [t["lse"]] + ([t["lse_contig"]] if case.strided_lse else [])
    ref = oracle(case, t["q"], t["k"], t["v"], t["do"], sinks, scale)
    refs = dict(dq=ref[0], dk=ref[1], dv=ref[2], dsinks=ref[3])
    outs = ("dq", "dk", "dv") + (("dsinks",) if p.has_dsinks else ())
    first = None
    for lse in lse_variants:
        for _ in range(case.runs):
            for n in outs:
                t[n].fill_(float("nan"))
            chains[case.name]({**t, "lse": lse}, scalars, workspace_views(p, t))
            torch.cuda.synchronize()
            for n in outs:
                got_n = valid_rows(case, n, t[n])
                assert not torch.isnan(got_n).any(), f"{case.name}: {n} has {int(torch.isnan(got_n).sum())} NaN"
                e = rel(got_n, valid_rows(case, n, refs[n]))
                assert e < 2e-2, f"{case.name}: {n} rel err {e:.2e}"
                if case.wide and n != "dsinks":  # the NaN columns past the head dim: never written
                    assert torch.isnan(extra_cols(t[n])).all(), f"{case.name}: {n} written past its head dim"
            got = [t[n].clone() for n in outs]
            if first is None:
                first = got
            elif p.deterministic:
                assert all(torch.equal(a, b) for a, b in zip(first, got)), f"{case.name}: runs differ bitwise"


@pytest.mark.parametrize("name", sorted(REPLAY))
def test_thd_graph_replay_honors_new_lengths(name, length_chains):
    """Captured once, replayed after new lengths are written into the same device tensors."""
    case = [c for c in LENGTH_CASES if c.name == name][0]
    ok, msg = run_graph_replay(case, length_chains[name], REPLAY[name])
    assert ok, msg


@pytest.mark.parametrize(
    "name",
    ["pad_d128_causal", "pad_d96_sinks_det", "thd_d128_causal_gqa_sinks", "thd_d64_det", "thd_d96_det_causal_gqa"],
)
def test_nan_in_padding_does_not_leak(name, length_chains):
    """NaN / Inf in every padding row (past seqused, after the last packed sequence) stays out of the gradients."""
    case = [c for c in LENGTH_CASES if c.name == name][0]
    ok, msg = run_nan_padding(case, length_chains[name])
    assert ok, msg


# Determinism over many runs: 1000 of small problems (checked once against float64), 20 of large ones (every
# run bitwise equal to the first; the float64 oracle is too large there). Dense, GQA, causal and packed THD.
MANY_RUNS = [
    Case(
        "many_small_gqa_causal",
        _p(hq=4, hk=2, has_window_right=True, deterministic=True),
        b=1,
        sq=256,
        skv=256,
        wr=0,
        runs=1000,
    ),
    Case(
        "many_small_thd_d64",
        _p(d=64, hq=4, hk=2, is_thd=True, deterministic=True),
        thd_lens=[(200, 200), (57, 57), (300, 129)],
        runs=1000,
    ),
    Case("many_large_gqa", _p(hq=16, hk=4, deterministic=True), b=2, sq=4096, skv=4096, runs=20),
    Case(
        "many_large_causal",
        _p(hq=16, hk=16, has_window_right=True, deterministic=True),
        b=1,
        sq=8192,
        skv=8192,
        wr=0,
        runs=20,
    ),
    Case(
        "many_large_thd_causal_gqa",
        _p(hq=8, hk=2, is_thd=True, has_window_right=True, deterministic=True),
        thd_lens=[(4000, 4000), (1500, 1500), (2600, 2600)],
        wr=0,
        runs=20,
    ),
]


@pytest.fixture(scope="module")
def many_run_chains():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return dict(zip([c.name for c in MANY_RUNS], compile_chains([c.p for c in MANY_RUNS])))


@pytest.mark.parametrize("case", MANY_RUNS, ids=[c.name for c in MANY_RUNS])
def test_deterministic_gradients_are_bitwise_equal_over_many_runs(case, many_run_chains):
    p = case.p
    t, scalars, sinks, scale = make_inputs(case)
    outs = ("dq", "dk", "dv")
    views = workspace_views(p, t)
    many_run_chains[case.name](t, scalars, views)
    torch.cuda.synchronize()
    first = [valid_rows(case, n, t[n]).clone() for n in outs]
    for n, x in zip(outs, first):
        assert torch.isfinite(x).all(), f"{case.name}: {n} not finite"
    if case.runs >= 1000:  # small: the first run against float64
        ref = oracle(case, t["q"], t["k"], t["v"], t["do"], sinks, scale)
        for n, x, r in zip(outs, first, ref[:3]):
            assert rel(x, valid_rows(case, n, r)) < 2e-2, f"{case.name}: {n}"
    differ = 0
    for _ in range(case.runs - 1):
        many_run_chains[case.name](t, scalars, views)
        differ += sum(not torch.equal(valid_rows(case, n, t[n]), x) for n, x in zip(outs, first))
    torch.cuda.synchronize()
    assert differ == 0, f"{case.name}: {differ} gradients differ bitwise from the first run"


# The rotated deterministic order (`det_order="rotated"`, no band): each key tile's walk starts at its own query
# tile. Two runs bitwise equal, and within the chains' tolerance of the non-deterministic kernel; dense with GQA
# and a ragged last tile, packed THD, and a plan whose SMs are fewer than the key tiles (the stair fallback).
ROTATED = [
    Case(
        "rotated_d128_gqa",
        _p(hq=8, hk=2, deterministic=True, knobs=dict(det_order="rotated")),
        b=2,
        sq=3000,
        skv=2900,
        runs=2,
    ),
    Case(
        "rotated_d128_thd",
        _p(hq=4, hk=2, is_thd=True, deterministic=True, knobs=dict(det_order="rotated")),
        thd_lens=[(2000, 2000), (700, 1300), (1, 1), (1500, 900)],
        runs=2,
    ),
    Case(
        "rotated_d128_fewer_sms",
        _p(deterministic=True, knobs=dict(det_order="rotated", sm_count=8)),
        b=1,
        sq=3000,
        skv=3000,
        runs=2,
    ),
]


@pytest.fixture(scope="module")
def rotated_chains():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    twins = [c.p.model_copy(update=dict(deterministic=False, det_order="stair")) for c in ROTATED]
    compiled = compile_chains([c.p for c in ROTATED] + twins)
    return {c.name: (compiled[i], compiled[len(ROTATED) + i], twins[i]) for i, c in enumerate(ROTATED)}


@pytest.mark.parametrize("case", ROTATED, ids=[c.name for c in ROTATED])
def test_rotated_order_is_bitwise_stable_and_matches_the_free_order(case, rotated_chains):
    chain, free_chain, free_p = rotated_chains[case.name]
    t, scalars, _, _ = make_inputs(case)
    outs = ("dq", "dk", "dv")
    runs = []
    for _ in range(case.runs):
        for n in outs:
            t[n].fill_(float("nan"))
        chain(t, scalars, workspace_views(case.p, t))
        torch.cuda.synchronize()
        runs.append([valid_rows(case, n, t[n]).clone() for n in outs])
    assert all(torch.equal(a, b) for r in runs[1:] for a, b in zip(runs[0], r)), f"{case.name}: runs differ bitwise"
    free_chain(t, scalars, workspace_views(free_p, t))
    torch.cuda.synchronize()
    for n, x in zip(outs, runs[0]):
        assert torch.isfinite(x).all(), f"{case.name}: {n} not finite"
        e = rel(x, valid_rows(case, n, t[n]))
        assert e < 2e-2, f"{case.name}: {n} rel err {e:.2e} against the non-deterministic kernel"
