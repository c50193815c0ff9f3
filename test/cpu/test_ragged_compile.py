"""cuDNN's ragged-offset form in the DSL templates: argument lists, params checks, fakes and launch arguments, and
the ragged specializations compiling for sm_80 and sm_90a (int32 and int64 offsets, ragged and per-batch Stats).

The kernels are frost's packed (THD) kernels with three plan-time additions: each token group's divisor of its
element offsets, the offsets' dtype, and where Stats live; frost's own packed form keeps identical IR (checked
with tools/kernel_ir.py, not here).
"""

from __future__ import annotations

import pytest
import torch

import frost
from frost.engines.params import SdpaFeatureParams
from frost.engines.sdpa_args import fwd_arg_names
from frost.engines.sdpa_bwd.chain import chain_of
from frost.engines.sdpa_bwd.scratch import scratch_layout
from frost.engines.sm80.sdpa_bwd_params import Sm80BwdParams
from frost.engines.sm80.sdpa_fwd_params import Sm80FwdParams
from frost.engines.sm90.sdpa_bwd_params import Sm90BwdParams
from frost.engines.sm90.sdpa_fwd_params import Sm90FwdParams
from frost.errors import TemplateParamsError
from frost.target import fake_target
from frost.testing import cases
from test.compile_runner import compile_groups

ragged = cases.ragged


def test_argument_lists_take_offsets_lengths_stats_offsets_and_token_envelopes():
    p = Sm80FwdParams(**cases.RAGGED_MMA_FWD_COVER["sm_80"][0])
    names = fwd_arg_names(p)
    assert names[names.index("cu_seqlens_q") : names.index("softmax_scale")] == [
        "cu_seqlens_q",
        "cu_seqlens_kv",
        "seqused_q",
        "seqused_kv",
        "lse_offsets",
    ]
    assert names[-5:] == ["max_seqlen_q", "max_seqlen_kv", "total_q", "total_kv", "stream"]
    per_batch = Sm80FwdParams(**cases.RAGGED_MMA_FWD_COVER["sm_80"][1])
    assert "lse_offsets" not in fwd_arg_names(per_batch) and per_batch.stats_per_batch
    b = Sm80BwdParams(**cases.RAGGED_MMA_BWD_COVER["sm_80"][0])
    stages = {stage: names for stage, _, names, _ in chain_of(b)}
    assert "lse_offsets" in stages["main"] and "lse_offsets" not in stages["preprocess"]
    assert all(names[-3:] == ["total_q", "total_kv", "stream"] for names in stages.values())
    # frost's own packed form keeps its lists
    assert "total_q" not in fwd_arg_names(Sm80FwdParams(is_thd=True, has_lse=True))


def test_kernel_names_tag_the_divisors_and_64_bit_offsets():
    from frost.engines.sm80.sdpa_fwd import kernel_name

    p = Sm80FwdParams(**cases.RAGGED_MMA_FWD_COVER["sm_80"][1])
    name = kernel_name(p, "sm_80")
    assert "_thd_" in name and f"rg{p.token_div_q}x{p.token_div_kv}" in name and "o64q" in name and "lsepb" in name
    helpers = {stage: sp for stage, _, _, sp in chain_of(Sm80BwdParams(**cases.RAGGED_MMA_BWD_COVER["sm_80"][0]))}
    assert helpers["preprocess"].ragged and helpers["postprocess"].token_div_lse == 8


@pytest.mark.parametrize(
    "flags, word",
    [
        (dict(token_div_q=512, token_div_kv=256), "ragged-offset form is packed"),
        (dict(is_thd=True, token_div_q=512, token_div_kv=256), "ragged-offset form is packed"),
        (dict(is_thd=True, has_seqused=True, token_div_q=512), "token stride per group"),
        (dict(is_thd=True, has_seqused=True), "dense-only padding mask"),
        (dict(stats_per_batch=True), "belong to the ragged-offset form"),
        (dict(ragged(stats="batch"), token_div_lse=4), "or per batch, not both"),
    ],
)
def test_validator_rejects_inconsistent_ragged_fields(flags, word):
    from frost.engines.params import check_sdpa_features

    with pytest.raises(TemplateParamsError, match=word):
        check_sdpa_features(SdpaFeatureParams(**flags), ((128, 128),), "P")


def test_ragged_semaphores_are_per_batch_and_head_whatever_the_placement():
    p = Sm80BwdParams(**cases.RAGGED_MMA_BWD_COVER["sm_80"][1])
    assert p.deterministic and p.ragged
    sems = dict((n, shape) for n, _, shape in scratch_layout(p, 3, 200, 300, total_q=500, total_kv=700))
    assert sems["dq_semaphore"] == (p.num_heads_q * 3 * -(-200 // p.tile_m),)
    assert sems["dq_accum"] == (p.num_heads_q, 500, p.head_dim)  # the packed envelope, as frost's own form


def test_fakes_take_the_declared_rank_and_the_offsets_dtype():
    import cutlass

    from frost.engines.common.sdpa_entry import FakeArgs

    p = Sm90FwdParams(**cases.RAGGED_SM90_FWD_COVER[1])
    f = FakeArgs(p)
    assert len(f.get("q").shape) == 4 and len(f.get("lse").shape) == 4
    assert f.get("cu_seqlens_q").element_type == cutlass.Int64
    assert f.get("cu_seqlens_kv").element_type == cutlass.Int32
    assert f.get("total_q") is not None and f.get("total_kv") is not None


def test_launch_arguments_are_the_bound_tensors_and_one_dimensional_offset_views():
    """Execute passes the declared (B, H, S, D) tensors themselves, the offsets and lengths as 1-D views of the
    bound tensors (no copies) and the token envelopes as plan-time ints."""
    from frost.adapters.dsl import LaunchArgs, ragged_totals, viewed_args
    from test.cpu.test_cudnn_vocabulary import B, H, HKV, SKV, SQ, D, _ragged

    g = _ragged(frost.Graph(target=fake_target("H200")))
    g.create_execution_plans()
    adapter = g._ranking.accepted[0][1]
    names = fwd_arg_names(adapter.template_params())
    facts = adapter.facts
    bound = {r: torch.zeros(B, H, SQ, D) for r in ("q", "o")}
    bound.update({r: torch.zeros(B, HKV, SKV, D) for r in ("k", "v")})
    bound["stats"] = torch.zeros(B, H, SQ, 1)
    bound.update({f"{r}_ragged_offset": torch.arange(B + 1).view(-1, 1, 1, 1) for r in ("q", "o", "k", "v", "stats")})
    bound.update({r: torch.ones(B, 1, 1, 1, dtype=torch.int32) for r in ("seq_len_q", "seq_len_kv")})
    per_call = {"stream": 0, **ragged_totals(facts, bound)}
    for n, role, view in viewed_args(names, facts):
        per_call[n] = view(bound[role])
    args = dict(zip(names, LaunchArgs(names, facts)(bound, per_call)))
    assert args["q"] is bound["q"] and args["lse"] is bound["stats"]
    for name, role in (
        ("cu_seqlens_q", "q_ragged_offset"),
        ("cu_seqlens_kv", "k_ragged_offset"),
        ("lse_offsets", "stats_ragged_offset"),
        ("seqused_q", "seq_len_q"),
    ):
        assert args[name].dim() == 1 and args[name].data_ptr() == bound[role].data_ptr(), name
    assert (args["total_q"], args["total_kv"], args["max_seqlen_q"]) == (B * SQ, B * SKV, SQ)


def _chain_specs(kws, params_cls):
    """Compile specs of each chain's three kernels (helpers from their own params record)."""
    helper = "frost.engines.sdpa_bwd.chain.BwdHelperParams"
    main = f"{params_cls.__module__}.{params_cls.__name__}"
    return [
        (t, main if stage == "main" else helper, sp.model_dump(), stage)
        for kw in kws
        for stage, t, _, sp in chain_of(params_cls(**kw))
    ]


@pytest.mark.slow
def test_ragged_specializations_compile_for_sm80_and_sm90a(tmp_path):
    fwd80 = f"{Sm80FwdParams.__module__}.Sm80FwdParams"
    fwd90 = f"{Sm90FwdParams.__module__}.Sm90FwdParams"
    groups = [
        (
            "sm_80",
            [(cases.SM80_FWD_TEMPLATE, fwd80, kw, "mma") for kw in cases.RAGGED_MMA_FWD_COVER["sm_80"]]
            + _chain_specs(cases.RAGGED_MMA_BWD_COVER["sm_80"], Sm80BwdParams),
        ),
        (
            "sm_90a",
            [(cases.SM80_FWD_TEMPLATE, fwd80, kw, "mma") for kw in cases.RAGGED_MMA_FWD_COVER["sm_90a"]]
            + _chain_specs(cases.RAGGED_MMA_BWD_COVER["sm_90a"], Sm80BwdParams)
            + [(cases.SM90_FWD_TEMPLATE, fwd90, kw, "wgmma") for kw in cases.RAGGED_SM90_FWD_COVER]
            + _chain_specs(cases.RAGGED_SM90_BWD_COVER, Sm90BwdParams),
        ),
    ]
    results = [r for part in compile_groups(groups, tmp_path) for r in part]
    assert len(results) == 3 + 9 + 4 + 9
    for r in results:
        assert r["entries"] == [r["name"]] and r["name"].startswith("frost_sdpa_"), r
        assert "_rg" in r["name"], r  # every kernel of a ragged plan says so
        if r["tag"] == "mma" or (r["tag"] == "main" and "_sm80_" in r["name"]):
            assert r["mma_sync"] > 0 and r["wgmma"] == 0, r
        if r["tag"] == "wgmma" or (r["tag"] == "main" and "_sm90_" in r["name"]):
            assert r["wgmma_mma_async"] > 0 and r["tma"] > 0, r
        assert r["local"] == 0, r
    assert any("o64q" in r["name"] for r in results) and any("o64" not in r["name"] for r in results)


def test_tensors_with_offsets_of_their_own_read_them_by_name():
    """cuDNN's tests give q, k, v and o an offset tensor each: the forwards take O's and V's own offsets after the
    Stats offsets, the backward's main kernel V's and the gradients' own, its preprocess O's and dO's."""
    fwd = Sm80FwdParams(**cases.RAGGED_OWN_MMA_FWD_COVER["sm_90a"][0])
    names = fwd_arg_names(fwd)
    assert names[names.index("seqused_kv") + 1 : names.index("softmax_scale")] == ["o_offsets", "v_offsets"]
    assert fwd.own_div("o") == 6 * 64 and fwd.own_div("v") == 64 and fwd.own_div("dq") == 0
    bwd = Sm80BwdParams(**cases.RAGGED_OWN_MMA_BWD_COVER["sm_90a"][0])
    stages = {stage: (names, sp) for stage, _, names, sp in chain_of(bwd)}
    assert [n for n in stages["main"][0] if n.endswith("_offsets")] == ["v_offsets", "do_offsets", "dv_offsets"]
    assert [n for n in stages["preprocess"][0] if n.endswith("_offsets")] == ["o_offsets", "do_offsets"]
    assert not any(n.endswith("_offsets") and n != "lse_offsets" for n in stages["postprocess"][0])
    assert [r for r, _, _ in stages["preprocess"][1].own_offsets] == ["o", "do"]  # its key keeps its own only


@pytest.mark.slow
def test_ragged_specializations_with_offsets_of_their_own_compile_for_sm90a(tmp_path):
    fwd80 = f"{Sm80FwdParams.__module__}.Sm80FwdParams"
    fwd90 = f"{Sm90FwdParams.__module__}.Sm90FwdParams"
    specs = (
        [(cases.SM80_FWD_TEMPLATE, fwd80, kw, "mma") for kw in cases.RAGGED_OWN_MMA_FWD_COVER["sm_90a"]]
        + _chain_specs(cases.RAGGED_OWN_MMA_BWD_COVER["sm_90a"], Sm80BwdParams)
        + [(cases.SM90_FWD_TEMPLATE, fwd90, kw, "wgmma") for kw in cases.RAGGED_OWN_SM90_FWD_COVER]
        + _chain_specs(cases.RAGGED_OWN_SM90_BWD_COVER, Sm90BwdParams)
    )
    results = [r for part in compile_groups([("sm_90a", specs[:6]), ("sm_90a", specs[6:])], tmp_path) for r in part]
    assert len(results) == 3 + 6 + 4 + 3
    for r in results:
        assert "_rg" in r["name"] and r["local"] == 0, r
    assert sum("_rgv" in r["name"] for r in results) >= 5 and any("_rgdo" in r["name"] for r in results)
    assert sum("_rgscore_max" in r["name"] for r in results) == 2  # ragged score_max from its own offsets
