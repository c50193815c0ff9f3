"""The FLOP convention every TFLOP/s number in a frost report uses.

Forward: 4*B*H*Sq*Skv*D, or 2*B*H*Sq*Skv*(Dqk+Dv) when the head dims differ;
halved when causal; summed over sequences for packed (THD) batches.
Backward counts 2.5x the forward.
"""

from __future__ import annotations

from typing import Iterable

BWD_FACTOR = 2.5


def sdpa_pair_flops(heads: int, seqlen_q: int, seqlen_kv: int, d_qk: int, d_v: int, causal: bool) -> float:
    """Forward FLOPs of one sequence (all query heads)."""
    f = 2.0 * heads * seqlen_q * seqlen_kv * (d_qk + d_v)
    return f / 2.0 if causal else f


def sdpa_flops(
    *,
    heads: int,
    d_qk: int,
    d_v: int | None = None,
    causal: bool = False,
    direction: str = "fwd",
    batch: int = 1,
    seqlen_q: int = 0,
    seqlen_kv: int | None = None,
    seqlens_q: Iterable[int] | None = None,
    seqlens_kv: Iterable[int] | None = None,
) -> float:
    """FLOPs of one SDPA call: dense (batch x seqlen) or packed (per-sequence lengths)."""
    d_v = d_qk if d_v is None else d_v
    if seqlens_q is not None:
        sq = list(seqlens_q)
        skv = sq if seqlens_kv is None else list(seqlens_kv)
        if len(sq) != len(skv):
            raise ValueError("seqlens_q and seqlens_kv must have the same number of sequences")
        fwd = sum(sdpa_pair_flops(heads, a, b, d_qk, d_v, causal) for a, b in zip(sq, skv))
    else:
        skv1 = seqlen_q if seqlen_kv is None else seqlen_kv
        fwd = batch * sdpa_pair_flops(heads, seqlen_q, skv1, d_qk, d_v, causal)
    if direction == "fwd":
        return fwd
    if direction == "bwd":
        return BWD_FACTOR * fwd
    raise ValueError(f"direction must be 'fwd' or 'bwd', not {direction!r}")


def tflops(flops: float, ms: float | None) -> float | None:
    """TFLOP/s of `flops` done in `ms` milliseconds (None when there is no time)."""
    if ms is None or ms <= 0:
        return None
    return flops / (ms * 1e-3) / 1e12
