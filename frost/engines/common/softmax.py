"""Online softmax over a (rows, cols) accumulator view, exp2 with the scale folded in.

State per thread: `row_max` (raw logits, before scaling) and `row_sum`
(this thread's partial sum; the row-wide sum is formed once, at finalize).
Each row of the view is spread over `threads_per_row` consecutive lanes
(4 for mma.sync and wgmma accumulators), so row reductions end with
butterfly shuffles. Scores become exp2(s * scale_log2 - max * scale_log2),
one FFMA and one exp2 per element.

Used by every SDPA forward kernel (mma.sync and wgmma); the backward
recomputes P from the LSE that `softmax_finalize` writes.
"""

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from frost.engines.common.lanes import lanes_allreduce_max, lanes_allreduce_sum

LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)


@cute.jit
def row_max_of(row: cute.Tensor, n: cutlass.Constexpr[int]) -> Float32:
    """Max of a register row: four independent chains when n is a multiple of 4 (more ILP)."""
    if cutlass.const_expr(n % 4 != 0):
        m = row.load().reduce(cute.ReductionOp.MAX, -Float32.inf, 0)
    else:
        m0 = row[0]
        m1 = row[1]
        m2 = row[2]
        m3 = row[3]
        for i in cutlass.range_constexpr(4, n, 4):
            m0 = cute.arch.fmax(m0, row[i])
            m1 = cute.arch.fmax(m1, row[i + 1])
            m2 = cute.arch.fmax(m2, row[i + 2])
            m3 = cute.arch.fmax(m3, row[i + 3])
        m = cute.arch.fmax(cute.arch.fmax(m0, m1), cute.arch.fmax(m2, m3))
    return m


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
    is_first: cutlass.Constexpr[bool] = False,
    check_inf: cutlass.Constexpr[bool] = True,
    threads_per_row: cutlass.Constexpr[int] = 4,
):
    """One step of the online softmax on a (rows, cols) score view, in place.

    Overwrites the scores with unnormalized probabilities, updates row_max /
    row_sum, and writes into `row_scale` the factor the O accumulator rows
    must be multiplied by (see `rescale_rows`). `is_first`: the first key
    tile of a row (no earlier state; row_scale = 1). `check_inf`: a row whose
    running max is still -inf uses 0 as its max, so every term is 0 (only
    needed where a tile can be fully masked).
    """
    n = cutlass.const_expr(cute.size(acc_mn, mode=[1]))
    for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
        row = acc_mn[r, None]
        cur = row_max_of(row, n)
        if cutlass.const_expr(not is_first):
            cur = cute.arch.fmax(cur, row_max[r])
        cur = lanes_allreduce_max(cur, threads_per_row)
        prev = row_max[r]
        row_max[r] = cur
        cur_safe = cur
        if cutlass.const_expr(check_inf):
            cur_safe = 0.0 if cur == -Float32.inf else cur
        cur_scaled = cur_safe * scale_log2
        for c in cutlass.range_constexpr(n):
            row[c] = cute.math.exp2(row[c] * scale_log2 - cur_scaled, fastmath=True)
        part = row.load().reduce(cute.ReductionOp.ADD, Float32.zero, 0)
        if cutlass.const_expr(is_first):
            row_scale[r] = 1.0
            row_sum[r] = part
        else:
            sc = cute.math.exp2((prev - cur_safe) * scale_log2, fastmath=True)
            row_scale[r] = sc
            row_sum[r] = row_sum[r] * sc + part


@cute.jit
def rescale_rows(acc_mn: cute.Tensor, row_scale: cute.Tensor):
    """Multiply each row of a (rows, cols) accumulator view by row_scale[row]."""
    for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
        for c in cutlass.range_constexpr(cute.size(acc_mn, mode=[1])):
            acc_mn[r, c] = acc_mn[r, c] * row_scale[r]


@cute.jit
def softmax_finalize(
    row_max: cute.Tensor,
    row_sum: cute.Tensor,
    scale_log2: Float32,
    row_scale: cute.Tensor,
    lse: cute.Tensor,
    sink=None,
    sink_per_row: cutlass.Constexpr[bool] = False,
    threads_per_row: cutlass.Constexpr[int] = 4,
    score_max=None,
    score_sum_exp=None,
):
    """Close the softmax: O's per-row factor into `row_scale`, natural-log LSE into `lse`.

    `score_max` / `score_sum_exp` (register tensors, or None: not written) receive the two halves of the
    LSE: the row max of the scaled logits (the sink included; natural units) and the row sum of
    exp(logit - max) (the sink's term included), cuDNN's definitions; an empty row gets -inf and 0.

    `lse` may be `row_sum` itself (each row is read before it is written).
    `sink` (a logit in scaled units: one Float32 for every row, or with
    `sink_per_row` a register tensor per row; None: no sink) joins the
    denominator only. A row with no allowed key (or a NaN sum) and no sink
    gets LSE = -inf and O = 0; with a sink, O = 0 and LSE = sink. The max is
    re-centred on the sink when the sink dominates, so large sinks cannot
    overflow the sum.
    """
    for r in cutlass.range_constexpr(cute.size(row_sum)):
        total = lanes_allreduce_sum(row_sum[r], threads_per_row)
        mx_scaled = row_max[r] * scale_log2  # the terms were taken against this (-inf: all terms 0)
        corr = Float32(1.0)
        if cutlass.const_expr(sink is not None):
            sink_log2 = (sink[r] if cutlass.const_expr(sink_per_row) else sink) * LOG2_E
            m_new = cute.arch.fmax(mx_scaled, sink_log2)
            m_new = 0.0 if m_new == -Float32.inf else m_new
            corr = cute.math.exp2(mx_scaled - m_new, fastmath=True)
            total = total * corr + cute.math.exp2(sink_log2 - m_new, fastmath=True)
            mx_scaled = m_new
        empty = total == 0.0 or total != total
        row_scale[r] = cute.arch.rcp_approx(1.0 if empty else total) * corr
        if cutlass.const_expr(score_max is not None):
            score_max[r] = mx_scaled * LN_2
        if cutlass.const_expr(score_sum_exp is not None):
            score_sum_exp[r] = total
        value = (mx_scaled + cute.math.log2(total, fastmath=True)) * LN_2
        lse[r] = -Float32.inf if empty else value
