"""Persistent tile scheduler for attention kernels: work items are (m_block, head, batch).

Without a right-bounded band, tiles are numbered batch-major, then head, then
m-block, so CTAs running at the same time share one head's K/V in L2.

Dense batches decode a tile index with two divisions. Packed (THD) batches
decode it in-kernel from `cu_seqlens_q` with a warp-wide scan (the whole warp
must call `varlen_decode` together); a cursor carried between calls makes a
persistent CTA's scans amortize to one pass over the batch. Nothing is read on
the host: the grid is an upper bound from tensor extents and SM count.

Under a band, tiles instead run longest-first over the whole batch
(`dense_decode_lpt`; packed batches by m-block level, `varlen_decode_lpt`), and
a persistent CTA takes its tiles in a zigzag over waves (`zigzag_tile`): one
CTA's long tile of one wave pairs with a short one of the next, which keeps a
static assignment within a few percent of balanced.

A backward grid of (key tile, kv head, batch entry) whose CTAs each walk a group of
query heads launches its batch entries longest first (`ranked_batch`): a CTA walks
its sequence's query tiles, so a long sequence launched last leaves the other SMs
idle at the end.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Int32, const_expr

from frost.engines.common import seqlen


def grid_size(total_tiles_bound: Int32, sm_count: int, persistent: bool):
    """CTAs to launch: one per tile, or at most one per SM when persistent (never zero)."""
    if const_expr(persistent):
        return cutlass.max(cutlass.min(total_tiles_bound, Int32(sm_count)), Int32(1))
    return cutlass.max(total_tiles_bound, Int32(1))


def varlen_tiles_bound(total_q: Int32, num_batch: Int32, num_heads: int, tile_m: int) -> Int32:
    """Upper bound on THD tiles: sum_b ceil(len_b / tile_m) <= (T + B*(tile_m-1)) / tile_m."""
    return (total_q + num_batch * (tile_m - 1)) // tile_m * num_heads


@cute.jit
def dense_decode(tile_idx: Int32, num_m_blocks: Int32, num_heads: cutlass.Constexpr[int], total_tiles: Int32):
    """tile index -> (m_block, head, batch, is_valid) for a dense (B, S) batch."""
    m_idx = tile_idx % num_m_blocks
    hb = tile_idx // num_m_blocks
    head = hb % num_heads
    batch = hb // num_heads
    return m_idx, head, batch, tile_idx < total_tiles


@cute.jit
def dense_decode_lpt(
    tile_idx: Int32, num_m_blocks: Int32, num_heads: cutlass.Constexpr[int], num_batch: Int32, width: Int32
):
    """Longest-first within sections of `width` (batch, head) pairs: the last m-block of every pair
    of the first section, then the one before, and so on, then the next section (the last one may be
    narrower). CTAs at one m-level of one head stream the same K/V blocks at about the same time.
    A width of num_heads * num_batch (the SM90 forward's) orders the whole batch by m-level."""
    num_hb = num_heads * num_batch
    per_section = width * num_m_blocks
    section = tile_idx // per_section
    r = tile_idx - section * per_section
    first = section * width
    w = cutlass.max(cutlass.min(width, num_hb - first), Int32(1))
    m_rank = r // w
    hb = first + r - m_rank * w
    return num_m_blocks - 1 - m_rank, hb % num_heads, hb // num_heads, tile_idx < num_hb * num_m_blocks


@cute.jit
def zigzag_tile(wave: Int32, cta: Int32, num_ctas: Int32) -> Int32:
    """The tile a persistent CTA takes in `wave`: position cta, or mirrored on odd waves."""
    pos = cta
    if wave % 2 == 1:
        pos = num_ctas - 1 - cta
    return wave * num_ctas + pos


@cute.jit
def _m_blocks(
    cu_seqlens: cute.Tensor,
    b: Int32,
    num_batch: Int32,
    tile_m: cutlass.Constexpr[int],
    lengths: cutlass.Constexpr[bool] = False,
    total=None,
) -> Int32:
    """m-blocks of packed sequence b (0 past the batch); `lengths`: the tensor holds each sequence's length
    (seqused: cuDNN's ragged-offset form), not prefix sums. `total`: the token extent the lengths are clamped
    to as `seqlen.seqlen_info` clamps them (a ragged length to [0, total]: its offset is not read here; the
    tiles past the clamped length that `seqlen_info` gives do no work)."""
    n = Int32(0)
    if b < num_batch:
        if const_expr(total is None):
            if const_expr(lengths):
                n = (cu_seqlens[b] + (tile_m - 1)) // tile_m
            else:
                n = (cu_seqlens[b + 1] - cu_seqlens[b] + (tile_m - 1)) // tile_m
        elif const_expr(lengths):
            n = (seqlen.clamp(cu_seqlens[b], Int32(0), total) + (tile_m - 1)) // tile_m
        else:
            start = seqlen.token_offset(cu_seqlens, b, 0, total)
            n = (seqlen.packed_length(cu_seqlens, b, start, total) + (tile_m - 1)) // tile_m
    return n


@cute.jit
def varlen_decode(
    tile_idx: Int32,
    cu_seqlens: cute.Tensor,
    num_batch: Int32,
    num_heads: cutlass.Constexpr[int],
    tile_m: cutlass.Constexpr[int],
    cursor_batch: Int32,
    cursor_base: Int32,
    lengths: cutlass.Constexpr[bool] = False,
    total=None,
):
    """tile index -> (m_block, head, batch, is_valid, cursor_batch, cursor_base). Warp-collective.

    `cursor_batch` is the first batch of a 32-batch chunk and `cursor_base` the
    number of tiles before it; tile indices must not decrease between calls.
    """
    lane = cute.arch.lane_idx()
    m_block = Int32(0)
    head = Int32(0)
    batch = num_batch
    searching = Boolean(True)
    while searching:
        n_m = _m_blocks(cu_seqlens, cursor_batch + lane, num_batch, tile_m, lengths, total)
        n_tiles = n_m * num_heads
        incl = n_tiles
        for i in cutlass.range_constexpr(5):
            y = cute.arch.shuffle_sync_up(incl, offset=1 << i)
            if lane >= (1 << i):
                incl = incl + y
        chunk_total = cute.arch.shuffle_sync(incl, offset=31)
        if tile_idx < cursor_base + chunk_total:
            hit = cute.arch.vote_ballot_sync(cursor_base + incl > tile_idx)
            first = cute.arch.popc((hit & (-hit)) - 1)
            excl = cute.arch.shuffle_sync(incl - n_tiles, offset=first)
            n_m_b = cute.arch.shuffle_sync(n_m, offset=first)
            local = tile_idx - cursor_base - excl
            m_idx = local % n_m_b
            head = local // n_m_b
            m_block = m_idx
            batch = cursor_batch + first
            searching = Boolean(False)
        else:
            cursor_base = cursor_base + chunk_total
            cursor_batch = cursor_batch + 32
            if cursor_batch >= num_batch:
                searching = Boolean(False)
    return m_block, head, batch, batch < num_batch, cursor_batch, cursor_base


@cute.jit
def varlen_decode_lpt(
    tile_idx: Int32,
    cu_seqlens: cute.Tensor,
    num_batch: Int32,
    num_heads: cutlass.Constexpr[int],
    tile_m: cutlass.Constexpr[int],
    cursor_rank: Int32,
    cursor_base: Int32,
    lengths: cutlass.Constexpr[bool] = False,
    total=None,
):
    """Longest-first over a packed batch under a causal band. Warp-collective.

    Under a causal band a tile's work grows with its m-block index, whatever its
    sequence's length, so tiles run by level: m-block L-1 of every sequence that
    has one (L = the most m-blocks of any sequence), then L-2, and so on; within a
    level, sequence-major then head. Returns (m_block, head, batch, is_valid,
    cursor_rank, cursor_base): the cursor is the levels already passed and the
    tiles before them; tile indices must not decrease between calls.
    """
    lane = cute.arch.lane_idx()
    top = Int32(0)
    c = Int32(0)
    while c < num_batch:
        top = cutlass.max(top, _m_blocks(cu_seqlens, c + lane, num_batch, tile_m, lengths, total))
        c = c + 32
    for i in cutlass.range_constexpr(5):
        top = cutlass.max(top, cute.arch.shuffle_sync_bfly(top, offset=1 << i))
    m_block = Int32(0)
    head = Int32(0)
    batch = num_batch
    rank = cursor_rank
    base = cursor_base
    searching = rank < top
    while searching:
        level = top - 1 - rank
        count = Int32(0)
        c = Int32(0)
        while c < num_batch:
            count = count + cute.arch.popc(
                cute.arch.vote_ballot_sync(_m_blocks(cu_seqlens, c + lane, num_batch, tile_m, lengths, total) > level)
            )
            c = c + 32
        n_tiles = count * num_heads
        if tile_idx < base + n_tiles:
            j = tile_idx - base
            e = j // num_heads
            head = j - e * num_heads
            c = Int32(0)
            while c < num_batch:  # the e-th sequence that has a tile at this level
                has = _m_blocks(cu_seqlens, c + lane, num_batch, tile_m, lengths, total) > level
                bal = cute.arch.vote_ballot_sync(has)
                k = cute.arch.popc(bal)
                if e < k:
                    below = cute.arch.popc(bal & ((Int32(1) << lane) - 1))
                    hit = cute.arch.vote_ballot_sync(has & (below == e))
                    batch = c + cute.arch.popc((hit & (-hit)) - 1)
                    c = num_batch
                else:
                    e = e - k
                    c = c + 32
            m_block = level
            searching = Boolean(False)
        else:
            base = base + n_tiles
            rank = rank + 1
            if rank >= top:
                searching = Boolean(False)
    return m_block, head, batch, batch < num_batch, rank, base


#: batch entries `ranked_batch` orders by length in-kernel (two per lane); a longer batch keeps its own order
RANKED_BATCH_MAX = 64


@cute.jit
def ranked_batch(rank: Int32, num_batch: Int32, cu_seqlens, seqused, total=None) -> Int32:
    """The batch entry launched `rank`-th when entries run longest query length first, ties by index.

    Warp-collective (each warp of a CTA finds the same entry). Each lane holds the lengths of entries lane and
    lane + 32, counts the entries ahead of each (longer, or as long with a lower index), and the warp votes for
    the one with `rank` entries ahead of it. Read from the device on every launch, so replays with new lengths
    take their own order; batches of more than RANKED_BATCH_MAX entries launch in index order.
    """
    batch = rank
    if num_batch <= RANKED_BATCH_MAX:
        lane = cute.arch.lane_idx()
        # query lengths as `seqlen_info` reads them (0 past the batch: such a lane counts every entry ahead of it)
        lens, from_seqused = (seqused, True) if const_expr(seqused is not None) else (cu_seqlens, False)
        low = _m_blocks(lens, lane, num_batch, 1, from_seqused, total)  # entry lane
        high = _m_blocks(lens, lane + 32, num_batch, 1, from_seqused, total)  # entry lane + 32
        ahead_low = Int32(0)
        ahead_high = Int32(0)
        for j in cutlass.range(num_batch, unroll=1):
            other = cute.arch.shuffle_sync(low, offset=j % 32)
            if j >= 32:
                other = cute.arch.shuffle_sync(high, offset=j % 32)
            if other > low or (other == low and j < lane):
                ahead_low = ahead_low + 1
            if other > high or (other == high and j < lane + 32):
                ahead_high = ahead_high + 1
        hit_low = cute.arch.vote_ballot_sync(ahead_low == rank)
        hit_high = cute.arch.vote_ballot_sync(ahead_high == rank)
        if hit_low != 0:
            batch = cute.arch.popc((hit_low & (-hit_low)) - 1)
        if hit_high != 0:
            batch = 32 + cute.arch.popc((hit_high & (-hit_high)) - 1)
    return batch
