"""SM90 SDPA forward template: TMA loads, wgmma consumer warpgroups, persistent tiles.

Warp 0 loads Q, K and V tiles with TMA into a multi-stage shared-memory ring
(one mbarrier pipeline each for Q, K and V). Two or three consumer warpgroups
own 64 query rows each: S = Q K^T with both operands in shared memory, online
softmax in registers, O += P V with P fed from registers. Within a warpgroup,
the QK^T of block j is issued before the PV of block j-1 so softmax overlaps
tensor-core work; across warpgroups, named barriers alternate GEMM issue
(ping-pong) so one group's softmax hides under the other's GEMMs. Producers
drop to few registers (setmaxnreg) and consumers take the rest.

GQA packing (`pack_gqa`): tiles run over groups of r query heads, and tile row m
is query position m // r of head group * r + m % r (r = Hq / Hkv, or with K and
V heads apart the largest group sharing both a K and a V head), so one K/V
stream feeds all r heads. Q, O and LSE are viewed with a ((r, S), ...) row mode
(`pack_gqa.pack_heads`); TMA moves Q and O with (r, rows / r) boxes; masks use
the row's query position and sinks the row's head.

Score modifiers (an additive bias, ALiBi: `frost.engines.common.score_mod`): each
S tile is scaled and modified in registers after its QK^T and before the mask, and
the softmax runs with a scale of 1; tile rows are query positions (no GQA packing
with them: a packed tile's rows would span several heads' biases and slopes).
Without them none of that code is compiled.

cuDNN's block_mask (`has_block_mask`): a work tile skips the key blocks whose bits are all clear for its rows,
neither loaded nor multiplied. The producer warp and the consumers ask the same question of the same bits in
global memory (`mask.block_mask_tile_visible`: a byte or two per key block, from 32-bit row offsets made once per
work tile, `mask.block_mask_rows`), so they walk the same blocks and advance their pipeline states together; the
consumers' peeled first block is the first one visited (`mask.block_mask_last_visible`), and a work tile that
visits none writes its rows as empty (O = 0, LSE -inf or the sink's), as one with an empty band does. A visited
block inside one 128x128 block (tile_m and tile_n dividing 128) was visited because its bit is set: it needs no
mask. One that straddles blocks (tile_n not dividing 128, tile_m 192) is masked bit by bit after the band
(`mask.apply_block_mask`), and the softmax treats a row with no visible key yet as the band does. Tile rows are
query positions (no GQA packing with it: a packed tile would span several heads' bits).

cuDNN's paged K/V cache (`paged`): K and V are containers (num_blocks, block_size, H, D) read through int32
block tables. Where tile_n divides a block size, a key tile lies inside one block: the producer's TMA load names
that block (read from the table on the device per tile, clamped to the container: `paged.block_of`) and the
tile's row offset in it (`kv_gmem`); blocks smaller than tile_n (a multiple of 8 rows that divides it) are
spanned, one TMA load per block into its rows of the stage, all on the stage's mbarrier (`load_blocks`). The key
length is seqused_kv clamped to the envelope max_seqlen_kv. Nothing else changes (rows past a sequence's keys
are masked, and V's are zeroed as for any seqused).

Split-KV (`num_splits`, docs/decode.md): the split is the scheduled head index's fastest coordinate; producer and
consumers cut the same key-tile range with `key_split_range` (the mma.sync forward's and the host model's cut), and
a split's consumers write its fp32 O and LSE (no sink) from the registers to the workspace partials, which the
shared combine kernel (`frost.engines.common.split_combine`) reduces into O and Stats.

Head dims: tiles span d_qk and d_v padded up to whole 16-element wgmma K steps
(`tile_head_dim`, `tile_head_dim_v`) while the tensors keep theirs; TMA loads
zero-fill the columns past a head dim (zeros add nothing to Q K^T or P V), TMA
stores clip them and the row-predicated O store of packed sequences skips them.

Arguments follow `frost.engines.sdpa_args` exactly; see `build` for the fakes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Boolean, Float32, Int32, const_expr, pipeline
from cutlass.cute.nvgpu import cpasync, warp, warpgroup

from frost.engines.common import mask, paged, rows, score_mod, tiles
from frost.engines.common import softmax as sm
from frost.engines.common import tile_scheduler as ts
from frost.engines.common.acc_layout import acc_as_mn
from frost.engines.common.seqlen import own_token_offset, rows_offset, seqlen_info
from frost.engines.common.sdpa_entry import IO_DTYPES, FakeArgs, make_entry, select_modes
from frost.engines.common.split_combine_params import key_split_range
from frost.engines.params import score_mod_tags
from frost.engines.sdpa_args import BLOCK_MASK_TILE, fwd_arg_names, ragged_tags
from frost.engines.sm90 import pack_gqa as pg
from frost.engines.sm90 import wgmma_utils as wu
from frost.engines.sm90.sdpa_fwd_params import Sm90FwdParams, paged_span, separate_o, validate

BAR_SCHED = 1  # 1..3: ping-pong turn of consumer warpgroup w
BAR_EPI = 4  # 4..6: epilogue of consumer warpgroup w
BAR_EPI_ALL = 7  # every consumer thread


def kernel_name(params: Sm90FwdParams, arch: str) -> str:
    """Every param appears: dtype, head dims, heads, band, features, then the knobs."""
    p = params
    dims = f"d{p.head_dim}" + (f"v{p.head_dim_v}" if p.head_dim_v != p.head_dim else "")
    parts = [
        "frost_sdpa_fwd_sm90",
        p.dtype,
        dims,
        f"h{p.num_heads_q}"
        + (f"x{p.num_heads_kv}" if p.num_heads_kv != p.num_heads_q else "")
        + (f"v{p.num_heads_v}" if p.num_heads_v else ""),
    ]
    if p.has_window_right and not p.has_window_left:
        parts.append("causal" if not p.bottom_right else "causalbr")
    elif p.has_window_left or p.has_window_right:
        parts.append(
            "band"
            + ("l" if p.has_window_left else "")
            + ("r" if p.has_window_right else "")
            + ("br" if p.bottom_right else "")
        )
    parts += [
        tag
        for flag, tag in (
            (p.is_thd, "thd"),
            (p.has_seqused, "seqused"),
            (p.has_sinks, "sink"),
            (not p.has_lse, "nolse"),
            (p.has_score_max, "smax"),
            (p.has_score_sum_exp, "ssum"),
            *score_mod_tags(p),
            (p.has_block_mask, "bmask"),
        )
        if flag
    ]
    if p.paged:  # paged K/V: the containers' block sizes
        parts.append(f"pg{p.paged_block_k}" + (f"v{p.paged_block_v}" if p.paged_block_v != p.paged_block_k else ""))
    parts += ragged_tags(p)
    parts.append(
        f"m{p.tile_m}n{p.tile_n}s{p.num_stages}"
        + ("" if p.persistent else "np")
        + ("pp" if p.pingpong else "")
        + ("" if p.separate_o_smem else "ao")
        + ("pg" if p.pack_gqa else "")
        + (f"vs{p.v_slices}" if p.v_slices > 1 else "")
        + f"sm{p.sm_count}"
        + (f"sp{p.num_splits}" if p.split else "")
    )
    return "_".join(parts)


class _Mainloop(NamedTuple):
    """What every K/V block step of a consumer warpgroup reads, bound once per kernel (trace-time record).
    The state a step updates in place (the O accumulator, the pipeline state) travels beside it."""

    tOrP: Any
    tSrQ: Any
    tSrK: Any
    tOrVt: Any
    row_max: Any
    row_sum: Any
    row_scale: Any
    tScS_mn: Any
    t0ScS_mn: Any
    pipe_k: Any
    pipe_v: Any
    tiled_mma_qk: Any
    tiled_mma_pv: Any
    scale_log2: Any
    wg: Any
    softmax_scale: Any = None  # with score modifiers: the logit scale they apply (the softmax's is then 1)
    thr_qk: Any = None  # with score modifiers: this thread's slice of the QK^T MMA (the bias's partition)
    mBias: Any = None  # with a bias: the declared (B or 1, H or 1, S_q, S_kv) tensor
    mBlockMask: Any = None  # with block_mask: the declared uint8 (B, Hq, q tiles, key-tile bytes) tensor


class _Lengths(NamedTuple):
    """The device lengths both roles read (None where the form has none): packed prefix sums, padded lengths, and
    the packed form's envelopes (max_seqlen_q, max_seqlen_kv) each length is capped at."""

    mCuQ: Any
    mCuK: Any
    mUsedQ: Any
    mUsedK: Any
    max_q: Any
    max_k: Any


class _Sched(NamedTuple):
    """The tile scheduler's extents, the same for every role: batch entries, query tiles per entry, work tiles,
    and the width of a longest-first section (`tile_scheduler`)."""

    num_batch: Any
    num_m_blocks: Any
    total_tiles: Any
    section_width: Any


class _PagedKv(NamedTuple):
    """Where the producer reads one paged container's key tiles (made once per work tile): the head's
    (block_size, D, num_blocks) view, the sequence's table row, the shared tile stages (TMA-grouped), the
    block size, the tile's columns and O's column slice."""

    m: Any
    table: Any
    smem: Any
    block: Any
    cols: Any
    vsl: Any


class _Smem(NamedTuple):
    """The shared tiles: Q, the K and V stages, O (its own, or Q's where it aliases it)."""

    sQ: Any
    sK: Any
    sV: Any
    sO: Any


class _OutStage(NamedTuple):
    """How O leaves a consumer warpgroup (made once per kernel): the shared O tile (and its (rows, columns) view),
    the register-to-shared copy and this thread's part of it, the O coordinates of this thread's values, O's TMA
    atom (None where O leaves as rows)."""

    sO: Any
    sO_mn: Any
    tRsO: Any
    r2s: Any
    tOcO_mn: Any
    tma_atom_o: Any


class _TileBand(NamedTuple):
    """One work tile's place in the mask: its first row, the key extent, the diagonal offset and the
    clamped windows (None when absent). Made once per tile."""

    row0: Any
    seqlen_k: Any
    off: Any
    wl: Any
    wr: Any
    mods: Any = None  # _TileMods with score modifiers
    bm_at: Any = None  # with block_mask: the tile's (batch entry, query head, seqlen_q)
    bm_rows: Any = None  # with block_mask: where its bits start (`SdpaFwdSm90.bm_rows`)


class _TileMods(NamedTuple):
    """One work tile's score modifiers (`score_mod.sequence_mods`): where its bias tiles are (batch entry, query
    head, m block: each key block's tile is addressed from the kernel argument, which keeps no 64-bit pointer live
    across the mainloop), the row and column limits the bias is read below, ALiBi's slope (None without)."""

    batch: Any
    head: Any
    m_block: Any
    row_limit: Any
    col_limit: Any
    slope: Any


class SdpaFwdSm90:
    """The kernel object: host-side launch (`launch`, the jit entry's body) and the device kernel."""

    def __init__(self, params: Sm90FwdParams):
        validate(params)
        p = self.p = params
        self.dtype = IO_DTYPES[p.dtype]
        self.tile_m, self.tile_n = p.tile_m, p.tile_n
        # tiles span the head dims padded to whole wgmma K steps; the tensors keep theirs (see HEAD_DIM_GRANULE)
        self.hd, self.hdv = p.tile_head_dim, p.tile_head_dim_v
        self.cols_o = p.head_dim_v if self.hdv != p.head_dim_v else 0  # O's columns, where the tile is wider
        self.stages = p.num_stages
        self.num_wg = p.tile_m // 64
        self.num_mma_threads = 128 * self.num_wg
        self.num_threads = self.num_mma_threads + 128
        self.mma_regs, self.load_regs = {1: (256, 56), 2: (240, 24), 3: (160, 32)}[self.num_wg]
        self.ratio = p.num_heads_q // p.num_heads_kv
        self.ratio_v = p.qhead_per_vhead  # V's group (K's unless num_heads_v is set)
        # GQA packing: a tile's rows are (query position, head of the group) pairs, m = s * rq + j
        self.pack = p.pack_gqa
        self.rq = p.rows_per_query
        self.qt = self.tile_m // self.rq  # query positions per M tile
        # (head, O column slice) pairs the scheduler iterates; a slice recomputes S for its own columns of O
        self.vs = p.v_slices
        # split-KV: each (head, slice) pair's key tiles in num_splits pieces, the split the fastest coordinate (a
        # query tile's splits run side by side and share its Q in L2)
        self.ns = p.num_splits
        self.tile_heads = (p.num_heads_q // self.rq if self.pack else p.num_heads_q) * self.vs * self.ns
        self.reverse_m = p.has_window_right
        self.pingpong = p.pingpong and self.num_wg >= 2
        self.separate_o = separate_o(p)

    # ------------------------------------------------------------------ host side
    @cute.jit
    def launch(self, a: dict):
        """`a`: the sdpa_args arguments by name, tensors in canonical views (max_seqlen_q / max_seqlen_kv cap the
        packed lengths; the grid comes from tensor extents)."""
        p = self.p
        dt = self.dtype
        thd = const_expr(p.is_thd)
        # kernel views: (seq, d, head[, batch]) for Q/K/V/O, (seq, head[, batch]) for LSE
        if const_expr(thd):
            mQ, mK, mV, mO = [select_modes(t, [0, 2, 1]) for t in (a["q"], a["k"], a["v"], a["o"])]
            mLSE = None
            if const_expr(p.has_lse):  # per-batch Stats of the ragged form are indexed as a dense batch's
                mLSE = select_modes(a["lse"], [2, 1, 0] if const_expr(p.stats_per_batch) else [1, 0])
        else:
            mQ, mK, mV, mO = [select_modes(t, [1, 3, 2, 0]) for t in (a["q"], a["k"], a["v"], a["o"])]
            mLSE = select_modes(a["lse"], [2, 1, 0]) if const_expr(p.has_lse) else None
        mMax, mSumExp = self.row_view(a.get("score_max")), self.row_view(a.get("score_sum_exp"))
        seq_q = mQ.shape[0]
        if const_expr(self.pack):
            mQ, mO = pg.pack_heads(mQ, self.rq, 2), pg.pack_heads(mO, self.rq, 2)
            if const_expr(p.has_lse):
                mLSE = pg.pack_heads(mLSE, self.rq, 1)
        mPartials = self.partial_views(a)
        # TMA boxes: a packed tile of rows is (rq heads, rows / rq positions)
        q_box = (self.rq, self.qt) if const_expr(self.pack) else self.tile_m
        o_box = (self.rq, 64 // self.rq) if const_expr(self.pack) else 64

        K = cute.nvgpu.OperandMajorMode.K
        MN = cute.nvgpu.OperandMajorMode.MN
        tiled_mma_qk = sm90_utils.make_trivial_tiled_mma(dt, dt, K, K, Float32, (self.num_wg, 1, 1), (64, self.tile_n))
        tiled_mma_pv = sm90_utils.make_trivial_tiled_mma(
            dt, dt, K, MN, Float32, (self.num_wg, 1, 1), (64, self.hdv), warpgroup.OperandSource.RMEM
        )

        sQ_layout = cute.tile_to_shape(wu.smem_atom(dt, self.hd), (self.tile_m, self.hd), order=(0, 1))
        sK_layout = cute.tile_to_shape(wu.smem_atom(dt, self.hd), (self.tile_n, self.hd, self.stages), order=(0, 1, 2))
        sV_layout = cute.tile_to_shape(
            wu.smem_atom(dt, self.hdv), (self.tile_n, self.hdv, self.stages), order=(0, 1, 2)
        )
        sO_layout = cute.tile_to_shape(wu.smem_atom(dt, self.hdv), (64, self.hdv, self.num_wg), order=(0, 1, 2))

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_atom_q, tma_q = cpasync.make_tiled_tma_atom(g2s, mQ, sQ_layout, (q_box, self.hd))
        tma_atom_k, tma_k = self.key_tma(g2s, mK, sK_layout, p.paged_block_k, self.hd)
        tma_atom_v, tma_v = self.key_tma(g2s, mV, sV_layout, p.paged_block_v, self.hdv)
        tma_atom_o, tma_o = None, mO
        if const_expr(not thd):
            tma_atom_o, tma_o = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(), mO, cute.select(sO_layout, mode=[0, 1]), (o_box, self.hdv)
            )
        q_bytes = cute.size_in_bytes(dt, sQ_layout)
        k_bytes = cute.size_in_bytes(dt, cute.select(sK_layout, mode=[0, 1]))
        v_bytes = cute.size_in_bytes(dt, cute.select(sV_layout, mode=[0, 1]))

        if const_expr(thd):
            num_batch = a["cu_seqlens_q"].shape[0] - 1
            num_m_blocks = Int32(0)
            total_tiles = ts.varlen_tiles_bound(seq_q, num_batch, self.tile_heads, self.qt)
        else:
            num_batch = mQ.shape[3]
            num_m_blocks = (seq_q + (self.qt - 1)) // self.qt
            total_tiles = num_m_blocks * self.tile_heads * num_batch
        # dense longest-first order: one section over every (batch, head) pair
        section_width = Int32(0)
        if const_expr(not thd):
            section_width = self.tile_heads * num_batch
        grid = ts.grid_size(total_tiles, p.sm_count, p.persistent)
        # a paged cache's block tables and key envelope S_kv (a container's rows are not a sequence's)
        paged_args = None
        if const_expr(p.paged):
            paged_args = (a["k_table"], a["v_table"], a["max_seqlen_kv"])

        # with score modifiers the logits arrive scaled (score_mod) and the softmax's exp2 factor is log2(e)
        scale = Float32(a["softmax_scale"])
        softmax_scale = scale if const_expr(p.has_score_mods) else None
        scale_log2 = Float32(sm.LOG2_E) if const_expr(p.has_score_mods) else scale * Float32(sm.LOG2_E)
        wl = Int32(a["window_left"]) if const_expr(p.has_window_left) else None
        wr = Int32(a["window_right"]) if const_expr(p.has_window_right) else None

        stages = self.stages
        o_elems = cute.cosize(sO_layout) if const_expr(self.separate_o) else 0
        # O reusing Q's tile: the tile is as large as the larger of the two (d_v above d_qk)
        q_elems = (
            cute.cosize(sQ_layout)
            if const_expr(self.separate_o)
            else max(cute.cosize(sQ_layout), cute.cosize(sO_layout))
        )

        @cute.struct
        class SharedStorage:
            mbar_q: cute.struct.MemRange[cutlass.Int64, 2]
            mbar_k: cute.struct.MemRange[cutlass.Int64, 2 * stages]
            mbar_v: cute.struct.MemRange[cutlass.Int64, 2 * stages]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, q_elems], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sV_layout)], 1024]
            sO: cute.struct.Align[cute.struct.MemRange[dt, o_elems], 1024]

        maxima = (None, None)  # the packed form's envelopes, each length is capped at
        if const_expr(thd):
            maxima = (a["max_seqlen_q"], a["max_seqlen_kv"])
        self.kernel(
            tma_q,
            tma_k,
            tma_v,
            tma_o,
            mLSE,
            mMax,
            mSumExp,
            a.get("cu_seqlens_q"),
            a.get("cu_seqlens_kv"),
            a.get("seqused_q"),
            a.get("seqused_kv"),
            maxima,
            a.get("sinks"),
            a.get("lse_offsets"),
            a.get("o_offsets"),
            a.get("v_offsets"),
            (a.get("score_max_offsets"), a.get("score_sum_exp_offsets")),
            a.get("bias"),
            a.get("block_mask"),
            paged_args,
            mPartials,
            tma_atom_q,
            tma_atom_k,
            tma_atom_v,
            tma_atom_o,
            scale_log2,
            softmax_scale,
            wl,
            wr,
            num_batch,
            num_m_blocks,
            total_tiles,
            section_width,
            q_bytes,
            k_bytes,
            v_bytes,
            sQ_layout,
            sK_layout,
            sV_layout,
            sO_layout,
            tiled_mma_qk,
            tiled_mma_pv,
            SharedStorage,
        ).launch(grid=[grid, 1, 1], block=[self.num_threads, 1, 1], stream=a["stream"], min_blocks_per_mp=1)

    def key_tma(self, g2s, mX, s_layout, paged_block: int, width: int):
        """K's (V's) TMA atom and tensor: one box per key tile, or with a paged cache whose blocks are smaller than
        the tile, one box per block of the tile's blocks (`block_rows`)."""
        if const_expr(paged_span(paged_block, self.tile_n)):
            return cpasync.make_tiled_tma_atom(
                g2s, mX, self.block_rows(s_layout, paged_block, width), (paged_block, width), 1
            )
        return cpasync.make_tiled_tma_atom(g2s, mX, cute.select(s_layout, mode=[0, 1]), (self.tile_n, width), 1)

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        mLSE,
        mMax,
        mSumExp,
        mCuQ,
        mCuK,
        mUsedQ,
        mUsedK,
        maxima,
        mSinks,
        mLseOff,
        mOOff,
        mVOff,
        mScoreOffs,
        mBias,
        mBlockMask,
        mPaged,
        mPartials,
        tma_atom_q: cute.CopyAtom,
        tma_atom_k: cute.CopyAtom,
        tma_atom_v: cute.CopyAtom,
        tma_atom_o,
        scale_log2: Float32,
        softmax_scale,
        wl,
        wr,
        num_batch: Int32,
        num_m_blocks: Int32,
        total_tiles: Int32,
        section_width: Int32,
        q_bytes: cutlass.Constexpr,
        k_bytes: cutlass.Constexpr,
        v_bytes: cutlass.Constexpr,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sO_layout: cute.ComposedLayout,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            cpasync.prefetch_descriptor(tma_atom_q)
            cpasync.prefetch_descriptor(tma_atom_k)
            cpasync.prefetch_descriptor(tma_atom_v)
            if const_expr(tma_atom_o is not None):
                cpasync.prefetch_descriptor(tma_atom_o)

        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        pipe_q, pipe_k, pipe_v = wu.tma_pipelines(
            self.num_mma_threads,
            (storage.mbar_q.data_ptr(), 1, q_bytes),
            (storage.mbar_k.data_ptr(), self.stages, k_bytes),
            (storage.mbar_v.data_ptr(), self.stages, v_bytes),
        )
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        if const_expr(self.separate_o):
            sO = storage.sO.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)
        else:
            sO = storage.sQ.get_tensor(sO_layout.outer, swizzle=sO_layout.inner, dtype=self.dtype)

        lengths = _Lengths(mCuQ, mCuK, mUsedQ, mUsedK, maxima[0], maxima[1])
        sched = _Sched(num_batch, num_m_blocks, total_tiles, section_width)
        smem = _Smem(sQ, sK, sV, sO)
        pipes = (pipe_q, pipe_k, pipe_v)
        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.load_regs)
            if warp_idx == 0:
                self.producer(
                    mQ,
                    mK,
                    mV,
                    lengths,
                    mVOff,
                    mBlockMask,
                    smem,
                    (tma_atom_q, tma_atom_k, tma_atom_v),
                    pipes,
                    wl,
                    wr,
                    sched,
                    mPaged,
                )
        else:
            cute.arch.setmaxregister_increase(self.mma_regs)
            self.consumer(
                mO,
                mLSE,
                (mMax, mSumExp, mPartials),
                lengths,
                mSinks,
                (mLseOff, mOOff, mScoreOffs),
                smem,
                tma_atom_o,
                pipes,
                (scale_log2, softmax_scale, mBias, mBlockMask),
                (wl, wr),
                sched,
                (tiled_mma_qk, tiled_mma_pv),
                (pg.rows_extent(mQ, self.pack), self.key_extent(mK, mPaged)),
            )

    # --- work decomposition shared by producer and consumers
    @cute.jit
    def decode(
        self,
        tile_idx: Int32,
        mCuQ,
        num_batch: Int32,
        num_m_blocks: Int32,
        total_tiles: Int32,
        section_width: Int32,
        cursor_b: Int32,
        cursor_base: Int32,
        total_q=None,
    ):
        """`mCuQ`: `sched_lengths` (prefix sums, or the ragged form's lengths); `total_q`: packed, the query token
        extent the lengths are clamped to (`seqlen.seqlen_info`)."""
        if const_expr(self.p.is_thd and self.reverse_m):
            return ts.varlen_decode_lpt(
                tile_idx, mCuQ, num_batch, self.tile_heads, self.qt, cursor_b, cursor_base, self.p.ragged, total_q
            )
        elif const_expr(self.p.is_thd):
            return ts.varlen_decode(
                tile_idx, mCuQ, num_batch, self.tile_heads, self.qt, cursor_b, cursor_base, self.p.ragged, total_q
            )
        elif const_expr(self.reverse_m):
            m_block, head, batch, valid = ts.dense_decode_lpt(
                tile_idx, num_m_blocks, self.tile_heads, num_batch, section_width
            )
            return m_block, head, batch, valid, cursor_b, cursor_base
        else:
            m_block, head, batch, valid = ts.dense_decode(tile_idx, num_m_blocks, self.tile_heads, total_tiles)
            return m_block, head, batch, valid, cursor_b, cursor_base

    def split_head(self, hv):
        """(head, O column slice) of a scheduled head index; the slice is the constant 0 without slices (split-KV:
        the index's split, `key_split`, comes off first)."""
        if const_expr(self.ns > 1):
            hv = hv // self.ns
        if const_expr(self.vs == 1):
            return hv, 0
        return hv // self.vs, hv % self.vs

    @cute.jit
    def band(self, seqlen_q: Int32, seqlen_k: Int32, wl, wr) -> tiles.Band:
        """The sequence's `tiles.Band`, its windows clamped to its lengths."""
        p = self.p
        return tiles.band(
            seqlen_q,
            seqlen_k,
            wl if const_expr(p.has_window_left) else None,
            wr if const_expr(p.has_window_right) else None,
            p.bottom_right,
            True,
        )

    def key_split(self, hv):
        """Split-KV: the split of a scheduled head index (the constant 0 without splits)."""
        if const_expr(self.ns == 1):
            return 0
        return hv % self.ns

    @cute.jit
    def n_block_range(self, m_block: Int32, seqlen_q: Int32, seqlen_k: Int32, off: Int32, wl, wr, hv):
        """The shared mask's key-tile range of m_block (in query positions), empty past the sequence; split-KV:
        the piece of it that the split of scheduled head index `hv` walks (`key_split_range`, cut from the
        actual lengths, as the host model and the mma.sync forward cut it)."""
        n_min, n_max = mask.n_block_range(m_block, self.qt, self.tile_n, seqlen_q, seqlen_k, off, wl, wr)
        if const_expr(self.ns > 1):
            n_min, n_max = key_split_range(n_min, n_max, self.key_split(hv), self.ns, cutlass.min)
        return n_min, n_max

    @cute.jit
    def bm_rows(self, mBlockMask, at, row0: Int32):
        """Where a work tile's block_mask bits start (`mask.block_mask_rows`: the byte rows of its query blocks),
        made once per tile; `at`: the tile's (batch entry, query head, seqlen_q), row0: its first row (a query
        position: no GQA packing with block_mask)."""
        batch, head, seqlen_q = at
        return mask.block_mask_rows(mBlockMask, batch, head, row0, self.tile_m, seqlen_q)

    @cute.jit
    def tile_visible(self, rows, n_block: Int32, seqlen_k: Int32):
        """Does key block n_block hold a key the work tile's rows may see by the block_mask bits (`rows`:
        `bm_rows`)? Producer and consumers ask the same question of the same bits, so they visit the same blocks."""
        return mask.block_mask_tile_visible(rows, n_block, self.tile_m, self.tile_n, seqlen_k)

    @cute.jit
    def last_visible(self, rows, n_min: Int32, n_max: Int32, seqlen_k: Int32):
        """The first key block a work tile visits (blocks run from the top down): the last of [n_min, n_max) that
        `tile_visible` keeps, n_min - 1 when the block_mask clears them all."""
        return mask.block_mask_last_visible(rows, n_min, n_max, self.tile_m, self.tile_n, seqlen_k)

    def key_extent(self, mK, mPaged):
        """The key extent device lengths are clamped to: K's rows, or a paged cache's envelope S_kv (a container's
        rows are not a sequence's)."""
        return mPaged[2] if self.p.paged else mK.shape[0]

    def sched_lengths(self, mCuQ, mUsedQ):
        """What the packed scheduler reads sequence lengths from: the prefix sums, or the ragged form's lengths."""
        return mUsedQ if self.p.ragged else mCuQ

    def head_rows(self, mX, head, batch, offset):
        """The (seq, d) rows of one head of one batch (packed: shifted by the batch's first token)."""
        if const_expr(self.p.is_thd):
            return cute.domain_offset((offset, 0, 0), mX)[None, None, head]
        return mX[None, None, head, batch]

    def q_rows(self, mX, head, batch, offset):
        """head_rows of a Q/O view: packed, the rows of all rq heads of kv head `head` (offset in tokens)."""
        return self.head_rows(mX, head, batch, offset * self.rq)

    @cute.jit
    def next_tile(self, tile_idx: Int32, wave: Int32, total_tiles: Int32):
        """(next tile, next wave, whether to decode it): zigzag over waves under a band."""
        if const_expr(self.p.persistent):
            num_ctas = cute.arch.grid_dim()[0]
            if const_expr(self.reverse_m):
                return ts.zigzag_tile(wave + 1, cute.arch.block_idx()[0], num_ctas), wave + 1, Boolean(True)
            return tile_idx + num_ctas, wave + 1, Boolean(True)
        else:
            return total_tiles, wave, Boolean(False)

    # --- producer warp
    @cute.jit
    def producer(
        self,
        mQ,
        mK,
        mV,
        lengths: _Lengths,
        mVOff,
        mBlockMask,
        smem: _Smem,
        tma_atoms,
        pipes,
        wl,
        wr,
        sched: _Sched,
        mPaged,
    ):
        """Warp 0: per work tile Q, then K and V of the key blocks the consumers visit, in their order (K of a
        block ahead of V of the one before it); with block_mask only the blocks `tile_visible` keeps; with a paged
        cache (`mPaged`: K table, V table, envelope) each key tile from the block its table names."""
        mCuQ, mCuK, mUsedQ, mUsedK, max_q, max_k = lengths
        sQ, sK, sV, _ = smem
        tma_atom_q, tma_atom_k, tma_atom_v = tma_atoms
        pipe_q, pipe_k, pipe_v = pipes
        num_batch, num_m_blocks, total_tiles, section_width = sched
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        tile_idx = Int32(cute.arch.block_idx()[0])
        wave = Int32(0)
        total_q = pg.rows_extent(mQ, self.pack)
        m_block, hv, batch, valid, cur_b, cur_base = self.decode(
            tile_idx,
            self.sched_lengths(mCuQ, mUsedQ),
            num_batch,
            num_m_blocks,
            total_tiles,
            section_width,
            Int32(0),
            Int32(0),
            total_q,
        )
        while valid:
            head, vsl = self.split_head(hv)
            off_q, off_k, seqlen_q, seqlen_k = seqlen_info(
                batch,
                total_q,
                self.key_extent(mK, mPaged),
                mCuQ,
                mCuK,
                mUsedQ,
                mUsedK,
                self.p.token_div_q,
                self.p.token_div_kv,
                max_q,
                max_k,
            )
            off_v = own_token_offset(self.p, "v", mVOff, batch, off_k, seqlen_k, mK.shape[0])
            off, wl_c, wr_c = self.band(seqlen_q, seqlen_k, wl, wr)
            n_min, n_max = self.n_block_range(m_block, seqlen_q, seqlen_k, off, wl_c, wr_c, hv)
            has_work = n_max > n_min
            bm_rows, n_top = None, None
            if const_expr(self.p.has_block_mask):  # the consumers' first block: the top visible one
                bm_rows = self.bm_rows(mBlockMask, (batch, head, seqlen_q), m_block * self.tile_m)
                n_top = self.last_visible(bm_rows, n_min, n_max, seqlen_k)
                has_work = n_top >= n_min
            if has_work:
                tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV = self.tile_sources(
                    mQ, mK, mV, mPaged, smem, tma_atoms, (m_block, head, vsl, batch, off_q, off_k, off_v)
                )
                n_last = n_max - 1
                if const_expr(self.p.has_block_mask):
                    n_last = n_top
                pipe_k.producer_acquire(kv_state)
                self.load_key_tile(tma_atom_k, tKgK, tKsK, n_last, pipe_k, kv_state)
                pipe_q.producer_acquire(q_state)
                cute.copy(tma_atom_q, tQgQ, tQsQ, tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
                q_state.advance()
                rest = n_max - 1 - n_min
                if const_expr(self.p.has_block_mask):
                    rest = n_top - n_min
                n_prev = n_last
                kv = (tma_atom_k, tma_atom_v, tKgK, tKsK, tVgV, tVsV, pipe_k, pipe_v)
                # kv_state advances in place and is never rebound in this loop (so the DSL carries the loop's
                # values in the order it always did: without block_mask the IR is unchanged)
                for i in cutlass.range(rest, unroll=1):
                    n_cur = n_last - 1 - i
                    if const_expr(self.p.has_block_mask):
                        if self.tile_visible(bm_rows, n_cur, seqlen_k):  # else the consumers skip it too
                            prev_state = kv_state.clone()
                            kv_state.advance()
                            self.load_kv(kv, n_cur, n_prev, kv_state, prev_state)
                            n_prev = n_cur
                    else:
                        prev_state = kv_state.clone()
                        kv_state.advance()
                        self.load_kv(kv, n_cur, n_prev, kv_state, prev_state)
                        n_prev = n_cur
                pipe_v.producer_acquire(kv_state)
                self.load_key_tile(tma_atom_v, tVgV, tVsV, n_prev, pipe_v, kv_state)
                kv_state.advance()
            else:
                if const_expr(not self.separate_o):
                    # sO lives in sQ: an empty tile still owns the Q slot while it writes zeros
                    gQ = cute.local_tile(self.q_rows(mQ, head, batch, off_q), (self.tile_m, self.hd), (m_block, 0))
                    tQsQ, tQgQ = cpasync.tma_partition(
                        tma_atom_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2)
                    )
                    pipe_q.producer_acquire(q_state)
                    cute.copy(tma_atom_q, tQgQ, tQsQ, tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
                    q_state.advance()
            tile_idx, wave, more = self.next_tile(tile_idx, wave, total_tiles)
            valid = Boolean(False)
            if more:
                m_block, hv, batch, valid, cur_b, cur_base = self.decode(
                    tile_idx,
                    self.sched_lengths(mCuQ, mUsedQ),
                    num_batch,
                    num_m_blocks,
                    total_tiles,
                    section_width,
                    cur_b,
                    cur_base,
                    total_q,
                )

    @cute.jit
    def tile_sources(self, mQ, mK, mV, mPaged, smem: _Smem, tma_atoms, at):
        """One work tile's TMA partitions: Q's (shared, global), then K's and V's (shared stages, the global source
        `kv_gmem` takes a key tile from). `at`: (m_block, head, O column slice, batch entry, Q's, K's and V's first
        tokens)."""
        m_block, head, vsl, batch, off_q, off_k, off_v = at
        sQ, sK, sV, _ = smem
        tma_atom_q, tma_atom_k, tma_atom_v = tma_atoms
        head_kv = head if const_expr(self.pack) else head // self.ratio
        head_v = head_kv
        if const_expr(self.p.num_heads_v):  # K and V heads apart (packed: `head` is a group of rq)
            head_kv = head // (self.ratio // self.rq) if const_expr(self.pack) else head // self.ratio
            head_v = head // (self.ratio_v // self.rq) if const_expr(self.pack) else head // self.ratio_v
        gQ = cute.local_tile(self.q_rows(mQ, head, batch, off_q), (self.tile_m, self.hd), (m_block, 0))
        if const_expr(not self.p.paged):
            gK = cute.local_tile(self.head_rows(mK, head_kv, batch, off_k), (self.tile_n, self.hd), (None, 0))
            gV = cute.local_tile(self.head_rows(mV, head_v, batch, off_v), (self.tile_n, self.hdv), (None, vsl))
        tQsQ, tQgQ = cpasync.tma_partition(
            tma_atom_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2)
        )
        if const_expr(self.p.paged):  # each key tile's source is found in its block per load (`kv_gmem`)
            tKsK, tKgK = self.paged_source(
                tma_atom_k, mK, mPaged[0], sK, head_kv, batch, self.p.paged_block_k, self.hd, 0
            )
            tVsV, tVgV = self.paged_source(
                tma_atom_v, mV, mPaged[1], sV, head_v, batch, self.p.paged_block_v, self.hdv, vsl
            )
        else:
            tKsK, tKgK = cpasync.tma_partition(
                tma_atom_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2)
            )
            tVsV, tVgV = cpasync.tma_partition(
                tma_atom_v, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2)
            )
        return tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV

    @cute.jit
    def load_kv(self, kv, n_cur: Int32, n_prev: Int32, kv_state, prev_state):
        """K of block n_cur into kv_state's stage, then V of the block visited before it (n_prev) into its stage,
        prev_state's; `kv`: (TMA atoms of K and V, their partitions (gmem, smem), their pipelines)."""
        tma_atom_k, tma_atom_v, tKgK, tKsK, tVgV, tVsV, pipe_k, pipe_v = kv
        pipe_k.producer_acquire(kv_state)
        self.load_key_tile(tma_atom_k, tKgK, tKsK, n_cur, pipe_k, kv_state)
        pipe_v.producer_acquire(prev_state)
        self.load_key_tile(tma_atom_v, tVgV, tVsV, n_prev, pipe_v, prev_state)

    @cute.jit
    def paged_source(
        self, atom, mX, mTable, sX, head, batch, block_size: cutlass.Constexpr[int], cols: cutlass.Constexpr[int], vsl
    ):
        """(the shared stages partitioned for TMA, the `_PagedKv` that `kv_gmem` makes each key tile's source
        from) of one paged container, K or V (`cols`: the tile's columns; `vsl`: O's column slice)."""
        m = mX[None, None, head, None]
        if const_expr(paged_span(block_size, self.tile_n)):  # the loads partition their own row slices
            return sX, _PagedKv(m, paged.table_row(mTable, batch), sX, block_size, cols, vsl)
        smem = cute.group_modes(sX, 0, 2)
        g = cute.local_tile(m[None, None, 0], (self.tile_n, cols), (0, vsl))
        tXsX, _ = cpasync.tma_partition(atom, 0, cute.make_layout(1), smem, cute.group_modes(g, 0, 2))
        return tXsX, _PagedKv(m, paged.table_row(mTable, batch), smem, block_size, cols, vsl)

    @cute.jit
    def load_key_tile(self, atom, src, dst, n_block: Int32, pipe, state):
        """TMA-load key tile n_block of K or V into `state`'s stage of `pipe` (`src`, `dst`: from `tile_sources`):
        one load of the tile (`kv_gmem`), or with a paged cache whose blocks are smaller than the tile, one per
        block it spans (`load_blocks`)."""
        if const_expr(self.p.paged and paged_span(src.block, self.tile_n)):
            self.load_blocks(atom, src, n_block, state.index, pipe.producer_get_barrier(state))
        else:
            cute.copy(
                atom,
                self.kv_gmem(atom, src, n_block),
                dst[None, state.index],
                tma_bar_ptr=pipe.producer_get_barrier(state),
            )

    @cute.jit
    def load_blocks(self, atom, src, n_block: Int32, stage, bar):
        """Key tile n_block of a paged container whose blocks it spans (`src` a `_PagedKv`, its smem the
        (tile_n, cols, stages) tiles): block j of the tile's tile_n / block_size names its own block from the
        table (`paged.span_block_of`: index and block clamped) and lands in rows [j * block_size, (j + 1) *
        block_size) of the stage, whole swizzle atoms since block_size is a multiple of 8. Every load completes
        on `bar`, whose expected bytes are the whole tile's, as for one load."""
        per = self.tile_n // src.block
        sX = src.smem[None, None, stage]
        num_blocks = cute.size(src.m, mode=[2])
        for j in cutlass.range(per, unroll=1):  # a loop, not unrolled: the producer warp's registers are few
            block = paged.span_block_of(src.table, n_block * per + j, num_blocks)
            g = cute.local_tile(src.m[None, None, block], (src.block, src.cols), (0, src.vsl))
            s = cute.local_tile(sX, (src.block, src.cols), (j, 0))
            tXsX, tXgX = cpasync.tma_partition(
                atom, 0, cute.make_layout(1), cute.group_modes(s, 0, 2), cute.group_modes(g, 0, 2)
            )
            cute.copy(atom, tXgX, tXsX, tma_bar_ptr=bar)

    def block_rows(self, s_layout, block_size: int, cols: int):
        """The shared layout of one block's rows of a K or V stage (the first block_size rows of the (tile_n,
        cols) tile, its column atoms still tile_n rows apart): the box a spanned tile's per-block TMA loads fill."""
        return cute.composition(
            cute.select(s_layout, mode=[0, 1]), cute.make_layout((block_size, cols), stride=(1, self.tile_n))
        )

    @cute.jit
    def kv_gmem(self, atom, src, n_block: Int32):
        """The TMA source of key tile n_block: dense, the tile's slice of the head's partition (`src`); paged
        (`src` a `_PagedKv`), the tile of the block the table names (clamped to the container), at the tile's row
        offset in that block."""
        if const_expr(self.p.paged):
            first = n_block * self.tile_n
            block = paged.block_of(src.table, first // src.block, cute.size(src.m, mode=[2]))
            g = cute.local_tile(
                src.m[None, None, block], (self.tile_n, src.cols), ((first % src.block) // self.tile_n, src.vsl)
            )
            _, tXgX = cpasync.tma_partition(atom, 0, cute.make_layout(1), src.smem, cute.group_modes(g, 0, 2))
            return tXgX
        return src[None, n_block]

    # --- consumer warpgroups
    @cute.jit
    def sched_sync(self, wg: Int32):
        if const_expr(self.pingpong):
            cute.arch.barrier(barrier_id=BAR_SCHED + wg, number_of_threads=256)

    @cute.jit
    def sched_arrive(self, wg: Int32):
        if const_expr(self.pingpong):
            nxt = wg + 1
            if const_expr(self.num_wg == 2):
                nxt = 1 - wg
            else:
                nxt = 0 if wg == self.num_wg - 1 else wg + 1
            cute.arch.barrier_arrive(barrier_id=BAR_SCHED + nxt, number_of_threads=256)

    @cute.jit
    def one_block(self, c: _Mainloop, t: _TileBand, acc_O, n_block: Int32, kv_state, masked: cutlass.Constexpr[bool]):
        """QK^T of block n_block overlapped with PV of the previous block; softmax of n_block."""
        v_state = kv_state.clone()
        kv_state.advance()
        c.pipe_k.consumer_wait(kv_state, c.pipe_k.consumer_try_wait(kv_state))
        self.sched_sync(c.wg)
        acc_S = cute.make_rmem_tensor(c.tiled_mma_qk.partition_shape_C((self.tile_m, self.tile_n)), Float32)
        wu.gemm(c.tiled_mma_qk, acc_S, c.tSrQ, c.tSrK[None, None, None, kv_state.index], zero_init=True, wg_wait=-1)
        c.pipe_v.consumer_wait(v_state, c.pipe_v.consumer_try_wait(v_state))
        wu.gemm(c.tiled_mma_pv, acc_O, c.tOrP, c.tOrVt[None, None, None, v_state.index], zero_init=False, wg_wait=-1)
        self.sched_arrive(c.wg)
        tBgB, rB = None, None  # the bias tile; its first row, loads in flight while QK^T runs (dense: packed
        if const_expr(self.p.has_bias):
            tBgB = self.bias_tile(c, t.mods, n_block)
        if const_expr(self.p.has_bias and not self.p.is_thd):  # plans' checks spill)
            rB = score_mod.fetch_bias(
                tBgB,
                c.tScS_mn,
                c.t0ScS_mn,
                t.row0,
                n_block * self.tile_n,
                t.mods.row_limit,
                t.mods.col_limit,
                False,
                0,
                1,
            )
        warpgroup.wait_group(1)
        c.pipe_k.consumer_release(kv_state)
        if const_expr(self.p.has_score_mods):  # every block but the last lies inside the key length
            self.add_mods(c, t.row0, t.mods, acc_S, n_block, False, rB, tBgB)
        if const_expr(masked):
            mask.apply_mask(
                acc_as_mn(acc_S),
                c.tScS_mn,
                c.t0ScS_mn,
                t.row0,
                n_block * self.tile_n,
                t.seqlen_k,
                t.off,
                t.wl,
                t.wr,
                mask_seqlen=False,
                rows_per_query=self.rq,
            )
        if const_expr(self.p.has_block_mask):
            self.block_mask(c, t.bm_at, t.bm_rows, t.row0, acc_S, n_block)
        sm.online_softmax(acc_as_mn(acc_S), c.row_max, c.row_sum, c.row_scale, c.scale_log2, is_first=False)
        warpgroup.wait_group(0)
        c.pipe_v.consumer_release(v_state)
        wu.convert_to_16bit(wu.acc_view_as_a(acc_S), c.tOrP)
        sm.rescale_rows(acc_as_mn(acc_O), c.row_scale)
        return kv_state

    @cute.jit
    def visit_block(self, c: _Mainloop, t: _TileBand, acc_O, n_block: Int32, kv_state, masked: cutlass.Constexpr[bool]):
        """`one_block` for a key block after the first: with block_mask only where `tile_visible` keeps it (the
        producer loaded exactly those), a skipped block advancing no pipeline state."""
        if const_expr(self.p.has_block_mask):
            if self.tile_visible(t.bm_rows, n_block, t.seqlen_k):
                kv_state = self.one_block(c, t, acc_O, n_block, kv_state, masked=masked)
        else:
            kv_state = self.one_block(c, t, acc_O, n_block, kv_state, masked=masked)
        return kv_state

    @cute.jit
    def block_mask(self, c: _Mainloop, at, rows, row0: Int32, acc_S, n_block: Int32):
        """Key block n_block's scores whose block_mask bit is clear to -inf, for a visited block; `at`: the tile's
        (batch entry, query head, seqlen_q), whose bits are addressed from the kernel argument per block, `rows`:
        its `bm_rows`. A block inside one 128x128 block (tile_m and tile_n dividing 128) was visited because its
        bit is set: it needs nothing, unless `tile_visible` could not read the bits (`mask.block_mask_unread`)."""
        batch, head, _ = at
        one_query_block = BLOCK_MASK_TILE % self.tile_m == 0
        one_key_block = BLOCK_MASK_TILE % self.tile_n == 0
        mBM = c.mBlockMask[batch, head, None, None]
        if const_expr(one_query_block and one_key_block):
            if mask.block_mask_unread(rows):
                mask.apply_block_mask(
                    acc_as_mn(acc_S),
                    c.tScS_mn,
                    c.t0ScS_mn,
                    mBM,
                    row0,
                    n_block * self.tile_n,
                    one_query_block=True,
                    one_key_block=True,
                )
        else:
            mask.apply_block_mask(
                acc_as_mn(acc_S),
                c.tScS_mn,
                c.t0ScS_mn,
                mBM,
                row0,
                n_block * self.tile_n,
                one_query_block=one_query_block,
            )

    @cute.jit
    def add_mods(
        self,
        c: _Mainloop,
        row0: Int32,
        m: _TileMods,
        acc_S,
        n_block: Int32,
        check_cols: cutlass.Constexpr[bool],
        rB=None,
        tBgB=None,
    ):
        """Scale key block n_block's scores and add the bias and ALiBi (`score_mod.add_score_mods`; `rB`: its
        first rows already fetched from `tBgB`, the block's `bias_tile`, made here when not given); a packed
        sequence may outgrow its bias, so its columns are always checked."""
        p = self.p
        if const_expr(p.has_bias and tBgB is None):
            tBgB = self.bias_tile(c, m, n_block)
        score_mod.add_score_mods(
            acc_as_mn(acc_S),
            c.tScS_mn,
            c.t0ScS_mn,
            tBgB,
            c.softmax_scale,
            row0,
            n_block * self.tile_n,
            m.row_limit,
            m.col_limit,
            m.slope,
            check_cols=check_cols or p.is_thd,
            rB=rB,
        )

    def bias_tile(self, c: _Mainloop, m: _TileMods, n_block: Int32) -> cute.Tensor:
        """This thread's bias elements of key block n_block, as the scores' (rows, cols) view."""
        p = self.p
        mB = score_mod.bias_rows(c.mBias, m.batch, m.head, p.bias_per_batch, p.bias_per_head)
        return acc_as_mn(c.thr_qk.partition_C(cute.local_tile(mB, (self.tile_m, self.tile_n), (m.m_block, n_block))))

    @cute.jit
    def consumer(
        self,
        mO,
        mLSE,
        mScores,
        lengths: _Lengths,
        mSinks,
        row_offsets,
        smem: _Smem,
        tma_atom_o,
        pipes,
        scales,
        windows,
        sched: _Sched,
        mmas,
        static_lengths,
    ):
        """The MMA warpgroups: per work tile its key blocks (`tile_mainloop`), then O and the row statistics out."""
        p = self.p
        mCuQ, mCuK, mUsedQ, mUsedK, max_q, max_k = lengths
        sV = smem.sV
        pipe_q = pipes[0]
        wl, wr = windows
        num_batch, num_m_blocks, total_tiles, section_width = sched
        seqlen_q_static, seqlen_k_static = static_lengths
        # mBias: None without score modifiers; mBlockMask: None without block_mask
        mBias, mBlockMask = scales[2:]
        tidx = cute.arch.thread_idx()[0] - 128
        wg = cute.arch.make_warp_uniform(tidx // 128)
        warp_in_wg = cute.arch.make_warp_uniform((tidx // 32) % 4)
        loop, out, acc_O, s_max, s_sum = self.consumer_setup(smem, tma_atom_o, pipes, scales, mmas, tidx, wg)
        row_max, row_sum, tScS_mn = loop.row_max, loop.row_sum, loop.tScS_mn

        if const_expr(self.pingpong):
            if wg == 0:
                cute.arch.barrier_arrive(barrier_id=BAR_SCHED, number_of_threads=256)

        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        tile_idx = Int32(cute.arch.block_idx()[0])
        wave = Int32(0)
        m_block, hv, batch, valid, cur_b, cur_base = self.decode(
            tile_idx,
            self.sched_lengths(mCuQ, mUsedQ),
            num_batch,
            num_m_blocks,
            total_tiles,
            section_width,
            Int32(0),
            Int32(0),
            seqlen_q_static,
        )
        while valid:
            head, vsl = self.split_head(hv)
            off_q, off_k, seqlen_q, seqlen_k = seqlen_info(
                batch,
                seqlen_q_static,
                seqlen_k_static,
                mCuQ,
                mCuK,
                mUsedQ,
                mUsedK,
                p.token_div_q,
                p.token_div_kv,
                max_q,
                max_k,
            )
            off_lse, off_o, off_scores = self.row_starts(row_offsets, batch, off_q, seqlen_q, seqlen_q_static)
            off, wl_c, wr_c = self.band(seqlen_q, seqlen_k, wl, wr)
            n_min, n_max = self.n_block_range(m_block, seqlen_q, seqlen_k, off, wl_c, wr_c, hv)
            row0 = m_block * self.tile_m  # first tile row (packed: s * rq + j)
            q0 = m_block * self.qt  # first query position
            has_work = n_max > n_min
            bm_at, bm_rows, n_top = None, None, None
            if const_expr(p.has_block_mask):  # the first block visited: the top one the bits keep (as the producer)
                bm_at = (batch, head, seqlen_q)
                bm_rows = self.bm_rows(mBlockMask, bm_at, row0)
                n_top = self.last_visible(bm_rows, n_min, n_max, seqlen_k)
                has_work = n_top >= n_min
            mods = None
            if const_expr(p.has_score_mods):
                _, row_limit, col_limit, slope = score_mod.sequence_mods(p, mBias, batch, head, seqlen_q, seqlen_k)
                mods = _TileMods(batch, head, m_block, row_limit, col_limit, slope)
            if has_work:
                band = _TileBand(row0, seqlen_k, off, wl_c, wr_c, mods, bm_at, bm_rows)
                kv_state = self.tile_mainloop(
                    loop, band, acc_O, pipe_q, q_state, kv_state, sV, n_min, n_max, n_top, q0, tidx
                )
            else:
                if const_expr(not self.separate_o):
                    pipe_q.consumer_wait(q_state)
                acc_O.fill(0.0)
                sm.softmax_reset(row_max, row_sum)

            if const_expr(self.ns > 1):  # split-KV: this split's partials (the combine adds the sink)
                self.finish_partial(
                    loop,
                    acc_O,
                    mScores[2],
                    out.tOcO_mn,
                    (m_block, head, batch, self.key_split(hv)),
                    (seqlen_q, self.partial_rows(seqlen_q, seqlen_q_static)),
                )
            else:
                sink = self.row_sinks(mSinks, head, row0, tScS_mn)
                self.finish_tile(
                    loop,
                    out,
                    acc_O,
                    (s_max, s_sum),
                    (mO, mLSE, mScores[:2]),
                    sink,
                    (tidx, wg, warp_in_wg),
                    (m_block, head, vsl, batch),
                    (seqlen_q, seqlen_q_static),
                    (off_o, off_lse, off_scores),
                )
            if const_expr(not self.separate_o):
                cute.arch.fence_view_async_shared()
                pipe_q.consumer_release(q_state)
                q_state.advance()
            elif has_work:
                q_state.advance()

            tile_idx, wave, more = self.next_tile(tile_idx, wave, total_tiles)
            valid = Boolean(False)
            if more:
                m_block, hv, batch, valid, cur_b, cur_base = self.decode(
                    tile_idx,
                    self.sched_lengths(mCuQ, mUsedQ),
                    num_batch,
                    num_m_blocks,
                    total_tiles,
                    section_width,
                    cur_b,
                    cur_base,
                    seqlen_q_static,
                )
        if const_expr(not p.is_thd):
            if warp_in_wg == 0:
                cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def consumer_setup(self, smem: _Smem, tma_atom_o, pipes, scales, mmas, tidx: Int32, wg: Int32):
        """What a consumer thread keeps across its work tiles, made once: the `_Mainloop` record (the MMA fragments,
        the row statistics, the pipelines, the score modifiers' and block_mask's pieces), the `_OutStage` of O,
        the O accumulator, and score_max's / score_sum_exp's registers (None where not declared)."""
        p = self.p
        sQ, sK, sV, sO = smem
        _, pipe_k, pipe_v = pipes
        tiled_mma_qk, tiled_mma_pv = mmas
        scale_log2, softmax_scale, mBias, mBlockMask = scales
        thr_qk = tiled_mma_qk.get_slice(tidx)
        wg_qk = tiled_mma_qk.get_slice(wg * 128)
        thr_pv = tiled_mma_pv.get_slice(tidx)
        wg_pv = tiled_mma_pv.get_slice(wg * 128)
        tSrQ = wg_qk.make_fragment_A(wg_qk.partition_A(sQ))
        tSrK = wg_qk.make_fragment_B(wg_qk.partition_B(sK))
        tOrVt = wg_pv.make_fragment_B(wg_pv.partition_B(wu.transpose_view(sV)))
        acc_O = cute.make_rmem_tensor(tiled_mma_pv.partition_shape_C((self.tile_m, self.hdv)), Float32)
        tOrP = wg_pv.make_fragment_A(wg_pv.partition_shape_A((self.tile_m, self.tile_n)))
        cS = cute.make_identity_tensor((self.tile_m, self.tile_n))
        tScS_mn = acc_as_mn(thr_qk.partition_C(cS))
        t0ScS_mn = acc_as_mn(tiled_mma_qk.get_slice(0).partition_C(cS))
        cO = cute.make_identity_tensor((self.tile_m, self.hdv))
        tOcO_mn = acc_as_mn(thr_pv.partition_C(cO))
        n_rows = cute.size(tScS_mn, mode=[0])
        row_max = cute.make_rmem_tensor(n_rows, Float32)
        row_sum = cute.make_rmem_tensor(n_rows, Float32)
        row_scale = cute.make_rmem_tensor(n_rows, Float32)
        # the two halves of the LSE (cuDNN's score_max / score_sum_exp), where declared
        s_max = cute.make_rmem_tensor(n_rows, Float32) if const_expr(p.has_score_max) else None
        s_sum = cute.make_rmem_tensor(n_rows, Float32) if const_expr(p.has_score_sum_exp) else None

        # epilogue pieces
        L = sO.layout
        sO_mn = cute.make_tensor(
            sO.iterator,
            cute.make_layout(((L.shape[0], L.shape[2]), L.shape[1]), stride=((L.stride[0], L.stride[2]), L.stride[1])),
        )
        st_atom = cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        r2s = cute.make_tiled_copy_C(st_atom, tiled_mma_pv)
        thr_r2s = r2s.get_slice(tidx)
        tRsO = thr_r2s.partition_D(sO_mn)
        out = _OutStage(sO, sO_mn, tRsO, r2s, tOcO_mn, tma_atom_o)

        loop = _Mainloop(
            tOrP,
            tSrQ,
            tSrK,
            tOrVt,
            row_max,
            row_sum,
            row_scale,
            tScS_mn,
            t0ScS_mn,
            pipe_k,
            pipe_v,
            tiled_mma_qk,
            tiled_mma_pv,
            scale_log2,
            wg,
        )
        if const_expr(p.has_score_mods):
            loop = loop._replace(softmax_scale=softmax_scale, thr_qk=thr_qk, mBias=mBias)
        if const_expr(p.has_block_mask):
            loop = loop._replace(mBlockMask=mBlockMask)
        return loop, out, acc_O, s_max, s_sum

    @cute.jit
    def row_starts(self, row_offsets, batch: Int32, off_q, seqlen_q: Int32, seqlen_q_static):
        """Where a work tile's rows start in each per-row output: (Stats, O, (score_max, score_sum_exp)); Q's first
        token unless the ragged form gives the output offsets of its own (`row_offsets`: Stats', O's and
        score_max's / score_sum_exp's offset tensors, where given)."""
        p = self.p
        mLseOff, mOOff, mScoreOffs = row_offsets
        off_lse = off_q  # ragged Stats start at their own offsets (clamped so the entry's rows fit)
        if const_expr(mLseOff is not None):
            off_lse = rows_offset(mLseOff, batch, p.token_div_lse, seqlen_q, seqlen_q_static)
        off_o = own_token_offset(p, "o", mOOff, batch, off_q, seqlen_q, seqlen_q_static)
        off_scores = tuple(
            own_token_offset(p, role, off, batch, off_q, seqlen_q, seqlen_q_static)
            for role, off in zip(("score_max", "score_sum_exp"), mScoreOffs)
        )
        return off_lse, off_o, off_scores

    @cute.jit
    def row_sinks(self, mSinks, head, row0, tScS_mn):
        """The sink logit of a work tile's rows (None without sinks): the head's, or packed, one per row (row m is
        head head * rq + m % rq)."""
        sink = None
        if const_expr(self.p.has_sinks):
            if const_expr(self.pack):
                n_rows = cute.size(tScS_mn, mode=[0])
                sink = cute.make_rmem_tensor(n_rows, Float32)
                for r in cutlass.range_constexpr(n_rows):
                    sink[r] = mSinks[head * self.rq + (row0 + tScS_mn[r, 0][0]) % self.rq]
            else:
                sink = Float32(mSinks[head])
        return sink

    @cute.jit
    def finish_tile(self, c: _Mainloop, out: _OutStage, acc_O, scores, outputs, sink, thread, tile, seqlen, offs):
        """A work tile's softmax finalized (with its `sink`), O and the LSE out (`epilogue`), then score_max /
        score_sum_exp (`scores`: their registers, None where not declared). `outputs`: (O, LSE, (score_max,
        score_sum_exp)) views; `offs`: `row_starts`; `thread`, `tile`, `seqlen`: as `epilogue` takes them."""
        p = self.p
        s_max, s_sum = scores
        mO, mLSE, mScores = outputs
        off_o, off_lse, off_scores = offs
        m_block, head, vsl, batch = tile
        seqlen_q, seqlen_q_static = seqlen
        sm.softmax_finalize(
            c.row_max,
            c.row_sum,
            c.scale_log2,
            c.row_scale,
            c.row_sum,
            sink,
            sink_per_row=self.pack,
            score_max=s_max,
            score_sum_exp=s_sum,
        )
        sm.rescale_rows(acc_as_mn(acc_O), c.row_scale)  # row_sum now holds the LSE
        self.epilogue(acc_O, c.row_sum, mO, mLSE, out, thread, tile, seqlen, off_o, off_lse)
        if vsl == 0:  # every slice holds the same row values: the first writes them
            for mX, vals, pad, off_rows in zip(mScores, (s_max, s_sum), (-Float32.inf, Float32(0.0)), off_scores):
                if const_expr(vals is not None):
                    self.store_row_values(
                        mX,
                        vals,
                        pad,
                        out.tOcO_mn,
                        m_block,
                        head,
                        batch,
                        seqlen_q,
                        off_rows,
                        seqlen_q_static,
                        p.stats_per_batch,
                    )

    @cute.jit
    def tile_mainloop(
        self, loop: _Mainloop, band: _TileBand, acc_O, pipe_q, q_state, kv_state, sV, n_min, n_max, n_top, q0, tidx
    ):
        """One work tile's key blocks, n_max - 1 (with block_mask the top visible one) down to n_min: the first with
        every mask, then the masked right edge, the unmasked middle, the masked left edge, the last PV; returns
        the K / V pipeline state after them."""
        p = self.p
        (
            tOrP,
            tSrQ,
            tSrK,
            tOrVt,
            row_max,
            row_sum,
            row_scale,
            tScS_mn,
            t0ScS_mn,
            pipe_k,
            pipe_v,
            tiled_mma_qk,
            tiled_mma_pv,
            scale_log2,
            wg,
        ) = loop[:15]
        row0, seqlen_k, off, wl_c, wr_c, mods, bm_at, bm_rows = band
        pipe_q.consumer_wait(q_state)
        # first block (with block_mask the first visited): all masks (it may hold the end of the keys)
        n_last = n_max - 1
        if const_expr(p.has_block_mask):
            n_last = n_top
        pipe_k.consumer_wait(kv_state, pipe_k.consumer_try_wait(kv_state))
        acc_S = cute.make_rmem_tensor(tiled_mma_qk.partition_shape_C((self.tile_m, self.tile_n)), Float32)
        wu.gemm(tiled_mma_qk, acc_S, tSrQ, tSrK[None, None, None, kv_state.index], zero_init=True, wg_wait=0)
        pipe_k.consumer_release(kv_state)
        if const_expr(p.has_score_mods):  # the last key block: it may hold the end of the keys
            self.add_mods(loop, row0, mods, acc_S, n_last, True)
        mask.apply_mask(
            acc_as_mn(acc_S),
            tScS_mn,
            t0ScS_mn,
            row0,
            n_last * self.tile_n,
            seqlen_k,
            off,
            wl_c,
            wr_c,
            mask_seqlen=True,
            rows_per_query=self.rq,
        )
        if const_expr(p.has_block_mask):
            self.block_mask(loop, bm_at, bm_rows, row0, acc_S, n_last)
        sm.online_softmax(acc_as_mn(acc_S), row_max, row_sum, row_scale, scale_log2, is_first=True)
        wu.convert_to_16bit(wu.acc_view_as_a(acc_S), tOrP)
        acc_O.fill(0.0)
        if const_expr(p.is_thd or p.has_seqused):
            self.zero_v_tail(sV, pipe_v, kv_state, seqlen_k - n_last * self.tile_n, tidx % 128, wg)
        hi = n_last
        if const_expr(p.has_window_right):
            r_lo = cutlass.max(n_min, cutlass.min(hi, (q0 + off + wr_c) // self.tile_n))
            for i in cutlass.range(hi - r_lo, unroll=1):
                kv_state = self.visit_block(loop, band, acc_O, hi - 1 - i, kv_state, masked=True)
            hi = r_lo
        l_hi = n_min
        if const_expr(p.has_window_left):
            l_hi = cutlass.max(n_min, cutlass.min(hi, (q0 + self.qt + off - wl_c + (self.tile_n - 1)) // self.tile_n))
        for i in cutlass.range(hi - l_hi, unroll=1):
            kv_state = self.visit_block(loop, band, acc_O, hi - 1 - i, kv_state, masked=False)
        if const_expr(p.has_window_left):
            for i in cutlass.range(l_hi - n_min, unroll=1):
                kv_state = self.visit_block(loop, band, acc_O, l_hi - 1 - i, kv_state, masked=True)
        if const_expr(self.separate_o):
            pipe_q.consumer_release(q_state)
        # last PV
        pipe_v.consumer_wait(kv_state, pipe_v.consumer_try_wait(kv_state))
        wu.gemm(tiled_mma_pv, acc_O, tOrP, tOrVt[None, None, None, kv_state.index], zero_init=False, wg_wait=0)
        pipe_v.consumer_release(kv_state)
        kv_state.advance()
        return kv_state

    def row_copy(self):
        """16-byte row copies of (rows, hdv) smem tiles by at most one warpgroup: (tiled copy, threads used);
        rows per pass are a power of two, so they divide tile_n and 64."""
        return rows.row_copy(self.dtype, self.hdv, 128)

    @cute.jit
    def zero_v_tail(self, sV, pipe_v, v_state, limit: Int32, t: Int32, wg: Int32):
        """Zero the V rows of a sequence's last key block that lie past its length.

        TMA zero-fills only outside the tensor; rows past seqused_kv, or past a
        packed sequence's end (the next sequence, or whatever follows the last),
        are loaded as they are, and P = 0 there does not stop 0 * NaN = NaN in
        P.V (K needs nothing: the mask selects -inf over any score). Every
        consumer warpgroup zeroes the whole tail itself (the values written are
        all zero, so the overlap is benign) and syncs only its own 128 threads,
        which keeps ping-pong intact.
        """
        if limit < self.tile_n:
            pipe_v.consumer_wait(v_state)
            tiled, threads = self.row_copy()
            rows.zero_rows(tiled, threads, sV[None, None, v_state.index], limit, t)
            cute.arch.fence_view_async_shared()  # generic-proxy stores before the wgmma (async proxy) reads
            cute.arch.barrier(barrier_id=BAR_EPI + wg, number_of_threads=128)

    @cute.jit
    def epilogue(self, acc_O, lse, mO, mLSE, out: _OutStage, thread, tile, seqlen, off_o, off_lse):
        """O (and the LSE) of one work tile out: rows past the sequence zeroed, staged through shared memory, stored
        by TMA or as rows. `thread`: (thread, warpgroup, warp in it); `tile`: (query tile, head, O column slice,
        batch entry); `seqlen`: (the sequence's query length, the bound tensor's)."""
        p = self.p
        sO, sO_mn, tRsO, r2s, tOcO_mn, tma_atom_o = out
        tidx, wg, warp_in_wg = thread
        m_block, head, vsl, batch = tile
        seqlen_q, seqlen_q_static = seqlen
        row0 = m_block * self.tile_m
        rows_q = seqlen_q * self.rq  # tile rows inside the sequence (packed: rq per query position)
        if const_expr(p.has_seqused):
            # rows past seqused_q are padding: O = 0 whatever Q held there
            a = acc_as_mn(acc_O)
            for r in cutlass.range_constexpr(cute.size(a, mode=[0])):
                if row0 + tOcO_mn[r, 0][0] >= rows_q:
                    for c in cutlass.range_constexpr(cute.size(a, mode=[1])):
                        a[r, c] = 0.0
        rO = cute.make_rmem_tensor_like(acc_O, self.dtype)
        wu.convert_to_16bit(acc_O, rO)

        # sO is free once the previous TMA store read it (and, when it aliases sQ, once every QK^T is done)
        if const_expr(self.separate_o):
            if const_expr(not p.is_thd):
                if warp_in_wg == 0:
                    cute.arch.cp_async_bulk_wait_group(0, read=True)
            cute.arch.barrier(barrier_id=BAR_EPI + wg, number_of_threads=128)
        else:
            cute.arch.barrier(barrier_id=BAR_EPI_ALL, number_of_threads=self.num_mma_threads)
        cute.copy(r2s, r2s.retile(rO), tRsO)
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=BAR_EPI + wg, number_of_threads=128)
        sO_wg = sO[None, None, wg]
        if const_expr(not p.is_thd):
            if warp_in_wg == 0:
                gO = cute.local_tile(mO[None, None, head, batch], (64, self.hdv), (m_block * self.num_wg + wg, vsl))
                tOsO, tOgO = cpasync.tma_partition(
                    tma_atom_o, 0, cute.make_layout(1), cute.group_modes(sO_wg, 0, 2), cute.group_modes(gO, 0, 2)
                )
                cute.copy(tma_atom_o, tOsO, tOgO)
                cute.arch.cp_async_bulk_commit_group()
                if const_expr(not self.separate_o):
                    cute.arch.cp_async_bulk_wait_group(0, read=True)
        else:
            self.store_o_rows(sO_wg, mO, tidx % 128, m_block, wg, head, vsl, rows_q, off_o * self.rq)

        if const_expr(p.has_lse):
            if vsl == 0:  # every slice holds the same LSE: the first writes it
                self.store_row_values(
                    mLSE,
                    lse,
                    -Float32.inf,
                    tOcO_mn,
                    m_block,
                    head,
                    batch,
                    seqlen_q,
                    off_lse,
                    seqlen_q_static,
                    p.stats_per_batch,
                )

    def partial_views(self, a: dict):
        """Split-KV: the workspace partials in the kernel's views, O's (S_q, D_v, H_q, B, split) and the LSE's
        (S_q, H_q, B, split), and with score_max / score_sum_exp the row maxima's (as the LSE's), heads packed as
        Q's; (None, None) without splits."""
        if const_expr(self.ns == 1):
            return None, None
        mOp, mLp = select_modes(a["o_partial"], [3, 4, 2, 1, 0]), select_modes(a["lse_partial"], [3, 2, 1, 0])
        if const_expr(self.pack):
            mOp, mLp = pg.pack_heads(mOp, self.rq, 2), pg.pack_heads(mLp, self.rq, 1)
        if const_expr("max_partial" in a):  # score_max / score_sum_exp: each split's row max, viewed as the LSE's
            mMp = select_modes(a["max_partial"], [3, 2, 1, 0])
            return mOp, mLp, pg.pack_heads(mMp, self.rq, 1) if const_expr(self.pack) else mMp
        return mOp, mLp

    def partial_rows(self, seqlen_q, seqlen_q_static):
        """The query positions of a sequence whose partial rows a split writes: the bound tensor's (dense: the
        combine reads every row), or the sequence's own (packed: the per-batch partials hold max_seq_len_q rows and
        the combine reads those inside the sequence)."""
        return seqlen_q if const_expr(self.p.is_thd) else seqlen_q_static

    @cute.jit
    def finish_partial(self, c: _Mainloop, acc_O, partials, tOcO_mn, tile, seqlen):
        """Split-KV: a work tile's softmax closed without the sink (the combine adds it once), its O (normalized over
        its own keys, fp32) and LSE (natural log) straight from the registers to the workspace partials, and with
        score_max / score_sum_exp its row max (natural units). A split that saw no key has O = 0 and LSE = max =
        -inf; so do rows past the sequence up to the bound tensor's (the combine
        reads every row of the partials; the workspace holds anything). `tile`: (query tile, head, batch entry,
        split); `seqlen`: (the sequence's query length, the query positions whose rows are written:
        `partial_rows`)."""
        mOp, mLp = partials[0], partials[1]
        m_block, head, batch, split = tile
        seqlen_q, seqlen_q_static = seqlen
        s_max, mMp_t = None, None  # score_max / score_sum_exp: the split's row max too (the combine takes their max)
        if const_expr(len(partials) > 2):
            s_max = cute.make_rmem_tensor(cute.size(c.row_sum), Float32)
            mMp_t = partials[2][None, head, batch, split]
        sm.softmax_finalize(c.row_max, c.row_sum, c.scale_log2, c.row_scale, c.row_sum, None, score_max=s_max)
        a = acc_as_mn(acc_O)
        sm.rescale_rows(a, c.row_scale)  # row_sum now holds the LSE
        row0 = m_block * self.tile_m
        rows_q = seqlen_q * self.rq  # tile rows inside the sequence (packed: rq per query position)
        mOp_t = mOp[None, None, head, batch, split]
        mLp_t = mLp[None, head, batch, split]
        for r in cutlass.range_constexpr(cute.size(a, mode=[0])):
            row = row0 + tOcO_mn[r, 0][0]
            if row >= rows_q:  # padding: O = 0 whatever Q held there
                c.row_sum[r] = -Float32.inf
                if const_expr(s_max is not None):
                    s_max[r] = -Float32.inf
                for col in cutlass.range_constexpr(cute.size(a, mode=[1])):
                    a[r, col] = 0.0
            if row < seqlen_q_static * self.rq:
                for col in cutlass.range_constexpr(cute.size(a, mode=[1])):
                    if const_expr(self.cols_o):
                        if tOcO_mn[r, col][1] < self.cols_o:
                            mOp_t[row, tOcO_mn[r, col][1]] = a[r, col]
                    else:
                        mOp_t[row, tOcO_mn[r, col][1]] = a[r, col]
                if tOcO_mn[0][1] == 0:
                    mLp_t[row] = c.row_sum[r]
                    if const_expr(s_max is not None):
                        mMp_t[row] = s_max[r]

    def row_view(self, t):
        """A declared (B, H, S, 1) / (T, H, 1) per-row output (score_max, score_sum_exp) in the kernel's view of
        LSE: (seq, head[, batch]), the head mode packed like LSE's; None when not declared."""
        if t is None:
            return None
        t = select_modes(t, [1, 0] if self.p.is_thd and not self.p.stats_per_batch else [2, 1, 0])
        return pg.pack_heads(t, self.rq, 1) if self.pack else t

    @cute.jit
    def store_row_values(
        self,
        mX,
        vals,
        pad,
        tOcO_mn,
        m_block,
        head,
        batch,
        seqlen_q,
        off_rows,
        seqlen_q_static,
        per_batch: cutlass.Constexpr[bool] = False,
    ):
        """One fp32 value per tile row (LSE, score_max, score_sum_exp) to its (seq, head[, batch]) view: packed
        rows from `off_rows` (the sequence's first token) on, only those inside the sequence, as are `per_batch`
        ones (the ragged form's per-batch Stats, indexed like a dense batch's); dense rows past seqused_q get
        `pad`."""
        row0 = m_block * self.tile_m
        rows_q = seqlen_q * self.rq  # tile rows inside the sequence (packed: rq per query position)
        if tOcO_mn[0][1] == 0:
            for r in cutlass.range_constexpr(cute.size(vals)):
                row = row0 + tOcO_mn[r, 0][0]
                if const_expr(per_batch):
                    if row < rows_q:
                        mX[row, head, batch] = vals[r]
                elif const_expr(self.p.is_thd):
                    if row < rows_q:
                        mX[off_rows * self.rq + row, head] = vals[r]
                else:
                    if row < seqlen_q_static * self.rq:
                        mX[row, head, batch] = vals[r] if row < rows_q else pad

    @cute.jit
    def store_o_rows(self, sO_wg, mO, t: Int32, m_block, wg, head, vsl, rows_q, off_rows):
        """Packed sequences: 16-byte row-predicated stores so no row of a neighbour is touched.

        `rows_q` rows of the sequence are valid; `off_rows` is its first row in mO's row mode. A tile wider
        than d_v stores only the columns left of it (`cols_o`); O's column slice `vsl` starts vsl * hdv columns
        in and stores the columns of d_v left of it (the last slice may pass d_v).
        """
        tiled, threads = self.row_copy()
        if t < threads:
            cols = self.cols_o
            if const_expr(self.vs > 1):
                cols = cutlass.min(Int32(self.p.head_dim_v) - vsl * self.hdv, Int32(self.hdv))
            mO_h = rows.widen(cute.domain_offset((off_rows, 0, 0), mO)[None, None, head], self.hdv * self.vs)
            gO = cute.local_tile(mO_h, (64, self.hdv), (m_block * self.num_wg + wg, vsl))
            rows.store_rows(
                tiled,
                sO_wg,
                gO,
                cute.make_identity_tensor((64, self.hdv)),
                rows_q - (m_block * self.tile_m + wg * 64),
                t,
                cols=cols,
            )


def build(params: Sm90FwdParams, arch: str):
    """(jit entry taking declared-order tensors, fake arguments); every runtime extent is symbolic."""
    names = fwd_arg_names(params)
    return make_entry(SdpaFwdSm90(params).launch, names, params.is_thd, params if params.ragged else None), FakeArgs(
        params
    ).all(names)
