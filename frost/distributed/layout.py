"""Host geometry of a head-tail split: which global tokens each rank holds, and the index lists the schemes use.

Each document of global length L is cut into 2W chunks of L / 2W tokens; rank r holds chunks r and 2W - 1 - r
(its head and its tail), in that order. Under a causal mask early chunks see few keys and late chunks many, so
every rank gets the same work. Dense batches are W-way splits of B documents of one length. Local token order:
document by document, each document's head chunk then its tail chunk ("local order"). Concatenating every
rank's local tokens, rank 0 first, gives the "shard order" that an all-gather or all-to-all produces.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch


def host_lengths(cu_seqlens) -> list[int]:
    """Per-document lengths from host prefix sums (a list of ints or a CPU tensor). The split's index lists are
    built on the host, so a device tensor is refused rather than read: execute never reads device memory."""
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.device.type != "cpu":
            raise ValueError(
                f"context parallel: cu_seqlens must be on the host (a list of ints or a CPU tensor), "
                f"got a tensor on {cu_seqlens.device}: the head-tail split is planned from the lengths "
                "on the host and frost never reads device memory to the host; pass the host prefix "
                "sums the batch was packed from (docs/context_parallel.md)"
            )
        cu_seqlens = cu_seqlens.tolist()
    cu = [int(x) for x in cu_seqlens]
    return [b - a for a, b in zip(cu[:-1], cu[1:])]


def _prefix(lengths) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + int(n))
    return out


@dataclass(frozen=True)
class Shards:
    """Global document lengths and the world size; every length a positive multiple of 2 * world."""

    lengths: tuple[int, ...]
    world: int

    def __post_init__(self):
        bad = [n for n in self.lengths if n <= 0 or n % (2 * self.world)]
        if bad:
            raise ValueError(
                f"context parallelism over {self.world} ranks splits each sequence into "
                f"{2 * self.world} equal chunks: lengths {bad} are not positive multiples of "
                f"{2 * self.world} (pad the documents)"
            )

    @staticmethod
    def from_local(local_lengths, world: int) -> "Shards":
        """From one rank's per-document local lengths (every rank holds L / W tokens of each document)."""
        return Shards(tuple(int(n) * world for n in local_lengths), world)

    @property
    def chunks(self) -> list[int]:
        return [n // (2 * self.world) for n in self.lengths]

    @property
    def cu_global(self) -> list[int]:
        return _prefix(self.lengths)

    @property
    def cu_local(self) -> list[int]:
        return _prefix(2 * c for c in self.chunks)

    @property
    def cu_chunks(self) -> list[int]:
        """Local tokens as one sequence per chunk: head of document 0, its tail, head of document 1, ..."""
        return _prefix(c for c in self.chunks for _ in range(2))

    @property
    def cu_halves(self) -> list[int]:
        """One chunk per document (the head chunks alone, or the tail chunks alone)."""
        return _prefix(self.chunks)

    def positions(self, rank: int) -> list[tuple[int, int]]:
        """Per local chunk in local order: (document, chunk index along the document)."""
        return [(d, p) for d in range(len(self.lengths)) for p in (rank, 2 * self.world - 1 - rank)]

    def natural_index(self, rank: int) -> list[int]:
        """Global packed positions of `rank`'s local tokens, in local order."""
        cu, out = self.cu_global, []
        for (d, p), c in zip(self.positions(rank), (c for c in self.chunks for _ in range(2))):
            out.extend(range(cu[d] + p * c, cu[d] + (p + 1) * c))
        return out

    def shard_order(self) -> list[int]:
        """Global packed position of each token in shard order (every rank's local tokens, rank 0 first)."""
        return [i for r in range(self.world) for i in self.natural_index(r)]

    def halves(self, tail: bool) -> list[int]:
        """Local indices of every head chunk (or every tail chunk), in document order."""
        cu = self.cu_local
        return [cu[d] + (c if tail else 0) + i for d, c in enumerate(self.chunks) for i in range(c)]

    def key_ranges(self, rank: int, *, causal: bool, left: int) -> list[tuple[int, int]]:
        """Per local chunk (local order): the global key range [k0, k1) its queries may see, sequence-local.
        Causal: keys up to the chunk's last query, from `left` before its first (-1: from 0); else every key."""
        out = []
        for (d, p), c in zip(self.positions(rank), (c for c in self.chunks for _ in range(2))):
            if not causal:
                out.append((0, self.lengths[d]))
                continue
            k0 = 0 if left < 0 else max(0, p * c - left)
            out.append((k0, (p + 1) * c))
        return out


@lru_cache(maxsize=256)
def indices(shards: Shards, rank: int, device: torch.device, causal: bool, left: int) -> dict:
    """Device index tensors and host envelopes for one rank, cached per geometry."""

    def t(x, dtype=torch.int64):
        return torch.tensor(x, dtype=dtype, device=device)

    order = shards.shard_order()
    to_shard = [0] * len(order)  # natural position -> shard-order index
    for i, n in enumerate(order):
        to_shard[n] = i
    cu_g = shards.cu_global
    ranges = shards.key_ranges(rank, causal=causal, left=left)
    keys, key_lens, head_rows, tail_rows = [], [], [], []
    for j, ((d, _), (k0, k1)) in enumerate(zip(shards.positions(rank), ranges)):
        rows = range(len(keys), len(keys) + k1 - k0)
        (tail_rows if j % 2 else head_rows).append(rows)
        keys.extend(to_shard[cu_g[d] + n] for n in range(k0, k1))
        key_lens.append(k1 - k0)
    i32 = torch.int32
    head_rows = [i for r in head_rows for i in r]
    tail_rows = [i for r in tail_rows for i in r]
    return dict(
        cu_global=t(cu_g, i32),
        cu_local=t(shards.cu_local, i32),
        cu_chunks=t(shards.cu_chunks, i32),
        cu_halves=t(shards.cu_halves, i32),
        cu_keys=t(_prefix(key_lens), i32),
        max_global=max(shards.lengths),
        max_local=2 * max(shards.chunks),
        max_chunk=max(shards.chunks),
        max_keys=max(key_lens),
        heads=t(shards.halves(False)),
        tails=t(shards.halves(True)),
        to_natural=t(to_shard),
        to_shard=t(order),
        keys=t(keys),
        key_head_rows=t(head_rows),
        key_tail_rows=t(tail_rows),
        key_head_src=t([keys[i] for i in head_rows]),
        key_tail_src=t([keys[i] for i in tail_rows]),
    )
