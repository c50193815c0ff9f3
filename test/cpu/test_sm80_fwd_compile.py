"""The mma.sync SDPA forward template compiles for sm_80, sm_90a and sm_120a (no GPU needed).

A covering set, not the cross product: every tuned head-dim pair once, every
feature flag at least once, both families, each arch; and a second set of the
other head dims (tiles padded past the head dim, d_qk != d_v). Each arch compiles in
its own process (PTX kept, disk cache off) and the PTX is checked for the
instruction family and the frost kernel symbol.
"""

from __future__ import annotations

import pytest

from frost.engines.sm80.sdpa_fwd_params import (
    SMEM_BUDGET,
    TUNED_HEAD_DIMS,
    Sm80FwdParams,
    default_knobs,
    smem_bytes,
    validate,
)
from frost.errors import TemplateParamsError
from frost.testing.cases import SM80_FWD_COVER as COVER
from frost.testing.cases import SM80_FWD_HEAD_DIM_COVER as HEAD_DIM_COVER
from frost.testing.cases import SM80_FWD_SCORE_MOD_COVER as SCORE_MOD_COVER
from frost.testing.cases import SM80_FWD_TEMPLATE as TEMPLATE
from frost.testing.cases import params_kwargs
from test.compile_runner import check_head_dim_cover, compile_groups


def _p(**kw) -> dict:
    return params_kwargs(default_knobs, **kw)


PARAMS = "frost.engines.sm80.sdpa_fwd_params.Sm80FwdParams"


@pytest.mark.slow
@pytest.mark.parametrize("cover", [COVER, HEAD_DIM_COVER, SCORE_MOD_COVER], ids=["tuned", "head_dims", "score_mods"])
def test_covering_set_compiles_to_mma_sync_for_every_arch(tmp_path, cover):
    from frost.engines.sm80.sdpa_fwd import kernel_name

    groups = [(arch, [(TEMPLATE, PARAMS, kw, None) for kw in kws]) for arch, kws in cover.items()]
    results = dict(zip(cover, compile_groups(groups, tmp_path)))
    for arch, outs in results.items():
        for kw, out in zip(cover[arch], outs):
            name = kernel_name(Sm80FwdParams(**kw), arch)
            assert out["name"] == name
            assert out["entries"] == [name], out["entries"]
            assert out["target"] == [arch], out["target"]
            assert out["mma_sync"] > 0 and out["wgmma"] == 0, out
            assert out["ldmatrix"] > 0 and out["ldmatrix_trans"] > 0 and out["cp_async"] > 0, out
            assert out["ex2"] > 0, out


def test_covering_set_covers_head_dims_flags_and_families():
    kws = [kw for arch in COVER for kw in COVER[arch]]
    others = check_head_dim_cover(COVER, HEAD_DIM_COVER, TUNED_HEAD_DIMS)
    for k in others:
        assert (k["head_dim"], k["head_dim_v"]) not in TUNED_HEAD_DIMS
    for flag in (
        "is_thd",
        "has_seqused",
        "has_lse",
        "has_sinks",
        "has_window_left",
        "has_window_right",
        "bottom_right",
    ):
        assert any(k.get(flag) for k in kws), flag
    assert {k["family"] for k in kws} == {"sm80", "sm120"}
    assert any(k["num_heads_q"] != k["num_heads_kv"] for k in kws)
    assert {k["dtype"] for k in kws} == {"bf16", "fp16"}


def test_kernel_name_is_a_self_describing_frost_symbol():
    from frost.compiler.naming import check_symbol
    from frost.engines.sm80.sdpa_fwd import kernel_name

    p = Sm80FwdParams(**_p(d=128, hq=8, hk=2, is_thd=True, has_window_right=True, has_lse=True))
    name = kernel_name(p, "sm_90a")
    assert check_symbol(name) == name
    assert name == "frost_sdpa_fwd_sm80_bf16_d128_h8k2_wr_lse_thd_m128n64s1w4"
    p2 = Sm80FwdParams(**_p(family="sm120", d=192, dv=128, has_sinks=True))
    assert kernel_name(p2, "sm_120a").startswith("frost_sdpa_fwd_sm120_bf16_d192v128_h4k4_sink_")


def test_default_knobs_fit_each_family_and_validate():
    for fam in ("sm80", "sm120"):
        for d, dv in TUNED_HEAD_DIMS + ((8, 8), (40, 40), (72, 72), (160, 160), (192, 64), (64, 256), (256, 8)):
            for dt in ("bf16", "fp16"):
                p = Sm80FwdParams(**_p(family=fam, dtype=dt, d=d, dv=dv))
                validate(p)
                assert smem_bytes(p) <= SMEM_BUDGET[fam]
    # a small-smem cc 8.x target (99 KB) gets a fitting configuration in the sm80 family
    k = default_knobs("sm80", 256, 256, "bf16", smem_budget=101376)
    assert smem_bytes(Sm80FwdParams(head_dim=256, head_dim_v=256, **k)) <= 101376


def test_padded_head_dims_take_the_covering_tuned_row():
    """A head dim between granules runs on tiles padded to the next one, with its covering tuned pair's knobs;
    the tuned pairs keep their own rows."""
    from frost.engines.sm80.sdpa_fwd_params import tile_dim, tuned_head_dims

    assert [tile_dim(d) for d in (8, 32, 40, 64, 72, 96, 112, 136, 160, 200, 256)] == [
        32,
        32,
        64,
        64,
        96,
        96,
        128,
        160,
        160,
        224,
        256,
    ]
    for d, dv in TUNED_HEAD_DIMS:
        assert tuned_head_dims(d, dv) == (d, dv)
    assert tuned_head_dims(72, 72) == (96, 96) and tuned_head_dims(112, 112) == (128, 128)
    assert tuned_head_dims(160, 128) == (192, 128) and tuned_head_dims(160, 160) == (256, 256)
    assert tuned_head_dims(128, 64) == (128, 128) and tuned_head_dims(64, 256) == (256, 256)
    assert default_knobs("sm80", 72, 72) == default_knobs("sm80", 96, 96)
    p = Sm80FwdParams(**_p(d=72, dv=40))
    assert (p.tile_head_dim, p.tile_head_dim_v) == (96, 64)
    assert smem_bytes(p) == smem_bytes(
        Sm80FwdParams(
            **_p(
                d=96,
                dv=64,
                knobs=dict(tile_m=p.tile_m, tile_n=p.tile_n, num_stages=p.num_stages, num_warps=p.num_warps),
            )
        )
    )


@pytest.mark.parametrize(
    "bad",
    [
        dict(head_dim=84, head_dim_v=84),
        dict(head_dim=128, head_dim_v=4),
        dict(head_dim=264, head_dim_v=128),
        dict(num_heads_q=6, num_heads_kv=4),
        dict(is_thd=True, has_seqused=True),
        dict(tile_m=96),
        dict(tile_m=64, num_warps=8),
        dict(num_stages=4),
        dict(family="sm120", head_dim=256, head_dim_v=256, tile_m=128, tile_n=64, num_warps=8),
    ],
)
def test_validator_rejects(bad):
    with pytest.raises(TemplateParamsError):
        validate(Sm80FwdParams(**bad))
