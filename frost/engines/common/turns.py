"""The deterministic backward's turns, shared by the mma.sync and the wgmma backward.

Where dQ is ordered by turns (`scratch.uses_turns`), each CTA holds one key tile and adds into the query tiles
of its walk; an add into query tile m waits until m's counter (`turn_index`) equals the CTA's turn on m, then
passes the turn on. Two orders (`det_order`):

- "stair": turns follow the launch. Under a right-bounded band (causal) key tiles launch from the last down and
  walk from the diagonal, so each query tile takes them from the highest down; an order that runs upward starts
  every walk at the band's first query tile and the adds settle into a staircase (`stair_turn`).
- "rotated" (no window): key tile n starts its walk at query tile n mod M (wrapping), and a query tile takes its
  key tiles by (arrival step, key tile) (`rotated_turn`), so neighbouring key tiles never queue behind each
  other. A rotated turn may wait on a key tile launched later, so the walks rotate only where `rotation_fits`.

Plain, branch-free integer arithmetic without a cutlass import: planning and the CPU tests call the very
definitions the kernels trace (a kernel passes `cutlass.min` / `cutlass.max`).
"""

from __future__ import annotations

STAIR, ROTATED = "stair", "rotated"
#: the `det_order` values of both backwards
DET_ORDERS = (STAIR, ROTATED)


def rotation_fits(key_tiles, sm_count: int):
    """The one safety rule of the rotated order: a sequence's key tiles fit on half the SMs.

    A rotated turn waits on higher key tiles, launched after it. With one CTA per SM and CTAs launched in grid
    order, only the newest sequence has CTAs still to launch, so its `key_tiles - 1` waiting CTAs must leave an
    SM free; half the SMs keeps that true with a second such kernel running at once (another stream).
    """
    return key_tiles <= sm_count // 2


def rotated_turn(n, m, key_tiles, query_tiles, minimum=min):
    """Key tile n's turn on query tile m in the rotated order: n visits m at step s = (m - n) mod M, and the
    adds into m run by (s, n). Closed form (N key tiles, M query tiles, N = q M + r): the key tiles with a
    smaller step are those whose residue mod M lies in the M-cyclic window (m - s, m], q each plus one per
    residue below r (`_residues_below`), then the n // M tiles of n's own residue below it. Non-negative
    operands."""
    q, r = key_tiles // query_tiles, key_tiles % query_tiles
    s = (m + query_tiles - n % query_tiles) % query_tiles
    end = m + 1 + query_tiles  # shifted by M: the window's start stays non-negative
    window = _residues_below(end, query_tiles, r, minimum) - _residues_below(end - s, query_tiles, r, minimum)
    return q * s + window + n // query_tiles


def _residues_below(x, query_tiles, r, minimum=min):
    """How many integers in [0, x) have a residue mod M below r (x >= 0)."""
    return (x // query_tiles) * r + minimum(x % query_tiles, r)


def stair_turn(
    n_block,
    m_block,
    tile_m,
    tile_n,
    seqlen_k,
    diag,
    window_left,
    window_right,
    downward: bool,
    integer=int,
    minimum=min,
    maximum=max,
):
    """Key tile n_block's turn on query tile m_block in the stair order. The key tiles that visit a query tile
    are a run [n_lo, n_hi] of the band (windows: None where the band has none); `downward` (the launch runs
    from the last key tile) counts from n_hi, else from n_lo (`integer`: the kernel's Int32)."""
    if downward:
        n_hi = (seqlen_k + tile_n - 1) // tile_n - 1
        if window_right is not None:
            # key tile n's band starts at or before m_block  <=>  n * tile_n < (m + 1) * tile_m + diag + wr
            bound = (m_block + 1) * tile_m + diag + window_right
            n_hi = minimum(n_hi, (maximum(bound, 1) - 1) // tile_n)
        return n_hi - n_block
    n_lo = integer(0)
    if window_left is not None:
        n_lo = maximum(m_block * tile_m + diag - window_left, 0) // tile_n
    return n_block - n_lo


def ragged_tiles(counters, batch_entries: int, num_heads: int):
    """cuDNN's ragged form (sequences anywhere, in any order): the query tiles each (batch entry, head) has
    counters for, those of the longest sequence (`scratch.scratch_layout`); `counters`: the counters' extent."""
    return counters // (batch_entries * num_heads)


def turn_index(head, m_block, num_heads, tiles, batch=None, first_tile=None):
    """The turn counter of one (batch, query head, query tile), as `scratch.scratch_layout` sizes them and the
    shared preprocess zeroes them. Per sequence (`batch`: dense, and cuDNN's ragged form): `tiles` per (batch,
    head). Packed (`first_tile`: the sequence's first tile, `accum.packed_acc_tile`): `tiles` per head."""
    if first_tile is None:
        return (batch * num_heads + head) * tiles + m_block
    return head * tiles + first_tile + m_block
