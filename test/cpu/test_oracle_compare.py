"""`assert_close_to_oracle`: passes rounding-level error, fails a few corrupted rows the norm check lets through."""

from __future__ import annotations

import pytest
import torch

from test import oracle


def _case(dtype):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 256, 64, generator=gen).to(dtype) for _ in range(3))
    o64, _ = oracle.attention(q, k, v, scale=64**-0.5)
    return o64


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rounded_oracle_passes(dtype):
    o64 = _case(dtype)
    oracle.assert_close_to_oracle(o64.to(dtype), o64, rel=1e-2, name="O")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_few_corrupted_rows_fail_while_the_norm_passes(dtype):
    o64 = _case(dtype)
    out = o64.to(dtype).clone()
    out[1, 2, 17] = 0  # one row zeroed, one taken from another row: 2 of 2048 rows
    out[0, 3, 200] = out[0, 3, 5]
    assert oracle.rel_err_norm(out, o64) < 1e-1  # the norm alone would pass them at a loose tolerance
    with pytest.raises(AssertionError, match="2 rows over the bound"):
        oracle.assert_close_to_oracle(out, o64, rel=1e-1, name="O")


def test_poison_infinities_and_fp32_references_fail():
    o64 = _case(torch.bfloat16)
    out = o64.to(torch.bfloat16).clone()
    out[0, 0, 0, 0] = float("nan")
    with pytest.raises(AssertionError, match="NaN"):
        oracle.assert_close_to_oracle(out, o64, rel=1e-2)
    with pytest.raises(AssertionError, match="float64 oracle"):
        oracle.assert_close_to_oracle(o64.float(), o64.float(), rel=1e-2)
    lse = torch.tensor([float("-inf"), 1.0], dtype=torch.float64)
    with pytest.raises(AssertionError, match="infinities"):
        oracle.assert_close_to_oracle(torch.tensor([0.0, 1.0]), lse, rel=1e-2)
    oracle.assert_close_to_oracle(lse.float(), lse, rel=1e-2)


def test_the_gpu_suites_oracle_keywords_agree_with_the_reference_engine():
    """The GPU graph cases' mapping to the oracle's keywords (masks, sinks, padding, packed lengths) is right: on
    the CPU, frost's reference engine on the same graphs meets the same bounds the GPU engines must meet."""
    from test.gpu import test_sdpa_bwd_gpu as bwd
    from test.gpu import test_sdpa_fwd_gpu as fwd
    from test.gpu.graph_cases import make_fwd, oracle_fwd, oracle_grads, pack

    for case in fwd.CASES:
        g, decl, t = make_fwd(case, dev="cpu")
        g.validate().build_plans(engine="reference")
        want = oracle_fwd(case, t)
        g.execute(pack(decl, t), None)
        o, ro = t["o"], want["o"]
        rows = fwd._valid_rows(case, t)
        if rows is not None:
            o, ro = o.permute(0, 2, 1, 3)[rows], ro.permute(0, 2, 1, 3)[rows]
        oracle.assert_close_to_oracle(o, ro, rel=1e-2, name=f"{case.id} O")
        if case.stats:
            s, rs = t["stats"], want["stats"]
            if rows is not None:
                s, rs = s[..., 0].permute(0, 2, 1)[rows], rs[..., 0].permute(0, 2, 1)[rows]
            oracle.assert_close_to_oracle(s, rs, rel=2e-3, max_abs=2e-2, name=f"{case.id} Stats")
    for case in bwd.CASES[:6] + [bwd.DET_CASES[2][0]]:
        g, d, t = bwd.make_bwd(case, dev="cpu")
        g.validate().build_plans(engine="reference")
        want = oracle_grads(case, t)
        g.execute(pack(d, t), None)
        for name, ref in want.items():
            oracle.assert_close_to_oracle(
                t[name], ref, rel=2e-2, kind="grad", io_dtype=case.dtype, name=f"{case.id} {name}"
            )
