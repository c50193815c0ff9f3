"""Views that pack the query heads of one kv head into the row mode (GQA packing).

With r = Hq / Hkv, packed row m = s * r + j stands for query position s of head
kv_head * r + j. Folding the head mode into the row mode as ((r, S), ..., Hkv)
with strides ((head stride, row stride), ..., r * head stride) lets one M tile
cover r heads that read the same K/V, and lets an integer row index address the
right head: a coordinate m on the mode (r, S) is (m % r, m // r).
"""

from __future__ import annotations

import cutlass.cute as cute


def pack_heads(t: cute.Tensor, r: int, head_mode: int) -> cute.Tensor:
    """(S, ..., H, ...) -> ((r, S), ..., H / r, ...): a view, no data moves."""
    shape, stride = list(t.shape), list(t.stride)
    h_stride = stride[head_mode]
    new_shape = [(r, shape[0])] + shape[1:]
    new_stride = [(h_stride, stride[0])] + stride[1:]
    new_shape[head_mode] = shape[head_mode] // r
    new_stride[head_mode] = h_stride * r
    return cute.make_tensor(t.iterator, cute.make_layout(tuple(new_shape), stride=tuple(new_stride)))


def rows_extent(t: cute.Tensor, packed: bool):
    """The sequence extent of a (possibly packed) kernel view's row mode."""
    return t.shape[0][1] if packed else t.shape[0]
