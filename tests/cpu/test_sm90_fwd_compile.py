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
from frost.testing.cases import SM90_FWD_TEMPLATE as TEMPLATE
from tests.compile_runner import compile_groups

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


def test_defaults_validate_for_every_head_dim():
    for d, dv in [(64, 64), (96, 96), (128, 128), (192, 128), (192, 192), (256, 256)]:
        p = Sm90FwdParams(head_dim=d, head_dim_v=dv, **default_knobs(d, dv))
        validate(p)
        assert smem_bytes(p) <= 227 * 1024


def test_o_tile_falls_back_to_q_tile_when_it_does_not_fit():
    from frost.engines.sm90.sdpa_fwd_params import separate_o

    assert separate_o(Sm90FwdParams())
    big = Sm90FwdParams(tile_n=192)  # K and V stages leave no room for a separate O tile
    validate(big)
    assert not separate_o(big) and smem_bytes(big) <= 227 * 1024


@pytest.mark.parametrize("bad", [
    dict(head_dim=80),
    dict(head_dim=128, head_dim_v=64),
    dict(num_heads_q=6, num_heads_kv=4),
    dict(is_thd=True, has_seqused=True),
    dict(bottom_right=True),
    dict(tile_m=96),
    dict(tile_n=120),
    dict(tile_n=256, num_stages=3),
    dict(intra_wg_overlap=False),
    dict(pack_gqa=True),  # nothing to pack (Hq == Hkv)
    dict(num_heads_q=6, num_heads_kv=2, pack_gqa=True),  # r=3 does not divide a warpgroup's 64 rows
])
def test_validator_rejects(bad):
    with pytest.raises(TemplateParamsError):
        validate(Sm90FwdParams(**bad))


def test_kernel_name_encodes_every_param():
    from frost.engines.sm90.sdpa_fwd import kernel_name

    base = Sm90FwdParams()
    names = {kernel_name(base, "sm_90a")}
    for field, value in [("dtype", "fp16"), ("head_dim", 64), ("num_heads_q", 8), ("num_heads_kv", 2),
                         ("is_thd", True), ("has_seqused", True), ("has_lse", False), ("has_sinks", True),
                         ("has_window_left", True), ("has_window_right", True), ("tile_n", 64),
                         ("num_stages", 3), ("pingpong", False), ("separate_o_smem", False),
                         ("persistent", False), ("sm_count", 114), ("pack_gqa", True)]:
        upd = {field: value}
        if field == "head_dim":
            upd["head_dim_v"] = 64
        if field == "num_heads_kv":
            upd["num_heads_q"] = 4
        names.add(kernel_name(base.model_copy(update=upd), "sm_90a"))
    assert len(names) == 18
    assert all(n.startswith("frost_sdpa_fwd_sm90_") for n in names)
