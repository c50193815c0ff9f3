"""Backward step 2: the mma.sync main kernel (dK, dV, and dQ partials).

One CTA per (key tile, kv head, batch). K and V of the tile stay in shared
memory; the CTA walks every query head of its GQA group and, per head, every
query tile of the mask band, in one flat pipelined loop:

    S  = Q.K^T           (masked only on tiles that cross the band or the end)
    P  = exp2(S * scale * log2e - LSE * log2e)
         (with a bias or ALiBi: S = scale * Q.K^T + bias + ALiBi first, `score_mod`)
    dP = dO.V^T,  dS = P * (dP - dpsum)  (= dBias: written to its tile, or red.global
                                          into the fp32 dBias accumulator when summed)
    dV += P^T.dO,  dK += dS^T.Q          (registers, fp32, whole loop)
    dQ  = dS.K  -> red.global.add into the fp32 accumulator

Q and dO are double-buffered with cp.async when `num_stages == 2`; the next
tile's LSE / dpsum rows are prefetched into registers and staged in shared
memory at the end of a step. `fused_prefetch` picks between two validated
step orders (one wait for Q and dO and P stored early, or FA2's order with a
separate wait and barrier for dO, P and dS stored together). LSE is read natively from its declared
strides; rows past the sequence, and rows whose LSE is -inf, get P = 0. In deterministic mode the
key tiles of one (batch, head, query tile) add their dQ partials in a fixed
key-tile order (`det_order`), taking turns through a semaphore; with `dq_splits` (dense) the grid
holds that many CTAs per (batch, kv head) instead, each walking its share of the key tiles and adding
into its own accumulator copy, so no CTA waits for another. dK (times scale) and dV go out
through shared memory to their declared strides; rows past the sequence but
inside the tensor (padding) are written as zeros. A dBias written directly gets
zeros from each key tile in the query rows outside its band too, so every
element of its columns is written once.

Head dims between the tiles' 32-element granules (72, 80, 112, ...) run on tiles padded
up to the next granule (`Sm80BwdParams.tile_head_dim`): loads zero-fill the columns past
the head dim in shared memory, so S, dP and the padded columns of dK, dV and dQ come out
exact or zero (S and dP stop at the last 16-column k-slice holding a head-dim column);
dK / dV stores and the dQ additions skip those columns.

K and V with different head counts (`num_heads_v`): the grid holds a CTA per walk of `walk_group` query heads,
the smallest run made of whole K groups and whole V groups (the coarser tensor's group where one count divides the
other; their least common multiple where neither does, e.g. 6 query heads over K 2 and V 3: one walk of all 6).
A tensor whose group is shorter than the walk changes its tile within it: at the end of each of its groups its dK
or dV tile goes out through its smem tile and the next head's K or V tile comes in (`_next_fine_head`; both K and
V change where the counts do not nest), so each head's gradient is summed in one CTA and no workspace or second
reduction is needed.

Where the batch entries share one fp32 dBias accumulator the grid runs batch fastest (`grid_order`,
`frost.engines.common.grid_order`), so their adds into an element meet in L2.

THD: lengths come from cu_seqlens in-kernel; the grid's x extent is
ceil(max_seqlen_kv / tile_n) and each CTA strides over the key tiles of its
sequence, so a longer sequence than declared is still fully served.

Argument list: `sdpa_bwd_params.main_args`; the chain around it: `frost.engines.sdpa_bwd`.
"""

from types import SimpleNamespace
from typing import Any, NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync, warp

from frost.engines.common import mask as fmask
from frost.engines.common import rows, score_mod
from frost.engines.common import tiles, turns
from frost.engines.common.acc_layout import acc_as_mn, transpose_view
from frost.engines.common.grid_order import block_coord, grid_extent, grid_shape
from frost.engines.common.sdpa_entry import IO_DTYPES
from frost.engines.common.seqlen import own_rows, rows_offset
from frost.engines.common.softmax import LOG2_E
from frost.engines.common.global_ops import elem_ptr, ld_acquire_i32, red_add_f32, red_release_add_i32
from frost.engines.sdpa_bwd import accum
from frost.engines.sdpa_bwd.scratch import uses_turns
from frost.engines.sm80 import warp_mma
from frost.engines.sm80.dq_splits import split_tile, split_tile_count
from frost.engines.sm80.sdpa_bwd_params import Sm80BwdParams, main_args, name_suffix


def kernel_name(params: Sm80BwdParams, arch: str) -> str:
    return f"frost_sdpa_bwd_main_{name_suffix(params)}"


def _arch_number(arch: str) -> int:
    return int("".join(ch for ch in arch.split("_")[1] if ch.isdigit()))


class SdpaBwdSm80:
    """The main kernel object: plan-time constants, host-side launch (`launch`) and the device kernel (`kernel`)."""

    def __init__(self, p: Sm80BwdParams, arch: str):
        self.p = p
        self.names = main_args(p)
        self.dtype = IO_DTYPES[p.dtype]
        self.bm, self.bn = p.tile_m, p.tile_n
        self.d, self.dv = p.tile_head_dim, p.tile_head_dim_v  # the tiles' head-dim extents
        # column limits of the copies and dQ additions: the head dim where the tile is wider, else 0 (none)
        self.cols_qk = p.head_dim if self.d != p.head_dim else 0
        self.cols_v = p.head_dim_v if self.dv != p.head_dim_v else 0
        # S = Q.K^T and dP = dO.V^T stop at the last 16-wide k-slice holding a head-dim column (0: every slice)
        self.k_slices_qk = -(-p.head_dim // 16) if self.cols_qk else 0
        self.k_slices_v = -(-p.head_dim_v // 16) if self.cols_v else 0
        self.threads = p.num_threads
        self.stages = p.num_stages
        self.group = p.walk_group  # query heads a CTA walks (Hq / Hkv unless K and V heads differ)
        # K and V heads apart: K's tile changes every `group_k` query heads of the walk, V's every `group_v`
        # (`per_cta_k` / `per_cta_v` heads of each per CTA; 1: the tile stays for the whole walk, as it always
        # does with equal counts)
        self.group_k, self.group_v = p.qhead_per_kvhead, p.qhead_per_vhead
        self.per_cta_k, self.per_cta_v = p.walk_heads_k, p.walk_heads_v
        self.fused = p.fused_prefetch
        self.vector_red = _arch_number(arch) >= 90

    # ------------------------------------------------------------------ host side
    def _layouts(self):
        dt, bm, bn, st = self.dtype, self.bm, self.bn, self.stages
        self.sQ_layout = cute.tile_to_shape(warp_mma.smem_layout_atom(self.d), (bm, self.d, st), (0, 1, 2))
        self.sdO_layout = cute.tile_to_shape(warp_mma.smem_layout_atom(self.dv), (bm, self.dv, st), (0, 1, 2))
        self.sK_layout = cute.tile_to_shape(warp_mma.smem_layout_atom(self.d), (bn, self.d), (0, 1))
        self.sV_layout = cute.tile_to_shape(warp_mma.smem_layout_atom(self.dv), (bn, self.dv), (0, 1))
        self.sPdS_layout = cute.tile_to_shape(warp_mma.smem_layout_atom(bn), (bm, bn), (0, 1))

        # gmem <-> smem copies: 16-byte chunks, whole rows per pass
        def thr_layout(row_elems):
            return warp_mma.row_thread_layout(self.threads, row_elems)

        vals = cute.make_layout((1, 8))
        g2s = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dt, num_bits_per_copy=128)
        st128 = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dt, num_bits_per_copy=128)
        self.g2s_qk = cute.make_tiled_copy_tv(g2s, thr_layout(self.d), vals)
        self.g2s_vdo = cute.make_tiled_copy_tv(g2s, thr_layout(self.dv), vals)
        self.s2g_k = cute.make_tiled_copy_tv(st128, thr_layout(self.d), vals)
        self.s2g_v = cute.make_tiled_copy_tv(st128, thr_layout(self.dv), vals)

        w = self.p.num_warps
        op = warp.MmaF16BF16Op(dt, Float32, (16, 8, 16))

        def tiled(wm):
            return cute.make_tiled_mma(op, (wm, w // wm, 1), permutation_mnk=(wm * 16, (w // wm) * 16, 16))

        self.mma_sdp = tiled(self.p.sdp_warps_m)
        self.mma_dkv = tiled(self.p.dkv_warps_n)
        self.mma_dq = tiled(self.p.dq_warps_m)

    def _storage(self):
        dt = self.dtype

        def tile(layout):
            return cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(layout)], 1024]

        rows = cute.struct.Align[cute.struct.MemRange[Float32, self.bm], 128]

        @cute.struct
        class Storage:
            sK: tile(self.sK_layout)
            sV: tile(self.sV_layout)
            sQ: tile(self.sQ_layout)
            sdO: tile(self.sdO_layout)
            sP: tile(self.sPdS_layout)
            sdS: tile(self.sPdS_layout)
            sLSE: rows
            sdPsum: rows

        return Storage

    def launch(self, a: dict) -> None:
        """`a`: this kernel's arguments by contract name, tensors in canonical views."""
        self._layouts()
        Storage = self._storage()
        mK = a["k"]
        if cutlass.const_expr(self.p.is_thd):
            n_batch = a["cu_seqlens_kv"].shape[0] - 1
            grid_x = (a["max_seqlen_kv"] + self.bn - 1) // self.bn
        else:
            n_batch = mK.shape[0]
            grid_x = (mK.shape[1] + self.bn - 1) // self.bn
            if cutlass.const_expr(self.p.dq_splits > 0):
                grid_x = self.p.dq_splits  # one CTA per accumulator copy, walking its share of key tiles
        grid_x = cutlass.max(grid_x, 1)
        scale = Float32(a["softmax_scale"])
        # P's exp2 factor: with score modifiers the logits arrive scaled (score_mod)
        scale_log2 = Float32(LOG2_E) if cutlass.const_expr(self.p.has_score_mods) else scale * LOG2_E
        maxima = (None, None)  # the packed form's envelopes, each length is capped at
        if cutlass.const_expr(self.p.is_thd):
            maxima = (a["max_seqlen_q"], a["max_seqlen_kv"])
        kernel(
            self,
            a["q"],
            mK,
            a["v"],
            a["do"],
            a["lse"],
            a["dk"],
            a["dv"],
            a.get("cu_seqlens_q"),
            a.get("cu_seqlens_kv"),
            a.get("seqused_q"),
            a.get("seqused_kv"),
            maxima,
            a.get("lse_offsets"),
            (a.get("v_offsets"), a.get("do_offsets"), a.get("dk_offsets"), a.get("dv_offsets")),
            a["dpsum"],
            a["dq_accum"],
            a.get("dq_semaphore"),
            a.get("bias"),
            a.get("dbias"),
            a.get("dbias_accum"),
            scale,
            scale_log2,
            a.get("window_left"),
            a.get("window_right"),
            self.sQ_layout,
            self.sdO_layout,
            self.sK_layout,
            self.sV_layout,
            self.sPdS_layout,
            self.g2s_qk,
            self.g2s_vdo,
            self.s2g_k,
            self.s2g_v,
            self.mma_sdp,
            self.mma_dkv,
            self.mma_dq,
            Storage,
        ).launch(
            grid=grid_shape(self.p.grid_order, grid_x, self.p.kv_grid_heads, n_batch),
            block=(self.threads, 1, 1),
            smem=Storage.size_in_bytes(),
            stream=a["stream"],
        )


@cute.jit
def _load_rows(
    thr_copy: cute.TiledCopy,
    tiled_copy: cute.TiledCopy,
    gX: cute.Tensor,
    sX: cute.Tensor,
    cX: cute.Tensor,
    limit: Int32,
    cols: cutlass.Constexpr[int] = 0,
):
    """cp.async a (rows, cols) tile into smem; rows >= limit (and columns >= `cols`) are zero-filled instead."""
    rows.load_rows(
        tiled_copy,
        thr_copy.partition_S(gX),
        thr_copy.partition_D(sX),
        thr_copy.partition_S(cX),
        limit,
        tile_rows=cute.size(sX, mode=[0]),
        cols=cols,
    )


@cute.jit
def _tile_of(cfg: cutlass.Constexpr, t: Int32, m_min: Int32, n_m: Int32, head_kv: Int32, rot: Int32):
    """Step t of the flat loop -> (query head, query tile).

    Query tiles are walked upward from the band's first, starting `rot` tiles
    in and wrapping around (deterministic rotated order: each key tile starts at
    its own query tile, so neighbouring key tiles never queue behind each other).
    """
    head = head_kv
    idx = t
    if cutlass.const_expr(cfg.group > 1):
        head = head_kv * cfg.group + t // n_m
        idx = t % n_m
    if cutlass.const_expr(_rotates(cfg)):
        idx = idx + rot
        if idx >= n_m:
            idx = idx - n_m
    m = m_min + idx
    return head, m


def _rotates(cfg) -> bool:
    """Rotated walks: deterministic turns in the rotated order (whose turns follow the rotation)."""
    return uses_turns(cfg.p) and cfg.p.det_order == turns.ROTATED


class _Sequence(NamedTuple):
    """A CTA's (batch, kv head): where its sequences start, their lengths, the mask band and the key tiles it
    walks. Made once per CTA."""

    batch: Any
    head_kv: Any
    offset_q: Any
    offset_k: Any
    seqlen_q: Any
    seqlen_k: Any
    static_q: Any  # the bound tensors' query and key extents (dense: the semaphores' rows, dK / dV's rows)
    static_k: Any
    diag: Any
    window_left: Any
    window_right: Any
    num_n: Any  # key tiles of the walk (dense: every tile of the tensor, padding rows included)
    acc_batch: Any  # the dense accumulator's batch index: this CTA's own copy with `dq_splits`
    offset_lse: Any  # the first LSE row of the sequence (ragged Stats: their own offsets; else offset_q)


class _KeyTile(NamedTuple):
    """One key tile of a CTA's walk: its index, its band's query tiles and the walk's rotation."""

    n_block: Any
    m_min: Any
    n_m: Any  # query tiles in the band
    n_steps: Any  # n_m times the query heads of the GQA group
    rot: Any


class _Fine(NamedTuple):
    """K and V heads apart: K or V where its group is shorter than the walk, whose tile a CTA's walk replaces at
    the end of each of its query-head groups. Made once per CTA."""

    src: Any  # K or V (canonical)
    grad: Any  # dK or dV
    head0: Any  # its first head in this CTA
    scale: Any  # the softmax scale (dK's factor)


class _Io(NamedTuple):
    """The global tensors a walk step reads or adds into."""

    q: Any
    do: Any
    lse: Any
    dpsum: Any
    acc: Any
    sem: Any
    bias: Any  # the declared bias (score_mod), or None
    dbias: Any  # dBias written directly, or None
    dbias_acc: Any  # the fp32 dBias accumulator (dbias_accum), or None


class _Next(NamedTuple):
    """The query tile after a walk step's: whether there is one, its query head and its index."""

    has_next: Any
    head: Any
    m_block: Any


@cute.kernel
def kernel(
    cfg: cutlass.Constexpr,
    mQ: cute.Tensor,
    mK: cute.Tensor,
    mV: cute.Tensor,
    mdO: cute.Tensor,
    mLSE: cute.Tensor,
    mdK: cute.Tensor,
    mdV: cute.Tensor,
    mCuQ,
    mCuK,
    mUsedQ,
    mUsedK,
    maxima,
    mLseOff,
    mOwnOff,
    mdPsum: cute.Tensor,
    mAcc: cute.Tensor,
    mSem,
    mBias,
    mdBias,
    mdBiasAcc,
    scale: Float32,
    scale_log2: Float32,
    window_left,
    window_right,
    sQ_layout: cute.ComposedLayout,
    sdO_layout: cute.ComposedLayout,
    sK_layout: cute.ComposedLayout,
    sV_layout: cute.ComposedLayout,
    sPdS_layout: cute.ComposedLayout,
    g2s_qk: cute.TiledCopy,
    g2s_vdo: cute.TiledCopy,
    s2g_k: cute.TiledCopy,
    s2g_v: cute.TiledCopy,
    mma_sdp: cute.TiledMma,
    mma_dkv: cute.TiledMma,
    mma_dq: cute.TiledMma,
    Storage: cutlass.Constexpr,
):
    """Setup, then per key tile of this CTA: the walk over its band's query tiles, and the dK / dV epilogue."""
    p = cfg.p
    tidx, _, _ = cute.arch.thread_idx()
    bx, head_kv, batch = (block_coord(p.grid_order, a) for a in ("key", "head", "batch"))
    grid_x = grid_extent(p.grid_order, "key")
    c = _setup(
        cfg,
        tidx,
        sQ_layout,
        sdO_layout,
        sK_layout,
        sV_layout,
        sPdS_layout,
        g2s_qk,
        g2s_vdo,
        s2g_k,
        s2g_v,
        mma_sdp,
        mma_dkv,
        mma_dq,
        Storage,
    )
    s = _sequence(
        cfg,
        mQ,
        mK,
        (mCuQ, mCuK, mUsedQ, mUsedK, maxima[0], maxima[1]),
        batch,
        head_kv,
        bx,
        grid_x,
        window_left,
        window_right,
        mLseOff,
        mSem,
    )
    # the ragged form's io tensors with offsets of their own, rebased onto their group leader's (q's, k's) and
    # clamped so the sequence's rows fit
    mV, mdO, mdK, mdV = (
        own_rows(
            p,
            role,
            mX,
            off,
            batch,
            *((s.offset_q, s.seqlen_q, s.static_q) if role == "do" else (s.offset_k, s.seqlen_k, s.static_k)),
        )
        for role, mX, off in zip(("v", "do", "dk", "dv"), (mV, mdO, mdK, mdV), mOwnOff)
    )
    io = _Io(mQ, mdO, mLSE, mdPsum, mAcc, mSem, mBias, mdBias, mdBiasAcc)

    # key / value views of this (batch, kv head); K and V heads apart: the walk starts at the first K and V heads
    # of this CTA, and the epilogue writes the last of each where its tile changes within the walk
    src_k, src_v, dst_k, dst_v = head_kv, head_kv, head_kv, head_kv
    fine_k, fine_v = None, None
    if cutlass.const_expr(cfg.per_cta_k > 1):
        src_k, dst_k = head_kv * cfg.per_cta_k, head_kv * cfg.per_cta_k + cfg.per_cta_k - 1
        fine_k = _Fine(mK, mdK, src_k, scale)
    if cutlass.const_expr(cfg.per_cta_v > 1):
        src_v, dst_v = head_kv * cfg.per_cta_v, head_kv * cfg.per_cta_v + cfg.per_cta_v - 1
        fine_v = _Fine(mV, mdV, src_v, scale)
    mK_cur = rows.widen(rows.head_rows(mK, src_k, batch, s.offset_k, p.is_thd), cfg.d)
    mV_cur = rows.widen(rows.head_rows(mV, src_v, batch, s.offset_k, p.is_thd), cfg.dv)
    mdK_cur = rows.widen(rows.head_rows(mdK, dst_k, batch, s.offset_k, p.is_thd), cfg.d)
    mdV_cur = rows.widen(rows.head_rows(mdV, dst_v, batch, s.offset_k, p.is_thd), cfg.dv)
    out_rows = s.seqlen_k if cutlass.const_expr(p.is_thd) else s.static_k

    n_iters = (s.num_n - bx + grid_x - 1) // grid_x
    if cutlass.const_expr(p.dq_splits > 0):
        n_iters = split_tile_count(s.num_n, bx, p.dq_splits)
    for it in cutlass.range(n_iters, unroll=1):
        kt = _key_tile(cfg, s, bx, it, grid_x)
        acc_dK = cute.make_rmem_tensor(c.acc_shape_dK, Float32)
        acc_dV = cute.make_rmem_tensor(c.acc_shape_dV, Float32)
        acc_dK.fill(0.0)
        acc_dV.fill(0.0)
        if kt.n_steps > 0:
            _walk(cfg, c, s, kt, io, acc_dK, acc_dV, mK_cur, mV_cur, scale, scale_log2, tidx, fine_k, fine_v)
        if cutlass.const_expr(p.has_dbias and not p.dbias_accum):
            _zero_dbias_outside_band(cfg, s, kt, io, tidx)
        _write_dk_dv(
            cfg,
            c,
            acc_dK,
            acc_dV,
            scale,
            cute.local_tile(mdK_cur, (cfg.bn, cfg.d), (kt.n_block, 0)),
            cute.local_tile(mdV_cur, (cfg.bn, cfg.dv), (kt.n_block, 0)),
            out_rows - kt.n_block * cfg.bn,
            tidx,
        )
        if cutlass.const_expr(fine_k is not None or fine_v is not None):
            if kt.n_steps == 0:  # no query tile in the band: the changing tensors' other heads get zeros too
                if cutlass.const_expr(fine_k is not None):
                    for j in cutlass.range(cfg.per_cta_k - 1, unroll=1):
                        _store_fine(cfg, c, s, kt, fine_k, False, acc_dK, acc_dV, fine_k.head0 + j, tidx)
                if cutlass.const_expr(fine_v is not None):
                    for j in cutlass.range(cfg.per_cta_v - 1, unroll=1):
                        _store_fine(cfg, c, s, kt, fine_v, True, acc_dK, acc_dV, fine_v.head0 + j, tidx)


@cute.jit
def _setup(
    cfg: cutlass.Constexpr,
    tidx: Int32,
    sQ_layout,
    sdO_layout,
    sK_layout,
    sV_layout,
    sPdS_layout,
    g2s_qk: cute.TiledCopy,
    g2s_vdo: cute.TiledCopy,
    s2g_k: cute.TiledCopy,
    s2g_v: cute.TiledCopy,
    mma_sdp: cute.TiledMma,
    mma_dkv: cute.TiledMma,
    mma_dq: cute.TiledMma,
    Storage: cutlass.Constexpr,
):
    """Shared memory, this thread's MMA partitions and fragments, and the copies: loop-invariant, bound once."""
    bm, bn, D, Dv = cfg.bm, cfg.bn, cfg.d, cfg.dv
    dt = cfg.dtype
    c = SimpleNamespace(
        g2s_qk=g2s_qk, g2s_vdo=g2s_vdo, s2g_k=s2g_k, s2g_v=s2g_v, mma_sdp=mma_sdp, mma_dkv=mma_dkv, mma_dq=mma_dq
    )

    # ---------------------------------------------------------------- shared memory
    smem = cutlass.utils.SmemAllocator()
    storage = smem.allocate(Storage)
    sQ = c.sQ = storage.sQ.get_tensor(sQ_layout)
    sdO = c.sdO = storage.sdO.get_tensor(sdO_layout)
    sK = c.sK = storage.sK.get_tensor(sK_layout)
    sV = c.sV = storage.sV.get_tensor(sV_layout)
    sP = storage.sP.get_tensor(sPdS_layout)
    sdS = storage.sdS.get_tensor(sPdS_layout)
    c.sLSE = storage.sLSE.get_tensor(cute.make_layout(bm))
    c.sdPsum = storage.sdPsum.get_tensor(cute.make_layout(bm))
    sQt, sdOt, sKt, sPt, sdSt = [transpose_view(t) for t in (sQ, sdO, sK, sP, sdS)]

    # ---------------------------------------------------------------- MMA partitions
    thr_sdp = c.thr_sdp = mma_sdp.get_slice(tidx)
    thr_dkv = mma_dkv.get_slice(tidx)
    thr_dq = c.thr_dq = mma_dq.get_slice(tidx)
    ldsm = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), dt)
    ldsm_t = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), dt)
    s2r_sdp_a = c.s2r_sdp_a = cute.make_tiled_copy_A(ldsm, mma_sdp).get_slice(tidx)
    s2r_sdp_b = c.s2r_sdp_b = cute.make_tiled_copy_B(ldsm, mma_sdp).get_slice(tidx)
    s2r_dkv_a = c.s2r_dkv_a = cute.make_tiled_copy_A(ldsm_t, mma_dkv).get_slice(tidx)
    s2r_dkv_b = c.s2r_dkv_b = cute.make_tiled_copy_B(ldsm_t, mma_dkv).get_slice(tidx)
    s2r_dq_a = c.s2r_dq_a = cute.make_tiled_copy_A(ldsm, mma_dq).get_slice(tidx)
    s2r_dq_b = c.s2r_dq_b = cute.make_tiled_copy_B(ldsm_t, mma_dq).get_slice(tidx)
    r2s_sdp = c.r2s_sdp = cute.make_tiled_copy_C(
        cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dt, num_bits_per_copy=2 * dt.width), mma_sdp
    ).get_slice(tidx)
    c.r2s_dkv = cute.make_tiled_copy_C(
        cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dt, num_bits_per_copy=2 * dt.width), mma_dkv
    ).get_slice(tidx)

    c.tSrQ = thr_sdp.make_fragment_A(thr_sdp.partition_A(sQ[None, None, 0]))
    c.tSrK = thr_sdp.make_fragment_B(thr_sdp.partition_B(sK))
    c.tdPrdO = thr_sdp.make_fragment_A(thr_sdp.partition_A(sdO[None, None, 0]))
    c.tdPrV = thr_sdp.make_fragment_B(thr_sdp.partition_B(sV))
    c.tdVrPt = thr_dkv.make_fragment_A(thr_dkv.partition_A(sPt))
    c.tdVrdOt = thr_dkv.make_fragment_B(thr_dkv.partition_B(sdOt[None, None, 0]))
    c.tdKrdSt = thr_dkv.make_fragment_A(thr_dkv.partition_A(sdSt))
    c.tdKrQt = thr_dkv.make_fragment_B(thr_dkv.partition_B(sQt[None, None, 0]))
    c.tdQrdS = thr_dq.make_fragment_A(thr_dq.partition_A(sdS))
    c.tdQrKt = thr_dq.make_fragment_B(thr_dq.partition_B(sKt))

    c.tSsQ = s2r_sdp_a.partition_S(sQ)
    c.tSsK = s2r_sdp_b.partition_S(sK)
    c.tdPsdO = s2r_sdp_a.partition_S(sdO)
    c.tdPsV = s2r_sdp_b.partition_S(sV)
    c.tdVsPt = s2r_dkv_a.partition_S(sPt)
    c.tdVsdOt = s2r_dkv_b.partition_S(sdOt)
    c.tdKsdSt = s2r_dkv_a.partition_S(sdSt)
    c.tdKsQt = s2r_dkv_b.partition_S(sQt)
    c.tdQsdS = s2r_dq_a.partition_S(sdS)
    c.tdQsKt = s2r_dq_b.partition_S(sKt)
    c.tPsP = r2s_sdp.partition_D(sP)
    c.tdSsdS = r2s_sdp.partition_D(sdS)

    cS = cute.make_identity_tensor((bm, bn))
    c.tScS_mn = acc_as_mn(thr_sdp.partition_C(cS))
    c.t0ScS_mn = acc_as_mn(mma_sdp.get_slice(0).partition_C(cS))
    cdQ = cute.make_identity_tensor((bm, D))
    c.tdQcdQ = thr_dq.partition_C(cdQ)
    c.cK = cute.make_identity_tensor((bn, D))
    c.cV = cute.make_identity_tensor((bn, Dv))
    c.cQ = cute.make_identity_tensor((bm, D))
    c.cdO = cute.make_identity_tensor((bm, Dv))
    c.g2s_qk_thr = g2s_qk.get_slice(tidx)
    c.g2s_vdo_thr = g2s_vdo.get_slice(tidx)

    c.acc_shape_dK = thr_dkv.partition_shape_C((bn, D))
    c.acc_shape_dV = thr_dkv.partition_shape_C((bn, Dv))
    c.acc_shape_S = thr_sdp.partition_shape_C((bm, bn))
    c.acc_shape_dQ = thr_dq.partition_shape_C((bm, D))
    return c


@cute.jit
def _sequence(
    cfg: cutlass.Constexpr,
    mQ: cute.Tensor,
    mK: cute.Tensor,
    lengths,
    batch: Int32,
    head_kv: Int32,
    bx: Int32,
    grid_x: Int32,
    window_left,
    window_right,
    mLseOff=None,
    mSem=None,
) -> _Sequence:
    """This CTA's sequence record: offsets, lengths (clamped to the envelope, `seqlen_info`; `lengths`: the device
    lengths and the packed form's (max_seqlen_q, max_seqlen_kv) they are capped at), the mask's diagonal, its key
    tiles and accumulator copy."""
    p = cfg.p
    mCuQ, mCuK, mUsedQ, mUsedK, max_q, max_k = lengths
    static_q, static_k = tiles.extents(mQ, mK, p.is_thd)
    if cutlass.const_expr(p.ragged and uses_turns(p)):
        # cuDNN's ragged form: per (batch, head) turn counters for the longest sequence's tiles only
        turn_rows = turns.ragged_tiles(mSem.shape[0], grid_extent(p.grid_order, "batch"), p.num_heads_q) * cfg.bm
        max_q = cutlass.min(max_q, turn_rows)
    seq = tiles.sequence(p, batch, static_q, static_k, (mCuQ, mCuK, mUsedQ, mUsedK), max_q, max_k)
    offset_q, offset_k, seqlen_q, seqlen_k = seq.offset_q, seq.offset_k, seq.seqlen_q, seq.seqlen_k
    offset_lse = offset_q
    if cutlass.const_expr(mLseOff is not None):
        offset_lse = rows_offset(mLseOff, batch, p.token_div_lse, seqlen_q, static_q)
    diag = tiles.band(seqlen_q, seqlen_k, window_left, window_right, p.bottom_right, False).diag
    num_n = (seqlen_k + cfg.bn - 1) // cfg.bn
    splits = p.dq_splits
    if cutlass.const_expr(not p.is_thd):
        num_n = grid_x  # padding rows of dK / dV are written (as zeros) too
        if cutlass.const_expr(splits > 0):
            num_n = cutlass.max((static_k + cfg.bn - 1) // cfg.bn, 1)  # the grid holds one CTA per split
    acc_batch = batch  # the accumulator copy this CTA adds into (its own, with split copies)
    if cutlass.const_expr(splits > 0):
        acc_batch = accum.copy_batch(bx, grid_extent(cfg.p.grid_order, "batch"), batch)
    return _Sequence(
        batch,
        head_kv,
        offset_q,
        offset_k,
        seqlen_q,
        seqlen_k,
        static_q,
        static_k,
        diag,
        window_left,
        window_right,
        num_n,
        acc_batch,
        offset_lse,
    )


@cute.jit
def _key_tile(cfg: cutlass.Constexpr, s: _Sequence, bx: Int32, it: Int32, grid_x: Int32) -> _KeyTile:
    """Step `it` of this CTA's walk over key tiles: the key tile and its band of query tiles."""
    p = cfg.p
    n_block = bx + it * grid_x
    if cutlass.const_expr(p.dq_splits > 0):
        n_block = split_tile(it, bx, p.dq_splits)
    if cutlass.const_expr(uses_turns(p) and p.det_order == turns.STAIR):
        n_block = s.num_n - 1 - n_block  # higher key tiles launch first: they take the earlier turns
    m_min, m_max = fmask.m_block_range(
        n_block, cfg.bm, cfg.bn, s.seqlen_q, s.seqlen_k, s.diag, s.window_left, s.window_right
    )
    n_m = cutlass.max(m_max - m_min, 0)
    n_steps = n_m * cfg.group
    rot = Int32(0)
    if cutlass.const_expr(_rotates(cfg)):
        if n_m > 0:
            rot = n_block % n_m
    return _KeyTile(n_block, m_min, n_m, n_steps, rot)


@cute.jit
def _walk(
    cfg: cutlass.Constexpr,
    c,
    s: _Sequence,
    kt: _KeyTile,
    io: _Io,
    acc_dK: cute.Tensor,
    acc_dV: cute.Tensor,
    mK_cur: cute.Tensor,
    mV_cur: cute.Tensor,
    scale: Float32,
    scale_log2: Float32,
    tidx: Int32,
    fine_k=None,
    fine_v=None,
):
    """Load the key tile and the walk's first query tile, run every step, and pass a late turn on."""
    bm, bn = cfg.bm, cfg.bn
    kv_limit = s.seqlen_k - kt.n_block * bn
    gK = cute.local_tile(mK_cur, (bn, cfg.d), (kt.n_block, 0))
    gV = cute.local_tile(mV_cur, (bn, cfg.dv), (kt.n_block, 0))
    _load_rows(c.g2s_qk_thr, c.g2s_qk, gK, c.sK, c.cK, kv_limit, cfg.cols_qk)
    _load_rows(c.g2s_vdo_thr, c.g2s_vdo, gV, c.sV, c.cV, kv_limit, cfg.cols_v)
    head0, m0 = _tile_of(cfg, Int32(0), kt.m_min, kt.n_m, s.head_kv, kt.rot)
    _load_q(cfg, s, c.g2s_qk_thr, c.g2s_qk, io.q, head0, m0, c.sQ[None, None, 0], c.cQ, cfg.cols_qk)
    cute.arch.cp_async_commit_group()
    _load_q(cfg, s, c.g2s_vdo_thr, c.g2s_vdo, io.do, head0, m0, c.sdO[None, None, 0], c.cdO, cfg.cols_v)
    cute.arch.cp_async_commit_group()
    lse0, dps0 = _load_rows_stats(cfg, s, io, head0, m0, tidx)
    if tidx < bm:
        _stage_rows_stats(c.sLSE, c.sdPsum, lse0, dps0, tidx)

    for t in cutlass.range(kt.n_steps, unroll=1):
        _step(cfg, c, s, kt, io, acc_dK, acc_dV, scale, scale_log2, tidx, t)
        if cutlass.const_expr(fine_k is not None):
            _next_fine_head(cfg, c, s, kt, fine_k, False, acc_dK, acc_dV, t, tidx)
        if cutlass.const_expr(fine_v is not None):
            _next_fine_head(cfg, c, s, kt, fine_v, True, acc_dK, acc_dV, t, tidx)
    cute.arch.cp_async_wait_group(0)
    if cutlass.const_expr(_late_release(cfg)):
        cute.arch.barrier()
        head_p, m_p = _tile_of(cfg, kt.n_steps - 1, kt.m_min, kt.n_m, s.head_kv, kt.rot)
        _release(cfg, s, io, head_p, m_p, tidx)


@cute.jit
def _step(
    cfg: cutlass.Constexpr,
    c,
    s: _Sequence,
    kt: _KeyTile,
    io: _Io,
    acc_dK: cute.Tensor,
    acc_dV: cute.Tensor,
    scale: Float32,
    scale_log2: Float32,
    tidx: Int32,
    t: Int32,
):
    """Step t of a walk: S, P, dP, dS of one query tile; dV and dK accumulate, dQ's partial is added."""
    bm = cfg.bm
    n_block = kt.n_block
    head, m_block = _tile_of(cfg, t, kt.m_min, kt.n_m, s.head_kv, kt.rot)
    slot = Int32(0)
    if cutlass.const_expr(cfg.stages == 2):
        slot = t % 2
    has_next = t + 1 < kt.n_steps
    head_n, m_next = _tile_of(cfg, t + 1, kt.m_min, kt.n_m, s.head_kv, kt.rot)
    nxt = _Next(has_next, head_n, m_next)
    lse_n = Float32(0.0)
    dps_n = Float32(0.0)
    if has_next:
        lse_n, dps_n = _load_rows_stats(cfg, s, io, head_n, m_next, tidx)

    # ---- S = Q.K^T, P
    # fused: Q and dO of this step were issued together one step ago (stage 1: at its end);
    # split: only Q is waited for here, dO behind a second barrier (FA2's order).
    if cutlass.const_expr(cfg.fused):
        cute.arch.cp_async_wait_group(0)
    else:
        cute.arch.cp_async_wait_group(1 if cutlass.const_expr(cfg.stages == 2) else 0)
    cute.arch.barrier()
    if cutlass.const_expr(_late_release(cfg)):
        # the previous step's dQ reductions of every thread precede the barrier above
        if t > 0:
            head_p, m_p = _tile_of(cfg, t - 1, kt.m_min, kt.n_m, s.head_kv, kt.rot)
            _release(cfg, s, io, head_p, m_p, tidx)
    if cutlass.const_expr(cfg.stages == 2):
        _prefetch(cfg, c, s, io, nxt, slot, True, cfg.fused)
    acc_S, acc_S_mn = _scores(cfg, c, s, io, (head, m_block, n_block), slot, scale, scale_log2)

    # ---- dP = dO.V^T, dS
    if cutlass.const_expr(not cfg.fused):
        cute.arch.cp_async_wait_group(1 if cutlass.const_expr(cfg.stages == 2) else 0)
        cute.arch.barrier()
        if cutlass.const_expr(cfg.stages == 2):
            _prefetch(cfg, c, s, io, nxt, slot, False, True)
    _score_grads_to_smem(cfg, c, s, io, (head, m_block, n_block), slot, acc_S, acc_S_mn)

    # ---- dV += P^T.dO
    warp_mma.gemm_ss(
        c.mma_dkv,
        acc_dV,
        c.tdVrPt,
        c.tdVrdOt,
        c.tdVsPt,
        c.tdVsdOt[None, None, None, slot],
        c.s2r_dkv_a,
        c.s2r_dkv_b,
        c.s2r_dkv_a,
        c.s2r_dkv_b,
    )
    if cutlass.const_expr(cfg.stages == 1):
        cute.arch.barrier()
        _prefetch(cfg, c, s, io, nxt, slot, False, True)

    _dq_partial(cfg, c, s, io, (head, m_block, n_block), tidx)

    # ---- dK += dS^T.Q
    warp_mma.gemm_ss(
        c.mma_dkv,
        acc_dK,
        c.tdKrdSt,
        c.tdKrQt,
        c.tdKsdSt,
        c.tdKsQt[None, None, None, slot],
        c.s2r_dkv_a,
        c.s2r_dkv_b,
        c.s2r_dkv_a,
        c.s2r_dkv_b,
    )
    if cutlass.const_expr(cfg.stages == 1):
        cute.arch.barrier()
        _prefetch(cfg, c, s, io, nxt, slot, True, False)
    # stage the next tile's LSE / dpsum rows (every reader of this tile's rows passed the dS barrier)
    if has_next:
        if tidx < bm:
            _stage_rows_stats(c.sLSE, c.sdPsum, lse_n, dps_n, tidx)


@cute.jit
def _prefetch(
    cfg: cutlass.Constexpr,
    c,
    s: _Sequence,
    io: _Io,
    nxt: _Next,
    slot,
    q: cutlass.Constexpr[bool],
    do: cutlass.Constexpr[bool],
):
    """cp.async the next query tile's Q and / or dO (where there is a next tile) into the stage after this step's
    `slot` (`_next_slot`), then commit the group (empty at the walk's end)."""
    if nxt.has_next:
        if cutlass.const_expr(q):
            _load_q(
                cfg,
                s,
                c.g2s_qk_thr,
                c.g2s_qk,
                io.q,
                nxt.head,
                nxt.m_block,
                c.sQ[None, None, _next_slot(cfg, slot)],
                c.cQ,
                cfg.cols_qk,
            )
        if cutlass.const_expr(do):
            _load_q(
                cfg,
                s,
                c.g2s_vdo_thr,
                c.g2s_vdo,
                io.do,
                nxt.head,
                nxt.m_block,
                c.sdO[None, None, _next_slot(cfg, slot)],
                c.cdO,
                cfg.cols_v,
            )
    cute.arch.cp_async_commit_group()


def _next_slot(cfg, slot):
    """The smem stage the next query tile loads into: the other of two stages, or the only one."""
    return 1 - slot if cfg.stages == 2 else 0


@cute.jit
def _scores(cfg: cutlass.Constexpr, c, s: _Sequence, io: _Io, at, slot, scale: Float32, scale_log2: Float32):
    """S = Q.K^T of the step's tile (`at`: query head, query tile, key tile), modified and masked, turned into P
    in place: (acc_S, its (rows, cols) view). Fused: P also goes to smem (its readers of the previous step passed
    the step's first barrier)."""
    bm = cfg.bm
    head, m_block, n_block = at
    acc_S = cute.make_rmem_tensor(c.acc_shape_S, Float32)
    acc_S.fill(0.0)
    warp_mma.gemm_ss(
        c.mma_sdp,
        acc_S,
        c.tSrQ,
        c.tSrK,
        c.tSsQ[None, None, None, slot],
        c.tSsK,
        c.s2r_sdp_a,
        c.s2r_sdp_b,
        c.s2r_sdp_a,
        c.s2r_sdp_b,
        cfg.k_slices_qk,
    )
    acc_S_mn = acc_as_mn(acc_S)
    if cutlass.const_expr(cfg.p.has_score_mods):
        _score_mods(cfg, c, s, io, acc_S_mn, head, m_block, n_block, scale)
    if fmask.tile_needs_mask(
        m_block, n_block, bm, cfg.bn, s.seqlen_q, s.seqlen_k, s.diag, s.window_left, s.window_right
    ):
        fmask.apply_mask(
            acc_S_mn,
            c.tScS_mn,
            c.t0ScS_mn,
            m_block * bm,
            n_block * cfg.bn,
            s.seqlen_k,
            s.diag,
            s.window_left,
            s.window_right,
            mask_seqlen=True,
        )
    _probabilities(acc_S_mn, c.tScS_mn, c.sLSE, scale_log2)
    if cutlass.const_expr(cfg.fused):
        rP = cute.make_fragment_like(acc_S, cfg.dtype)
        rP.store(acc_S.load().to(cfg.dtype))
        cute.copy(c.r2s_sdp, c.r2s_sdp.retile(rP), c.tPsP)
    return acc_S, acc_S_mn


@cute.jit
def _score_grads_to_smem(
    cfg: cutlass.Constexpr, c, s: _Sequence, io: _Io, at, slot, acc_S: cute.Tensor, acc_S_mn: cute.Tensor
):
    """dP = dO.V^T and dS of the step's tile (`at`: query head, query tile, key tile); dBias = dS where declared;
    P (split) and dS to smem, then a barrier."""
    dt = cfg.dtype
    head, m_block, n_block = at
    acc_dP = cute.make_rmem_tensor(c.acc_shape_S, Float32)
    acc_dP.fill(0.0)
    warp_mma.gemm_ss(
        c.mma_sdp,
        acc_dP,
        c.tdPrdO,
        c.tdPrV,
        c.tdPsdO[None, None, None, slot],
        c.tdPsV,
        c.s2r_sdp_a,
        c.s2r_sdp_b,
        c.s2r_sdp_a,
        c.s2r_sdp_b,
        cfg.k_slices_v,
    )
    _score_grads(acc_as_mn(acc_dP), acc_S_mn, c.tScS_mn, c.sdPsum)
    if cutlass.const_expr(not cfg.fused):
        rP = cute.make_fragment_like(acc_S, dt)
        rP.store(acc_S.load().to(dt))
    rdS = cute.make_fragment_like(acc_dP, dt)
    rdS.store(acc_dP.load().to(dt))
    if cutlass.const_expr(cfg.p.has_dbias):  # dBias = dS, before the scale
        if cutlass.const_expr(cfg.p.dbias_accum):
            _add_dbias(cfg, c, s, io, acc_as_mn(acc_dP), head, m_block, n_block)
        else:
            _store_dbias(cfg, c, s, io, acc_as_mn(rdS), head, m_block, n_block)
    if cutlass.const_expr(not cfg.fused):
        cute.copy(c.r2s_sdp, c.r2s_sdp.retile(rP), c.tPsP)
    cute.copy(c.r2s_sdp, c.r2s_sdp.retile(rdS), c.tdSsdS)
    cute.arch.barrier()


@cute.jit
def _dq_partial(cfg: cutlass.Constexpr, c, s: _Sequence, io: _Io, at, tidx: Int32):
    """dQ partial = dS.K of the step's tile (`at`: query head, query tile, key tile) -> the fp32 accumulator.
    Deterministic turns: thread 0 reads its turn before the dQ GEMM, so the other warps compute while warp 0
    waits on the load (a stale read is re-polled at the reductions)."""
    head, m_block, n_block = at
    polled = Int32(-1)
    if cutlass.const_expr(uses_turns(cfg.p)):
        if tidx == 0:
            polled = ld_acquire_i32(_sem_ptr(cfg, s, io, head, m_block))
    acc_dQ = cute.make_rmem_tensor(c.acc_shape_dQ, Float32)
    acc_dQ.fill(0.0)
    warp_mma.gemm_ss(
        c.mma_dq, acc_dQ, c.tdQrdS, c.tdQrKt, c.tdQsdS, c.tdQsKt, c.s2r_dq_a, c.s2r_dq_b, c.s2r_dq_a, c.s2r_dq_b
    )
    _add_dq(cfg, c, s, io, acc_dQ, head, m_block, n_block, tidx, polled)


@cute.jit
def _score_mods(
    cfg: cutlass.Constexpr,
    c,
    s: _Sequence,
    io: _Io,
    acc_S_mn: cute.Tensor,
    head: Int32,
    m_block: Int32,
    n_block: Int32,
    scale: Float32,
):
    """S -> scale * S + bias + ALiBi of query head `head`, in place (score_mod; masks come after)."""
    mB, row_limit, col_limit, slope = score_mod.sequence_mods(cfg.p, io.bias, s.batch, head, s.seqlen_q, s.seqlen_k)
    tBgB = None
    if cutlass.const_expr(cfg.p.has_bias):
        tBgB = _score_tile(cfg, c, mB, m_block, n_block)
    score_mod.add_score_mods(
        acc_S_mn, c.tScS_mn, c.t0ScS_mn, tBgB, scale, m_block * cfg.bm, n_block * cfg.bn, row_limit, col_limit, slope
    )


@cute.jit
def _score_tile(cfg: cutlass.Constexpr, c, mX: cute.Tensor, m_block: Int32, n_block: Int32) -> cute.Tensor:
    """The (query tile, key tile) of an (S_q, S_kv) tensor (bias, dBias, its accumulator) partitioned like this
    thread's scores, as a (rows, cols) view."""
    return acc_as_mn(c.thr_sdp.partition_C(cute.local_tile(mX, (cfg.bm, cfg.bn), (m_block, n_block))))


@cute.jit
def _store_dbias(
    cfg: cutlass.Constexpr, c, s: _Sequence, io: _Io, rdS_mn: cute.Tensor, head: Int32, m_block: Int32, n_block: Int32
):
    """dS of one (query tile, key tile) into dBias as it is (dense, one (batch, head) per element): every
    element inside dBias's extents, the zeros of masked and padding positions included."""
    p = cfg.p
    mdB = score_mod.bias_rows(io.dbias, s.batch, head, p.bias_per_batch, p.bias_per_head)
    score_mod.write_score_tile(
        rdS_mn,
        _score_tile(cfg, c, mdB, m_block, n_block),
        c.tScS_mn,
        c.t0ScS_mn,
        mdB.shape[0] - m_block * cfg.bm,
        mdB.shape[1] - n_block * cfg.bn - c.tScS_mn[0][1],
        add=False,
    )


@cute.jit
def _add_dbias(
    cfg: cutlass.Constexpr, c, s: _Sequence, io: _Io, dS_mn: cute.Tensor, head: Int32, m_block: Int32, n_block: Int32
):
    """red.global.add dS (fp32) of one (query tile, key tile) into the dBias accumulator (dbias_accum), the
    positions inside the sequence only (the others add 0). Neighbouring columns go as one 8-byte reduction on
    sm_90+: the accumulator's rows are 16-byte multiples, so a pair never leaves its row. Deterministic: the
    accumulator holds a copy per (batch entry, query head), so this is the one write of each element: a plain
    store (the dQ convert sums the copies in a fixed order)."""
    p = cfg.p
    mA = score_mod.bias_rows(io.dbias_acc, s.batch, head, p.dbias_accum_per_batch, p.dbias_accum_per_head)
    score_mod.write_score_tile(
        dS_mn,
        _score_tile(cfg, c, mA, m_block, n_block),
        c.tScS_mn,
        c.t0ScS_mn,
        cutlass.min(s.seqlen_q, mA.shape[0]) - m_block * cfg.bm,
        cutlass.min(s.seqlen_k, mA.shape[1]) - n_block * cfg.bn - c.tScS_mn[0][1],
        add=not p.deterministic,
        pairs=True,
        vector_red=cfg.vector_red,
    )


@cute.jit
def _zero_dbias_outside_band(cfg: cutlass.Constexpr, s: _Sequence, kt: _KeyTile, io: _Io, tidx: Int32):
    """Zeros into the dBias elements of this key tile's columns that no step of its walk writes
    (`score_mod.zero_dbias_outside_band`)."""
    score_mod.zero_dbias_outside_band(
        cfg.p,
        io.dbias,
        s.batch,
        s.head_kv * cfg.group,
        cfg.group,
        kt.m_min,
        kt.n_m,
        cfg.bm,
        kt.n_block,
        cfg.bn,
        s.static_q,
        s.static_k,
        cfg.threads,
        tidx,
    )


@cute.jit
def _probabilities(acc_S_mn: cute.Tensor, tScS_mn: cute.Tensor, sLSE: cute.Tensor, scale_log2: Float32):
    """S -> P = exp2(S * scale * log2e - LSE * log2e), in place; a row's staged LSE is +inf past the sequence."""
    for r in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[0])):
        lse2 = sLSE[tScS_mn[r, 0][0]]
        acc_S_mn[r, None].store(cute.math.exp2(acc_S_mn[r, None].load() * scale_log2 - lse2, fastmath=True))


@cute.jit
def _score_grads(acc_dP_mn: cute.Tensor, acc_P_mn: cute.Tensor, tScS_mn: cute.Tensor, sdPsum: cute.Tensor):
    """dP -> dS = P * (dP - rowsum(dO * O)), in place."""
    for r in cutlass.range_constexpr(cute.size(acc_dP_mn, mode=[0])):
        dps = sdPsum[tScS_mn[r, 0][0]]
        acc_dP_mn[r, None].store(acc_P_mn[r, None].load() * (acc_dP_mn[r, None].load() - dps))


@cute.jit
def _write_dk_dv(
    cfg: cutlass.Constexpr,
    c,
    acc_dK: cute.Tensor,
    acc_dV: cute.Tensor,
    scale: Float32,
    gdK: cute.Tensor,
    gdV: cute.Tensor,
    rows_left: Int32,
    tidx: Int32,
):
    """Epilogue of a key tile: dK (scaled) and dV in the io dtype, through the K / V smem tiles to their rows."""
    dt = cfg.dtype
    cute.arch.barrier()
    acc_dK.store(acc_dK.load() * scale)
    rdK = cute.make_fragment_like(acc_dK, dt)
    rdK.store(acc_dK.load().to(dt))
    rdV = cute.make_fragment_like(acc_dV, dt)
    rdV.store(acc_dV.load().to(dt))
    cute.copy(c.r2s_dkv, c.r2s_dkv.retile(rdK), c.r2s_dkv.partition_D(c.sK))
    cute.copy(c.r2s_dkv, c.r2s_dkv.retile(rdV), c.r2s_dkv.partition_D(c.sV))
    cute.arch.barrier()
    rows.store_rows(c.s2g_k, c.sK, gdK, c.cK, rows_left, tidx, regs_like_dst=True, cols=cfg.cols_qk)
    rows.store_rows(c.s2g_v, c.sV, gdV, c.cV, rows_left, tidx, regs_like_dst=True, cols=cfg.cols_v)
    cute.arch.barrier()


@cute.jit
def _next_fine_head(
    cfg: cutlass.Constexpr,
    c,
    s: _Sequence,
    kt: _KeyTile,
    fine: _Fine,
    is_v: cutlass.Constexpr[bool],
    acc_dK: cute.Tensor,
    acc_dV: cute.Tensor,
    t: Int32,
    tidx: Int32,
):
    """K and V heads apart, after step t: where the query heads of one of this tensor's heads (V's if `is_v`, else
    K's) end and the walk goes on, its dK or dV tile goes out and the next head's K or V tile comes in (the walk
    takes the query heads in order)."""
    span = kt.n_m * (cfg.group_v if cutlass.const_expr(is_v) else cfg.group_k)
    if (t + 1) % span == 0 and t + 1 < kt.n_steps:
        j = (t + 1) // span
        _store_fine(cfg, c, s, kt, fine, is_v, acc_dK, acc_dV, fine.head0 + j - 1, tidx)
        if cutlass.const_expr(is_v):
            acc_dV.fill(0.0)
        else:
            acc_dK.fill(0.0)
        _load_fine(cfg, c, s, kt, fine, is_v, fine.head0 + j)


@cute.jit
def _store_fine(
    cfg: cutlass.Constexpr,
    c,
    s: _Sequence,
    kt: _KeyTile,
    fine: _Fine,
    is_v: cutlass.Constexpr[bool],
    acc_dK: cute.Tensor,
    acc_dV: cute.Tensor,
    head: Int32,
    tidx: Int32,
):
    """The accumulated dV (`is_v`) or dK (scaled) tile to head `head`'s rows, staged through its own V or K smem
    tile as the epilogue does (every thread is done with that tile first)."""
    dt = cfg.dtype
    batch = block_coord(cfg.p.grid_order, "batch")
    out_rows = s.seqlen_k if cutlass.const_expr(cfg.p.is_thd) else s.static_k
    rows_left = out_rows - kt.n_block * cfg.bn
    sX, cX, s2g, d, cols = _fine_tile(cfg, c, is_v)
    cute.arch.barrier()
    rX = cute.make_fragment_like(acc_dV if cutlass.const_expr(is_v) else acc_dK, dt)
    if cutlass.const_expr(is_v):
        rX.store(acc_dV.load().to(dt))
    else:
        rX.store((acc_dK.load() * fine.scale).to(dt))
    cute.copy(c.r2s_dkv, c.r2s_dkv.retile(rX), c.r2s_dkv.partition_D(sX))
    cute.arch.barrier()
    gX = cute.local_tile(
        rows.widen(rows.head_rows(fine.grad, head, batch, s.offset_k, cfg.p.is_thd), d), (cfg.bn, d), (kt.n_block, 0)
    )
    rows.store_rows(s2g, sX, gX, cX, rows_left, tidx, regs_like_dst=True, cols=cols)
    cute.arch.barrier()


def _fine_tile(cfg, c, is_v: bool) -> tuple:
    """V's (`is_v`) or K's smem tile, its coordinates, its smem -> global copy, the tile's head-dim extent and its
    column limit (`cols_v` / `cols_qk`)."""
    if is_v:
        return c.sV, c.cV, c.s2g_v, cfg.dv, cfg.cols_v
    return c.sK, c.cK, c.s2g_k, cfg.d, cfg.cols_qk


@cute.jit
def _load_fine(
    cfg: cutlass.Constexpr, c, s: _Sequence, kt: _KeyTile, fine: _Fine, is_v: cutlass.Constexpr[bool], head: Int32
):
    """Head `head`'s V (`is_v`) or K tile of this key tile into its smem tile, waited for (with whatever else is in
    flight) before the next step reads it."""
    batch = block_coord(cfg.p.grid_order, "batch")
    kv_limit = s.seqlen_k - kt.n_block * cfg.bn
    sX, cX, _, d, cols = _fine_tile(cfg, c, is_v)
    g2s_thr, g2s = (c.g2s_vdo_thr, c.g2s_vdo) if cutlass.const_expr(is_v) else (c.g2s_qk_thr, c.g2s_qk)
    gX = cute.local_tile(
        rows.widen(rows.head_rows(fine.src, head, batch, s.offset_k, cfg.p.is_thd), d), (cfg.bn, d), (kt.n_block, 0)
    )
    _load_rows(g2s_thr, g2s, gX, sX, cX, kv_limit, cols)
    cute.arch.cp_async_commit_group()
    cute.arch.cp_async_wait_group(0)
    cute.arch.barrier()


@cute.jit
def _load_q(
    cfg: cutlass.Constexpr,
    s: _Sequence,
    thr_copy,
    tiled_copy,
    mX: cute.Tensor,
    head: Int32,
    m_block: Int32,
    sX: cute.Tensor,
    cX: cute.Tensor,
    limit_cols: cutlass.Constexpr[int],
):
    """cp.async one query tile of q or do (rows past the sequence, and columns >= `limit_cols`, zero-filled)."""
    batch = block_coord(cfg.p.grid_order, "batch")
    cols = cute.size(sX, mode=[1])
    mX_cur = rows.widen(rows.head_rows(mX, head, batch, s.offset_q, cfg.p.is_thd), cols)
    gX = cute.local_tile(mX_cur, (cfg.bm, cols), (m_block, 0))
    _load_rows(thr_copy, tiled_copy, gX, sX, cX, s.seqlen_q - m_block * cfg.bm, limit_cols)


@cute.jit
def _load_rows_stats(cfg: cutlass.Constexpr, s: _Sequence, io: _Io, head: Int32, m_block: Int32, tidx: Int32):
    """This thread's row of a query tile, as loaded: (LSE, or -inf past the sequence; dpsum, or 0).

    Nothing here reads the loaded values, so the loads stay in flight until `_stage_rows_stats` at the end of
    the step; converting them here made every step wait out a global-memory round trip.
    """
    row = m_block * cfg.bm + tidx
    lse = -Float32.inf
    dps = Float32(0.0)
    if tidx < cfg.bm and row < s.seqlen_q:
        if cutlass.const_expr(cfg.p.is_thd):
            if cutlass.const_expr(cfg.p.stats_per_batch):
                lse = io.lse[s.batch, head, row]
            else:
                lse = io.lse[head, s.offset_lse + row]
            dps = io.dpsum[head, s.offset_q + row]
        else:
            lse = io.lse[s.batch, head, row]
            dps = io.dpsum[s.batch, head, row]
    return lse, dps


@cute.jit
def _stage_rows_stats(sLSE: cute.Tensor, sdPsum: cute.Tensor, lse: Float32, dps: Float32, tidx: Int32):
    """Store a row's LSE * log2e (+inf for -inf: a row with no keys, or past the sequence, gets P = 0) and dpsum."""
    lse2 = Float32.inf
    if lse != -Float32.inf:
        lse2 = lse * LOG2_E
    sLSE[tidx] = lse2
    sdPsum[tidx] = dps


@cute.jit
def _add_dq(
    cfg: cutlass.Constexpr,
    c,
    s: _Sequence,
    io: _Io,
    acc_dQ: cute.Tensor,
    head: Int32,
    m_block: Int32,
    n_block: Int32,
    tidx: Int32,
    polled: Int32,
):
    """Add a dQ partial into the fp32 accumulator (in key-tile order when deterministic).

    `polled`: thread 0's acquire read of the semaphore before the dQ GEMM (deterministic turns), else -1.
    The dense accumulator's batch index `s.acc_batch` selects this CTA's own copy with `dq_splits`.
    """
    p = cfg.p
    if cutlass.const_expr(p.is_thd):
        acc_view = rows.widen(cute.domain_offset((s.offset_q, 0), io.acc[head, None, None]), cfg.d)
    else:
        acc_view = rows.widen(accum.dense_acc_rows(p, io.acc, s.acc_batch, head, cols=cfg.d), cfg.d)
    gAcc = cute.local_tile(acc_view, (cfg.bm, cfg.d), (m_block, 0))
    tAcc = c.thr_dq.partition_C(gAcc)
    limit = s.seqlen_q - m_block * cfg.bm

    sem_ptr = None
    if cutlass.const_expr(io.sem is not None):
        sem_ptr = _sem_ptr(cfg, s, io, head, m_block)
        turn = _turn(cfg, s, m_block, n_block)
        if tidx == 0:
            if polled != turn:
                while ld_acquire_i32(sem_ptr) != turn:
                    pass
        cute.arch.barrier()

    # a full tile (the common case) adds without per-row checks: a check around an asm reduction becomes a
    # branch, and ptxas does not schedule other work across it
    if limit >= cfg.bm:
        _red_dq(cfg, acc_dQ, tAcc, c.tdQcdQ, limit, False)
    else:
        _red_dq(cfg, acc_dQ, tAcc, c.tdQcdQ, limit, True)

    if cutlass.const_expr(io.sem is not None and not _late_release(cfg)):
        # every thread's reductions precede the barrier; one thread's fence + release publishes them all
        cute.arch.barrier()
        _release(cfg, s, io, head, m_block, tidx)


def _late_release(cfg) -> bool:
    """Deterministic turns released at the next step's first barrier (or after the walk), not right away."""
    return uses_turns(cfg.p) and cfg.p.det_late_release


@cute.jit
def _sem_ptr(cfg: cutlass.Constexpr, s: _Sequence, io: _Io, head: Int32, m_block: Int32):
    """The turn semaphore of one (batch, query head, query tile) (`turns.turn_index`)."""
    p = cfg.p
    if cutlass.const_expr(p.ragged):
        # sequences may lie anywhere and in any order: per (batch, head) the tiles of the longest one
        n_batch = grid_extent(p.grid_order, "batch")
        per_seq = turns.ragged_tiles(io.sem.shape[0], n_batch, p.num_heads_q)
        idx = turns.turn_index(head, m_block, p.num_heads_q, per_seq, batch=s.batch)
    elif cutlass.const_expr(p.is_thd):
        n_batch = grid_extent(p.grid_order, "batch")
        per_head = io.acc.shape[1] // cfg.bm + n_batch + 1
        idx = turns.turn_index(
            head, m_block, p.num_heads_q, per_head, first_tile=accum.packed_acc_tile(s.offset_q, s.batch, cfg.bm)
        )
    else:
        idx = turns.turn_index(head, m_block, p.num_heads_q, (s.static_q + cfg.bm - 1) // cfg.bm, batch=s.batch)
    return elem_ptr(io.sem, idx)


@cute.jit
def _release(cfg: cutlass.Constexpr, s: _Sequence, io: _Io, head: Int32, m_block: Int32, tidx: Int32):
    """Pass the turn of (head, m_block) on; callers put a CTA barrier after this CTA's reductions first.

    The last warp releases, so warp 0, which reads the turns, does not also wait out the release's fence.
    """
    releaser = cfg.threads - 32
    if tidx == releaser:
        cute.arch.fence_acq_rel_gpu()
        red_release_add_i32(_sem_ptr(cfg, s, io, head, m_block), Int32(1))


@cute.jit
def _red_dq(
    cfg: cutlass.Constexpr,
    acc_dQ: cute.Tensor,
    tAcc: cute.Tensor,
    tdQcdQ: cute.Tensor,
    limit: Int32,
    check: cutlass.Constexpr[bool],
):
    """red.global.add this thread's dQ partial into its accumulator rows (rows >= limit skipped if `check`)."""
    n_vals = cute.size(acc_dQ)
    for i in cutlass.range_constexpr(0, n_vals, 2):
        if cutlass.const_expr(check):
            if tdQcdQ[i][0] < limit:
                _red_pair_cols(cfg, tAcc, acc_dQ, tdQcdQ, i)
        else:
            _red_pair_cols(cfg, tAcc, acc_dQ, tdQcdQ, i)


@cute.jit
def _red_pair_cols(
    cfg: cutlass.Constexpr, tAcc: cute.Tensor, acc_dQ: cute.Tensor, tdQcdQ: cute.Tensor, i: cutlass.Constexpr[int]
):
    """`_red_pair`, skipped for a pair in the columns past the head dim of a padded tile (a pair is two
    neighbouring columns of one 8-column block: both in or both out)."""
    if cutlass.const_expr(cfg.cols_qk == 0):
        _red_pair(cfg, tAcc, acc_dQ, i)
    else:
        if tdQcdQ[i][1] < cfg.cols_qk:
            _red_pair(cfg, tAcc, acc_dQ, i)


@cute.jit
def _red_pair(cfg: cutlass.Constexpr, tAcc: cute.Tensor, acc_dQ: cute.Tensor, i: cutlass.Constexpr[int]):
    """Values i, i+1 (neighbouring columns): one 8-byte reduction on sm_90+, two 4-byte ones below."""
    if cutlass.const_expr(cfg.vector_red):
        red_add_f32(elem_ptr(tAcc, i), [acc_dQ[i], acc_dQ[i + 1]])
    else:
        red_add_f32(elem_ptr(tAcc, i), [acc_dQ[i]])
        red_add_f32(elem_ptr(tAcc, i + 1), [acc_dQ[i + 1]])


@cute.jit
def _turn(cfg: cutlass.Constexpr, s: _Sequence, m_block: Int32, n_block: Int32) -> Int32:
    """Key tile n_block's place in the fixed order of dQ additions to query tile m_block.

    The key tiles that visit a query tile (`fmask.m_block_range`) are a
    contiguous run [n_lo, n_hi]. The stair order counts down from n_hi, the tile
    nearest the diagonal, which reaches the query tile first when every key
    tile walks upward from its band start (key tiles launch from the last). The rotated
    order (every key tile visits every query tile) ranks by arrival on the rotated walks.
    """
    bm, bn = cfg.bm, cfg.bn
    turn = Int32(0)
    if cutlass.const_expr(cfg.p.det_order == turns.ROTATED):
        turn = turns.rotated_turn(
            n_block, m_block, (s.seqlen_k + bn - 1) // bn, (s.seqlen_q + bm - 1) // bm, cutlass.min
        )
    else:
        turn = turns.stair_turn(
            n_block, m_block, bm, bn, s.seqlen_k, s.diag, None, s.window_right, True, Int32, cutlass.min, cutlass.max
        )
    return turn


def build(params: Sm80BwdParams, arch: str):
    """The host entry (declared-order tensors) and fake arguments in `main_args(params)` order."""
    main = SdpaBwdSm80(params, arch)
    return accum.build_entry(params, main.names, main.launch)
