"""mma.sync (m16n8k16) GEMM steps with ldmatrix operand loads, software-pipelined over k.

Shared by the mma.sync-family SDPA kernels: `gemm_ss` reads both operands
from shared memory, `gemm_rs` takes A from registers (P in P.V).
"""

import cutlass
import cutlass.cute as cute


@cute.jit
def gemm_ss(
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    tCrA: cute.Tensor,
    tCrB: cute.Tensor,
    tCsA: cute.Tensor,
    tCsB: cute.Tensor,
    smem_copy_A: cute.TiledCopy,
    smem_copy_B: cute.TiledCopy,
    thr_copy_A,
    thr_copy_B,
    k_slices: cutlass.Constexpr[int] = 0,
):
    """acc += A.B^T with A and B fragments loaded from smem, each k-slice one slice ahead of its MMAs.

    `k_slices` > 0 stops after that many 16-wide k-slices (a head dim padded past them: the slices beyond
    hold only zero columns, which add nothing).
    """
    tCrA_v = thr_copy_A.retile(tCrA)
    tCrB_v = thr_copy_B.retile(tCrB)
    num_k = cute.size(tCsA.shape[2])
    if cutlass.const_expr(k_slices > 0):
        num_k = k_slices
    cute.copy(smem_copy_A, tCsA[None, None, 0], tCrA_v[None, None, 0])
    cute.copy(smem_copy_B, tCsB[None, None, 0], tCrB_v[None, None, 0])
    for k in cutlass.range_constexpr(num_k):
        if cutlass.const_expr(k + 1 < num_k):
            cute.copy(smem_copy_A, tCsA[None, None, k + 1], tCrA_v[None, None, k + 1])
            cute.copy(smem_copy_B, tCsB[None, None, k + 1], tCrB_v[None, None, k + 1])
        cute.gemm(tiled_mma, acc, tCrA[None, None, k], tCrB[None, None, k], acc)


@cute.jit
def gemm_rs(
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    tCrA: cute.Tensor,
    tCrB: cute.Tensor,
    tCsB: cute.Tensor,
    smem_copy_B: cute.TiledCopy,
    thr_copy_B,
):
    """acc += A.B^T with A already in registers and B loaded from smem slice by slice (no prefetch: the
    wide V fragments would cost more registers than ptxas's own scheduling)."""
    tCrB_v = thr_copy_B.retile(tCrB)
    for k in cutlass.range_constexpr(cute.size(tCrA.shape[2])):
        cute.copy(smem_copy_B, tCsB[None, None, k], tCrB_v[None, None, k])
        cute.gemm(tiled_mma, acc, tCrA[None, None, k], tCrB[None, None, k], acc)


def smem_layout_atom(row_elems: int):
    """Swizzled (8, 64) or (8, 32) atom for 16-bit rows of `row_elems` elements (ldmatrix conflict-free)."""
    kblk = 64 if row_elems % 64 == 0 else 32
    return cute.make_composed_layout(
        cute.make_swizzle(3 if kblk == 64 else 2, 3, 3), 0, cute.make_ordered_layout((8, kblk), order=(1, 0))
    )


def row_thread_layout(num_threads: int, row_elems: int):
    """Threads of a 16-byte-per-thread gmem copy: whole (64- or 32-element) row chunks per pass."""
    tpr = (64 if row_elems % 64 == 0 else 32) // 8
    return cute.make_ordered_layout((num_threads // tpr, tpr), order=(1, 0))
