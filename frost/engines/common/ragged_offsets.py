"""Ragged offsets from packed prefix sums: what cuDNN's ragged form reads, derived on the execute stream.

One thread per batch entry b of the (B+1,) prefix sums `cu_seq_len_q/kv`:

    lengths[0, b] = cu_q[b+1] - cu_q[b],  lengths[1, b] = cu_kv[b+1] - cu_kv[b]    (b < B)
    offsets[j, b] = cu[b] * stride_j                                                 (b <= B)

with `cu` the query prefix sums for the q group's strides (`strides_q`, rows 0..) and the key/value ones for
the kv group's (`strides_kv`, the rows after). B is symbolic (the prefix sums' extent), so one artifact serves
every batch; the strides and the offsets' integer type are plan-time params. The lengths stay on the device:
nothing is read on the host. Every prefix sum is clamped to the declared envelope first (`seqlen`, as the DSL
kernels clamp theirs; docs/lengths.md): cu[b] to [0, T], cu[b+1] to [cu[b], T], each length then to the declared
maximum, so cuDNN is never handed an offset or length outside the tensors it was planned for. Call signature:
``fn(cu_q, cu_kv, lengths, offsets, total_q, total_kv, max_q, max_kv, stream)`` (the four envelopes Int32,
plan-time values passed at run time, so they stay out of the compile key).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from frost.engines.common.ragged_offsets_params import RaggedOffsetsParams, validate
from frost.engines.common.seqlen import clamp, packed_length

TEMPLATE = __name__
THREADS = 128
_OFFSET_TYPES = {"int32": Int32, "int64": Int64}


def kernel_name(params: RaggedOffsetsParams, arch: str) -> str:
    q = "x".join(map(str, params.strides_q))
    kv = "x".join(map(str, params.strides_kv))
    return f"frost_ragged_offsets_{params.offset_dtype}_q{q}_kv{kv}"


def build(params: RaggedOffsetsParams, arch: str):
    """The host entry and its fakes: prefix sums (B+1,), lengths (2, L), offsets (N, M), the stream."""
    validate(params)
    batch1 = cute.sym_int(symbol="batch_plus_1")
    cu_q = cute.runtime.make_fake_compact_tensor(Int32, (batch1,), assumed_align=4)
    cu_kv = cute.runtime.make_fake_compact_tensor(Int32, (batch1,), assumed_align=4)
    lengths = cute.runtime.make_fake_compact_tensor(
        Int32, (2, cute.sym_int(symbol="lengths_row")), stride_order=(1, 0), assumed_align=16
    )
    offsets = cute.runtime.make_fake_compact_tensor(
        _OFFSET_TYPES[params.offset_dtype],
        (params.num_offsets, cute.sym_int(symbol="offsets_row")),
        stride_order=(1, 0),
        assumed_align=16,
    )
    stream = cute.runtime.make_fake_stream()
    op = RaggedOffsets(params)

    @cute.jit
    def ragged_offsets(
        cu_q: cute.Tensor,
        cu_kv: cute.Tensor,
        lengths: cute.Tensor,
        offsets: cute.Tensor,
        total_q: Int32,
        total_kv: Int32,
        max_q: Int32,
        max_kv: Int32,
        stream: cuda.CUstream,
    ):
        op.launch(cu_q, cu_kv, lengths, offsets, (total_q, total_kv, max_q, max_kv), stream)

    return ragged_offsets, (cu_q, cu_kv, lengths, offsets, Int32(1), Int32(1), Int32(1), Int32(1), stream)


class RaggedOffsets:
    """The kernel object: plan-time params and the host-side launch the jit entry calls; device code: `kernel`."""

    def __init__(self, p: RaggedOffsetsParams):
        self.p = p

    def launch(self, cu_q, cu_kv, lengths, offsets, envelope, stream) -> None:
        """`envelope`: (total_q, total_kv, max_q, max_kv), the declared token totals and longest sequences."""
        n = cute.size(cu_q, mode=[0])
        kernel(self.p, cu_q, cu_kv, lengths, offsets, *envelope).launch(
            grid=((n + THREADS - 1) // THREADS, 1, 1), block=(THREADS, 1, 1), stream=stream
        )


@cute.kernel
def kernel(
    p: cutlass.Constexpr,
    mCuQ: cute.Tensor,
    mCuKV: cute.Tensor,
    mLengths: cute.Tensor,
    mOffsets: cute.Tensor,
    total_q: Int32,
    total_kv: Int32,
    max_q: Int32,
    max_kv: Int32,
):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    b = bidx * THREADS + tidx
    n = cute.size(mCuQ, mode=[0])
    if b < n:
        cq = clamp(mCuQ[b], Int32(0), total_q)
        ckv = clamp(mCuKV[b], Int32(0), total_kv)
        if cutlass.const_expr(p.offset_dtype == "int64"):
            cq_o, ckv_o = Int64(cq), Int64(ckv)
        else:
            cq_o, ckv_o = cq, ckv
        for j in cutlass.range_constexpr(len(p.strides_q)):
            mOffsets[j, b] = cq_o * p.strides_q[j]
        for j in cutlass.range_constexpr(len(p.strides_kv)):
            mOffsets[len(p.strides_q) + j, b] = ckv_o * p.strides_kv[j]
        if b + 1 < n:
            mLengths[0, b] = cutlass.min(packed_length(mCuQ, b, cq, total_q), max_q)
            mLengths[1, b] = cutlass.min(packed_length(mCuKV, b, ckv, total_kv), max_kv)
