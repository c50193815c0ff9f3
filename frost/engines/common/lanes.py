"""Butterfly all-reduces over a power-of-two group of consecutive lanes.

A row of an mma.sync or wgmma accumulator lives on a quad of lanes; the
backward's helper kernels also reduce a row over a few lanes or a whole warp.
Offsets run upward (1, 2, 4, ...), so every caller sums in the same order and
every lane ends with the group's result.
"""

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32


@cute.jit
def lanes_allreduce_max(x: Float32, lanes: cutlass.Constexpr[int] = 4) -> Float32:
    """Max over `lanes` consecutive lanes (a power of two); every lane gets it."""
    for i in cutlass.range_constexpr(int(math.log2(lanes))):
        x = cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=1 << i))
    return x


@cute.jit
def lanes_allreduce_sum(x: Float32, lanes: cutlass.Constexpr[int] = 4) -> Float32:
    """Sum over `lanes` consecutive lanes (a power of two); every lane gets it."""
    for i in cutlass.range_constexpr(int(math.log2(lanes))):
        x = x + cute.arch.shuffle_sync_bfly(x, offset=1 << i)
    return x
