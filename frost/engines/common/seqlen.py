"""Per-batch sequence offset and length for dense, seqused (padded) and packed THD batches.

Read once per tile at kernel start, from device tensors, so lengths written
into the same device buffers between CUDA-graph replays are honoured.

Device values are never trusted (docs/lengths.md): every offset and length is clamped here, where it is
decoded, to the envelope of the tensors the kernel was launched with, so no row a kernel touches lies outside
them whatever the device holds. Offsets go to [0, T] (T: the bound token extent), a packed sequence's end to
[start, T], a length to [0, T - start] (dense: [0, S]) and, where a kernel passes one, to its plan-time maximum;
an io tensor's own offset goes to [0, T - length] so its rows fit too.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32


@cute.jit
def clamp(x, lo, hi):
    """`x` limited to [lo, hi] (callers keep lo <= hi): where a device-read length or offset may lie."""
    return cutlass.max(cutlass.min(x, hi), lo)


@cute.jit
def token_offset(offsets: cute.Tensor, batch: Int32, div: cutlass.Constexpr[int] = 0, limit=None):
    """The first token of batch entry `batch`: frost's token prefix sums as they are (`div` 0), or cuDNN's
    element offsets (int32 or int64) divided by the group's token stride `div` (the ragged-offset form).
    `limit`: clamped to [0, limit] in the offsets' own type, before an int64 offset narrows to Int32."""
    if cutlass.const_expr(div == 0):
        v = offsets[batch]
    else:
        v = offsets[batch] // div
    if cutlass.const_expr(limit is not None):
        v = clamp(v, type(v)(0), type(v)(limit))
    if cutlass.const_expr(div == 0 and limit is None):
        return v
    else:
        return Int32(v)


@cute.jit
def packed_length(cu_seqlens: cute.Tensor, batch: Int32, start: Int32, total) -> Int32:
    """Length of packed sequence `batch` from the prefix sums, its first token `start` already clamped: its end
    clamped to [start, total], so a decreasing or oversized prefix sum gives a length in [0, total - start]."""
    return clamp(cu_seqlens[batch + 1], start, total) - start


@cute.jit
def seqlen_info(
    batch: Int32,
    static_seqlen_q: Int32,
    static_seqlen_k: Int32,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    seqused_q=None,
    seqused_k=None,
    div_q: cutlass.Constexpr[int] = 0,
    div_k: cutlass.Constexpr[int] = 0,
    max_q=None,
    max_k=None,
):
    """(offset_q, offset_k, seqlen_q, seqlen_k) of one batch entry, each clamped to the envelope.

    Dense: offsets 0, lengths the static extents, or seqused[b] in [0, S] when given.
    THD (static extents: the token totals T): offsets cu_seqlens[b] in [0, T], ends cu_seqlens[b + 1] in
    [offset, T], lengths their difference.
    Ragged (`div_q` / `div_k` > 0, cuDNN's element offsets): offsets cu_seqlens[b] // div in [0, T], lengths
    seqused[b] in [0, T - offset].
    `max_q` / `max_k`: a plan-time maximum the length is also held to (kernels with per-sequence workspace).
    """
    offset_q = Int32(0)
    seqlen_q = static_seqlen_q
    if cutlass.const_expr(cu_seqlens_q is not None):
        offset_q = token_offset(cu_seqlens_q, batch, div_q, static_seqlen_q)
        if cutlass.const_expr(seqused_q is None):
            seqlen_q = packed_length(cu_seqlens_q, batch, offset_q, static_seqlen_q)
    if cutlass.const_expr(seqused_q is not None):
        seqlen_q = clamp(seqused_q[batch], Int32(0), static_seqlen_q - offset_q)
    if cutlass.const_expr(max_q is not None):
        seqlen_q = cutlass.min(seqlen_q, max_q)
    offset_k = Int32(0)
    seqlen_k = static_seqlen_k
    if cutlass.const_expr(cu_seqlens_k is not None):
        offset_k = token_offset(cu_seqlens_k, batch, div_k, static_seqlen_k)
        if cutlass.const_expr(seqused_k is None):
            seqlen_k = packed_length(cu_seqlens_k, batch, offset_k, static_seqlen_k)
    if cutlass.const_expr(seqused_k is not None):
        seqlen_k = clamp(seqused_k[batch], Int32(0), static_seqlen_k - offset_k)
    if cutlass.const_expr(max_k is not None):
        seqlen_k = cutlass.min(seqlen_k, max_k)
    return offset_q, offset_k, seqlen_q, seqlen_k


@cute.jit
def rows_offset(offsets: cute.Tensor, batch: Int32, div: cutlass.Constexpr[int], rows, total):
    """The first token of an entry of `rows` rows (a clamped length) in a tensor of `total` tokens, read from its
    own offsets: clamped to [0, total - rows], so every one of its rows lies inside the tensor."""
    return token_offset(offsets, batch, div, total - rows)


def own_token_offset(p, role: str, offsets, batch: Int32, shared, rows=None, total=None):
    """The first token of batch entry `batch` in io tensor `role`: from its own ragged offsets (`offsets`, params
    `own_offsets`) where it has them, clamped so its `rows` fit in `total` (`rows_offset`), else its group
    leader's (`shared`)."""
    if offsets is None:
        return shared
    if total is None:
        return token_offset(offsets, batch, p.own_div(role))
    return rows_offset(offsets, batch, p.own_div(role), rows, total)


def own_rows(p, role: str, mX, offsets, batch: Int32, leader, rows=None, total=None):
    """A packed (T, ...) view of io tensor `role`, shifted so that its group leader's first token of batch entry
    `batch` (`leader`) is its own: code that indexes every tensor of the group from the leader's offset then
    reads this one from its own ragged offsets (clamped as `own_token_offset`). Unchanged where it takes the
    leader's."""
    if offsets is None:
        return mX
    shift = own_token_offset(p, role, offsets, batch, leader, rows, total) - leader
    return cute.domain_offset((shift,) + (0,) * (cute.rank(mX) - 1), mX)
