"""Decode on the mma.sync forward: the plan-time choices of `num_splits` and GQA packing on a fake H200 (and their
requests, workspace, kernels and arguments), the split + combine math modelled in float64 on the host with the
kernel's own key-tile cut against the reference engine, and the split, packed and combine kernels compiled for
sm_80."""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch

import frost
from frost.adapters.split_kv import choose_num_splits, partial_layout
from frost.engines.common.split_combine_params import (
    SplitCombineParams,
    combine_arg_names,
    combine_row,
    combine_score_stats,
    key_split_range,
)
from frost.engines.sdpa_args import fwd_arg_names
from frost.knobs import Knobs
from frost.runtime.workspace import align_up, layout_bytes
from frost.target import fake_target
from test.compile_runner import compile_groups
from test import oracle
from test.helpers import Case, make_inputs, prefix, run_fwd

H200_SLOTS = 2 * 132  # the CTA slots the plan counts on an H200 (frost.adapters.split_kv.CTAS_PER_SM)


def _decode_facts(batch=1, hq=32, hkv=8, sq=1, d=128, skv=32768, paged=None, stats=True, scores=False, **mask):
    """A decode forward's facts: dense K/V (B, Hkv, Skv, d) or a paged cache of block size `paged`; `scores`:
    score_max and score_sum_exp outputs too; `mask`: sdpa's mask keywords."""
    g = frost.pygraph(io_data_type=frost.data_type.BFLOAT16)
    q = g.tensor(name="Q", dim=(batch, hq, sq, d), stride=(hq * sq * d, d, hq * d, 1))
    kw = dict(attn_scale=0.1, generate_stats=stats, **mask)
    if scores:
        for role in ("score_max", "score_sum_exp"):
            kw[role] = g.tensor(name=role, dim=(batch, hq, sq, 1), data_type=frost.data_type.FLOAT)
    if paged:
        blocks = -(-skv // paged)
        k, v = (
            g.tensor(name=n, dim=(batch * blocks, hkv, paged, d), stride=(hkv * paged * d, d, hkv * d, 1)) for n in "KV"
        )
        kt, vt = (
            g.tensor(name=n, dim=(batch, 1, blocks, 1), stride=(blocks, blocks, 1, 1), data_type=frost.data_type.INT32)
            for n in ("table_k", "table_v")
        )
        lq, lk = (
            g.tensor(name=n, dim=(batch, 1, 1, 1), stride=(1, 1, 1, 1), data_type=frost.data_type.INT32)
            for n in ("seq_q", "seq_kv")
        )
        kw.update(
            use_padding_mask=True,
            seq_len_q=lq,
            seq_len_kv=lk,
            paged_attention_k_table=kt,
            paged_attention_v_table=vt,
            paged_attention_max_seq_len_kv=skv,
        )
    else:
        k, v = (g.tensor(name=n, dim=(batch, hkv, skv, d), stride=(hkv * skv * d, d, hkv * d, 1)) for n in "KV")
    o, st = g.sdpa(q, k, v, **kw)
    o.set_output(True)
    if st is not None:
        st.set_output(True)
    return g.validate().facts


def _sm80(facts, knobs=None, target="H200"):
    """The mma.sync forward's adapter for `facts` on a fake target (by name: the wgmma forward ranks first)."""
    from frost.lowering.lower import rank

    ranking = rank(facts, fake_target(target), knobs, engine="sm80")
    assert ranking.accepted, ranking.declines
    return ranking.accepted[0][1]


@pytest.mark.parametrize(
    "kw", [dict(), dict(batch=2, skv=131072), dict(paged=128), dict(batch=2, paged=64, skv=131072)]
)
def test_a_long_decode_is_split_until_it_fills_the_h200(kw):
    a = _sm80(_decode_facts(**kw))
    p = a.validated_params()
    assert (p.tile_m, p.num_warps) == (64, 4) and p.pack_gqa  # the decode tile, the 4 heads of a group packed
    work = kw.get("batch", 1) * 8  # batch x KV groups x one query tile
    assert p.split and work * p.num_splits >= 0.8 * H200_SLOTS, (p.num_splits, work)
    # the partials' workspace is the plan's, from the declared dims: (splits, B, Hq, Sq, Dv) and (splits, B, Hq, Sq)
    want = layout_bytes(partial_layout(a.facts, p.num_splits))
    assert a.scratch_workspace_bytes() == want >= 4 * p.num_splits * kw.get("batch", 1) * 32 * 129
    specs = a.kernel_specs()
    assert [t for t, _ in specs] == ["frost.engines.sm80.sdpa_fwd", "frost.engines.common.split_combine"]
    combine = specs[1][1]
    assert (combine.num_splits, combine.has_lse, combine.head_dim_v) == (p.num_splits, True, 128)
    names = fwd_arg_names(p)
    assert names[-3:] == ["o_partial", "lse_partial", "stream"]


@pytest.mark.parametrize("kw", [dict(batch=8, sq=1024, skv=4096), dict(skv=128), dict(batch=32)])
def test_busy_grids_and_short_caches_are_not_split(kw):
    p = _sm80(_decode_facts(**kw)).validated_params()
    assert p.num_splits == 1 and not p.split
    assert "o_partial" not in fwd_arg_names(p)


def test_score_statistics_split_with_each_splits_row_max():
    """score_max / score_sum_exp no longer keep a decode unsplit: each split writes its row max to a third
    partial, (splits, B, Hq, Sq) fp32 in the plan's workspace, and the combine writes both outputs."""
    facts = _decode_facts(batch=2, scores=True)
    for a in (_sm90(facts), _sm80(facts)):
        p = a.validated_params()
        assert p.split and p.has_score_max and p.has_score_sum_exp, a.engine_name
        layout = partial_layout(facts, p.num_splits)
        assert [b.name for b in layout] == ["o_partial", "lse_partial", "max_partial"]
        assert a.scratch_workspace_bytes() == layout_bytes(layout) >= 4 * p.num_splits * 2 * 32 * (128 + 2)
        assert fwd_arg_names(p)[-4:] == ["o_partial", "lse_partial", "max_partial", "stream"]
        combine = a.kernel_specs()[1][1]
        assert combine_arg_names(combine) == [
            "o", "lse", "score_max", "score_sum_exp", "o_partial", "lse_partial", "max_partial", "stream"
        ]  # fmt: skip


def test_a_requested_split_count_is_honored_on_both_dsl_forwards():
    a = _sm80(_decode_facts(skv=8192), Knobs(num_splits=3))
    assert a.validated_params().num_splits == 3 and a.validated_params().tile_m == 64  # the packed decode tile
    p = _sm80(_decode_facts(), Knobs(tile_m=128)).validated_params()
    assert p.tile_m == 128 and p.split  # a requested tile is kept; the split count follows it
    assert _sm80(_decode_facts(), Knobs(num_splits=1)).validated_params().num_splits == 1
    from frost.lowering.lower import rank

    ranking = rank(_decode_facts(), fake_target("H200"), Knobs(num_splits=4))
    assert ranking.accepted[0][1].engine_name == "SdpaFwdDslSm90"
    assert ranking.accepted[0][1].validated_params().num_splits == 4
    assert [a.engine_name for _, a in ranking.accepted] == ["SdpaFwdDslSm90", "SdpaFwdDslSm80"]
    assert "has no knob 'num_splits'" in dict(ranking.declines)["SdpaFwdCudnn"]
    declines = dict(rank(_decode_facts(), fake_target("H200"), Knobs(num_splits=200), engine="sm80").declines)
    assert "num_splits=200 is not one of" in declines["SdpaFwdDslSm80"]


@pytest.mark.parametrize(
    "kw, packed",
    [
        (dict(), True),
        (dict(sq=16), True),
        (dict(sq=17), False),
        (dict(hkv=32), False),
        (dict(hkv=1, skv=4096), True),
        (dict(sq=4, use_causal_mask_bottom_right=True, sliding_window_length=4096), True),
    ],
)
def test_gqa_packing_is_planned_for_short_queries(kw, packed):
    p = _sm80(_decode_facts(**kw)).validated_params()
    assert p.pack_gqa == packed
    if packed:
        assert p.tile_m % (p.num_heads_q // p.num_heads_kv) == 0


def test_gqa_packing_requests_and_what_it_declines():
    p = _sm80(_decode_facts(), Knobs(pack_gqa=False)).validated_params()
    assert not p.pack_gqa and p.split  # unpacked: 32 heads' tiles, split
    assert _sm80(_decode_facts(sq=64, skv=512), Knobs(pack_gqa=True)).validated_params().pack_gqa
    from frost.engines.sm80.sdpa_fwd_params import Sm80FwdParams, validate
    from frost.errors import TemplateParamsError

    base = dict(head_dim=128, head_dim_v=128, num_heads_q=32, num_heads_kv=8, pack_gqa=True, tile_m=64)
    validate(Sm80FwdParams(**base))
    validate(Sm80FwdParams(**base, has_window_left=True, has_window_right=True))  # a sliding window packs too
    validate(Sm80FwdParams(**base, is_thd=True))  # and packed batches
    for bad, match in (
        (dict(num_heads_kv=32), "more query heads"),
        (dict(num_heads_kv=1, num_heads_q=96), "not a multiple"),
        (dict(has_alibi=True, has_window_right=True), "no bias, ALiBi"),
    ):
        with pytest.raises(TemplateParamsError, match=match):
            validate(Sm80FwdParams(**{**base, **bad}))


def _sm90(facts, knobs=None):
    from frost.lowering.lower import rank

    ranking = rank(facts, fake_target("H200"), knobs)
    assert ranking.accepted[0][1].engine_name == "SdpaFwdDslSm90", ranking.declines
    return ranking.accepted[0][1]


@pytest.mark.parametrize(
    "kw", [dict(), dict(batch=2, skv=131072), dict(paged=128), dict(batch=2, paged=64, skv=131072)]
)
def test_the_wgmma_forward_splits_a_long_decode_with_the_shared_choice(kw):
    """The H200's first-ranked decode engine (GQA 32:8, d=128): 64-row packed tiles, one per KV group, split by the
    mma.sync forward's own choice over its work tiles (one CTA per SM); its workspace, combine and arguments."""
    from frost.adapters.split_kv import cdiv

    a = _sm90(_decode_facts(**kw))
    p = a.validated_params()
    work = kw.get("batch", 1) * 8
    assert (p.tile_m, p.pack_gqa) == (64, True) and p.split
    assert p.num_splits == choose_num_splits(132, work, cdiv(kw.get("skv", 32768), p.tile_n))
    assert 0.8 * 132 <= work * p.num_splits <= 132  # one wave that fills the SMs
    assert a.scratch_workspace_bytes() == layout_bytes(partial_layout(a.facts, p.num_splits))
    specs = a.kernel_specs()
    assert [t for t, _ in specs] == ["frost.engines.sm90.sdpa_fwd", "frost.engines.common.split_combine"]
    assert (specs[1][1].num_splits, specs[1][1].has_lse, specs[1][1].has_sinks) == (p.num_splits, True, False)
    assert fwd_arg_names(p)[-3:] == ["o_partial", "lse_partial", "stream"]


@pytest.mark.parametrize("kw", [dict(batch=8, sq=1024, skv=4096), dict(skv=128), dict(batch=32, hq=32, hkv=32)])
def test_the_wgmma_forward_leaves_busy_grids_and_short_caches_unsplit(kw):
    p = _sm90(_decode_facts(**kw)).validated_params()
    assert p.num_splits == 1 and "o_partial" not in fwd_arg_names(p)


def test_a_small_prefill_grid_is_not_split_unless_requested():
    """Splits are planned for decodes only (`SPLIT_MAX_SEQ_Q`): a prefill whose grid underfills the GPU keeps the
    unsplit kernels, whose numerics and speed the GPU suite measured; a requested count is still honored."""
    from frost.adapters.split_kv import SPLIT_MAX_SEQ_Q

    prefill = _decode_facts(hq=8, hkv=8, sq=2048, skv=2048)
    assert _sm90(prefill).validated_params().num_splits == 1
    assert _sm80(prefill).validated_params().num_splits == 1
    assert _sm90(prefill, Knobs(num_splits=2)).validated_params().num_splits == 2
    assert _sm90(_decode_facts(hq=8, hkv=8, sq=SPLIT_MAX_SEQ_Q, skv=32768)).validated_params().num_splits > 1


def test_the_wgmma_forward_splits_only_what_its_template_serves():
    from frost.engines.sm90.sdpa_fwd_params import Sm90FwdParams, validate
    from frost.errors import TemplateParamsError

    base = dict(head_dim=128, head_dim_v=128, num_heads_q=32, num_heads_kv=8, num_splits=4)
    validate(Sm90FwdParams(**base))
    validate(Sm90FwdParams(**base, is_thd=True, pack_gqa=True))  # packed batches split too
    validate(Sm90FwdParams(**base, has_score_max=True, has_score_sum_exp=True))  # and so do the score statistics
    for bad in (
        dict(has_block_mask=True),
        dict(num_splits=129),
        dict(head_dim_v=512, v_slices=2),
    ):
        with pytest.raises(TemplateParamsError, match="num_splits"):
            validate(Sm90FwdParams(**{**base, **bad}))


def test_choose_num_splits_counts_waves():
    assert choose_num_splits(264, 300, 1000) == 1  # already busy
    assert choose_num_splits(264, 32, 7) == 1  # too few key tiles to share
    assert choose_num_splits(264, 32, 512) == 7  # 224 CTAs: within 85% of 8 splits' 256 / 264
    assert choose_num_splits(264, 64, 2048) == 4
    s = choose_num_splits(132, 1, 10_000)
    assert 100 <= s <= 132


# ---------------------------------------------------------------- the math, modelled on the host in float64


def _band_tiles(m_block, tile_m, tile_n, sq, sk, offset, window_right):
    """The kernel's [n_min, n_max) of an m-tile (frost.engines.common.mask.n_block_range, no left bound)."""
    row_first, row_last = m_block * tile_m, min(m_block * tile_m + tile_m, sq) - 1
    col_end = sk if window_right is None else min(sk, row_last + offset + window_right + 1)
    n_max = -(-max(col_end, 0) // tile_n)
    return (0, 0) if row_first >= sq else (0, n_max)


def _split_model(case: Case, t: dict, num_splits: int, tile_m: int, tile_n: int):
    """Split + combine in float64: per query row, each split's keys are its share of the m-tile's key tiles
    (`key_split_range`, the kernel's own cut), its O_s and LSE_s are taken over them alone (no sink) and
    `combine_row` reduces them with the sink once. Returns (O, LSE, number of empty splits seen)."""
    q, k, v = (t[r].double() for r in ("q", "k", "v"))
    b_n, hq, sq, _ = q.shape
    qpk = hq // k.shape[1]
    causal_br = dict(case.mask).get("use_causal_mask_bottom_right", False)
    o = torch.zeros(b_n, hq, sq, v.shape[-1], dtype=torch.float64)
    lse = torch.full((b_n, hq, sq), -math.inf, dtype=torch.float64)
    empty = 0
    for b in range(b_n):
        len_q = case.lens_q[b] if case.padding else sq
        len_k = case.lens_kv[b] if case.padding else k.shape[2]
        offset = len_k - len_q if causal_br else 0
        for h in range(hq):
            sink = float(t["sink"].view(-1)[h]) if case.sink else None
            logits = (q[b, h] @ k[b, h // qpk].T) * case.attn_scale
            for i in range(len_q):
                n_min, n_max = _band_tiles(i // tile_m, tile_m, tile_n, len_q, len_k, offset, 0 if causal_br else None)
                lses, outs = [], []
                for s in range(num_splits):
                    lo, hi = key_split_range(n_min, n_max, s, num_splits)
                    keys = [j for j in range(lo * tile_n, min(hi * tile_n, len_k)) if not causal_br or j <= i + offset]
                    if not keys:
                        empty += 1
                        lses.append(-math.inf)
                        outs.append([0.0] * v.shape[-1])
                        continue
                    x = logits[i, keys]
                    lse_s = torch.logsumexp(x, 0)
                    lses.append(float(lse_s))
                    outs.append((torch.exp(x - lse_s) @ v[b, h // qpk, keys]).tolist())
                row, lse_row = combine_row(lses, outs, sink)
                o[b, h, i] = torch.tensor(row, dtype=torch.float64)
                lse[b, h, i] = lse_row
    return o, lse, empty


SPLIT_CASES = {
    "plain": (Case(batch=2, hq=4, hkv=2, sq=3, skv=37, d=8), 3),
    "empty-splits": (Case(batch=2, hq=4, hkv=2, sq=2, skv=37, d=8), 7),
    "sinks-padding-empty-sequence": (
        Case(batch=3, hq=2, hkv=1, sq=5, skv=29, d=8, sink=True, lens_q=(5, 2, 3), lens_kv=(29, 0, 11)),
        4,
    ),
    "causal-bottom-right": (
        Case(
            batch=2,
            hq=2,
            hkv=2,
            sq=6,
            skv=30,
            d=8,
            lens_q=(6, 4),
            lens_kv=(30, 17),
            mask=(("use_causal_mask_bottom_right", True),),
            sink=True,
        ),
        5,
    ),
}


#: (query positions per tile, keys per tile) of the model: the mma.sync forward's unpacked tiles, and a packed
#: wgmma tile (its 64 rows hold 64 / r query positions: the model walks query positions)
MODEL_TILES = {"mma.sync": (4, 4), "wgmma-packed": (1, 8)}


@pytest.mark.parametrize("tiles", list(MODEL_TILES))
@pytest.mark.parametrize("name", list(SPLIT_CASES))
def test_split_and_combine_reproduce_the_reference_engine(name, tiles):
    """The host model of the kernels' split + combine (the same key-tile cut) equals the reference engine's O and
    LSE in float64; padding rows are the forward's O = 0, LSE = -inf."""
    case, splits = SPLIT_CASES[name]
    t = make_inputs(case)
    o_ref, lse_ref = run_fwd(case, t)
    tile_m, tile_n = MODEL_TILES[tiles]
    o, lse, empty = _split_model(case, t, splits, tile_m=tile_m, tile_n=tile_n)
    rows = torch.zeros(lse.shape, dtype=torch.bool)
    for b in range(case.batch):
        rows[b, :, : case.lens_q[b] if case.padding else case.sq] = True
    lse_ref = lse_ref.double().squeeze(-1)
    torch.testing.assert_close(o[rows], o_ref.double()[rows], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse[rows], lse_ref[rows], rtol=1e-6, atol=1e-6)
    assert torch.isneginf(lse_ref[~rows]).all() and (o_ref[~rows] == 0).all()
    if name in ("empty-splits", "sinks-padding-empty-sequence"):
        assert empty > 0  # the model met splits with no key, as the kernel does


def test_key_split_ranges_cover_the_band_once():
    for n_min, n_max in ((0, 0), (0, 1), (3, 17), (0, 512), (5, 6)):
        for splits in (2, 3, 7, 64):
            got = [key_split_range(n_min, n_max, s, splits) for s in range(splits)]
            tiles = [n for lo, hi in got for n in range(lo, hi)]
            assert tiles == list(range(n_min, n_max))
            assert all(n_min <= lo <= hi <= n_max for lo, hi in got)


def test_combine_row_handles_empty_splits_rows_and_sinks():
    o, lse = combine_row([-math.inf, -math.inf], [[0.0], [0.0]])
    assert o == [0.0] and lse == -math.inf
    o, lse = combine_row([-math.inf, -math.inf], [[0.0], [0.0]], sink=1.5)
    assert o == [0.0] and lse == 1.5
    o, lse = combine_row([0.0, -math.inf, math.log(3.0)], [[1.0], [0.0], [2.0]], sink=None)
    assert lse == pytest.approx(math.log(4.0)) and o[0] == pytest.approx(0.25 * 1.0 + 0.75 * 2.0)
    # score_max / score_sum_exp from the splits' row maxima: a row with no key, then only the sink, then keys
    assert combine_score_stats([-math.inf, -math.inf], -math.inf) == (-math.inf, 0.0)
    assert combine_score_stats([-math.inf, -math.inf], 1.5, sink=1.5) == (1.5, 1.0)
    m, z = combine_score_stats([-0.5, -math.inf, 0.25], math.log(4.0), sink=-3.0)
    assert m == 0.25 and z == pytest.approx(4.0 / math.exp(0.25))


# ---------------------------------------------------------------- packed (THD) batches


def _thd_decode_facts(batch=4, hq=32, hkv=8, sq=1, skv=32768, d=128, ragged=False, scores=False):
    """A packed decode's facts: frost's packed form ((T, H, D) tensors, cu_seq_len_q / kv, max_seq_len_q / kv
    envelopes) or cuDNN's ragged offsets ((B, H, S, D) tensors in bshd strides, element offsets, seq_len_q / kv);
    `scores`: score_max and score_sum_exp too (the packed form's (T, H, 1), or per batch entry)."""
    g = frost.pygraph(io_data_type=frost.data_type.BFLOAT16)
    i32 = frost.data_type.INT32
    f32 = frost.data_type.FLOAT
    stats_dim = (batch * sq, hq, 1) if not ragged else (batch, hq, sq, 1)
    scores = (
        dict(
            score_max=g.tensor(name="M", dim=stats_dim, data_type=f32),
            score_sum_exp=g.tensor(name="Z", dim=stats_dim, data_type=f32),
        )
        if scores
        else {}
    )
    if ragged:
        bshd = lambda h, s: (s * h * d, d, h * d, 1)  # noqa: E731
        q = g.tensor(name="Q", dim=(batch, hq, sq, d), stride=bshd(hq, sq))
        k, v = (g.tensor(name=n, dim=(batch, hkv, skv, d), stride=bshd(hkv, skv)) for n in "KV")
        off_q, off_kv = (g.tensor(name=n, dim=(batch + 1, 1, 1, 1), stride=(1,) * 4, data_type=i32) for n in "qk")
        lq, lk = (g.tensor(name=n, dim=(batch, 1, 1, 1), stride=(1,) * 4, data_type=i32) for n in ("lq", "lk"))
        for t, off in ((q, off_q), (k, off_kv), (v, off_kv)):
            t.set_ragged_offset(off)
        kw = dict(use_padding_mask=True, seq_len_q=lq, seq_len_kv=lk, **scores)
        o, st = g.sdpa(q, k, v, attn_scale=0.1, generate_stats=True, **kw)
        o.set_stride(bshd(hq, sq)).set_ragged_offset(off_q)
    else:
        q = g.tensor(name="Q", dim=(batch * sq, hq, d))
        k, v = (g.tensor(name=n, dim=(batch * skv, hkv, d)) for n in "KV")
        cu_q, cu_kv = (g.tensor(name=n, dim=(batch + 1,), data_type=i32) for n in ("cu_q", "cu_kv"))
        kw = dict(cu_seq_len_q=cu_q, cu_seq_len_kv=cu_kv, max_seq_len_q=sq, max_seq_len_kv=skv, **scores)
        o, st = g.sdpa(q, k, v, attn_scale=0.1, generate_stats=True, **kw)
    o.set_output(True)
    st.set_output(True)
    return g.validate().facts


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(sq=16),
        dict(batch=1, skv=131072),
        dict(ragged=True),
        dict(ragged=True, batch=2, sq=4),
        dict(scores=True),
        dict(ragged=True, scores=True),
    ],
)
def test_a_packed_decode_is_split_on_both_forwards(kw):
    """A serving batch of packed decodes (1..16 query tokens per sequence over long caches) on a fake H200: both
    forwards split it by the shared choice over their work tiles (each packs a KV group's heads); the partials are
    per batch entry from the declared B and max_seq_len_q; the combine reads the packed form's lengths and offsets."""
    from frost.adapters.split_kv import cdiv

    facts = _thd_decode_facts(**kw)
    batch, sq, skv = kw.get("batch", 4), kw.get("sq", 1), kw.get("skv", 32768)
    assert facts.is_thd and (facts.ragged is not None) == kw.get("ragged", False)
    heads = 8  # one tile row block per KV group
    for a, slots in ((_sm90(facts), 132), (_sm80(facts), H200_SLOTS)):
        p = a.validated_params()
        assert p.is_thd and p.split and p.pack_gqa and p.tile_m == 64, a.engine_name
        rows = sq * 32 // heads
        assert p.num_splits == choose_num_splits(slots, batch * heads * cdiv(rows, 64), cdiv(skv, p.tile_n))
        row_values = 2 if kw.get("scores") else 1  # the LSE, and each split's row max for the score statistics
        rows_bytes = 4 * p.num_splits * batch * 32 * sq  # each buffer 256-byte aligned (frost.runtime.workspace)
        assert a.scratch_workspace_bytes() == align_up(rows_bytes * 128) + row_values * align_up(rows_bytes)
        (_, fwd), (template, combine) = a.kernel_specs()
        assert template == "frost.engines.common.split_combine" and combine.is_thd and combine.has_lse
        assert combine.has_score_max == combine.has_score_sum_exp == fwd.has_score_max == kw.get("scores", False)
        assert (
            ("max_partial" in fwd_arg_names(fwd))
            == ("max_partial" in combine_arg_names(combine))
            == combine.has_score_max
        )
        assert (combine.num_splits, combine.ragged, combine.has_seqused) == (p.num_splits,) + (p.ragged,) * 2
        names = combine_arg_names(combine)
        scored = ["score_max", "score_sum_exp"] * combine.has_score_max
        partials = ["o_partial", "lse_partial"] + ["max_partial"] * combine.has_score_max
        assert names[: 5 + 3 * len(scored) // 2] == ["o", "lse", *scored, *partials, "cu_seqlens_q"]
        assert "max_seqlen_q" in names
        assert ("total_q" in names) == ("seqused_q" in names) == p.ragged
        assert fwd_arg_names(p)[-len(partials) - 1 :] == [*partials, "stream"]


def test_packed_combine_params_and_what_they_decline():
    from frost.errors import TemplateParamsError
    from frost.engines.common.split_combine import kernel_name
    from frost.engines.common.split_combine_params import validate

    base = dict(head_dim_v=128, num_heads_q=32, num_splits=4, has_lse=True)
    for ok in (
        dict(is_thd=True),
        dict(is_thd=True, has_seqused=True, token_div_q=4096, token_div_lse=32, own_offsets=(("o", 4096, "int64"),)),
        dict(is_thd=True, has_seqused=True, token_div_q=4096, stats_per_batch=True),
    ):
        validate(SplitCombineParams(**base, **ok))
    for bad in (
        dict(stats_per_batch=True),  # a dense batch
        dict(has_seqused=True, token_div_q=4096),
        dict(is_thd=True, token_div_q=4096),  # the ragged form's lengths come from seqused
        dict(is_thd=True, has_seqused=True),  # frost's packed form's from the prefix sums
    ):
        with pytest.raises(TemplateParamsError):
            validate(SplitCombineParams(**base, **bad))
    ragged = SplitCombineParams(
        **base, is_thd=True, has_seqused=True, token_div_q=4096, own_offsets=(("o", 8, "int64"),)
    )
    assert kernel_name(ragged, "sm_90a").endswith("_lse_seqused_thd_rg4096_rgo8o64")
    assert combine_arg_names(ragged) == [
        "o", "lse", "o_partial", "lse_partial", "cu_seqlens_q", "seqused_q", "o_offsets", "max_seqlen_q", "total_q",
        "stream",
    ]  # fmt: skip


def _packed_split_model(case: Case, t: dict, num_splits: int, tile_m: int, tile_n: int):
    """The packed split + combine in float64, through the kernels' per-batch partials: each split writes its O_s
    and LSE_s at the sequence-local rows of (splits, B, H, max_seq_len_q) arrays poisoned with NaN, for the rows
    inside its sequence only; the combine reads a sequence's rows there and writes the packed O and LSE at its
    first token on; each split's row max goes to a third such array, which the combine reduces into score_max and
    score_sum_exp. Returns (O (T, H, Dv), LSE, score_max, score_sum_exp (T, H)), NaN where no sequence lies."""
    q, k, v = (t[r].double() for r in ("q", "k", "v"))
    cu_q, cu_k = prefix(case.lens_q), prefix(case.lens_kv)
    hq, dv, qpk = case.hq, case.head_dim_v, case.hq // case.hkv
    max_q = max(1, max(case.lens_q))
    causal_br = dict(case.mask).get("use_causal_mask_bottom_right", False)
    o_part = torch.full((num_splits, case.batch, hq, max_q, dv), math.nan, dtype=torch.float64)
    lse_part = torch.full((num_splits, case.batch, hq, max_q), math.nan, dtype=torch.float64)
    max_part = lse_part.clone()
    for b in range(case.batch):  # the forward: one CTA per (m-tile, split, head, batch entry)
        len_q, len_k = case.lens_q[b], case.lens_kv[b]
        offset = len_k - len_q if causal_br else 0
        qs, ks, vs = q[cu_q[b] : cu_q[b + 1]], k[cu_k[b] : cu_k[b + 1]], v[cu_k[b] : cu_k[b + 1]]
        for h, i, s in itertools.product(range(hq), range(len_q), range(num_splits)):
            n_min, n_max = _band_tiles(i // tile_m, tile_m, tile_n, len_q, len_k, offset, 0 if causal_br else None)
            lo, hi = key_split_range(n_min, n_max, s, num_splits)
            keys = [j for j in range(lo * tile_n, min(hi * tile_n, len_k)) if not causal_br or j <= i + offset]
            lse_part[s, b, h, i], max_part[s, b, h, i], o_part[s, b, h, i] = -math.inf, -math.inf, 0.0
            if keys:
                x = (ks[keys, h // qpk] @ qs[i, h]) * case.attn_scale
                lse_part[s, b, h, i], max_part[s, b, h, i] = torch.logsumexp(x, 0), x.max()
                o_part[s, b, h, i] = torch.exp(x - lse_part[s, b, h, i]) @ vs[keys, h // qpk]
    o = torch.full((case.total_q, hq, dv), math.nan, dtype=torch.float64)
    lse = torch.full((case.total_q, hq), math.nan, dtype=torch.float64)
    s_max, s_sum = lse.clone(), lse.clone()
    for b, h in itertools.product(range(case.batch), range(hq)):  # the combine: rows inside the sequence only
        sink = float(t["sink"].view(-1)[h]) if case.sink else None
        for i in range(min(case.lens_q[b], max_q)):
            row, lse_row = combine_row(lse_part[:, b, h, i].tolist(), o_part[:, b, h, i].tolist(), sink)
            o[cu_q[b] + i, h], lse[cu_q[b] + i, h] = torch.tensor(row, dtype=torch.float64), lse_row
            s_max[cu_q[b] + i, h], s_sum[cu_q[b] + i, h] = combine_score_stats(
                max_part[:, b, h, i].tolist(), lse_row, sink
            )
    return o, lse, s_max, s_sum


PACKED_SPLIT_CASES = {
    # ragged lengths, an empty query sequence, an empty key sequence with and without a sink, 1..4 queries
    "ragged-empty-sequences": (
        Case(batch=4, hq=4, hkv=2, d=8, thd=True, lens_q=(3, 0, 1, 4), lens_kv=(37, 9, 0, 21), sink=True),
        4,
    ),
    "gqa-causal-bottom-right": (
        Case(
            batch=3,
            hq=4,
            hkv=1,
            d=8,
            thd=True,
            lens_q=(2, 1, 4),
            lens_kv=(30, 1, 17),
            extra_q=3,
            mask=(("use_causal_mask_bottom_right", True),),
        ),
        5,
    ),
}


@pytest.mark.parametrize("tiles", list(MODEL_TILES))
@pytest.mark.parametrize("name", list(PACKED_SPLIT_CASES))
def test_packed_split_and_combine_reproduce_the_reference_engine(name, tiles):
    """Packed batches through the per-batch partials (the kernels' layout and cut) equal the reference engine's
    packed O and LSE in float64, and the float64 oracle's score_max / score_sum_exp; every partial the combine reads
    was written, and no token outside a sequence is."""
    case, splits = PACKED_SPLIT_CASES[name]
    t = make_inputs(case)
    o_ref, lse_ref = run_fwd(case, t)
    o, lse, s_max, s_sum = _packed_split_model(case, t, splits, *MODEL_TILES[tiles])
    band = dict(causal_bottom_right=True) if case.mask else {}
    _, _, max_ref, sum_ref = oracle.attention(
        t["q"], t["k"], t["v"], scale=case.attn_scale, sink=t.get("sink"), row_stats=True, **band,
        cu_seq_len_q=prefix(case.lens_q), cu_seq_len_kv=prefix(case.lens_kv),
    )  # fmt: skip
    inside = torch.zeros(case.total_q, dtype=torch.bool)
    inside[: sum(case.lens_q)] = True
    torch.testing.assert_close(o[inside], o_ref.double()[inside], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse[inside], lse_ref.double()[inside, :, 0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(s_max[inside], max_ref[inside], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(s_sum[inside], sum_ref[inside], rtol=1e-9, atol=1e-9)
    assert o[~inside].isnan().all() and lse[~inside].isnan().all() and s_max[~inside].isnan().all()


# ---------------------------------------------------------------- compile (sm_80)

FWD = "frost.engines.sm80.sdpa_fwd"
FWD_PARAMS = "frost.engines.sm80.sdpa_fwd_params.Sm80FwdParams"
COMBINE = "frost.engines.common.split_combine"
COMBINE_PARAMS = "frost.engines.common.split_combine_params.SplitCombineParams"
_FWD = dict(head_dim=128, head_dim_v=128, num_heads_q=32, num_heads_kv=8, has_lse=True, tile_m=64)  # DECODE_TILE
_PAGED = dict(has_seqused=True, paged_block_k=128, paged_block_v=128, has_sinks=True)


@pytest.mark.slow
def test_split_and_combine_kernels_compile_for_sm80_and_sm90a_without_spills(tmp_path):
    """The split and packed forwards (dense, paged with sinks) beside the plain kernel, and the combine, for sm_80
    and sm_90a: frost symbols, mma.sync in the forwards, no more local memory or ptxas spills than the plain kernel,
    every device length clamped (compile_groups checks)."""
    specs = [
        (FWD, FWD_PARAMS, dict(_FWD, num_splits=7), "split"),
        (FWD, FWD_PARAMS, _FWD, "base"),
        (FWD, FWD_PARAMS, dict(_FWD, **_PAGED, num_splits=5), "paged-split"),
        (FWD, FWD_PARAMS, dict(_FWD, **_PAGED), "paged-base"),
        (FWD, FWD_PARAMS, dict(_FWD, **_PAGED, num_splits=29, pack_gqa=True), "paged-split-packed"),
        (
            FWD,
            FWD_PARAMS,
            dict(_FWD, **_PAGED, pack_gqa=True, has_window_right=True, bottom_right=True),
            "paged-packed-causal",
        ),
        (
            FWD,
            FWD_PARAMS,
            dict(_FWD, **_PAGED, num_splits=9, pack_gqa=True, has_window_left=True, has_window_right=True),
            "paged-split-packed-window",
        ),
        (
            COMBINE,
            COMBINE_PARAMS,
            dict(head_dim_v=128, num_heads_q=32, num_splits=7, has_lse=True, has_seqused=True, has_sinks=True),
            "combine",
        ),
    ]
    # sm_90a too: the H200 runs the mma.sync family from an sm_90a build
    both = compile_groups([("sm_80", specs), ("sm_90a", specs)], tmp_path, ptxas=True)
    for arch_outs in both:
        assert all(o["target"] == [arch_outs[0]["target"][0]] for o in arch_outs)
    outs = {o["tag"]: o for o in both[0]}
    outs90 = {o["tag"]: o for o in both[1]}
    assert outs90["combine"]["local"] == 0 and all(o["mma_sync"] > 0 for t, o in outs90.items() if t != "combine")
    for arch_outs in (outs, outs90):
        for split, base in (
            ("split", "base"),
            ("paged-split", "paged-base"),
            ("paged-split-packed", "paged-base"),
            ("paged-packed-causal", "paged-base"),
            ("paged-split-packed-window", "paged-base"),
        ):
            out = arch_outs[split]
            assert ("_sp" in out["name"] or "_pk" in out["name"]) and out["entries"] == [out["name"]]
            assert out["mma_sync"] > 0
            assert out["local"] <= arch_outs[base]["local"], (out["local"], arch_outs[base]["local"])
            if out["ptxas"] is not None:
                assert out["spill_bytes"] <= arch_outs[base]["spill_bytes"], (out["ptxas"], arch_outs[base]["ptxas"])
    c = outs["combine"]
    assert c["name"] == "frost_split_combine_bf16_d128_h32_sp7_lse_seqused_sink" and c["entries"] == [c["name"]]
    assert c["local"] == 0 and c["length_loads"] >= 1
    if c["ptxas"] is not None:
        assert c["spill_bytes"] == 0, c["ptxas"]
    assert SplitCombineParams(num_splits=2).is_thd is False


# ---------------------------------------------------------------- the wgmma forward's split (sm_90a)

SM90 = "frost.engines.sm90.sdpa_fwd"
SM90_PARAMS = "frost.engines.sm90.sdpa_fwd_params.Sm90FwdParams"
#: the packed decode the H200 plans (64-row tiles of the 4 heads of a group), dense and paged with sinks
_SM90 = dict(head_dim=128, head_dim_v=128, num_heads_q=32, num_heads_kv=8, has_lse=True, tile_m=64, pack_gqa=True)
#: a paged cache of 16-row blocks: each 128-key tile spans 8 blocks, a TMA load each
_PAGED16 = dict(_PAGED, paged_block_k=16, paged_block_v=16)
_SM90_CAUSAL = dict(
    head_dim=128, head_dim_v=128, num_heads_q=32, num_heads_kv=8, has_lse=True, has_window_right=True, bottom_right=True
)
#: O in Q's shared tile on one warpgroup (d=256), and three warpgroups of 64 rows (d=64, no Stats)
_SM90_D256 = dict(
    head_dim=256,
    head_dim_v=256,
    num_heads_q=16,
    num_heads_kv=2,
    has_lse=True,
    tile_m=64,
    tile_n=80,
    pack_gqa=True,
    separate_o_smem=False,
    pingpong=False,
    has_seqused=True,
    has_sinks=True,
)
_SM90_D64 = dict(head_dim=64, head_dim_v=64, num_heads_q=8, num_heads_kv=8, has_lse=False, tile_m=192, tile_n=128)


@pytest.mark.slow
def test_wgmma_split_forwards_compile_for_sm90a_without_more_spills(tmp_path):
    """The wgmma forward's split kernels (packed dense, packed paged with sinks, 16-row paged blocks, unpacked
    causal on the longest-first order, O in Q's tile at d=256, three warpgroups at d=64) beside their unsplit
    kernels for sm_90a: frost symbols tagged with the split count, wgmma in each, no more local memory or ptxas
    spills than the unsplit kernel, every device length clamped (compile_groups)."""
    specs = [
        (SM90, SM90_PARAMS, dict(_SM90, num_splits=14), "split"),
        (SM90, SM90_PARAMS, _SM90, "base"),
        (SM90, SM90_PARAMS, dict(_SM90, **_PAGED, num_splits=8), "paged-split"),
        (SM90, SM90_PARAMS, dict(_SM90, **_PAGED), "paged-base"),
        (SM90, SM90_PARAMS, dict(_SM90, **_PAGED16, num_splits=8), "paged16-split"),
        (SM90, SM90_PARAMS, dict(_SM90, **_PAGED16), "paged16-base"),
        (SM90, SM90_PARAMS, dict(_SM90_CAUSAL, num_splits=3), "causal-split"),
        (SM90, SM90_PARAMS, _SM90_CAUSAL, "causal-base"),
        (SM90, SM90_PARAMS, dict(_SM90_D256, num_splits=5), "d256-split"),
        (SM90, SM90_PARAMS, _SM90_D256, "d256"),
        (SM90, SM90_PARAMS, dict(_SM90_D64, num_splits=3), "d64-split"),
        (SM90, SM90_PARAMS, _SM90_D64, "d64"),
    ]
    outs = {o["tag"]: o for o in compile_groups([("sm_90a", specs)], tmp_path, ptxas=True)[0]}
    for split, base in (
        ("split", "base"),
        ("paged-split", "paged-base"),
        ("paged16-split", "paged16-base"),
        ("causal-split", "causal-base"),
        ("d256-split", "d256"),
        ("d64-split", "d64"),
    ):
        out, ref = outs[split], outs[base]
        splits = next(kw["num_splits"] for _, _, kw, tag in specs if tag == split)
        assert out["name"].endswith(f"sp{splits}"), out["name"]
        assert out["entries"] == [out["name"]] and out["wgmma"] > 0 and not out["unclamped"]
        assert "_sp" not in ref["name"]
        assert out["local"] <= ref["local"], (split, out["local"], ref["local"])
        if out["ptxas"] is not None:
            assert out["spill_bytes"] <= ref["spill_bytes"], (split, out["ptxas"], ref["ptxas"])


#: packed decodes (frost's packed form; cuDNN's ragged offsets with per-batch Stats): the mma.sync forward's 64-row
#: tile per head, the wgmma forward's packed 64-row tiles with sinks
_THD = dict(_FWD, is_thd=True)
_RAGGED = dict(_THD, has_seqused=True, token_div_q=4096, token_div_kv=1024, stats_per_batch=True)
_SM90_THD = dict(_SM90, is_thd=True, has_sinks=True)
_COMBINE_THD = dict(head_dim_v=128, num_heads_q=32, num_splits=7, has_lse=True, is_thd=True)
_COMBINE_RAGGED = dict(
    _COMBINE_THD, has_seqused=True, token_div_q=4096, token_div_lse=32, own_offsets=(("o", 4096, "int64"),)
)
#: cuDNN's score_max / score_sum_exp beside Stats (in the ragged form each with its own offsets)
_SCORES = dict(has_score_max=True, has_score_sum_exp=True)
_OWN_SCORES = (("o", 4096, "int64"), ("score_max", 32, "int32"), ("score_sum_exp", 32, "int64"))


@pytest.mark.slow
def test_packed_split_kernels_compile_without_more_spills(tmp_path):
    """The packed split forwards (mma.sync for sm_80 and sm_90a, wgmma for sm_90a; with and without score_max /
    score_sum_exp) beside their unsplit packed kernels and the dense split ones, and the combines (frost's packed
    form with sinks, cuDNN's ragged offsets with O's own 64-bit offsets and ragged Stats, per-batch Stats, the
    score statistics packed and dense): frost symbols tagged thd and with the split count, no more local memory or
    ptxas spills than the unsplit kernel or the dense split one, every device length clamped (compile_groups
    checks), none spilled in the combines."""
    mma = [
        (FWD, FWD_PARAMS, dict(_THD, num_splits=7), "thd-split"),
        (FWD, FWD_PARAMS, _THD, "thd-base"),
        (FWD, FWD_PARAMS, dict(_FWD, num_splits=7), "dense-split"),
        (FWD, FWD_PARAMS, dict(_THD, **_SCORES, num_splits=7), "thd-split-scores"),
        (FWD, FWD_PARAMS, dict(_THD, **_SCORES), "thd-base-scores"),
        (FWD, FWD_PARAMS, dict(_THD, pack_gqa=True, num_splits=7), "thd-split-packed"),
        (FWD, FWD_PARAMS, dict(_THD, pack_gqa=True, has_sinks=True), "thd-packed"),
    ]
    ragged_mma = [
        (FWD, FWD_PARAMS, dict(_RAGGED, num_splits=5, has_sinks=True), "ragged-split"),
        (FWD, FWD_PARAMS, dict(_RAGGED, has_sinks=True), "ragged-base"),
        (FWD, FWD_PARAMS, dict(_RAGGED, num_splits=5, has_sinks=True, pack_gqa=True), "ragged-split-packed"),
        (
            FWD,
            FWD_PARAMS,
            dict(_RAGGED, **_SCORES, stats_per_batch=False, own_offsets=_OWN_SCORES, has_sinks=True, pack_gqa=True),
            "ragged-packed-scores",
        ),
    ]
    combines = [
        (COMBINE, COMBINE_PARAMS, dict(_COMBINE_THD, has_sinks=True), "combine-thd"),
        (COMBINE, COMBINE_PARAMS, _COMBINE_RAGGED, "combine-ragged"),
        (COMBINE, COMBINE_PARAMS, dict(_COMBINE_RAGGED, token_div_lse=0, stats_per_batch=True), "combine-pb"),
        (COMBINE, COMBINE_PARAMS, dict(_COMBINE_RAGGED, **_SCORES, own_offsets=_OWN_SCORES), "combine-scores"),
        (
            COMBINE,
            COMBINE_PARAMS,
            dict(_COMBINE_THD, **_SCORES, is_thd=False, has_seqused=True),
            "combine-dense-scores",
        ),
    ]
    wgmma = [
        (SM90, SM90_PARAMS, dict(_SM90_THD, num_splits=7), "thd-split"),
        (SM90, SM90_PARAMS, _SM90_THD, "thd-base"),
        (SM90, SM90_PARAMS, dict(_SM90, has_sinks=True, num_splits=7), "dense-split"),
        (SM90, SM90_PARAMS, dict(_SM90_THD, **_SCORES, num_splits=7), "thd-split-scores"),
        (SM90, SM90_PARAMS, dict(_SM90_THD, **_SCORES), "thd-base-scores"),
    ]
    groups = [("sm_80", mma + ragged_mma + combines), ("sm_90a", mma + combines[:1]), ("sm_90a", wgmma)]
    results = compile_groups(groups, tmp_path, ptxas=True)
    outs80, outs90, outs_wg = ({o["tag"]: o for o in outs} for outs in results)
    pairs = (("thd-split", "thd-base"), ("thd-split", "dense-split"), ("thd-split-scores", "thd-base-scores"))
    packed = (("thd-split-packed", "thd-base"),)  # the mma.sync forward's packed heads
    for outs, bases, count in (
        (
            outs80,
            pairs + (("ragged-split", "ragged-base"), ("ragged-split-packed", "ragged-base")) + packed,
            "mma_sync",
        ),
        (outs90, pairs + packed, "mma_sync"),
        (outs_wg, pairs, "wgmma"),
    ):
        for split, base in bases:
            out, ref = outs[split], outs[base]
            assert "_thd" in out["name"] and re.search(r"sp\d+", out["name"]), out["name"]
            assert not base.endswith("base") or not re.search(r"sp\d+", ref["name"]), ref["name"]
            assert out["entries"] == [out["name"]] and out[count] > 0 and out["length_loads"] >= 1
            assert out["local"] <= ref["local"], (split, base, out["local"], ref["local"])
            if out["ptxas"] is not None:
                assert out["spill_bytes"] <= ref["spill_bytes"], (split, base, out["ptxas"], ref["ptxas"])
    # the unsplit packed-heads kernels beside the tile per head (the ragged one with its own offsets for O and the
    # score statistics, which the packed view writes too)
    for outs, tag in ((outs80, "thd-packed"), (outs90, "thd-packed"), (outs80, "ragged-packed-scores")):
        out, ref = outs[tag], outs["thd-base"]
        assert "_thd" in out["name"] and "_pk" in out["name"] and out["mma_sync"] > 0 and out["length_loads"] >= 1
        if out["ptxas"] is not None:
            assert out["spill_bytes"] <= ref["spill_bytes"], (out["ptxas"], ref["ptxas"])
    for outs in (outs80, outs90):
        for tag in (t for t in outs if t.startswith("combine")):
            c = outs[tag]
            assert c["name"].startswith("frost_split_combine_bf16_d128_h32_sp7_lse")
            assert ("_thd" in c["name"]) == ("dense" not in tag) and ("smax_ssum" in c["name"]) == ("scores" in tag)
            assert c["entries"] == [c["name"]] and c["local"] == 0 and c["length_loads"] >= 1
            if c["ptxas"] is not None:
                assert c["spill_bytes"] == 0, c["ptxas"]
