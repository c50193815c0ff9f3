"""The pieces of frost.distributed that need no process group: the head-tail geometry and the fp32 merge."""

from __future__ import annotations

import pytest
import torch

from frost.distributed.layout import Shards
from frost.distributed.merge import merge, merge_rows


def test_head_tail_split_balances_causal_work_and_covers_every_token_once():
    shards = Shards((16, 32), world=4)
    seen = []
    for r in range(4):
        idx = shards.natural_index(r)
        seen += idx
        # causal work of a token = its position in its document + 1; every rank holds the same amount
        work = sum((i if i < 16 else i - 16) + 1 for i in idx)
        assert work == (16 * 17 // 2 + 32 * 33 // 2) // 4
    assert sorted(seen) == list(range(48)) and shards.shard_order() == seen
    assert shards.natural_index(1)[:4] == [2, 3, 12, 13]  # chunks 1 and 6 of the first document (chunk size 2)


def test_lengths_must_split_into_two_chunks_per_rank():
    with pytest.raises(ValueError, match="multiples of 4"):
        Shards((8, 6), world=2)


def test_causal_key_ranges_end_at_each_chunk_and_reach_back_by_the_window():
    shards = Shards((16,), world=2)  # chunks of 4: rank 0 holds chunks 0 and 3
    assert shards.key_ranges(0, causal=True, left=-1) == [(0, 4), (0, 16)]
    assert shards.key_ranges(0, causal=True, left=5) == [(0, 4), (7, 16)]
    assert shards.key_ranges(1, causal=False, left=-1) == [(0, 16), (0, 16)]


def test_merge_of_two_key_blocks_is_the_attention_over_both():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(6, 2, 4, generator=gen, dtype=torch.float64) for _ in range(3))

    def attend(ks, vs):
        s = torch.einsum("qhd,khd->hqk", q, ks)
        lse = torch.logsumexp(s, -1)
        return torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), vs), lse

    want_o, want_lse = attend(k, v)
    (o1, l1), (o2, l2) = attend(k[:2], v[:2]), attend(k[2:], v[2:])
    o, lse = merge(o1, l1, o2, l2)
    torch.testing.assert_close(o.double(), want_o, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-6, atol=1e-6)
    # rows that saw no key in a block (lse -inf) take the other block whole; rows that saw none stay empty
    empty = torch.full_like(l2, float("-inf"))
    o, lse = merge(o1, l1, torch.zeros_like(o2), empty)
    torch.testing.assert_close(o.double(), o1, rtol=1e-6, atol=1e-6)
    o, lse = merge(torch.zeros_like(o1), empty, torch.zeros_like(o2), empty)
    assert torch.equal(o, torch.zeros_like(o)) and torch.isneginf(lse).all()
    # in place, on a subset of rows
    acc_o, acc_lse = o1.float().clone(), l1.float().clone()
    rows = torch.tensor([1, 4])
    merge_rows(acc_o, acc_lse, o2[rows], l2[:, rows], rows)
    torch.testing.assert_close(acc_o[rows].double(), want_o[rows], rtol=1e-6, atol=1e-6)
    assert torch.equal(acc_o[0], o1[0].float())


def test_packed_lengths_are_taken_from_the_host_and_a_device_tensor_is_refused_unread():
    """The split is planned from host prefix sums; a tensor off the host (meta stands in for a GPU's: reading
    it would fail) is a ValueError naming the rule, raised before any process group is needed."""
    from frost.distributed import context_parallel_attention, local_cu_seqlens, shard_sequence
    from frost.distributed.layout import host_lengths

    assert host_lengths([0, 8, 24]) == host_lengths(torch.tensor([0, 8, 24], dtype=torch.int32)) == [8, 16]
    assert local_cu_seqlens([0, 8, 24], 2).tolist() == [0, 4, 12]
    on_device = torch.tensor([0, 8, 24], dtype=torch.int32, device="meta")
    q = torch.zeros(12, 2, 4)
    with pytest.raises(ValueError, match="cu_seqlens must be on the host.*meta"):
        context_parallel_attention(q, q, q, cu_seqlens=on_device)
    with pytest.raises(ValueError, match="cu_seqlens must be on the host"):
        shard_sequence(torch.zeros(24, 2, 4), rank=0, world=2, dim=0, cu_seqlens=on_device)
    with pytest.raises(ValueError, match="cu_seqlens must be on the host"):
        local_cu_seqlens(on_device, 2)
