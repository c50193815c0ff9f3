"""The SM90 forward template (wgmma + TMA) compiles for sm_90a without a GPU, and its params validate.

The compile test is a covering set, not the cross product: every head-dim pair,
every feature flag and every knob at least once. Two processes (PTX kept, disk
cache off) split the set; each PTX must hold wgmma, TMA bulk-tensor copies,
register reallocation and the frost kernel symbol.
"""

from __future__ import annotations

import pytest

from frost.engines.sm90.sdpa_fwd_params import Sm90FwdParams, default_knobs, smem_bytes, validate
from frost.errors import TemplateParamsError
from frost.testing.cases import SM90_FWD_COVER as COVER
from frost.testing.cases import SM90_FWD_HEAD_DIM_COVER as HEAD_DIM_COVER
from frost.testing.cases import SM90_FWD_SCORE_MOD_COVER as SCORE_MOD_COVER
from frost.testing.cases import SM90_FWD_WIDE_V_COVER as WIDE_V_COVER
from frost.testing.cases import SM90_FWD_TEMPLATE as TEMPLATE
from test.compile_runner import BIAS_THD_SPILL_BYTES, BIAS_TILE_SPILL_BYTES, compile_groups

PARAMS = "frost.engines.sm90.sdpa_fwd_params.Sm90FwdParams"


@pytest.mark.slow
def test_covering_set_compiles_for_sm90a(tmp_path):
    groups = [("sm_90a", [(TEMPLATE, PARAMS, kw, None) for kw in part]) for part in COVER]
    results = [r for part in compile_groups(groups, tmp_path, timeout=600) for r in part]
    for kw, r in zip([kw for part in COVER for kw in part], results):
        assert r["name"].startswith("frost_sdpa_fwd_sm90_"), r
        assert r["entries"] == [r["name"]], r  # the one GPU kernel carries the frost symbol
        assert r["target"] == ["sm_90a"], r
        assert r["wgmma_mma_async"] > 0 and r["tma"] > 0 and r["setmaxnreg"] == 2, r
        assert r["local"] == 0, r
    assert len({r["name"] for r in results}) == len(results)


@pytest.mark.slow
def test_padded_and_wide_head_dims_compile_without_spills(tmp_path):
    """Head dims between 16-element steps (tiles padded, O stores column-limited), d_qk above 256 and d_v above
    d_qk: wgmma and TMA as at the tuned dims, and ptxas spills nothing with the default knobs."""
    groups = [("sm_90a", [(TEMPLATE, PARAMS, kw, None) for kw in part]) for part in HEAD_DIM_COVER]
    results = [r for part in compile_groups(groups, tmp_path, timeout=600, ptxas=True) for r in part]
    for kw, r in zip([kw for part in HEAD_DIM_COVER for kw in part], results):
        dims = f"d{kw['head_dim']}" + (f"v{kw['head_dim_v']}" if kw["head_dim_v"] != kw["head_dim"] else "")
        assert r["name"].startswith(f"frost_sdpa_fwd_sm90_bf16_{dims}_"), r["name"]
        assert r["wgmma_mma_async"] > 0 and r["tma"] > 0 and r["setmaxnreg"] == 2, r["name"]
        assert r["local"] == 0, r["name"]
        if r["ptxas"] is not None:
            assert r["spill_bytes"] == 0, r["ptxas"]


@pytest.mark.slow
def test_column_slices_of_o_compile_without_spills(tmp_path):
    """d_v above 256 (O in column slices, `vs` in the name) and d_qk up to 1024: wgmma and TMA as at the tuned
    dims, and ptxas spills nothing with the default knobs (the planner's: no GQA packing with slices)."""
    groups = [("sm_90a", [(TEMPLATE, PARAMS, kw, None) for kw in WIDE_V_COVER[i::2]]) for i in range(2)]
    results = [r for part in compile_groups(groups, tmp_path, timeout=600, ptxas=True) for r in part]
    for kw, r in zip(WIDE_V_COVER[0::2] + WIDE_V_COVER[1::2], results):
        slices = Sm90FwdParams(**kw).v_slices
        assert (f"vs{slices}sm" in r["name"]) == (slices > 1), r["name"]
        assert r["wgmma_mma_async"] > 0 and r["tma"] > 0 and r["setmaxnreg"] == 2, r["name"]
        assert r["local"] == 0, r["name"]
        if r["ptxas"] is not None:
            assert r["spill_bytes"] == 0, r["ptxas"]
    assert any(Sm90FwdParams(**kw).head_dim == 1024 for kw in WIDE_V_COVER)


@pytest.mark.slow
def test_score_modifiers_compile_without_spills(tmp_path):
    """A bias (full, broadcast with a strided key dim, packed, with GQA) and ALiBi: wgmma and TMA as without them,
    the modifier tags in the name, and ptxas spills nothing (with a bias, at most a per-tile value:
    `BIAS_TILE_SPILL_BYTES`)."""
    from frost.engines.params import score_mod_tags

    groups = [("sm_90a", [(TEMPLATE, PARAMS, kw, None) for kw in part]) for part in SCORE_MOD_COVER]
    results = [r for part in compile_groups(groups, tmp_path, timeout=600, ptxas=True) for r in part]
    for kw, r in zip([kw for part in SCORE_MOD_COVER for kw in part], results):
        tags = [tag for on, tag in score_mod_tags(Sm90FwdParams(**kw)) if on]
        assert tags and all(f"_{tag}_" in r["name"] for tag in tags), r["name"]
        assert r["entries"] == [r["name"]] and r["target"] == ["sm_90a"], r
        assert r["wgmma_mma_async"] > 0 and r["tma"] > 0 and r["setmaxnreg"] == 2, r["name"]
        assert r["local"] == 0, r["name"]
        if r["ptxas"] is not None:
            allowed = 0
            if kw.get("has_bias"):
                allowed = BIAS_THD_SPILL_BYTES if kw.get("is_thd") else BIAS_TILE_SPILL_BYTES
            assert r["spill_bytes"] <= allowed, r["ptxas"]
    assert len({r["name"] for r in results}) == len(results)


def test_defaults_validate_for_every_head_dim():
    for d in range(8, 1025, 8):
        for dv in range(8, 1025, 8 if d <= 256 else 56):
            p = Sm90FwdParams(head_dim=d, head_dim_v=dv, **default_knobs(d, dv))
            validate(p)
            assert smem_bytes(p) <= 227 * 1024
            assert p.v_slices == -(-dv // 256), (d, dv, p.v_slices)


@pytest.mark.parametrize(
    "dv, slices, tile, first_slices",
    [(256, 1, 256, 1), (264, 2, 144, 2), (520, 3, 176, 3), (512, 2, 256, 2), (1024, 4, 256, 4), (776, 4, 208, 4)],
)
def test_d_v_above_256_runs_in_column_slices_of_o(dv, slices, tile, first_slices):
    """A wgmma PV GEMM covers at most 256 columns: a wider d_v takes the fewest slices whose padded tiles do."""
    from frost.engines.sm90.sdpa_fwd_params import min_v_slices

    assert min_v_slices(dv) == first_slices
    p = Sm90FwdParams(head_dim=64, head_dim_v=dv, **default_knobs(64, dv))
    assert (p.v_slices, p.tile_head_dim_v) == (slices, tile)
    assert (p.v_slices - 1) * p.tile_head_dim_v < dv <= p.v_slices * p.tile_head_dim_v


def test_tiles_pad_head_dims_to_wgmma_k_steps():
    p = Sm90FwdParams(head_dim=72, head_dim_v=40)
    assert (p.tile_head_dim, p.tile_head_dim_v) == (80, 48)
    assert (Sm90FwdParams(head_dim=512, head_dim_v=256).tile_head_dim, Sm90FwdParams().tile_head_dim) == (512, 128)
    # the shared-memory estimate counts the padded tiles
    assert smem_bytes(p) == smem_bytes(Sm90FwdParams(head_dim=80, head_dim_v=48))


@pytest.mark.parametrize(
    "d, dv, knobs",
    [
        (80, 80, dict(tile_m=192, tile_n=112, num_stages=2)),
        (112, 112, dict(tile_m=192, tile_n=80, num_stages=2)),
        (72, 40, dict(tile_m=192, tile_n=112, num_stages=2)),
        (64, 256, dict(tile_m=128, tile_n=80, num_stages=2)),
        (104, 64, dict(tile_m=192, tile_n=80)),
        (120, 120, dict(tile_m=128, tile_n=128)),
        (320, 128, dict(tile_m=64, tile_n=64, num_stages=2)),
        (512, 256, dict(tile_m=64, tile_n=64, num_stages=1)),
        (520, 520, dict(tile_m=64, tile_n=64, num_stages=1, v_slices=3)),
        (1024, 1024, dict(tile_m=64, tile_n=32, num_stages=1, v_slices=4)),
        (64, 264, dict(tile_m=128, tile_n=96, num_stages=2, v_slices=2)),
        (64, 520, dict(tile_n=96, v_slices=3)),
        # the tuned pairs keep their measured rows
        (64, 64, dict(tile_m=192, tile_n=128, num_stages=2)),
        (192, 192, dict(tile_m=128, tile_n=112, num_stages=2)),
        (96, 96, dict(tile_m=192, tile_n=112, num_stages=2)),
        (128, 128, dict(tile_m=128, tile_n=128, num_stages=2)),
        (256, 256, dict(tile_m=128, tile_n=80, num_stages=2)),
    ],
)
def test_default_knobs_by_tile_head_dims(d, dv, knobs):
    k = default_knobs(d, dv)
    assert {n: k[n] for n in knobs} == knobs


@pytest.mark.parametrize("d", [64, 80, 96, 112])
def test_score_modifiers_keep_two_consumer_warpgroups(d):
    """A bias, ALiBi or a block mask spills three warpgroups' 160 registers: their tiles are 128 x 128."""
    assert default_knobs(d, d)["tile_m"] == 192
    assert {n: default_knobs(d, d, score_mods=True)[n] for n in ("tile_m", "tile_n")} == dict(tile_m=128, tile_n=128)


@pytest.mark.parametrize(
    "d, dv, message",
    [
        (84, 84, "d_qk=84 is not a multiple of 8"),
        (128, 60, "d_v=60 is not a multiple of 8"),
        (1032, 128, "d_qk=1032 is above 1024"),
        (512, 1040, "d_v=1040 is above 1024"),
        (0, 64, "d_qk=0 is not a multiple"),
    ],
)
def test_validator_names_the_head_dim_outside_the_span(d, dv, message):
    with pytest.raises(TemplateParamsError, match=message):
        validate(Sm90FwdParams(head_dim=d, head_dim_v=dv))
    with pytest.raises(TemplateParamsError, match=f"{message}.*; no default knobs"):
        default_knobs(d, dv)


def test_o_tile_falls_back_to_q_tile_when_it_does_not_fit():
    from frost.engines.sm90.sdpa_fwd_params import separate_o

    assert separate_o(Sm90FwdParams())
    big = Sm90FwdParams(tile_n=192)  # K and V stages leave no room for a separate O tile
    validate(big)
    assert not separate_o(big) and smem_bytes(big) <= 227 * 1024


@pytest.mark.parametrize(
    "bad",
    [
        dict(head_dim=84),
        dict(head_dim=520, head_dim_v=128),  # the default 128x128 tiles past the shared memory
        dict(head_dim=64, head_dim_v=264),  # one 272-column O tile: past a wgmma's N
        dict(head_dim=64, head_dim_v=64, v_slices=0),
        dict(head_dim=64, head_dim_v=64, v_slices=8),  # the last slice (past 7 * 16 columns) would be empty
        dict(head_dim=64, head_dim_v=520, v_slices=3, num_heads_q=4, num_heads_kv=2, pack_gqa=True),
        dict(head_dim=512, head_dim_v=256, tile_m=128),  # Q, K and V tiles past the shared memory
        dict(num_heads_q=6, num_heads_kv=4),
        dict(is_thd=True, has_seqused=True),
        dict(bottom_right=True),
        dict(tile_m=96),
        dict(tile_n=120),
        dict(tile_n=256, num_stages=3),
        dict(intra_wg_overlap=False),
        dict(pack_gqa=True),  # nothing to pack (Hq == Hkv)
        dict(num_heads_q=6, num_heads_kv=2, pack_gqa=True),  # r=3 does not divide a warpgroup's 64 rows
    ],
)
def test_validator_rejects(bad):
    with pytest.raises(TemplateParamsError):
        validate(Sm90FwdParams(**bad))


def test_kernel_name_encodes_every_param():
    from frost.engines.sm90.sdpa_fwd import kernel_name

    base = Sm90FwdParams()
    names = {kernel_name(base, "sm_90a")}
    for field, value in [
        ("dtype", "fp16"),
        ("head_dim", 64),
        ("num_heads_q", 8),
        ("num_heads_kv", 2),
        ("is_thd", True),
        ("has_seqused", True),
        ("has_lse", False),
        ("has_sinks", True),
        ("has_window_left", True),
        ("has_window_right", True),
        ("tile_n", 64),
        ("num_stages", 3),
        ("pingpong", False),
        ("separate_o_smem", False),
        ("persistent", False),
        ("sm_count", 114),
        ("pack_gqa", True),
        ("has_bias", True),
        ("has_alibi", True),
    ]:
        upd = {field: value}
        if field == "head_dim":
            upd["head_dim_v"] = 64
        if field == "num_heads_kv":
            upd["num_heads_q"] = 4
        names.add(kernel_name(base.model_copy(update=upd), "sm_90a"))
    assert len(names) == 20
    assert all(n.startswith("frost_sdpa_fwd_sm90_") for n in names)
