"""Where the mma.sync forward's query tiles read Q and write O and Stats, traced on the CPU (nothing compiles for
a GPU or runs): the kernel's own `query_rows` / `row_values` views over identity tensors, so each element reads
as its coordinate. With GQA packing (r query heads per KV group), tile row m of KV group g stands for query
position m // r of query head g * r + m % r; in packed batches (frost's packed form, cuDNN's ragged form) positions
count from the sequence's first token. Without packing a tile reads one head's rows."""

from __future__ import annotations

import pytest

from frost.engines.sm80.sdpa_fwd_params import Sm80FwdParams

HQ, HKV, D, TILE_M = 8, 2, 64, 64
R = HQ // HKV
BATCH, GROUP, FIRST = 1, 1, 37  # the batch entry, KV group (or query head unpacked) and first token traced


def _traced(p: Sm80FwdParams, m_block: int):
    """{(tile row, column): coordinate} of query tile `m_block`'s Q view (`query_rows`) and {tile row: coordinate}
    of its Stats view (`row_values`), over identity tensors of canonical shape."""
    import cutlass.cute as cute

    from frost.engines.sm80.sdpa_fwd import SdpaFwdSm80

    kernel = SdpaFwdSm80(p)
    q_at, lse_at = {}, {}

    def collect():  # plain Python: its loops run at trace time over static values
        if p.is_thd:
            mQ, mLSE = cute.make_identity_tensor((300, HQ, D)), cute.make_identity_tensor((HQ, 300))
        else:
            mQ, mLSE = cute.make_identity_tensor((3, 100, HQ, D)), cute.make_identity_tensor((3, HQ, 100))
        tile = cute.local_tile(kernel.query_rows(mQ, GROUP, BATCH, FIRST, D), (TILE_M, D), (m_block, 0))
        rows = kernel.row_values(mLSE, GROUP, BATCH, FIRST)
        for m in range(TILE_M):
            lse_at[m] = tuple(rows[m_block * TILE_M + m])
            for c in (0, 5, D - 1):
                q_at[m, c] = tuple(tile[m, c])

    @cute.jit
    def trace():
        collect()

    cute.compile(trace)
    return q_at, lse_at


def _want(p: Sm80FwdParams, m_block: int, m: int, c: int):
    """(Q coordinate, Stats coordinate) tile row m of `m_block` must address."""
    i = m_block * TILE_M + m
    pos, head = (i // R, GROUP * R + i % R) if p.pack_gqa else (i, GROUP)
    if p.is_thd:
        return (FIRST + pos, head, c), (head, FIRST + pos)
    return (BATCH, pos, head, c), (BATCH, head, pos)


@pytest.mark.parametrize("thd", [False, True])
@pytest.mark.parametrize("pack", [False, True])
def test_each_query_tile_row_addresses_its_position_and_head(thd, pack):
    p = Sm80FwdParams(
        head_dim=D, head_dim_v=D, num_heads_q=HQ, num_heads_kv=HKV, tile_m=TILE_M, is_thd=thd, pack_gqa=pack
    )
    for m_block in (0, 2):
        q_at, lse_at = _traced(p, m_block)
        for (m, c), got in q_at.items():
            want_q, want_lse = _want(p, m_block, m, c)
            assert got == want_q, (m_block, m, c, got, want_q)
            assert lse_at[m] == want_lse, (m_block, m, lse_at[m], want_lse)
