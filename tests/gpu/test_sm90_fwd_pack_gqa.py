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
from tests.gpu.test_sm90_fwd_kernel import (TEMPLATE, K, _hopper, _rel, run_and_check,
                                            check_nan_after_last_packed_sequence, check_nan_in_seqused_padding,
                                            check_replay_with_new_lengths, make_args, params_of)

pytestmark = pytest.mark.gpu

PACK = dict(pack_gqa=True)
S4K = 4096

CASES = [
    # r = 2, 4, 8 over Sq in {1, 7, 128, 1000} against 4k keys
    *[K(hq=4, hkv=2, b=2, sq=sq, skv=S4K, wr=0, br=True, knobs=PACK) for sq in (1, 7, 128, 1000)],
    *[K(hq=8, hkv=2, b=2, sq=sq, skv=S4K, knobs=PACK) for sq in (1, 7, 128, 1000)],
    *[K(hq=16, hkv=2, b=1, sq=sq, skv=S4K, wr=0, br=True, sinks=True, knobs=PACK) for sq in (1, 7, 128, 1000)],
    K(hq=16, hkv=2, b=2, sq=1000, skv=1000, wr=0, knobs=PACK),  # causal, top-left
    K(hq=8, hkv=2, b=2, sq=300, skv=700, wr=0, knobs=PACK),  # causal top-left, Sq < Skv
    K(hq=8, hkv=2, b=2, sq=520, skv=200, wr=0, br=True, knobs=PACK),  # bottom-right, Sq > Skv (empty rows)
    K(hq=8, hkv=2, wl=100, wr=17, sinks=True, sq=700, skv=700, knobs=PACK),
    K(hq=8, hkv=4, wl=33, br=True, sq=130, skv=260, knobs=PACK),
    K(hq=8, hkv=2, seqused=((250, 0), (300, 17)), sq=300, skv=300, wr=0, knobs=PACK),
    K(hq=16, hkv=4, lse=False, strided=True, sq=257, skv=383, knobs=PACK),
    K(hq=16, hkv=2, thd=((0, 0), (1, 1), (129, 129), (500, 500), (77, 300), (1, 4096), (7, 4096)), wr=0,
      knobs=PACK),
    K(hq=8, hkv=2, thd=((513, 513), (1, 7), (0, 3), (64, 64)), sinks=True, knobs=PACK),
    K(d=64, hq=8, hkv=4, wr=0, br=True, sq=700, skv=900, knobs=PACK),  # tile_m 192: 96 positions x 2 heads
    K(hq=32, hkv=4, sq=3, skv=S4K, knobs=dict(pack_gqa=True, tile_m=64)),  # one warpgroup, r = 8
    # 64-row tiles: what the adapter picks for decode-like shapes
    *[K(hq=32, hkv=4, b=2, sq=sq, skv=S4K, wr=0, br=True, sinks=True, knobs=dict(pack_gqa=True, tile_m=64))
      for sq in (1, 16, 100)],
    K(hq=16, hkv=2, thd=((1, 4096), (0, 5), (7, 4096), (16, 16), (100, 3000)), wr=0, br=True,
      knobs=dict(pack_gqa=True, tile_m=64)),
    K(dtype="fp16", hq=8, hkv=2, wr=0, sq=333, skv=333, knobs=PACK),
    K(d=256, hq=4, hkv=2, wr=0, sq=333, skv=333, knobs=PACK),
    K(d=192, dv=128, hq=8, hkv=2, wr=0, sq=200, skv=600, knobs=PACK),
    K(hq=64, hkv=1, sq=5, skv=2000, wr=0, br=True, knobs=PACK),  # r = 64: one position fills a warpgroup
]
# the unpacked twin of a dense case: same inputs, same params but pack_gqa off
TWINS = [c for c in CASES if c.thd is None and c.seqused is None][::3]


def _unpacked(c: K) -> K:
    return K(**{**c.__dict__, "knobs": {**c.knobs, "pack_gqa": False}})


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
    c = K(hq=16, hkv=2, thd=((0, 0), (1, 1), (129, 129), (500, 500), (77, 300), (1, 4096), (7, 4096)), wr=0,
          knobs=PACK)
    check_replay_with_new_lengths(kernels[c.id], c, [0, 300, 301, 400, 600, 708, 709, 715],
                                  [0, 400, 401, 600, 800, 930, 3000, 9122])
