"""The mma.sync and wgmma forwards reading cuDNN's paged K/V cache through its block tables: the SM80 adapter
plans paged graphs on a fake A100 and the SM90 adapter on a fake H200 (the SM80 one ranked after it) for the
block sizes their key tiles divide, and both decline the others naming the sizes they serve; the templates' params
and argument lists; the kernels compile (sm_80 / sm_90a) with no more ptxas spills than the same kernels over dense
K and V, every length and block index they read clamped."""

from __future__ import annotations

import pytest

import frost
from frost.engines.sdpa_args import fwd_arg_names
from frost.engines.sm80.sdpa_fwd_params import (
    PAGED_BLOCK_SIZES,
    Sm80FwdParams,
    default_knobs,
    paged_span,
    paged_tile_n,
    validate,
)
from frost.engines.sm90 import sdpa_fwd_params as sm90
from frost.errors import TemplateParamsError
from frost.target import fake_target
from frost.testing.cases import SM80_FWD_PAGED_COVER, SM80_FWD_TEMPLATE, SM90_FWD_PAGED_COVER, SM90_FWD_TEMPLATE
from test.compile_runner import compile_groups

PARAMS = "frost.engines.sm80.sdpa_fwd_params.Sm80FwdParams"
SM90_PARAMS = "frost.engines.sm90.sdpa_fwd_params.Sm90FwdParams"


def _facts(block_size: int, *, d=64, max_kv=1000, hq=8, hkv=2, sq=1, **sdpa_kw):
    """The facts of a paged decode-style forward (B=3), containers (num_blocks, H_kv, block_size, d)."""
    blocks = -(-max_kv // block_size)
    g = frost.pygraph(io_data_type=frost.data_type.BFLOAT16)
    q = g.tensor(name="Q", dim=(3, hq, sq, d), stride=(hq * sq * d, d, hq * d, 1))
    k, v = (
        g.tensor(name=n, dim=(3 * blocks + 2, hkv, block_size, d), stride=(hkv * block_size * d, d, hkv * d, 1))
        for n in ("container_k", "container_v")
    )
    kt, vt = (
        g.tensor(name=n, dim=(3, 1, blocks, 1), stride=(blocks, blocks, 1, 1), data_type=frost.data_type.INT32)
        for n in ("table_k", "table_v")
    )
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
        **sdpa_kw,
    )
    o.set_output(True)
    return g.validate().facts


def _ranked(facts, target):
    from frost.lowering.lower import rank

    ranking = rank(facts, fake_target(target))
    return ranking, dict(ranking.declines)


@pytest.mark.parametrize("target", ["A100", "H200"])
@pytest.mark.parametrize("block_size", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("d", [64, 128])
def test_the_mma_sync_forward_plans_paged_graphs(target, block_size, d):
    ranking, declines = _ranked(_facts(block_size, d=d, use_causal_mask_bottom_right=True), target)
    assert "SdpaFwdDslSm80" not in declines
    accepted = [row.name for row, _ in ranking.accepted]
    # on the H200 the wgmma forward ranks first, the mma.sync one after it
    assert accepted[:2] == (["SdpaFwdDslSm90", "SdpaFwdDslSm80"] if target == "H200" else ["SdpaFwdDslSm80"])
    row, adapter = ranking.accepted[accepted.index("SdpaFwdDslSm80")]
    p = adapter.validated_params()
    assert (p.paged_block_k, p.paged_block_v) == (block_size, block_size) and p.paged
    default = default_knobs("sm80", d, d)["tile_n"]
    if block_size < 64:  # the key tile spans whole blocks, not shrunk to one
        assert p.tile_n == default and p.tile_n % block_size == 0 and paged_span(block_size, p.tile_n)
    else:  # every key tile inside one block
        assert block_size % p.tile_n == 0 and not paged_span(block_size, p.tile_n)
    assert p.has_seqused and p.bottom_right and p.num_heads_q == 8 and p.num_heads_kv == 2
    names = fwd_arg_names(p)
    assert names.index("k_table") < names.index("v_table") < names.index("softmax_scale")
    # (a split-KV plan's workspace partials come last but the stream: test_split_kv.py)
    assert [n for n in names if not n.endswith("_partial")][-2:] == ["max_seqlen_kv", "stream"]
    # the adapter's launch arguments: the tables as bound, the envelope a plan-time constant
    from frost.adapters.dsl import LaunchArgs

    items = dict((a, k) for k, a in LaunchArgs(names, adapter.facts).items)
    assert items["paged_attention_k_table"] == 0 and items["paged_attention_v_table"] == 0
    assert 1000 in [a for k, a in LaunchArgs(names, adapter.facts).items if k == 1]


@pytest.mark.parametrize("target", ["A100", "H200"])
@pytest.mark.parametrize("block_size", [8, 24, 48, 512])
def test_the_mma_sync_forward_declines_other_blocks_naming_the_sizes_served(target, block_size):
    ranking, declines = _ranked(_facts(block_size, max_kv=1024), target)
    says = (
        f"serves paged K/V block sizes 16, 32, 64, 128, 256; this graph's K/V containers have block size {block_size}"
    )
    assert declines["SdpaFwdDslSm80"] == says
    assert all(row.name == "SdpaFwdCudnn" for row, _ in ranking.accepted)  # the cuDNN engine, if its binding loads


@pytest.mark.parametrize("blocks", [(16, 128), (64, 32), (32, 16)])
def test_the_mma_sync_forward_plans_k_and_v_blocks_apart(blocks):
    """K's and V's containers of different block sizes: the key tile lies inside the blocks of 64 rows or more and
    spans the smaller ones (here through the params: the declaration helper gives K and V one block size)."""
    from frost.adapters.sm80 import SdpaFwdDslSm80

    p = Sm80FwdParams(
        head_dim=64,
        head_dim_v=64,
        has_seqused=True,
        paged_block_k=blocks[0],
        paged_block_v=blocks[1],
        tile_n=paged_tile_n(default_knobs("sm80", 64, 64)["tile_n"], blocks),
    )
    validate(p)
    big = [b for b in blocks if b >= 64]
    assert p.tile_n == min([128, *big])
    assert [paged_span(b, p.tile_n) for b in blocks] == [b < 64 for b in blocks]
    # the plan: 16-row blocks keep d=64's 128-key tile, 64-row blocks shrink it to 64
    assert [SdpaFwdDslSm80.plan_knobs(_facts(b, d=64), fake_target("A100"), {})["tile_n"] for b in (16, 64)] == [
        128,
        64,
    ]


def test_requested_key_tiles_must_divide_the_block_or_span_whole_ones():
    p = Sm80FwdParams(head_dim=64, head_dim_v=64, has_seqused=True, paged_block_k=64, paged_block_v=64, tile_n=128)
    with pytest.raises(TemplateParamsError, match="tile_n=96 must divide the k container's block size 64"):
        validate(p.model_copy(update={"tile_n": 96}))
    validate(p)  # two 64-row blocks per key tile
    with pytest.raises(TemplateParamsError, match="dense"):
        validate(p.model_copy(update={"tile_n": 64, "has_seqused": False}))
    validate(p.model_copy(update={"tile_n": 64}))
    validate(p.model_copy(update={"tile_n": 96, "paged_block_k": 32, "paged_block_v": 16}))  # 3 and 6 blocks a tile
    with pytest.raises(TemplateParamsError, match="the v container's block size 48"):
        validate(p.model_copy(update={"tile_n": 64, "paged_block_v": 48}))
    assert PAGED_BLOCK_SIZES == (16, 32, 64, 128, 256)
    assert [paged_tile_n(t, (16,)) for t in (128, 96, 64, 32)] == [128, 96, 64, 32]
    assert [paged_tile_n(t, (64, 32)) for t in (128, 64, 32)] == [64, 64, 32]
    assert paged_tile_n(128, (256, 128)) == 128 and not paged_span(64, 64) and paged_span(16, 64)


def _span_misses(p: Sm80FwdParams, n_block: int = 3, head: int = 2) -> tuple[list, int]:
    """Traced on the CPU (nothing compiles for a GPU or runs): every thread of the mma.sync forward's K copy over a
    key tile that spans blocks, its partition of the container view (`paged.span_rows`, an identity container of 7
    blocks, so each element reads as its (block, row, head, column)) at the block of each row mode's table entry
    (`paged.span_entries`, the table here holding entry % 7). Returns (misses, elements checked): a miss is a row
    whose entry is not its key's block index or whose element is not (that block, the key's row in it, the head,
    its column)."""
    import cutlass.cute as cute

    from frost.engines.common import paged
    from frost.engines.sm80.sdpa_fwd import SdpaFwdSm80

    kernel = SdpaFwdSm80(p)
    block, tile_n, misses, checked = p.paged_block_k, p.tile_n, [], [0]

    def collect():  # plain Python: its loops run at trace time over static values
        copy = kernel._gmem_copy(kernel.d, True)
        mX = cute.make_identity_tensor((7, block, 3, kernel.d))
        for t in range(p.num_threads):
            thr = copy.get_slice(t)
            rows = thr.partition_S(paged.span_rows(mX, head, tile_n, block, kernel.d))
            crd = thr.partition_S(cute.make_identity_tensor((tile_n, kernel.d)))
            entries, owners = paged.span_entries(crd, n_block, tile_n, block)
            for m in range(len(entries)):
                entry = entries[owners[m]]
                for k in range(cute.size(crd, mode=[2])):
                    r, c = crd[0, m, k]
                    checked[0] += 1
                    if entry != (n_block * tile_n + r) // block or tuple(rows[0, m, k, entry % 7]) != (
                        entry % 7,
                        r % block,
                        head,
                        c,
                    ):
                        misses.append((t, m, k, r, c, entry, rows[0, m, k, entry % 7]))

    @cute.jit
    def trace():
        collect()

    cute.compile(trace)
    return misses, checked[0]


@pytest.mark.slow
def test_each_row_of_a_spanning_key_tile_is_read_from_its_own_block():
    """Blocks of 16 and 32 rows under every key tile they divide (and 64-row blocks under a requested 128-key tile),
    with copy passes of 16, 32 and 64 rows (d=64 and d=96 on 4 and 8 warps): where a pass divides the block the
    table entry is read once for the modes that share it, else per thread; either way every element of every
    thread's rows lands on its key's block and row."""
    configs = 0
    for d in (64, 96):
        for warps in (4, 8):
            for block, tile_n in ((16, 32), (16, 64), (32, 64), (16, 96), (32, 96), (16, 128), (32, 128), (64, 128)):
                p = Sm80FwdParams(
                    head_dim=d,
                    head_dim_v=d,
                    num_warps=warps,
                    tile_n=tile_n,
                    has_seqused=True,
                    paged_block_k=block,
                    paged_block_v=block,
                )
                try:
                    validate(p)
                except TemplateParamsError:  # key tiles that are not whole copy passes
                    continue
                misses, checked = _span_misses(p)
                assert not misses and checked == tile_n * p.tile_head_dim // 8, (d, warps, block, tile_n, misses[:4])
                configs += 1
    assert configs >= 16


#: what ptxas may spill in a mma.sync forward whose key tiles span 16- or 32-row blocks beyond the same kernel over
#: 64-row blocks: d=128's 128x64 tile runs at 255 registers and spills in every form (dense 128 bytes, 64-row blocks
#: 108, 16-row blocks 120: a table entry and a 64-bit block offset per row mode); the others spill nothing
SPAN_SPILL_BYTES = 16


def _twin(kw: dict) -> dict:
    """A spanning case's twin over 64-row blocks (where it spans), its key tile as the plan shrinks it."""
    blocks = [64 if paged_span(kw[b], kw["tile_n"]) else kw[b] for b in ("paged_block_k", "paged_block_v")]
    return dict(kw, paged_block_k=blocks[0], paged_block_v=blocks[1], tile_n=paged_tile_n(kw["tile_n"], blocks))


@pytest.mark.slow
def test_the_paged_forward_compiles_with_no_more_spills_than_dense(tmp_path):
    """Each paged case of the covering set beside the same kernel over dense K and V: mma.sync and cp.async, no
    local memory beyond the dense kernel's, ptxas spills no more (d=128 on 255 registers spills a little in both),
    and the block tables are read on the device. Key tiles spanning 16- or 32-row blocks beside their twins over
    64-row blocks: more table reads (one per row mode and tile), spills within SPAN_SPILL_BYTES of the twin's."""
    from frost.engines.sm80.sdpa_fwd import kernel_name

    cover = SM80_FWD_PAGED_COVER
    dense = {arch: [dict(kw, paged_block_k=0, paged_block_v=0) for kw in kws] for arch, kws in cover.items()}
    spans = {arch: [kw for kw in kws if kw != _twin(kw)] for arch, kws in cover.items()}
    assert {kw["paged_block_k"] for kws in spans.values() for kw in kws} == {16, 32}
    assert any(kw["paged_block_v"] in (16, 32) for kws in spans.values() for kw in kws)
    assert any(kw.get("num_splits", 1) > 1 and kw.get("pack_gqa") for kws in spans.values() for kw in kws)
    groups = [(arch, [(SM80_FWD_TEMPLATE, PARAMS, kw, None) for kw in cover[arch] + dense[arch]]) for arch in cover]
    groups += [(arch, [(SM80_FWD_TEMPLATE, PARAMS, _twin(kw), None) for kw in spans[arch]]) for arch in cover]
    results = compile_groups(groups, tmp_path, ptxas=True)
    for arch, outs, twins in zip(cover, results, results[len(cover) :]):
        n = len(cover[arch])
        for kw, out, base in zip(cover[arch], outs[:n], outs[n:]):
            name = kernel_name(Sm80FwdParams(**kw), arch)
            assert "_pg" in name and out["name"] == name and out["entries"] == [name]
            assert out["target"] == [arch] and out["mma_sync"] > 0 and out["cp_async"] > 0
            assert out["local"] <= base["local"], (name, out["local"], base["local"])
            # the block indices are integer loads from global memory beside the lengths, each clamped to the
            # container (compile_groups fails any unclamped one)
            assert out["length_loads"] > base["length_loads"], (name, out["length_loads"], base["length_loads"])
            if out["ptxas"] is not None:
                assert out["spill_bytes"] <= base["spill_bytes"], (name, out["ptxas"], base["ptxas"])
        for out, twin in zip([out for kw, out in zip(cover[arch], outs) if kw in spans[arch]], twins):
            assert "_pg64" in twin["name"] and out["local"] <= twin["local"], (out["name"], twin["name"])
            assert out["length_loads"] > twin["length_loads"], (out["name"], out["length_loads"], twin["length_loads"])
            if out["ptxas"] is not None:
                spill = (out["spill_bytes"], twin["spill_bytes"])
                assert spill[0] <= spill[1] + SPAN_SPILL_BYTES, (out["name"], spill, out["ptxas"], twin["ptxas"])


# the wgmma forward ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("block_size", [64, 128, 256])
@pytest.mark.parametrize("d", [64, 80, 128, 256])
@pytest.mark.parametrize("sq", [1, 300])
def test_the_wgmma_forward_plans_paged_graphs(block_size, d, sq):
    """Decode (one query row: GQA packed into the M tile) and chunked prefill (a bottom-right sliding window)
    rank the wgmma forward first on the H200, its key tile shrunk to divide the block size."""
    band = (
        {}
        if sq == 1
        else dict(
            diagonal_band_right_bound=0,
            diagonal_band_left_bound=256,
            diagonal_alignment=frost.diagonal_alignment.BOTTOM_RIGHT,
        )
    )
    ranking, declines = _ranked(_facts(block_size, d=d, sq=sq, **band), "H200")
    row, adapter = ranking.accepted[0]
    assert row.name == "SdpaFwdDslSm90", declines.get("SdpaFwdDslSm90")
    p = adapter.validated_params()
    assert (p.paged_block_k, p.paged_block_v) == (block_size, block_size) and p.paged and p.has_seqused
    assert block_size % p.tile_n == 0 and p.tile_n % 16 == 0  # every key tile inside one block
    default = sm90.default_knobs(d, d)["tile_n"]
    assert p.tile_n == sm90.paged_tile_n(default, (block_size,))
    assert p.pack_gqa  # Hq/Hkv = 4 share one K/V stream, decode and prefill alike
    if sq > 1:
        assert p.bottom_right and p.has_window_left and p.has_window_right
    names = fwd_arg_names(p)
    tail = ["max_seqlen_kv"] + ["o_partial", "lse_partial"] * p.split + ["stream"]  # a long decode may split
    assert names.index("k_table") < names.index("v_table") and names[-len(tail) :] == tail


def test_the_wgmma_forward_serves_sinks_and_mixed_block_sizes():
    """Sinks and K / V containers of different block sizes: the key tile divides both."""
    from frost.lowering.lower import rank

    blocks = {"k": 64, "v": 128}
    g = frost.pygraph(io_data_type=frost.data_type.BFLOAT16)
    q = g.tensor(name="Q", dim=(2, 8, 40, 128), stride=(8 * 40 * 128, 128, 8 * 128, 1))
    k, v = (
        g.tensor(name=f"c{n}", dim=(40, 2, blocks[n], 128), stride=(2 * blocks[n] * 128, 128, 2 * 128, 1))
        for n in ("k", "v")
    )
    kt = g.tensor(name="kt", dim=(2, 1, 8, 1), stride=(8, 8, 1, 1), data_type=frost.data_type.INT32)
    vt = g.tensor(name="vt", dim=(2, 1, 4, 1), stride=(4, 4, 1, 1), data_type=frost.data_type.INT32)
    lq, lk = (
        g.tensor(name=n, dim=(2, 1, 1, 1), stride=(1, 1, 1, 1), data_type=frost.data_type.INT32) for n in ("lq", "lk")
    )
    sink = g.tensor(name="sink", dim=(1, 8, 1, 1), stride=(8, 1, 1, 1), data_type=frost.data_type.FLOAT)
    o, _ = g.sdpa(
        q,
        k,
        v,
        attn_scale=0.1,
        use_padding_mask=True,
        seq_len_q=lq,
        seq_len_kv=lk,
        sink_token=sink,
        use_causal_mask_bottom_right=True,
        paged_attention_k_table=kt,
        paged_attention_v_table=vt,
        paged_attention_max_seq_len_kv=512,
    )
    o.set_output(True)
    ranking = rank(g.validate().facts, fake_target("H200"))
    row, adapter = ranking.accepted[0]
    assert row.name == "SdpaFwdDslSm90", dict(ranking.declines).get("SdpaFwdDslSm90")
    p = adapter.validated_params()
    assert (p.paged_block_k, p.paged_block_v, p.tile_n) == (64, 128, 64) and p.has_sinks


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("d", [64, 80, 128, 256])
@pytest.mark.parametrize("sq", [1, 300])
def test_the_wgmma_forward_plans_blocks_smaller_than_its_key_tile(block_size, d, sq):
    """Blocks of 16 and 32 rows: the wgmma forward ranks first on the H200, its key tile the widest multiple of the
    block up to its default (one TMA load per block), not shrunk to the block."""
    band = (
        {}
        if sq == 1
        else dict(
            diagonal_band_right_bound=0,
            diagonal_band_left_bound=256,
            diagonal_alignment=frost.diagonal_alignment.BOTTOM_RIGHT,
        )
    )
    ranking, declines = _ranked(_facts(block_size, d=d, sq=sq, **band), "H200")
    row, adapter = ranking.accepted[0]
    assert row.name == "SdpaFwdDslSm90", declines.get("SdpaFwdDslSm90")
    p = adapter.validated_params()
    assert (p.paged_block_k, p.paged_block_v) == (block_size, block_size) and p.paged and p.has_seqused
    default = sm90.default_knobs(d, d)["tile_n"]
    assert p.tile_n == default - default % block_size and p.tile_n >= 64
    assert sm90.paged_span(block_size, p.tile_n) and p.pack_gqa


@pytest.mark.parametrize("block_size", [8, 24, 48, 512])
def test_the_wgmma_forward_declines_other_block_sizes_naming_the_served_ones(block_size):
    _, declines = _ranked(_facts(block_size, max_kv=1024), "H200")
    assert declines["SdpaFwdDslSm90"] == (
        f"serves paged K/V block sizes 16, 32, 64, 128, 256; this graph's K/V containers have block size {block_size}"
    )


def test_wgmma_key_tiles_lie_inside_a_block_or_span_whole_ones():
    p = sm90.Sm90FwdParams(
        head_dim=128, head_dim_v=128, has_seqused=True, paged_block_k=64, paged_block_v=64, tile_n=96
    )
    with pytest.raises(TemplateParamsError, match="tile_n=96 must divide the k container's block size 64"):
        sm90.validate(p)
    with pytest.raises(TemplateParamsError, match="multiple of 8 rows"):  # a block's load fills whole swizzle atoms
        sm90.validate(p.model_copy(update={"tile_n": 80, "paged_block_k": 20}))
    sm90.validate(p.model_copy(update={"tile_n": 128}))  # two 64-row blocks per key tile
    sm90.validate(p.model_copy(update={"tile_n": 128, "paged_block_k": 16, "paged_block_v": 256}))
    assert not sm90.paged_span(64, 64) and sm90.paged_span(16, 128) and not sm90.paged_span(0, 128)
    assert [sm90.paged_tile_n(t, (16,)) for t in (128, 112, 80)] == [128, 112, 80]
    assert [sm90.paged_tile_n(t, (32,)) for t in (128, 112, 80)] == [128, 96, 64]
    assert sm90.paged_tile_n(128, (16, 64)) == 128 and sm90.paged_tile_n(112, (32, 64)) == 64
    p = p.model_copy(update={"tile_n": 128})
    with pytest.raises(TemplateParamsError, match="dense"):
        sm90.validate(p.model_copy(update={"tile_n": 64, "has_seqused": False}))
    with pytest.raises(TemplateParamsError, match="both set"):
        sm90.validate(p.model_copy(update={"tile_n": 64, "paged_block_v": 0}))
    sm90.validate(p.model_copy(update={"tile_n": 64}))
    assert sm90.PAGED_BLOCK_SIZES == (16, 32, 64, 128, 256)
    assert [sm90.paged_tile_n(t, (64, 128)) for t in (128, 112, 80, 64, 32)] == [64, 64, 64, 64, 32]
    assert [sm90.paged_tile_n(t, (256,)) for t in (128, 112, 80)] == [128, 64, 64]


def test_a_requested_key_tile_that_straddles_blocks_declines_the_wgmma_forward():
    from frost.knobs import Knobs
    from frost.lowering.lower import rank

    ranking = rank(_facts(64, d=128), fake_target("H200"), Knobs(tile_n=96))
    assert "tile_n=96 must divide the k container's block size 64" in dict(ranking.declines)["SdpaFwdDslSm90"]


@pytest.mark.slow
@pytest.mark.parametrize("span", [False, True], ids=["inside", "spanning"])
def test_the_paged_wgmma_forward_compiles_with_no_more_spills_than_dense(tmp_path, span):
    """Each paged case of the wgmma covering set beside the same kernel over dense K and V: wgmma and TMA, no
    local memory or ptxas spill beyond the dense kernel's, and the block tables read on the device. `spanning`:
    the cases whose blocks (16 and 32 rows) are smaller than the key tile, one TMA load per block."""
    from frost.engines.sm90.sdpa_fwd import kernel_name

    cover = [kw for kw in SM90_FWD_PAGED_COVER if sm90.paged_span(kw["paged_block_k"], kw["tile_n"]) == span]
    assert cover and (not span or {kw["paged_block_k"] for kw in cover} == {16, 32})
    dense = [dict(kw, paged_block_k=0, paged_block_v=0) for kw in cover]
    specs = [(SM90_FWD_TEMPLATE, SM90_PARAMS, kw, None) for kw in cover + dense]
    n = len(cover)
    groups = [("sm_90a", specs[:n]), ("sm_90a", specs[n:])]
    outs, bases = compile_groups(groups, tmp_path, ptxas=True)
    for kw, out, base in zip(cover, outs, bases):
        name = kernel_name(sm90.Sm90FwdParams(**kw), "sm_90a")
        assert "_pg" in name and out["name"] == name and out["entries"] == [name]
        assert out["target"] == ["sm_90a"] and out["wgmma_mma_async"] > 0 and out["tma"] > 0
        assert out["local"] <= base["local"], (name, out["local"], base["local"])
        assert out["length_loads"] > base["length_loads"], (name, out["length_loads"], base["length_loads"])
        if out["ptxas"] is not None:
            assert out["spill_bytes"] <= base["spill_bytes"], (name, out["ptxas"], base["ptxas"])
