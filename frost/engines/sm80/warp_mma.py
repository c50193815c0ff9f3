"""mma.sync (m16n8k16) GEMM steps with ldmatrix operand loads, software-pipelined over k.

Shared by the mma.sync-family SDPA kernels: `gemm_ss` reads both operands
from shared memory, `gemm_rs` takes A from registers (P in P.V).
"""
import cutlass
import cutlass.cute as cute

# Operand prefetch one k-slice ahead: on for Q.K^T; off for P.V, where the
# wide V fragments (d_v / 8 n-tiles per k-slice) would cost more registers than
# ptxas's own load scheduling within the unrolled block.
PREFETCH_SS = True
PREFETCH_RS = False


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
):
    """acc += A.B^T with A and B fragments loaded from smem one k-slice ahead."""
    tCrA_v = thr_copy_A.retile(tCrA)
    tCrB_v = thr_copy_B.retile(tCrB)
    num_k = cute.size(tCsA.shape[2])
    if cutlass.const_expr(PREFETCH_SS):
        cute.copy(smem_copy_A, tCsA[None, None, 0], tCrA_v[None, None, 0])
        cute.copy(smem_copy_B, tCsB[None, None, 0], tCrB_v[None, None, 0])
    for k in cutlass.range_constexpr(num_k):
        if cutlass.const_expr(PREFETCH_SS):
            if cutlass.const_expr(k + 1 < num_k):
                cute.copy(smem_copy_A, tCsA[None, None, k + 1], tCrA_v[None, None, k + 1])
                cute.copy(smem_copy_B, tCsB[None, None, k + 1], tCrB_v[None, None, k + 1])
        else:
            cute.copy(smem_copy_A, tCsA[None, None, k], tCrA_v[None, None, k])
            cute.copy(smem_copy_B, tCsB[None, None, k], tCrB_v[None, None, k])
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
    """acc += A.B^T with A already in registers and B loaded from smem one k-slice ahead."""
    tCrB_v = thr_copy_B.retile(tCrB)
    num_k = cute.size(tCrA.shape[2])
    if cutlass.const_expr(PREFETCH_RS):
        cute.copy(smem_copy_B, tCsB[None, None, 0], tCrB_v[None, None, 0])
    for k in cutlass.range_constexpr(num_k):
        if cutlass.const_expr(PREFETCH_RS):
            if cutlass.const_expr(k + 1 < num_k):
                cute.copy(smem_copy_B, tCsB[None, None, k + 1], tCrB_v[None, None, k + 1])
        else:
            cute.copy(smem_copy_B, tCsB[None, None, k], tCrB_v[None, None, k])
        cute.gemm(tiled_mma, acc, tCrA[None, None, k], tCrB[None, None, k], acc)
