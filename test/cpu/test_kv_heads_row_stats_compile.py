"""K and V with their own head counts, and the score_max / score_sum_exp outputs, in the DSL forwards (and split
heads, nested or not, in both backwards' main kernels), also beside a bias, dBias and ALiBi on the mma.sync line: the
params validate, name their kernels apart, and the kernels compile for sm_80 (mma.sync) and sm_90a (mma.sync and
wgmma) without a GPU. Graphs without the features compile to the same kernels as before (the kernel IR of the
covering sets is unchanged; `tools/kernel_ir.py diff`)."""

from __future__ import annotations

import pytest

from frost.engines.sm80.sdpa_fwd_params import Sm80FwdParams
from frost.engines.sm80.sdpa_fwd_params import default_knobs as knobs80
from frost.engines.sm80.sdpa_fwd_params import validate as validate80
from frost.engines.sm90.sdpa_fwd_params import Sm90FwdParams, pack_gqa_reason
from frost.engines.sm90.sdpa_fwd_params import default_knobs as knobs90
from frost.engines.sm90.sdpa_fwd_params import validate as validate90
from frost.errors import TemplateParamsError
from frost.testing.cases import SM80_FWD_TEMPLATE, SM90_FWD_TEMPLATE, params_kwargs
from test.compile_runner import compile_groups

P80 = "frost.engines.sm80.sdpa_fwd_params.Sm80FwdParams"
B80 = "frost.engines.sm80.sdpa_bwd_params.Sm80BwdParams"
BWD_MAIN = "frost.engines.sm80.sdpa_bwd"
P90 = "frost.engines.sm90.sdpa_fwd_params.Sm90FwdParams"
B90 = "frost.engines.sm90.sdpa_bwd_params.Sm90BwdParams"
BWD90_MAIN = "frost.engines.sm90.sdpa_bwd"


def _k80(**kw) -> dict:
    return params_kwargs(knobs80, **kw)


def _b80(**kw) -> dict:
    from frost.engines.sm80.sdpa_bwd_knobs import default_knobs

    return params_kwargs(default_knobs, **kw)


def _b90(d=128, dv=None, hq=4, hk=4, **kw) -> dict:
    from frost.engines.sm90.sdpa_bwd_knobs import default_knobs

    dv = dv or d
    return dict(
        head_dim=d,
        head_dim_v=dv,
        num_heads_q=hq,
        num_heads_kv=hk,
        **kw,
        **default_knobs(d, dv, banded=kw.get("has_window_right", False)),
    )


def _k90(d=128, **kw) -> dict:
    return dict(head_dim=d, head_dim_v=d, **{**knobs90(d, d), **kw})


#: (template, params class, kwargs) compiled per arch: split heads and row statistics, dense and packed
CASES = {
    "sm_80": [
        (SM80_FWD_TEMPLATE, P80, _k80(d=128, hq=6, hk=6, num_heads_v=1, has_lse=True, has_window_right=True)),
        (
            SM80_FWD_TEMPLATE,
            P80,
            _k80(
                d=64,
                hq=8,
                hk=2,
                num_heads_v=4,
                has_score_max=True,
                has_score_sum_exp=True,
                has_seqused=True,
                has_sinks=True,
            ),
        ),
        (
            SM80_FWD_TEMPLATE,
            P80,
            _k80(
                d=128,
                hq=4,
                hk=4,
                is_thd=True,
                has_lse=True,
                has_score_max=True,
                has_score_sum_exp=True,
                has_window_right=True,
            ),
        ),
        # the mma.sync backward's main kernel: K finer (6 K heads, 1 V head) and V finer (2 K heads, 4 V heads)
        (BWD_MAIN, B80, _b80(d=64, hq=6, hk=6, num_heads_v=1, has_window_right=True)),
        (BWD_MAIN, B80, _b80(d=128, hq=8, hk=2, num_heads_v=4, is_thd=True, deterministic=True)),
        (
            BWD_MAIN,
            B80,
            _b80(d=72, hq=8, hk=4, num_heads_v=1, has_seqused=True, deterministic=True, knobs=dict(dq_splits=2)),
        ),
        # counts that do not nest: K's and V's tiles both change within a walk (K groups of 3, V groups of 2)
        (BWD_MAIN, B80, _b80(d=64, hq=12, hk=4, num_heads_v=6, has_window_right=True, has_seqused=True)),
        (BWD_MAIN, B80, _b80(d=128, hq=6, hk=2, num_heads_v=3, is_thd=True, deterministic=True)),
        # with the score modifiers: a bias and ALiBi beside split heads and both row statistics, and the
        # backward's dBias written directly with K finer
        (
            SM80_FWD_TEMPLATE,
            P80,
            _k80(
                d=64,
                hq=8,
                hk=2,
                num_heads_v=4,
                has_bias=True,
                bias_per_head=True,
                has_alibi=True,
                has_window_right=True,
                has_lse=True,
                has_score_max=True,
                has_score_sum_exp=True,
            ),
        ),
        (
            BWD_MAIN,
            B80,
            _b80(
                d=64,
                hq=6,
                hk=6,
                num_heads_v=1,
                has_bias=True,
                bias_per_head=True,
                has_dbias=True,
                has_alibi=True,
                has_window_right=True,
            ),
        ),
    ],
    "sm_90a": [
        (SM90_FWD_TEMPLATE, P90, _k90(num_heads_q=6, num_heads_kv=6, num_heads_v=1, has_window_right=True)),
        (
            SM90_FWD_TEMPLATE,
            P90,
            _k90(
                num_heads_q=8,
                num_heads_kv=2,
                num_heads_v=4,
                pack_gqa=True,
                has_score_max=True,
                has_score_sum_exp=True,
                has_sinks=True,
            ),
        ),
        (
            SM90_FWD_TEMPLATE,
            P90,
            _k90(
                num_heads_q=4,
                num_heads_kv=4,
                is_thd=True,
                has_score_max=True,
                has_score_sum_exp=True,
                has_window_right=True,
            ),
        ),
        (
            SM90_FWD_TEMPLATE,
            P90,
            _k90(
                d=64, num_heads_q=8, num_heads_kv=2, pack_gqa=True, has_seqused=True, has_lse=False, has_score_max=True
            ),
        ),
        (SM80_FWD_TEMPLATE, P80, _k80(d=96, hq=8, hk=2, num_heads_v=4, is_thd=True, has_score_sum_exp=True)),
        (BWD_MAIN, B80, _b80(d=128, hq=8, hk=1, num_heads_v=2, has_sinks=True, has_dsinks=True)),
        # a broadcast dBias through the fp32 accumulator, V finer
        (
            BWD_MAIN,
            B80,
            _b80(
                d=64, hq=8, hk=2, num_heads_v=4, has_bias=True, has_dbias=True, dbias_accum=True, has_window_right=True
            ),
        ),
        # the wgmma backward's main kernel: K finer, V finer (deterministic, causal), counts that do not nest
        # (padded, deterministic), shared keys (d=192x128)
        (BWD90_MAIN, B90, _b90(hq=6, hk=6, num_heads_v=1)),
        (BWD90_MAIN, B90, _b90(hq=8, hk=2, num_heads_v=4, has_window_right=True, deterministic=True)),
        (
            BWD90_MAIN,
            B90,
            _b90(hq=12, hk=4, num_heads_v=6, has_window_right=True, has_seqused=True, deterministic=True),
        ),
        (BWD90_MAIN, B90, _b90(d=192, dv=128, hq=6, hk=6, num_heads_v=1)),
    ],
}


@pytest.mark.slow
def test_split_heads_and_row_stats_compile(tmp_path):
    groups = [(arch, [(t, pc, kw, None) for t, pc, kw in specs]) for arch, specs in CASES.items()]
    for (arch, specs), outs in zip(CASES.items(), compile_groups(groups, tmp_path, ptxas=True)):
        for (template, _, kw), out in zip(specs, outs):
            assert out["entries"] == [out["name"]] and out["target"] == [arch], out
            if template == SM90_FWD_TEMPLATE:
                assert out["wgmma_mma_async"] > 0 and out["tma"] > 0, out
            elif template == BWD_MAIN:
                assert out["mma_sync"] > 0 and out["red"] + out["red_v2"] > 0, out
            elif template == BWD90_MAIN:
                assert out["wgmma_mma_async"] > 0 and out["tma"] > 0, out
                # the tile reload inside the walk keeps the step's wgmmas in flight and nothing on the stack
                assert out["spill_bytes"] == 0 and "serialized" not in out["ptxas"], out["ptxas"]
            else:
                assert out["mma_sync"] > 0 and out["wgmma"] == 0, out
            assert out["local"] == 0, out


def test_params_name_v_heads_and_row_stats_apart():
    from frost.engines.sm80.sdpa_fwd import kernel_name as name80
    from frost.engines.sm90.sdpa_fwd import kernel_name as name90

    base = Sm80FwdParams(**_k80(d=64, hq=8, hk=2))
    split = base.model_copy(update={"num_heads_v": 4})
    stats = base.model_copy(update={"has_score_max": True, "has_score_sum_exp": True})
    names = {name80(p, "sm_80") for p in (base, split, stats)}
    assert len(names) == 3 and "_h8k2v4_" in name80(split, "sm_80") and "_smax_ssum_" in name80(stats, "sm_80")
    b90 = Sm90FwdParams(num_heads_q=8, num_heads_kv=2)
    assert "_h8x2v4_" in name90(b90.model_copy(update={"num_heads_v": 4}), "sm_90a")
    assert name90(b90.model_copy(update={"has_score_sum_exp": True}), "sm_90a") != name90(b90, "sm_90a")
    for p in (split, stats):
        validate80(p)


@pytest.mark.parametrize("bad", [dict(num_heads_v=2), dict(num_heads_v=3)])
def test_num_heads_v_is_zero_when_v_has_ks_heads_and_must_divide_hq(bad):
    """One kernel, one key: V with K's heads is num_heads_v=0, never the same count spelled out."""
    with pytest.raises(TemplateParamsError, match="num_heads_v"):
        validate80(Sm80FwdParams(**{**_k80(d=64, hq=8, hk=2), **bad}))


def test_pack_gqa_packs_the_heads_sharing_k_and_v():
    p = Sm90FwdParams(num_heads_q=8, num_heads_kv=2, num_heads_v=4, pack_gqa=True)
    assert p.pack_group == 2 and p.rows_per_query == 2  # Hq/Hk = 4, Hq/Hv = 2: pairs share both
    validate90(p)
    assert Sm90FwdParams(num_heads_q=32, num_heads_kv=8, pack_gqa=True).rows_per_query == 4
    mqa_v = Sm90FwdParams(num_heads_q=6, num_heads_kv=6, num_heads_v=1, pack_gqa=True)
    assert "share both a K head and a V head" in pack_gqa_reason(mqa_v)


def test_backward_walks_whole_k_and_v_groups():
    """The mma.sync backward's CTA walks the smallest run of query heads made of whole K groups and whole V groups
    (the coarser tensor's group where the counts nest, their least common multiple where they do not). The wgmma
    backward walks the same runs, loading a K or V head's tile by TMA where the previous one's group ends."""
    from frost.engines.sm80.sdpa_bwd import kernel_name
    from frost.engines.sm80.sdpa_bwd_params import Sm80BwdParams
    from frost.engines.sm80.sdpa_bwd_params import validate as validate_bwd
    from frost.engines.sm90.sdpa_bwd_params import Sm90BwdParams
    from frost.engines.sm90.sdpa_bwd_params import validate as validate_bwd90

    p = Sm80BwdParams(**_b80(d=64, hq=8, hk=2, num_heads_v=4))
    validate_bwd(p)
    assert (p.kv_grid_heads, p.walk_group) == (2, 4) and "_h8k2v4_" in kernel_name(p, "sm_80")
    q = Sm80BwdParams(**_b80(d=64, hq=6, hk=6, num_heads_v=1))
    assert (q.kv_grid_heads, q.walk_group) == (1, 6)
    base = Sm80BwdParams(**_b80(d=64, hq=8, hk=2))
    assert (base.kv_grid_heads, base.walk_group) == (2, 4)  # equal counts: one CTA per kv head, as before
    unnested = Sm80BwdParams(**_b80(d=64, hq=12, hk=4, num_heads_v=6))  # K groups of 3, V groups of 2
    validate_bwd(unnested)
    assert (unnested.kv_grid_heads, unnested.walk_group) == (2, 6) and "_h12k4v6_" in kernel_name(unnested, "sm_80")
    assert (Sm80BwdParams(**_b80(d=64, hq=6, hk=2, num_heads_v=3)).kv_grid_heads,) == (1,)
    assert Sm80BwdParams(**_b80(d=64, hq=24, hk=6, num_heads_v=4)).walk_group == 12  # groups of 4 and 6
    from frost.engines.sm90.sdpa_bwd import kernel_name as name90

    for hk, hv, walk in ((2, 4, 4), (8, 1, 8), (1, 4, 8)):  # the wgmma backward walks the same runs
        w = Sm90BwdParams(head_dim=64, head_dim_v=64, num_heads_q=8, num_heads_kv=hk, num_heads_v=hv)
        validate_bwd90(w)
        assert (w.walk_group, w.kv_grid_heads) == (walk, 8 // walk)
        assert f"_h8k{hk}v{hv}_" in name90(w, "sm_90a")  # apart from the kernel with V on K's heads
