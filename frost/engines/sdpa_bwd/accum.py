"""Views of the fp32 dQ accumulator and the jit entry and fakes of every kernel of a backward chain.

The accumulator's layout is stated by its params (`chain.BwdChainParams`): dense rows, 8x8 blocks
(`dq_accum_blocked`) or tiles in wgmma fragment order (`dq_accum_tile`, `fragment_offset`), one copy or
`dq_splits` copies stacked copy-major along its batch mode; THD keeps one (heads, packed tokens,
head_dim) accumulator, or, in fragment-order tiles, one whose sequences each start a tile of their own
(`packed_acc_tile`, `scratch.packed_acc_rows`).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from frost.engines.common.sdpa_entry import FakeArgs, make_entry


def blocked_layout(rows, d: int, cols: int = 0):
    """(rows, d) -> offset of an fp32 accumulator stored in 8x8 blocks (row groups of 8, then columns).

    An MMA accumulator fragment puts each lane quad on 8 columns of one of 8 rows, so a warp's reduction of
    one fragment register pair lands in one 256-byte block: two whole cache lines. `cols` > d widens the
    view for a tile padded past the head dim (its extra column blocks are never added into).
    """
    return cute.make_layout(((8, rows // 8), (8, (cols or d) // 8)), stride=((8, 8 * d), (1, 64)))


@cute.jit
def blocked_rows(acc: cute.Tensor, d: cutlass.Constexpr[int], cols: cutlass.Constexpr[int] = 0) -> cute.Tensor:
    """The blocked (`blocked_layout`) view of a compact (rows, d) accumulator, `cols` wide if given."""
    return cute.make_tensor(acc.iterator, blocked_layout(acc.shape[0], d, cols))


#: threads of one wgmma warpgroup, and of the two that write a fragment-order tile
WG_THREADS = 128
FRAGMENT_THREADS = 256


def fragment_offset(tile_m: int, head_dim: int, t, i: int):
    """Where thread t (of the 256 MMA threads) puts fp32 register i of its dQ fragment in a tile of
    `tile_m` rows stored in fragment order: warpgroup t // 128 owns one half of the tile's words, and its
    threads store four registers at a time side by side (16-byte stores, every bank once per quarter warp)."""
    half = tile_m * head_dim // 2
    return (t // WG_THREADS) * half + ((i // 4) * WG_THREADS + t % WG_THREADS) * 4 + i % 4


def fragment_coord(tile_m: int, head_dim: int, t, i: int):
    """(query row in the tile, head-dim column) of fp32 register i of MMA thread t's dQ fragment.

    The dQ GEMM of the SM90 backward (`frost.engines.sm90.sdpa_bwd`): two warpgroups of 64-row wgmma
    atoms. A 64 x N accumulator puts register i of thread (warp w, lane l) at row 16 w + 8 ((i // 2) % 2) +
    l // 4, column 8 (i // 4) + 2 (l % 4) + i % 2. tile_m not a multiple of 64 computes dQ^T (head dim on
    the rows, the two warpgroups over its halves); tile_m = 128 splits the query rows over the warpgroups;
    else the warpgroups split the head-dim columns.
    """
    g, w, lane = t // WG_THREADS, (t % WG_THREADS) // 32, t % 32
    row = 16 * w + 8 * ((i // 2) % 2) + lane // 4
    col = 8 * (i // 4) + 2 * (lane % 4) + i % 2
    if tile_m % 64:
        return col, 64 * g + row
    if tile_m == 128:
        return 64 * g + row, col
    return row, (head_dim // 2) * g + col


def copy_batch(copy, n_batch, batch):
    """Batch index of a dense accumulator's copy `copy`: `dq_splits` copies stack copy-major along the batch
    mode (`scratch.scratch_layout`); copy 0 is the accumulator every mode has."""
    return copy * n_batch + batch


def dense_acc_rows(p, mAcc: cute.Tensor, acc_batch, head, blocked: bool = True, cols: int = 0) -> cute.Tensor:
    """The (rows, head_dim) dQ accumulator of one head of a dense batch index (`copy_batch`): 8x8-blocked
    where the params block it, or, with `blocked=False`, the same memory row-major (zeroing). `cols` widens
    a blocked view for a padded tile (`blocked_layout`)."""
    acc = mAcc[acc_batch, head, None, None]
    return blocked_rows(acc, p.head_dim, cols) if blocked and p.dq_accum_blocked else acc


def packed_acc_tile(first_token, sequence, tile: int):
    """The first fragment-order tile of packed sequence `sequence` (first token `first_token`) in its head's
    accumulator (`scratch.packed_acc_rows`): the tile of its first token, shifted by one per sequence before it,
    so its tiles never overlap its predecessor's last one."""
    return first_token // tile + sequence


def acc_copies(p, mAcc: cute.Tensor, n_batch, batch, head, blocked: bool = True) -> list:
    """The (rows, head_dim) dQ accumulator views of one (batch, head), one per copy in copy order: THD's
    packed rows, or each dense copy (`dense_acc_rows`); the helper kernels zero and sum them."""
    if p.is_thd:
        return [mAcc[head, None, None]]
    return [dense_acc_rows(p, mAcc, copy_batch(c, n_batch, batch), head, blocked) for c in range(max(p.dq_splits, 1))]


def scratch_fake(fakes: FakeArgs, name: str):
    """Fakes of the chain's workspace buffers (scratch.scratch_layout), compact and symbolic."""
    p = fakes.p
    hq, d = p.num_heads_q, p.head_dim
    if name == "dpsum":
        return fakes.compact(Float32, (hq, fakes.rows_q) if p.is_thd else (fakes.batch, hq, fakes.rows_q))
    if name == "dq_accum":
        if p.is_thd and p.dq_accum_tile:  # whole tiles per sequence (scratch.packed_acc_rows)
            return fakes.compact(Float32, (hq, cute.sym_int(divisibility=8, symbol="acc_rows_q"), d))
        if p.is_thd:
            return fakes.compact(Float32, (hq, fakes.rows_q, d))
        padded = p.dq_accum_blocked or p.dq_accum_tile > 0
        rows = cute.sym_int(divisibility=8, symbol="acc_rows_q") if padded else fakes.rows_q
        # dq_splits stacks its copies along the batch mode (copy_batch), so that extent is its own symbol
        batch = cute.sym_int(symbol="acc_batch") if p.dq_splits > 0 else fakes.batch
        return fakes.compact(Float32, (batch, hq, rows, d))
    if name == "dq_semaphore":
        return fakes.compact(Int32, (cute.sym_int(symbol="n_semaphores"),))
    if name == "dsink_partial":
        return fakes.compact(Float32, (cute.sym_int(symbol="n_dsink_partials"),))
    if name == "dbias_accum":  # scratch.dbias_accum_shape: dBias's dims, rows padded to 16 bytes
        b = fakes.batch if p.dbias_accum_per_batch else 1
        h = hq if p.dbias_accum_per_head else 1
        rows, _ = fakes.bias_rows()
        return fakes.compact(Float32, (b, h, rows, cute.sym_int(divisibility=4, symbol="dbias_accum_cols")))
    raise KeyError(f"no fake argument for {name!r}")


def build_entry(p, names: list[str], run):
    """(jit entry, fakes) of one kernel of the chain; `run(args)` receives the arguments by contract name."""
    return make_entry(run, names, p.is_thd, p if p.ragged else None), tuple(FakeArgs(p, extra=scratch_fake).all(names))
