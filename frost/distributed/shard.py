"""Splitting a sequence over ranks head-tail, and putting it back together (see `layout.py` for the order)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from frost.distributed.comm import all_gather
from frost.distributed.layout import Shards, host_lengths


def _shards(x, dim: int, world: int, cu_seqlens) -> Shards:
    return Shards(tuple(host_lengths(cu_seqlens)) if cu_seqlens is not None else (x.shape[dim],), world)


def shard_positions(seq_len: int, *, rank: int, world: int) -> torch.Tensor:
    """The global positions of rank's local tokens of a sequence of `seq_len` (for position embeddings)."""
    return torch.tensor(Shards((seq_len,), world).natural_index(rank), dtype=torch.int64)


def shard_sequence(x: torch.Tensor, *, rank: int, world: int, dim: int = 2, cu_seqlens=None) -> torch.Tensor:
    """Rank's head-tail share of x along `dim` (dense (B, H, S, D): dim 2); packed (T, H, D) with the global
    `cu_seqlens` (B+1 prefix sums on the host: a list or a CPU tensor): dim 0, each document split on its own
    (its local prefix sums: `local_cu_seqlens`). Each length must be a multiple of 2 * world."""
    idx = _shards(x, dim, world, cu_seqlens).natural_index(rank)
    return x.index_select(dim, torch.tensor(idx, dtype=torch.int64, device=x.device))


def local_cu_seqlens(cu_seqlens, world: int) -> torch.Tensor:
    """Every rank's int32 prefix sums of its share of a packed batch (each document holds L / world tokens), on
    the host from host prefix sums (what `context_parallel_attention` takes); copy them to the device for kernels
    of your own."""
    cu = [0]
    for n in host_lengths(cu_seqlens):
        cu.append(cu[-1] + n // world)
    return torch.tensor(cu, dtype=torch.int32)


def unshard_sequence(x: torch.Tensor, *, group=None, dim: int = 2, cu_seqlens=None) -> torch.Tensor:
    """The whole sequence from every rank's share (all_gather_into_tensor), in natural order; the inverse of
    `shard_sequence` with the same `dim` and global `cu_seqlens`. Not differentiable."""
    world = dist.get_world_size(group)
    moved = x.movedim(dim, 0)
    parts = all_gather(moved, group)
    shards = _shards(parts, 0, world, cu_seqlens)
    order = shards.shard_order()
    natural = torch.empty(len(order), dtype=torch.int64)
    natural[torch.tensor(order)] = torch.arange(len(order))
    return parts.index_select(0, natural.to(x.device)).movedim(0, dim)
