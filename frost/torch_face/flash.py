"""Drop-in `flash_attn_func` / `flash_attn_varlen_func` with FlashAttention's signatures, on frost.

They serve what frost serves (softmax_scale, causal, window_size, deterministic, GQA, packed batches,
learnable sinks) and raise `UnsupportedArgumentError` naming any other argument that is set (dropout,
softcap, ALiBi, a block table under packed queries: `flash_attn_with_kvcache` serves paged caches). Masks
follow FlashAttention: aligned to the bottom-right diagonal (offset len_k - len_q), causal overriding the
window's right bound.

The log-sum-exp, as the peers give it: `return_attn_probs=True` returns `(out, softmax_lse, None)` as
FlashAttention 2 does (its third value, the dropout mask, exists only with dropout, which frost does not
serve); `return_lse=True` returns `(out, lse)` as FlashAttention 4 (`flash_attn.cute`) does. lse is fp32
(B, Hq, Sq) dense or (Hq, Tq) packed, natural log, sinks included, and carries no gradient.
`learnable_sink` (FlashAttention 4's keyword): one logit per query head, (Hq,), any float dtype; its
gradient flows (frost computes dSink).
"""

from __future__ import annotations

from typing import Optional

from frost.torch_face.api import attention, varlen_attention
from frost.torch_face.spec import reject


def _unserved(dropout_p, softcap, alibi_slopes, block_table=None) -> None:
    if dropout_p:
        reject("dropout_p", dropout_p, "attention dropout is not implemented (pass 0.0)")
    if softcap:
        reject("softcap", softcap, "logit soft-capping is not implemented (pass 0.0)")
    if alibi_slopes is not None:
        reject("alibi_slopes", "<tensor>", "ALiBi biases are not implemented")
    if block_table is not None:
        reject(
            "block_table",
            "<tensor>",
            "packed queries over a paged key/value cache are not served (cuDNN's graph has no ragged queries "
            "with paged caches); flash_attn_with_kvcache serves paged caches with (B, S_q, H, D) queries",
        )


def _returns(got, return_attn_probs, return_lse):
    """FlashAttention 2's (out, lse, None), FlashAttention 4's (out, lse), or out alone."""
    if not (return_attn_probs or return_lse):
        return got
    out, lse = got
    return (out, lse, None) if return_attn_probs else (out, lse)


def flash_attn_func(
    q,
    k,
    v,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size=(-1, -1),
    softcap: float = 0.0,
    alibi_slopes=None,
    deterministic: Optional[bool] = None,
    return_attn_probs: bool = False,
    *,
    learnable_sink=None,
    return_lse: bool = False,
):
    """q (B, Sq, Hq, D), k/v (B, Sk, Hkv, D) -> out (B, Sq, Hq, D), as FlashAttention's.

    `deterministic` defaults to `torch.are_deterministic_algorithms_enabled()`; `learnable_sink` and
    `return_lse` are keywords (FlashAttention 4 orders its positional arguments otherwise).
    """
    _unserved(dropout_p, softcap, alibi_slopes)
    got = attention(
        q,
        k,
        v,
        causal=causal,
        window=window_size,
        scale=softmax_scale,
        sinks=learnable_sink,
        deterministic=deterministic,
        layout="bshd",
        return_lse=bool(return_attn_probs or return_lse),
        diagonal_alignment="bottom_right",
        _causal_wins=True,
    )
    return _returns(got, return_attn_probs, return_lse)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size=(-1, -1),
    softcap: float = 0.0,
    alibi_slopes=None,
    deterministic: Optional[bool] = None,
    return_attn_probs: bool = False,
    block_table=None,
    *,
    learnable_sink=None,
    return_lse: bool = False,
):
    """q (Tq, Hq, D), k/v (Tk, Hkv, D), int32 cu_seqlens (B+1,) -> out (Tq, Hq, D), as FlashAttention's;
    lse (Hq, Tq) with `return_attn_probs` or `return_lse`."""
    _unserved(dropout_p, softcap, alibi_slopes, block_table)
    got = varlen_attention(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        causal=causal,
        window=window_size,
        scale=softmax_scale,
        sinks=learnable_sink,
        deterministic=deterministic,
        return_lse=bool(return_attn_probs or return_lse),
        diagonal_alignment="bottom_right",
        _causal_wins=True,
    )
    return _returns(got, return_attn_probs, return_lse)
