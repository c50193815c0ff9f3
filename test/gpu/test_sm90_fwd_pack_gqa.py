"""The SM90 forward with GQA heads packed into one M tile (pack_gqa), called directly, against the reference.

Packed rows are (query position, head of the group) pairs, so masks, sinks,
padding and the LSE / O stores must pick the right position and head per row.
Outputs are poisoned with NaN; decode-like shapes (Sq = 1, 7) against 4k keys
are the case packing exists for. The unpacked twin of each dense kernel runs
too: the two must agree to bf16 rounding.
"""

from __future__ import annotations

import pytest
import torch

from frost.engines.sdpa_args import CanonicalCall
from frost.testing.cases import SM90_PACK_GQA_CASES as CASES
from frost.testing.cases import SM90_PACK_GQA_TWINS as TWINS
from frost.testing.cases import Sm90Case as K
from frost.testing.cases import unpacked as _unpacked
from test.gpu.test_sm90_fwd_kernel import (
    TEMPLATE,
    _hopper,
    _rel,
    run_and_check,
    check_nan_after_last_packed_sequence,
    check_nan_in_seqused_padding,
    check_replay_with_new_lengths,
    make_args,
    params_of,
)

pytestmark = pytest.mark.gpu

PACK = dict(pack_gqa=True)


@pytest.fixture(scope="module")
def kernels():
    if not _hopper():
        pytest.skip("needs an sm_90 GPU")
    from frost.compiler.workers import compile_many

    cases = {c.id: c for c in CASES + [_unpacked(c) for c in TWINS]}
    cks = compile_many([(TEMPLATE, params_of(c)) for c in cases.values()], "sm_90a")
    return {cid: CanonicalCall(ck, params_of(c)) for (cid, c), ck in zip(cases.items(), cks)}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_packed_matches_reference(kernels, case):
    run_and_check(kernels[case.id], case)


@pytest.mark.parametrize("case", TWINS, ids=lambda c: c.id)
def test_packed_agrees_with_unpacked(kernels, case):
    args, _, _, o, lse = make_args(case, seed=5)
    kernels[case.id](*args)
    o_packed, lse_packed = o.clone(), lse.clone()
    o.fill_(float("nan"))
    lse.fill_(float("nan"))
    kernels[_unpacked(case).id](*args)
    torch.cuda.synchronize()
    assert _rel(o_packed, o) < 2e-3, f"rel diff {_rel(o_packed, o):.3e}"
    if case.lse:
        fin = torch.isfinite(lse)
        assert torch.equal(torch.isfinite(lse_packed), fin)
        assert (lse_packed[fin] - lse[fin]).abs().max().item() < 1e-3


def test_nan_in_seqused_padding_does_not_leak(kernels):
    case = K(hq=8, hkv=2, seqused=((250, 0), (300, 17)), sq=300, skv=300, wr=0, knobs=PACK)
    run = K(**{**case.__dict__, "b": 3, "seqused": ((300, 131, 7), (200, 257, 1))})  # same kernel
    check_nan_in_seqused_padding(kernels[case.id], run)


@pytest.mark.parametrize("case", [c for c in CASES if c.thd is not None], ids=lambda c: c.id)
def test_nan_after_last_packed_sequence_does_not_leak(kernels, case):
    check_nan_after_last_packed_sequence(kernels[case.id], case)


def test_graph_replay_honors_new_lengths(kernels):
    c = K(hq=16, hkv=2, thd=((0, 0), (1, 1), (129, 129), (500, 500), (77, 300), (1, 4096), (7, 4096)), wr=0, knobs=PACK)
    # every new length within the captured maxima (500 queries, 4096 keys): a longer one is capped at them
    check_replay_with_new_lengths(
        kernels[c.id], c, [0, 300, 301, 400, 600, 708, 709, 715], [0, 400, 401, 600, 800, 930, 5026, 9122]
    )
