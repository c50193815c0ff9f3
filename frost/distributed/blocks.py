"""The block calls: frost's packed attention forward (O and LSE) and backward (given O and LSE), through the torch
face's ops. Every scheme computes its blocks here, so the choice of entry point lives in one place.

Packed tensors are (T, H, D); lse is fp32 (H, T); `band` is (window_left, window_right, bottom_right) in
FlashAttention's convention (-1 unbounded).
"""

from __future__ import annotations

import torch

from frost.torch_face import ops  # registers torch.ops.frost.*


def _lean(*tensors) -> bool:
    """Inside the schemes' autograd Functions (grad mode off) in eager mode: call the ops' kernels directly."""
    return not torch.is_grad_enabled() and ops.lean(*tensors)


def forward(q, k, v, cu_q, cu_k, max_q: int, max_k: int, sinks, scale: float, band, deterministic: bool):
    """-> (out (Tq, H, Dv) in q's dtype, lse (H, Tq) fp32); the op's kernel itself where nothing traces or records
    gradients (`_lean`: no dispatcher per ring step), the op otherwise."""
    fwd = ops.sdpa_varlen_fwd if _lean(q, k, v, sinks) else torch.ops.frost.sdpa_varlen_fwd
    return fwd(q, k, v, cu_q, cu_k, max_q, max_k, sinks, scale, *band, deterministic)


def backward(
    dout, q, k, v, out, lse, cu_q, cu_k, max_q: int, max_k: int, sinks, scale: float, band, deterministic: bool
):
    """-> (dq, dk, dv, dsinks or None); `out` and `lse` are used as given (a ring hands every block the merged
    ones)."""
    bwd = ops.sdpa_varlen_bwd if _lean(dout, q, k, v, sinks) else torch.ops.frost.sdpa_varlen_bwd
    dq, dk, dv, dsinks = bwd(
        dout.contiguous(), q, k, v, out, lse.contiguous(), cu_q, cu_k, max_q, max_k, sinks, scale, *band, deterministic
    )
    return dq, dk, dv, (dsinks if sinks is not None else None)
