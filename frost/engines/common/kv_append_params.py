"""Params of the KV-cache append kernel (no cutlass import: planning reads this module).

A serving step writes its new keys and values into the cache before attending over it: for each sequence b and
new token s, K_new[b, s] lands at position cache_seqlens[b] + s of sequence b's cache (a contiguous cache
(B, S_cache, H, D), or a paged one (num_blocks, block_size, H, D) through the block table (B, max_blocks)), and
the kernel writes the lengths the attention then reads: seq_len_kv[b] = cache_seqlens[b] + S_new and
seq_len_q[b] = S_q. Call signature: ``fn(k_new, v_new, k_cache, v_cache, table, cache_seqlens, seq_len_q,
seq_len_kv, cache_len, s_q, stream)``; a contiguous cache's `table` and a scalar length's `cache_seqlens` are
stand-ins the kernel never reads (any int32 tensors of their shapes).
"""

from __future__ import annotations

from typing import Literal

from frost.engines.params import TemplateParams
from frost.errors import TemplateParamsError


class KvAppendParams(TemplateParams):
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    head_dim: int = 128
    head_dim_v: int = 128
    paged: bool = False  # through a block table (else a contiguous (B, S_cache, H, D) cache)
    seqlens_tensor: bool = True  # cache_seqlens per sequence in a device tensor (else one runtime scalar)


def validate(p: KvAppendParams) -> None:
    if p.head_dim < 1 or p.head_dim_v < 1:
        raise TemplateParamsError(f"kv append: head dims must be >= 1, got {p.head_dim} / {p.head_dim_v}")


def reference_append(
    k_new, v_new, k_cache, v_cache, table, cache_seqlens, cache_len: int, s_q: int, seq_len_q, seq_len_kv
) -> None:
    """The kernel's contract in torch (the CPU path, and the tests' model): the same writes, host-indexed."""
    import torch

    batch, s_new = k_new.shape[0], k_new.shape[1]
    lens = cache_seqlens.tolist() if cache_seqlens is not None else [cache_len] * batch
    capacity = k_cache.shape[1] * (table.shape[1] if table is not None else 1)
    for b in range(batch):
        start = min(max(int(lens[b]), 0), capacity)  # clamped as the kernel clamps a device-read length
        if table is not None:
            bs = k_cache.shape[1]
            for s in range(s_new):
                pos = start + s
                if pos // bs >= table.shape[1]:
                    continue  # past the table's row: dropped, as the kernel drops it
                blk = int(table[b, pos // bs])
                if not 0 <= blk < k_cache.shape[0]:
                    continue  # a block outside the container: dropped, as the kernel drops it
                k_cache[blk, pos % bs] = k_new[b, s]
                v_cache[blk, pos % bs] = v_new[b, s]
        elif s_new:
            end = min(start + s_new, k_cache.shape[1])  # past the cache's end: dropped, as the kernel drops it
            k_cache[b, start:end] = k_new[b, : max(end - start, 0)]
            v_cache[b, start:end] = v_new[b, : max(end - start, 0)]
        seq_len_kv[b] = start + s_new
    seq_len_q.copy_(torch.full_like(seq_len_q, s_q))
