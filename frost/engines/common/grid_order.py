"""Which grid axis (x, y, z) of a backward main kernel walks key tiles, kv heads and batch entries.

Key tiles run fastest, then heads, then batch entries ("key"), except where the batch entries share one fp32
dBias accumulator ("batch", `SdpaBwdFeatureParams.grid_order`): the CTAs of one (key tile, head) then run side by
side for every batch entry, and their adds into an element meet in L2 instead of a batch's pass apart.
"""

import cutlass.cute as cute

GRID_AXES = {"key": ("key", "head", "batch"), "batch": ("batch", "key", "head")}


def axis(order: str, name: str) -> int:
    """The grid axis (0, 1, 2) that walks `name` ("key", "head" or "batch") in `order`."""
    return GRID_AXES[order].index(name)


def grid_shape(order: str, key, head, batch) -> list:
    """The launch grid of `order` for these extents."""
    extent = {"key": key, "head": head, "batch": batch}
    return [extent[a] for a in GRID_AXES[order]]


def block_coord(order: str, name: str):
    """This CTA's index along `name`."""
    return cute.arch.block_idx()[axis(order, name)]


def grid_extent(order: str, name: str):
    """The grid's extent along `name`."""
    return cute.arch.grid_dim()[axis(order, name)]
