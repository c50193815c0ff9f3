"""Drop-in `flash_attn_func` / `flash_attn_varlen_func` with FlashAttention's signatures, on frost.

They serve what frost serves (softmax_scale, causal, window_size, deterministic, GQA, packed batches)
and raise `UnsupportedArgumentError` naming any other argument that is set (dropout, softcap, ALiBi,
attention probabilities, paged KV). Masks follow FlashAttention: aligned to the bottom-right diagonal
(offset len_k - len_q), causal overriding the window's right bound.
"""
from __future__ import annotations

from typing import Optional

from frost.torch_face.api import attention, varlen_attention
from frost.torch_face.spec import reject


def _unserved(dropout_p, softcap, alibi_slopes, return_attn_probs, block_table=None) -> None:
    if dropout_p:
        reject("dropout_p", dropout_p, "attention dropout is not implemented (pass 0.0)")
    if softcap:
        reject("softcap", softcap, "logit soft-capping is not implemented (pass 0.0)")
    if alibi_slopes is not None:
        reject("alibi_slopes", "<tensor>", "ALiBi biases are not implemented")
    if return_attn_probs:
        reject("return_attn_probs", return_attn_probs, "frost never materializes the attention matrix")
    if block_table is not None:
        reject("block_table", "<tensor>", "paged key/value caches are not implemented")


def flash_attn_func(q, k, v, dropout_p: float = 0.0, softmax_scale: Optional[float] = None, causal: bool = False,
                    window_size=(-1, -1), softcap: float = 0.0, alibi_slopes=None,
                    deterministic: Optional[bool] = None, return_attn_probs: bool = False):
    """q (B, Sq, Hq, D), k/v (B, Sk, Hkv, D) -> out (B, Sq, Hq, D), as FlashAttention's.

    `deterministic` defaults to `torch.are_deterministic_algorithms_enabled()`.
    """
    _unserved(dropout_p, softcap, alibi_slopes, return_attn_probs)
    return attention(q, k, v, causal=causal, window=window_size, scale=softmax_scale, deterministic=deterministic,
                     layout="bshd", diagonal_alignment="bottom_right", _causal_wins=True)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                           dropout_p: float = 0.0, softmax_scale: Optional[float] = None, causal: bool = False,
                           window_size=(-1, -1), softcap: float = 0.0, alibi_slopes=None,
                           deterministic: Optional[bool] = None, return_attn_probs: bool = False,
                           block_table=None):
    """q (Tq, Hq, D), k/v (Tk, Hkv, D), int32 cu_seqlens (B+1,) -> out (Tq, Hq, D), as FlashAttention's."""
    _unserved(dropout_p, softcap, alibi_slopes, return_attn_probs, block_table)
    return varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                            window=window_size, scale=softmax_scale, deterministic=deterministic,
                            diagonal_alignment="bottom_right", _causal_wins=True)
