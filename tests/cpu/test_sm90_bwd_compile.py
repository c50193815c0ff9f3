"""The wgmma backward main kernel compiles for sm_90a without a GPU; its PTX holds what the design asks for.

Covering set: every head dim and tile height, fp16, every mask flag, GQA and MQA, packed THD, padding masks,
sinks and the deterministic mode. Each PTX must hold wgmma, TMA bulk-tensor loads (and stores, dense), the TMA
reduce-add of dQ, register reallocation and the frost symbol; the params validator rejects what the template
does not serve.
"""
from __future__ import annotations

import pytest

from frost.engines.sm90.sdpa_bwd_params import Sm90BwdParams, main_args, validate
from frost.errors import TemplateParamsError
from frost.engines.sdpa_bwd.chain import chain_of
from frost.testing.cases import SM90_BWD_COVER, sm90_bwd_kwargs
from tests.compile_runner import compile_groups


_p = sm90_bwd_kwargs
COVER = SM90_BWD_COVER
TEMPLATE = "frost.engines.sm90.sdpa_bwd"
PARAMS = "frost.engines.sm90.sdpa_bwd_params.Sm90BwdParams"


@pytest.mark.slow
def test_covering_set_compiles_for_sm90a(tmp_path):
    groups = [("sm_90a", [(TEMPLATE, PARAMS, kw, None) for kw in part]) for part in COVER]
    results = [r for part in compile_groups(groups, tmp_path, timeout=600) for r in part]
    for r in results:
        assert r["name"].startswith("frost_sdpa_bwd_main_sm90_"), r
        assert r["entries"] == [r["name"]], r
        assert r["target"] == ["sm_90a"], r
        assert r["wgmma_mma_async"] > 0 and r["tma"] > 0 and r["setmaxnreg"] == 2, r
        assert r["tma_reduce"] > 0, r
        assert r["local"] == 0, r
    assert len({r["name"] for r in results}) == len(results)


def test_validator_declines_what_the_template_lacks():
    for flags, word in ((dict(has_dsinks=True), "dsinks needs sinks"),
                        (dict(tile_m=80, head_dim=64, head_dim_v=64), "head_dim=128"),
                        (dict(head_dim=256, head_dim_v=256), "head dims"), (dict(tile_m=128), "registers"),
                        (dict(tile_n=64), "tile_n")):
        with pytest.raises(TemplateParamsError, match=word):
            validate(Sm90BwdParams(**{**_p(), **flags}))
    for part in COVER:
        for kw in part:
            validate(Sm90BwdParams(**kw))


def test_chain_wraps_the_main_kernel_in_the_shared_helpers_with_a_row_accumulator():
    p = Sm90BwdParams(**_p(has_window_right=True))
    stages = chain_of(p)
    assert [s[0] for s in stages] == ["preprocess", "main", "postprocess"]
    assert stages[1][1] == TEMPLATE and stages[1][2] == main_args(p)
    for _, _, _, sp in (stages[0], stages[2]):
        assert sp.dq_accum_blocked is False and sp.dq_splits == 0 and sp.family == "sm90"
    assert "window_right" in main_args(p) and "max_seqlen_kv" not in main_args(p)
    det = Sm90BwdParams(**_p(deterministic=True))
    assert main_args(det)[main_args(det).index("dq_accum") + 1] == "dq_semaphore"
    assert "dq_semaphore" in chain_of(det)[0][2]  # the preprocess zeroes the turn counters
    thd = Sm90BwdParams(**_p(is_thd=True))
    assert main_args(thd)[7:9] == ["cu_seqlens_q", "cu_seqlens_kv"] and main_args(thd)[-2] == "max_seqlen_kv"
    sinks = Sm90BwdParams(**_p(has_sinks=True, has_dsinks=True))
    assert "sinks" not in main_args(sinks) and "dsinks" in chain_of(sinks)[2][2]  # the helpers compute dSink
