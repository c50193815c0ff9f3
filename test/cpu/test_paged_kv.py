"""cuDNN's paged K/V cache: the declaration, its validation errors, the engines' verdicts, and the reference engine
against a gather-then-attend float64 oracle (block sizes 16..256, GQA, windows, sinks, ragged and empty lengths).

The graphs are written the way cuDNN's own paged tests write them (test_mhas_v2.py / sdpa/fp16.py): K and V
declared as containers (num_blocks, H_kv, block_size, D), int32 block tables (B, 1, max_blocks_per_seq, 1) with
the strides of a transposed (max_blocks, 1, B, 1) tensor, paged_attention_max_seq_len_kv, and the padding mask.
"""

from __future__ import annotations

import math

import pytest
import torch

import frost
from frost.errors import GraphError
from frost.target import fake_target
from test import oracle

SIZES_SAY = {
    name: "serves paged K/V block sizes 16, 32, 64, 128, 256; this graph's K/V containers have block size 24"
    for name in ("SdpaFwdDslSm80", "SdpaFwdDslSm90")
}


def _tables(b, blocks_per_seq, num_blocks, gen, *, transposed=True):
    """A (B, 1, max_blocks, 1) int32 table of distinct shuffled block ids (transposed strides, as cuDNN's tests)."""
    ids = torch.randperm(num_blocks, generator=gen)[: b * blocks_per_seq].to(torch.int32)
    if transposed:
        return ids.reshape(blocks_per_seq, 1, b, 1).transpose(0, 2)
    return ids.reshape(b, 1, blocks_per_seq, 1)


def _paged(
    q_dims,
    kv_heads,
    d_v,
    block_size,
    max_kv,
    lens_q,
    lens_kv,
    *,
    dtype=torch.float32,
    seed=0,
    sink=False,
    spare_blocks=3,
    junk=True,
    row_stats=False,
    **sdpa_kw,
):
    """(graph, variant pack, the oracle's dense K and V (B, H, S_kv, D) and lengths) of one paged forward;
    `block_size`: both containers', or (K's, V's)."""
    gen = torch.Generator().manual_seed(seed)
    b, hq, sq, d = q_dims
    bk, bv = block_size if isinstance(block_size, tuple) else (block_size, block_size)
    per_k, per_v = math.ceil(max_kv / bk), math.ceil(max_kv / bv)
    q = torch.randn(q_dims, generator=gen).to(dtype)
    kc = torch.randn(b * per_k + spare_blocks, kv_heads, bk, d, generator=gen).to(dtype)
    vc = torch.randn(b * per_v + spare_blocks, kv_heads, bv, d_v, generator=gen).to(dtype)
    kt = _tables(b, per_k, kc.shape[0], gen)
    vt = _tables(b, per_v, vc.shape[0], gen, transposed=False)
    if junk:  # table entries past a sequence's last block are never read (a serving engine leaves them stale)
        for t, bs in ((kt, bk), (vt, bv)):
            for i, n in enumerate(lens_kv):
                t[i, 0, math.ceil(n / bs) :, 0] = 10**6
    lq = torch.tensor(lens_q, dtype=torch.int32).reshape(b, 1, 1, 1)
    lk = torch.tensor(lens_kv, dtype=torch.int32).reshape(b, 1, 1, 1)
    io = {
        torch.float32: frost.data_type.FLOAT,
        torch.bfloat16: frost.data_type.BFLOAT16,
        torch.float16: frost.data_type.HALF,
    }[dtype]
    g = frost.pygraph(
        io_data_type=io, intermediate_data_type=frost.data_type.FLOAT, compute_data_type=frost.data_type.FLOAT
    )
    tq = g.tensor(dim=q.shape, stride=q.stride(), data_type=io)
    tk = g.tensor(dim=kc.shape, stride=kc.stride(), data_type=io)
    tv = g.tensor(dim=vc.shape, stride=vc.stride(), data_type=io)
    tkt = g.tensor(dim=kt.shape, stride=kt.stride(), data_type=frost.data_type.INT32)
    tvt = g.tensor(dim=vt.shape, stride=vt.stride(), data_type=frost.data_type.INT32)
    tlq = g.tensor(dim=lq.shape, stride=lq.stride(), data_type=frost.data_type.INT32)
    tlk = g.tensor(dim=lk.shape, stride=lk.stride(), data_type=frost.data_type.INT32)
    sink_t = torch.randn(1, hq, 1, 1, generator=gen) if sink else None
    ts = g.tensor(dim=(1, hq, 1, 1), stride=(hq, 1, 1, 1), data_type=frost.data_type.FLOAT) if sink else None
    rows = {}
    if row_stats:  # cuDNN's score_max / score_sum_exp, declared as fp32 graph tensors the forward writes
        for r in ("score_max", "score_sum_exp"):
            buf = torch.full((b, hq, sq, 1), float("nan"))
            t = g.tensor(dim=buf.shape, stride=buf.stride(), data_type=frost.data_type.FLOAT)
            t.set_output(True)
            rows[r] = (t, buf)
        sdpa_kw.update({r: t for r, (t, _) in rows.items()})
    o, st = g.sdpa(
        name="sdpa_forward",
        q=tq,
        k=tk,
        v=tv,
        generate_stats=True,
        attn_scale=0.125,
        use_padding_mask=True,
        seq_len_q=tlq,
        seq_len_kv=tlk,
        paged_attention_k_table=tkt,
        paged_attention_v_table=tvt,
        paged_attention_max_seq_len_kv=max_kv,
        sink_token=ts,
        **sdpa_kw,
    )
    out = torch.full((b, hq, sq, d_v), float("nan"), dtype=dtype)
    lse = torch.full((b, hq, sq, 1), float("nan"))
    o.set_output(True).set_dim(out.shape).set_stride(out.stride())
    st.set_output(True).set_data_type(frost.data_type.FLOAT).set_dim(lse.shape).set_stride(lse.stride())
    pack = {tq: q, tk: kc, tv: vc, tkt: kt, tvt: vt, tlq: lq, tlk: lk, o: out, st: lse}
    if sink:
        pack[ts] = sink_t
    pack.update({t: buf for t, buf in rows.values()})
    return (
        g,
        pack,
        dict(
            rows={r: buf for r, (_, buf) in rows.items()},
            q=q,
            kc=kc,
            vc=vc,
            kt=kt,
            vt=vt,
            out=out,
            lse=lse,
            sink=sink_t,
            lens_q=lens_q,
            lens_kv=lens_kv,
            block_size=block_size,
            max_kv=max_kv,
        ),
    )


def _gathered(container, table, lens_kv, max_kv):
    """The oracle's dense (B, H, max_kv, D): key j of sequence b, element by element, from row j % block_size of
    block table[b, 0, j // block_size, 0] (the container's own block size); zeros past the sequence's length."""
    b = len(lens_kv)
    _, h, block_size, d = container.shape
    out = torch.zeros(b, h, max_kv, d, dtype=torch.float64)
    for i in range(b):
        for j in range(lens_kv[i]):
            blk = int(table[i, 0, j // block_size, 0])
            out[i, :, j] = container[blk, :, j % block_size].double()
    return out


def _oracle(x, row_stats=False, **mask):
    k = _gathered(x["kc"], x["kt"], x["lens_kv"], x["max_kv"])
    v = _gathered(x["vc"], x["vt"], x["lens_kv"], x["max_kv"])
    return oracle.attention(
        x["q"],
        k,
        v,
        scale=0.125,
        sink=x["sink"],
        seq_len_q=x["lens_q"],
        seq_len_kv=x["lens_kv"],
        row_stats=row_stats,
        **mask,
    )


def _run(g, pack):
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([frost.heur_mode.A, frost.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    g.execute(pack, None)
    return g


def _close(x, ref, tol):
    o, lse = ref
    b, hq, sq, _ = x["q"].shape
    valid = torch.zeros(b, hq, sq, dtype=torch.bool)
    for i, n in enumerate(x["lens_q"]):
        valid[i, :, :n] = True
    got_o, got_lse = x["out"].double(), x["lse"][..., 0].double()
    assert not torch.isnan(got_o).any(), "an output element was never written"
    assert torch.allclose(got_o, o, atol=tol, rtol=tol), (got_o - o).abs().max()
    assert torch.equal(torch.isinf(got_lse[valid]), torch.isinf(lse[valid]))
    fin = valid & torch.isfinite(lse)
    assert torch.allclose(got_lse[fin], lse[fin], atol=tol, rtol=tol)


# the reference engine: the semantics ---------------------------------------------------------------------------
@pytest.mark.parametrize("block_size", [16, 32, 64, 128, 256])
def test_reference_matches_gather_then_attend_for_every_block_size(block_size):
    lens_q, lens_kv = [5, 1, 7], [300, 17, block_size]
    g, pack, x = _paged(
        (3, 4, 7, 32), 2, 32, block_size, 300, lens_q, lens_kv, seed=block_size, use_causal_mask_bottom_right=True
    )
    assert g.validate().facts.paged.block_size_k == block_size
    _run(g, pack)
    assert g.engine_name == "SdpaFwdReference"
    _close(x, _oracle(x, causal_bottom_right=True), 1e-5)


@pytest.mark.parametrize("blocks", [(16, 64), (128, 32), (256, 16)])
def test_reference_reads_k_and_v_through_blocks_of_different_sizes(blocks):
    """K's container in blocks of one size and V's in another, each through its own table."""
    lens_q, lens_kv = [5, 1, 7], [300, 17, 256]
    g, pack, x = _paged((3, 4, 7, 32), 2, 32, blocks, 300, lens_q, lens_kv, use_causal_mask_bottom_right=True)
    paged = g.validate().facts.paged
    assert (paged.block_size_k, paged.block_size_v) == blocks
    _run(g, pack)
    _close(x, _oracle(x, causal_bottom_right=True), 1e-5)


@pytest.mark.parametrize("case", ["gqa", "mqa", "window", "band", "sinks", "empty", "decode", "top_left", "bf16", "dv"])
def test_reference_paged_features(case):
    q_dims, hkv, dv, bs, max_kv = (2, 8, 4, 64), 2, 64, 16, 80
    lens_q, lens_kv = [4, 3], [80, 33]
    kw, mask, dtype, tol, sink = {}, {}, torch.float32, 1e-5, False
    if case == "mqa":
        hkv = 1
    elif case == "window":
        kw = dict(use_causal_mask_bottom_right=True, sliding_window_length=9)
        mask = dict(causal_bottom_right=True, sliding_window_length=9)
    elif case == "band":
        kw = dict(
            diagonal_alignment=frost.diagonal_alignment.BOTTOM_RIGHT,
            diagonal_band_left_bound=20,
            diagonal_band_right_bound=2,
        )
        mask = dict(alignment="BOTTOM_RIGHT", left_bound=20, right_bound=2)
    elif case == "sinks":
        sink = True
        kw, mask = dict(use_causal_mask_bottom_right=True), dict(causal_bottom_right=True)
    elif case == "empty":  # empty sequences: no keys (with a sink: the sink alone), no queries, both
        lens_q, lens_kv, q_dims = [4, 0, 2], [0, 0, 50], (3, 8, 4, 64)
        sink = True
    elif case == "decode":
        q_dims, lens_q, lens_kv = (2, 8, 1, 64), [1, 1], [77, 1]
        kw, mask = dict(use_causal_mask_bottom_right=True), dict(causal_bottom_right=True)
    elif case == "top_left":
        kw, mask = dict(diagonal_band_right_bound=0), dict(right_bound=0)
    elif case == "bf16":
        dtype, tol = torch.bfloat16, 2e-2
    elif case == "dv":
        dv = 32
    g, pack, x = _paged(q_dims, hkv, dv, bs, max_kv, lens_q, lens_kv, dtype=dtype, sink=sink, **kw)
    _run(g, pack)
    ref = _oracle(x, **mask)
    if dtype != torch.float32:
        x["out"] = x["out"].float()
    _close(x, ref, tol)


def test_reference_refuses_a_table_entry_outside_the_container():
    g, pack, x = _paged((1, 2, 3, 16), 2, 16, 16, 40, [3], [40], junk=False)
    x["kt"][0, 0, 1, 0] = x["kc"].shape[0]
    g.validate()
    g.build_plans()
    with pytest.raises(frost.BindingError, match="paged_attention_k_table.*outside"):
        g.execute(pack, None)


# the declaration ----------------------------------------------------------------------------------------------
def _declare(
    *,
    table_dtype=frost.data_type.INT32,
    table_dims=(3, 1, 4, 1),
    max_kv=100,
    block_size=32,
    num_blocks=11,
    v_table_dims=None,
    target=None,
):
    g = frost.pygraph(io_data_type=frost.data_type.HALF, target=target)
    q = g.tensor(name="Q", dim=(3, 4, 8, 64), stride=(2048, 512, 64, 1))
    k, v = (
        g.tensor(name=n, dim=(num_blocks, 2, block_size, 64), stride=(4096, 64 * block_size, 64, 1))
        for n in ("container_k", "container_v")
    )
    kt = g.tensor(name="page_table_k", dim=table_dims, stride=None, data_type=table_dtype)
    vt = g.tensor(name="page_table_v", dim=v_table_dims or table_dims, stride=None, data_type=frost.data_type.INT32)
    lq, lk = (
        g.tensor(name=n, dim=(3, 1, 1, 1), stride=(1, 1, 1, 1), data_type=frost.data_type.INT32)
        for n in ("seq_q", "seq_kv")
    )
    o, _ = g.sdpa(
        q,
        k,
        v,
        attn_scale=0.125,
        use_padding_mask=True,
        seq_len_q=lq,
        seq_len_kv=lk,
        paged_attention_k_table=kt,
        paged_attention_v_table=vt,
        paged_attention_max_seq_len_kv=max_kv,
    )
    o.set_output(True)
    return g


def test_a_paged_container_counts_blocks_not_sequences():
    facts = _declare().validate().facts  # 11 blocks, batch 3: no "batch sizes differ"
    assert facts.batch == 3 and facts.seq_kv == 100 and "paged_attention" in facts.features()
    assert (facts.paged.block_size_k, facts.paged.num_blocks_k, facts.paged.table_blocks_k) == (32, 11, 4)
    assert facts.tensor("paged_attention_k_table").dim == (3, 1, 4, 1)


def test_the_envelope_is_inferred_from_the_tables_as_cudnn_does():
    assert _declare(max_kv=None).validate().facts.seq_kv == 4 * 32


@pytest.mark.parametrize(
    "kw, fragment",
    [
        (dict(table_dtype=frost.data_type.INT64), "'page_table_k' (paged_attention_k_table): data_type must be int32"),
        (
            dict(table_dims=(3, 4, 1)),
            "'page_table_k' (paged_attention_k_table): expected dim (3, 1, max_blocks_per_seq",
        ),
        (dict(table_dims=(2, 1, 4, 1)), "B=3 from q"),
        (dict(v_table_dims=(3, 1, 4, 2)), "'page_table_v' (paged_attention_v_table): expected dim"),
        (dict(max_kv=200), "'page_table_k' (paged_attention_k_table): 4 blocks per sequence, but"),
        (dict(max_kv=0), "paged_attention_max_seq_len_kv must be >= 1"),
    ],
)
def test_validation_names_the_tensor(kw, fragment):
    with pytest.raises(GraphError) as ei:
        _declare(**kw).validate()
    assert fragment in str(ei.value)


def test_paged_caches_need_the_padding_mask_and_dense_queries():
    g = frost.pygraph(io_data_type=frost.data_type.HALF)
    q, k, v = (g.tensor(dim=(2, 4, 32, 64), stride=None) for _ in range(3))
    t = g.tensor(dim=(2, 1, 1, 1), stride=None, data_type=frost.data_type.INT32)
    o, _ = g.sdpa(q, k, v, paged_attention_k_table=t, paged_attention_v_table=t)
    o.set_output(True)
    with pytest.raises(GraphError, match="need use_padding_mask=True"):
        g.validate()


# the engines' verdicts -----------------------------------------------------------------------------------------
def test_dsl_engines_decline_naming_the_feature_and_the_reference_serves_it_on_the_cpu():
    from frost.lowering.lower import rank

    g = _declare(block_size=24, max_kv=96)
    g.validate()
    g.build_plans()
    assert g.engine_name == "SdpaFwdReference"
    for target, dsl in (("H200", ("SdpaFwdDslSm90",)), ("A100", ())):
        facts = _declare(block_size=24, max_kv=96).validate().facts  # facts judge nothing: rank them for the device
        ranking = rank(facts, fake_target(target))
        declines = dict(ranking.declines)
        for name in dsl + ("SdpaFwdDslSm80",):  # block size 24: neither inside nor a whole part of their key tiles
            assert declines[name] == SIZES_SAY[name]
        accepted = [row.name for row, _ in ranking.accepted]
        assert accepted in ([], ["SdpaFwdCudnn"])  # the cuDNN engine where its binding loads, else nothing
        assert "paged" not in declines.get("SdpaFwdCudnn", "")  # never for the paged cache itself


def test_a_block_size_no_engine_serves_is_named_with_the_sizes_served():
    from frost.lowering.capabilities import rows_for
    from frost.lowering.mismatch import mismatch
    from frost.knobs import Knobs
    from frost.target import CPU

    facts = _declare(block_size=24, max_kv=96).validate().facts
    ref = next(r for r in rows_for("fwd") if r.name == "SdpaFwdReference")
    assert mismatch(ref, facts, Knobs(), CPU) is None  # the reference serves every block size
    narrow = ref.model_copy(update={"paged_block_sizes": (16, 32, 64, 128, 256)})
    reason = mismatch(narrow, facts, Knobs(), CPU)
    assert reason == (
        "serves paged K/V block sizes 16, 32, 64, 128, 256; this graph's K/V containers have block size 24"
    )
    assert mismatch(narrow, _declare().validate().facts, Knobs(), CPU) is None


def test_cudnn_rows_serve_paged_forwards():
    from frost.lowering.capabilities import rows_for

    fwd = {r.name: r for r in rows_for("fwd")}
    assert "paged_attention" in fwd["SdpaFwdCudnn"].features and "paged_attention" in fwd["SdpaFwdReference"].features
    assert "paged_attention" not in fwd["SdpaFwdDslSm100"].features  # no SM100 kernels yet
    assert all(
        "paged_attention" in fwd[n].features and fwd[n].paged_block_sizes == (16, 32, 64, 128, 256)
        for n in ("SdpaFwdDslSm80", "SdpaFwdDslSm120", "SdpaFwdDslSm90")
    )


def test_paged_caches_take_dense_queries_not_the_packed_form():
    g = frost.Graph(io_data_type="fp16")
    q, k, v = (g.tensor(dim=(64, 4, 64)) for _ in range(3))
    cu = g.tensor(dim=(3,), data_type="int32")
    t = g.tensor(dim=(2, 1, 2, 1), data_type="int32")
    lens = g.tensor(dim=(2,), data_type="int32")
    o, _ = g.sdpa(
        q,
        k,
        v,
        cu_seq_len_q=cu,
        cu_seq_len_kv=cu,
        max_seq_len_q=32,
        max_seq_len_kv=32,
        use_padding_mask=True,
        seq_len_q=lens,
        seq_len_kv=lens,
        paged_attention_k_table=t,
        paged_attention_v_table=t,
    )
    o.set_output(True)
    with pytest.raises(GraphError, match="not frost's packed form"):
        g.validate()


def test_row_statistics_and_sinks_through_a_paged_cache():
    """cuDNN's paged tests draw score_max / score_sum_exp and sinks too: the halves of Stats per valid row."""
    lens_q, lens_kv = [3, 2], [45, 0]
    g, pack, x = _paged(
        (2, 4, 3, 32), 2, 16, 32, 64, lens_q, lens_kv, sink=True, row_stats=True, use_causal_mask_bottom_right=True
    )
    _run(g, pack)
    o, lse, top, sum_exp = _oracle(x, row_stats=True, causal_bottom_right=True)
    _close(x, (o, lse), 1e-5)
    for name, want in (("score_max", top), ("score_sum_exp", sum_exp)):
        got = x["rows"][name][..., 0].double()
        for i, n in enumerate(lens_q):
            assert torch.allclose(got[i, :, :n], want[i, :, :n], atol=1e-5, rtol=1e-5), name
