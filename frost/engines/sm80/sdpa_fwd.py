"""SDPA forward of the mma.sync family (sm80 and sm120 budgets) in CuTe DSL.

One CTA computes one (m-tile, query head, batch entry): Q stays in shared
memory, K and V tiles stream through a `num_stages`-deep cp.async pipeline,
S = Q.K^T and O += P.V run on warp-level m16n8k16 MMAs with ldmatrix operand
loads (ldmatrix.trans for V), P is converted to 16 bits in registers and fed
straight back as the A operand. Key tiles outside the mask band are never
visited; only the tiles that straddle the band or the key-length boundary
are masked element by element.

Arguments follow `frost.engines.sdpa_args` exactly (declared-order tensors
viewed canonically by the shared entry, order, mask / sink / LSE semantics).
With score modifiers (an additive bias, ALiBi: `frost.engines.common.score_mod`)
each S tile is scaled and modified in registers before the mask, and the softmax
runs with a scale of 1; without them none of that code is compiled.
Every runtime extent and every non-unit stride is symbolic, so one artifact
serves any batch, lengths and BSHD / BHSD / interleaved layouts.

Head dims between the tiles' 32-element granules (72, 80, 112, ...) run on tiles
padded up to the next granule (`Sm80FwdParams.tile_head_dim`): Q, K and V loads
zero-fill the columns past the head dim in shared memory (so they add nothing to
Q.K^T, which stops at the last 16-column k-slice holding a head-dim column, and give
O columns that are never stored), and O's store skips them.

A paged K/V cache (cuDNN's, params `paged`) changes only where a key tile is read from: each tile lies inside
one block of its container, found through the block tables per tile (`frost.engines.common.paged`), or spans
blocks smaller than it, each of a thread's rows read from its own block (`span_tile`); the key length comes from
seqused_kv, clamped to the envelope max_seqlen_kv.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, NamedTuple

import cutlass
import cutlass.memory
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warp

from frost.engines.common import acc_layout, gqa_rows, mask, paged, rows, score_mod, seqlen, softmax, tiles
from frost.engines.common.sdpa_entry import IO_DTYPES, FakeArgs, make_entry
from frost.engines.common.split_combine_params import key_split_range
from frost.engines.params import score_mod_tags
from frost.engines.sdpa_args import BLOCK_MASK_TILE, fwd_arg_names, ragged_tags
from frost.engines.sm80 import warp_mma
from frost.engines.sm80.sdpa_fwd_params import Sm80FwdParams, paged_span, validate


def kernel_name(params: Sm80FwdParams, arch: str) -> str:
    """frost_sdpa_fwd_<family>_<dtype>_d<qk>[v<v>]_h<Hq>k<Hkv>[_<flags>]_m<tm>n<tn>s<st>w<nw>."""
    p = params
    d = f"d{p.head_dim}" + (f"v{p.head_dim_v}" if p.head_dim_v != p.head_dim else "")
    flags = [
        name
        for on, name in (
            (p.has_window_left, "wl"),
            (p.has_window_right, "wr"),
            (p.bottom_right, "br"),
            (p.has_sinks, "sink"),
            *score_mod_tags(p),
            (p.has_block_mask, "bmask"),
            (p.has_lse, "lse"),
            (p.has_score_max, "smax"),
            (p.has_score_sum_exp, "ssum"),
            (p.has_seqused, "seqused"),
            (p.is_thd, "thd"),
        )
        if on
    ] + ragged_tags(p)
    if p.paged:  # paged K/V: the containers' block sizes
        flags.append(f"pg{p.paged_block_k}" + (f"v{p.paged_block_v}" if p.paged_block_v != p.paged_block_k else ""))
    if p.pack_gqa:  # the query heads of a KV group share the query tiles
        flags.append("pk")
    if p.split:  # split-KV: fp32 partials per split (the combine kernel reduces them)
        flags.append(f"sp{p.num_splits}")
    heads = f"h{p.num_heads_q}k{p.num_heads_kv}" + (f"v{p.num_heads_v}" if p.num_heads_v else "")
    parts = [
        "frost_sdpa_fwd",
        p.family,
        p.dtype,
        d,
        heads,
        *flags,
        f"m{p.tile_m}n{p.tile_n}s{p.num_stages}w{p.num_warps}",
    ]
    return "_".join(parts)


def build(params: Sm80FwdParams, arch: str):
    """(jit entry taking declared-order tensors, fake arguments) for `frost.compiler.compile.compile_kernel`."""
    validate(params)
    names = fwd_arg_names(params)
    kernel = SdpaFwdSm80(params)
    entry = make_entry(kernel.launch, names, params.is_thd, params if params.ragged else None)
    return entry, FakeArgs(params).all(names)


class _Globals(NamedTuple):
    """The kernel's global tensors (None where a flavor does not take one): Q, K, V, O, Stats, (score_max,
    score_sum_exp), sinks, the bias, the block mask, a paged cache's (K table, V table, S_kv envelope), split-KV's
    workspace partials (O, LSE, and the row max where score_max / score_sum_exp are written, else None)."""

    mQ: Any
    mK: Any
    mV: Any
    mO: Any
    mLSE: Any
    mScores: Any
    mSinks: Any
    mBias: Any
    mBlockMask: Any
    paged: Any
    partial: Any


class _Scores(NamedTuple):
    """The logits' scale (None without score modifiers), the softmax's exp2 factor, the windows (None: none)."""

    softmax_scale: Any
    scale_log2: Any
    window_left: Any
    window_right: Any


class _Kit(NamedTuple):
    """The kernel's shared-memory layouts, copies, MMA and storage struct: the same for every tile."""

    sQ_layout: Any
    sK_layout: Any
    sV_layout: Any
    sO_layout: Any
    copy_QK: Any
    copy_V: Any
    copy_O: Any
    tiled_mma: Any
    SharedStorage: Any


class SdpaFwdSm80:
    """The kernel object: host-side launch (`launch`) and the device kernel."""

    def __init__(self, params: Sm80FwdParams):
        p = params
        self.p = p
        self.dtype = IO_DTYPES[p.dtype]
        self.num_threads = 32 * p.num_warps
        self.qpk = p.num_heads_q // p.num_heads_kv
        self.qpv = p.qhead_per_vhead  # V's group (K's unless num_heads_v is set)
        self.rpq = p.rows_per_query  # tile rows per query position (GQA packing: the group's heads)
        self.d, self.dv = p.tile_head_dim, p.tile_head_dim_v  # the tiles' head-dim extents
        # column limits of the copies: the head dim where the tile is wider, else 0 (no column checks)
        self.cols_qk = p.head_dim if self.d != p.head_dim else 0
        self.cols_v = p.head_dim_v if self.dv != p.head_dim_v else 0
        # S = Q.K^T stops at the last 16-wide k-slice holding a head-dim column (0: every slice)
        self.k_slices_qk = -(-p.head_dim // 16) if self.cols_qk else 0
        # every (m-tile, key tile) lies inside one 128x128 block of the block mask: one bit per tile
        self.block_mask_tiles = BLOCK_MASK_TILE % p.tile_m == 0 and BLOCK_MASK_TILE % p.tile_n == 0

    def packed(self, n):
        """`n` query positions in tile rows: times the group's heads when packed (no op traced otherwise)."""
        return n * self.rpq if self.rpq > 1 else n

    # ------------------------------------------------------------------ host
    def _smem_layout(self, rows: int, d: int, stages: int | None):
        """Swizzled (rows, d[, stages]) smem layout: 8 x 64 (or 8 x 32) element atoms, conflict-free ldmatrix."""
        atom = warp_mma.smem_layout_atom(d)
        if stages is None:
            return cute.tile_to_shape(atom, (rows, d), (0, 1))
        return cute.tile_to_shape(atom, (rows, d, stages), (0, 1, 2))

    def _gmem_copy(self, d: int, is_async: bool):
        """128-bit per thread, rows of the tile spread over the CTA."""
        vec = 128 // self.dtype.width
        if is_async:
            atom = cute.make_copy_atom(
                cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), self.dtype, num_bits_per_copy=128
            )
        else:
            atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
        thr = warp_mma.row_thread_layout(self.num_threads, d)
        return cute.make_tiled_copy_tv(atom, thr, cute.make_layout((1, vec)))

    @cute.jit
    def launch(self, a: dict):
        """`a`: the sdpa_args arguments by name, tensors in canonical views."""
        p = self.p
        dt = self.dtype
        sQ_layout = self._smem_layout(p.tile_m, self.d, None)
        sK_layout = self._smem_layout(p.tile_n, self.d, p.num_stages)
        sV_layout = self._smem_layout(p.tile_n, self.dv, p.num_stages)
        sO_layout = self._smem_layout(p.tile_m, self.dv, None)

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sV_layout)], 1024]

        tiled_mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(dt, Float32, (16, 8, 16)),
            (p.num_warps, 1, 1),
            permutation_mnk=(p.num_warps * 16, 16, 16),
        )
        copy_QK = self._gmem_copy(self.d, True)
        copy_V = self._gmem_copy(self.dv, True)
        copy_O = self._gmem_copy(self.dv, False)

        if const_expr(p.is_thd):
            num_batch = a["cu_seqlens_q"].shape[0] - 1
            m_blocks = (self.packed(a["max_seqlen_q"]) + (p.tile_m - 1)) // p.tile_m
        else:
            num_batch = a["q"].shape[0]
            m_blocks = (self.packed(a["q"].shape[1]) + (p.tile_m - 1)) // p.tile_m
        # an empty batch or zero lengths still launch a valid (idle) grid; split-KV: num_splits CTAs per m-tile
        heads = p.num_heads_kv if const_expr(p.pack_gqa) else p.num_heads_q  # packed: one CTA row per KV group
        grid = (cutlass.max(m_blocks, 1) * p.num_splits, heads, cutlass.max(num_batch, 1))
        scale = a["softmax_scale"]
        # the softmax's exp2 factor: with score modifiers the logits arrive scaled (score_mod)
        scale_log2 = Float32(softmax.LOG2_E) if const_expr(p.has_score_mods) else scale * softmax.LOG2_E
        g = a.get
        maxima = (None, None)  # the packed form's envelopes, each length is capped at
        if const_expr(p.is_thd):
            maxima = (a["max_seqlen_q"], a["max_seqlen_kv"])
        self.kernel(
            a["q"],
            a["k"],
            a["v"],
            a["o"],
            g("lse"),
            g("score_max"),
            g("score_sum_exp"),
            g("cu_seqlens_q"),
            g("cu_seqlens_kv"),
            g("seqused_q"),
            g("seqused_kv"),
            maxima,
            g("sinks"),
            g("lse_offsets"),
            g("o_offsets"),
            g("v_offsets"),
            (g("score_max_offsets"), g("score_sum_exp_offsets")),
            g("bias"),
            g("block_mask"),
            (g("k_table"), g("v_table"), g("max_seqlen_kv")),
            (g("o_partial"), g("lse_partial"), g("max_partial")),
            scale if const_expr(p.has_score_mods) else None,
            scale_log2,
            g("window_left"),
            g("window_right"),
            num_batch,
            sQ_layout,
            sK_layout,
            sV_layout,
            sO_layout,
            copy_QK,
            copy_V,
            copy_O,
            tiled_mma,
            SharedStorage,
        ).launch(
            grid=grid,
            block=(self.num_threads, 1, 1),
            smem=SharedStorage.size_in_bytes(),
            stream=a["stream"],
        )

    # ---------------------------------------------------------------- device
    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        mLSE,
        mScoreMax,
        mScoreSumExp,
        mCuQ,
        mCuK,
        mSuQ,
        mSuK,
        maxima,
        mSinks,
        mLseOff,
        mOOff,
        mVOff,
        mScoreOffs,
        mBias,
        mBlockMask,
        mPaged,
        mPartial,
        softmax_scale,
        scale_log2: Float32,
        window_left,
        window_right,
        num_batch: Int32,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sO_layout: cute.ComposedLayout,
        copy_QK: cute.TiledCopy,
        copy_V: cute.TiledCopy,
        copy_O: cute.TiledCopy,
        tiled_mma: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        bx, head, batch = cute.arch.block_idx()
        if batch < num_batch:
            self.cta(
                _Globals(mQ, mK, mV, mO, mLSE, (mScoreMax, mScoreSumExp), mSinks, mBias, mBlockMask, mPaged, mPartial),
                (mCuQ, mCuK, mSuQ, mSuK, maxima[0], maxima[1]),
                mLseOff,
                (mOOff, mVOff, mScoreOffs),
                _Scores(softmax_scale, scale_log2, window_left, window_right),
                _Kit(sQ_layout, sK_layout, sV_layout, sO_layout, copy_QK, copy_V, copy_O, tiled_mma, SharedStorage),
                bx,
                head,
                batch,
            )

    @cute.jit
    def cta(self, g: _Globals, lengths, mLseOff, mOwnOff, sc: _Scores, kit: _Kit, bx, head, batch):
        """Pick this CTA's m-tile of its (head, batch entry) and run it. `lengths`: the device lengths (packed
        prefix sums, padded lengths; None where the form has none) and the packed form's envelopes
        (max_seqlen_q, max_seqlen_kv) each length is capped at."""
        p = self.p
        mCuQ, mCuK, mSuQ, mSuK, max_q, max_k = lengths
        split = Int32(0)
        if const_expr(p.split):  # split-KV: the m-tile's num_splits CTAs are neighbours in x
            split = bx % p.num_splits
            bx = bx // p.num_splits
        static_sq, static_sk = tiles.extents(g.mQ, g.mK, p.is_thd)
        if const_expr(p.paged):  # a container's rows are not a sequence's: the envelope bounds the key length
            static_sk = g.paged[2]
        seq = tiles.sequence(p, batch, static_sq, static_sk, (mCuQ, mCuK, mSuQ, mSuK), max_q, max_k)
        off_q, off_k, seqlen_q, seqlen_k = seq.offset_q, seq.offset_k, seq.seqlen_q, seq.seqlen_k
        off_lse = off_q  # ragged Stats start at their own offsets
        if const_expr(mLseOff is not None):
            off_lse = seqlen.rows_offset(mLseOff, batch, p.token_div_lse, seqlen_q, static_sq)
        # ragged io tensors with offsets of their own (cuDNN's form gives each tensor its own), clamped so the
        # entry's rows fit in each
        off_o = seqlen.own_token_offset(p, "o", mOwnOff[0], batch, off_q, seqlen_q, static_sq)
        off_v = seqlen.own_token_offset(p, "v", mOwnOff[1], batch, off_k, seqlen_k, static_sk)
        off_scores = tuple(
            seqlen.own_token_offset(p, role, off, batch, off_q, seqlen_q, static_sq)
            for role, off in zip(("score_max", "score_sum_exp"), mOwnOff[2])
        )
        # last m-tiles first: under a causal band they carry the most work. Dense batches
        # visit every m-tile of the static length (rows past seqused_q are written as
        # padding); packed sequences only their own.
        if const_expr(p.is_thd):
            m_block = (self.packed(seqlen_q) + (p.tile_m - 1)) // p.tile_m - 1 - bx
        else:
            m_block = (self.packed(static_sq) + (p.tile_m - 1)) // p.tile_m - 1 - bx
        if m_block >= 0:
            self.tile(g, sc, kit, (m_block, split), head, batch, seq, (off_lse, off_o, off_v, off_scores))

    @cute.jit
    def tile(self, g: _Globals, sc: _Scores, kit: _Kit, at, head, batch, seq: tiles.Sequence, offsets):
        """One query tile: its key tiles from the last down (`step`), then O and the row statistics out
        (`epilogue`; split-KV: this split's share of the key tiles, its partials out). `at`: (m-tile, split).
        `offsets`: the first rows of Stats, O, V and score_max / score_sum_exp in their tensors."""
        p = self.p
        m_block, split = at
        mQ, mO, mBias, mBlockMask = g.mQ, g.mO, g.mBias, g.mBlockMask
        softmax_scale, scale_log2, window_left, window_right = sc
        sQ_layout, sK_layout, sV_layout, _, copy_QK, copy_V, _, tiled_mma, SharedStorage = kit
        off_q, off_k, seqlen_q, seqlen_k, static_sq, _ = seq
        _, off_o, off_v, _ = offsets
        tidx, _, _ = cute.arch.thread_idx()
        head_kv = head // self.qpk
        if const_expr(p.pack_gqa):  # `head` is the KV group
            head_kv = head
        head_v = head_kv
        if const_expr(p.num_heads_v):
            head_v = head // self.qpv
        # ---- per-sequence 2-D views (rows, d); packed: rows (r, S) of the group's query heads
        d, dv = self.d, self.dv
        mQ_s = self.query_rows(mQ, head, batch, off_q, d)
        mO_s = self.query_rows(mO, head, batch, off_o, dv)
        gQ = cute.local_tile(mQ_s, (p.tile_m, d), (m_block, 0))
        gO = cute.local_tile(mO_s, (p.tile_m, dv), (m_block, 0))

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout)
        sK = storage.sK.get_tensor(sK_layout)
        sV = storage.sV.get_tensor(sV_layout)
        sVt = acc_layout.transpose_view(sV)

        # ---- gmem -> smem copies
        thr_QK = copy_QK.get_slice(tidx)
        thr_V = copy_V.get_slice(tidx)
        tQgQ, tQsQ = thr_QK.partition_S(gQ), thr_QK.partition_D(sQ)
        tQcQ = thr_QK.partition_S(cute.make_identity_tensor((p.tile_m, d)))
        tKsK, tVsV = thr_QK.partition_D(sK), thr_V.partition_D(sV)
        src = self.key_sources(g, (thr_QK, thr_V), (head_kv, head_v), batch, (off_k, off_v))
        tKcK = thr_QK.partition_S(cute.make_identity_tensor((p.tile_n, d)))
        tVcV = thr_V.partition_S(cute.make_identity_tensor((p.tile_n, dv)))

        r = self.registers(kit, sQ, sK, sVt, tidx)

        # ---- which key tiles to visit, which need masking
        offset = tiles.band(seqlen_q, seqlen_k, window_left, window_right, p.bottom_right, False).diag
        n_min, n_max, lo, hi = self.key_tiles(m_block, split, seqlen_q, seqlen_k, offset, window_left, window_right)
        a_end = cutlass.max(cutlass.min(hi, n_max), n_min)  # [a_end, n_max): masked (right side)
        b_end = cutlass.max(cutlass.min(lo, a_end), n_min)  # [b_end, a_end): unmasked; [n_min, b_end): masked

        mods = None  # score modifiers: this tile's bias rows and ALiBi slope
        if const_expr(p.has_score_mods):
            mods = self.tile_mods(softmax_scale, mBias, m_block, head, batch, seqlen_q, seqlen_k)

        ctx = SimpleNamespace(
            **vars(r),
            tiled_mma=tiled_mma,
            copy_QK=copy_QK,
            copy_V=copy_V,
            src=src,
            tKsK=tKsK,
            tKcK=tKcK,
            tVsV=tVsV,
            tVcV=tVcV,
            scale_log2=scale_log2,
            m_block=m_block,
            n_min=n_min,
            n_max=n_max,
            seqlen_k=seqlen_k,
            offset=offset,
            window_left=window_left,
            window_right=window_right,
            mods=mods,
        )
        if const_expr(p.has_block_mask):  # this (batch entry, head)'s (q tiles, key-tile bytes) bits
            ctx.block_mask = mBlockMask[batch, head, None, None]

        # ---- prologue: cp.async groups [Q + K(b0)], then [V(b_s-1)], [K(b_s)] for s < S
        q_rows = self.packed(seqlen_q) - m_block * p.tile_m  # rows of this tile inside the sequence
        # rows this tile writes: to the sequence end (THD), to the static length (dense)
        store_rows = q_rows if const_expr(p.is_thd) else self.packed(static_sq) - m_block * p.tile_m
        self.prologue(ctx, (tQgQ, tQsQ, tQcQ), q_rows)

        # ---- main loop, last key tile first
        stage = Int32(0)
        for it in cutlass.range(n_max - a_end, unroll=1):
            self.step(ctx, n_max - 1 - it, stage, True)
            stage = self.next_stage(stage)
        for it in cutlass.range(a_end - b_end, unroll=1):
            self.step(ctx, a_end - 1 - it, stage, False)
            stage = self.next_stage(stage)
        if const_expr(window_left is not None):
            for it in cutlass.range(b_end - n_min, unroll=1):
                self.step(ctx, b_end - 1 - it, stage, True)
                stage = self.next_stage(stage)

        if const_expr(p.split):
            self.epilogue_partial(ctx, g, (split, head, batch), q_rows, store_rows, r.num_rows)
        else:
            self.epilogue(ctx, g, kit, sQ, gO, (head, batch), offsets, q_rows, store_rows, r.num_rows, tidx)

    @cute.jit
    def registers(self, kit: _Kit, sQ, sK, sVt, tidx):
        """This thread's MMA fragments and smem -> register copies, the zeroed O accumulator, the softmax state
        and the score coordinates: the same for every key tile of a query tile."""
        p = self.p
        tiled_mma = kit.tiled_mma
        thr_mma = tiled_mma.get_slice(tidx)
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
        tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK[None, None, 0]))
        tOrVt = thr_mma.make_fragment_B(thr_mma.partition_B(sVt[None, None, 0]))
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((p.tile_m, self.dv)), Float32)
        acc_O.fill(0.0)
        ldsm = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        ldsm_t = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype)
        smem_copy_Q = cute.make_tiled_copy_A(ldsm, tiled_mma)
        smem_copy_K = cute.make_tiled_copy_B(ldsm, tiled_mma)
        smem_copy_V = cute.make_tiled_copy_B(ldsm_t, tiled_mma)
        thr_copy_Q = smem_copy_Q.get_slice(tidx)
        thr_copy_K = smem_copy_K.get_slice(tidx)
        thr_copy_V = smem_copy_V.get_slice(tidx)
        tSsQ = thr_copy_Q.partition_S(sQ)
        tSsK = thr_copy_K.partition_S(sK)
        tOsVt = thr_copy_V.partition_S(sVt)

        # ---- softmax state and score coordinates
        num_rows = acc_O.shape[0][1] * acc_O.shape[1]
        row_max = cute.make_rmem_tensor(num_rows, Float32)
        row_sum = cute.make_rmem_tensor(num_rows, Float32)
        row_scale = cute.make_rmem_tensor(num_rows, Float32)
        softmax.softmax_reset(row_max, row_sum)
        cS = cute.make_identity_tensor((p.tile_m, p.tile_n))
        tScS_mn = acc_layout.acc_as_mn(thr_mma.partition_C(cS))
        t0ScS_mn = acc_layout.acc_as_mn(tiled_mma.get_slice(0).partition_C(cS))
        return SimpleNamespace(
            thr_mma=thr_mma,
            tSrQ=tSrQ,
            tSrK=tSrK,
            tOrVt=tOrVt,
            tSsQ=tSsQ,
            tSsK=tSsK,
            tOsVt=tOsVt,
            smem_copy_Q=smem_copy_Q,
            smem_copy_K=smem_copy_K,
            smem_copy_V=smem_copy_V,
            thr_copy_Q=thr_copy_Q,
            thr_copy_K=thr_copy_K,
            thr_copy_V=thr_copy_V,
            acc_O=acc_O,
            row_max=row_max,
            row_sum=row_sum,
            row_scale=row_scale,
            tScS_mn=tScS_mn,
            t0ScS_mn=t0ScS_mn,
            num_rows=num_rows,
        )

    @cute.jit
    def tile_mods(self, softmax_scale, mBias, m_block, head, batch, seqlen_q, seqlen_k):
        """The score modifiers of a query tile (score_mod): the logits' scale, its bias rows, the ALiBi slope."""
        p = self.p
        mB, row_limit, col_limit, slope = score_mod.sequence_mods(p, mBias, batch, head, seqlen_q, seqlen_k)
        mods = SimpleNamespace(scale=softmax_scale, gB=None, slope=slope, row_limit=row_limit, col_limit=col_limit)
        if const_expr(p.has_bias):
            mods.gB = cute.local_tile(mB, (p.tile_m, p.tile_n), (m_block, None))
        return mods

    @cute.jit
    def prologue(self, c: SimpleNamespace, tQ, q_rows):
        """cp.async groups [Q + K(b0)], then [V(b_s-1)], [K(b_s)] for s < S, b0 the last key tile. `tQ`: Q's
        (global, shared, coordinate) partitions."""
        p = self.p
        S = p.num_stages
        tQgQ, tQsQ, tQcQ = tQ
        copy_QK, copy_V, n_min, n_max, seqlen_k = c.copy_QK, c.copy_V, c.n_min, c.n_max, c.seqlen_k
        tKsK, tKcK, tVsV, tVcV = c.tKsK, c.tKcK, c.tVsV, c.tVcV
        # zeros: finite scores in rows that are never kept
        rows.load_rows(copy_QK, tQgQ, tQsQ, tQcQ, q_rows, cols=self.cols_qk)
        first_rows = seqlen_k - (n_max - 1) * p.tile_n
        if n_max > n_min:
            self.load_rows(copy_QK, self.kv_src(c.src.k, n_max - 1), tKsK, tKcK, 0, first_rows, False, self.cols_qk)
        cute.arch.cp_async_commit_group()
        for s in cutlass.range_constexpr(1, S):
            if n_max - s >= n_min:
                if const_expr(s == 1):
                    self.load_rows(
                        copy_V, self.kv_src(c.src.v, n_max - 1), tVsV, tVcV, 0, first_rows, True, self.cols_v
                    )
                else:
                    self.copy_tile(
                        copy_V, self.kv_src(c.src.v, n_max - s), tVsV[None, None, None, s - 1], tVcV, self.cols_v
                    )
            cute.arch.cp_async_commit_group()
            if n_max - 1 - s >= n_min:
                self.copy_tile(
                    copy_QK, self.kv_src(c.src.k, n_max - 1 - s), tKsK[None, None, None, s], tKcK, self.cols_qk
                )
            cute.arch.cp_async_commit_group()

    @cute.jit
    def query_rows(self, mX, head, batch, offset, width: cutlass.Constexpr[int]):
        """The (rows, `width`) view of Q or O (canonical (B, S, H, D) / (T, H, D)) a query tile reads or writes:
        one head's rows of batch entry `batch` (packed: from token `offset`), or with GQA packing the (r, S) rows
        of KV group `head`'s query heads (packed: the (r, tokens) rows from the sequence's first token `offset`)."""
        p = self.p
        if const_expr(p.pack_gqa and p.is_thd):
            return rows.widen(gqa_rows.pack_rows(cute.domain_offset((offset, 0, 0), mX), 0, 1, head, self.rpq), width)
        elif const_expr(p.pack_gqa):
            return rows.widen(gqa_rows.pack_rows(mX[batch, None, None, None], 0, 1, head, self.rpq), width)
        else:
            return rows.widen(rows.head_rows(mX, head, batch, offset, p.is_thd), width)

    @cute.jit
    def key_tiles(self, m_block, split, seqlen_q, seqlen_k, offset, window_left, window_right):
        """(n_min, n_max, lo, hi): the key tiles holding any allowed column of the query tile (this split's piece
        of them, split-KV), and [lo, hi) those wholly allowed (packed tiles: over their query positions)."""
        p = self.p
        if const_expr(p.pack_gqa):
            n_min, n_max, lo, hi = gqa_rows.packed_key_tiles(
                m_block, p.tile_m, p.tile_n, self.rpq, seqlen_q, seqlen_k, offset, window_right, window_left
            )
        else:
            n_min, n_max = mask.n_block_range(
                m_block, p.tile_m, p.tile_n, seqlen_q, seqlen_k, offset, window_left, window_right
            )
            lo, hi = mask.n_block_unmasked_range(
                m_block, p.tile_m, p.tile_n, seqlen_q, seqlen_k, offset, window_left, window_right
            )
        if const_expr(p.split):  # this split's piece of the band's key tiles (cut from the actual lengths)
            n_min, n_max = key_split_range(n_min, n_max, split, p.num_splits, cutlass.min)
        return n_min, n_max, lo, hi

    @cute.jit
    def epilogue_partial(self, ctx, g: _Globals, at, q_rows, store_rows, num_rows):
        """Split-KV: this split's O (normalized over its keys, fp32) and LSE (natural log, without the sink, which
        the combine adds once) to the workspace partials, straight from the registers, and with score_max /
        score_sum_exp its row max (natural units, no sink). A split that saw no key writes O = 0, LSE = -inf, max
        -inf; dense rows past the sequence the same (packed sequences: only their own rows,
        at sequence-local rows of the per-batch partials). `at`: (split, head, batch entry)."""
        p = self.p
        split, head, batch = at
        mOp, mLp, mMp = g.partial
        thr_mma, acc_O, row_scale = ctx.thr_mma, ctx.acc_O, ctx.row_scale
        cute.arch.cp_async_wait_group(0)
        lse = cute.make_rmem_tensor(num_rows, Float32)
        s_max = None  # score_max / score_sum_exp: this split's row max too (the combine takes the max over splits)
        if const_expr(mMp is not None):
            s_max = cute.make_rmem_tensor(num_rows, Float32)
        softmax.softmax_finalize(ctx.row_max, ctx.row_sum, ctx.scale_log2, row_scale, lse, None, score_max=s_max)
        tOcO_mn = acc_layout.acc_as_mn(thr_mma.partition_C(cute.make_identity_tensor((p.tile_m, self.dv))))
        for r in cutlass.range_constexpr(num_rows):
            if tOcO_mn[r, 0][0] >= q_rows:
                row_scale[r] = Float32(0.0)
                lse[r] = -Float32.inf
                if const_expr(mMp is not None):
                    s_max[r] = -Float32.inf
        acc_O_mn = acc_layout.acc_as_mn(acc_O)
        softmax.rescale_rows(acc_O_mn, row_scale)
        # this tile's rows of the split's O, each row's slice taken once (its columns are unit-strided); the
        # accumulator's (row, column) view, so every element is checked against the rows the tile writes
        if const_expr(p.pack_gqa):
            mOp_s = gqa_rows.pack_rows(mOp[split, batch, None, None, None], 1, 0, head, self.rpq)
        else:
            mOp_s = mOp[split, batch, head, None, None]
        gO = cute.local_tile(mOp_s, (p.tile_m, self.dv), (ctx.m_block, 0))
        for r in cutlass.range_constexpr(num_rows):
            row = tOcO_mn[r, 0][0]
            if row < store_rows:
                gO_r = gO[row, None]
                for c in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[1])):
                    col = tOcO_mn[r, c][1]
                    if const_expr(self.cols_v):
                        if col < p.head_dim_v:
                            gO_r[col] = acc_O_mn[r, c]
                    else:
                        gO_r[col] = acc_O_mn[r, c]
        self.store_row_values(
            mLp[split, None, None, None], lse, tOcO_mn, head, batch, Int32(0), ctx.m_block, store_rows, True
        )
        if const_expr(mMp is not None):
            self.store_row_values(
                mMp[split, None, None, None], s_max, tOcO_mn, head, batch, Int32(0), ctx.m_block, store_rows, True
            )

    @cute.jit
    def epilogue(self, ctx, g: _Globals, kit: _Kit, sQ, gO, at, offsets, q_rows, store_rows, num_rows, tidx):
        """The tile's O (staged through sQ's smem) and row statistics out; rows past the sequence (dense) get
        O = 0, LSE = -inf. `at`: (head, batch entry)."""
        p = self.p
        dv = self.dv
        head, batch = at
        off_lse, _, _, off_scores = offsets
        mLSE, mScores, mSinks = g.mLSE, g.mScores, g.mSinks
        sO_layout, copy_O, tiled_mma = kit.sO_layout, kit.copy_O, kit.tiled_mma
        thr_mma, acc_O, row_max, row_sum, row_scale = ctx.thr_mma, ctx.acc_O, ctx.row_max, ctx.row_sum, ctx.row_scale
        scale_log2, m_block = ctx.scale_log2, ctx.m_block
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()  # sQ is reused for O; no load may still land in it
        lse = cute.make_rmem_tensor(num_rows, Float32)
        sink = None
        if const_expr(p.has_sinks):
            sink = mSinks[head]
            if const_expr(p.pack_gqa):  # each row's own query head of the group (tile_m is a multiple of r)
                tc = acc_layout.acc_as_mn(thr_mma.partition_C(cute.make_identity_tensor((p.tile_m, dv))))
                sink = cute.make_rmem_tensor(num_rows, Float32)
                for r in cutlass.range_constexpr(num_rows):
                    sink[r] = mSinks[head * self.rpq + tc[r, 0][0] % self.rpq]
        # the two halves of the LSE (cuDNN's score_max / score_sum_exp), where declared
        s_max = cute.make_rmem_tensor(num_rows, Float32) if const_expr(p.has_score_max) else None
        s_sum = cute.make_rmem_tensor(num_rows, Float32) if const_expr(p.has_score_sum_exp) else None
        softmax.softmax_finalize(
            row_max,
            row_sum,
            scale_log2,
            row_scale,
            lse,
            sink,
            p.pack_gqa and p.has_sinks,
            score_max=s_max,
            score_sum_exp=s_sum,
        )
        tOcO_mn = acc_layout.acc_as_mn(thr_mma.partition_C(cute.make_identity_tensor((p.tile_m, dv))))
        if const_expr(not p.is_thd):
            for r in cutlass.range_constexpr(num_rows):
                if tOcO_mn[r, 0][0] >= q_rows:  # padding rows: O = 0, LSE = -inf
                    row_scale[r] = Float32(0.0)
                    lse[r] = -Float32.inf
                    if const_expr(p.has_score_max):
                        s_max[r] = -Float32.inf
                    if const_expr(p.has_score_sum_exp):
                        s_sum[r] = Float32(0.0)
        acc_O_mn = acc_layout.acc_as_mn(acc_O)
        softmax.rescale_rows(acc_O_mn, row_scale)
        rO = cute.make_fragment_like(acc_O, self.dtype)
        rO.store(acc_O.load().to(self.dtype))
        sO = cute.make_tensor(sQ.iterator, sO_layout)
        smem_copy_O = cute.make_tiled_copy_C(
            cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=2 * self.dtype.width),
            tiled_mma,
        )
        thr_copy_O = smem_copy_O.get_slice(tidx)
        cute.copy(smem_copy_O, thr_copy_O.retile(rO), thr_copy_O.partition_D(sO))

        # LSE and its two halves, where declared (ragged ones start at their own offsets, or are per batch)
        for mX, vals, off_row in zip(
            (mLSE, *mScores), (lse if const_expr(p.has_lse) else None, s_max, s_sum), (off_lse, *off_scores)
        ):
            if const_expr(vals is not None):
                self.store_row_values(mX, vals, tOcO_mn, head, batch, off_row, m_block, store_rows)

        cute.arch.barrier()
        rows.store_rows(copy_O, sO, gO, cute.make_identity_tensor((p.tile_m, dv)), store_rows, tidx, cols=self.cols_v)

    @cute.jit
    def store_row_values(
        self, mX, vals, tOcO_mn, head, batch, off_row, m_block, store_rows, per_batch: cutlass.Constexpr[bool] = False
    ):
        """One fp32 value per query row (LSE, score_max, score_sum_exp) to its (B, H, S) / (H, T) canonical view,
        the packed rows from `off_row` (ragged Stats' own offset for the LSE); per-batch ragged Stats as a dense
        batch's, and so are `per_batch` rows (split-KV's LSE partials, per batch entry in every form). The lane
        holding column 0 of its rows writes them."""
        p = self.p
        mX_s = self.row_values(mX, head, batch, off_row, per_batch)
        if tOcO_mn[0, 0][1] == 0:
            for r in cutlass.range_constexpr(cute.size(vals)):
                row = tOcO_mn[r, 0][0]
                if row < store_rows:
                    mX_s[m_block * p.tile_m + row] = vals[r]

    @cute.jit
    def row_values(self, mX, head, batch, off_row, per_batch: cutlass.Constexpr[bool] = False):
        """The (rows,) view of a per-row output (`store_row_values`) for this tile's head or KV group: the (H, T)
        canonical view from row `off_row`, or (B, H, S) per batch entry; with GQA packing the (r, ...) rows of the
        group's query heads."""
        p = self.p
        if const_expr(p.is_thd and not p.stats_per_batch and not per_batch and p.pack_gqa):  # (H, T): (r, T) rows
            return gqa_rows.pack_rows(cute.domain_offset((0, off_row), mX), 1, 0, head, self.rpq)
        elif const_expr(p.is_thd and not p.stats_per_batch and not per_batch):
            return cute.domain_offset((off_row,), mX[head, None])
        elif const_expr(p.pack_gqa):  # the group's rows (r, S): `head` is the KV group
            return gqa_rows.pack_rows(mX[batch, None, None], 1, 0, head, self.rpq)
        else:
            return mX[batch, head, None]

    @cute.jit
    def next_stage(self, stage):
        if const_expr(self.p.num_stages == 1):
            return stage
        else:
            return Int32(0) if stage == self.p.num_stages - 1 else stage + 1

    @cute.jit
    def key_sources(self, g: _Globals, thr, heads, batch, offsets):
        """Where key tiles come from, `k` and `v` alike (`kv_src` finds each tile): the sequence's K or V tiles
        partitioned for this thread (dense, packed), or a paged cache's container, this head's in it and this
        sequence's block table. `thr`: the K and V copies' thread slices; `heads`, `offsets`: K's and V's."""
        p = self.p
        (thr_QK, thr_V), (head_kv, head_v), (off_k, off_v) = thr, heads, offsets
        if const_expr(p.paged):
            return SimpleNamespace(
                k=self.paged_source(g.mK, g.paged[0], batch, head_kv, thr_QK, p.paged_block_k, self.d),
                v=self.paged_source(g.mV, g.paged[1], batch, head_v, thr_V, p.paged_block_v, self.dv),
            )
        else:
            mK_s = rows.widen(rows.head_rows(g.mK, head_kv, batch, off_k, p.is_thd), self.d)
            mV_s = rows.widen(rows.head_rows(g.mV, head_v, batch, off_v, p.is_thd), self.dv)
            gK = cute.local_tile(mK_s, (p.tile_n, self.d), (None, 0))
            gV = cute.local_tile(mV_s, (p.tile_n, self.dv), (None, 0))
            return SimpleNamespace(
                k=SimpleNamespace(tiles=thr_QK.partition_S(gK)), v=SimpleNamespace(tiles=thr_V.partition_S(gV))
            )

    @cute.jit
    def paged_source(self, m, mTable, batch, head, thr, block: cutlass.Constexpr[int], width: cutlass.Constexpr[int]):
        """One paged container's key-tile source (K's or V's): the container, this head, this sequence's table row,
        the copy's thread slice; with blocks smaller than the key tile (`span`), this thread's partition of the
        container's rows viewed per block (`paged.span_rows`) and its rows' coordinates."""
        src = SimpleNamespace(
            m=m, table=paged.table_row(mTable, batch), head=head, thr=thr, block=block, width=width, span=False
        )
        if const_expr(paged_span(block, self.p.tile_n)):
            src.span = True
            src.rows = thr.partition_S(paged.span_rows(m, head, self.p.tile_n, block, width))
            src.crd = thr.partition_S(cute.make_identity_tensor((self.p.tile_n, width)))
        return src

    @cute.jit
    def kv_src(self, src: SimpleNamespace, n_block):
        """This thread's partition of key tile `n_block` of K or V in global memory (`src`: `key_sources`' `k` or
        `v`), through the table when paged; for blocks smaller than the tile, the partition of the container's
        rows with each row mode's block (`span_tile`)."""
        if const_expr(self.p.paged):
            if const_expr(src.span):
                return self.span_tile(src, n_block)
            else:
                return src.thr.partition_S(
                    paged.key_tile(src.m, src.table, src.head, n_block, self.p.tile_n, src.block, src.width)
                )
        else:
            return src.tiles[None, None, None, n_block]

    @cute.jit
    def span_tile(self, src: SimpleNamespace, n_block):
        """Key tile `n_block` over blocks smaller than it: the rows' partition (`paged_source`) and the block of each
        of this thread's row modes, each table entry read once per tile (`paged.span_entries`)."""
        num_blocks = cute.size(src.m, mode=[0])
        entries, owners = paged.span_entries(src.crd, n_block, self.p.tile_n, src.block)
        blocks = []
        for m in cutlass.range_constexpr(len(entries)):
            if const_expr(owners[m] == m):
                blocks.append(paged.span_block_of(src.table, entries[m], num_blocks))
            else:
                blocks.append(blocks[owners[m]])
        return SimpleNamespace(rows=src.rows, blocks=blocks)

    @cute.jit
    def tile_row(self, tXg, m: cutlass.Constexpr[int]):
        """Row mode `m` of a key tile's partition (`kv_src`): its (CPY, chunks) slice, from its own block when the
        tile spans blocks."""
        if const_expr(isinstance(tXg, SimpleNamespace)):
            return tXg.rows[None, m, None, tXg.blocks[m]]
        else:
            return tXg[None, m, None]

    @cute.jit
    def copy_tile(self, tiled_copy, tXg, tXs, tXc, cols: cutlass.Constexpr[int]):
        """A whole key tile's partition (`kv_src`) into one stage `tXs` (`rows.copy_cols`), row mode by row mode
        when it spans blocks."""
        if const_expr(isinstance(tXg, SimpleNamespace)):
            for m in cutlass.range_constexpr(cute.size(tXs.shape[1])):
                rows.copy_row(tiled_copy, self.tile_row(tXg, m), tXs[None, m, None], tXc[None, m, None], cols)
        else:
            rows.copy_cols(tiled_copy, tXg, tXs, tXc, cols)

    @cute.jit
    def load_rows(
        self, tiled_copy, tXg, tXsX, tXcX, stage, n_rows, zero_fill: cutlass.Constexpr, cols: cutlass.Constexpr = 0
    ):
        """Copy the first `n_rows` rows of a key tile's partition `tXg` into `stage`; optionally zero the rest.

        V rows past the key length must be zero (P is 0 there, 0 * garbage may be NaN);
        K rows there only produce scores that the mask replaces. With `cols`, the columns
        past it are zeroed instead of loaded (`rows.copy_row`).
        """
        for m in cutlass.range_constexpr(cute.size(tXsX.shape[1])):
            if tXcX[0, m, 0][0] < n_rows:
                rows.copy_row(tiled_copy, self.tile_row(tXg, m), tXsX[None, m, None, stage], tXcX[None, m, None], cols)
            else:
                if const_expr(zero_fill):
                    tXsX[None, m, None, stage].fill(0)

    @cute.jit
    def step(self, c: SimpleNamespace, n_block, stage, masked: cutlass.Constexpr):
        """One key tile: S = Q.K^T, mask, online softmax, O += P.V, with the next loads in flight."""
        p = self.p
        S = p.num_stages
        # K(n_block) has landed and every thread is done with the stage V is about to reuse
        cute.arch.cp_async_wait_group(2 * S - 2)
        cute.arch.barrier()
        n_v = n_block - (S - 1)
        v_stage = stage
        if const_expr(S > 1):
            v_stage = stage + (S - 1) if stage == 0 else stage - 1
        if n_v >= c.n_min:
            if const_expr(S == 1):
                if n_v == c.n_max - 1:
                    self.load_rows(
                        c.copy_V,
                        self.kv_src(c.src.v, n_v),
                        c.tVsV,
                        c.tVcV,
                        v_stage,
                        c.seqlen_k - n_v * p.tile_n,
                        True,
                        self.cols_v,
                    )
                else:
                    self.copy_tile(
                        c.copy_V, self.kv_src(c.src.v, n_v), c.tVsV[None, None, None, v_stage], c.tVcV, self.cols_v
                    )
            else:
                self.copy_tile(
                    c.copy_V, self.kv_src(c.src.v, n_v), c.tVsV[None, None, None, v_stage], c.tVcV, self.cols_v
                )
        cute.arch.cp_async_commit_group()

        if const_expr(p.has_block_mask and self.block_mask_tiles):
            # the tile lies in one 128x128 block: with its bit clear it adds nothing (its loads keep their order)
            if mask.block_mask_visible(
                c.block_mask, c.m_block * p.tile_m // BLOCK_MASK_TILE, n_block * p.tile_n // BLOCK_MASK_TILE
            ):
                self.scores(c, n_block, stage, masked)
            else:
                self.next_k(c, n_block, stage)
        else:
            self.scores(c, n_block, stage, masked)

    @cute.jit
    def next_k(self, c: SimpleNamespace, n_block, stage):
        """Once V(n_block) has landed and every thread is done reading K from `stage`: K(n_block - S) into it."""
        p = self.p
        S = p.num_stages
        cute.arch.cp_async_wait_group(2 * S - 2)
        cute.arch.barrier()
        n_k = n_block - S
        if n_k >= c.n_min:
            self.copy_tile(c.copy_QK, self.kv_src(c.src.k, n_k), c.tKsK[None, None, None, stage], c.tKcK, self.cols_qk)
        cute.arch.cp_async_commit_group()

    @cute.jit
    def scores(self, c: SimpleNamespace, n_block, stage, masked: cutlass.Constexpr):
        """A visible key tile once K(n_block) is in `stage`: S = Q.K^T, the next K load, then the rest (`attend`)."""
        p = self.p
        acc_S = cute.make_rmem_tensor(c.thr_mma.partition_shape_C((p.tile_m, p.tile_n)), Float32)
        acc_S.fill(0.0)
        warp_mma.gemm_ss(
            c.tiled_mma,
            acc_S,
            c.tSrQ,
            c.tSrK,
            c.tSsQ,
            c.tSsK[None, None, None, stage],
            c.smem_copy_Q,
            c.smem_copy_K,
            c.thr_copy_Q,
            c.thr_copy_K,
            self.k_slices_qk,
        )
        # V(n_block) has landed and every thread is done reading K from `stage`
        self.next_k(c, n_block, stage)
        self.attend(c, acc_S, n_block, stage, masked)

    @cute.jit
    def attend(self, c: SimpleNamespace, acc_S, n_block, stage, masked: cutlass.Constexpr):
        """The rest of a step once S = Q.K^T is in `acc_S`: score modifiers, mask, online softmax, O += P.V."""
        p = self.p
        acc_S_mn = acc_layout.acc_as_mn(acc_S)
        if const_expr(p.has_score_mods):
            tBgB = None
            if const_expr(p.has_bias):
                tBgB = acc_layout.acc_as_mn(c.thr_mma.partition_C(c.mods.gB[None, None, n_block]))
            # unmasked tiles lie inside the key length (a packed sequence may outgrow its bias: check)
            score_mod.add_score_mods(
                acc_S_mn,
                c.tScS_mn,
                c.t0ScS_mn,
                tBgB,
                c.mods.scale,
                c.m_block * p.tile_m,
                n_block * p.tile_n,
                c.mods.row_limit,
                c.mods.col_limit,
                c.mods.slope,
                check_cols=masked or p.is_thd,
            )
        if const_expr(masked):
            mask.apply_mask(
                acc_S_mn,
                c.tScS_mn,
                c.t0ScS_mn,
                c.m_block * p.tile_m,
                n_block * p.tile_n,
                c.seqlen_k,
                c.offset,
                c.window_left,
                c.window_right,
                True,
                self.rpq,
            )
        element_bits = p.has_block_mask and not self.block_mask_tiles
        if const_expr(element_bits):  # tiles straddle 128x128 blocks: bit by bit
            mask.apply_block_mask(
                acc_S_mn, c.tScS_mn, c.t0ScS_mn, c.block_mask, c.m_block * p.tile_m, n_block * p.tile_n
            )
        # a bias may hold -inf (and a block mask clear a row's part of a tile): every tile then checks for rows
        # with no finite score yet
        softmax.online_softmax(
            acc_S_mn, c.row_max, c.row_sum, c.row_scale, c.scale_log2, check_inf=masked or p.has_bias or element_bits
        )
        softmax.rescale_rows(acc_layout.acc_as_mn(c.acc_O), c.row_scale)

        rP = cute.make_fragment_like(acc_S, self.dtype)
        rP.store(acc_S.load().to(self.dtype))
        tOrP = acc_layout.acc_as_operand_a(rP)
        warp_mma.gemm_rs(
            c.tiled_mma, c.acc_O, tOrP, c.tOrVt, c.tOsVt[None, None, None, stage], c.smem_copy_V, c.thr_copy_V
        )
