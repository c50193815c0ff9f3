"""frost as torch's flash-attention provider: `F.scaled_dot_product_attention` and torch's varlen attention
run frost kernels, opt-in.

torch (2.10 and later) keeps a registry of flash-attention implementations
(`torch.nn.attention.register_flash_attention_impl` / `activate_flash_attention_impl`); an activated
implementation registers CUDA kernels for aten's flash ops (`_scaled_dot_product_flash_attention` and its
backward, `_flash_attention_forward` / `_backward`, `_flash_attention_forward_no_dropout_inplace` where
it exists). Importing `frost.torch_face` registers frost there under the name "frost"; `use_for_sdpa()`
activates it and `restore_sdpa()` returns to torch's own. Each kernel below is a thin client of
`block.py` (the same cached plans) and honors the aten contract its meta kernel states: out `empty_like`
the query, lse fp32 (B, H, Sq) or (H, Tq), gradients `empty_like` their inputs. What frost does not
serve (dropout, debug masks, ALiBi, seqused_k, paged KV) raises `UnsupportedArgumentError`.

CPU tensors, opt-in: `use_for_sdpa(device="cpu")` registers the same kernels for aten's flash ops on the
CPU key (aten has none there) and routes `F.scaled_dot_product_attention` on CPU tensors that frost
serves (no attn_mask, no dropout, one head dim) to `aten._scaled_dot_product_flash_attention`, whose
derivative is aten's flash backward op. That is the op torch's `context_parallel` intercepts, so its
ring attention over gloo runs every block on frost's reference engine, as on CUDA it runs frost's
kernels; other calls keep torch's own CPU attention. `restore_sdpa(device="cpu")` takes it back.
"""

from __future__ import annotations

import torch

from frost.torch_face import block
from frost.torch_face.ops import servable
from frost.torch_face.spec import reject

PROVIDER_NAME = "frost"


def _registry():
    """torch's provider registry functions, or None where this torch has none.

    torch 2.10 and 2.11 have register / activate / list / current; `restore_flash_attention_impl` came later
    (None here where it is missing).
    """
    import torch.nn.attention as attn

    if not all(
        hasattr(attn, n)
        for n in ("register_flash_attention_impl", "activate_flash_attention_impl", "current_flash_attention_impl")
    ):
        return None
    names = (
        "register_flash_attention_impl",
        "activate_flash_attention_impl",
        "current_flash_attention_impl",
        "restore_flash_attention_impl",
    )
    return {n: getattr(attn, n, None) for n in names}


def _no_registry_error() -> RuntimeError:
    return RuntimeError(
        f"torch {torch.__version__} has no flash-attention provider registry "
        f"(torch.nn.attention.register_flash_attention_impl, torch 2.10 and later), so frost "
        f"cannot serve F.scaled_dot_product_attention; call frost.torch_face.attention instead"
    )


def _unserved(
    dropout_p=0.0, return_debug_mask=False, alibi_slopes=None, seqused_k=None, block_table=None, **unknown
) -> None:
    if dropout_p:
        reject("dropout_p", dropout_p, "attention dropout is not implemented")
    if return_debug_mask:
        reject("return_debug_mask", return_debug_mask, "frost never materializes the attention matrix")
    for name, value in (("alibi_slopes", alibi_slopes), ("seqused_k", seqused_k), ("block_table", block_table)):
        if value is not None:
            reject(name, "<tensor>", "not implemented by frost's provider")
    for name, value in unknown.items():
        if value is not None and name != "num_splits":  # num_splits is a speed hint: the plan picks the split
            reject(name, value, "an argument frost's provider does not know")


def _window(is_causal, left, right) -> tuple[int, int]:
    """aten's window (None or -1 unbounded) with causal setting the right bound to 0."""
    wl = -1 if left is None or left < 0 else int(left)
    wr = 0 if is_causal else (-1 if right is None or right < 0 else int(right))
    return wl, wr


def _aux(query):
    """rng_state (2,) and the unused offset () as aten's meta kernel declares them (dropout is never on)."""
    dev = query.device
    return torch.zeros(2, dtype=torch.uint64, device=dev), torch.zeros((), dtype=torch.uint64, device=dev)


def _bhsd(*tensors):
    return tuple(t.transpose(1, 2) for t in tensors)


def sdpa_flash_forward(
    query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None, **extra
):
    """aten::_scaled_dot_product_flash_attention: (B, H, S, D) inputs; torch's is_causal is top-left."""
    _unserved(dropout_p, return_debug_mask, **extra)
    out, lse = block.forward(
        servable(query), servable(key), servable(value), None, scale, -1, 0 if is_causal else -1, False
    )
    rng_state, unused = _aux(query)
    debug = torch.empty(0, dtype=query.dtype, device=query.device)
    return out, lse, None, None, query.size(2), key.size(2), rng_state, unused, debug


def sdpa_flash_backward(
    grad_out,
    query,
    key,
    value,
    out,
    logsumexp,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    philox_seed,
    philox_offset,
    *,
    scale=None,
    **extra,
):
    """aten::_scaled_dot_product_flash_attention_backward -> (dq, dk, dv)."""
    _unserved(dropout_p, **extra)
    dq, dk, dv, _ = block.backward(
        servable(grad_out),
        query,
        key,
        value,
        out,
        logsumexp,
        None,
        scale,
        -1,
        0 if is_causal else -1,
        False,
        torch.are_deterministic_algorithms_enabled(),
    )
    return dq, dk, dv


def flash_forward(
    query,
    key,
    value,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    return_debug_mask,
    *,
    scale=None,
    window_size_left=None,
    window_size_right=None,
    out=None,
    **extra,
):
    """aten::_flash_attention_forward: dense (B, S, H, D) or packed (T, H, D); FlashAttention's masks
    (bottom-right aligned)."""
    _unserved(dropout_p, return_debug_mask, **extra)
    wl, wr = _window(is_causal, window_size_left, window_size_right)
    q, k, v = servable(query), servable(key), servable(value)
    if cum_seq_q is None:
        q, k, v = _bhsd(q, k, v)
        o, lse = block.forward(q, k, v, None, scale, wl, wr, True, out=None if out is None else out.transpose(1, 2))
        o = o.transpose(1, 2)
    else:
        o, lse = block.packed_forward(q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, None, scale, wl, wr, True, out=out)
    rng_state, unused = _aux(query)
    return o, lse, rng_state, unused, torch.empty(0, dtype=query.dtype, device=query.device)


def flash_forward_inplace(
    out, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, **kwargs
):
    """aten::_flash_attention_forward_no_dropout_inplace: writes `out`, returns lse."""
    return flash_forward(
        query,
        key,
        value,
        cum_seq_q,
        cum_seq_k,
        max_q,
        max_k,
        dropout_p,
        is_causal,
        return_debug_mask,
        out=out,
        **kwargs,
    )[1]


def flash_backward(
    grad_out,
    query,
    key,
    value,
    out,
    logsumexp,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    rng_state,
    unused,
    *,
    scale=None,
    window_size_left=None,
    window_size_right=None,
    **extra,
):
    """aten::_flash_attention_backward -> (dq, dk, dv)."""
    _unserved(dropout_p, **extra)
    wl, wr = _window(is_causal, window_size_left, window_size_right)
    det = torch.are_deterministic_algorithms_enabled()
    dout = servable(grad_out)
    if cum_seq_q is None or cum_seq_q.numel() == 0:
        dq, dk, dv, _ = block.backward(*_bhsd(dout, query, key, value, out), logsumexp, None, scale, wl, wr, True, det)
        return _bhsd(dq, dk, dv)
    dq, dk, dv, _ = block.packed_backward(
        dout, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, None, scale, wl, wr, True, det
    )
    return dq, dk, dv


KERNELS = {
    "_scaled_dot_product_flash_attention": sdpa_flash_forward,
    "_scaled_dot_product_flash_attention_backward": sdpa_flash_backward,
    "_flash_attention_forward": flash_forward,
    "_flash_attention_forward_no_dropout_inplace": flash_forward_inplace,
    "_flash_attention_backward": flash_backward,
}


class _Handle:
    """Keeps frost's aten registrations alive; `remove()` (torch's restore) takes them out again."""

    def __init__(self, library):
        self.library = library

    def remove(self) -> None:
        global _HANDLE
        lib, self.library = self.library, None
        if lib is not None:
            lib._destroy()
        if _HANDLE is self:
            _HANDLE = None


_HANDLE = None  # the registrations of the active frost provider


def _install() -> _Handle:
    """Register frost's kernels for aten's flash ops on CUDA (the ops this torch has)."""
    global _HANDLE
    lib = torch.library.Library("aten", "IMPL", "CUDA")
    for name, fn in KERNELS.items():
        if hasattr(torch.ops.aten, name):
            lib.impl(name, fn, "CUDA")
    _HANDLE = _Handle(lib)
    return _HANDLE


def register() -> bool:
    """Offer frost to torch's registry (activation stays the user's call); False where torch has none."""
    reg = _registry()
    if reg is None:
        return False
    reg["register_flash_attention_impl"](PROVIDER_NAME, register_fn=_install)
    return True


def _sdpa_cpu(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """`F.scaled_dot_product_attention` on CPU tensors (its AutogradCPU kernel while frost serves the CPU): aten's
    flash op where frost serves the call, torch's own composite otherwise."""
    hq, hk = query.size(-3), key.size(-3)
    if (
        attn_mask is None
        and not dropout_p
        and query.dim() == 4
        and key.dim() == 4
        and value.dim() == 4
        and query.dtype in _SERVED
        and query.size(-1) == value.size(-1)
        and (hq == hk or (enable_gqa and hq % hk == 0))
    ):
        return torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, 0.0, is_causal, False, scale=scale
        )[0]
    return torch.ops.aten.scaled_dot_product_attention.default.decompose(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
    )


_CPU = None  # the CPU registrations while frost serves CPU tensors
_SERVED = (torch.float16, torch.bfloat16, torch.float32)


def _install_cpu() -> None:
    global _CPU
    if _CPU is not None:
        return
    lib = torch.library.Library("aten", "IMPL")
    for name, fn in KERNELS.items():
        if hasattr(torch.ops.aten, name):
            lib.impl(name, fn, "CPU")
    lib.impl("scaled_dot_product_attention", _sdpa_cpu, "AutogradCPU")
    _CPU = lib


def cpu_active() -> bool:
    """Whether frost serves aten's flash ops (and SDPA) on CPU tensors (`use_for_sdpa(device="cpu")`)."""
    return _CPU is not None


def use_for_sdpa(device: str = "cuda") -> None:
    """Route torch's flash-attention ops (SDPA's flash backend, torch's varlen attention) to frost.

    device="cuda" (the default) activates frost in torch's provider registry. device="cpu" is an explicit
    opt-in for CPU tensors (torch's registry is CUDA's): frost's kernels for aten's flash ops on the CPU key,
    and SDPA on CPU tensors that frost serves routed to them, e.g. for torch's `context_parallel` over gloo
    on frost's reference engine. Calls on other CPU tensors keep torch's attention."""
    if str(device) == "cpu":
        _install_cpu()
        return
    reg = _registry()
    if reg is None:
        raise _no_registry_error()
    register()
    reg["activate_flash_attention_impl"](PROVIDER_NAME)


def restore_sdpa(device: str = "cuda") -> None:
    """Give torch's flash-attention ops back to torch's own implementation (on CPU tensors with device="cpu")."""
    global _CPU
    if str(device) == "cpu":
        lib, _CPU = _CPU, None
        if lib is not None:
            lib._destroy()
        return
    reg = _registry()
    if reg is None:
        raise _no_registry_error()
    if reg["current_flash_attention_impl"]() != PROVIDER_NAME:
        return
    if reg["restore_flash_attention_impl"] is not None:
        reg["restore_flash_attention_impl"]()
        return
    # a registry without restore (torch 2.10, 2.11): drop frost's registrations and its active mark
    from torch.nn.attention import _registry as registry

    if _HANDLE is not None:
        _HANDLE.remove()
    getattr(registry, "_FLASH_ATTENTION_HANDLES", {}).pop(PROVIDER_NAME, None)
    registry._FLASH_ATTENTION_ACTIVE = None


def active() -> bool:
    reg = _registry()
    return reg is not None and reg["current_flash_attention_impl"]() == PROVIDER_NAME
