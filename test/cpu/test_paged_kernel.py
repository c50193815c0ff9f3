"""The mma.sync forward reading cuDNN's paged K/V cache through its block tables: the SM80 adapter plans paged
graphs on fake A100 / H200 targets for the block sizes its key tiles divide and declines the others naming the
sizes it serves; the template's params and argument list; the kernel compiles for sm_80 and sm_90a with no more
ptxas spills than the same kernel over dense K and V, every length and block index it reads clamped."""
from __future__ import annotations

import pytest

import frost
from frost.engines.sdpa_args import fwd_arg_names
from frost.engines.sm80.sdpa_fwd_params import PAGED_BLOCK_SIZES, Sm80FwdParams, validate
from frost.errors import TemplateParamsError
from frost.target import fake_target
from frost.testing.cases import SM80_FWD_PAGED_COVER, SM80_FWD_TEMPLATE
from test.compile_runner import compile_groups

PARAMS = "frost.engines.sm80.sdpa_fwd_params.Sm80FwdParams"


def _facts(block_size: int, *, d=64, max_kv=1000, hq=8, hkv=2, sq=1, **sdpa_kw):
    """The facts of a paged decode-style forward (B=3), containers (num_blocks, H_kv, block_size, d)."""
    blocks = -(-max_kv // block_size)
    g = frost.pygraph(io_data_type=frost.data_type.BFLOAT16)
    q = g.tensor(name="Q", dim=(3, hq, sq, d), stride=(hq * sq * d, d, hq * d, 1))
    k, v = (g.tensor(name=n, dim=(3 * blocks + 2, hkv, block_size, d),
                     stride=(hkv * block_size * d, d, hkv * d, 1)) for n in ("container_k", "container_v"))
    kt, vt = (g.tensor(name=n, dim=(3, 1, blocks, 1), stride=(blocks, blocks, 1, 1),
                       data_type=frost.data_type.INT32) for n in ("table_k", "table_v"))
    lq, lk = (g.tensor(name=n, dim=(3, 1, 1, 1), stride=(1, 1, 1, 1), data_type=frost.data_type.INT32)
              for n in ("seq_q", "seq_kv"))
    o, _ = g.sdpa(q, k, v, attn_scale=0.125, use_padding_mask=True, seq_len_q=lq, seq_len_kv=lk,
                  paged_attention_k_table=kt, paged_attention_v_table=vt, paged_attention_max_seq_len_kv=max_kv,
                  **sdpa_kw)
    o.set_output(True)
    return g.validate().facts


def _ranked(facts, target):
    from frost.lowering.lower import rank

    ranking = rank(facts, fake_target(target))
    return ranking, dict(ranking.declines)


@pytest.mark.parametrize("target", ["A100", "H200"])
@pytest.mark.parametrize("block_size", [64, 128, 256])
@pytest.mark.parametrize("d", [64, 128])
def test_the_mma_sync_forward_plans_paged_graphs(target, block_size, d):
    ranking, declines = _ranked(_facts(block_size, d=d, use_causal_mask_bottom_right=True), target)
    if target == "H200":  # the wgmma forward ranks first there and declines the paged cache, naming it
        assert "does not serve paged_attention" in declines["SdpaFwdDslSm90"]
    row, adapter = ranking.accepted[0]
    assert row.name == "SdpaFwdDslSm80"
    p = adapter.validated_params()
    assert (p.paged_block_k, p.paged_block_v) == (block_size, block_size) and p.paged
    assert block_size % p.tile_n == 0  # every key tile inside one block
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
@pytest.mark.parametrize("block_size", [16, 32])
def test_small_blocks_are_declined_naming_the_sizes_served(target, block_size):
    ranking, declines = _ranked(_facts(block_size), target)
    assert declines["SdpaFwdDslSm80"] == (f"serves paged K/V block sizes 64, 128, 256; this graph's K/V containers "
                                          f"have block size {block_size}")
    assert all(row.name in ("SdpaFwdCudnn",) for row, _ in ranking.accepted)  # the cuDNN engine, if its binding loads


def test_requested_key_tiles_must_divide_the_block():
    p = Sm80FwdParams(head_dim=64, head_dim_v=64, has_seqused=True, paged_block_k=64, paged_block_v=64, tile_n=128)
    with pytest.raises(TemplateParamsError, match="must divide the k container's block size 64"):
        validate(p)
    with pytest.raises(TemplateParamsError, match="dense"):
        validate(p.model_copy(update={"tile_n": 64, "has_seqused": False}))
    validate(p.model_copy(update={"tile_n": 64}))
    assert PAGED_BLOCK_SIZES == (64, 128, 256)


@pytest.mark.slow
def test_the_paged_forward_compiles_with_no_more_spills_than_dense(tmp_path):
    """Each paged case of the covering set beside the same kernel over dense K and V: mma.sync and cp.async, no
    local memory beyond the dense kernel's, ptxas spills no more (d=128 on 255 registers spills a little in both),
    and the block tables are read on the device."""
    from frost.engines.sm80.sdpa_fwd import kernel_name

    cover = SM80_FWD_PAGED_COVER
    dense = {arch: [dict(kw, paged_block_k=0, paged_block_v=0) for kw in kws] for arch, kws in cover.items()}
    groups = [(arch, [(SM80_FWD_TEMPLATE, PARAMS, kw, None) for kw in cover[arch] + dense[arch]]) for arch in cover]
    for arch, outs in zip(cover, compile_groups(groups, tmp_path, ptxas=True)):
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
