"""Row views that pack the query heads of one KV group into the row mode (GQA packing, mma.sync forward).

With r = Hq / Hkv, packed row m of KV group g stands for query position m // r of query head g * r + m % r: the
view's row mode is (r, S) with strides (head stride, position stride), so a flat row index m addresses
(m % r, m // r). One query tile then holds the r heads that read the same K and V tiles (a decode of S_q = 1..16
fills its rows instead of padding them), and K / V stream once per group. The heads of a position are
consecutive rows, so the mask reads query position m // r (`mask.apply_mask`'s `rows_per_query`).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32


def pack_rows(t: cute.Tensor, row_mode: int, head_mode: int, group, r: int) -> cute.Tensor:
    """The ((r, S), rest...) view of KV group `group` of `t` (its modes: positions `row_mode`, query heads
    `head_mode`, the others kept in order): a view, no data moves."""
    at = [0] * len(t.shape)
    at[head_mode] = group * r
    t = cute.domain_offset(tuple(at), t)
    rest = [i for i in range(len(t.shape)) if i not in (row_mode, head_mode)]
    shape = ((r, t.shape[row_mode]), *(t.shape[i] for i in rest))
    stride = ((t.stride[head_mode], t.stride[row_mode]), *(t.stride[i] for i in rest))
    return cute.make_tensor(t.iterator, cute.make_layout(shape, stride=stride))


@cute.jit
def packed_key_tiles(
    m_block,
    tile_m: cutlass.Constexpr[int],
    tile_n: cutlass.Constexpr[int],
    rows_per_query: cutlass.Constexpr[int],
    seqlen_q,
    seqlen_k,
    offset,
    window_right=None,
    window_left=None,
):
    """(n_min, n_max, lo, hi) of a packed query tile: the key tiles holding any allowed column, and [lo, hi)
    those every row of it may see entirely (`mask.n_block_range` / `n_block_unmasked_range` over the tile's query
    positions m // rows_per_query: a left bound starts the band at the first position's, and its wholly allowed
    tiles at the last position's)."""
    rows_total = seqlen_q * rows_per_query
    row_first = m_block * tile_m
    pos_first = row_first // rows_per_query
    pos_last = (cutlass.min(row_first + tile_m, rows_total) - 1) // rows_per_query
    col_end = seqlen_k
    hi = seqlen_k // tile_n
    if cutlass.const_expr(window_right is not None):
        col_end = cutlass.min(col_end, pos_last + offset + window_right + 1)
        hi = cutlass.min(hi, cutlass.max(pos_first + offset + window_right + 1, 0) // tile_n)
    n_max = (cutlass.max(col_end, 0) + tile_n - 1) // tile_n
    if cutlass.const_expr(window_left is None):
        if row_first >= rows_total:
            n_max = Int32(0)
        return Int32(0), n_max, Int32(0), hi
    else:
        n_min = cutlass.max(pos_first + offset - window_left, 0) // tile_n
        lo = (cutlass.max(pos_last + offset - window_left, 0) + tile_n - 1) // tile_n
        if row_first >= rows_total:
            n_max = n_min
        return n_min, n_max, lo, hi
