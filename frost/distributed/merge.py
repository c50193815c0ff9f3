"""Merging partial attention results in fp32: two blocks of keys seen by the same query rows combine exactly
through their log-sum-exps, so the merge adds no error that grows with the number of blocks."""

from __future__ import annotations

import torch


def merge(o_a, lse_a, o_b, lse_b):
    """(o, lse) of rows that saw the keys of both blocks. o_* (T, H, Dv), lse_* (H, T); fp32 results.
    A row that saw no key in either (-inf, -inf) stays O = 0, LSE = -inf."""
    lse_a, lse_b = lse_a.float(), lse_b.float()
    lse = torch.logaddexp(lse_a, lse_b)
    finite = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    w_a = torch.exp(lse_a - finite).t().unsqueeze(-1)
    w_b = torch.exp(lse_b - finite).t().unsqueeze(-1)
    return o_a.float() * w_a + o_b.float() * w_b, lse


def merge_rows(o_acc, lse_acc, o_blk, lse_blk, rows=None) -> None:
    """Merge a block's (o, lse) into fp32 accumulators in place, on all rows or on the index tensor `rows`."""
    if rows is None:
        o, lse = merge(o_acc, lse_acc, o_blk, lse_blk)
        o_acc.copy_(o)
        lse_acc.copy_(lse)
        return
    o, lse = merge(o_acc.index_select(0, rows), lse_acc.index_select(1, rows), o_blk, lse_blk)
    o_acc.index_copy_(0, rows, o)
    lse_acc.index_copy_(1, rows, lse)
