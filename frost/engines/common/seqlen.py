"""Per-batch sequence offset and length for dense, seqused (padded) and packed THD batches.

Read once per tile at kernel start, from device tensors, so lengths written
into the same device buffers between CUDA-graph replays are honoured.
"""
import cutlass
import cutlass.cute as cute
from cutlass import Int32


@cute.jit
def seqlen_info(
    batch: Int32,
    static_seqlen_q: Int32,
    static_seqlen_k: Int32,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    seqused_q=None,
    seqused_k=None,
):
    """(offset_q, offset_k, seqlen_q, seqlen_k) of one batch entry.

    Dense: offsets 0, lengths the static extents, or seqused[b] when given.
    THD: offsets cu_seqlens[b], lengths cu_seqlens[b + 1] - cu_seqlens[b]
    (seqused, when given, overrides the length and keeps the offset).
    """
    offset_q = Int32(0)
    seqlen_q = static_seqlen_q
    if cutlass.const_expr(cu_seqlens_q is not None):
        offset_q = cu_seqlens_q[batch]
        seqlen_q = cu_seqlens_q[batch + 1] - offset_q
    if cutlass.const_expr(seqused_q is not None):
        seqlen_q = seqused_q[batch]
    offset_k = Int32(0)
    seqlen_k = static_seqlen_k
    if cutlass.const_expr(cu_seqlens_k is not None):
        offset_k = cu_seqlens_k[batch]
        seqlen_k = cu_seqlens_k[batch + 1] - offset_k
    if cutlass.const_expr(seqused_k is not None):
        seqlen_k = seqused_k[batch]
    return offset_q, offset_k, seqlen_q, seqlen_k
