"""Per-batch sequence offset and length for dense, seqused (padded) and packed THD batches.

Read once per tile at kernel start, from device tensors, so lengths written
into the same device buffers between CUDA-graph replays are honoured.
"""
import cutlass
import cutlass.cute as cute
from cutlass import Int32


@cute.jit
def token_offset(offsets: cute.Tensor, batch: Int32, div: cutlass.Constexpr[int] = 0):
    """The first token of batch entry `batch`: frost's token prefix sums as they are (`div` 0), or cuDNN's
    element offsets (int32 or int64) divided by the group's token stride `div` (the ragged-offset form)."""
    if cutlass.const_expr(div == 0):
        return offsets[batch]
    else:
        return Int32(offsets[batch] // div)


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
):
    """(offset_q, offset_k, seqlen_q, seqlen_k) of one batch entry.

    Dense: offsets 0, lengths the static extents, or seqused[b] when given.
    THD: offsets cu_seqlens[b], lengths cu_seqlens[b + 1] - cu_seqlens[b].
    Ragged (`div_q` / `div_k` > 0, cuDNN's element offsets): offsets cu_seqlens[b] // div, lengths seqused[b].
    """
    offset_q = Int32(0)
    seqlen_q = static_seqlen_q
    if cutlass.const_expr(cu_seqlens_q is not None):
        offset_q = token_offset(cu_seqlens_q, batch, div_q)
        if cutlass.const_expr(seqused_q is None):
            seqlen_q = cu_seqlens_q[batch + 1] - offset_q
    if cutlass.const_expr(seqused_q is not None):
        seqlen_q = seqused_q[batch]
    offset_k = Int32(0)
    seqlen_k = static_seqlen_k
    if cutlass.const_expr(cu_seqlens_k is not None):
        offset_k = token_offset(cu_seqlens_k, batch, div_k)
        if cutlass.const_expr(seqused_k is None):
            seqlen_k = cu_seqlens_k[batch + 1] - offset_k
    if cutlass.const_expr(seqused_k is not None):
        seqlen_k = seqused_k[batch]
    return offset_q, offset_k, seqlen_q, seqlen_k


def own_token_offset(p, role: str, offsets, batch: Int32, shared):
    """The first token of batch entry `batch` in io tensor `role`: from its own ragged offsets (`offsets`, params
    `own_offsets`) where it has them, else its group leader's (`shared`)."""
    if offsets is None:
        return shared
    return token_offset(offsets, batch, p.own_div(role))


def own_rows(p, role: str, mX, offsets, batch: Int32, leader):
    """A packed (T, ...) view of io tensor `role`, shifted so that its group leader's first token of batch entry
    `batch` (`leader`) is its own: code that indexes every tensor of the group from the leader's offset then
    reads this one from its own ragged offsets. Unchanged where it takes the leader's."""
    if offsets is None:
        return mX
    shift = own_token_offset(p, role, offsets, batch, leader) - leader
    return cute.domain_offset((shift,) + (0,) * (cute.rank(mX) - 1), mX)
