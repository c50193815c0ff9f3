"""Online softmax over a (rows, cols) accumulator view, exp2 with the scale folded in.

State per thread: `row_max` (raw logits, before scaling) and `row_sum`
(this thread's partial sum; the quad-wide sum is formed once, at finalize).
Each row of the view is spread over `threads_per_row` consecutive lanes
(4 for mma.sync and wgmma accumulators). Scores are turned into
exp2(s * scale_log2 - max * scale_log2) with one FFMA per element.

Used by every SDPA forward kernel; the backward recomputes P from the LSE
that `softmax_finalize` writes.
"""
import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32

LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)


@cute.jit
def quad_allreduce_max(x: Float32, threads_per_row: cutlass.Constexpr[int] = 4) -> Float32:
    """Max over the `threads_per_row` lanes that share one row."""
    for i in cutlass.range_constexpr(int(math.log2(threads_per_row))):
        x = cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=threads_per_row >> (i + 1)))
    return x


@cute.jit
def quad_allreduce_sum(x: Float32, threads_per_row: cutlass.Constexpr[int] = 4) -> Float32:
    """Sum over the `threads_per_row` lanes that share one row."""
    for i in cutlass.range_constexpr(int(math.log2(threads_per_row))):
        x = x + cute.arch.shuffle_sync_bfly(x, offset=threads_per_row >> (i + 1))
    return x


@cute.jit
def softmax_reset(row_max: cute.Tensor, row_sum: cute.Tensor):
    row_max.fill(-Float32.inf)
    row_sum.fill(0.0)


@cute.jit
def online_softmax(
    acc_mn: cute.Tensor,
    row_max: cute.Tensor,
    row_sum: cute.Tensor,
    row_scale: cute.Tensor,
    scale_log2: Float32,
    check_inf: cutlass.Constexpr[bool] = True,
    threads_per_row: cutlass.Constexpr[int] = 4,
):
    """One step of the online softmax on a (rows, cols) score view, in place.

    Overwrites the scores with unnormalized probabilities, updates row_max /
    row_sum, and writes into `row_scale` the factor the O accumulator rows
    must be multiplied by (see `rescale_rows`). `check_inf` guards rows whose
    scores are all -inf so far (only needed on masked tiles).
    """
    for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
        s = acc_mn[r, None].load()
        m_prev = row_max[r]
        m_cur = s.reduce(cute.ReductionOp.MAX, m_prev, 0)
        m_cur = quad_allreduce_max(m_cur, threads_per_row)
        row_max[r] = m_cur
        if cutlass.const_expr(check_inf):
            m_cur = Float32(0.0) if m_cur == -Float32.inf else m_cur
        m_scaled = m_cur * scale_log2
        p = cute.math.exp2(s * scale_log2 - m_scaled, fastmath=True)
        corr = cute.math.exp2(m_prev * scale_log2 - m_scaled, fastmath=True)
        row_scale[r] = corr
        row_sum[r] = p.reduce(cute.ReductionOp.ADD, row_sum[r] * corr, 0)
        acc_mn[r, None].store(p)


@cute.jit
def rescale_rows(acc_mn: cute.Tensor, row_scale: cute.Tensor):
    """Multiply each row of a (rows, cols) accumulator view by row_scale[row]."""
    for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
        acc_mn[r, None].store(acc_mn[r, None].load() * row_scale[r])


@cute.jit
def softmax_finalize(
    row_max: cute.Tensor,
    row_sum: cute.Tensor,
    scale_log2: Float32,
    row_scale: cute.Tensor,
    lse: cute.Tensor,
    sink=None,
    threads_per_row: cutlass.Constexpr[int] = 4,
):
    """Close the softmax: O's per-row factor into `row_scale`, natural-log LSE into `lse`.

    `sink` (Float32, a logit already in scaled units, or None) joins the
    denominator only. A row with no allowed key and no sink gets factor 0
    (so O = 0) and LSE = -inf; with a sink it gets O = 0 and LSE = sink.
    The max is re-centred on the sink when the sink dominates, so large
    sinks cannot overflow the sum.
    """
    for r in cutlass.range_constexpr(cute.size(row_max)):
        total = quad_allreduce_sum(row_sum[r], threads_per_row)
        m_scaled = row_max[r] * scale_log2  # -inf for a row with no allowed key
        corr = Float32(1.0)
        if cutlass.const_expr(sink is not None):
            sink_l2 = sink * LOG2_E
            m_new = cute.arch.fmax(m_scaled, sink_l2)
            corr = cute.math.exp2(m_scaled - m_new, fastmath=True)
            total = total * corr + cute.math.exp2(sink_l2 - m_new, fastmath=True)
            m_scaled = m_new
        empty = total == Float32(0.0)
        inv = cute.arch.rcp_approx(total if not empty else Float32(1.0))
        row_scale[r] = Float32(0.0) if empty else inv * corr
        lse[r] = -Float32.inf if empty else (m_scaled + cute.math.log2(total, fastmath=True)) * LN_2
