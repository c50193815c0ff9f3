"""cuDNN's paged K/V cache in the kernels: the global view of one key tile, read through its block table.

A container is (num_blocks, block_size, H, D) in canonical view; key j of sequence b is row j % block_size of
block table[b, j // block_size]. A key tile of `tile_n` rows lies inside one block when `tile_n` divides the
block size, so its view is a plain (tile_n, D) tile of that block: the tile loads stay as they are. Both forwards
also serve blocks smaller than their key tile, a tile spanning whole blocks: the wgmma forward issues one TMA load
per block (`span_block_of`), the mma.sync forward reads each of a thread's rows of the tile from its own block
(`span_rows`, `span_entries`). The block index is a device value and is clamped to the container
(docs/lengths.md), so no load leaves it whatever the table holds.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from frost.engines.common import rows, seqlen


@cute.jit
def table_row(mTable: cute.Tensor, batch: Int32) -> cute.Tensor:
    """Sequence `batch`'s block indices: its row of a declared (B, 1, max_blocks, 1) table, as (max_blocks,)."""
    return mTable[batch, 0, None, 0]


@cute.jit
def block_of(table: cute.Tensor, index, num_blocks) -> Int32:
    """Entry `index` of a table row (`table_row`), clamped to the container's `num_blocks` blocks."""
    return seqlen.clamp(table[index], Int32(0), num_blocks - 1)


@cute.jit
def span_block_of(table: cute.Tensor, index, num_blocks) -> Int32:
    """`block_of` for one of the blocks a key tile spans: the tile's last blocks may lie past the table row (the
    tile runs past the key length, rows masked and zeroed), so the entry read is clamped to the row as well."""
    return block_of(table, seqlen.clamp(index, Int32(0), cute.size(table) - 1), num_blocks)


@cute.jit
def key_tile(
    mX: cute.Tensor,
    table: cute.Tensor,
    head: Int32,
    n_block: Int32,
    tile_n: cutlass.Constexpr[int],
    block_size: cutlass.Constexpr[int],
    cols: cutlass.Constexpr[int],
) -> cute.Tensor:
    """The (tile_n, cols) global view of key tile `n_block` of one head of container `mX` (num_blocks,
    block_size, H, D), through `table` (`table_row`); `cols` >= D widens it as `rows.widen` does."""
    first = n_block * tile_n
    block = block_of(table, first // block_size, cute.size(mX, mode=[0]))
    page = rows.widen(mX[block, None, head, None], cols)
    return cute.local_tile(page, (tile_n, cols), ((first % block_size) // tile_n, 0))


@cute.jit
def span_rows(
    mX: cute.Tensor,
    head: Int32,
    tile_n: cutlass.Constexpr[int],
    block_size: cutlass.Constexpr[int],
    cols: cutlass.Constexpr[int],
) -> cute.Tensor:
    """A (tile_n, cols, num_blocks) view of one head of container `mX` (num_blocks, block_size, H, D) for key tiles
    that span blocks of `block_size` rows: row r of a tile lies at row r % block_size of the block the third mode
    names (its entry of the table: `span_entries`). Partitioned once like a key tile, a row slice indexed by
    its block gives that row's columns; `cols` >= D widens as `rows.widen` does."""
    heads = mX[None, None, head, None]  # (num_blocks, block_size, D)
    layout = cute.make_layout(
        ((block_size, tile_n // block_size), cols, heads.shape[0]),
        stride=((heads.stride[1], 0), heads.stride[2], heads.stride[0]),
    )
    return cute.make_tensor(heads.iterator, layout)


@cute.jit
def span_entries(crd: cute.Tensor, n_block, tile_n: cutlass.Constexpr[int], block_size: cutlass.Constexpr[int]):
    """(entries, owners): for each row mode m of a thread's partition of a key tile spanning blocks (`crd`: the
    partition of the tile's identity, (CPY, modes, chunks)), the table entry of its row's block, and the first mode
    whose entry it shares. Mode m holds rows [m * p, (m + 1) * p), one per thread (p = tile_n / modes, the copy's
    rows per pass); where p divides the block, a mode's rows lie in one block whatever the thread, so its entry is a
    constant per tile, read once for the modes that share it; else each mode's is its thread's row's."""
    modes = cute.size(crd, mode=[1])
    per_pass = tile_n // modes
    first = n_block * (tile_n // block_size)
    entries, owners, seen = [], [], {}
    for m in cutlass.range_constexpr(modes):
        if cutlass.const_expr(block_size % per_pass == 0):
            at = m * per_pass // block_size
            entries.append(first + at)
            owners.append(seen.setdefault(at, m))
        else:
            entries.append(first + crd[0, m, 0][0] // block_size)
            owners.append(m)
    return entries, owners
