"""Score modifiers of the frost contract (see `frost.engines.sdpa_args`): the additive bias and ALiBi.

For query row i and key column j, local to their sequences (cuDNN's order, masks after):
    logit(i, j) = softmax_scale * q_i.k_j + bias[b, h, i, j] + slope(h) * (j - i)
A kernel with score modifiers scales its S = Q.K^T tile here and hands the softmax
(or the backward's P) a scale of 1 (log2(e) in the exp2 domain). The bias is read
from global memory element by element through its declared strides (any layout),
one predicated load per score, issued together a few rows at a time (up to
FETCH_CHUNK elements, at least a row) before any is used (`fetch_bias`; the wgmma
backward fetches its whole tile before it waits for the scores); dBias leaves the
same way (`write_score_tile`). Rows and columns outside the sequence (or the bias) read 0, and
the mask then decides. ALiBi's slopes are computed in the
kernel (`alibi_slope`, cuDNN's formula; `sdpa_args.alibi_slopes` is its host twin).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from frost.engines.common import global_ops as gops


@cute.jit
def alibi_slope(head: Int32, num_heads: cutlass.Constexpr[int]) -> Float32:
    """cuDNN's ALiBi slope of query head `head` of `num_heads`: with n the largest power of two <= num_heads,
    2^(-8 (h + 1) / n) for h < n, else 2^(-4 (2 (h - n) + 1) / n)."""
    n = 1 << (num_heads.bit_length() - 1)
    exponent = Float32(head + 1) * Float32(-8.0 / n)
    if cutlass.const_expr(n != num_heads):
        if head >= n:
            exponent = Float32(2 * (head - n) + 1) * Float32(-4.0 / n)
    return cute.math.exp2(exponent)


@cute.jit
def bias_rows(
    mBias: cute.Tensor, batch: Int32, head: Int32, per_batch: cutlass.Constexpr[bool], per_head: cutlass.Constexpr[bool]
) -> cute.Tensor:
    """The (S_q, S_kv) view of one (batch entry, query head) of a declared (B or 1, H or 1, S_q, S_kv) bias or
    dBias: index 0 along a mode it broadcasts over."""
    b = Int32(0)
    h = Int32(0)
    if cutlass.const_expr(per_batch):
        b = batch
    if cutlass.const_expr(per_head):
        h = head
    return mBias[b, h, None, None]


@cute.jit
def sequence_mods(p: cutlass.Constexpr, mBias, batch: Int32, head: Int32, seqlen_q: Int32, seqlen_k: Int32):
    """The score-modifier inputs of one (batch entry, query head) of params `p` (its `has_bias`, `has_alibi`,
    `bias_per_batch`, `bias_per_head`, `num_heads_q`): (its (S_q, S_kv) bias view or None, the row and column
    limits `add_score_mods` reads the bias below (the sequence's, cut to the bias's extents), ALiBi's slope or
    None)."""
    mB = None
    row_limit, col_limit = seqlen_q, seqlen_k
    if cutlass.const_expr(p.has_bias):
        mB = bias_rows(mBias, batch, head, p.bias_per_batch, p.bias_per_head)
        row_limit = cutlass.min(seqlen_q, mB.shape[0])
        col_limit = cutlass.min(seqlen_k, mB.shape[1])
    slope = None
    if cutlass.const_expr(p.has_alibi):
        slope = alibi_slope(head, p.num_heads_q)
    return mB, row_limit, col_limit, slope


@cute.jit
def fetch_bias(
    tBgB_mn: cute.Tensor,
    tScS_mn: cute.Tensor,
    t0ScS_mn: cute.Tensor,
    row_base: Int32,
    col_base: Int32,
    row_limit: Int32,
    col_limit: Int32,
    check_cols: cutlass.Constexpr[bool] = True,
    first_row: cutlass.Constexpr[int] = 0,
    num_rows: cutlass.Constexpr[int] = 0,
) -> cute.Tensor:
    """This thread's bias elements of one tile in fp32 registers: a (num_rows, cols) fragment of the score view's
    rows first_row.. (num_rows 0: to the last), 0.0 at rows >= row_limit and, with `check_cols`, columns >=
    col_limit. The loads are predicated, not branched, so they issue back to back and their latency is paid
    once per fragment; an engine may call this before it waits for the scores so the latency hides behind the
    GEMM."""
    rows = cute.size(tBgB_mn, mode=[0]) - first_row if cutlass.const_expr(num_rows == 0) else num_rows
    cols = cute.size(tBgB_mn, mode=[1])
    rB = cute.make_rmem_tensor((rows, cols), Float32)
    bf16 = cutlass.const_expr(tBgB_mn.element_type == cutlass.BFloat16)
    col_room = col_limit - col_base - tScS_mn[0][1]
    for r in cutlass.range_constexpr(rows):
        row_ok = row_base + tScS_mn[first_row + r, 0][0] < row_limit
        for c in cutlass.range_constexpr(cols):
            ok = row_ok
            if cutlass.const_expr(check_cols):
                ok = row_ok & (t0ScS_mn[0, c][1] < col_room)
            rB[r, c] = gops.ld_16bit_as_f32_if(gops.elem_ptr(tBgB_mn, (first_row + r, c)), ok, bf16)
    return rB


# bias elements fetched at once when the caller has not prefetched the tile: enough loads in flight to pay the
# latency a few times per tile, few enough registers that the tile's other live values stay in registers
FETCH_CHUNK = 16


@cute.jit
def add_score_mods(
    acc_mn: cute.Tensor,
    tScS_mn: cute.Tensor,
    t0ScS_mn: cute.Tensor,
    tBgB_mn,
    scale: Float32,
    row_base: Int32,
    col_base: Int32,
    row_limit: Int32,
    col_limit: Int32,
    slope,
    check_cols: cutlass.Constexpr[bool] = True,
    rB=None,
):
    """acc = acc * scale + bias + slope * (j - i), in place, on a (rows, cols) score view.

    tScS_mn / t0ScS_mn: this thread's and thread 0's (row, col) tile coordinates (the thread's columns are
    thread 0's plus a uniform offset, so the column checks compare constants). `tBgB_mn`: the bias tile
    partitioned like the scores (None: no bias), read through `fetch_bias` (rows >= row_limit and, with
    `check_cols`, columns >= col_limit, sequence-local, read 0); `rB`: that fragment already fetched.
    `slope`: ALiBi's slope of this head (None: no ALiBi). `rB` may hold the first rows only (its own row
    count); the rows it lacks are fetched from `tBgB_mn` FETCH_CHUNK elements at a time.
    """
    rows = cute.size(acc_mn, mode=[0])
    cols = cute.size(acc_mn, mode=[1])
    pre = 0 if cutlass.const_expr(rB is None) else cute.size(rB, mode=[0])  # rows already fetched
    step = max(1, min(rows, FETCH_CHUNK // cols))
    chunks = [(0, pre)] if cutlass.const_expr(pre > 0) else []
    if cutlass.const_expr(tBgB_mn is None and pre == 0):
        chunks = [(0, rows)]
    elif cutlass.const_expr(tBgB_mn is not None):
        chunks += [(r0, min(step, rows - r0)) for r0 in range(pre, rows, step)]
    thr_col = col_base + tScS_mn[0][1]
    for r0, n in chunks:
        rC = None
        if cutlass.const_expr(pre > 0 and r0 == 0):
            rC = rB
        elif cutlass.const_expr(tBgB_mn is not None):
            rC = fetch_bias(tBgB_mn, tScS_mn, t0ScS_mn, row_base, col_base, row_limit, col_limit, check_cols, r0, n)
        for r in cutlass.range_constexpr(r0, r0 + n):
            i = row_base + tScS_mn[r, 0][0]
            alibi_row = Float32(0.0)
            if cutlass.const_expr(slope is not None):
                alibi_row = Float32(thr_col - i) * slope
            for c in cutlass.range_constexpr(cols):
                v = acc_mn[r, c] * scale
                if cutlass.const_expr(rC is not None):
                    v = v + rC[r - r0, c]
                if cutlass.const_expr(slope is not None):
                    v = v + (alibi_row + slope * Float32(t0ScS_mn[0, c][1]))
                acc_mn[r, c] = v


@cute.jit
def write_score_tile(
    vals_mn: cute.Tensor,
    tX_mn: cute.Tensor,
    tScS_mn: cute.Tensor,
    t0ScS_mn: cute.Tensor,
    rows_left: Int32,
    col_room: Int32,
    add: cutlass.Constexpr[bool],
    pairs: cutlass.Constexpr[bool] = False,
    vector_red: cutlass.Constexpr[bool] = False,
):
    """One score-shaped (rows, cols) fragment (dS, or the wgmma backward's dS^T) into its tile `tX_mn` of dBias or
    of its fp32 accumulator, partitioned alike: the elements whose row is below `rows_left` (tScS_mn's rows) and
    whose column is below `col_room` (thread 0's columns, t0ScS_mn, against the thread's room) are stored (16 bits
    or fp32, as the tensor is) or, with `add`, red.global.add'ed in fp32. `pairs`: neighbouring columns share
    the first one's check (a pair never leaves a row of 16-byte multiples), added in one 8-byte reduction with
    `vector_red` (sm_90+). Predicated stores and reductions: no branch per element."""
    fp32 = cutlass.const_expr(tX_mn.element_type == Float32)
    step = 2 if cutlass.const_expr(pairs) else 1
    for r in cutlass.range_constexpr(cute.size(vals_mn, mode=[0])):
        row_ok = tScS_mn[r, 0][0] < rows_left
        for c in cutlass.range_constexpr(0, cute.size(vals_mn, mode=[1]), step):
            ok = row_ok & (t0ScS_mn[0, c][1] < col_room)
            if cutlass.const_expr(add and vector_red):
                gops.red_add_f32(gops.elem_ptr(tX_mn, (r, c)), [vals_mn[r, c], vals_mn[r, c + 1]], ok)
            else:
                for k in cutlass.range_constexpr(step):
                    ptr = gops.elem_ptr(tX_mn, (r, c + k))
                    if cutlass.const_expr(add):
                        gops.red_add_f32(ptr, [vals_mn[r, c + k]], ok)
                    elif cutlass.const_expr(fp32):
                        gops.st_f32_if(ptr, [vals_mn[r, c + k]], ok)
                    else:
                        gops.st_16bit_if(ptr, vals_mn[r, c + k], ok)


@cute.jit
def zero_dbias_outside_band(
    p: cutlass.Constexpr,
    mdBias: cute.Tensor,
    batch: Int32,
    head0: Int32,
    group: cutlass.Constexpr[int],
    m_min: Int32,
    n_m: Int32,
    bm: cutlass.Constexpr[int],
    n_block: Int32,
    bn: cutlass.Constexpr[int],
    static_q,
    static_k,
    threads: cutlass.Constexpr[int],
    tidx: Int32,
):
    """Zeros into the dBias elements of key tile n_block's columns that no step of its walk writes (a dBias
    written directly): the query rows above and below its band (query tiles m_min .. m_min + n_m - 1 of bm rows;
    padding rows included), for each of the `group` query heads from head0 on. `static_q` / `static_k`: the
    bound extents. Consecutive threads take consecutive columns."""
    col0 = n_block * bn
    n_cols = static_k - col0
    lo_rows = cutlass.min(m_min * bm, static_q)  # rows [0, lo_rows) and [hi_row, static_q) get zeros
    hi_row = cutlass.min((m_min + n_m) * bm, static_q)
    total = (lo_rows + static_q - hi_row) * bn
    for g in cutlass.range_constexpr(group):
        mdB = bias_rows(mdBias, batch, head0 + g, p.bias_per_batch, p.bias_per_head)
        zero_rows_of_cols(mdB, total, lo_rows, hi_row, col0, n_cols, bn, threads, tidx)


@cute.jit
def zero_rows_of_cols(
    mX: cute.Tensor,
    total: Int32,
    lo_rows: Int32,
    hi_row: Int32,
    col0: Int32,
    n_cols: Int32,
    width: cutlass.Constexpr[int],
    threads: cutlass.Constexpr[int],
    tidx: Int32,
):
    """Zero columns [col0, col0 + min(width, n_cols)) of rows [0, lo_rows) and [hi_row, ...) of a (rows, cols)
    tensor, `total` = rows * width elements in all, `threads` threads taking consecutive columns."""
    zero = mX.element_type(0.0)
    for it in cutlass.range((total - tidx + threads - 1) // threads, unroll=1):
        k = tidx + it * threads
        row = k // width
        col = k % width
        if row >= lo_rows:
            row = row - lo_rows + hi_row
        if col < n_cols:
            mX[row, col0 + col] = zero
