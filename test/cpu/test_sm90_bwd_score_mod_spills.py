"""What ptxas spills in the wgmma backward's default kernels with a bias, dBias or ALiBi, compiled for sm_90a without
a GPU: nothing up to d=96 (d<=64 with a bias on 64-row steps: at 128 rows it spilled 212-476 bytes and ran 1.5-2.2x
slower, benchmarks/results/2026-12-02-h200-run17), and at d=128, where 64 rows is the smallest step, no more than
the bytes measured when these kernels were last timed (a bias's loads and dBias's fp32 adds beside dK, dV, S^T and
dP^T): a kernel that spills more has grown its live registers."""

from __future__ import annotations

import pytest

from frost.testing.cases import SM90_BWD_TEMPLATE, sm90_bwd_kwargs
from test.compile_runner import compile_groups

B90 = "frost.engines.sm90.sdpa_bwd_params.Sm90BwdParams"
ACC = dict(has_bias=True, bias_per_head=True, has_dbias=True, dbias_accum=True)  # per head: the fp32 accumulator
FULL = dict(has_bias=True, bias_per_head=True, bias_per_batch=True, has_dbias=True)  # (B, H): written directly
CAUSAL = dict(has_window_right=True)

#: (kwargs, ptxas spill bytes allowed: stores + loads)
CASES = [
    (sm90_bwd_kwargs(d=64, hq=8, hk=2, **ACC, **CAUSAL), 0),
    (sm90_bwd_kwargs(d=64, hq=8, hk=2, is_thd=True, **FULL, dbias_accum=True), 0),
    (sm90_bwd_kwargs(d=64, hq=8, hk=2, has_alibi=True, **CAUSAL), 0),  # ALiBi alone keeps 128-row steps
    (sm90_bwd_kwargs(d=96, hq=8, hk=2, is_thd=True, **ACC, **CAUSAL), 0),
    (sm90_bwd_kwargs(d=128, hq=8, hk=2, **ACC), 160),  # 72 + 84 when measured
    (sm90_bwd_kwargs(d=128, hq=8, hk=2, **FULL, **CAUSAL), 48),  # 20 + 20
    (sm90_bwd_kwargs(d=128, hq=8, hk=2, is_thd=True, **FULL, dbias_accum=True, **CAUSAL), 380),  # 184 + 192
    (sm90_bwd_kwargs(d=128, hq=8, hk=2, is_thd=True, has_alibi=True, **CAUSAL), 0),
]


@pytest.mark.slow
def test_score_mod_defaults_spill_no_more_than_measured(tmp_path):
    specs = [(SM90_BWD_TEMPLATE, B90, kw, i) for i, (kw, _) in enumerate(CASES)]
    [outs] = compile_groups([("sm_90a", specs)], tmp_path, ptxas=True)
    for out in outs:
        kw, allowed = CASES[out["tag"]]
        if out.get("ptxas") is None:
            pytest.skip("no ptxas on the PATH")
        assert out["wgmma_mma_async"] > 0 and "serialized" not in out["ptxas"], out["ptxas"]
        assert out["spill_bytes"] <= allowed, (out["name"], out["spill_bytes"], allowed)
    assert [kw["tile_m"] for kw, _ in CASES[:3]] == [64, 64, 128]
