"""The block calls: frost's packed attention forward (O and LSE) and backward (given O and LSE), through the torch
face's ops. Every scheme computes its blocks here, so the choice of entry point lives in one place.

Packed tensors are (T, H, D); lse is fp32 (H, T); `band` is (window_left, window_right, bottom_right) in
FlashAttention's convention (-1 unbounded).
"""
from __future__ import annotations

import torch

import frost.torch_face  # noqa: F401  (registers torch.ops.frost.*)


def forward(q, k, v, cu_q, cu_k, max_q: int, max_k: int, sinks, scale: float, band, deterministic: bool):
    """-> (out (Tq, H, Dv) in q's dtype, lse (H, Tq) fp32)."""
    return torch.ops.frost.sdpa_varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, sinks, scale, *band, deterministic)


def backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q: int, max_k: int, sinks, scale: float, band,
             deterministic: bool):
    """-> (dq, dk, dv, dsinks or None); `out` and `lse` are used as given (a ring hands every block the merged
    ones)."""
    dq, dk, dv, dsinks = torch.ops.frost.sdpa_varlen_bwd(dout.contiguous(), q, k, v, out, lse.contiguous(), cu_q,
                                                         cu_k, max_q, max_k, sinks, scale, *band, deterministic)
    return dq, dk, dv, (dsinks if sinks is not None else None)
