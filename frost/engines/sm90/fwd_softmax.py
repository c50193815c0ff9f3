"""Online softmax and band masking on wgmma accumulators (rows split across a quad of lanes).

Each thread holds two rows of a 64-row warpgroup tile; a row's values are spread
over the 4 lanes of a quad, so row reductions end with two butterfly shuffles.
Row sums stay per-thread until `finalize`, which reduces them once.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from frost.engines.common.softmax import LN_2, LOG2_E
from frost.engines.sm90.wgmma_utils import acc_view_mn


@cute.jit
def quad_max(x: Float32) -> Float32:
    x = cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=1))
    return cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=2))


@cute.jit
def quad_sum(x: Float32) -> Float32:
    x = x + cute.arch.shuffle_sync_bfly(x, offset=1)
    return x + cute.arch.shuffle_sync_bfly(x, offset=2)


@cute.jit
def row_max_of(row: cute.Tensor, n: cutlass.Constexpr[int]) -> Float32:
    """Max of a register row with four independent chains (n is a multiple of 4)."""
    m0 = row[0]
    m1 = row[1]
    m2 = row[2]
    m3 = row[3]
    for i in cutlass.range_constexpr(4, n, 4):
        m0 = cute.arch.fmax(m0, row[i])
        m1 = cute.arch.fmax(m1, row[i + 1])
        m2 = cute.arch.fmax(m2, row[i + 2])
        m3 = cute.arch.fmax(m3, row[i + 3])
    return cute.arch.fmax(cute.arch.fmax(m0, m1), cute.arch.fmax(m2, m3))


@cute.jit
def online_softmax(acc_S: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor, row_scale: cute.Tensor,
                   scale_log2: Float32, is_first: cutlass.Constexpr[bool]):
    """acc_S <- exp2(acc_S*scale_log2 - max*scale_log2); update max/sum; row_scale <- rescale for O.

    A row whose running max is still -inf uses 0 as its max (every term is 0).
    """
    s = acc_view_mn(acc_S)
    n = const_expr(cute.size(s, mode=[1]))
    for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
        row = s[r, None]
        cur = row_max_of(row, n)
        if const_expr(not is_first):
            cur = cute.arch.fmax(cur, row_max[r])
        cur = quad_max(cur)
        prev = row_max[r]
        row_max[r] = cur
        cur_safe = 0.0 if cur == -Float32.inf else cur
        cur_scaled = cur_safe * scale_log2
        for c in cutlass.range_constexpr(n):
            row[c] = cute.math.exp2(row[c] * scale_log2 - cur_scaled, fastmath=True)
        part = row.load().reduce(cute.ReductionOp.ADD, Float32.zero, 0)
        if const_expr(is_first):
            row_scale[r] = 1.0
            row_sum[r] = part
        else:
            sc = cute.math.exp2((prev - cur_safe) * scale_log2, fastmath=True)
            row_scale[r] = sc
            row_sum[r] = row_sum[r] * sc + part


@cute.jit
def rescale_rows(acc: cute.Tensor, row_scale: cute.Tensor):
    a = acc_view_mn(acc)
    for r in cutlass.range_constexpr(cute.size(a, mode=[0])):
        for c in cutlass.range_constexpr(cute.size(a, mode=[1])):
            a[r, c] = a[r, c] * row_scale[r]


@cute.jit
def finalize(row_max: cute.Tensor, row_sum: cute.Tensor, row_scale: cute.Tensor, scale_log2: Float32,
             sink, has_sink: cutlass.Constexpr[bool], sink_per_row: cutlass.Constexpr[bool] = False):
    """row_scale <- 1/sum (0-safe); row_sum <- natural-log LSE (-inf for an empty row without sink).

    `sink` is one Float32 for every row, or (sink_per_row, packed GQA heads) a register tensor per row.
    """
    for r in cutlass.range_constexpr(cute.size(row_sum)):
        total = quad_sum(row_sum[r])
        mx_scaled = row_max[r] * scale_log2  # the terms were taken against this (-inf: all terms 0)
        corr = Float32(1.0)
        if const_expr(has_sink):
            # re-centre on the larger of max and sink so a dominant sink cannot overflow the sum
            sink_log2 = (sink[r] if const_expr(sink_per_row) else sink) * LOG2_E
            m_new = cute.arch.fmax(mx_scaled, sink_log2)
            m_new = 0.0 if m_new == -Float32.inf else m_new
            corr = cute.math.exp2(mx_scaled - m_new, fastmath=True)
            total = total * corr + cute.math.exp2(sink_log2 - m_new, fastmath=True)
            mx_scaled = m_new
        empty = total == 0.0 or total != total
        row_scale[r] = cute.arch.rcp_approx(1.0 if empty else total) * corr
        lse = (mx_scaled + cute.math.log2(total, fastmath=True)) * LN_2
        row_sum[r] = -Float32.inf if empty else lse


@cute.jit
def apply_band_mask(acc_S: cute.Tensor, tScS_mn: cute.Tensor, t0ScS_mn: cute.Tensor, row0: Int32, col0: Int32,
                    seqlen_k: Int32, off: Int32, window_left: Int32, window_right: Int32,
                    mask_seqlen: cutlass.Constexpr[bool], mask_left: cutlass.Constexpr[bool],
                    mask_right: cutlass.Constexpr[bool], rows_per_query: cutlass.Constexpr[int] = 1):
    """Set disallowed logits to -inf: j >= seqlen_k, j < i+off-wl, j > i+off+wr (local i, j).

    `row0`/`col0` are the tile's first row and key column. Tile row m is query
    position i = m // rows_per_query (GQA packing puts rows_per_query heads of
    one position in consecutive rows). Column tests compare compile-time column
    offsets of lane 0 against per-thread limits.
    """
    s = acc_view_mn(acc_S)
    thr_col = col0 + tScS_mn[0][1]
    for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
        i = row0 + tScS_mn[r, 0][0]
        if const_expr(rows_per_query > 1):
            i = i // rows_per_query
        right = Int32(0x7FFFFFF)
        if const_expr(mask_seqlen):
            right = seqlen_k
        if const_expr(mask_right):
            right = cutlass.min(right, i + off + window_right + 1)
        right = right - thr_col
        left = Int32(0)
        if const_expr(mask_left):
            left = i + off - window_left - thr_col
        for c in cutlass.range_constexpr(cute.size(s, mode=[1])):
            cc = t0ScS_mn[0, c][1]
            if const_expr(mask_left):
                s[r, c] = -Float32.inf if (cc >= right or cc < left) else s[r, c]
            else:
                s[r, c] = -Float32.inf if cc >= right else s[r, c]
