"""Backward step 3 of every chain (dQ convert): dQ = scale * accumulator in the io dtype, and dSink.

Input contract (`chain.BwdHelperParams`): the fp32 dQ accumulator the preprocess zeroed and the main
kernel filled, dense (batch * copies, heads, rows, head_dim) in rows, 8x8 blocks (`dq_accum_blocked`) or
tiles in wgmma fragment order (`dq_accum_tile`), with `dq_splits` copies stacked copy-major along the
batch mode, or THD (heads, tokens, head_dim); the dSink partials of the preprocess. Plain loads and
stores only: any arch.

The grid is the preprocess grid (64-row blocks x query heads x batch; THD: over
the packed tokens), so every row of dQ is written, padding rows and tokens
outside every sequence included (their accumulator rows are zero); the ragged-offset form's
grid is its preprocess's, and only the rows of the sequences are written. A fragment-order
accumulator is read one tile per CTA instead: its 16-byte groups land in a shared
memory tile by `accum.fragment_coord`, which then leaves in rows. With
`dq_splits` the accumulator's copies are summed in copy order. dQ goes to
its declared strides with 16-byte stores. The CTAs of row block 0, batch 0 also
sum one head's dSink partials in a fixed order (deterministic in every mode). With
`dbias_accum` the whole grid also converts the fp32 dBias accumulator into dBias
(grid-stride over its rows, every element: zeros where nothing was added).

Argument list: `chain.postprocess_args`.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from frost.engines.common.sdpa_entry import IO_DTYPES
from frost.engines.common.lanes import lanes_allreduce_sum
from frost.engines.common.seqlen import clamp, own_token_offset, packed_length, token_offset
from frost.engines.sdpa_bwd.accum import (
    FRAGMENT_THREADS,
    acc_copies,
    build_entry,
    fragment_coord,
    fragment_offset,
    packed_acc_tile,
)
from frost.engines.sdpa_bwd.chain import BwdHelperParams, helper_suffix, postprocess_args
from frost.engines.sdpa_bwd.scratch import PARTIALS_PER_CTA, ROWS_PER_CTA, packed_fragments

THREADS = 128
VEC = 8


def kernel_name(params: BwdHelperParams, arch: str) -> str:
    return f"frost_sdpa_bwd_post_{helper_suffix(params)}"


class SdpaBwdPostprocess:
    """The dQ-convert kernel object: plan-time constants and the host-side launch; device code: `kernel`."""

    def __init__(self, p: BwdHelperParams):
        self.p = p
        self.names = postprocess_args(p)

    def launch(self, a: dict) -> None:
        """`a`: this kernel's arguments by contract name, tensors in canonical views."""
        mdQ = a["dq"]
        if cutlass.const_expr(self.p.ragged):  # the preprocess grid: each sequence's row blocks per batch entry
            total = a["max_seqlen_q"]
            n_batch = a["seqused_q"].shape[0]
        elif cutlass.const_expr(packed_fragments(self.p)):  # each sequence's fragment-order tiles
            total = a["max_seqlen_q"]
            n_batch = a["cu_seqlens_q"].shape[0] - 1
        elif cutlass.const_expr(self.p.is_thd):
            total = mdQ.shape[0]
            n_batch = Int32(1)
        else:
            total = mdQ.shape[1]
            n_batch = mdQ.shape[0]
        rows = self.p.dq_accum_tile or ROWS_PER_CTA
        n_blocks = cutlass.max((total + rows - 1) // rows, 1)
        kernel(
            self.p,
            mdQ,
            a["dq_accum"],
            a.get("dsinks"),
            a.get("dsink_partial"),
            a.get("dbias"),
            a.get("dbias_accum"),
            Float32(a["softmax_scale"]),
            a.get("cu_seqlens_q"),
            a.get("seqused_q"),
            a.get("dq_offsets"),
        ).launch(
            grid=(n_blocks, self.p.num_heads_q, n_batch), block=(THREADS, 1, 1), stream=a["stream"], use_pdl=self.p.pdl
        )


@cute.kernel
def kernel(
    p: cutlass.Constexpr,
    mdQ: cute.Tensor,
    mAcc: cute.Tensor,
    mdSinks,
    mPart,
    mdBias,
    mDBiasAcc,
    scale: Float32,
    mCuQ,
    mUsedQ,
    mdQOff,
):
    if cutlass.const_expr(p.pdl):  # launched while the main kernel runs: its dQ partials are complete after this
        cute.arch.griddepcontrol_wait()
    tidx, _, _ = cute.arch.thread_idx()
    bx, head, batch = cute.arch.block_idx()
    gx, gy, gz = cute.arch.grid_dim()
    dt = IO_DTYPES[p.dtype]
    if cutlass.const_expr(p.is_thd):
        extent = mdQ.shape[0]
    else:
        extent = mdQ.shape[1]
    packed_rows = extent  # the preprocess grid's rows (dSink's partials)
    copies = acc_copies(p, mAcc, gz, batch, head)
    convert_tile = True
    if cutlass.const_expr(packed_fragments(p)):
        if batch == gz - 1:  # tokens after the last sequence belong to none: their dQ is 0
            _zero_tail_rows(p, mdQ, clamp(mCuQ[gz], Int32(0), packed_rows), packed_rows, dt, tidx, bx, gx, head)
        # frost's packed form in fragment-order tiles: sequence `batch`'s tile bx, from its own tiles (start and
        # end clamped to the token extent as `seqlen.seqlen_info` clamps them)
        start = token_offset(mCuQ, batch, 0, packed_rows)
        extent = packed_length(mCuQ, batch, start, packed_rows)
        mdQ = cute.domain_offset((start, 0, 0), mdQ)
        copies = [
            cute.domain_offset((packed_acc_tile(start, batch, p.dq_accum_tile) * p.dq_accum_tile, 0), c) for c in copies
        ]
        convert_tile = bx * p.dq_accum_tile < extent
    if cutlass.const_expr(p.ragged):
        # cuDNN's ragged-offset form: the rows of sequence `batch` only, from its first token
        base = token_offset(mCuQ, batch, p.token_div_q, packed_rows)
        extent = clamp(mUsedQ[batch], Int32(0), packed_rows - base)
        mdQ = cute.domain_offset((own_token_offset(p, "dq", mdQOff, batch, base, extent, packed_rows), 0, 0), mdQ)
        copies = [cute.domain_offset((base, 0), c) for c in copies]
    chunks_per_row = p.head_dim // VEC
    if cutlass.const_expr(p.dq_accum_tile > 0):
        if convert_tile:
            _convert_fragment_tile(p, mdQ, copies[0], scale, tidx, bx, batch, head, extent)
    chunks = 0 if p.dq_accum_tile else ROWS_PER_CTA * chunks_per_row
    for i in cutlass.range_constexpr((chunks + THREADS - 1) // THREADS):
        idx = i * THREADS + tidx
        if cutlass.const_expr((i + 1) * THREADS <= chunks):
            _convert_chunk(p, mdQ, copies, scale, dt, bx, batch, head, extent, idx, chunks_per_row)
        else:  # an odd number of 16-byte chunks per row (head dims 8 mod 16): the last pass is partial
            if idx < chunks:
                _convert_chunk(p, mdQ, copies, scale, dt, bx, batch, head, extent, idx, chunks_per_row)

    if cutlass.const_expr(mdBias is not None):
        if cutlass.const_expr(p.dbias_sum_batch or p.dbias_sum_heads):
            _sum_dbias_copies(p, mdBias, mDBiasAcc, dt, (batch * gy + head) * gx + bx, gx * gy * gz, tidx)
        else:
            _convert_dbias(mdBias, mDBiasAcc, dt, (batch * gy + head) * gx + bx, gx * gy * gz, tidx)

    if cutlass.const_expr(mdSinks is not None):
        if bx == 0 and batch == 0 and tidx < 32:
            n_part = (extent + ROWS_PER_CTA - 1) // ROWS_PER_CTA * gz * PARTIALS_PER_CTA  # the preprocess grid
            if cutlass.const_expr(p.ragged):
                n_part = gx * gz * PARTIALS_PER_CTA
            if cutlass.const_expr(packed_fragments(p)):
                n_part = (packed_rows + ROWS_PER_CTA - 1) // ROWS_PER_CTA * PARTIALS_PER_CTA
            s = Float32(0.0)
            for i in cutlass.range((n_part - tidx + 31) // 32, unroll=1):
                s += mPart[head * n_part + tidx + i * 32]
            s = lanes_allreduce_sum(s, 32)
            if tidx == 0:
                mdSinks[head] = s


@cute.jit
def _zero_tail_rows(
    p: cutlass.Constexpr,
    mdQ: cute.Tensor,
    first: Int32,
    total: Int32,
    dt,
    tidx: Int32,
    bx: Int32,
    gx: Int32,
    head: Int32,
):
    """Zero dQ rows [first, total) of `head` (tokens after the last packed sequence), tiles of dq_accum_tile rows
    dealt to the last sequence's CTAs bx, bx + gx, ...: the fragment-order convert writes only the sequences'
    own rows, where the row convert writes every row."""
    tile, d = p.dq_accum_tile, p.head_dim
    span = tile * gx
    for k in cutlass.range((total - first - bx * tile + span - 1) // span, unroll=1):
        row0 = first + bx * tile + k * span
        for i in cutlass.range_constexpr((tile * d + THREADS - 1) // THREADS):
            idx = i * THREADS + tidx
            r = idx // d
            if idx < tile * d and row0 + r < total:
                mdQ[row0 + r, head, idx - r * d] = dt(0.0)


@cute.jit
def _convert_fragment_tile(
    p: cutlass.Constexpr,
    mdQ: cute.Tensor,
    acc_rows: cute.Tensor,
    scale: Float32,
    tidx: Int32,
    m_block: Int32,
    batch: Int32,
    head: Int32,
    extent: Int32,
):
    """dQ rows of query tile m_block from its fragment-order accumulator tile: each thread reads the
    16-byte groups of two MMA threads (t and t + 128), places them in a shared tile, then rows go out."""
    tile, d = p.dq_accum_tile, p.head_dim
    dt = IO_DTYPES[p.dtype]
    smem = cutlass.utils.SmemAllocator()
    s_tile = smem.allocate_tensor(dt, cute.make_layout((tile, d), stride=(d + VEC, 1)), byte_alignment=16)
    base = acc_rows.iterator + m_block * (tile * d)  # whole tiles: 16-byte aligned (the workspace is 256)
    chunk = cute.make_tensor(
        cute.make_ptr(Float32, base.toint(), cute.AddressSpace.gmem, assumed_align=16),
        cute.make_layout((4, tile * d // 4)),
    )
    group = cute.make_rmem_tensor((4,), Float32)
    for k in cutlass.range_constexpr(FRAGMENT_THREADS // THREADS):
        t = tidx + k * THREADS
        for j in cutlass.range_constexpr(tile * d // FRAGMENT_THREADS // 4):
            cute.autovec_copy(chunk[None, fragment_offset(tile, d, t, 4 * j) // 4], group)
            for e in cutlass.range_constexpr(4):
                r, c = fragment_coord(tile, d, t, 4 * j + e)
                s_tile[r, c] = (group[e] * scale).to(dt)
    cute.arch.sync_threads()
    chunks_per_row = d // VEC
    for i in cutlass.range_constexpr(tile * chunks_per_row // THREADS):
        idx = i * THREADS + tidx
        r = idx // chunks_per_row
        c = idx % chunks_per_row
        row = m_block * tile + r
        if row < extent:
            if cutlass.const_expr(p.is_thd):
                dq_row = mdQ[row, head, None]
            else:
                dq_row = mdQ[batch, row, head, None]
            cute.local_tile(dq_row, (VEC,), (c,)).store(cute.local_tile(s_tile[r, None], (VEC,), (c,)).load())


@cute.jit
def _convert_chunk(
    p: cutlass.Constexpr,
    mdQ: cute.Tensor,
    copies,
    scale: Float32,
    dt: cutlass.Constexpr,
    bx: Int32,
    batch: Int32,
    head: Int32,
    extent: Int32,
    idx: Int32,
    chunks_per_row: cutlass.Constexpr[int],
):
    """dQ's 16-byte chunk `idx` of this CTA's rows: the accumulator copies summed in order, times scale."""
    row = bx * ROWS_PER_CTA + idx // chunks_per_row
    c = idx % chunks_per_row
    if row < extent:
        if cutlass.const_expr(p.is_thd):
            dq_row = mdQ[row, head, None]
        else:
            dq_row = mdQ[batch, row, head, None]
        vals = cute.local_tile(copies[0][row, None], (VEC,), (c,)).load()
        for acc_rows in copies[1:]:  # split copies, summed in a fixed order
            vals = vals + cute.local_tile(acc_rows[row, None], (VEC,), (c,)).load()
        cute.local_tile(dq_row, (VEC,), (c,)).store((vals * scale).to(dt))


@cute.jit
def _convert_dbias(
    mdBias: cute.Tensor, mAcc: cute.Tensor, dt: cutlass.Constexpr, cta: Int32, n_cta: Int32, tidx: Int32
):
    """dBias (B or 1, H or 1, S_q, S_kv, any strides) from its fp32 accumulator (rows padded to 16 bytes): CTA
    `cta` of `n_cta` takes every n_cta-th row, its threads consecutive columns."""
    n_b, n_h, s_q, s_kv = mdBias.shape
    for it in cutlass.range((n_b * n_h * s_q - cta + n_cta - 1) // n_cta, unroll=1):
        r = cta + it * n_cta
        i = r % s_q
        bh = r // s_q
        src = mAcc[bh // n_h, bh % n_h, i, None]
        dst = mdBias[bh // n_h, bh % n_h, i, None]
        for jt in cutlass.range((s_kv - tidx + THREADS - 1) // THREADS, unroll=1):
            j = tidx + jt * THREADS
            dst[j] = src[j].to(dt)


@cute.jit
def _sum_dbias_copies(
    p: cutlass.Constexpr,
    mdBias: cute.Tensor,
    mAcc: cute.Tensor,
    dt: cutlass.Constexpr,
    cta: Int32,
    n_cta: Int32,
    tidx: Int32,
):
    """A deterministic dBias from its accumulator's copies (one per batch entry and query head): each element
    the sum, batch entries outer and heads inner in increasing order, of the copies it broadcasts over; rows
    dealt out as `_convert_dbias` deals them."""
    n_b, n_h, s_q, s_kv = mdBias.shape
    copies_b = mAcc.shape[0] if cutlass.const_expr(p.dbias_sum_batch) else 1
    copies_h = mAcc.shape[1] if cutlass.const_expr(p.dbias_sum_heads) else 1
    for it in cutlass.range((n_b * n_h * s_q - cta + n_cta - 1) // n_cta, unroll=1):
        r = cta + it * n_cta
        i = r % s_q
        bh = r // s_q
        b0, h0 = bh // n_h, bh % n_h
        dst = mdBias[b0, h0, i, None]
        for jt in cutlass.range((s_kv - tidx + THREADS - 1) // THREADS, unroll=1):
            j = tidx + jt * THREADS
            acc = Float32(0.0)
            for cb in cutlass.range(copies_b, unroll=1):
                for ch in cutlass.range(copies_h, unroll=1):
                    acc += mAcc[b0 + cb, h0 + ch, i, j]
            dst[j] = acc.to(dt)


def build(params: BwdHelperParams, arch: str):
    """The host entry (declared-order tensors) and fake arguments in `postprocess_args(params)` order."""
    helper = SdpaBwdPostprocess(params)
    return build_entry(params, helper.names, helper.launch)
