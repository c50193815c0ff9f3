"""`attention(q, k, v, ...)` and `varlen_attention(...)`: frost as one call in a model.

Both are the custom ops of `ops.py` (autograd, torch.compile and CUDA graphs see one op). An eager
call with nothing to trace (`ops.lean`: not compiling, no mode, no functorch transform, no tensor
subclass) skips the dispatcher: without autograd it calls the ops' own kernel (`block.py`) directly,
with autograd it makes the op's autograd node directly (`ops.fwd_autograd`), whose backward calls the
backward kernel directly. The same plans and launches, fewer microseconds of host time; under
compile, functionalization, a mode or a subclass the op stays the path.

The eager inference path has two steps. A call whose exact argument signature (dims, strides and
dtypes of q, k and v, q's device, every other argument) was served before finds its memoized launch
(`block.EagerForward`) with one dict lookup, and only allocates its output and launches; any other
call takes the whole way (argument checks, copies of unservable layouts, the plan cache, every binding
check) and memoizes it when it needed no copy. Both give the same outputs and raise the same errors.
Without `return_lse` the eager forward plans without Stats: no lse is allocated or written (nobody
could see it).
"""

from __future__ import annotations

import enum
from typing import Optional

import torch

from frost.torch_face import block, ops
from frost.torch_face.spec import band, check_scale, reject

_lean = ops.lean
_grad_enabled = torch._C.is_grad_enabled
_memo = block.PLANS.memo
_MEMO_SCALARS = (bool, int, float, str, type(None))


def _memoizable(causal, window, scale, diagonal_alignment, return_lse, causal_wins) -> bool:
    """Arguments a memo key may hold: plain values (never a tensor, which would be kept alive and compared)."""
    plain = _MEMO_SCALARS
    return (
        type(causal) in plain
        and type(scale) in plain
        and type(return_lse) in plain
        and type(causal_wins) in plain
        and isinstance(diagonal_alignment, (str, enum.Enum))
        and (window is None or (type(window) is tuple and all(type(w) in plain for w in window)))
    )


def _deterministic(deterministic) -> bool:
    return torch.are_deterministic_algorithms_enabled() if deterministic is None else bool(deterministic)


def _sinks(sinks, heads_q):
    """Sinks as frost takes them: fp32 (Hq,), contiguous (a differentiable cast, so a bf16 parameter learns)."""
    if sinks is None:
        return None
    if sinks.dim() != 1 or sinks.shape[0] != heads_q:
        raise ValueError(f"sinks must be one value per query head, shape ({heads_q},); got {tuple(sinks.shape)}")
    return sinks.float().contiguous()


def _check_dense(q, k, v) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, S, H, D) or (B, H, S, D); got shape {tuple(t.shape)}")


def _needs_grad(*tensors) -> bool:
    return _grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def attention(
    q,
    k,
    v,
    *,
    causal: bool = False,
    window=None,
    scale: Optional[float] = None,
    sinks=None,
    deterministic: Optional[bool] = None,
    layout: str = "bhsd",
    return_lse: bool = False,
    diagonal_alignment: str = "top_left",
    dropout_p: float = 0.0,
    _causal_wins: bool = False,
):
    """Scaled dot-product attention on frost; differentiable, torch.compile- and CUDA-graph-safe.

    q (B, Hq, Sq, D), k/v (B, Hkv, Skv, D/Dv) with `layout="bhsd"` (torch's order, the default), or
    (B, S, H, D) with `layout="bshd"` (FlashAttention's); any memory layout frost serves (others are
    copied to contiguous first). Hq must be a multiple of Hkv (GQA/MQA).

    causal: keep keys j <= i (+ offset). window=(left, right): keep i - left <= j <= i + right, None or
    -1 unbounded, relative to the `diagonal_alignment` ("top_left" or "bottom_right": offset Skv - Sq).
    scale: default 1/sqrt(D). sinks: one logit per query head (learnable). deterministic: bitwise
    reproducible gradients; default `torch.are_deterministic_algorithms_enabled()`.
    Returns out in q's order and layout, and with `return_lse` also lse fp32 (B, Hq, Sq).
    """
    lean = _lean(q, k, v)  # views and copies below keep what it looked at
    grad = lean and _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    key = None
    if lean and sinks is None and not dropout_p:
        try:
            key = (
                q.shape,
                q.stride(),
                k.shape,
                k.stride(),
                v.shape,
                v.stride(),
                q.dtype,
                k.dtype,
                v.dtype,
                q.device,
                causal,
                window,
                scale,
                layout,
                return_lse,
                diagonal_alignment,
                _causal_wins,
                grad,
            )
            hit = _memo.get(key)
        except TypeError:  # an unhashable window
            key = hit = None
        if hit is not None and hit.plan.live:
            if not grad:
                return hit(q, k, v)
            if hit.bshd:
                q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            out, lse = ops.memo_autograd(hit, q, k, v, _deterministic(deterministic))
            if hit.bshd:
                out = out.transpose(1, 2)
            return (out, lse) if return_lse else out
    if dropout_p:
        reject("dropout_p", dropout_p, "attention dropout is not implemented")
    scale = check_scale(scale)
    bshd = layout == "bshd"
    if not bshd and layout != "bhsd":
        raise ValueError(f"layout must be 'bhsd' or 'bshd', got {layout!r}")
    _check_dense(q, k, v)
    if bshd:
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    qs, ks, vs = ops.servable(q), ops.servable(k), ops.servable(v)
    b = band(causal, window, diagonal_alignment, causal_wins=_causal_wins)
    sinks = _sinks(sinks, qs.shape[1])
    if sinks is not None and lean:
        lean = type(sinks) is torch.Tensor
        grad = lean and (grad or _needs_grad(sinks))
    if lean and not grad:
        remember = None
        if (
            key is not None
            and qs is q
            and ks is k
            and vs is v
            and _memoizable(causal, window, scale, diagonal_alignment, return_lse, _causal_wins)
        ):
            remember = (key, bshd)
        out, lse = block.forward(
            qs, ks, vs, sinks, scale, b.left, b.right, b.bottom_right, lse=bool(return_lse), remember=remember
        )
    elif lean:
        out, lse = ops.fwd_autograd(
            qs, ks, vs, sinks, scale, b.left, b.right, b.bottom_right, _deterministic(deterministic)
        )
        if (
            key is not None
            and sinks is None
            and qs is q
            and ks is k
            and vs is v
            and _memoizable(causal, window, scale, diagonal_alignment, return_lse, _causal_wins)
        ):
            block.memoize_training(key, qs, ks, vs, out, lse, scale, b.left, b.right, b.bottom_right, bshd=bshd)
    else:
        out, lse = torch.ops.frost.sdpa_fwd(
            qs, ks, vs, sinks, scale, b.left, b.right, b.bottom_right, _deterministic(deterministic)
        )
    if bshd:
        out = out.transpose(1, 2)
    return (out, lse) if return_lse else out


def varlen_attention(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool = False,
    window=None,
    scale: Optional[float] = None,
    sinks=None,
    deterministic: Optional[bool] = None,
    return_lse: bool = False,
    diagonal_alignment: str = "top_left",
    dropout_p: float = 0.0,
    _causal_wins: bool = False,
):
    """Attention over packed variable-length sequences: q (Tq, Hq, D), k/v (Tk, Hkv, D/Dv).

    cu_seqlens_q/k: int32 (B+1,) prefix sums on the device (read only by the kernels, never on the host,
    so the call can be captured in a CUDA graph and replayed with new lengths in the same tensors).
    max_seqlen_q/k: static envelopes, at least the longest sequence ever passed. Tokens past
    cu_seqlens[-1] get unspecified outputs. Masks are per sequence; other arguments as in `attention`.
    Returns out (Tq, Hq, Dv), and with `return_lse` also lse fp32 (Hq, Tq).
    """
    if dropout_p:
        reject("dropout_p", dropout_p, "attention dropout is not implemented")
    scale = check_scale(scale)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"{name} must be packed (T, H, D); got shape {tuple(t.shape)}")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if t.dtype != torch.int32 or t.dim() != 1:
            raise ValueError(f"{name} must be a 1-D int32 tensor of B+1 prefix sums; got {t.dtype} {tuple(t.shape)}")
    q, k, v = ops.servable(q), ops.servable(k), ops.servable(v)
    b = band(causal, window, diagonal_alignment, causal_wins=_causal_wins)
    det = _deterministic(deterministic)
    sinks = _sinks(sinks, q.shape[1])
    args = (
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        sinks,
        scale,
        b.left,
        b.right,
        b.bottom_right,
    )
    if not _lean(q, k, v, sinks):
        out, lse = torch.ops.frost.sdpa_varlen_fwd(*args, det)
    elif _needs_grad(q, k, v, sinks):
        out, lse = ops.varlen_fwd_autograd(*args, det)
    else:
        out, lse = block.packed_forward(*args)
    return (out, lse) if return_lse else out
