"""SM90 SDPA backward main kernel: TMA loads, two wgmma warpgroups, dQ by TMA reduce-add.

One CTA per (key tile, kv head, batch), 384 threads in three warpgroups. K and V
of the tile stay in shared memory. The CTA walks every query head of its GQA
group and every query tile of the mask band in one flat loop (deterministic
without a band, `det_order="rotated"`: each head's tiles from the key tile's own
query tile, wrapping around); each MMA warpgroup owns 64 of the tile's 128 keys
and computes, per step:

    S^T  = K Q^T, dP^T = V dO^T        (wgmma, both operands in shared memory)
    P^T  = exp2(S^T * scale_log2 - LSE_log2)       (registers, masked where the band or the keys end)
    dS^T = P^T * (dP^T - dpsum)
    dV  += P^T dO, dK += dS^T Q        (wgmma with P^T / dS^T from registers)
    dS^T -> shared memory (stmatrix, transposed), then dQ = dS K split over both warpgroups

Above d=128 one warpgroup's registers cannot hold dK and dV of 64 keys, so with
tile_n = 64 (`kv_shared`) both MMA warpgroups share the tile's 64 keys: each computes
S^T / dP^T for half of the step's query columns, stores its halves of P^T and dS^T
to shared memory, and after one barrier takes half of the head-dim columns of dV,
dK and dQ with both wgmma operands in shared memory. With `dq_red` the MMA warpgroups
add their dQ values straight from registers (red.global.add.v2, rows past the
sequence skipped; deterministic turns taken by MMA thread 0 around the fenced adds)
and the dQ writer warp and the shared dQ tile are not there: at d=256 that is what
leaves room for two Q / dO stages.

Warpgroup 0 gives its registers away (setmaxnreg): warp 0 issues the TMA loads of
Q and dO into a staged mbarrier pipeline (K and V once), warp 1 adds each step's
fp32 dQ tile into the row-layout dQ accumulator with one TMA reduce-add
(`cp.reduce.async.bulk.tensor`), out of bounds rows skipped by the hardware. LSE
and dpsum are read per query column straight from global memory (LSE from its
declared strides), issued before the GEMMs they wait behind, or (`rows_warp`) staged
in shared memory two steps ahead by warp 2, whose stages change hands through named
barriers of the whole CTA or (`rows_mbar`, the default with it) an mbarrier pipeline
on which each MMA warpgroup waits on its own. dK (times scale) and dV leave through
the K / V tiles by TMA stores to their declared strides.

Score modifiers (an additive bias, ALiBi: `frost.engines.common.score_mod`): each step's
S^T is scaled and modified in registers before the mask, read through the bias's
transposed view (rows are keys), ALiBi with its slope negated (slope (j - i) with the
roles of rows and columns swapped); P then takes an exp2 factor of log2(e). dS, dQ, dK and
dV are as without them. dBias is dS^T before the scale: a full (B, H) dBias takes each step's
16-bit dS^T as it is, and the MMA threads zero its rows outside the key tile's band
(`score_mod.zero_dbias_outside_band`); a broadcast or packed one adds fp32 dS^T into the
accumulator the chain zeroes and converts (a deterministic one stores a copy per (batch entry,
head) once, summed in order by the dQ convert). Where the batch entries share that accumulator the grid puts batch
on its fastest axis (`batch_fastest`), so their adds into an element meet in L2.

K and V with different head counts (`num_heads_v`): the grid's head axis holds one CTA per walk of `walk_group`
query heads, the smallest run made of whole K groups and whole V groups. A tensor whose group is shorter than the
walk changes its tile within it: after the last step of each of its groups (every GEMM of the step completed), its
dK or dV leaves through its tile (`write_grads`, as the epilogue's does), the accumulator restarts at zero, and one
TMA load on an mbarrier of its own brings the next head's K or V tile (`swap_fine`), waited for before the next
step; a walk with no step writes zeros to every such head.

Head dims between the wgmma tiles' steps (80, 112, 72x40, ...) run on tiles padded past them
(`tile_head_dim`): the TMA loads zero-fill the columns past the head dim (zeros add nothing to any
GEMM), the TMA stores of dK / dV and the TMA reduce-add of dQ clip them, and the packed dK / dV row
stores and the dQ register adds skip them.

Lengths (packed THD through cu_seqlens, padding through seqused) are read per CTA
on the device (`seqlen_info`). TMA zero-fills only outside a tensor, so the rows
of a sequence's last query tile and last key tile that lie past its length (the
next sequence's, padding, whatever follows) are zeroed in shared memory before a
GEMM reads them; their LSE reads as +inf (P = 0), so their dS, and so their rows
of the dQ tile, are exactly zero: the reduce-add of a packed sequence's last tile
adds zeros into the next sequence's accumulator rows. Packed: the grid holds
ceil(max_seqlen_kv / 128) key tiles per sequence (the plan's envelope: a longer
sequence is not fully served), a CTA whose key tile starts past its sequence
exits at once (all its warps: nothing waits on it), and dK / dV leave by
row-predicated stores so no row of the next sequence is touched. With GQA the grid's
batch coordinate is a rank, the longest sequences first (`ranked_launch`). Sinks need
nothing here (LSE holds them; the shared helpers compute dSink). Argument list:
`main_args`.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, const_expr, pipeline
from cutlass.cute.nvgpu import cpasync, warp, warpgroup

from frost.engines.common import mask, score_mod
from frost.engines.common import tiles, turns
from frost.engines.common.acc_layout import acc_as_mn
from frost.engines.common.grid_order import block_coord, grid_extent, grid_shape
from frost.engines.common.rows import row_copy, store_rows, widen, zero_rows
from frost.engines.common.sdpa_entry import IO_DTYPES, select_modes
from frost.engines.common.seqlen import own_rows, own_token_offset, rows_offset, token_offset
from frost.engines.common.softmax import LOG2_E
from frost.engines.common.tile_scheduler import ranked_batch
from frost.engines.common import global_ops as gops
from frost.engines.sdpa_bwd.accum import packed_acc_tile
from frost.engines.sm90 import wgmma_utils as wu
from frost.engines.sm90.sdpa_bwd_params import ROWS_STAGES, Sm90BwdParams, main_args, name_suffix, validate

BAR_DS = 1  # both MMA warpgroups stored their halves of dS
BAR_DQ_EMPTY = 2  # the dQ writer's last reduce has read the dQ tile (MMA warpgroups + writer warp)
BAR_DQ_FULL = 3  # the MMA warpgroups wrote the dQ tile
BAR_EPI = 4  # epilogue: K / V tiles free, then dK / dV staged
BAR_ROWS_FULL = 5  # (and 6) the rows warp staged a step's LSE / dpsum rows in that half (`rows_warp`)
BAR_ROWS_FREE = 7  # (and 8) the MMA warpgroups have read that half
MMA_THREADS = 256


@cute.jit
def rows_barrier(first_id: cutlass.Constexpr[int], stage: Int32, arrive: cutlass.Constexpr[bool]):
    """Sync on (or arrive at) the rows barrier of a staged half, between the MMA warpgroups and the rows warp;
    the barrier ids stay constants (a computed id makes ptxas reserve every barrier of the CTA)."""
    n = MMA_THREADS + 32
    if stage == 0:
        if const_expr(arrive):
            cute.arch.barrier_arrive(barrier_id=first_id, number_of_threads=n)
        else:
            cute.arch.barrier(barrier_id=first_id, number_of_threads=n)
    else:
        if const_expr(arrive):
            cute.arch.barrier_arrive(barrier_id=first_id + 1, number_of_threads=n)
        else:
            cute.arch.barrier(barrier_id=first_id + 1, number_of_threads=n)


class Walk(NamedTuple):
    """One CTA's work, made once: its key tile and heads, the query tiles it visits and the mask band."""

    n_block: Int32
    head_kv: Int32  # the CTA's walk of query heads (its kv head where K and V heads match)
    batch: Int32
    m_min: Int32  # first query tile of the band
    n_m: Int32  # query tiles per query head
    steps: Int32  # n_m times the query heads of the group
    band: tiles.Band  # the mask band, its windows clamped
    seqlen_q: Int32
    seqlen_k: Int32
    off_q: object  # first query / key token of the sequence (Int32), or None without lengths (dense rows)
    off_k: object
    off_lse: object  # first LSE row of the sequence: ragged Stats' own offsets, else off_q
    n_k: object = None  # rotated order (`det_order`): the sequence's key tiles (Int32), else None
    rot: object = None  # rotated order: the walk's first query tile (0 where the sequence's key tiles do not
    # all fit on the SMs: the stair order), else None


class Globals(NamedTuple):
    """The CTA's global tensors as the roles read them: the io tensors (V and dO rebased for the ragged form), the
    dQ accumulator, the LSE / dpsum rows, the turn counters, dK / dV's key offsets and packed row views."""

    mQ: cute.Tensor
    mK: cute.Tensor
    mV: cute.Tensor
    mdO: cute.Tensor
    mdK: cute.Tensor
    mdV: cute.Tensor
    mAcc: cute.Tensor
    mLSE: cute.Tensor
    mdPsum: cute.Tensor
    mSem: object
    key_offsets: tuple
    mdK_rows: object
    mdV_rows: object


class Smem(NamedTuple):
    """The CTA's shared tiles: the staged LSE / dpsum rows (halves and their pipeline), Q, K, V, dO, dS (and P^T
    with shared keys, else None), the dQ tile."""

    rows: tuple
    sQ: cute.Tensor
    sK: cute.Tensor
    sV: cute.Tensor
    sdO: cute.Tensor
    sdS: cute.Tensor
    sP: object
    sdQ: cute.Tensor


class Tma(NamedTuple):
    """The TMA atoms of the loads (Q, K, V, dO) and stores (dK, dV, dQ; None where that path does not use TMA)."""

    q: cute.CopyAtom
    k: cute.CopyAtom
    v: cute.CopyAtom
    do: cute.CopyAtom
    dk: object
    dv: object
    dq: object


class Gemms(NamedTuple):
    """The step's pipelines (Q, dO, K / V) and tiled MMAs (S^T and dP^T, dK, dV, dQ)."""

    pipe_q: object
    pipe_do: object
    pipe_kv: object
    sdp: cute.TiledMma
    dk: cute.TiledMma
    dv: cute.TiledMma
    dq: cute.TiledMma


class Operands(NamedTuple):
    """What every step's GEMMs read and write, made once per walk (`mma`): the wgmma fragments of S^T, dP^T, dV,
    dK and dQ, the dS^T (and P^T) stores, dQ's destination (shared tile, or its coordinates for register adds),
    the coordinates of this thread's S^T values, the MMA thread's slice and the S^T columns per thread."""

    tSrK: cute.Tensor
    tSrQ: cute.Tensor
    tPrV: cute.Tensor
    tPrdO: cute.Tensor
    tdVrdOt: cute.Tensor
    tdKrQt: cute.Tensor
    tdQrKt: cute.Tensor
    tdQrdS: cute.Tensor
    tdVrP: cute.Tensor
    tdKrdS: cute.Tensor
    r2s_ds: cute.TiledCopy
    tRsdS: cute.Tensor
    tRsP: object
    tdQsdQ: object
    tdQcdQ: object
    tScS_mn: cute.Tensor
    t0ScS_mn: cute.Tensor
    thr_sdp: object
    n_cols: int


class Rows(NamedTuple):
    """The staged LSE / dpsum rows: global sources, shared halves (one per step parity), this thread."""

    mLSE: cute.Tensor
    mdPsum: cute.Tensor
    sLSE: cute.Tensor
    sdPsum: cute.Tensor
    tidx: Int32


class GradOut(NamedTuple):
    """Where dK and dV go (`write_grads`): the accumulators, the destinations (TMA tensors, and the packed rows with
    their offsets), the K / V tiles they are staged through, the GEMMs whose fragments they are, dK's scale."""

    acc_dK: cute.Tensor
    acc_dV: cute.Tensor
    mdK: cute.Tensor
    mdV: cute.Tensor
    key_offsets: tuple
    mdK_rows: object
    mdV_rows: object
    sK: cute.Tensor
    sV: cute.Tensor
    tma_atom_dk: cute.CopyAtom
    tma_atom_dv: cute.CopyAtom
    mma_dk: cute.TiledMma
    mma_dv: cute.TiledMma
    scale: Float32


class Fine(NamedTuple):
    """What reloads a K or V tile within the walk (K and V heads apart, `swap_fine`): the sources, their TMA atoms,
    the mbarrier the reload completes on."""

    mK: cute.Tensor
    mV: cute.Tensor
    tma_atom_k: cute.CopyAtom
    tma_atom_v: cute.CopyAtom
    mbar: object


def kernel_name(params: Sm90BwdParams, arch: str) -> str:
    return f"frost_sdpa_bwd_main_{name_suffix(params)}"


class SdpaBwdSm90:
    """One compiled specialization; `launch` is the jit body taking the main arguments by name."""

    def __init__(self, p: Sm90BwdParams):
        validate(p)
        self.p = p
        self.dtype = IO_DTYPES[p.dtype]
        self.bm, self.bn = p.tile_m, p.tile_n
        self.d, self.dv = p.tile_head_dim, p.tile_head_dim_v  # the tiles' head dims (padded: see HEAD_DIMS)
        self.stages = p.num_stages
        self.group = p.walk_group  # query heads a CTA walks (Hq / Hkv unless K and V heads differ)
        # K's / V's tile changes within the walk (K and V heads apart: its group is shorter than the walk)
        self.fine_k, self.fine_v = p.walk_heads_k > 1, p.walk_heads_v > 1
        self.split_m = p.dq_split_m
        self.swap_dq = p.dq_swap
        self.frag = p.dq_fragments
        self.red = p.dq_red
        self.shared_keys = p.kv_shared
        self.dk_first = p.dk_first_order
        self.rows_warp = p.rows_warp
        self.rows_mbar = p.rows_mbar  # the staged rows change hands through mbarriers (else named barriers)
        self.rotated = p.rotated
        self.num_threads = MMA_THREADS + 128
        self.lengths = p.is_thd or p.has_seqused  # per-sequence lengths (and packed offsets) from the device

    # ------------------------------------------------------------------ host side
    @cute.jit
    def launch(self, a: dict):
        p = self.p
        dt = self.dtype
        bm, bn, d, dv, st = self.bm, self.bn, self.d, self.dv, self.stages
        # kernel views: (seq, d, head[, batch]) for Q/K/V/dO/dK/dV and the accumulator, (seq, head[, batch]) rows
        thd = const_expr(p.is_thd)
        io = [0, 2, 1] if const_expr(thd) else [1, 3, 2, 0]
        mQ, mK, mV, mdO, mdK, mdV = [select_modes(a[n], io) for n in ("q", "k", "v", "do", "dk", "dv")]
        mLSE = select_modes(a["lse"], [1, 0] if const_expr(thd) else [2, 1, 0])
        mdPsum = select_modes(a["dpsum"], [1, 0] if const_expr(thd) else [2, 1, 0])
        if const_expr(p.stats_per_batch):  # the ragged form's per-batch Stats: read as a dense batch's
            mLSE = select_modes(a["lse"], [2, 1, 0])
        mAcc = select_modes(a["dq_accum"], [1, 2, 0] if const_expr(thd) else [2, 3, 1, 0])

        K = cute.nvgpu.OperandMajorMode.K
        MN = cute.nvgpu.OperandMajorMode.MN
        RMEM = warpgroup.OperandSource.RMEM
        if const_expr(self.shared_keys):  # the warpgroups split query columns, then head-dim columns
            mma_sdp = sm90_utils.make_trivial_tiled_mma(dt, dt, K, K, Float32, (1, 2, 1), (64, bm // 2))
            mma_dk = sm90_utils.make_trivial_tiled_mma(dt, dt, MN, MN, Float32, (1, 2, 1), (64, d // 2))
            mma_dv = sm90_utils.make_trivial_tiled_mma(dt, dt, MN, MN, Float32, (1, 2, 1), (64, dv // 2))
        else:
            mma_sdp = sm90_utils.make_trivial_tiled_mma(dt, dt, K, K, Float32, (2, 1, 1), (64, bm))
            mma_dk = sm90_utils.make_trivial_tiled_mma(dt, dt, K, MN, Float32, (2, 1, 1), (64, d), RMEM)
            mma_dv = sm90_utils.make_trivial_tiled_mma(dt, dt, K, MN, Float32, (2, 1, 1), (64, dv), RMEM)
        if const_expr(self.swap_dq):  # dQ^T = K^T dS^T: head-dim rows over the warpgroups, any tile_m
            mma_dq = sm90_utils.make_trivial_tiled_mma(dt, dt, MN, K, Float32, (2, 1, 1), (64, bm))
        elif const_expr(self.split_m):
            mma_dq = sm90_utils.make_trivial_tiled_mma(dt, dt, K, MN, Float32, (2, 1, 1), (64, d))
        else:
            mma_dq = sm90_utils.make_trivial_tiled_mma(dt, dt, K, MN, Float32, (1, 2, 1), (64, d // 2))

        # K is also dQ's B operand (head-dim major), split in halves over the warpgroups when tile_m = 64
        k_major = d if const_expr(self.split_m) else d // 2
        # Q and dO are also dK's / dV's B operands (head-dim major), split in halves when the warpgroups share keys,
        # and so are the K / V tiles dK and dV leave through (a half of 80 columns must not cut a swizzle atom)
        q_major, do_major = (d // 2, dv // 2) if const_expr(self.shared_keys) else (d, dv)
        sQ_layout = cute.tile_to_shape(wu.smem_atom(dt, q_major), (bm, d, st), order=(0, 1, 2))
        sdO_layout = cute.tile_to_shape(wu.smem_atom(dt, do_major), (bm, dv, st), order=(0, 1, 2))
        sK_layout = cute.tile_to_shape(wu.smem_atom(dt, k_major), (bn, d), order=(0, 1))
        sV_layout = cute.tile_to_shape(wu.smem_atom(dt, do_major), (bn, dv), order=(0, 1))
        sdS_layout = cute.tile_to_shape(wu.smem_atom(dt, bn), (bm, bn, 2), order=(0, 1, 2))
        sdQ_layout = cute.tile_to_shape(wu.smem_atom(Float32, k_major), (bm, d), order=(0, 1))

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        s2g = cpasync.CopyBulkTensorTileS2GOp()
        tma_atom_q, tma_q = cpasync.make_tiled_tma_atom(g2s, mQ, cute.select(sQ_layout, mode=[0, 1]), (bm, d))
        tma_atom_do, tma_do = cpasync.make_tiled_tma_atom(g2s, mdO, cute.select(sdO_layout, mode=[0, 1]), (bm, dv))
        tma_atom_k, tma_k = cpasync.make_tiled_tma_atom(g2s, mK, sK_layout, (bn, d))
        tma_atom_v, tma_v = cpasync.make_tiled_tma_atom(g2s, mV, sV_layout, (bn, dv))
        tma_atom_dk, tma_dk = cpasync.make_tiled_tma_atom(s2g, mdK, sK_layout, (bn, d))
        tma_atom_dv, tma_dv = cpasync.make_tiled_tma_atom(s2g, mdV, sV_layout, (bn, dv))
        if const_expr(self.frag or self.red):  # a bulk reduce of a flat tile, or reds: no tensor map
            tma_atom_dq, acc = None, mAcc
        else:
            tma_atom_dq, acc = cpasync.make_tiled_tma_atom(
                cpasync.CopyReduceBulkTensorTileS2GOp(), mAcc, sdQ_layout, (bm, d)
            )
        q_bytes = cute.size_in_bytes(dt, cute.select(sQ_layout, mode=[0, 1]))
        do_bytes = cute.size_in_bytes(dt, cute.select(sdO_layout, mode=[0, 1]))
        kv_bytes = cute.size_in_bytes(dt, sK_layout) + cute.size_in_bytes(dt, sV_layout)

        SharedStorage = self.shared_storage(sQ_layout, sdO_layout, sK_layout, sV_layout, sdS_layout, sdQ_layout)

        scale = Float32(a["softmax_scale"])
        if const_expr(thd):  # the key tiles of the longest sequence the plan declares, per sequence
            n_blocks = cutlass.max((Int32(a["max_seqlen_kv"]) + bn - 1) // bn, 1)
            n_batch = a["cu_seqlens_q"].shape[0] - 1
        else:
            n_blocks = cutlass.max((mK.shape[0] + bn - 1) // bn, 1)
            n_batch = mQ.shape[3]
        maxima = (None, None)  # the packed form's envelopes, each length is capped at
        if const_expr(thd):
            maxima = (a["max_seqlen_q"], a["max_seqlen_kv"])
        self.kernel(
            tma_q,
            tma_k,
            tma_v,
            tma_do,
            tma_dk,
            tma_dv,
            acc,
            mLSE,
            mdPsum,
            a.get("dq_semaphore"),
            a.get("cu_seqlens_q"),
            a.get("cu_seqlens_kv"),
            a.get("seqused_q"),
            a.get("seqused_kv"),
            maxima,
            mdK if const_expr(thd) else None,
            mdV if const_expr(thd) else None,
            a.get("lse_offsets"),
            (a.get("v_offsets"), a.get("do_offsets"), a.get("dk_offsets"), a.get("dv_offsets")),
            tma_atom_q,
            tma_atom_k,
            tma_atom_v,
            tma_atom_do,
            tma_atom_dk,
            tma_atom_dv,
            tma_atom_dq,
            (scale, a.get("bias"), a.get("dbias"), a.get("dbias_accum")),
            a.get("window_left"),
            a.get("window_right"),
            q_bytes,
            do_bytes,
            kv_bytes,
            sQ_layout,
            sdO_layout,
            sK_layout,
            sV_layout,
            sdS_layout,
            sdQ_layout,
            mma_sdp,
            mma_dk,
            mma_dv,
            mma_dq,
            SharedStorage,
        ).launch(
            grid=grid_shape(p.grid_order, n_blocks, p.kv_grid_heads, n_batch),
            block=[self.num_threads, 1, 1],
            stream=a["stream"],
            min_blocks_per_mp=1,
            use_pdl=p.pdl,
        )

    def shared_storage(self, sQ_layout, sdO_layout, sK_layout, sV_layout, sdS_layout, sdQ_layout):
        """The kernel's shared memory struct; P^T's tiles (`sP`) only when the warpgroups share the keys, the
        dQ tile only when dQ leaves through shared memory (a 16-byte stand-in otherwise)."""
        dt, st, bm = self.dtype, self.stages, self.bm
        mem, align = cute.struct.MemRange, cute.struct.Align
        fields = dict(
            mbar_q=mem[cutlass.Int64, 2 * st], mbar_do=mem[cutlass.Int64, 2 * st], mbar_kv=mem[cutlass.Int64, 2]
        )
        for name, layout in (
            ("sQ", sQ_layout),
            ("sdO", sdO_layout),
            ("sK", sK_layout),
            ("sV", sV_layout),
            ("sdS", sdS_layout),
        ) + ((("sP", sdS_layout),) if self.shared_keys else ()):
            fields[name] = align[mem[dt, cute.cosize(layout)], 1024]
        fields["sdQ"] = align[mem[Float32, 4 if self.red else cute.cosize(sdQ_layout)], 1024]
        fields["sLSE"] = align[mem[Float32, ROWS_STAGES * bm], 128]
        fields["sdPsum"] = align[mem[Float32, ROWS_STAGES * bm], 128]
        if self.rows_mbar:
            fields["mbar_rows"] = mem[cutlass.Int64, 2 * ROWS_STAGES]  # full and free per stage
        if self.fine_k or self.fine_v:
            fields["mbar_fine"] = mem[cutlass.Int64, 1]  # a K or V tile reloaded within the walk (`swap_fine`)
        return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mdO: cute.Tensor,
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        mAcc: cute.Tensor,
        mLSE: cute.Tensor,
        mdPsum: cute.Tensor,
        mSem,
        mCuQ,
        mCuK,
        mUsedQ,
        mUsedK,
        maxima,
        mdK_rows,
        mdV_rows,
        mLseOff,
        mOwnOff,
        tma_atom_q: cute.CopyAtom,
        tma_atom_k: cute.CopyAtom,
        tma_atom_v: cute.CopyAtom,
        tma_atom_do: cute.CopyAtom,
        tma_atom_dk: cute.CopyAtom,
        tma_atom_dv: cute.CopyAtom,
        tma_atom_dq,
        score_args,
        wl,
        wr,
        q_bytes: cutlass.Constexpr,
        do_bytes: cutlass.Constexpr,
        kv_bytes: cutlass.Constexpr,
        sQ_layout: cute.ComposedLayout,
        sdO_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sdS_layout: cute.ComposedLayout,
        sdQ_layout: cute.ComposedLayout,
        mma_sdp: cute.TiledMma,
        mma_dk: cute.TiledMma,
        mma_dv: cute.TiledMma,
        mma_dq: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            for atom in (tma_atom_q, tma_atom_k, tma_atom_v, tma_atom_do, tma_atom_dk, tma_atom_dv, tma_atom_dq):
                if const_expr(atom is not None):
                    cpasync.prefetch_descriptor(atom)
        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        pipe_q, pipe_do, pipe_kv = wu.tma_pipelines(
            MMA_THREADS,
            (storage.mbar_q.data_ptr(), self.stages, q_bytes),
            (storage.mbar_do.data_ptr(), self.stages, do_bytes),
            (storage.mbar_kv.data_ptr(), 1, kv_bytes),
        )
        pipe_rows = None
        if const_expr(self.rows_mbar):  # the rows warp's 32 lanes fill a stage, the 256 MMA threads free it
            pipe_rows = pipeline.PipelineAsync.create(
                num_stages=ROWS_STAGES,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 32),
                consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, MMA_THREADS),
                barrier_storage=storage.mbar_rows.data_ptr(),
                defer_sync=True,
            )
        mbar_fine = None
        if const_expr(self.fine_k or self.fine_v):
            mbar_fine = storage.mbar_fine.data_ptr()
            if warp_idx == 0:
                if cute.arch.lane_idx() == 0:
                    cute.arch.mbarrier_init(mbar_fine, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sdO = storage.sdO.get_tensor(sdO_layout.outer, swizzle=sdO_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sdS = storage.sdS.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner)
        sP = None
        if const_expr(self.shared_keys):  # P^T's tiles, laid out as dS^T's
            sP = storage.sP.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner)
        if const_expr(self.frag):  # a flat tile (fragment order), added by one bulk reduce
            sdQ = storage.sdQ.get_tensor(cute.make_layout(self.bm * self.d))
        else:
            sdQ = storage.sdQ.get_tensor(sdQ_layout.outer, swizzle=sdQ_layout.inner)
        rows2 = cute.make_layout((self.bm, ROWS_STAGES))
        sRows = (storage.sLSE.get_tensor(rows2), storage.sdPsum.get_tensor(rows2), pipe_rows)

        bx, head_kv, batch = (block_coord(self.p.grid_order, a) for a in ("key", "head", "batch"))
        if const_expr(self.p.ranked_launch):  # the longest sequences first
            batch = ranked_batch(batch, grid_extent(self.p.grid_order, "batch"), mCuQ, mUsedQ, mQ.shape[0])
        n_block = self.key_tile(bx)
        seqlen_q, seqlen_k, off_q, off_k = mQ.shape[0], mK.shape[0], None, None
        if const_expr(self.lengths):
            max_q, turn_rows = maxima[0], self.ragged_turn_rows(mSem)
            if const_expr(turn_rows is not None):
                max_q = cutlass.min(max_q, turn_rows)
            seq = tiles.sequence(
                self.p, batch, mQ.shape[0], mK.shape[0], (mCuQ, mCuK, mUsedQ, mUsedK), max_q, maxima[1]
            )
            off_q, off_k, seqlen_q, seqlen_k = seq.offset_q, seq.offset_k, seq.seqlen_q, seq.seqlen_k
        off_lse = off_q
        if const_expr(mLseOff is not None):
            off_lse = rows_offset(mLseOff, batch, self.p.token_div_lse, seqlen_q, mQ.shape[0])
        # the ragged form's V and dO with offsets of their own, rebased onto their group leader's (k's, q's) and
        # clamped so the sequence's rows fit; dK's and dV's are read at the epilogue
        mV = own_rows(self.p, "v", mV, mOwnOff[0], batch, off_k, seqlen_k, mK.shape[0])
        mdO = own_rows(self.p, "do", mdO, mOwnOff[1], batch, off_q, seqlen_q, mQ.shape[0])
        key_offsets = (mCuK, mOwnOff[2], mOwnOff[3])
        walk = self.walk(n_block, head_kv, batch, seqlen_q, seqlen_k, wl, wr, off_q, off_k, off_lse)
        fine = None  # what a K or V tile reloaded within the walk needs (`swap_fine`)
        if const_expr(self.fine_k or self.fine_v):
            fine = Fine(mK, mV, tma_atom_k, tma_atom_v, mbar_fine)
        args = (
            Globals(mQ, mK, mV, mdO, mdK, mdV, mAcc, mLSE, mdPsum, mSem, key_offsets, mdK_rows, mdV_rows),
            Smem(sRows, sQ, sK, sV, sdO, sdS, sP, sdQ),
            Tma(tma_atom_q, tma_atom_k, tma_atom_v, tma_atom_do, tma_atom_dk, tma_atom_dv, tma_atom_dq),
            Gemms(pipe_q, pipe_do, pipe_kv, mma_sdp, mma_dk, mma_dv, mma_dq),
            score_args,
            fine,
            walk,
        )
        if const_expr(self.p.is_thd):
            # a key tile past its sequence's keys owns no dK / dV rows and visits no query tile: every warp
            # of the CTA leaves at once, so none waits on another
            if n_block * self.bn < walk.seqlen_k:
                self.roles(warp_idx, *args)
        else:
            self.roles(warp_idx, *args)

    @cute.jit
    def roles(self, warp_idx, g: Globals, s: Smem, tma: Tma, gemms: Gemms, score_args, fine, walk: Walk):
        """The warp roles: warp 0 loads, warp 1 adds dQ (unless the MMA warpgroups add it from registers), warp 2
        stages the LSE / dpsum rows (`rows_warp`), the MMA warpgroups compute; all walk `walk`."""
        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(24)  # warpgroup-wide: before any warp waits below
            if const_expr(self.p.pdl):
                # launched as a programmatic dependent, the preprocess may still run: every role but the loads
                # (Q, dO, K, V, which it only reads) waits for it before touching dpsum, the dQ accumulator or
                # the turns
                if warp_idx != 0:
                    cute.arch.griddepcontrol_wait()
            if warp_idx == 0:
                self.load(g, s, tma, gemms, walk)
            if const_expr(not self.red):
                if warp_idx == 1:
                    self.store_dq(g.mAcc, g.mSem, s.sdQ, tma.dq, walk)
            if const_expr(self.rows_warp):
                if warp_idx == 2:
                    self.load_rows_warp(g.mLSE, g.mdPsum, s.rows, walk)
        else:
            cute.arch.setmaxregister_increase(240)
            if const_expr(self.p.pdl):
                cute.arch.griddepcontrol_wait()
            self.mma(g, s, tma, gemms, score_args, fine, walk)

    def seq_rows(self, mX, head, w: Walk, offset):
        """The (seq, dim) rows of one head of the CTA's batch entry (packed: from the sequence's first token)."""
        if self.p.is_thd:
            return cute.domain_offset((offset, 0), mX[None, None, head])
        return mX[None, None, head, w.batch]

    def row_value(self, mX, row, head, w: Walk, lse: bool = False):
        """One value of a (seq, head[, batch]) row vector (LSE, dpsum) at a row of the CTA's sequence (`lse`:
        the ragged form's Stats, from their own offsets or per batch)."""
        if lse and self.p.stats_per_batch:
            return mX[row, head, w.batch]
        if lse and self.p.token_div_lse:
            return mX[w.off_lse + row, head]
        if self.p.is_thd:
            return mX[w.off_q + row, head]
        return mX[row, head, w.batch]

    @cute.jit
    def walk(
        self,
        n_block: Int32,
        head_kv: Int32,
        batch: Int32,
        seqlen_q: Int32,
        seqlen_k: Int32,
        wl,
        wr,
        off_q,
        off_k,
        off_lse=None,
    ):
        """The CTA's `Walk`: the query tiles of its key tile's band, over every query head of its group."""
        p = self.p
        band = tiles.band(
            seqlen_q,
            seqlen_k,
            wl if const_expr(p.has_window_left) else None,
            wr if const_expr(p.has_window_right) else None,
            p.bottom_right,
            True,
        )
        m_min, m_max = mask.m_block_range(
            n_block, self.bm, self.bn, seqlen_q, seqlen_k, band.diag, band.window_left, band.window_right
        )
        n_m = cutlass.max(m_max - m_min, 0)
        n_k, rot = None, None
        if const_expr(self.rotated):
            n_k, rot = self.rotation(n_block, n_m, seqlen_k)
        return Walk(
            n_block,
            head_kv,
            batch,
            m_min,
            n_m,
            n_m * self.group,
            band,
            seqlen_q,
            seqlen_k,
            off_q,
            off_k,
            off_lse,
            n_k,
            rot,
        )

    @cute.jit
    def rotation(self, n_block: Int32, n_m: Int32, seqlen_k: Int32):
        """The rotated order's (key tiles, first query tile of the walk): key tile n starts at query tile
        n mod M, so the walks' first adds land on different tiles; 0 (the stair order) where the sequence's key
        tiles fail the turns' safety rule (`turns.rotation_fits`: a rotated turn waits on later-launched key
        tiles)."""
        n_k = (seqlen_k + self.bn - 1) // self.bn
        rot = Int32(0)
        if turns.rotation_fits(n_k, self.p.sm_count):
            rot = n_block % cutlass.max(n_m, 1)
        return n_k, rot

    @cute.jit
    def step_tile(self, t: Int32, w: Walk):
        """Step t of the flat loop -> (query head, query tile): heads of the group outer, tiles inner (rotated
        order: each head's tiles from the walk's first, `Walk.rot`, wrapping around). Every role walks this."""
        head = w.head_kv * self.group + t // w.n_m
        i = t % w.n_m
        if const_expr(self.rotated):
            i = i + w.rot
            if i >= w.n_m:
                i = i - w.n_m
        return head, w.m_min + i

    def kv_head(self, w: Walk, offset, is_v: bool):
        """K's (V's with `is_v`) head of the walk's query head `offset` (from its first): the CTA's kv head where K
        and V heads match."""
        if const_expr(not (self.fine_k or self.fine_v)):
            return w.head_kv
        return (w.head_kv * self.group + offset) // (self.p.qhead_per_vhead if is_v else self.p.qhead_per_kvhead)

    # --- producer warp: K / V once, then Q and dO per step
    @cute.jit
    def load(self, g: Globals, s: Smem, tma: Tma, gemms: Gemms, w: Walk):
        """The producer warp: the K and V tiles once, then Q and dO of every step of the walk."""
        mQ, mK, mV, mdO = g.mQ, g.mK, g.mV, g.mdO
        sQ, sK, sV, sdO = s.sQ, s.sK, s.sV, s.sdO
        tma_atom_q, tma_atom_k, tma_atom_v, tma_atom_do = tma.q, tma.k, tma.v, tma.do
        pipe_q, pipe_do, pipe_kv = gemms.pipe_q, gemms.pipe_do, gemms.pipe_kv
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        pipe_kv.producer_acquire(kv_state)
        bar = pipe_kv.producer_get_barrier(kv_state)
        self.load_kv_tile(tma_atom_k, mK, sK, self.d, self.kv_head(w, 0, False), w, bar)
        self.load_kv_tile(tma_atom_v, mV, sV, self.dv, self.kv_head(w, 0, True), w, bar)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        for t in cutlass.range(w.steps, unroll=1):
            head, m_block = self.step_tile(t, w)
            gQ = cute.local_tile(self.seq_rows(mQ, head, w, w.off_q), (self.bm, self.d), (m_block, 0))
            gdO = cute.local_tile(self.seq_rows(mdO, head, w, w.off_q), (self.bm, self.dv), (m_block, 0))
            tQsQ, tQgQ = cpasync.tma_partition(
                tma_atom_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2)
            )
            tOsdO, tOgdO = cpasync.tma_partition(
                tma_atom_do, 0, cute.make_layout(1), cute.group_modes(sdO, 0, 2), cute.group_modes(gdO, 0, 2)
            )
            pipe_q.producer_acquire(state)
            cute.copy(tma_atom_q, tQgQ, tQsQ[None, state.index], tma_bar_ptr=pipe_q.producer_get_barrier(state))
            pipe_do.producer_acquire(state)
            cute.copy(tma_atom_do, tOgdO, tOsdO[None, state.index], tma_bar_ptr=pipe_do.producer_get_barrier(state))
            state.advance()

    @cute.jit
    def load_kv_tile(
        self,
        atom: cute.CopyAtom,
        mX: cute.Tensor,
        sX: cute.Tensor,
        width: cutlass.Constexpr[int],
        head: Int32,
        w: Walk,
        bar,
    ):
        """One TMA load of the CTA's (tile_n, width) K or V tile of head `head` into sX, completing on `bar`."""
        gX = cute.local_tile(self.seq_rows(mX, head, w, w.off_k), (self.bn, width), (w.n_block, 0))
        tXsX, tXgX = cpasync.tma_partition(
            atom, 0, cute.make_layout(1), cute.group_modes(sX, 0, 2), cute.group_modes(gX, 0, 2)
        )
        cute.copy(atom, tXgX, tXsX, tma_bar_ptr=bar)

    # --- dQ writer warp: one TMA reduce-add of each step's fp32 dQ tile
    @cute.jit
    def store_dq(self, mAcc, mSem, sdQ, tma_atom_dq, w: Walk):
        """Deterministic: each (head, query tile) takes its key tiles' adds in a fixed order (`turn`); lane 0
        (the lane TMA elects) waits for its turn, and passes it on once its add has completed."""
        lane = cute.arch.lane_idx()
        for t in cutlass.range(w.steps, unroll=1):
            head, m_block = self.step_tile(t, w)
            if const_expr(not self.frag):
                gAcc = cute.local_tile(self.seq_rows(mAcc, head, w, w.off_q), (self.bm, self.d), (m_block, 0))
                tDsdQ, tDgAcc = cpasync.tma_partition(
                    tma_atom_dq, 0, cute.make_layout(1), cute.group_modes(sdQ, 0, 2), cute.group_modes(gAcc, 0, 2)
                )
            cute.arch.cp_async_bulk_wait_group(0, read=True)  # the previous reduce has read the tile
            cute.arch.barrier_arrive(barrier_id=BAR_DQ_EMPTY, number_of_threads=MMA_THREADS + 32)
            sem = None
            if const_expr(self.p.deterministic):
                sem = self.semaphore(mSem, mAcc, head, m_block, w)
                turn = self.turn(m_block, w)
                if lane == 0:
                    while gops.ld_acquire_i32(sem) != turn:
                        pass
                cute.arch.sync_warp()
            cute.arch.barrier(barrier_id=BAR_DQ_FULL, number_of_threads=MMA_THREADS + 32)
            if const_expr(self.frag):  # the tile's rows are one contiguous run of the accumulator
                if lane == 0:
                    gops.bulk_reduce_add_f32(
                        self.fragment_tile(mAcc, head, m_block, w), sdQ.iterator, self.bm * self.d * 4
                    )
            else:
                cute.copy(tma_atom_dq, tDsdQ, tDgAcc)
            cute.arch.cp_async_bulk_commit_group()
            if const_expr(self.p.deterministic):
                cute.arch.cp_async_bulk_wait_group(0, read=False)  # the add itself has completed
                if lane == 0:
                    cute.arch.fence_acq_rel_gpu()
                    gops.red_release_add_i32(sem, Int32(1))
        cute.arch.cp_async_bulk_wait_group(0, read=False)

    def fragment_tile(self, mAcc, head, m_block, w: Walk):
        """Where query tile m_block's fragment-order dQ tile starts: dense, the tile of its rows; packed, its
        sequence's own tiles (`accum.packed_acc_tile`)."""
        if const_expr(self.p.is_thd):
            tile = packed_acc_tile(w.off_q, w.batch, self.bm) + m_block
            return gops.elem_ptr(mAcc, (tile * self.bm, 0, head))
        return gops.elem_ptr(mAcc, (m_block * self.bm, 0, head, w.batch))

    def ragged_turn_rows(self, mSem):
        """cuDNN's ragged form with turn counters: the query rows a sequence has counters for (per (batch, head)
        the tiles of the longest one, `semaphore`), the most its length may take; else None (no such bound)."""
        if const_expr(self.p.ragged and self.p.deterministic):
            per_seq = turns.ragged_tiles(mSem.shape[0], grid_extent(self.p.grid_order, "batch"), self.p.num_heads_q)
            return per_seq * self.bm
        return None

    @cute.jit
    def semaphore(self, mSem, mAcc, head: Int32, m_block: Int32, w: Walk):
        """The turn counter of one (batch, query head, query tile), laid out as the skeleton's scratch layout
        sizes them (`scratch.scratch_layout`) and the shared preprocess zeroes them: dense, per (batch, head)
        the tiles of the declared Sq (the accumulator's rows, not a padded batch's own length: every batch
        has the same stride); packed, per head the tiles of the packed total plus one per sequence (a
        sequence's tiles start where its first token's tile does, shifted by one per sequence before it)."""
        bm = self.bm
        if const_expr(self.p.ragged):
            # sequences may lie anywhere and in any order: per (batch, head) the tiles of the longest one
            per_seq = turns.ragged_tiles(mSem.shape[0], grid_extent(self.p.grid_order, "batch"), self.p.num_heads_q)
            idx = turns.turn_index(head, m_block, self.p.num_heads_q, per_seq, batch=w.batch)
        elif const_expr(self.p.is_thd):
            per_head = mAcc.shape[0] // bm + grid_extent(self.p.grid_order, "batch") + 1
            if const_expr(self.frag):  # the accumulator's own tiles are laid out as the turns are
                per_head = mAcc.shape[0] // bm
            idx = turns.turn_index(
                head, m_block, self.p.num_heads_q, per_head, first_tile=packed_acc_tile(w.off_q, w.batch, bm)
            )
        else:
            rows_q = mAcc.shape[0] if const_expr(self.p.has_seqused) else w.seqlen_q  # equal without padding
            idx = turns.turn_index(head, m_block, self.p.num_heads_q, (rows_q + bm - 1) // bm, batch=w.batch)
        return gops.elem_ptr(mSem, idx)

    @cute.jit
    def turn(self, m_block: Int32, w: Walk):
        """Key tile n_block's place among the key tiles that add into query tile m_block.

        Under a right-bounded band (causal) the order runs from the highest key tile down: that tile reaches
        the query tile first (walks start at the diagonal) and is launched first (`key_tile`), so a tile only
        ever waits on tiles already running. Otherwise it runs upward from the band's first key tile; every
        walk starts at the same query tile, so the additions settle into a staircase after the first. The
        rotated order (`det_order`, no band) starts each walk at its own query tile instead.
        """
        p = self.p
        turn = Int32(0)
        band = w.band
        turn = turns.stair_turn(
            w.n_block,
            m_block,
            self.bm,
            self.bn,
            w.seqlen_k,
            band.diag,
            band.window_left,
            band.window_right,
            p.has_window_right,
            Int32,
            cutlass.min,
            cutlass.max,
        )
        if const_expr(self.rotated and not p.has_window_right):
            turn = self.rotated_turn(turn, m_block, w)
        return turn

    @cute.jit
    def rotated_turn(self, stair: Int32, m_block: Int32, w: Walk):
        """The rotated order's turn (`turns.rotated_turn`: adds into a query tile by the step that reaches it, then by
        key tile), or the stair turn where the walks do not rotate (`rotation`)."""
        turn = stair
        if turns.rotation_fits(w.n_k, self.p.sm_count):
            turn = turns.rotated_turn(w.n_block, m_block, w.n_k, w.n_m, cutlass.min)
        return turn

    @cute.jit
    def key_tile(self, bx: Int32):
        """The key tile of CTA bx: deterministic plans under a right-bounded band launch the last tile first."""
        n_block = bx
        if const_expr(self.p.deterministic and self.p.has_window_right):
            n_block = grid_extent(self.p.grid_order, "key") - 1 - bx
        return n_block

    # --- MMA warpgroups
    @cute.jit
    def mma(self, g: Globals, s: Smem, tma: Tma, gemms: Gemms, score_args, fine, w: Walk):
        """The MMA warpgroups: every step of the walk (`mma_step`), then dK and dV out (`epilogue`)."""
        sRows, sQ, sK, sV, sdO, sdS, sP, sdQ = s
        _, _, pipe_kv, mma_sdp, mma_dk, mma_dv, mma_dq = gemms
        bm, bn = self.bm, self.bn
        # the softmax scale; the declared bias, dBias (written directly) and dBias accumulator, or None
        scale, _, mdBias, _ = score_args
        n_block, steps, seqlen_k = w.n_block, w.steps, w.seqlen_k
        tidx = cute.arch.thread_idx()[0] - 128
        wg = cute.arch.make_warp_uniform(tidx // 128)
        wg_sdp = mma_sdp.get_slice(wg * 128)
        wg_dk = mma_dk.get_slice(wg * 128)
        wg_dv = mma_dv.get_slice(wg * 128)
        wg_dq = mma_dq.get_slice(wg * 128)
        thr_sdp = mma_sdp.get_slice(tidx)
        # operands
        tSrK = wg_sdp.make_fragment_A(wg_sdp.partition_A(sK))
        tSrQ = wg_sdp.make_fragment_B(wg_sdp.partition_B(sQ))
        tPrV = wg_sdp.make_fragment_A(wg_sdp.partition_A(sV))
        tPrdO = wg_sdp.make_fragment_B(wg_sdp.partition_B(sdO))
        tdVrdOt = wg_dv.make_fragment_B(wg_dv.partition_B(wu.transpose_view(sdO)))
        tdKrQt = wg_dk.make_fragment_B(wg_dk.partition_B(wu.transpose_view(sQ)))
        if const_expr(self.swap_dq):
            tdQrKt = wg_dq.make_fragment_A(wg_dq.partition_A(wu.transpose_view(sK)))
            tdQrdS = wg_dq.make_fragment_B(wg_dq.partition_B(sdS))
        else:
            tdQrdS = wg_dq.make_fragment_A(wg_dq.partition_A(sdS))
            tdQrKt = wg_dq.make_fragment_B(wg_dq.partition_B(wu.transpose_view(sK)))
        if const_expr(self.shared_keys):  # P^T and dS^T from shared memory (each warpgroup holds half of them)
            tdVrP = wg_dv.make_fragment_A(wg_dv.partition_A(wu.transpose_view(sP)))
            tdKrdS = wg_dk.make_fragment_A(wg_dk.partition_A(wu.transpose_view(sdS)))
        else:
            tdVrP = wg_dv.make_fragment_A(wg_dv.partition_shape_A((bn, bm)))
            tdKrdS = wg_dk.make_fragment_A(wg_dk.partition_shape_A((bn, bm)))
        acc_dK = cute.make_rmem_tensor(mma_dk.partition_shape_C((bn, self.d)), Float32)
        acc_dV = cute.make_rmem_tensor(mma_dv.partition_shape_C((bn, self.dv)), Float32)
        acc_dK.fill(0.0)
        acc_dV.fill(0.0)
        # dS^T -> sdS (query rows, key columns) through a transposed stmatrix
        st_t = cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype)
        r2s_ds = cute.make_tiled_copy_C(st_t, mma_sdp)
        thr_r2s_ds = r2s_ds.get_slice(tidx)
        tRsdS = thr_r2s_ds.partition_D(wu.transpose_view(sdS))
        tRsP = None
        if const_expr(self.shared_keys):
            tRsP = thr_r2s_ds.partition_D(wu.transpose_view(sP))
        tdQcdQ = None
        if const_expr(self.red):  # (query row, head-dim column) of each dQ value this thread adds
            tdQsdQ = None
            tdQcdQ = mma_dq.get_slice(tidx).partition_C(cute.make_identity_tensor((bm, self.d)))
        elif const_expr(self.frag):  # fragment order (frost.engines.sdpa_bwd.accum.fragment_offset)
            n_dq = self.bm * self.d // MMA_THREADS  # registers (p, h, j) of the dQ fragment: j-th 16-byte group
            half = self.bm * self.d // 2
            tdQsdQ = cute.make_tensor(
                sdQ.iterator + (tidx // 128) * half + (tidx % 128) * 4,
                cute.make_layout(((2, 2, n_dq // 4), 1, 1), stride=((1, 2, 512), 0, 0)),
            )
        else:
            tdQsdQ = mma_dq.get_slice(tidx).partition_C(wu.transpose_view(sdQ) if const_expr(self.swap_dq) else sdQ)
        # per-column (query) coordinates of this thread's S^T values
        cS = cute.make_identity_tensor((bn, bm))
        tScS_mn = acc_as_mn(thr_sdp.partition_C(cS))
        t0ScS_mn = acc_as_mn(mma_sdp.get_slice(0).partition_C(cS))
        n_cols = cute.size(tScS_mn, mode=[1])
        rows = Rows(g.mLSE, g.mdPsum, sRows[0], sRows[1], tidx)
        r_state = None
        if const_expr(self.rows_mbar):
            r_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, ROWS_STAGES)
        # P's exp2 factor: with score modifiers S^T arrives scaled (`score_mods`)
        scale_log2 = Float32(LOG2_E) if const_expr(self.p.has_score_mods) else scale * Float32(LOG2_E)

        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        if const_expr(not self.rows_warp):
            if steps > 0:
                self.stage_rows(rows, Int32(0), self.load_rows(rows, w, Int32(0)))
        cute.arch.barrier(barrier_id=BAR_EPI, number_of_threads=MMA_THREADS)
        pipe_kv.consumer_wait(kv_state)
        if const_expr(self.lengths):
            key_rows = seqlen_k - n_block * bn
            if key_rows < bn:  # the sequence's last key tile: rows past it may hold any bits
                self.zero_tail(sK, key_rows, tidx)
                self.zero_tail(sV, key_rows, tidx)
                cute.arch.fence_view_async_shared()  # generic-proxy stores before the wgmma (async proxy) reads
                cute.arch.barrier(barrier_id=BAR_DS, number_of_threads=MMA_THREADS)
        fine_phase = Int32(0)  # the fine-tile reloads' mbarrier phase (`swap_fine`)
        out = GradOut(
            acc_dK,
            acc_dV,
            g.mdK,
            g.mdV,
            g.key_offsets,
            g.mdK_rows,
            g.mdV_rows,
            sK,
            sV,
            tma.dk,
            tma.dv,
            mma_dk,
            mma_dv,
            scale,
        )
        ops = Operands(
            tSrK,
            tSrQ,
            tPrV,
            tPrdO,
            tdVrdOt,
            tdKrQt,
            tdQrKt,
            tdQrdS,
            tdVrP,
            tdKrdS,
            r2s_ds,
            tRsdS,
            tRsP,
            tdQsdQ,
            tdQcdQ,
            tScS_mn,
            t0ScS_mn,
            thr_sdp,
            n_cols,
        )
        for t in cutlass.range(steps, unroll=1):
            fine_phase, r_state, q_state = self.mma_step(
                t, q_state, r_state, fine_phase, ops, g, s, gemms, score_args, rows, scale_log2, out, fine, w, tidx
            )
        if const_expr(self.p.has_dbias and not self.p.dbias_accum):
            score_mod.zero_dbias_outside_band(
                self.p,
                mdBias,
                w.batch,
                w.head_kv * self.group,
                self.group,
                w.m_min,
                w.n_m,
                bm,
                n_block,
                bn,
                mdBias.shape[2],
                mdBias.shape[3],
                MMA_THREADS,
                tidx,
            )
        self.epilogue(out, tidx, w)

    @cute.jit
    def mma_step(
        self,
        t: Int32,
        q_state,
        r_state,
        fine_phase: Int32,
        ops: Operands,
        g: Globals,
        s: Smem,
        gemms: Gemms,
        score_args,
        rows: Rows,
        scale_log2: Float32,
        out: GradOut,
        fine,
        w: Walk,
        tidx: Int32,
    ):
        """Step t of the walk: S^T and dP^T, P^T and dS^T, dV and dK, this step's dQ handed on. Returns what the
        next step carries: the fine reloads' phase, the rows' and Q / dO's pipeline states (in the order the
        loop has always carried them, so the kernel's IR is unchanged)."""
        bm, bn = self.bm, self.bn
        scale, mBias, mdBias, mdBiasAcc = score_args
        mAcc, mSem = g.mAcc, g.mSem
        pipe_rows = s.rows[2]  # with rows_mbar: the staged rows' mbarrier pipeline
        pipe_q, pipe_do, _, mma_sdp, mma_dk, _, mma_dq = gemms
        (
            tSrK,
            tSrQ,
            tPrV,
            tPrdO,
            _,
            tdKrQt,
            tdQrKt,
            tdQrdS,
            _,
            tdKrdS,
            _,
            _,
            _,
            tdQsdQ,
            tdQcdQ,
            tScS_mn,
            t0ScS_mn,
            thr_sdp,
            _,
        ) = ops
        acc_dK = out.acc_dK
        head, m_block = self.step_tile(t, w)
        q0 = m_block * bm
        row_next = Float32(0.0)
        if const_expr(not self.rows_warp):
            row_next = self.load_rows(rows, w, t + 1)  # the next step's LSE / dpsum row, staged below
        stage = t % 2
        if const_expr(self.lengths):
            self.zero_query_tail(q_state, s, gemms, q0, w, tidx)
        pipe_q.consumer_wait(q_state, pipe_q.consumer_try_wait(q_state))
        acc_S = cute.make_rmem_tensor(mma_sdp.partition_shape_C((bn, bm)), Float32)
        wu.gemm(
            mma_sdp,
            acc_S,
            tSrK,
            tSrQ[None, None, None, q_state.index],
            zero_init=True,
            wg_wait=-1,
            k_blocks=self.p.s_k_blocks,
        )
        pipe_do.consumer_wait(q_state, pipe_do.consumer_try_wait(q_state))
        acc_dP = cute.make_rmem_tensor(mma_sdp.partition_shape_C((bn, bm)), Float32)
        wu.gemm(
            mma_sdp,
            acc_dP,
            tPrV,
            tPrdO[None, None, None, q_state.index],
            zero_init=True,
            wg_wait=-1,
            k_blocks=self.p.dp_k_blocks,
        )
        rB = None  # the step's bias tile, its loads in flight while S^T and dP^T run
        if const_expr(self.p.has_bias):
            rB = self.fetch_bias(tScS_mn, t0ScS_mn, thr_sdp, mBias, head, m_block, w)
        s_mn = self.probabilities(
            acc_S, rB, ops, (rows, pipe_rows, r_state), (scale, scale_log2), (head, m_block, q0), stage, w
        )
        r_state = self.score_grads(acc_dP, s_mn, ops, (rows, pipe_rows, r_state), mdBiasAcc, head, m_block, stage, w)
        rdS16 = self.dv_step(acc_dP, ops, gemms, out, stage, q_state)
        tdKrdS_t = tdKrdS[None, None, None, stage] if const_expr(self.shared_keys) else tdKrdS
        if const_expr(self.dk_first):
            # dK before dQ, so Q and dO are released while dQ still runs: the next step's loads overlap it
            wu.gemm(mma_dk, acc_dK, tdKrdS_t, tdKrQt[None, None, None, q_state.index], wg_wait=-1)
            acc_dQ = self.dq_gemm(mma_dq, tdQrdS, tdQrKt, stage)
            # the step's dBias while dK and dQ run
            self.write_step_dbias(rdS16, tScS_mn, t0ScS_mn, thr_sdp, mdBias, head, m_block, w)
            warpgroup.wait_group(1)  # dV and dK done; dQ may still run
            pipe_do.consumer_release(q_state)
            pipe_q.consumer_release(q_state)
            if const_expr(not self.rows_warp):
                self.stage_rows(rows, t + 1, row_next)  # read after this step's dQ-empty barrier
            self.put_dq(acc_dQ, tdQsdQ, tdQcdQ, mAcc, mSem, head, m_block, tidx, w, True)
        else:
            acc_dQ = self.dq_gemm(mma_dq, tdQrdS, tdQrKt, stage)
            wu.gemm(mma_dk, acc_dK, tdKrdS_t, tdKrQt[None, None, None, q_state.index], wg_wait=-1)
            # the step's dBias while dQ and dK run
            self.write_step_dbias(rdS16, tScS_mn, t0ScS_mn, thr_sdp, mdBias, head, m_block, w)
            warpgroup.wait_group(1)  # dV and dQ done; dK may still run
            pipe_do.consumer_release(q_state)
            if const_expr(not self.rows_warp):
                self.stage_rows(rows, t + 1, row_next)  # read after this step's dQ-empty barrier
            self.put_dq(acc_dQ, tdQsdQ, tdQcdQ, mAcc, mSem, head, m_block, tidx, w, False)
            warpgroup.wait_group(0)
            pipe_q.consumer_release(q_state)
        q_state.advance()
        if const_expr(self.fine_k or self.fine_v):
            fine_phase = self.next_fine(t, w, fine, out, fine_phase, tidx)
        return fine_phase, r_state, q_state

    @cute.jit
    def zero_query_tail(self, q_state, s: Smem, gemms: Gemms, q0: Int32, w: Walk, tidx: Int32):
        """The sequence's last query tile (from row `q0`): its Q and dO rows past the sequence may hold any bits;
        zeroed once both have landed, before the wgmmas read them."""
        pipe_q, pipe_do = gemms.pipe_q, gemms.pipe_do
        query_rows = w.seqlen_q - q0
        if query_rows < self.bm:
            pipe_q.consumer_wait(q_state)
            pipe_do.consumer_wait(q_state)
            self.zero_tail(s.sQ[None, None, q_state.index], query_rows, tidx)
            self.zero_tail(s.sdO[None, None, q_state.index], query_rows, tidx)
            cute.arch.fence_view_async_shared()
            cute.arch.barrier(barrier_id=BAR_DS, number_of_threads=MMA_THREADS)

    @cute.jit
    def probabilities(self, acc_S: cute.Tensor, rB, ops: Operands, staged, scales, at, stage, w: Walk):
        """S^T -> P^T in place once S^T has landed and the step's LSE rows are staged: score modifiers, mask,
        exp2; P^T to shared memory (shared keys) or to dV's A fragment. `staged`: (rows, their pipeline, its
        state); `scales`: (softmax scale, exp2 factor); `at`: (query head, query tile, its first row). Returns
        S^T's (rows, cols) view."""
        bm, bn = self.bm, self.bn
        rows, pipe_rows, r_state = staged
        scale, scale_log2 = scales
        head, m_block, q0 = at
        n_block, seqlen_q, seqlen_k = w.n_block, w.seqlen_q, w.seqlen_k
        off, wl, wr = w.band.diag, w.band.window_left, w.band.window_right
        tScS_mn, t0ScS_mn, n_cols = ops.tScS_mn, ops.t0ScS_mn, ops.n_cols
        warpgroup.wait_group(1)
        s_mn = acc_as_mn(acc_S)
        if const_expr(self.rows_mbar):  # this warpgroup waits for the rows alone, not for the other one
            pipe_rows.consumer_wait(r_state, pipe_rows.consumer_try_wait(r_state))
        elif const_expr(self.rows_warp):
            rows_barrier(BAR_ROWS_FULL, stage, False)
        if const_expr(self.p.has_score_mods):
            self.score_mods(s_mn, tScS_mn, t0ScS_mn, rB, scale, head, m_block, w)
        if mask.tile_needs_mask(m_block, n_block, bm, bn, seqlen_q, seqlen_k, off, wl, wr):
            mask.apply_mask_keys_by_rows(s_mn, tScS_mn, t0ScS_mn, q0, n_block * bn, seqlen_k, off, wl, wr)
        for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
            for c in cutlass.range_constexpr(n_cols):
                s_mn[r, c] = cute.math.exp2(s_mn[r, c] * scale_log2 - rows.sLSE[tScS_mn[0, c][1], stage], fastmath=True)
        if const_expr(self.shared_keys):
            self.stage_tile(acc_S, ops.r2s_ds, ops.tRsP[None, None, None, stage])
        else:
            wu.convert_to_16bit(wu.acc_view_as_a(acc_S), ops.tdVrP)
        return s_mn

    @cute.jit
    def score_grads(
        self,
        acc_dP: cute.Tensor,
        s_mn: cute.Tensor,
        ops: Operands,
        staged,
        mdBiasAcc,
        head: Int32,
        m_block: Int32,
        stage,
        w: Walk,
    ):
        """dP^T -> dS^T in place once dP^T has landed (P^T `s_mn` and the staged dpsum rows), the rows handed
        back; dBias through the accumulator added here. `staged`: (rows, their pipeline, its state). Returns the
        rows' pipeline state (advanced with `rows_mbar`)."""
        rows, pipe_rows, r_state = staged
        tScS_mn, t0ScS_mn, thr_sdp, n_cols = ops.tScS_mn, ops.t0ScS_mn, ops.thr_sdp, ops.n_cols
        warpgroup.wait_group(0)
        dp_mn = acc_as_mn(acc_dP)
        for r in cutlass.range_constexpr(cute.size(dp_mn, mode=[0])):
            for c in cutlass.range_constexpr(n_cols):
                dp_mn[r, c] = s_mn[r, c] * (dp_mn[r, c] - rows.sdPsum[tScS_mn[0, c][1], stage])
        if const_expr(self.rows_mbar):
            pipe_rows.consumer_release(r_state)
            r_state.advance()
        elif const_expr(self.rows_warp):
            rows_barrier(BAR_ROWS_FREE, stage, True)
        if const_expr(self.p.dbias_accum):  # dBias = dS^T (fp32, before the scale), added or stored
            self.write_dbias(dp_mn, tScS_mn, t0ScS_mn, thr_sdp, mdBiasAcc, head, m_block, w, True)
        return r_state

    @cute.jit
    def dv_step(self, acc_dP: cute.Tensor, ops: Operands, gemms: Gemms, out: GradOut, stage, q_state):
        """dS^T to shared memory and dV += P^T dO (in either order); returns dS^T in 16 bits laid out as the
        accumulator where a dBias is written as it is (else None)."""
        r2s_ds, tRsdS, tdVrP, tdVrdOt, tdKrdS = ops.r2s_ds, ops.tRsdS, ops.tdVrP, ops.tdVrdOt, ops.tdKrdS
        mma_dv, acc_dV = gemms.dv, out.acc_dV
        rdS16 = None  # dS^T in 16 bits, laid out as the accumulator (for a dBias written as it is)
        if const_expr(self.shared_keys):  # both halves of P^T and dS^T in shared memory, then dV
            rdS16 = self.stage_tile(acc_dP, r2s_ds, tRsdS[None, None, None, stage])
            cute.arch.fence_view_async_shared()
            cute.arch.barrier(barrier_id=BAR_DS, number_of_threads=MMA_THREADS)
            wu.gemm(
                mma_dv, acc_dV, tdVrP[None, None, None, stage], tdVrdOt[None, None, None, q_state.index], wg_wait=-1
            )
        else:
            wu.convert_to_16bit(wu.acc_view_as_a(acc_dP), tdKrdS)
            # dV += P^T dO while dS goes to shared memory
            wu.gemm(mma_dv, acc_dV, tdVrP, tdVrdOt[None, None, None, q_state.index], wg_wait=-1)
            cute.copy(
                r2s_ds, r2s_ds.retile(cute.make_tensor(tdKrdS.iterator, acc_dP.layout)), tRsdS[None, None, None, stage]
            )
            cute.arch.fence_view_async_shared()
            cute.arch.barrier(barrier_id=BAR_DS, number_of_threads=MMA_THREADS)
        if const_expr(self.p.has_dbias and not self.p.dbias_accum and not self.shared_keys):
            rdS16 = cute.make_tensor(tdKrdS.iterator, acc_dP.layout)
        return rdS16

    @cute.jit
    def fetch_bias(
        self, tScS_mn: cute.Tensor, t0ScS_mn: cute.Tensor, thr_sdp, mBias, head: Int32, m_block: Int32, w: Walk
    ) -> cute.Tensor:
        """Issue the loads of the step's bias^T tile (`score_mod.fetch_bias` through the transposed view: rows are
        keys, columns queries) into fp32 registers; called before the scores are waited for."""
        mB, q_limit, k_limit, _ = score_mod.sequence_mods(self.p, mBias, w.batch, head, w.seqlen_q, w.seqlen_k)
        return score_mod.fetch_bias(
            self.score_tile(thr_sdp, mB, m_block, w),
            tScS_mn,
            t0ScS_mn,
            w.n_block * self.bn,
            m_block * self.bm,
            k_limit,
            q_limit,
        )

    @cute.jit
    def score_mods(
        self,
        s_mn: cute.Tensor,
        tScS_mn: cute.Tensor,
        t0ScS_mn: cute.Tensor,
        rB,
        scale: Float32,
        head: Int32,
        m_block: Int32,
        w: Walk,
    ):
        """S^T -> scale * S^T + bias^T + ALiBi of query head `head`, in place, before the mask
        (`score_mod.add_score_mods` on the transposed view, `rB` the fetched bias^T tile or None; ALiBi's
        slope(j - i) takes the negated slope)."""
        neg_slope = None
        if const_expr(self.p.has_alibi):
            neg_slope = -score_mod.alibi_slope(head, self.p.num_heads_q)
        score_mod.add_score_mods(
            s_mn,
            tScS_mn,
            t0ScS_mn,
            None,
            scale,
            w.n_block * self.bn,
            m_block * self.bm,
            w.seqlen_k,
            w.seqlen_q,
            neg_slope,
            rB=rB,
        )

    def score_tile(self, thr_sdp, mX: cute.Tensor, m_block: Int32, w: Walk) -> cute.Tensor:
        """This thread's elements of a (S_q, S_kv) score-shaped tensor (bias, dBias) at the step's tile, through
        its transposed view, laid out as the S^T accumulator's (rows, cols) view."""
        mXt = cute.make_tensor(mX.iterator, cute.select(mX.layout, mode=[1, 0]))  # (keys, queries)
        return acc_as_mn(thr_sdp.partition_C(cute.local_tile(mXt, (self.bn, self.bm), (w.n_block, m_block))))

    @cute.jit
    def write_dbias(
        self,
        vals_mn: cute.Tensor,
        tScS_mn: cute.Tensor,
        t0ScS_mn: cute.Tensor,
        thr_sdp,
        mX,
        head: Int32,
        m_block: Int32,
        w: Walk,
        add: cutlass.Constexpr[bool],
    ):
        """dS^T of one step (before the scale) into dBias: as it is (16 bits, one (batch, head) per element),
        every element inside dBias's extents, the zeros of masked and padding positions included; or (`add`)
        red.global.add'ed in fp32 into the accumulator (`dbias_accum`), the positions inside the sequence only.
        Deterministic, the accumulator holds a copy per (batch entry, query head), so each element's one write is
        a plain store (the dQ convert sums the copies in a fixed order)."""
        p = self.p
        per_batch = p.dbias_accum_per_batch if const_expr(add) else p.bias_per_batch
        per_head = p.dbias_accum_per_head if const_expr(add) else p.bias_per_head
        mB = score_mod.bias_rows(mX, w.batch, head, per_batch, per_head)
        k_limit, q_limit = mB.shape[1], mB.shape[0]
        if const_expr(add):
            k_limit, q_limit = cutlass.min(w.seqlen_k, k_limit), cutlass.min(w.seqlen_q, q_limit)
        score_mod.write_score_tile(
            vals_mn,
            self.score_tile(thr_sdp, mB, m_block, w),
            tScS_mn,
            t0ScS_mn,
            k_limit - w.n_block * self.bn,
            q_limit - m_block * self.bm - tScS_mn[0][1],
            add=add and not p.deterministic,
        )

    @cute.jit
    def write_step_dbias(self, rdS16, tScS_mn, t0ScS_mn, thr_sdp, mdBias, head: Int32, m_block: Int32, w: Walk):
        """A dBias written as it is: the step's dS^T from its 16-bit registers `rdS16` (`write_dbias`), issued
        once the step's dQ and dK GEMMs are (a dBias through the accumulator is added where dS^T is made)."""
        if const_expr(self.p.has_dbias and not self.p.dbias_accum):
            self.write_dbias(acc_as_mn(rdS16), tScS_mn, t0ScS_mn, thr_sdp, mdBias, head, m_block, w, False)

    @cute.jit
    def dq_gemm(self, mma_dq, tdQrdS, tdQrKt, stage):
        """dQ = dS K (or dQ^T = K^T dS^T) of this step's dS tile, issued, not waited for."""
        if const_expr(self.swap_dq):
            acc_dQ = cute.make_rmem_tensor(mma_dq.partition_shape_C((self.d, self.bm)), Float32)
            wu.gemm(mma_dq, acc_dQ, tdQrKt, tdQrdS[None, None, None, stage], zero_init=True, wg_wait=-1)
        else:
            acc_dQ = cute.make_rmem_tensor(mma_dq.partition_shape_C((self.bm, self.d)), Float32)
            wu.gemm(mma_dq, acc_dQ, tdQrdS[None, None, None, stage], tdQrKt, zero_init=True, wg_wait=-1)
        return acc_dQ

    @cute.jit
    def put_dq(
        self,
        acc_dQ,
        tdQsdQ,
        tdQcdQ,
        mAcc,
        mSem,
        head: Int32,
        m_block: Int32,
        tidx: Int32,
        w: Walk,
        wait: cutlass.Constexpr[bool],
    ):
        """The step's dQ out of the registers: added by this thread (`dq_red`), or into the shared dQ tile once
        the writer's previous add has read it, handed over to the writer. `wait`: the dQ GEMM is the last one
        in flight, waited for here (after the barrier, so its time overlaps the writer's)."""
        if const_expr(self.red):
            cute.arch.barrier(barrier_id=BAR_DQ_EMPTY, number_of_threads=MMA_THREADS)
            if const_expr(wait):
                warpgroup.wait_group(0)
            self.add_dq(acc_dQ, tdQcdQ, mAcc, mSem, head, m_block, tidx, w)
        else:
            cute.arch.barrier(barrier_id=BAR_DQ_EMPTY, number_of_threads=MMA_THREADS + 32)
            if const_expr(wait):
                warpgroup.wait_group(0)
            cute.autovec_copy(acc_dQ, tdQsdQ)
            cute.arch.fence_view_async_shared()
            cute.arch.barrier_arrive(barrier_id=BAR_DQ_FULL, number_of_threads=MMA_THREADS + 32)

    @cute.jit
    def stage_tile(self, acc: cute.Tensor, r2s: cute.TiledCopy, dst: cute.Tensor) -> cute.Tensor:
        """A 16-bit copy of this thread's part of an S^T-shaped tile (P^T, dS^T) into its shared tile; returns
        the 16-bit registers."""
        r16 = cute.make_rmem_tensor_like(acc, self.dtype)
        wu.convert_to_16bit(acc, r16)
        cute.copy(r2s, r2s.retile(r16), dst)
        return r16

    @cute.jit
    def add_dq(
        self,
        acc_dQ: cute.Tensor,
        tdQcdQ: cute.Tensor,
        mAcc: cute.Tensor,
        mSem,
        head: Int32,
        m_block: Int32,
        tidx: Int32,
        w: Walk,
    ):
        """Add this thread's dQ values into the row-layout accumulator, two neighbouring columns per
        red.global.add.v2, rows past the sequence skipped. Deterministic: MMA thread 0 waits for the tile's
        turn, every thread fences its adds, and thread 0 passes the turn on."""
        q0 = m_block * self.bm
        gAcc = self.seq_rows(mAcc, head, w, w.off_q)
        sem = None
        if const_expr(self.p.deterministic):
            sem = self.semaphore(mSem, mAcc, head, m_block, w)
            if tidx == 0:
                turn = self.turn(m_block, w)
                while gops.ld_acquire_i32(sem) != turn:
                    pass
            cute.arch.barrier(barrier_id=BAR_DQ_FULL, number_of_threads=MMA_THREADS)
        for i in cutlass.range_constexpr(cute.size(acc_dQ) // 2):
            r, c = tdQcdQ[2 * i]
            inside = q0 + r < w.seqlen_q
            if const_expr(self.p.padded):  # the tile's columns past the head dim are not the accumulator's
                inside = inside and c < self.p.head_dim
            if inside:
                gops.red_add_f32(gops.elem_ptr(gAcc, (q0 + r, c)), (acc_dQ[2 * i], acc_dQ[2 * i + 1]))
        if const_expr(self.p.deterministic):
            cute.arch.fence_acq_rel_gpu()
            cute.arch.barrier(barrier_id=BAR_DQ_FULL, number_of_threads=MMA_THREADS)
            if tidx == 0:
                gops.red_release_add_i32(sem, Int32(1))

    @cute.jit
    def load_rows(self, r: Rows, w: Walk, t: Int32) -> Float32:
        """Threads [0, tile_m) read step t's LSE (log2 units; +inf past the sequence or for a row with no key,
        so P = 0), threads [tile_m, 2 tile_m) its dpsum; a step past the last reads the last step's rows."""
        tidx = r.tidx
        head, m_block = self.step_tile(cutlass.min(t, w.steps - 1), w)
        i = tidx % self.bm
        v = Float32(0.0)
        if tidx < self.bm:
            v = self.staged_lse(r.mLSE, i, head, m_block, w)
        elif tidx < 2 * self.bm:
            v = self.staged_dpsum(r.mdPsum, i, head, m_block, w)
        return v

    @cute.jit
    def staged_lse(self, mLSE, i, head: Int32, m_block: Int32, w: Walk) -> Float32:
        """Row i of a query tile's LSE as the steps read it: log2 units, +inf past the sequence or for a row
        with no key (so P = 0)."""
        q = m_block * self.bm + i
        lse = self.row_value(mLSE, cutlass.min(q, w.seqlen_q - 1), head, w, lse=True) * Float32(LOG2_E)
        return Float32.inf if (q >= w.seqlen_q or lse == -Float32.inf) else lse

    @cute.jit
    def staged_dpsum(self, mdPsum, i, head: Int32, m_block: Int32, w: Walk) -> Float32:
        """Row i of a query tile's dpsum (rows past the sequence read its last row; P = 0 there)."""
        return self.row_value(mdPsum, cutlass.min(m_block * self.bm + i, w.seqlen_q - 1), head, w)

    @cute.jit
    def load_rows_warp(self, mLSE, mdPsum, sRows, w: Walk):
        """The rows warp: each step's LSE (log2 units, +inf past the sequence or for a row with no key) and
        dpsum rows into that step's half of the staged rows, up to two steps ahead of the MMA warpgroups. Its
        global loads are waited for here, never by an MMA thread (whose proxy fences would wait for them). The
        halves change hands through named barriers of all 288 threads, or with `rows_mbar` through an mbarrier
        pipeline (full: the 32 lanes; free: the 256 MMA threads), on which each warpgroup waits on its own."""
        lane = cute.arch.lane_idx()
        sLSE, sdPsum, pipe_rows = sRows
        if const_expr(self.rows_mbar):
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, ROWS_STAGES)
            for t in cutlass.range(w.steps, unroll=1):
                pipe_rows.producer_acquire(state)
                self.stage_step_rows(mLSE, mdPsum, sLSE, sdPsum, lane, t, state.index, w)
                pipe_rows.producer_commit(state)
                state.advance()
        else:
            for t in cutlass.range(w.steps + ROWS_STAGES, unroll=1):
                stage = t % ROWS_STAGES
                if t >= ROWS_STAGES:  # the half of step t - 2 has been read
                    rows_barrier(BAR_ROWS_FREE, stage, False)
                if t < w.steps:
                    self.stage_step_rows(mLSE, mdPsum, sLSE, sdPsum, lane, t, stage, w)
                    rows_barrier(BAR_ROWS_FULL, stage, True)

    @cute.jit
    def stage_step_rows(self, mLSE, mdPsum, sLSE, sdPsum, lane: Int32, t: Int32, stage: Int32, w: Walk):
        """The rows warp's share of one step: step t's LSE and dpsum rows into `stage` of the staged rows."""
        head, m_block = self.step_tile(t, w)
        for j in cutlass.range_constexpr((self.bm + 31) // 32):
            i = lane + 32 * j
            if i < self.bm:
                sLSE[i, stage] = self.staged_lse(mLSE, i, head, m_block, w)
                sdPsum[i, stage] = self.staged_dpsum(mdPsum, i, head, m_block, w)

    @cute.jit
    def stage_rows(self, r: Rows, t: Int32, v: Float32):
        """Store `load_rows`' value in step t's half of the staged LSE / dpsum rows."""
        i = r.tidx % self.bm
        if r.tidx < self.bm:
            r.sLSE[i, t % ROWS_STAGES] = v
        elif r.tidx < 2 * self.bm:
            r.sdPsum[i, t % ROWS_STAGES] = v

    @cute.jit
    def zero_tail(self, sX: cute.Tensor, limit: Int32, tidx: Int32):
        """Zero the rows >= limit of a (rows, cols) smem tile with the MMA threads (no fence, no barrier)."""
        tiled, threads = row_copy(self.dtype, cute.size(sX, mode=[1]), MMA_THREADS)
        zero_rows(tiled, threads, sX, limit, tidx)

    @cute.jit
    def epilogue(self, out: GradOut, tidx: Int32, w: Walk):
        """dK * scale and dV of the walk's last K / V heads out (`write_grads`). A tile that changes within the
        walk whose walk has no step also writes its zeros to every earlier head of the walk (no step stored them)."""
        last_k, last_v = self.kv_head(w, self.group - 1, False), self.kv_head(w, self.group - 1, True)
        first_k, first_v = None, None  # one head each, unless the tile changes within the walk
        if const_expr(self.fine_k):
            first_k = last_k
            if w.steps == 0:
                first_k = self.kv_head(w, 0, False)
        if const_expr(self.fine_v):
            first_v = last_v
            if w.steps == 0:
                first_v = self.kv_head(w, 0, True)
        grads = (
            (False, last_k, None) if first_k is None else (False, first_k, last_k),
            (True, last_v, None) if first_v is None else (True, first_v, last_v),
        )
        self.write_grads(grads, out, tidx, w)

    @cute.jit
    def write_grads(self, grads, out: GradOut, tidx: Int32, w: Walk):
        """`grads`: (is_v, first head, last head) of dK (times scale) and / or dV, staged through their (now free)
        K / V tiles, then one TMA store per head (packed: row-predicated stores by one warpgroup each, so no row of
        the next sequence is touched). The tiles are free again on return only for the storing warp (TMA) or after
        a barrier (row stores)."""
        staged = []
        for is_v, _, _ in grads:
            acc = out.acc_dV if const_expr(is_v) else out.acc_dK
            if const_expr(not is_v):
                for i in cutlass.range_constexpr(cute.size(acc)):
                    acc[i] = acc[i] * out.scale
            r16 = cute.make_rmem_tensor_like(acc, self.dtype)
            wu.convert_to_16bit(acc, r16)
            staged.append(r16)
        st = cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        cute.arch.barrier(barrier_id=BAR_EPI, number_of_threads=MMA_THREADS)  # every GEMM has read sK / sV
        for (is_v, _, _), r16 in zip(grads, staged):
            r2s = cute.make_tiled_copy_C(st, out.mma_dv if const_expr(is_v) else out.mma_dk)
            cute.copy(r2s, r2s.retile(r16), r2s.get_slice(tidx).partition_D(out.sV if const_expr(is_v) else out.sK))
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=BAR_EPI, number_of_threads=MMA_THREADS)
        if const_expr(self.p.is_thd):
            # the sequence's first key read again here, not kept in registers over the steps (a d=64 spill)
            off_k = token_offset(out.key_offsets[0], w.batch, self.p.token_div_kv, out.mdK_rows.shape[0])
            limit = w.seqlen_k - w.n_block * self.bn
            if tidx < 128:  # each tile by its own warpgroup
                self.store_rows(grads[0], out, off_k, limit, tidx, w)
            elif const_expr(len(grads) > 1):
                self.store_rows(grads[1], out, off_k, limit, tidx - 128, w)
        elif tidx < 32:
            for is_v, lo, hi in grads:
                store = partial(
                    self.tma_store_tile,
                    out.sV if const_expr(is_v) else out.sK,
                    out.mdV if const_expr(is_v) else out.mdK,
                    out.tma_atom_dv if const_expr(is_v) else out.tma_atom_dk,
                    self.dv if const_expr(is_v) else self.d,
                )
                self.each_head(store, lo, hi, w)
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def store_rows(self, grad, out: GradOut, off_k: Int32, limit: Int32, t: Int32, w: Walk):
        """One staged dK / dV tile (`grad` as in `write_grads`) by one warpgroup's row-predicated stores (`t` its
        thread), to each of its heads."""
        is_v, lo, hi = grad
        _, mdKOff, mdVOff = out.key_offsets
        if const_expr(is_v):
            off = own_token_offset(self.p, "dv", mdVOff, w.batch, off_k, w.seqlen_k, out.mdV_rows.shape[0])
            self.each_head(
                partial(self.store_tile, out.sV, out.mdV_rows, self.dv, self.p.head_dim_v, off, limit, t), lo, hi, w
            )
        else:
            off = own_token_offset(self.p, "dk", mdKOff, w.batch, off_k, w.seqlen_k, out.mdK_rows.shape[0])
            self.each_head(
                partial(self.store_tile, out.sK, out.mdK_rows, self.d, self.p.head_dim, off, limit, t), lo, hi, w
            )

    @cute.jit
    def each_head(self, store, lo, hi, w: Walk):
        """store(head, w) for the heads lo..hi (`hi` None: lo alone)."""
        if const_expr(hi is None):
            store(lo, w)
        else:
            for h in cutlass.range(lo, hi + 1, unroll=1):
                store(h, w)

    @cute.jit
    def tma_store_tile(
        self, sX: cute.Tensor, mX: cute.Tensor, atom: cute.CopyAtom, width: cutlass.Constexpr[int], head: Int32, w: Walk
    ):
        """One TMA store of a staged (tile_n, width) dK / dV tile to head `head` (not committed)."""
        gX = cute.local_tile(mX[None, None, head, w.batch], (self.bn, width), (w.n_block, 0))
        tXsX, tXgX = cpasync.tma_partition(
            atom, 0, cute.make_layout(1), cute.group_modes(sX, 0, 2), cute.group_modes(gX, 0, 2)
        )
        cute.copy(atom, tXsX, tXgX)

    @cute.jit
    def next_fine(self, t: Int32, w: Walk, fine: Fine, out: GradOut, phase: Int32, tidx: Int32) -> Int32:
        """After step t: where the next step starts a K (or V) head inside the walk (K and V heads apart), that
        tensor's gradient goes out and the next head's tile comes in (`swap_fine`). Returns the reloads' phase."""
        nxt = t + 1
        if nxt < w.steps:
            if nxt % w.n_m == 0:
                j = nxt // w.n_m  # the next step's query head, from the walk's first
                if const_expr(self.fine_k):
                    if j % self.p.qhead_per_kvhead == 0:
                        self.swap_fine(False, j, fine, out, phase, tidx, w)
                        phase = phase ^ 1
                if const_expr(self.fine_v):
                    if j % self.p.qhead_per_vhead == 0:
                        self.swap_fine(True, j, fine, out, phase, tidx, w)
                        phase = phase ^ 1
        return phase

    @cute.jit
    def swap_fine(
        self, is_v: cutlass.Constexpr[bool], j: Int32, fine: Fine, out: GradOut, phase: Int32, tidx: Int32, w: Walk
    ):
        """The K (V) head of query head j - 1 is done: its dK (dV) leaves through its tile (`write_grads`; every GEMM
        of the step has completed, each warpgroup waited for its own), the accumulator restarts at zero, and one
        TMA load brings query head j's K (V) tile in, on the fine mbarrier, before the next step's GEMMs."""
        self.write_grads(((is_v, self.kv_head(w, j - 1, is_v), None),), out, tidx, w)
        (out.acc_dV if const_expr(is_v) else out.acc_dK).fill(0.0)
        cute.arch.fence_view_async_shared()  # row stores (generic proxy) read the tile before TMA rewrites it
        cute.arch.barrier(barrier_id=BAR_EPI, number_of_threads=MMA_THREADS)
        sX = out.sV if const_expr(is_v) else out.sK
        width = self.dv if const_expr(is_v) else self.d
        if tidx < 32:
            if tidx == 0:
                cute.arch.mbarrier_arrive_and_expect_tx(fine.mbar, self.bn * width * self.dtype.width // 8)
            self.load_kv_tile(
                fine.tma_atom_v if const_expr(is_v) else fine.tma_atom_k,
                fine.mV if const_expr(is_v) else fine.mK,
                sX,
                width,
                self.kv_head(w, j, is_v),
                w,
                fine.mbar,
            )
        cute.arch.mbarrier_wait(fine.mbar, phase)
        if const_expr(self.lengths):
            key_rows = w.seqlen_k - w.n_block * self.bn
            if key_rows < self.bn:  # the sequence's last key tile: rows past it may hold any bits
                self.zero_tail(sX, key_rows, tidx)
                cute.arch.fence_view_async_shared()
                cute.arch.barrier(barrier_id=BAR_DS, number_of_threads=MMA_THREADS)

    @cute.jit
    def store_tile(
        self,
        sX: cute.Tensor,
        mX: cute.Tensor,
        width: cutlass.Constexpr[int],
        cols: cutlass.Constexpr[int],
        off_k: Int32,
        limit: Int32,
        t: Int32,
        head: Int32,
        w: Walk,
    ):
        """The rows < limit of a staged (tile_n, width) dK / dV tile to the sequence's rows (from its first key
        `off_k`), by one warpgroup; a tile padded past the head dim (`cols`) stores only its first cols columns."""
        tiled, threads = row_copy(self.dtype, width, 128)
        if t < threads:
            rows = widen(self.seq_rows(mX, head, w, off_k), width)
            g = cute.local_tile(rows, (self.bn, width), (w.n_block, 0))
            store_rows(
                tiled,
                sX,
                g,
                cute.make_identity_tensor((self.bn, width)),
                limit,
                t,
                cols=cols if const_expr(cols < width) else 0,
            )


def build(params: Sm90BwdParams, arch: str):
    """The host entry (declared-order tensors) and fake arguments in `main_args(params)` order; the workspace
    buffers' fakes are the skeleton's (`frost.engines.sdpa_bwd.accum`)."""
    from frost.engines.sdpa_bwd.accum import build_entry

    return build_entry(params, main_args(params), SdpaBwdSm90(params).launch)


__all__ = ["SdpaBwdSm90", "build", "kernel_name", "main_args"]
