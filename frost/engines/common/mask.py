"""The SDPA mask of the frost contract (see `frost.engines.sdpa_args`), tile by tile.

For query row i and key column j, local to their sequences:
    off = seqlen_kv - seqlen_q if bottom_right else 0
    allowed(i, j) = j < seqlen_kv
                    and (window_left is None  or j >= i + off - window_left)
                    and (window_right is None or j <= i + off + window_right)
Causal is window_right = 0. `window_left` / `window_right` are runtime Int32
values or None (compiled out).

cuDNN's block_mask (`block_mask_visible`, `apply_block_mask`) adds one bit per
(128-row query tile, 128-key tile), sequence-local; a cleared bit masks the pair.
A kernel skips the key tiles of its work tile whose blocks are all cleared
(`block_mask_tile_visible`, `block_mask_last_visible`: the one predicate every role
of a kernel evaluates, so they visit the same tiles) and masks the visited ones
element by element where they straddle a cleared block.

Three pieces per kernel: which key tiles an m-tile must visit at all
(`n_block_range`), which of those need no per-element mask
(`n_block_unmasked_range`, `tile_needs_mask`), and the per-element mask of a
(rows, cols) score view (`apply_mask`). All divisions are on clamped
non-negative values, so negative diagonals are safe.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Float32, Int32

from frost.engines.sdpa_args import BLOCK_MASK_BITS, BLOCK_MASK_TILE


@cute.jit
def diag_offset(seqlen_q: Int32, seqlen_k: Int32, bottom_right: cutlass.Constexpr[bool]) -> Int32:
    """Column of the diagonal in query row 0."""
    if cutlass.const_expr(bottom_right):
        return seqlen_k - seqlen_q
    else:
        return Int32(0)


@cute.jit
def n_block_range(
    m_block: Int32,
    tile_m: cutlass.Constexpr[int],
    tile_n: cutlass.Constexpr[int],
    seqlen_q: Int32,
    seqlen_k: Int32,
    offset: Int32,
    window_left=None,
    window_right=None,
):
    """[n_min, n_max): the key tiles holding any allowed column for rows of m_block.

    Rows past seqlen_q are ignored (never written); an m_block of such rows only is empty (n_max = n_min).
    """
    row_first = m_block * tile_m
    row_last = cutlass.min(row_first + tile_m, seqlen_q) - 1
    col_end = seqlen_k
    if cutlass.const_expr(window_right is not None):
        col_end = cutlass.min(col_end, row_last + offset + window_right + 1)
    n_max = (cutlass.max(col_end, 0) + tile_n - 1) // tile_n
    n_min = Int32(0)
    if cutlass.const_expr(window_left is not None):
        n_min = cutlass.max(row_first + offset - window_left, 0) // tile_n
    if row_first >= seqlen_q:
        n_max = n_min
    return n_min, n_max


@cute.jit
def n_block_unmasked_range(
    m_block: Int32,
    tile_m: cutlass.Constexpr[int],
    tile_n: cutlass.Constexpr[int],
    seqlen_q: Int32,
    seqlen_k: Int32,
    offset: Int32,
    window_left=None,
    window_right=None,
):
    """[lo, hi): key tiles where every (row < seqlen_q, col) pair of m_block is allowed.

    May be empty (hi <= lo); callers clamp it into [n_min, n_max).
    """
    row_first = m_block * tile_m
    row_last = cutlass.min(row_first + tile_m, seqlen_q) - 1
    hi = seqlen_k // tile_n
    if cutlass.const_expr(window_right is not None):
        hi = cutlass.min(hi, cutlass.max(row_first + offset + window_right + 1, 0) // tile_n)
    lo = Int32(0)
    if cutlass.const_expr(window_left is not None):
        lo = (cutlass.max(row_last + offset - window_left, 0) + tile_n - 1) // tile_n
    return lo, hi


@cute.jit
def tile_needs_mask(
    m_block: Int32,
    n_block: Int32,
    tile_m: cutlass.Constexpr[int],
    tile_n: cutlass.Constexpr[int],
    seqlen_q: Int32,
    seqlen_k: Int32,
    offset: Int32,
    window_left=None,
    window_right=None,
):
    """True when tile (m_block, n_block) holds a disallowed (row < seqlen_q, col) pair."""
    lo, hi = n_block_unmasked_range(m_block, tile_m, tile_n, seqlen_q, seqlen_k, offset, window_left, window_right)
    return n_block < lo or n_block >= hi


@cute.jit
def m_block_range(
    n_block: Int32,
    tile_m: cutlass.Constexpr[int],
    tile_n: cutlass.Constexpr[int],
    seqlen_q: Int32,
    seqlen_k: Int32,
    offset: Int32,
    window_left=None,
    window_right=None,
):
    """[m_min, m_max): the query tiles with any allowed row for key tile n_block (for backward)."""
    col_first = n_block * tile_n
    col_last = cutlass.min(col_first + tile_n, seqlen_k) - 1
    m_max = (seqlen_q + tile_m - 1) // tile_m
    if cutlass.const_expr(window_left is not None):
        row_end = col_last - offset + window_left + 1
        m_max = cutlass.min(m_max, (cutlass.max(row_end, 0) + tile_m - 1) // tile_m)
    m_min = Int32(0)
    if cutlass.const_expr(window_right is not None):
        m_min = cutlass.max(col_first - offset - window_right, 0) // tile_m
    if col_first >= seqlen_k:
        m_max = m_min
    return m_min, m_max


@cute.jit
def apply_mask(
    acc_mn: cute.Tensor,
    tScS_mn: cute.Tensor,
    t0ScS_mn: cute.Tensor,
    row_base: Int32,
    col_base: Int32,
    seqlen_k: Int32,
    offset: Int32,
    window_left=None,
    window_right=None,
    mask_seqlen: cutlass.Constexpr[bool] = True,
    rows_per_query: cutlass.Constexpr[int] = 1,
):
    """Set disallowed scores of a (rows, cols) view to -inf.

    tScS_mn: this thread's (row, col) tile coordinates of each element;
    t0ScS_mn: the same for thread 0 (compile-time constants). The thread's
    coordinates are thread 0's plus a uniform offset, so every comparison is
    a constant against a per-row limit. row_base / col_base: sequence-local
    index of the tile's first row / column. Tile row m is query position
    m // rows_per_query (GQA packing puts the heads of one position in
    consecutive rows). `mask_seqlen`: also mask columns >= seqlen_k.
    """
    if cutlass.const_expr(mask_seqlen or window_left is not None or window_right is not None):
        thr_col = col_base + tScS_mn[0][1]
        for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
            i = row_base + tScS_mn[r, 0][0]
            if cutlass.const_expr(rows_per_query > 1):
                i = i // rows_per_query
            right = Int32(0x7FFFFFF)
            if cutlass.const_expr(mask_seqlen):
                right = seqlen_k
            if cutlass.const_expr(window_right is not None):
                right = cutlass.min(right, i + offset + window_right + 1)
            right = right - thr_col
            left = Int32(0)
            if cutlass.const_expr(window_left is not None):
                left = i + offset - window_left - thr_col
            for c in cutlass.range_constexpr(cute.size(acc_mn, mode=[1])):
                cc = t0ScS_mn[0, c][1]
                if cutlass.const_expr(window_left is not None):
                    acc_mn[r, c] = -Float32.inf if (cc >= right or cc < left) else acc_mn[r, c]
                else:
                    acc_mn[r, c] = -Float32.inf if cc >= right else acc_mn[r, c]


@cute.jit
def apply_mask_keys_by_rows(
    acc_mn: cute.Tensor,
    tScS_mn: cute.Tensor,
    t0ScS_mn: cute.Tensor,
    q_base: Int32,
    k_base: Int32,
    seqlen_k: Int32,
    offset: Int32,
    window_left=None,
    window_right=None,
):
    """`apply_mask` for a transposed score tile: rows are keys, columns are queries (the backward's S^T = K.Q^T).

    Coordinates are (key, query) pairs; the same allowed(i, j) as `apply_mask`, keys >= seqlen_k always
    masked. As there, the thread's columns are thread 0's plus a uniform offset.
    """
    thr_q = q_base + tScS_mn[0][1]
    for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
        j = k_base + tScS_mn[r, 0][0]
        # allowed queries i (column offsets from thr_q): lo <= i - thr_q <= hi
        lo = Int32(-0x7FFFFFF)
        hi = Int32(0x7FFFFFF)
        if cutlass.const_expr(window_right is not None):
            lo = j - offset - window_right - thr_q
        if cutlass.const_expr(window_left is not None):
            hi = j - offset + window_left - thr_q
        if j >= seqlen_k:
            lo = Int32(0x7FFFFFF)
        for c in cutlass.range_constexpr(cute.size(acc_mn, mode=[1])):
            cc = t0ScS_mn[0, c][1]
            if cutlass.const_expr(window_left is not None):
                acc_mn[r, c] = -Float32.inf if (cc < lo or cc > hi) else acc_mn[r, c]
            else:
                acc_mn[r, c] = -Float32.inf if cc < lo else acc_mn[r, c]


@cute.jit
def block_mask_visible(mBM: cute.Tensor, q_tile: Int32, k_tile: Int32):
    """cuDNN's block_mask bit of (query tile, key tile), each of 128 sequence-local positions: whether those
    queries may see those keys. `mBM`: one (batch entry, head)'s (q tiles, key-tile bytes) uint8 view."""
    byte = Int32(mBM[q_tile, k_tile // BLOCK_MASK_BITS])
    return ((byte >> (k_tile % BLOCK_MASK_BITS)) & 1) != 0


@cute.jit
def apply_block_mask(
    acc_mn: cute.Tensor,
    tScS_mn: cute.Tensor,
    t0ScS_mn: cute.Tensor,
    mBM: cute.Tensor,
    row_base: Int32,
    col_base: Int32,
    rows_per_query: cutlass.Constexpr[int] = 1,
    one_query_block: cutlass.Constexpr[bool] = False,
    one_key_block: cutlass.Constexpr[bool] = False,
):
    """Set the scores of a (rows, cols) view whose block_mask bit is clear to -inf, element by element (for
    tiles that straddle 128-position blocks; a tile inside one block takes its one bit, `block_mask_visible`).

    Coordinates as in `apply_mask` (sequence-local row_base / col_base, thread 0's constant columns plus a
    uniform offset). Each row reads the two bytes holding the bits from the view's first key tile on (nine
    tiles or more after the shift: any view up to 1024 keys wide), once, and every score tests its bit of that
    word. Rows past the block mask's extent read its last row, bytes past it its last byte (those positions are
    never written, or are masked by the key length). `one_query_block`: the view's rows all lie in row_base's
    128-query block (a tile of 128 rows or a divisor of it, unpacked), whose word every row shares;
    `one_key_block` too: its columns all lie in col_base's 128-key block, whose one bit every score takes.
    """
    q_last = mBM.shape[0] - 1
    byte_last = mBM.shape[1] - 1
    thr_col = col_base + tScS_mn[0][1]
    kt0 = col_base // BLOCK_MASK_TILE  # the view's first key tile
    lo = cutlass.min(kt0 // BLOCK_MASK_BITS, byte_last)
    hi = cutlass.min(lo + 1, byte_last)
    shift = kt0 % BLOCK_MASK_BITS

    def word_of(q_tile):
        """Query block q_tile's bits from the view's first key tile on."""
        return (Int32(mBM[q_tile, lo]) | (Int32(mBM[q_tile, hi]) << BLOCK_MASK_BITS)) >> shift

    if cutlass.const_expr(one_query_block and one_key_block):  # one 128x128 block: one bit for the view
        q_tile = cutlass.min(row_base // BLOCK_MASK_TILE, q_last)
        keep = ((Int32(mBM[q_tile, lo]) >> shift) & 1) != 0
        for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
            for c in cutlass.range_constexpr(cute.size(acc_mn, mode=[1])):
                acc_mn[r, c] = acc_mn[r, c] if keep else -Float32.inf
    else:
        shared = None
        if cutlass.const_expr(one_query_block):
            shared = word_of(cutlass.min(row_base // BLOCK_MASK_TILE, q_last))
        for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
            word = shared
            if cutlass.const_expr(not one_query_block):
                i = row_base + tScS_mn[r, 0][0]
                if cutlass.const_expr(rows_per_query > 1):
                    i = i // rows_per_query
                word = word_of(cutlass.min(i // BLOCK_MASK_TILE, q_last))
            for c in cutlass.range_constexpr(cute.size(acc_mn, mode=[1])):
                j = (thr_col + t0ScS_mn[0, c][1]) // BLOCK_MASK_TILE - kt0
                acc_mn[r, c] = acc_mn[r, c] if ((word >> j) & 1) != 0 else -Float32.inf


def _log2(x: int) -> int:
    """log2 of a power of two (shifts stand for the divisions by BLOCK_MASK_TILE / BLOCK_MASK_BITS)."""
    assert x > 0 and x & (x - 1) == 0, x
    return x.bit_length() - 1


#: the byte offsets of `block_mask_rows`, which a walk keeps in one 32-bit register each
_ROW_OFFSET_LIMIT = 0x7FFFFFFF


@cute.jit
def block_mask_rows(
    mBM: cute.Tensor, batch: Int32, head: Int32, row_first: Int32, tile_m: cutlass.Constexpr[int], seqlen_q: Int32
):
    """Where a work tile's block_mask bits start: the (batch entry, head, query block) byte rows of the rows
    `row_first` .. row_first + tile_m - 1 (sequence-local query positions, those below seqlen_q), as the byte
    offsets of their first key-tile byte in the declared uint8 (B, Hq, q tiles, key-tile bytes) `mBM`.

    Made once per work tile for `block_mask_tile_visible` / `block_mask_last_visible`: (mBM, first row's offset,
    last row's offset), the last the first where tile_m divides 128 (row_first a multiple of tile_m). The offsets
    are 32-bit (a walk over key tiles keeps one register live per row, not a 64-bit pointer: the wgmma producer
    warp runs on 24 registers); a row past 2^31 - 1 bytes (declared strides that far apart) gets -1 for both,
    which `block_mask_tile_visible` reads as "visible": such a tile skips nothing, its scores are still masked
    bit by bit. A query block past the mask's extent reads its last row (as `apply_block_mask` does).
    """
    q_last = mBM.shape[2] - 1
    q_lo = cutlass.min(row_first >> _log2(BLOCK_MASK_TILE), q_last)
    off_lo = cute.crd2idx((batch, head, q_lo, 0), mBM.layout)
    fits = off_lo >= 0 and off_lo <= _ROW_OFFSET_LIMIT
    off_hi = off_lo
    if cutlass.const_expr(BLOCK_MASK_TILE % tile_m != 0):  # the rows may span two query blocks
        row_last = cutlass.min(row_first + tile_m, seqlen_q) - 1
        off_hi = cute.crd2idx((batch, head, cutlass.min(row_last >> _log2(BLOCK_MASK_TILE), q_last), 0), mBM.layout)
        fits = fits and off_hi >= 0 and off_hi <= _ROW_OFFSET_LIMIT
    lo = Int32(-1)
    hi = Int32(-1)
    if fits:
        lo = Int32(off_lo)
        hi = Int32(off_hi)
    return mBM, lo, hi


@cute.jit
def block_mask_tile_visible(
    rows, n_block: Int32, tile_m: cutlass.Constexpr[int], tile_n: cutlass.Constexpr[int], seqlen_k: Int32
):
    """Whether key tile n_block (tile_n keys, n_block >= 0) has a key that a row of the work tile may see by
    cuDNN's block_mask: any set bit among the (query block, key block) pairs it covers, keys below seqlen_k only.
    `rows`: the work tile's `block_mask_rows` (of `tile_m` rows).

    One uniform value per (work tile, key tile), read from global memory: a byte per query block where the key
    tile lies inside one 128-key block (tile_n dividing 128), else the two bytes from its first block's on (it
    spans at most three blocks: tile_n <= 256). No band is taken into account (the tile must lie in
    `n_block_range`). A byte past the mask's extent reads its last one (as `apply_block_mask` does). A visited
    tile still needs `apply_block_mask` where it straddles a cleared block. Rows of a GQA-packed tile are not
    query positions: the caller's tiles are unpacked.
    """
    mBM, off_lo, off_hi = rows
    two_rows = cutlass.const_expr(BLOCK_MASK_TILE % tile_m != 0)
    byte_last = mBM.shape[3] - 1

    def read(off_row, byte):
        """Key-tile byte `byte` of the row at `off_row` (where the offsets are -1, of the mask's first row: a
        byte that exists, read for nothing)."""
        row = cute.make_tensor(mBM.iterator + cutlass.max(off_row, 0), cute.select(mBM.layout, mode=[3]))
        return Int32(row[byte])

    # the tile's first key block (non-negative operands: the shifts are floor divisions)
    kt0 = n_block
    if cutlass.const_expr(tile_n % BLOCK_MASK_TILE == 0):
        kt0 = n_block * (tile_n // BLOCK_MASK_TILE)
    elif cutlass.const_expr(BLOCK_MASK_TILE % tile_n == 0):
        kt0 = n_block >> _log2(BLOCK_MASK_TILE // tile_n)
    else:
        kt0 = (n_block * tile_n) >> _log2(BLOCK_MASK_TILE)
    lo = cutlass.min(kt0 >> _log2(BLOCK_MASK_BITS), byte_last)
    shift = kt0 & (BLOCK_MASK_BITS - 1)
    visible = Boolean(False)
    if cutlass.const_expr(BLOCK_MASK_TILE % tile_n == 0):  # the tile lies inside one key block: its bit
        word = read(off_lo, lo)
        if cutlass.const_expr(two_rows):
            word = word | read(off_hi, lo)
        visible = ((word >> shift) & 1) != 0
    else:  # key blocks kt0 .. kt1 (of the keys below seqlen_k)
        kt1 = (cutlass.min((n_block + 1) * tile_n, seqlen_k) - 1) >> _log2(BLOCK_MASK_TILE)
        hi = cutlass.min(lo + 1, byte_last)
        word = read(off_lo, lo) | (read(off_lo, hi) << BLOCK_MASK_BITS)
        if cutlass.const_expr(two_rows):
            word = word | read(off_hi, lo) | (read(off_hi, hi) << BLOCK_MASK_BITS)
        visible = ((word >> shift) & ((Int32(2) << (kt1 - kt0)) - 1)) != 0
    return visible or block_mask_unread(rows)  # rows past 32-bit offsets skip nothing


def block_mask_unread(rows):
    """Whether `block_mask_tile_visible` keeps every tile of the work tile without reading its bits (its
    `block_mask_rows` offsets past 32 bits): its visited tiles then need their bits applied even where they lie
    inside one 128x128 block."""
    return rows[1] < 0


@cute.jit
def block_mask_last_visible(
    rows, n_min: Int32, n_max: Int32, tile_m: cutlass.Constexpr[int], tile_n: cutlass.Constexpr[int], seqlen_k: Int32
) -> Int32:
    """The last key tile of [n_min, n_max) that `block_mask_tile_visible` keeps, or n_min - 1 when there is none
    (a work tile whose rows see no key: the kernel writes its empty rows). Tiles are read from the top down and
    the search stops at the first visible one; nothing below n_min is read."""
    n = n_max - 1
    searching = n >= n_min
    while searching:
        if block_mask_tile_visible(rows, n, tile_m, tile_n, seqlen_k):
            searching = Boolean(False)
        else:
            n = n - 1
            searching = n >= n_min
    return n
