"""Random device inputs for one workload, in several rotated buffer sets.

Storage is token-major: dense tensors are (B, S, H, D) (BSHD physical), packed
ones (T, H, D). Values are standard normal, never zeros. Enough sets are made
that their total exceeds the L2 cache (where one set does not already), so a
timed loop that rotates through them does not run out of a warm cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from frost.bench.workloads import Workload

TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def torch_dtype(name: str):
    import torch

    return getattr(torch, TORCH_DTYPES[name])


@dataclass
class BufferSet:
    q: object
    k: object
    v: object
    do: object = None  # bwd only, shaped like o
    table: object = None  # paged: int32 (B, max_blocks) block table (k and v are the caches)


@dataclass
class Inputs:
    workload: Workload
    sets: list
    cu_seqlens: object = None  # THD: int32 (B+1,) prefix sums on the device (shared by q and kv)
    seqused_q: object = None  # paged: int32 (B,) query rows per sequence
    seqused_k: object = None  # paged: int32 (B,) keys per sequence

    @property
    def o_shape(self) -> tuple:
        w = self.workload
        if w.is_thd:
            return (w.total_q, w.heads_q, w.d_v)
        return (w.batch, w.seqlen_q, w.heads_q, w.d_v)


def buffer_count(set_bytes: int, l2_bytes: int, max_sets: int, l2_multiple: float = 2.0) -> int:
    """How many sets to rotate so that together they exceed `l2_multiple` x L2."""
    if l2_bytes <= 0 or set_bytes <= 0:
        return 1
    need = math.ceil(l2_multiple * l2_bytes / set_bytes)
    return max(1, min(max_sets, need))


def qkv_shapes(w: Workload) -> tuple[tuple, tuple, tuple, tuple]:
    """q, k, v, o storage shapes; paged k and v are the caches (num_blocks, block_size, H_kv, D)."""
    if w.is_paged:
        return (
            (w.batch, w.seqlen_q, w.heads_q, w.d_qk),
            (w.num_blocks, w.block_size, w.heads_kv, w.d_qk),
            (w.num_blocks, w.block_size, w.heads_kv, w.d_v),
            (w.batch, w.seqlen_q, w.heads_q, w.d_v),
        )
    if w.is_thd:
        return (
            (w.total_q, w.heads_q, w.d_qk),
            (w.total_kv, w.heads_kv, w.d_qk),
            (w.total_kv, w.heads_kv, w.d_v),
            (w.total_q, w.heads_q, w.d_v),
        )
    return (
        (w.batch, w.seqlen_q, w.heads_q, w.d_qk),
        (w.batch, w.seqlen_kv, w.heads_kv, w.d_qk),
        (w.batch, w.seqlen_kv, w.heads_kv, w.d_v),
        (w.batch, w.seqlen_q, w.heads_q, w.d_v),
    )


def cu_seqlens_of(lengths) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + int(n))
    return out


def make_inputs(w: Workload, n_sets: int, device, seed: int = 0) -> Inputs:
    import torch

    dt = torch_dtype(w.dtype)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    qs, ks, vs, os_ = qkv_shapes(w)
    sets = []
    for _ in range(n_sets):

        def rnd(shape):
            return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dt)

        table = None
        if w.is_paged:  # each sequence's blocks scattered over the cache
            perm = torch.randperm(w.num_blocks - 1, generator=gen, device=device)
            table = perm.reshape(w.batch, w.blocks_per_seq).to(torch.int32)
        sets.append(
            BufferSet(q=rnd(qs), k=rnd(ks), v=rnd(vs), do=rnd(os_) if w.direction == "bwd" else None, table=table)
        )
    cu = lens_q = lens_k = None
    if w.is_thd:
        cu = torch.tensor(cu_seqlens_of(w.seqlens), dtype=torch.int32, device=device)
    if w.is_paged:
        lens_q = torch.full((w.batch,), w.seqlen_q, dtype=torch.int32, device=device)
        lens_k = torch.full((w.batch,), w.seqlen_kv, dtype=torch.int32, device=device)
    return Inputs(workload=w, sets=sets, cu_seqlens=cu, seqused_q=lens_q, seqused_k=lens_k)
