"""Backward step 1 of every chain: dpsum = rowsum(dO * O), zeroed dQ accumulator, dSink partial sums.

Input contract (`chain.BwdHelperParams`): the fp32 dQ accumulator as the params state it, dense
(batch * copies, heads, rows, head_dim) in rows, 8x8 blocks (`dq_accum_blocked`) or fragment-order
tiles (`dq_accum_tile`; zeroing treats all three as rows, and leaves the padding rows of the last tile,
which the dQ convert never reads) with `dq_splits` copies stacked copy-major along the batch mode, or THD (heads,
tokens, head_dim); int32 turn semaphores when deterministic without split copies. Plain loads and stores only: any arch.

One CTA per (64-row block, query head, batch) — THD: per (64-token block, query
head) over the packed tokens, so the grid follows the bound tensors' extents and
no sequence boundary is needed except for dSink (rows outside every sequence
contribute nothing). cuDNN's ragged-offset form (sequences anywhere, in any order, with gaps) instead runs one
CTA per (64-row block of the longest sequence, query head, batch entry) over that sequence's rows, from its
first token. It also zeroes the dQ accumulator rows it owns (in every
copy, with `dq_splits`) and, with deterministic turns, the dQ semaphores (grid-stride), and the fp32 dBias
accumulator (`dbias_accum`, grid-stride), so the main kernel starts from a clean workspace without a separate
fill launch.

Argument list: `chain.preprocess_args`.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from frost.engines.common.lanes import lanes_allreduce_sum
from frost.engines.common.seqlen import clamp, own_token_offset, rows_offset, token_offset
from frost.engines.sdpa_bwd.accum import acc_copies, build_entry
from frost.engines.sdpa_bwd.chain import BwdHelperParams, helper_suffix, preprocess_args
from frost.engines.sdpa_bwd.scratch import PARTIALS_PER_CTA, ROWS_PER_CTA, packed_fragments

THREADS = 128
LANES_PER_ROW = 4  # lanes sharing one row; a pass covers THREADS // 4 rows
VEC = 8  # 16-byte chunks of fp16 / bf16


def kernel_name(params: BwdHelperParams, arch: str) -> str:
    return f"frost_sdpa_bwd_pre_{helper_suffix(params)}"


class SdpaBwdPreprocess:
    """The preprocess kernel object: plan-time constants and the host-side launch; device code: `kernel`."""

    def __init__(self, p: BwdHelperParams):
        self.p = p
        self.names = preprocess_args(p)

    def launch(self, a: dict) -> None:
        """`a`: this kernel's arguments by contract name, tensors in canonical views."""
        mO = a["o"]
        if cutlass.const_expr(self.p.ragged):  # each sequence's row blocks, per batch entry
            total = a["max_seqlen_q"]
            n_batch = a["seqused_q"].shape[0]
        elif cutlass.const_expr(self.p.is_thd):
            total = mO.shape[0]
            n_batch = Int32(1)
        else:
            total = mO.shape[1]
            n_batch = mO.shape[0]
        n_blocks = cutlass.max((total + ROWS_PER_CTA - 1) // ROWS_PER_CTA, 1)
        kernel(
            self.p,
            a["o"],
            a["do"],
            a["lse"],
            a.get("cu_seqlens_q"),
            a.get("seqused_q"),
            a.get("sinks"),
            a["dpsum"],
            a["dq_accum"],
            a.get("dq_semaphore"),
            a.get("dsink_partial"),
            a.get("lse_offsets"),
            a.get("dbias_accum"),
            a.get("o_offsets"),
            a.get("do_offsets"),
            a["max_seqlen_q"] if self.p.ragged and a.get("dsink_partial") is not None else None,
        ).launch(grid=(n_blocks, self.p.num_heads_q, n_batch), block=(THREADS, 1, 1), stream=a["stream"])


@cute.kernel
def kernel(
    p: cutlass.Constexpr,
    mO: cute.Tensor,
    mdO: cute.Tensor,
    mLSE: cute.Tensor,
    mCuQ,
    mUsedQ,
    mSinks,
    mdPsum: cute.Tensor,
    mAcc: cute.Tensor,
    mSem,
    mPart,
    mLseOff,
    mDBiasAcc,
    mOOff,
    mdOOff,
    max_q,
):
    if cutlass.const_expr(p.pdl):  # the main kernel may start: it waits for this grid before reading its output
        cute.arch.griddepcontrol_launch_dependents()
    tidx, _, _ = cute.arch.thread_idx()
    bx, head, batch = cute.arch.block_idx()
    gx, gy, gz = cute.arch.grid_dim()
    lane4 = tidx % LANES_PER_ROW
    rows_per_pass = THREADS // LANES_PER_ROW
    if cutlass.const_expr(p.is_thd):
        extent = mO.shape[0]
    else:
        extent = mO.shape[1]
    ragged_acc = None  # the ragged form's accumulator rows of this sequence
    if cutlass.const_expr(p.ragged):
        # cuDNN's ragged-offset form: this CTA's rows are those of sequence `batch`, from its first token
        # (offset and length clamped to the token envelope T as `seqlen.seqlen_info` clamps them)
        total = extent
        base = token_offset(mCuQ, batch, p.token_div_q, total)
        extent = clamp(mUsedQ[batch], Int32(0), total - base)
        mO = cute.domain_offset((own_token_offset(p, "o", mOOff, batch, base, extent, total), 0, 0), mO)
        mdO = cute.domain_offset((own_token_offset(p, "do", mdOOff, batch, base, extent, total), 0, 0), mdO)
        mdPsum = cute.domain_offset((0, base), mdPsum)
        acc = cute.domain_offset((base, 0), mAcc[head, None, None])
        ragged_acc = [cute.make_tensor(acc.iterator, cute.make_layout((extent, p.head_dim), stride=acc.stride))]
        if cutlass.const_expr(mLseOff is not None):
            mLSE = cute.domain_offset((0, rows_offset(mLseOff, batch, p.token_div_lse, extent, total)), mLSE)
    # rows that lie inside a sequence (only dSink needs them)
    seq_rows = extent
    if cutlass.const_expr(mCuQ is not None and not p.ragged):
        seq_rows = clamp(mCuQ[mCuQ.shape[0] - 1], Int32(0), extent)
    if cutlass.const_expr(mUsedQ is not None):
        seq_rows = clamp(mUsedQ[batch], Int32(0), extent)
    if cutlass.const_expr(max_q is not None):  # the main kernel's rows: a length past the plan's maximum is capped
        seq_rows = cutlass.min(seq_rows, max_q)
    sink = Float32(0.0)
    if cutlass.const_expr(mSinks is not None):
        sink = mSinks[head]

    dsink = Float32(0.0)
    for pss in cutlass.range_constexpr(ROWS_PER_CTA // rows_per_pass):
        row = bx * ROWS_PER_CTA + pss * rows_per_pass + tidx // LANES_PER_ROW
        acc = Float32(0.0)
        if row < extent:
            if cutlass.const_expr(p.is_thd):
                o_row = mO[row, head, None]
                do_row = mdO[row, head, None]
            else:
                o_row = mO[batch, row, head, None]
                do_row = mdO[batch, row, head, None]
            chunks = p.head_dim_v // VEC
            for c in cutlass.range_constexpr((chunks + LANES_PER_ROW - 1) // LANES_PER_ROW):
                k = lane4 + c * LANES_PER_ROW
                if cutlass.const_expr((c + 1) * LANES_PER_ROW <= chunks):
                    acc += _row_dot(o_row, do_row, k)
                else:  # a head dim that is not a multiple of 32: the last pass is partial
                    if k < chunks:
                        acc += _row_dot(o_row, do_row, k)
        acc = lanes_allreduce_sum(acc, LANES_PER_ROW)
        if row < extent and lane4 == 0:
            if cutlass.const_expr(p.is_thd):
                mdPsum[head, row] = acc
            else:
                mdPsum[batch, head, row] = acc
            if cutlass.const_expr(mPart is not None):
                if row < seq_rows:
                    if cutlass.const_expr(p.is_thd and not p.stats_per_batch):
                        lse = mLSE[head, row]
                    else:
                        lse = mLSE[batch, head, row]
                    if lse != -Float32.inf:
                        dsink -= cute.math.exp(sink - lse) * acc

    # zero this CTA's rows of the dQ accumulator (of every copy, with split copies), 16 bytes per store (a
    # blocked accumulator's padding rows too: the same memory as its row-major view of as many rows)
    if cutlass.const_expr(packed_fragments(p)):
        # whole fragment-order tiles per sequence: more rows than packed tokens, so the grid strides over them
        acc_rows = mAcc[head, None, None]
        stride = gx * ROWS_PER_CTA
        for k in cutlass.range((acc_rows.shape[0] - bx * ROWS_PER_CTA + stride - 1) // stride, unroll=1):
            _zero_rows(acc_rows, bx * ROWS_PER_CTA + k * stride, p.head_dim, tidx)
    else:
        for acc_rows in ragged_acc if p.ragged else acc_copies(p, mAcc, gz, batch, head, blocked=False):
            _zero_rows(acc_rows, bx * ROWS_PER_CTA, p.head_dim, tidx)

    if cutlass.const_expr(mSem is not None):
        n_threads_total = gx * gy * gz * THREADS
        linear = ((batch * gy + head) * gx + bx) * THREADS + tidx
        n_sem = mSem.shape[0]
        for i in cutlass.range((n_sem - linear + n_threads_total - 1) // n_threads_total, unroll=1):
            mSem[linear + i * n_threads_total] = Int32(0)

    if cutlass.const_expr(mDBiasAcc is not None):
        _zero_grid_stride(
            cute.make_tensor(mDBiasAcc.iterator, cute.make_layout(cute.size(mDBiasAcc))),
            ((batch * gy + head) * gx + bx) * THREADS + tidx,
            gx * gy * gz * THREADS,
        )

    if cutlass.const_expr(mPart is not None):
        total = lanes_allreduce_sum(dsink, 32)
        n_part = gx * gz * PARTIALS_PER_CTA
        part = (batch * gx + bx) * PARTIALS_PER_CTA + tidx // 32
        if tidx % 32 == 0:
            mPart[head * n_part + part] = total


@cute.jit
def _row_dot(o_row: cute.Tensor, do_row: cute.Tensor, k: Int32) -> Float32:
    """sum(O * dO) over the 16-byte chunk k of a row."""
    o = cute.local_tile(o_row, (VEC,), (k,)).load().to(Float32)
    do = cute.local_tile(do_row, (VEC,), (k,)).load().to(Float32)
    return (o * do).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)


@cute.jit
def _zero_rows(acc_rows: cute.Tensor, first_row: Int32, head_dim: cutlass.Constexpr[int], tidx: Int32):
    """Zero ROWS_PER_CTA rows of a (rows, head_dim) fp32 view from `first_row` (those inside it)."""
    acc_extent = acc_rows.shape[0]
    chunks_per_row = head_dim // 4
    zero = cute.make_rmem_tensor((4,), Float32)
    zero.fill(0.0)
    for i in cutlass.range_constexpr(ROWS_PER_CTA * chunks_per_row // THREADS):
        idx = i * THREADS + tidx
        row = first_row + idx // chunks_per_row
        if row < acc_extent:
            dst = cute.local_tile(acc_rows[row, None], (4,), (idx % chunks_per_row,))
            dst.store(zero.load())


@cute.jit
def _zero_grid_stride(flat: cute.Tensor, linear: Int32, n_threads: Int32):
    """Zero a flat fp32 buffer whose length is a multiple of 4, 16 bytes per store, over the whole grid."""
    zero = cute.make_rmem_tensor((4,), Float32)
    zero.fill(0.0)
    n_chunks = cute.size(flat) // 4
    for i in cutlass.range((n_chunks - linear + n_threads - 1) // n_threads, unroll=1):
        cute.local_tile(flat, (4,), (linear + i * n_threads,)).store(zero.load())


def build(params: BwdHelperParams, arch: str):
    """The host entry (declared-order tensors) and fake arguments in `preprocess_args(params)` order."""
    helper = SdpaBwdPreprocess(params)
    return build_entry(params, helper.names, helper.launch)
