"""Per-tile records every SDPA kernel shares, each built once per tile.

`Sequence`: one batch entry's offsets and lengths (`seqlen.seqlen_info`) and the bound tensors' extents, built by
`sequence` (the extents of the canonical Q and K views: `extents`).

`Band`: a sequence's mask band (the causal diagonal's alignment and the windows), from its lengths. The
kernels' tile ranges (`mask.n_block_range`, `mask.m_block_range`) and masks read it; the deterministic
backward's stair turns too (`turns.stair_turn`).
"""

from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from frost.engines.common import mask, seqlen


class Sequence(NamedTuple):
    """One batch entry: its first query / key token (0 in a dense batch), its query / key lengths (from the device
    where the form has them), and the bound tensors' query / key extents (dense: the declared S, packed: T)."""

    offset_q: Int32
    offset_k: Int32
    seqlen_q: Int32
    seqlen_k: Int32
    static_q: Int32
    static_k: Int32


def extents(mQ, mK, is_thd: bool) -> tuple:
    """The bound Q and K tensors' query / key extents in their canonical views (dense (B, S, H, D): S; packed
    (T, H, D): T), a `Sequence`'s static_q / static_k."""
    if is_thd:
        return mQ.shape[0], mK.shape[0]
    return mQ.shape[1], mK.shape[1]


@cute.jit
def sequence(
    p: cutlass.Constexpr, batch: Int32, static_q: Int32, static_k: Int32, lengths, max_q=None, max_k=None
) -> Sequence:
    """Batch entry `batch`'s `Sequence`: its offsets and lengths from the device lengths where the form has them
    (`lengths`: the packed prefix sums of q and k, then their used lengths, each None where absent; params `p`'s
    `token_div_q` / `token_div_kv` for cuDNN's element offsets), clamped to the extents `static_q` / `static_k`
    (`seqlen.seqlen_info`; `max_q` / `max_k`: the bounds each length is also held to, or None)."""
    cu_q, cu_k, used_q, used_k = lengths
    off_q, off_k, seqlen_q, seqlen_k = seqlen.seqlen_info(
        batch, static_q, static_k, cu_q, cu_k, used_q, used_k, p.token_div_q, p.token_div_kv, max_q, max_k
    )
    return Sequence(off_q, off_k, seqlen_q, seqlen_k, static_q, static_k)


class Band(NamedTuple):
    """A sequence's mask band: key j meets query i on the diagonal where j = i + diag (`mask.diag_offset`: 0
    top-left, seqlen_k - seqlen_q bottom-right); a key is visible from i + diag - window_left to
    i + diag + window_right. A window is an Int32, or None where the band has no such bound."""

    diag: Int32
    window_left: object
    window_right: object


@cute.jit
def band(
    seqlen_q: Int32,
    seqlen_k: Int32,
    window_left,
    window_right,
    bottom_right: cutlass.Constexpr[bool],
    clamp: cutlass.Constexpr[bool],
) -> Band:
    """The `Band` of a sequence of these lengths. `clamp`: each window bound to seqlen_q + seqlen_k, a bound
    that admits every key already (the mask is unchanged and the index arithmetic stays far from Int32
    overflow); the kernels that take plan-time windows already clamped to the envelopes need not."""
    diag = mask.diag_offset(seqlen_q, seqlen_k, bottom_right)
    wl, wr = window_left, window_right
    if cutlass.const_expr(clamp):
        cap = seqlen_q + seqlen_k
        if cutlass.const_expr(wl is not None):
            wl = cutlass.min(Int32(wl), cap)
        if cutlass.const_expr(wr is not None):
            wr = cutlass.min(Int32(wr), cap)
    return Band(diag, wl, wr)
