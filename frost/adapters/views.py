"""Canonical views of bound tensors (see frost.engines.sdpa_args): strided views only.

The reference adapter computes on them; DSL kernels take io tensors and Stats as
declared (their jit entry views them) and only lengths and sinks pass through here.
"""

from __future__ import annotations


def io_view(t, is_thd: bool):
    """(B, H, S, D) -> (B, S, H, D); THD (T, H, D) stays."""
    return t if is_thd else t.permute(0, 2, 1, 3)


def stats_view(t, is_thd: bool):
    """(B, H, S, 1) -> (B, H, S); THD (T, H, 1) -> (H, T)."""
    return t[..., 0].t() if is_thd else t[..., 0]


def lengths_view(t):
    """(B,) or (B, 1, 1, 1) -> (B,)."""
    return t.reshape(t.shape[0]) if t.dim() != 1 else t


def sink_view(t):
    """(1, H, 1, 1) or (H,) -> (H,)."""
    return t.reshape(-1)
