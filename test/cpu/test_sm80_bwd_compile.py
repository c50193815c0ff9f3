"""The mma.sync SDPA backward chain compiles for sm_80, sm_90a and sm_120a (no GPU needed).

A covering set, not the cross product: every tuned head-dim pair once, every feature
flag at least once, both families, both dtypes, each arch; and a second set of the
other head dims (tiles padded past the head dim, d_qk != d_v). Each arch compiles
its three kernels per flavor in its own process (PTX kept, disk cache off); the
PTX is checked for the instruction family and the frost kernel symbol.
"""

from __future__ import annotations

import pytest

from frost.engines.sdpa_bwd.chain import BwdHelperParams, chain_args, stage_params
from frost.engines.sdpa_bwd.scratch import scratch_bytes, scratch_layout, uses_turns
from frost.engines.sm80.dq_splits import split_tile, split_tile_count
from frost.engines.sm80.sdpa_bwd_knobs import _CANDIDATES, candidates, default_knobs
from frost.engines.sm80.sdpa_bwd_params import SMEM_BUDGET, Sm80BwdParams, smem_bytes, validate
from frost.engines.sm80.sdpa_fwd_params import TUNED_HEAD_DIMS
from frost.engines.sdpa_bwd.chain import chain_of as bwd_chain
from frost.errors import TemplateParamsError
from frost.testing.cases import SM80_BWD_COVER as COVER
from frost.testing.cases import SM80_BWD_HEAD_DIM_COVER as HEAD_DIM_COVER
from frost.testing.cases import DET_DBIAS_MMA_BWD_COVER as DET_DBIAS_COVER
from frost.testing.cases import SM80_BWD_SCORE_MOD_COVER as SCORE_MOD_COVER
from frost.testing.cases import params_kwargs
from test.compile_runner import check_head_dim_cover, compile_groups

_STAGE_TAG = {"preprocess": "pre", "main": "main", "postprocess": "post"}


def _p(**kw) -> dict:
    return params_kwargs(default_knobs, **kw)


PARAMS = {
    "main": "frost.engines.sm80.sdpa_bwd_params.Sm80BwdParams",
    "preprocess": "frost.engines.sdpa_bwd.chain.BwdHelperParams",
    "postprocess": "frost.engines.sdpa_bwd.chain.BwdHelperParams",
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "cover",
    [COVER, HEAD_DIM_COVER, SCORE_MOD_COVER, DET_DBIAS_COVER],
    ids=["tuned", "head_dims", "score_mods", "det_dbias"],
)
def test_covering_set_compiles_to_mma_sync_for_every_arch(tmp_path, cover):
    import importlib

    groups = [
        (
            arch,
            [
                (t, PARAMS[stage], sp.model_dump(), stage)
                for kw in kws
                for stage, t, _, sp in bwd_chain(Sm80BwdParams(**kw))
            ],
        )
        for arch, kws in cover.items()
    ]
    results = dict(zip(cover, compile_groups(groups, tmp_path)))
    for arch, outs in results.items():
        expected = []
        for kw in cover[arch]:
            p = Sm80BwdParams(**kw)
            expected += [
                (stage, importlib.import_module(t).kernel_name(sp, arch), p) for stage, t, _, sp in bwd_chain(p)
            ]
        assert len(outs) == len(expected)
        for (stage, name, p), out in zip(expected, outs):
            assert out["tag"] == stage and out["name"] == name, (out["name"], name)
            assert name.startswith(f"frost_sdpa_bwd_{_STAGE_TAG[stage]}_")
            assert out["entries"] == [name], out["entries"]
            assert out["target"] == [arch], out["target"]
            assert out["wgmma"] == 0, out
            if stage != "main":
                assert out["mma_sync"] == 0, out
                continue
            assert out["mma_sync"] > 0 and out["ldmatrix_x4_trans"] > 0 and out["cp_async"] > 0, out
            assert out["ex2"] > 0, out
            # dQ partials: 8-byte vector reductions where the arch has them (sm_90+), scalar on sm_80 ("red"
            # counts the scalar form only)
            if arch == "sm_80":
                assert out["red"] > 0 and out["red_v2"] == 0, out
            else:
                assert out["red_v2"] > 0 and out["red"] == 0, out
            assert (out["sem"] > 0) == uses_turns(p), out  # split copies need no turns


def test_covering_set_covers_head_dims_flags_and_families():
    others = check_head_dim_cover(COVER, HEAD_DIM_COVER, TUNED_HEAD_DIMS)
    kws = [kw for arch in COVER for kw in COVER[arch]]
    for flag in ("is_thd", "has_seqused", "has_dsinks", "deterministic", "dq_splits"):
        assert any(k.get(flag) for k in others), flag
    for flag in (
        "is_thd",
        "has_seqused",
        "has_sinks",
        "has_dsinks",
        "has_window_left",
        "has_window_right",
        "bottom_right",
        "deterministic",
    ):
        assert any(k.get(flag) for k in kws), flag
    assert {k["family"] for k in kws} == {"sm80", "sm120"}
    assert any(k["num_heads_q"] != k["num_heads_kv"] for k in kws)
    assert {k["dtype"] for k in kws} == {"bf16", "fp16"}


def test_kernel_names_are_self_describing_frost_symbols():
    import importlib

    from frost.compiler.naming import check_symbol
    from frost.engines.sm80 import sdpa_bwd

    p = Sm80BwdParams(**_p(d=128, hq=8, hk=2, is_thd=True, has_window_right=True, deterministic=True))
    names = [importlib.import_module(t).kernel_name(sp, "sm_90a") for _, t, _, sp in bwd_chain(p)]
    for n in names:
        assert check_symbol(n) == n
    assert names[1] == "frost_sdpa_bwd_main_sm80_bf16_d128_h8k2_wr_thd_det_m64n128s2w8"
    assert names[0].startswith("frost_sdpa_bwd_pre_") and names[2].startswith("frost_sdpa_bwd_post_")
    p2 = Sm80BwdParams(**_p(family="sm120", d=192, dv=128, has_sinks=True, has_dsinks=True))
    assert sdpa_bwd.kernel_name(p2, "sm_120a").startswith("frost_sdpa_bwd_main_sm120_bf16_d192v128_h4k4_dsink_")


def test_helper_kernels_are_keyed_by_the_fields_they_read():
    """Main-kernel knobs and mask flags share one preprocess / postprocess; what a helper reads splits it."""
    from frost.engines.sdpa_bwd.chain import HELPER_FIELDS

    base = _p(d=128, hq=8, hk=2, is_thd=True, has_sinks=True, has_dsinks=True)
    variants = [
        Sm80BwdParams(**base),
        Sm80BwdParams(**dict(base, has_window_right=True, has_window_left=True, bottom_right=True)),
        Sm80BwdParams(**dict(base, tile_m=128, tile_n=64, num_stages=1, fused_prefetch=True)),
        Sm80BwdParams(**dict(base, num_heads_kv=8)),
    ]
    for stage in ("preprocess", "postprocess"):
        helpers = {stage_params(v, stage) for v in variants}
        assert len(helpers) == 1, (stage, helpers)
        assert set(HELPER_FIELDS[stage]) <= set(BwdHelperParams.model_fields)
    det = Sm80BwdParams(**dict(base, deterministic=True))
    assert stage_params(det, "preprocess") != stage_params(variants[0], "preprocess")  # zeroes the semaphores
    assert stage_params(det, "postprocess") == stage_params(variants[0], "postprocess")
    assert stage_params(det, "main") is det
    # the helpers compile from their own record: the accumulator layout is their whole input contract
    dense = stage_params(Sm80BwdParams(**_p(d=64)), "postprocess")
    assert isinstance(dense, BwdHelperParams) and dense.dq_accum_blocked and dense.dq_splits == 0
    assert not stage_params(variants[0], "preprocess").dq_accum_blocked  # THD keeps rows


def test_default_knobs_fit_each_family_and_validate():
    for fam in ("sm80", "sm120"):
        for d, dv in TUNED_HEAD_DIMS + ((8, 8), (40, 40), (72, 72), (160, 160), (192, 64), (64, 256), (256, 8)):
            for dt in ("bf16", "fp16"):
                p = Sm80BwdParams(**_p(family=fam, dtype=dt, d=d, dv=dv))
                validate(p)
                assert smem_bytes(p) <= SMEM_BUDGET[fam]
    k = default_knobs("sm80", 128, 128, "bf16", smem_budget=101376)  # a 99 KB cc 8.x part
    assert smem_bytes(Sm80BwdParams(head_dim=128, head_dim_v=128, **k)) <= 101376
    assert default_knobs("sm80", 128, 128, tile_n=64)["tile_n"] == 64  # a requested knob is honored


def test_padded_head_dims_take_the_covering_rows_with_their_warps_arranged():
    # the tuned pairs keep their rows (and their kernel names)
    for d, dv in TUNED_HEAD_DIMS:
        assert candidates(d, dv) == _CANDIDATES[(d, dv)] and default_knobs("sm80", d, dv) in candidates(d, dv)
    # 72 runs on 96-wide tiles with the 96 rows first (then the larger pairs' as fallbacks); 112 with the 128 rows
    for d, tuned in ((72, 96), (112, 128)):
        assert candidates(d, d)[: len(_CANDIDATES[(tuned, tuned)])] == _CANDIDATES[(tuned, tuned)]
    # 160 columns do not split over 4 warps of 16: the dQ warps go 4 along the rows, 2 along the columns
    c160 = candidates(160, 128)
    assert c160 and all(c["dq_warps_m"] == 4 for c in c160 if c["num_warps"] == 8)
    assert sdpa_kernel_name(Sm80BwdParams(**_p(d=160, dv=128))).endswith("_m64n64s2w8qb")  # no custom-warps tag
    # the sm120 budget: 160x128 falls back to the rows of the larger tuned pairs
    p = Sm80BwdParams(**_p(family="sm120", d=160, dv=128))
    validate(p)
    assert smem_bytes(p) <= SMEM_BUDGET["sm120"]
    assert (p.tile_head_dim, p.tile_head_dim_v) == (160, 128)


@pytest.mark.parametrize(
    "bad",
    [
        dict(head_dim=84, head_dim_v=84),
        dict(head_dim=128, head_dim_v=68),
        dict(head_dim=264, head_dim_v=256),
        dict(num_heads_q=6, num_heads_kv=4),
        dict(is_thd=True, has_seqused=True),
        dict(has_dsinks=True),
        dict(num_stages=3),
        dict(num_warps=6),
        dict(sdp_warps_m=3),
        dict(tile_m=48),
        dict(tile_m=128, tile_n=128, head_dim=128, head_dim_v=128),  # smem and registers
        dict(family="sm120", head_dim=128, head_dim_v=128, tile_m=64, tile_n=128, num_stages=2),
        dict(dq_splits=2),  # split accumulator copies order a deterministic backward only
        dict(dq_splits=2, deterministic=True, is_thd=True),  # THD keeps turns
        dict(dq_splits=65, deterministic=True),
        dict(det_order="rotated", deterministic=True, has_window_right=True),  # windows narrow the rotated walks
    ],
)
def test_validator_rejects(bad):
    with pytest.raises(TemplateParamsError):
        validate(Sm80BwdParams(**bad))


def test_scratch_layout_is_closed_form_and_aligned():
    p = Sm80BwdParams(**_p(d=128, hq=8, hk=2, is_thd=True, deterministic=True, has_sinks=True, has_dsinks=True))
    lay = scratch_layout(p, batch=3, max_seqlen_q=0, max_seqlen_kv=0, total_q=1000, total_kv=900)
    assert [n for n, _, _ in lay] == ["dpsum", "dq_accum", "dq_semaphore", "dsink_partial"]
    assert dict((n, s) for n, _, s in lay)["dq_accum"] == (8, 1000, 128)
    assert dict((n, s) for n, _, s in lay)["dq_semaphore"] == (8 * (1000 // 64 + 3 + 1),)
    nbytes = scratch_bytes(p, 3, 0, 0, 1000, 900)
    assert nbytes % 256 == 0 and nbytes >= 4 * (8 * 1000 + 8 * 1000 * 128)
    # a row-layout accumulator (a backward whose params say so) keeps Sq rows
    rows = BwdHelperParams(head_dim=64, head_dim_v=64, num_heads_q=4, dq_accum_blocked=False)
    lay = scratch_layout(rows, batch=2, max_seqlen_q=300, max_seqlen_kv=500)
    assert lay == [("dpsum", "float32", (2, 4, 300)), ("dq_accum", "float32", (2, 4, 300, 64))]
    # the mma.sync one pads its rows to whole 8-row blocks (dense); THD keeps rows
    blocked = Sm80BwdParams(**_p(d=64))
    lay = dict((n, s) for n, _, s in scratch_layout(blocked, batch=2, max_seqlen_q=300, max_seqlen_kv=500))
    assert lay["dq_accum"] == (2, 4, 304, 64) and lay["dpsum"] == (2, 4, 300)
    blocked_thd = Sm80BwdParams(**_p(d=64, is_thd=True))
    lay = dict((n, s) for n, _, s in scratch_layout(blocked_thd, 2, 0, 0, total_q=1001, total_kv=900))
    assert lay["dq_accum"] == (4, 1001, 64)


def test_split_copies_replace_the_semaphores_and_multiply_the_accumulator():
    p = Sm80BwdParams(
        **_p(d=64, hq=4, hk=2, deterministic=True, has_sinks=True, has_dsinks=True, knobs=dict(dq_splits=3))
    )
    validate(p)
    lay = dict((n, s) for n, _, s in scratch_layout(p, batch=2, max_seqlen_q=300, max_seqlen_kv=500))
    assert lay["dq_accum"] == (3 * 2, 4, 304, 64) and "dq_semaphore" not in lay and "dsink_partial" in lay
    chain = {stage: names for stage, _, names, _ in bwd_chain(p)}
    assert "dq_semaphore" not in chain["preprocess"] + chain["main"]
    assert "_detsp3_" in sdpa_kernel_name(p) and not uses_turns(p)
    # the helpers that read the copies are keyed by them
    plain = Sm80BwdParams(**_p(d=64, hq=4, hk=2, deterministic=True, has_sinks=True, has_dsinks=True))
    for stage in ("preprocess", "postprocess"):
        assert stage_params(p, stage) != stage_params(plain, stage)
    # requested through the knob table like any knob
    assert default_knobs("sm80", 64, 64, dq_splits=3)["dq_splits"] == 3
    # the copies stack along the accumulator's batch mode, so the compiled call must not bind that extent to
    # the io tensors' batch (a call would be refused with a shape mismatch)
    from frost.engines.common.sdpa_entry import FakeArgs
    from frost.engines.sdpa_bwd.accum import scratch_fake

    for params, shared in ((p, False), (plain, True)):
        acc, o = FakeArgs(params, extra=scratch_fake).all(["dq_accum", "o"])
        assert (acc.shape[0] is o.shape[0]) == shared


def test_split_count_keeps_the_sms_busy_or_falls_back_to_turns():
    from frost.adapters.sm80_plan import choose_dq_splits

    # H200 (132 SMs), hidden 2048: d=64 at 4k (B=4, H=32) fills one wave with one copy; at 16k (B=1) four
    assert choose_dq_splits(132, 4, 32, 32) == 1
    assert choose_dq_splits(132, 1, 32, 128) == 4
    assert choose_dq_splits(132, 1, 16, 128) == 8  # d=128, 16k
    assert choose_dq_splits(132, 4, 16, 32) == 2  # d=128, 4k
    assert choose_dq_splits(132, 200, 1, 64) == 3  # 200 groups: 1 or 2 copies leave a wave three-quarters full
    assert choose_dq_splits(132, 1, 1, 64) == 0  # one head: 8 copies fill 6% of the SMs; turns instead
    assert choose_dq_splits(132, 1, 32, 2) == 0  # two key tiles cap the copies at 2
    # workspace: d=128 at 16k needs 8 copies of 134 MB (0.94 GB beyond the first: allowed); d=64 at 128k
    # would need 4 copies of 1.07 GB, past the 1 GiB bound, so it keeps the turns
    assert choose_dq_splits(132, 1, 16, 128, copy_bytes=16 * 16384 * 128 * 4) == 8
    assert choose_dq_splits(132, 1, 32, 1024, copy_bytes=32 * 131072 * 64 * 4) == 0


@pytest.mark.parametrize(
    "kw,splits",
    [
        (dict(b=1, hq=16, hkv=16, s=16384, d=128), 8),  # one wave of 128 CTAs on the H200's 132 SMs
        (dict(b=4, hq=32, hkv=32, s=4096, d=64), 1),
        (dict(b=1, hq=1, hkv=1, s=1024), 0),  # eight copies would busy 8 of 132 SMs: turns
        (dict(b=2, hq=4, hkv=4, s=128, thd=True), 0),  # packed chains keep turns
    ],
)
def test_deterministic_dense_plans_default_to_split_copies(kw, splits):
    from frost.adapters.sm80 import SdpaBwdDslSm80
    from frost.knobs import Knobs
    from test.cpu.test_routing import H200, declare

    det = declare(H200, direction="bwd", use_deterministic_algorithm=True, **kw)
    p = SdpaBwdDslSm80(det.facts, H200, Knobs()).template_params()
    assert p.deterministic and p.dq_splits == splits and uses_turns(p) == (splits == 0)
    plain = declare(H200, direction="bwd", **kw)
    assert SdpaBwdDslSm80(plain.facts, H200, Knobs()).template_params().dq_splits == 0


def test_dq_splits_knob_overrides_the_plan_or_declines_with_the_reason():
    import frost
    from frost.lowering.lower import rank
    from test.cpu.test_routing import H200, declare

    def sm80(g, **knobs):
        r = rank(g.facts, H200, frost.Knobs(**knobs))
        accepted = [a.template_params() for row, a in r.accepted if row.name == "SdpaBwdDslSm80"]
        return accepted[0] if accepted else dict(r.declines)["SdpaBwdDslSm80"]

    det = declare(H200, direction="bwd", use_deterministic_algorithm=True, b=1, hq=16, hkv=16, s=16384, d=128)
    assert sm80(det).dq_splits == 8
    assert sm80(det, dq_splits=3).dq_splits == 3
    turns = sm80(det, dq_splits=0)  # one accumulator of workspace: turns, in band order (128 key tiles)
    assert turns.dq_splits == 0 and uses_turns(turns) and turns.det_order == "stair"
    plain = declare(H200, direction="bwd", b=1, hq=16, hkv=16, s=1024, d=128)
    assert sm80(plain, dq_splits=0).dq_splits == 0
    assert "not deterministic" in sm80(plain, dq_splits=3)
    thd = declare(H200, direction="bwd", use_deterministic_algorithm=True, thd=True, s=1024)
    assert "packed (THD)" in sm80(thd, dq_splits=2)
    fwd = rank(declare(H200).facts, H200, frost.Knobs(dq_splits=0))
    assert "has no knob 'dq_splits'" in dict(fwd.declines)["SdpaFwdDslSm80"]


def test_rotated_turns_rank_key_tiles_by_arrival_on_the_rotated_walks():
    from frost.engines.common.turns import rotated_turn

    for n_m in range(1, 12):
        for num_n in range(1, 30):  # fewer, as many and more key tiles than query tiles
            for m in range(n_m):
                # key tile n starts at query tile n % n_m and walks upward, wrapping: it reaches m at step s
                arrivals = sorted(range(num_n), key=lambda n: ((m - n) % n_m, n))
                assert [rotated_turn(n, m, num_n, n_m) for n in arrivals] == list(range(num_n))


@pytest.mark.parametrize(
    "kw,order",
    [
        (dict(b=2, hq=4, hkv=4, s=5000, thd=True), "rotated"),  # 40 key tiles fit on half of 132 SMs at once
        (dict(b=2, hq=4, hkv=4, s=5000, thd=True, use_causal_mask=True), "stair"),  # windows keep the band order
        (dict(b=1, hq=1, hkv=1, s=32768), "stair"),  # 256 key tiles could not all be resident
        (dict(b=1, hq=1, hkv=1, s=1024), "rotated"),  # dense, too few heads for split copies
    ],
)
def test_deterministic_turn_plans_pick_the_rotated_order_where_it_is_safe(kw, order):
    from frost.adapters.sm80 import SdpaBwdDslSm80
    from frost.knobs import Knobs
    from test.cpu.test_routing import H200, declare

    g = declare(H200, direction="bwd", use_deterministic_algorithm=True, **kw)
    p = SdpaBwdDslSm80(g.facts, H200, Knobs()).template_params()
    assert uses_turns(p) and p.det_order == order
    validate(p)


def sdpa_kernel_name(p):
    from frost.engines.sm80 import sdpa_bwd

    return sdpa_bwd.kernel_name(p, "sm_90a")


@pytest.mark.parametrize("splits", range(1, 10))
def test_split_ctas_walk_every_key_tile_once_with_even_counts(splits):
    for num_n in range(1, 70):
        tiles = [[split_tile(i, s, splits) for i in range(split_tile_count(num_n, s, splits))] for s in range(splits)]
        assert sorted(t for ts in tiles for t in ts) == list(range(num_n))
        counts = [len(ts) for ts in tiles]
        assert max(counts) - min(counts) <= 1
        if num_n % (2 * splits) == 0:  # whole forward/backward round pairs: equal causal work (sum of indices)
            assert len({sum(ts) for ts in tiles}) == 1


def test_chain_argument_lists_follow_the_contract_order():
    p = Sm80BwdParams(
        **_p(
            d=128,
            hq=8,
            hk=2,
            is_thd=True,
            has_window_left=True,
            has_window_right=True,
            has_sinks=True,
            has_dsinks=True,
            deterministic=True,
        )
    )
    chain = {stage: names for stage, _, names, _ in bwd_chain(p)}
    assert chain["preprocess"] == [
        "o",
        "do",
        "lse",
        "cu_seqlens_q",
        "sinks",
        "dpsum",
        "dq_accum",
        "dq_semaphore",
        "dsink_partial",
        "stream",
    ]
    assert chain["main"] == [
        "q",
        "k",
        "v",
        "do",
        "lse",
        "dk",
        "dv",
        "cu_seqlens_q",
        "cu_seqlens_kv",
        "dpsum",
        "dq_accum",
        "dq_semaphore",
        "softmax_scale",
        "window_left",
        "window_right",
        "max_seqlen_q",
        "max_seqlen_kv",
        "stream",
    ]
    assert chain["postprocess"] == ["dq", "dsinks", "dq_accum", "dsink_partial", "softmax_scale", "stream"]
    values = {n: n for names in chain.values() for n in names}
    bound = chain_args(bwd_chain(p), values)
    assert [args for _, args in bound] == list(chain.values())
    with pytest.raises(KeyError):
        chain_args(bwd_chain(p), {})
