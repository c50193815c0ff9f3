"""The blocked dQ accumulator: every warp reduction of the main kernel covers whole cache lines.

Traced on the CPU (no kernel runs): the dQ MMA's accumulator partition of each lane of a warp, mapped
through `blocked_layout`, for the default knobs of every tuned head dim, a few padded ones, and each
family. Each 8-byte reduction (a fragment register pair) of the 32 lanes must fill one aligned 256-byte
block, and the layout must place every (row, column) of the tile once. A tile padded past the head dim
(d=72 on 96 columns) skips the pairs of its padding columns: a whole warp's pair is in or out.
"""

from __future__ import annotations

import pytest

from frost.engines.sm80.sdpa_bwd_params import Sm80BwdParams
from frost.engines.sm80.sdpa_fwd_params import TUNED_HEAD_DIMS
from test.traced_bwd import FAMILIES, PADDED_HEAD_DIMS, default_params, trace_main

pytestmark = pytest.mark.slow


def _warp_offsets(p: Sm80BwdParams):
    """[lane][value] -> accumulator offset of warp 0's dQ fragment, rows of two query tiles (None for a value
    in the padding columns of a padded tile, which the kernel never adds)."""
    import cutlass.cute as cute

    from frost.engines.sdpa_bwd.accum import blocked_layout

    out = []

    def collect(m):  # plain Python: the loops run at trace time
        rows = 2 * m.bm
        d = p.head_dim
        layout = blocked_layout(rows, d, m.d)  # the kernel's view: m.d (the tile's) columns of a d-wide buffer
        tile = cute.make_identity_tensor((m.bm, m.d))
        for lane in range(32):
            frag = m.mma_dq.get_slice(lane).partition_C(tile)
            offs = []
            for i in range(int(cute.size(frag))):
                r, c = frag[i]
                inside = int(c) < d
                offs.append(int(cute.crd2idx((int(r) + m.bm, int(c)), layout)) if inside else None)
            out.append(offs)
        all_offs = {int(cute.crd2idx((r, c), layout)) for r in range(rows) for c in range(d)}
        out.append(sorted(all_offs))

    trace_main(p, collect)
    return out[:32], out[32]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("d,dv", TUNED_HEAD_DIMS + PADDED_HEAD_DIMS)
def test_each_warp_reduction_fills_whole_lines(family, d, dv):
    p = default_params(family, d, dv)
    lanes, all_offs = _warp_offsets(p)
    rows = 2 * p.tile_m
    assert all_offs == list(range(rows * d))  # a bijection onto the compact buffer
    n_vals = len(lanes[0])
    for i in range(0, n_vals, 2):  # one 8-byte reduction per register pair
        pair = [(lane[i], lane[i + 1]) for lane in lanes]
        skipped = [a is None or b is None for a, b in pair]
        if any(skipped):  # padding columns: the whole warp skips the pair, both values
            assert all(a is None and b is None for a, b in pair), f"value pair {i}: the warp splits on padding"
            continue
        assert all(b == a + 1 for a, b in pair), "a register pair must be two adjacent floats"
        start = min(a for a, _ in pair)
        assert start % 64 == 0 and sorted(x for ab in pair for x in ab) == list(range(start, start + 64)), (
            f"value pair {i}: the warp's reduction is not one aligned 256-byte block"
        )
