"""Views of MMA accumulator fragments as (rows, cols) tensors.

The softmax and mask helpers work on a (rows, cols) view of a thread's
accumulator, so they serve any accumulator whose per-thread values come in
(2 columns) x (2 rows) atoms: mma.sync m16n8 fragments ((2, 2), MMA_M, MMA_N)
and wgmma fragments ((2, 2, V), MMA_M, MMA_N).
"""

import cutlass
import cutlass.cute as cute


@cute.jit
def acc_mn_layout(acc_layout: cute.Layout) -> cute.Layout:
    """((2, 2[, V]), M, N) -> ((2, M), (2[, V], N)): rows first, columns second."""
    acc_col = cute.make_layout(acc_layout.shape)
    v = acc_col.shape[0]
    if cutlass.const_expr(cute.rank(v) == 2):
        mn = cute.make_layout(
            ((v[1], acc_col.shape[1]), (v[0], acc_col.shape[2])),
            stride=((acc_col.stride[0][1], acc_col.stride[1]), (acc_col.stride[0][0], acc_col.stride[2])),
        )
    else:
        mn = cute.make_layout(
            ((v[1], acc_col.shape[1]), (v[0], v[2], acc_col.shape[2])),
            stride=(
                (acc_col.stride[0][1], acc_col.stride[1]),
                (acc_col.stride[0][0], acc_col.stride[0][2], acc_col.stride[2]),
            ),
        )
    return cute.composition(acc_layout, mn)


@cute.jit
def acc_as_mn(acc: cute.Tensor) -> cute.Tensor:
    """The (rows, cols) view of an accumulator (or of its coordinate tensor)."""
    return cute.make_tensor(acc.iterator, acc_mn_layout(acc.layout))


@cute.jit
def acc_as_operand_a(acc: cute.Tensor) -> cute.Tensor:
    """Reuse an m16n8k16 accumulator (4, M, N) as the A fragment ((4, 2), M, N / 2).

    Two neighbouring n8 accumulator tiles form one k16 A tile, so P can feed
    P.V straight from registers.
    """
    div = cute.logical_divide(acc.layout, (None, None, 2))
    lay = cute.make_layout(
        ((div.shape[0], div.shape[2][0]), div.shape[1], div.shape[2][1]),
        stride=((div.stride[0], div.stride[2][0]), div.stride[1], div.stride[2][1]),
    )
    return cute.make_tensor(acc.iterator, lay)


def transpose_view(t: cute.Tensor) -> cute.Tensor:
    """(M, N[, S]) smem tensor viewed as (N, M[, S]) (flat modes)."""
    m, n = cute.size(t, mode=[0]), cute.size(t, mode=[1])
    if cute.rank(t) == 3:
        return cute.composition(t, cute.make_layout((n, m, cute.size(t, mode=[2])), stride=(m, 1, m * n)))
    return cute.composition(t, cute.make_layout((n, m), stride=(m, 1)))
