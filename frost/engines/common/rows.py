"""Row-wise tile movement shared by the kernels: per-head (rows, dim) views of canonical tensors, and
row-predicated gmem <-> smem copies (rows past a sequence's end are skipped, or zeroed in smem).

Column limits (`cols`, a plan-time head dim, or an Int32 for a column slice of O) serve tiles wider than
the head dim (the mma.sync kernels pad a head dim such as 72 up to a 96-wide tile): the chunks of the
columns past it are zero-filled in smem instead of loaded, and never stored. `cols=0` means the tile is
the head dim, and no column is checked.
"""

import math

import cutlass
import cutlass.cute as cute
from cutlass import Int32


@cute.jit
def head_rows(mX: cute.Tensor, head: Int32, batch: Int32, offset: Int32, is_thd: cutlass.Constexpr[bool]):
    """(rows, dim) view of one head of a canonical (B, S, H, D) / (T, H, D) tensor (THD: from `offset`)."""
    if cutlass.const_expr(is_thd):
        return cute.domain_offset((offset, 0), mX[None, head, None])
    else:
        return mX[batch, None, head, None]


def row_copy(dtype, width: int, threads: int):
    """16-byte row copies of (rows, width) smem tiles of a 16-bit `dtype` by at most `threads` threads:
    (tiled copy, threads used). Rows per pass are a power of two, so they divide every tile height the
    kernels use (64, 80, 128)."""
    tpr = width // 8  # threads per row
    per_pass = 1 << int(math.log2(threads // tpr))
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=128)
    return cute.make_tiled_copy_tv(
        atom, cute.make_ordered_layout((per_pass, tpr), order=(1, 0)), cute.make_layout((1, 8))
    ), per_pass * tpr


@cute.jit
def zero_rows(tiled_copy: cute.TiledCopy, threads: cutlass.Constexpr[int], sX: cute.Tensor, limit: Int32, tidx: Int32):
    """Zero the rows >= limit of a (rows, cols) smem tile, 16 bytes per store, by threads [0, threads) of a
    `row_copy`. TMA zero-fills only outside the tensor: rows past a packed sequence (the next one's, or
    whatever follows the last) or past a padding length arrive as they are, and a P or dS of 0 does not stop
    0 * NaN = NaN in a GEMM that reads them. The caller fences and syncs before an async-proxy (wgmma) read."""
    if tidx < threads:
        thr = tiled_copy.get_slice(tidx)
        tsX = thr.partition_D(sX)
        tcX = thr.partition_D(cute.make_identity_tensor((cute.size(sX, mode=[0]), cute.size(sX, mode=[1]))))
        for m in cutlass.range_constexpr(cute.size(tsX, mode=[1])):
            if tcX[0, m, 0][0] >= limit:
                tsX[None, m, None].fill(0)


@cute.jit
def widen(mX: cute.Tensor, cols: cutlass.Constexpr[int]):
    """A (rows, dim) view `cols` >= dim columns wide, for tiles padded past the head dim: the extra columns
    address the memory after each row, which the column-limited copies never touch. Unchanged when equal."""
    if cutlass.const_expr(cols == cute.size(mX, mode=[1])):
        return mX
    else:
        return cute.make_tensor(mX.iterator, cute.make_layout((mX.shape[0], cols), stride=mX.stride))


@cute.jit
def _copy_chunks(
    tiled_copy: cute.TiledCopy,
    src: cute.Tensor,
    dst: cute.Tensor,
    crd: cute.Tensor,
    cols,
    zero_fill: cutlass.Constexpr[bool],
):
    """One row's (CPY, chunks) of a partitioned tile: the chunks left of `cols` (a constant, or a tile's own
    Int32) copied, the others zeroed in smem when `zero_fill` (loads) or skipped (stores)."""
    for k in cutlass.range_constexpr(cute.size(dst.shape[1])):
        if crd[0, k][1] < cols:
            cute.copy(tiled_copy, src[None, k], dst[None, k])
        else:
            if cutlass.const_expr(zero_fill):
                dst[None, k].fill(0)


@cute.jit
def copy_cols(
    tiled_copy: cute.TiledCopy, tXg: cute.Tensor, tXs: cute.Tensor, tXc: cute.Tensor, cols: cutlass.Constexpr[int] = 0
):
    """Load a partitioned (CPY, rows, chunks) tile; with `cols`, the chunks past it are zeroed in smem."""
    if cutlass.const_expr(cols == 0):
        cute.copy(tiled_copy, tXg, tXs)
    else:
        for r in cutlass.range_constexpr(cute.size(tXs.shape[1])):
            _copy_chunks(tiled_copy, tXg[None, r, None], tXs[None, r, None], tXc[None, r, None], cols, True)


@cute.jit
def copy_row(
    tiled_copy: cute.TiledCopy,
    src: cute.Tensor,
    dst: cute.Tensor,
    crd: cute.Tensor,
    cols=0,
    zero_fill: cutlass.Constexpr[bool] = True,
):
    """Copy one row's (CPY, chunks); with `cols` (the constant 0: every column), only the chunks left of it
    (the others zeroed when `zero_fill`)."""
    if cutlass.const_expr(isinstance(cols, int) and cols == 0):
        cute.copy(tiled_copy, src, dst)
    else:
        _copy_chunks(tiled_copy, src, dst, crd, cols, zero_fill)


@cute.jit
def store_rows(
    tiled_copy: cute.TiledCopy,
    sX: cute.Tensor,
    gX: cute.Tensor,
    cX: cute.Tensor,
    limit: Int32,
    tidx: Int32,
    regs_like_dst: cutlass.Constexpr[bool] = False,
    cols=0,
):
    """smem tile -> registers -> global rows < limit, one copy-atom width per store (columns < `cols`, a
    constant or an Int32; 0: all).

    The register fragment takes the smem partition's layout, or the global one's with `regs_like_dst`
    (what the backward's dK / dV epilogue was tuned with).
    """
    thr = tiled_copy.get_slice(tidx)
    tXs = thr.partition_S(sX)
    tXg = thr.partition_D(gX)
    tXc = thr.partition_S(cX)
    tXr = cute.make_fragment_like(tXg if cutlass.const_expr(regs_like_dst) else tXs)
    cute.autovec_copy(tXs, tXr)
    for r in cutlass.range_constexpr(cute.size(tXr.shape[1])):
        if tXc[0, r, 0][0] < limit:
            copy_row(tiled_copy, tXr[None, r, None], tXg[None, r, None], tXc[None, r, None], cols, False)


@cute.jit
def load_rows(
    tiled_copy: cute.TiledCopy,
    tXg: cute.Tensor,
    tXs: cute.Tensor,
    tXc: cute.Tensor,
    limit: Int32,
    zero_fill: cutlass.Constexpr[bool] = True,
    tile_rows: cutlass.Constexpr[int] = 0,
    cols: cutlass.Constexpr[int] = 0,
):
    """Copy the partitioned rows < limit of a (CPY, rows, cols) tile; zero the others' smem when `zero_fill`.

    With `tile_rows` (the tile's height), a tile that lies wholly below `limit` is copied without per-row
    predicates: ptxas pads every predicated cp.async with three dead shared loads, which crowd the
    memory-instruction queue of a loop that issues them every step. With `cols`, only the chunks of the
    columns left of it are loaded, and the others zeroed (whatever `zero_fill` says of rows).
    """
    if cutlass.const_expr(tile_rows > 0):
        if limit >= tile_rows:
            copy_cols(tiled_copy, tXg, tXs, tXc, cols)
        else:
            _load_rows_checked(tiled_copy, tXg, tXs, tXc, limit, zero_fill, cols)
    else:
        _load_rows_checked(tiled_copy, tXg, tXs, tXc, limit, zero_fill, cols)


@cute.jit
def _load_rows_checked(
    tiled_copy: cute.TiledCopy,
    tXg: cute.Tensor,
    tXs: cute.Tensor,
    tXc: cute.Tensor,
    limit: Int32,
    zero_fill: cutlass.Constexpr[bool],
    cols: cutlass.Constexpr[int] = 0,
):
    for r in cutlass.range_constexpr(cute.size(tXs.shape[1])):
        if tXc[0, r, 0][0] < limit:
            copy_row(tiled_copy, tXg[None, r, None], tXs[None, r, None], tXc[None, r, None], cols)
        else:
            if cutlass.const_expr(zero_fill):
                tXs[None, r, None].fill(0)
