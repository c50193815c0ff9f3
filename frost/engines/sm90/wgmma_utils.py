"""Warpgroup-MMA helpers for the SM90 kernels: GEMM issue, accumulator views, conversions.

The wgmma accumulator of an m64nNk16 atom holds, per thread, ((2 cols, 2 rows,
N/8 column groups), MMA_M, MMA_N) values. Softmax and masking take it as (rows,
cols) through the shared `common.acc_layout.acc_as_mn`; the register-A (RS) PV
GEMM wants it regrouped into k16 slices, built here.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op
from cutlass.cute.nvgpu import warpgroup


def smem_atom(dtype, width: int):
    """The row-major wgmma shared-memory layout atom (widest swizzle) for rows of `width` elements."""
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass.tensor_utils import LayoutEnum

    return warpgroup.make_smem_layout_atom(sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dtype, width), dtype)


def tma_pipelines(consumer_threads: int, *specs):
    """One TMA mbarrier pipeline per (barrier storage, stages, tx bytes) spec: one producer thread fills it,
    the consumer warps (`consumer_threads` / 32 arrivals) release it. Initialized together; the caller fences
    (`mbarrier_init_fence`) and syncs once after."""
    from cutlass import pipeline

    producer = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
    consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, consumer_threads // 32)
    return [
        pipeline.PipelineTmaAsync.create(
            barrier_storage=mbar,
            num_stages=stages,
            producer_group=producer,
            consumer_group=consumers,
            tx_count=tx,
            defer_sync=True,
        )
        for mbar, stages, tx in specs
    ]


@cute.jit
def gemm(
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    tCrA: cute.Tensor,
    tCrB: cute.Tensor,
    zero_init: cutlass.Constexpr[bool] = False,
    wg_wait: cutlass.Constexpr[int] = 0,
    k_blocks: cutlass.Constexpr[int] = 0,
):
    """acc (+)= A @ B over the first `k_blocks` k blocks (0: all) as one wgmma commit group; wait for `wg_wait`
    groups (-1: none). Blocks past `k_blocks` must hold zeros in A or B (a tile's padded head-dim columns)."""
    warpgroup.fence()
    atom = cute.make_mma_atom(tiled_mma.op)
    atom.set(warpgroup.Field.ACCUMULATE, not zero_init)
    for k in cutlass.range_constexpr(k_blocks or cute.size(tCrA.shape[2])):
        cute.gemm(atom, acc, tCrA[None, None, k], tCrB[None, None, k], acc)
        atom.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.commit_group()
    if const_expr(wg_wait >= 0):
        warpgroup.wait_group(wg_wait)


def acc_layout_as_a(acc_layout: cute.Layout) -> cute.Layout:
    """((2, 2, V), M, N) accumulator layout -> ((2, 2, 2), M, (V/2, N)) register-A layout (16-bit A)."""
    l = cute.logical_divide(acc_layout, ((None, None, 2), None, None))
    return cute.make_layout(
        ((l.shape[0][0], l.shape[0][1], l.shape[0][2][0]), l.shape[1], (l.shape[0][2][1], l.shape[2])),
        stride=((l.stride[0][0], l.stride[0][1], l.stride[0][2][0]), l.stride[1], (l.stride[0][2][1], l.stride[2])),
    )


def acc_view_as_a(acc: cute.Tensor) -> cute.Tensor:
    return cute.make_tensor(acc.iterator, acc_layout_as_a(acc.layout))


def transpose_view(a: cute.Tensor) -> cute.Tensor:
    """Swap the first two modes of a (possibly staged) smem tensor."""
    shape = (a.shape[1], a.shape[0], *a.shape[2:])
    order = (1, 0, *range(2, cute.rank(a)))
    return cute.composition(a, cute.make_ordered_layout(shape, order=order))


@dsl_user_op
def cvt_pack_f32x2(a: Float32, b: Float32, to_bf16: bool, *, loc=None, ip=None) -> Int32:
    """Two fp32 -> one 32-bit register of two 16-bit floats (round to nearest), `a` in the low half."""
    kind = "bf16x2" if to_bf16 else "f16x2"
    return Int32(
        llvm.inline_asm(
            T.i32(),
            [Float32(a).ir_value(loc=loc, ip=ip), Float32(b).ir_value(loc=loc, ip=ip)],
            f"cvt.rn.{kind}.f32 $0, $2, $1;",
            "=r,f,f",
            has_side_effects=False,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


@cute.jit
def convert_to_16bit(src: cute.Tensor, dst: cute.Tensor):
    """Elementwise fp32 -> bf16/fp16 between equally sized register tensors, two at a time."""
    to_bf16 = const_expr(dst.element_type is cutlass.BFloat16)
    dst_i32 = cute.recast_tensor(dst, Int32)
    for i in cutlass.range_constexpr(cute.size(dst_i32)):
        dst_i32[i] = cvt_pack_f32x2(src[2 * i], src[2 * i + 1], to_bf16)
