"""`context_parallel_attention`: one sequence split over the ranks of a process group, with autograd."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch.distributed as dist

from frost.distributed.all_gather import AllGatherAttention
from frost.distributed.layout import Shards, host_lengths, indices
from frost.distributed.ring import RingAttention
from frost.distributed.ulysses import UlyssesAttention

SCHEMES = {"ring": RingAttention, "all_gather": AllGatherAttention, "ulysses": UlyssesAttention}


@dataclass
class Call:
    """What every scheme needs of one call: the group, the geometry's index tensors, the mask, the numerics."""

    group: object
    rank: int
    world: int
    ix: dict
    scale: float
    causal: bool
    band: tuple
    deterministic: bool


def _window(causal: bool, window, scheme: str) -> tuple[int, int]:
    """(left, right) in FlashAttention's convention, -1 unbounded; causal means right = 0."""
    left, right = (-1, -1) if window is None else (-1 if w is None else int(w) for w in window)
    if causal:
        if right not in (-1, 0):
            raise ValueError(f"causal attention takes window=(left, 0 or None); got {window!r}")
        right = 0
    if scheme == "ring" and left >= 0:
        raise NotImplementedError(
            "context parallel: sliding windows run on scheme='all_gather' (a chunk's keys "
            "are one range) or 'ulysses'; the ring does not take them"
        )
    if scheme == "all_gather" and left >= 0 and right != 0:
        raise NotImplementedError(
            "context parallel: the all_gather scheme takes causal sliding windows "
            "(left, 0); other bands run on scheme='ulysses'"
        )
    return left, right


def _repeat_kv(q, k, v, world: int):
    """Ulysses scatters heads: K/V heads repeated (GQA groups kept) until their count divides by the world."""
    hq, hk = q.shape[1], k.shape[1]
    if hq % world:
        raise ValueError(
            f"context parallel: scheme='ulysses' needs the query heads ({hq}) divisible by the world size ({world})"
        )
    rep = world // math.gcd(hk, world)
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return k, v


def context_parallel_attention(
    q,
    k,
    v,
    *,
    group=None,
    scheme: str = "ring",
    causal: bool = False,
    window=None,
    scale: Optional[float] = None,
    sinks=None,
    deterministic: bool = False,
    cu_seqlens=None,
    return_lse: bool = False,
):
    """Attention over a sequence split head-tail over the ranks of `group` (`shard_sequence`), differentiable.

    Dense: q (B, Hq, S_local, D), k/v (B, Hkv, S_local, D/Dv), this rank's share of every batch entry.
    Packed: q (T_local, Hq, D), k/v (T_local, Hkv, D/Dv) with `cu_seqlens` this rank's (B+1) prefix sums on the
    host, a list or a CPU tensor (each document split on its own: `local_cu_seqlens`); a device tensor is a
    ValueError, never read. Hq a multiple of Hkv.
    scheme: "ring" (K/V passed around, fp32 merge), "all_gather" (K/V gathered; causal sliding windows) or
    "ulysses" (heads scattered; any window). causal / window=(left, right) / scale (1/sqrt(D)) / sinks (one
    fp32 logit per query head, counted once) / deterministic (bitwise reproducible backward) as in
    `frost.torch_face.attention`. Gradients of q, k, v are this rank's; that of sinks is this rank's share
    (sum it over the group with the other parameters' gradients).
    Returns out like q (and with `return_lse`, fp32 lse (B, Hq, S_local), packed (Hq, T_local)).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {sorted(SCHEMES)}; got {scheme!r}")
    local_lengths = host_lengths(cu_seqlens) if cu_seqlens is not None else None  # before any collective
    group = group if group is not None else dist.group.WORLD
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    left, right = _window(causal, window, scheme)
    causal = causal or right == 0  # a band that ends at the diagonal is causal
    packed = cu_seqlens is not None
    want = 3 if packed else 4
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != want or t.dtype != q.dtype:
            raise ValueError(
                f"context parallel: {name} must be {'packed (T, H, D)' if packed else '(B, H, S, D)'} "
                f"in q's dtype; got {tuple(t.shape)} {t.dtype}"
            )
    if packed:
        shards = Shards.from_local(local_lengths, world)
        tq, tk, tv = q.contiguous(), k.contiguous(), v.contiguous()
    else:
        b, _, s_local, _ = q.shape
        shards = Shards((s_local * world,) * b, world)
        tq, tk, tv = (t.permute(0, 2, 1, 3).reshape(b * s_local, t.shape[1], t.shape[3]) for t in (q, k, v))
    if scheme == "ulysses":
        tk, tv = _repeat_kv(tq, tk, tv, world)
    band = {
        "ring": (-1, 0 if causal else -1, False),
        "all_gather": (left, 0, True) if causal else (-1, -1, False),
        "ulysses": (left, right, False),
    }[scheme]
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    call = Call(
        group, rank, world, indices(shards, rank, q.device, causal, left), scale, causal, band, bool(deterministic)
    )
    sinks = sinks.float() if sinks is not None else None
    out, lse = SCHEMES[scheme].apply(tq, tk, tv, sinks, call)
    if not packed:
        out = out.view(b, s_local, *out.shape[1:]).permute(0, 2, 1, 3)
        lse = lse.view(lse.shape[0], b, s_local).permute(1, 0, 2)
    return (out, lse) if return_lse else out
