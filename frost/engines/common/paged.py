"""cuDNN's paged K/V cache in the kernels: the global view of one key tile, read through its block table.

A container is (num_blocks, block_size, H, D) in canonical view; key j of sequence b is row j % block_size of
block table[b, j // block_size]. A key tile of `tile_n` rows lies inside one block when `tile_n` divides the
block size, so its view is a plain (tile_n, D) tile of that block: the tile loads stay as they are. The wgmma
forward also serves blocks smaller than its key tile: a tile spans whole blocks, one TMA load per block
(`span_block_of`). The block
index is a device value and is clamped to the container (docs/lengths.md), so no load leaves it whatever the
table holds.
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
    block = seqlen.clamp(table[first // block_size], Int32(0), cute.size(mX, mode=[0]) - 1)
    page = rows.widen(mX[block, None, head, None], cols)
    return cute.local_tile(page, (tile_n, cols), ((first % block_size) // tile_n, 0))
