"""cuDNN's block_mask without a GPU: its declaration, the reference engine against the float64 oracle (the bits
expanded independently into cuDNN's additive where(mask, 0, -inf) over 128x128 tiles), the routing that puts it
on the DSL forwards (the wgmma forward on cc 9.0, unpacked), the records the planner builds for it, and the kernel's
compile."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import frost
from frost.adapters.cudnn_lowering import CudnnUnsupported, lower_cudnn_sdpa
from frost.adapters.dsl import fwd_feature_flags
from frost.adapters.sm90 import SdpaFwdDslSm90
from frost.engines.sdpa_args import fwd_arg_names
from frost.engines.sm80.sdpa_fwd_params import Sm80FwdParams
from frost.errors import GraphError, TemplateParamsError
from frost.target import fake_target
from frost.engines.sm90.sdpa_fwd_params import Sm90FwdParams, pack_gqa_reason
from frost.engines.sm90.sdpa_fwd_params import validate as validate90
from frost.testing.cases import (
    SM80_FWD_BLOCK_MASK_COVER,
    SM80_FWD_TEMPLATE,
    SM90_FWD_BLOCK_MASK_COVER,
    SM90_FWD_BLOCK_SKIP_COVER,
    SM90_FWD_TEMPLATE,
)
from test import oracle
from test.compile_runner import BIAS_TILE_SPILL_BYTES, compile_groups
from test.helpers import assert_close, empty_like_decl, prefix

A100, H200, RTX5090 = (fake_target(n) for n in ("A100", "H200", "RTX5090"))


def block_dims(b, h, sq, skv) -> tuple:
    return b, h, -(-sq // 128), -(-(-(-skv // 128)) // 8)


def random_block_mask(b, h, sq, skv, seed=0, empty_tiles=()) -> torch.Tensor:
    """Random uint8 bits of cuDNN's dims; `empty_tiles`: (b, h, query tile) rows cleared (no key visible)."""
    gen = torch.Generator().manual_seed(seed)
    bm = torch.randint(0, 256, block_dims(b, h, sq, skv), generator=gen, dtype=torch.uint8)
    for bi, hi, qi in empty_tiles:
        bm[bi, hi, qi] = 0
    return bm


def additive(bm: torch.Tensor, sq: int, skv: int) -> torch.Tensor:
    """cuDNN's reference rule (fp16_ref.py): the bits unpacked LSB first into key tiles, each bit spread over its
    128x128 tile, cropped to (S_q, S_kv), as an additive where(mask, 0, -inf) on the scores."""
    bits = np.unpackbits(bm.numpy(), axis=-1, bitorder="little")
    full = np.repeat(np.repeat(bits, 128, axis=2), 128, axis=3)[:, :, :sq, :skv]
    return torch.where(torch.from_numpy(full.astype(bool)), 0.0, float("-inf")).double()


# --- declarations ----------------------------------------------------------------------------------------------


def _graph(sq=300, skv=1100, b=2, h=4, thd=False, max_q=None, max_kv=None):
    g = frost.Graph(io_data_type="fp16")
    if thd:
        q = g.tensor(name="q", dim=(b * sq, h, 64))
        k, v = (g.tensor(name=n, dim=(b * skv, h, 64)) for n in ("k", "v"))
        kw = dict(
            cu_seq_len_q=g.tensor(name="cu_q", dim=(b + 1,), data_type="int32"),
            cu_seq_len_kv=g.tensor(name="cu_kv", dim=(b + 1,), data_type="int32"),
            max_seq_len_q=max_q or sq,
            max_seq_len_kv=max_kv or skv,
        )
    else:
        q = g.tensor(name="q", dim=(b, h, sq, 64))
        k, v = (g.tensor(name=n, dim=(b, h, skv, 64)) for n in ("k", "v"))
        kw = {}
    return g, q, k, v, kw


def _declare(dim, dtype="uint8", **geo):
    g, q, k, v, kw = _graph(**geo)
    bm = g.tensor(name="bm", dim=dim, data_type=dtype)
    o, _ = g.sdpa(q, k, v, block_mask=bm, **kw)
    o.set_output(True)
    return g.validate()


def test_good_dims_declare_a_block_mask_feature():
    g = _declare((2, 4, 3, 2))  # S_q 300 -> 3 query tiles; S_kv 1100 -> 9 key tiles -> 2 bytes
    assert g.facts.has_block_mask and "block_mask" in g.facts.features()
    assert "block_mask" not in g.facts.other_features
    assert g.facts.tensor("block_mask").dim == (2, 4, 3, 2)
    # packed: the envelopes max_seq_len_q / kv
    g = _declare((3, 4, 2, 1), thd=True, b=3, sq=100, skv=100, max_q=129, max_kv=100)
    assert g.facts.has_block_mask


def test_any_declared_strides_are_accepted():
    g, q, k, v, kw = _graph()
    bm = g.tensor(name="bm", dim=(2, 4, 3, 2), stride=(1, 2, 8, 24), data_type="uint8")
    o, _ = g.sdpa(q, k, v, block_mask=bm)
    o.set_output(True)
    assert g.validate().facts.tensor("block_mask").stride == (1, 2, 8, 24)


@pytest.mark.parametrize("dim", [(2, 4, 3, 1), (2, 4, 2, 2), (1, 4, 3, 2), (2, 1, 3, 2), (2, 4, 300, 1100)])
def test_wrong_dims_raise_naming_the_tensor_and_both_dims(dim):
    with pytest.raises(GraphError) as ei:
        _declare(dim)
    msg = str(ei.value)
    assert "'bm' (block_mask)" in msg and "(2, 4, 3, 2)" in msg and f"got {dim}" in msg


def test_wrong_dims_of_a_packed_graph_name_its_envelopes():
    with pytest.raises(GraphError, match=r"'bm' \(block_mask\): expected dim \(3, 4, 2, 1\).*S_q=129"):
        _declare((3, 4, 1, 1), thd=True, b=3, sq=100, skv=100, max_q=129, max_kv=100)


@pytest.mark.parametrize("dtype", ["int8", "bool", "int32", "fp16"])
def test_wrong_dtype_raises(dtype):
    with pytest.raises(GraphError, match=rf"'bm' \(block_mask\): data_type must be uint8, got {dtype}"):
        _declare((2, 4, 3, 2), dtype=dtype)


def test_the_backward_has_no_block_mask():
    g = frost.Graph(io_data_type="fp16")
    q, k, v, o, do = (g.tensor(name=n, dim=(2, 4, 128, 64)) for n in ("q", "k", "v", "o", "dO"))
    stats = g.tensor(name="stats", dim=(2, 4, 128, 1), data_type="fp32")
    bm = g.tensor(name="bm", dim=(2, 4, 1, 1), data_type="uint8")
    with pytest.raises(GraphError, match="sdpa_backward.*block_mask.*no block mask"):
        g.sdpa_backward(q, k, v, o, do, stats, block_mask=bm)
    for t in g.sdpa_backward(q, k, v, o, do, stats, block_mask=None):  # the off value is no keyword at all
        t.set_output(True)
    assert not g.validate().facts.has_block_mask


# --- the reference engine against the oracle --------------------------------------------------------------------


def _run_reference(q, k, v, bm, *, scale, sink=None, seq=None, thd=None, stats_outputs=False, **mask):
    """Plan the reference (CPU) and execute; returns (o, stats[, score_max, score_sum_exp])."""
    g = frost.Graph(io_data_type=q.dtype)
    Q, K, V = (g.tensor_like(t, name=n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    M = g.tensor_like(bm, name="bm")
    pack = {Q: q, K: k, V: v, M: bm}
    kw = dict(mask)
    if sink is not None:
        kw["sink_token"] = S = g.tensor_like(sink, name="sink")
        pack[S] = sink
    if seq is not None:
        lq, lkv = (torch.tensor(x, dtype=torch.int32) for x in seq)
        kw.update(
            use_padding_mask=True, seq_len_q=g.tensor_like(lq, name="lq"), seq_len_kv=g.tensor_like(lkv, name="lkv")
        )
        pack.update({kw["seq_len_q"]: lq, kw["seq_len_kv"]: lkv})
    if thd is not None:
        cu_q, cu_kv, max_q, max_kv = thd
        kw.update(
            cu_seq_len_q=g.tensor_like(cu_q, name="cu_q"),
            cu_seq_len_kv=g.tensor_like(cu_kv, name="cu_kv"),
            max_seq_len_q=max_q,
            max_seq_len_kv=max_kv,
        )
        pack.update({kw["cu_seq_len_q"]: cu_q, kw["cu_seq_len_kv"]: cu_kv})
    rows = {}
    if stats_outputs:
        for name in ("score_max", "score_sum_exp"):
            shape = (q.shape[0], q.shape[1], 1) if thd is not None else (q.shape[0], q.shape[1], q.shape[2], 1)
            rows[name] = torch.empty(shape)
            kw[name] = g.tensor_like(rows[name], name=name)
            pack[kw[name]] = rows[name]
    o, st = g.sdpa(Q, K, V, attn_scale=scale, generate_stats=True, block_mask=M, **kw)
    o.set_output(True)
    st.set_output(True)
    g.build_plans()
    assert g.engine_name == "SdpaFwdReference"
    pack[o], pack[st] = empty_like_decl(o), empty_like_decl(st)
    g.execute(pack, None)
    return (pack[o], pack[st]) + tuple(rows.values())


def test_dense_with_fully_masked_rows_matches_cudnns_rule():
    b, h, sq, skv, d = 2, 3, 300, 1100, 16
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(b, h, s, d, generator=gen, dtype=torch.float32) for s in (sq, skv, skv))
    bm = random_block_mask(b, h, sq, skv, empty_tiles=((0, 1, 1), (1, 2, 2)))
    o, st, smax, ssum = _run_reference(q, k, v, bm, scale=0.25, stats_outputs=True)
    want = oracle.attention(q, k, v, scale=0.25, bias=additive(bm, sq, skv), row_stats=True)
    assert_close(o, want[0], rtol=1e-6, atol=1e-6, what="O")
    assert_close(st, want[1], rtol=1e-6, atol=1e-6, what="Stats")
    assert_close(smax, want[2], rtol=1e-6, atol=1e-6, what="score_max")
    assert_close(ssum, want[3], rtol=1e-6, atol=1e-6, what="score_sum_exp")
    # rows with no visible key: O = 0, Stats = score_max = -inf, score_sum_exp = 0 (frost's empty rows)
    assert torch.all(o[0, 1, 128:256] == 0) and torch.all(st[0, 1, 128:256] == float("-inf"))
    assert torch.all(smax[1, 2, 256:300] == float("-inf")) and torch.all(ssum[1, 2, 256:300] == 0)


@pytest.mark.parametrize(
    "mask",
    [
        dict(use_causal_mask=True),
        dict(use_causal_mask_bottom_right=True),
        dict(diagonal_band_right_bound=0, diagonal_band_left_bound=200),
    ],
)
def test_masks_compose_with_the_band(mask):
    b, h, sq, skv, d = 2, 2, 260, 400, 8
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(b, h, s, d, generator=gen, dtype=torch.float32) for s in (sq, skv, skv))
    bm = random_block_mask(b, h, sq, skv, seed=3, empty_tiles=((1, 0, 0),))
    o, st = _run_reference(q, k, v, bm, scale=0.3, **mask)
    names = {
        "use_causal_mask": "causal",
        "use_causal_mask_bottom_right": "causal_bottom_right",
        "diagonal_band_right_bound": "right_bound",
        "diagonal_band_left_bound": "left_bound",
    }
    want = oracle.attention(q, k, v, scale=0.3, bias=additive(bm, sq, skv), **{names[n]: x for n, x in mask.items()})
    assert_close(o, want[0], rtol=1e-6, atol=1e-6, what="O")
    assert_close(st, want[1], rtol=1e-6, atol=1e-6, what="Stats")


def test_padded_batches_index_tiles_per_batch_entry_and_a_sink_fills_empty_rows():
    b, h, sq, skv, d = 2, 2, 270, 300, 8
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(b, h, s, d, generator=gen, dtype=torch.float32) for s in (sq, skv, skv))
    sink = torch.randn(h, generator=gen, dtype=torch.float32)
    bm = random_block_mask(b, h, sq, skv, seed=5, empty_tiles=((0, 0, 1), (1, 1, 0)))
    lens = ([200, 270], [300, 140])
    o, st = _run_reference(q, k, v, bm, scale=0.3, sink=sink, seq=lens, use_causal_mask=True)
    want = oracle.attention(
        q, k, v, scale=0.3, sink=sink, bias=additive(bm, sq, skv), seq_len_q=lens[0], seq_len_kv=lens[1], causal=True
    )
    assert_close(o, want[0], rtol=1e-6, atol=1e-6, what="O")
    assert_close(st, want[1], rtol=1e-6, atol=1e-6, what="Stats")
    assert torch.allclose(st[0, 0, 128:200].double(), sink[0].double().expand(72))  # no key: the sink alone


def test_packed_sequences_count_tiles_from_their_first_token():
    h, d = 2, 8
    lens_q, lens_kv = [130, 0, 260], [300, 5, 129]
    max_q, max_kv = 260, 300
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(sum(lens_q) + 3, h, d, generator=gen, dtype=torch.float32)
    k, v = (torch.randn(sum(lens_kv), h, d, generator=gen, dtype=torch.float32) for _ in range(2))
    bm = random_block_mask(3, h, max_q, max_kv, seed=7, empty_tiles=((2, 1, 2),))
    cu_q, cu_kv = (torch.tensor(prefix(x), dtype=torch.int32) for x in (lens_q, lens_kv))
    o, st = _run_reference(q, k, v, bm, scale=0.3, thd=(cu_q, cu_kv, max_q, max_kv), use_causal_mask=True)
    want = oracle.attention(
        q,
        k,
        v,
        scale=0.3,
        bias=additive(bm, max_q, max_kv),
        cu_seq_len_q=prefix(lens_q),
        cu_seq_len_kv=prefix(lens_kv),
        causal=True,
    )
    rows = sum(lens_q)
    assert_close(o[:rows], want[0][:rows], rtol=1e-6, atol=1e-6, what="O")
    assert_close(st[:rows], want[1][:rows], rtol=1e-6, atol=1e-6, what="Stats")


def test_cudnns_ragged_form_takes_it_on_the_reference():
    b, h, s, d = 2, 2, 260, 8
    lens_q, lens_kv = [200, 260], [260, 131]
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(b, s, h, d, generator=gen, dtype=torch.float32).transpose(1, 2) for _ in range(3))
    bm = random_block_mask(b, h, s, s, seed=9, empty_tiles=((0, 1, 0),))
    g = frost.Graph(io_data_type=torch.float32)
    offsets = torch.tensor([0, s * h * d, 2 * s * h * d], dtype=torch.int32).view(-1, 1, 1, 1)
    OFF = g.tensor_like(offsets, name="off")
    Q, K, V = (g.tensor_like(t, name=n).set_ragged_offset(OFF) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    lq, lkv = (torch.tensor(x, dtype=torch.int32).view(-1, 1, 1, 1) for x in (lens_q, lens_kv))
    LQ, LK, M = g.tensor_like(lq, name="lq"), g.tensor_like(lkv, name="lkv"), g.tensor_like(bm, name="bm")
    o, _ = g.sdpa(
        Q, K, V, attn_scale=0.3, use_padding_mask=True, seq_len_q=LQ, seq_len_kv=LK, block_mask=M, use_causal_mask=True
    )
    o.set_output(True).set_stride(q.stride()).set_ragged_offset(OFF)
    g.build_plans()
    out = torch.full_like(q, float("nan"))
    g.execute({Q: q, K: k, V: v, OFF: offsets, LQ: lq, LK: lkv, M: bm, o: out}, None)
    want = oracle.attention(
        q, k, v, scale=0.3, bias=additive(bm, s, s), seq_len_q=lens_q, seq_len_kv=lens_kv, causal=True
    )[0]
    for i in range(b):
        assert_close(out[i, :, : lens_q[i]], want[i, :, : lens_q[i]], rtol=1e-6, atol=1e-6, what=f"O batch {i}")


# --- routing and the records the planner builds ----------------------------------------------------------------


def _bm_graph(target, thd=False, **kw):
    from test.cpu.test_routing import declare

    g = frost.Graph(io_data_type="bf16", target=target)
    bm = g.tensor(name="bm", dim=(2, kw.get("hq", 4), 2, 1), data_type="uint8")
    return declare(target, graph=g, thd=thd, s=256, block_mask=bm, **kw)


@pytest.mark.parametrize("tname, line", [("A100", "Sm80"), ("H200", "Sm90"), ("RTX5090", "Sm120")])
@pytest.mark.parametrize("thd", [False, True])
def test_block_mask_graphs_plan_on_a_dsl_forward(unpended, no_compile, tname, line, thd):
    g = _bm_graph(fake_target(tname), thd=thd, use_causal_mask=True)
    assert g.available_engines()[0] == f"SdpaFwdDsl{line}"


@pytest.mark.parametrize("knobs", [{}, {"pack_gqa": True}])
def test_the_wgmma_forward_serves_it_unpacked(unpended, no_compile, knobs):
    """A packed GQA tile would span several heads' bits: the planner leaves block-masked graphs unpacked, and a
    requested pack_gqa is refused naming why."""
    g = _bm_graph(H200, hq=8, hkv=2)
    assert "SdpaFwdDslSm90" in g.available_engines()
    flags = fwd_feature_flags(g.facts)
    assert "block_mask" in pack_gqa_reason(Sm90FwdParams(**flags, pack_gqa=True))
    planned = SdpaFwdDslSm90.plan_knobs(g.facts, H200, knobs)
    if knobs:
        with pytest.raises(TemplateParamsError, match="block_mask"):
            validate90(Sm90FwdParams(**flags, **planned))
    else:
        assert not planned["pack_gqa"] and planned["tile_m"] == 128


def test_the_planned_params_and_arguments_carry_the_flag():
    g = _bm_graph(H200, use_causal_mask=True)
    flags = fwd_feature_flags(g.facts)
    assert flags["has_block_mask"]
    p = Sm80FwdParams(**flags)
    names = fwd_arg_names(p)
    assert names.index("block_mask") == names.index("softmax_scale") - 1
    assert "block_mask" not in fwd_feature_flags(_bm_graph(H200).facts.model_copy(update={"has_block_mask": False}))
    from frost.engines.sm80.sdpa_fwd import kernel_name

    assert "_bmask_" in kernel_name(p, "sm_90a")
    assert "bmask" not in kernel_name(Sm80FwdParams(**{**flags, "has_block_mask": False}), "sm_90a")
    from frost.engines.sm90.sdpa_fwd import kernel_name as name90

    assert "_bmask_" in name90(Sm90FwdParams(**flags), "sm_90a")
    assert "bmask" not in name90(Sm90FwdParams(**{**flags, "has_block_mask": False}), "sm_90a")


def test_the_cudnn_engine_takes_it_dense_and_declines_it_packed():
    call = lower_cudnn_sdpa(_bm_graph(H200).facts)
    assert ("block_mask", "block_mask") in call.tensor_kwargs
    spec = next(t for t in call.inputs if t.role == "block_mask")
    assert spec.dim == (2, 4, 2, 1) and spec.dtype == "uint8"
    with pytest.raises(CudnnUnsupported, match="block_mask"):
        lower_cudnn_sdpa(_bm_graph(H200, thd=True).facts)


# --- the kernel compiles ---------------------------------------------------------------------------------------

PARAMS = "frost.engines.sm80.sdpa_fwd_params.Sm80FwdParams"
PARAMS90 = "frost.engines.sm90.sdpa_fwd_params.Sm90FwdParams"


@pytest.mark.slow
def test_the_block_mask_forward_compiles_without_local_memory(tmp_path):
    from frost.engines.sm80.sdpa_fwd import kernel_name

    cover = SM80_FWD_BLOCK_MASK_COVER
    groups = [(arch, [(SM80_FWD_TEMPLATE, PARAMS, kw, None) for kw in kws]) for arch, kws in cover.items()]
    for arch, outs in zip(cover, compile_groups(groups, tmp_path)):
        for kw, out in zip(cover[arch], outs):
            name = kernel_name(Sm80FwdParams(**kw), arch)
            assert "_bmask_" in name and out["name"] == name and out["entries"] == [name]
            assert out["mma_sync"] > 0 and out["wgmma"] == 0 and out["local"] == 0, out


@pytest.mark.slow
def test_the_wgmma_block_mask_forward_compiles_without_spills(tmp_path):
    """The wgmma forward with block skipping (its covering set and the configurations where registers are tight:
    the producer warp walks the bits on 24 registers): wgmma and TMA, and ptxas spills nothing (with a bias, at
    most a per-tile value: `BIAS_TILE_SPILL_BYTES`)."""
    from frost.engines.sm90.sdpa_fwd import kernel_name

    cover = SM90_FWD_BLOCK_MASK_COVER + SM90_FWD_BLOCK_SKIP_COVER
    groups = [("sm_90a", [(SM90_FWD_TEMPLATE, PARAMS90, kw, None) for kw in cover[i::2]]) for i in range(2)]
    results = [r for part in compile_groups(groups, tmp_path, ptxas=True) for r in part]
    for kw, out in zip(cover[0::2] + cover[1::2], results):
        name = kernel_name(Sm90FwdParams(**kw), "sm_90a")
        assert "_bmask_" in name and out["name"] == name and out["entries"] == [name]
        assert out["wgmma_mma_async"] > 0 and out["tma"] > 0 and out["local"] == 0, out
        if out["ptxas"] is not None:
            assert out["spill_bytes"] <= (BIAS_TILE_SPILL_BYTES if kw.get("has_bias") else 0), (name, out["ptxas"])
