"""The KV-cache append kernel: new keys and values into a contiguous or paged cache, and the lengths after.

Grid (S_new + 1, B, H): block (s, b, h) with s < S_new copies token s of head h of sequence b (its threads stride
over the head dims) to position cache_seqlens[b] + s; block (S_new, b, 0) writes seq_len_kv[b] and seq_len_q[b].
A paged cache maps position p to row p % block_size of block table[b, p // block_size]. A cache length read from the
device is clamped to [0, capacity]; writes past a contiguous cache's capacity, past the end of a table row or to a
block outside the container are dropped (nothing is read on the host to check them). B, S_new, the cache extents,
the block size and every stride are symbolic: one artifact per (dtype, head dims, paged, where the lengths come from).
Contract and reference: `kv_append_params`.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32

from frost.engines.common.kv_append_params import KvAppendParams, validate
from frost.engines.common.seqlen import clamp

TEMPLATE = __name__
THREADS = 128
_DTYPES = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16, "fp32": cutlass.Float32}


def kernel_name(params: KvAppendParams, arch: str) -> str:
    layout = "paged" if params.paged else "contiguous"
    lens = "lens" if params.seqlens_tensor else "scalar"
    return f"frost_kv_append_{params.dtype}_d{params.head_dim}x{params.head_dim_v}_{layout}_{lens}"


def _io(dtype, batch, rows, heads, dim):
    stride = (cute.sym_int64(), cute.sym_int64(), cute.sym_int64(), 1)
    return cute.runtime.make_fake_tensor(dtype, (batch, rows, heads, dim), stride, assumed_align=2)


def build(params: KvAppendParams, arch: str):
    """The host entry and its fakes (see the module docstring for the argument order)."""
    validate(params)
    dt = _DTYPES[params.dtype]
    batch, s_new, heads = cute.sym_int(symbol="batch"), cute.sym_int(symbol="new_tokens"), cute.sym_int()
    k_new = _io(dt, batch, s_new, heads, params.head_dim)
    v_new = _io(dt, batch, s_new, heads, params.head_dim_v)
    slots, rows = cute.sym_int(symbol="cache_slots"), cute.sym_int(symbol="cache_rows")
    k_cache = _io(dt, slots, rows, heads, params.head_dim)
    v_cache = _io(dt, slots, rows, heads, params.head_dim_v)
    table = cute.runtime.make_fake_tensor(
        Int32, (batch, cute.sym_int(symbol="max_blocks")), (cute.sym_int64(), cute.sym_int64()), assumed_align=4
    )
    seqlens = cute.runtime.make_fake_tensor(Int32, (batch,), (cute.sym_int64(),), assumed_align=4)
    lens_q = cute.runtime.make_fake_compact_tensor(Int32, (batch,), assumed_align=4)
    lens_kv = cute.runtime.make_fake_compact_tensor(Int32, (batch,), assumed_align=4)
    stream = cute.runtime.make_fake_stream()
    op = KvAppend(params)

    @cute.jit
    def kv_append(
        k_new: cute.Tensor,
        v_new: cute.Tensor,
        k_cache: cute.Tensor,
        v_cache: cute.Tensor,
        table: cute.Tensor,
        seqlens: cute.Tensor,
        lens_q: cute.Tensor,
        lens_kv: cute.Tensor,
        cache_len: Int32,
        s_q: Int32,
        stream: cuda.CUstream,
    ):
        op.launch(k_new, v_new, k_cache, v_cache, table, seqlens, lens_q, lens_kv, cache_len, s_q, stream)

    return kv_append, (k_new, v_new, k_cache, v_cache, table, seqlens, lens_q, lens_kv, Int32(0), Int32(1), stream)


class KvAppend:
    """The kernel object: plan-time params and the host-side launch the jit entry calls; device code: `kernel`."""

    def __init__(self, p: KvAppendParams):
        self.p = p

    def launch(self, k_new, v_new, k_cache, v_cache, table, seqlens, lens_q, lens_kv, cache_len, s_q, stream) -> None:
        batch = cute.size(k_new, mode=[0])
        s_new = cute.size(k_new, mode=[1])
        heads = cute.size(k_new, mode=[2])
        kernel(self.p, k_new, v_new, k_cache, v_cache, table, seqlens, lens_q, lens_kv, cache_len, s_q).launch(
            grid=(s_new + 1, batch, heads), block=(THREADS, 1, 1), stream=stream
        )


@cute.jit
def _copy_row(dst: cute.Tensor, src: cute.Tensor, tidx: Int32, dim: cutlass.Constexpr):
    """dst[d] = src[d] for the head dims this thread owns (tidx, tidx + THREADS, ...)."""
    for i in cutlass.range_constexpr((dim + THREADS - 1) // THREADS):
        d = tidx + i * THREADS
        if d < dim:
            dst[d] = src[d]


@cute.kernel
def kernel(
    p: cutlass.Constexpr,
    mKNew: cute.Tensor,
    mVNew: cute.Tensor,
    mKCache: cute.Tensor,
    mVCache: cute.Tensor,
    mTable: cute.Tensor,
    mSeqlens: cute.Tensor,
    mLensQ: cute.Tensor,
    mLensKV: cute.Tensor,
    cache_len: Int32,
    s_q: Int32,
):
    tidx, _, _ = cute.arch.thread_idx()
    s, b, h = cute.arch.block_idx()
    s_new = cute.size(mKNew, mode=[1])
    # a device-read length may be anything: the first position is clamped to the cache's capacity, so a
    # negative one appends at 0 and an oversized one appends nothing (docs/lengths.md)
    capacity = cute.size(mKCache, mode=[1])
    if cutlass.const_expr(p.paged):
        capacity = cute.size(mKCache, mode=[1]) * cute.size(mTable, mode=[1])
    start = clamp(cache_len, Int32(0), capacity)
    if cutlass.const_expr(p.seqlens_tensor):
        start = clamp(mSeqlens[b], Int32(0), capacity)
    if s < s_new:
        pos = start + s
        if cutlass.const_expr(p.paged):
            block_size = cute.size(mKCache, mode=[1])
            slot = pos // block_size
            if slot < cute.size(mTable, mode=[1]):
                # a table entry is read from the device too: clamped to [-1, num_blocks], and the two ends
                # (outside the container) are dropped
                num_blocks = cute.size(mKCache, mode=[0])
                blk = clamp(mTable[b, slot], Int32(-1), num_blocks)
                row = pos % block_size
                if blk >= 0 and blk < num_blocks:
                    _copy_row(mKCache[blk, row, h, None], mKNew[b, s, h, None], tidx, p.head_dim)
                    _copy_row(mVCache[blk, row, h, None], mVNew[b, s, h, None], tidx, p.head_dim_v)
        else:
            if pos < cute.size(mKCache, mode=[1]):
                _copy_row(mKCache[b, pos, h, None], mKNew[b, s, h, None], tidx, p.head_dim)
                _copy_row(mVCache[b, pos, h, None], mVNew[b, s, h, None], tidx, p.head_dim_v)
    elif h == 0 and tidx == 0:
        mLensKV[b] = start + s_new
        mLensQ[b] = s_q
