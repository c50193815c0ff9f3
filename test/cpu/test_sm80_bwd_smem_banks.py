"""Shared-memory bank conflicts of the mma.sync backward's main loop, modelled on the CPU.

Traced, not run: for warp 0 of the default knobs of every tuned head dim, a few padded ones (their tiles'
head-dim extents) and each family, each ldmatrix of the
five GEMMs (its lanes' 16-byte row addresses under the swizzled smem layouts, in phases of 8 lanes)
and each 4-byte store of P and dS (32 lanes) must take the minimum number of shared-memory wavefronts.
A tile, warp arrangement or swizzle change that makes a copy conflict fails here.
"""

from __future__ import annotations

import collections

import pytest

from frost.engines.sm80.sdpa_bwd_params import Sm80BwdParams
from frost.engines.sm80.sdpa_fwd_params import TUNED_HEAD_DIMS
from test.traced_bwd import FAMILIES, PADDED_HEAD_DIMS, default_params, trace_main

pytestmark = pytest.mark.slow


def _ldsm_wavefronts(addrs) -> int:
    """Wavefronts of one ldmatrix.x4: 4 phases of 8 lanes, each reading one 16-byte row (4 banks)."""
    total = 0
    for phase in range(4):
        groups = collections.defaultdict(set)
        for a in addrs[8 * phase : 8 * phase + 8]:
            groups[(a >> 4) & 7].add(a >> 4)
        total += max(len(v) for v in groups.values())
    return total


def _sts_wavefronts(addrs) -> int:
    banks = collections.defaultdict(set)
    for a in addrs:
        banks[(a >> 2) & 31].add(a >> 2)
    return max(len(v) for v in banks.values())


def _copies(p: Sm80BwdParams) -> list:
    """(name, per-instruction lane addresses, is_store) of every smem copy of one main-loop step."""
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import warp

    out = []

    def collect(m):  # plain Python: its loops run at trace time
        dt, bm, bn, d, dv = m.dtype, m.bm, m.bn, m.d, m.dv
        ldsm = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), dt)
        ldsm_t = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), dt)
        sts = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dt, num_bits_per_copy=2 * dt.width)
        A, B = cute.make_tiled_copy_A, cute.make_tiled_copy_B
        # (name, tiled copy, smem layout, shape the GEMM sees, seen transposed?)
        specs = [
            ("S: Q", A(ldsm, m.mma_sdp), m.sQ_layout, (bm, d), False),
            ("S: K", B(ldsm, m.mma_sdp), m.sK_layout, (bn, d), False),
            ("dP: dO", A(ldsm, m.mma_sdp), m.sdO_layout, (bm, dv), False),
            ("dP: V", B(ldsm, m.mma_sdp), m.sV_layout, (bn, dv), False),
            ("dV: P^T", A(ldsm_t, m.mma_dkv), m.sPdS_layout, (bn, bm), True),
            ("dV: dO^T", B(ldsm_t, m.mma_dkv), m.sdO_layout, (dv, bm), True),
            ("dK: dS^T", A(ldsm_t, m.mma_dkv), m.sPdS_layout, (bn, bm), True),
            ("dK: Q^T", B(ldsm_t, m.mma_dkv), m.sQ_layout, (d, bm), True),
            ("dQ: dS", A(ldsm, m.mma_dq), m.sPdS_layout, (bm, bn), False),
            ("dQ: K^T", B(ldsm_t, m.mma_dq), m.sK_layout, (d, bn), True),
            ("P, dS stores", cute.make_tiled_copy_C(sts, m.mma_sdp), m.sPdS_layout, (bm, bn), False),
        ]
        for name, tiled, layout, shape, transposed in specs:
            store = name.startswith("P, dS")
            tile = cute.make_identity_tensor(shape)
            lanes = []
            for lane in range(32):
                thr = tiled.get_slice(lane)
                part = thr.partition_D(tile) if store else thr.partition_S(tile)
                per_instr = 2 if store else int(cute.size(part, mode=[0]))  # 4 bytes, or one 16-byte row
                addrs = []
                for j in range(int(cute.size(part)) // per_instr):
                    r, c = (int(x) for x in part[per_instr * j])
                    crd = (c, r) if transposed else (r, c)
                    crd = crd + (0,) if cute.rank(layout) == 3 else crd  # stage 0 of a staged tile
                    addrs.append(2 * int(cute.crd2idx(crd, layout)))
                lanes.append(addrs)
            out.append((name, [[lanes[t][j] for t in range(32)] for j in range(len(lanes[0]))], store))

    trace_main(p, collect)
    return out


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("d,dv", TUNED_HEAD_DIMS + PADDED_HEAD_DIMS)
def test_main_loop_smem_copies_are_conflict_free(family, d, dv):
    copies = _copies(default_params(family, d, dv))
    assert len(copies) == 11
    for name, instrs, store in copies:
        assert instrs, name
        for addrs in instrs:
            got = _sts_wavefronts(addrs) if store else _ldsm_wavefronts(addrs)
            assert got == (1 if store else 4), f"{name}: {got} wavefronts for lanes at {addrs}"


def test_the_model_sees_a_conflict():
    """Eight lanes of a phase on one bank group (an unswizzled 128-byte row stride) cost 8 wavefronts."""
    assert _ldsm_wavefronts([128 * i for i in range(32)]) == 32
    assert _ldsm_wavefronts([16 * i for i in range(32)]) == 4
    assert _sts_wavefronts([128 * i for i in range(32)]) == 32
    assert _sts_wavefronts([4 * i for i in range(32)]) == 1
