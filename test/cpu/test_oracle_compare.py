"""`assert_close_to_oracle`: passes rounding-level error, fails a few corrupted rows the norm check lets through."""
from __future__ import annotations

import pytest
import torch

from test import oracle


def _case(dtype):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 256, 64, generator=gen).to(dtype) for _ in range(3))
    o64, _ = oracle.attention(q, k, v, scale=64 ** -0.5)
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
