"""`flash_attn_with_kvcache`: FlashAttention's serving call on frost, for paged and contiguous KV caches.

A decode or prefill step appends its new keys and values to the cache in place and attends over the cache:

    out = flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=lens,
                                  block_table=table, causal=True)

q (B, S_q, H_q, D); a contiguous cache (B, S_cache, H_kv, D), or a paged one (num_blocks, block_size, H_kv, D) with
`block_table` (B, max_blocks) int32; k / v (B, S_new, H_kv, D) new rows written at cache_seqlens[b] (int32 (B,), or
an int for every sequence), after which sequence b has cache_seqlens[b] + S_new keys. Masks follow FlashAttention:
causal and windows are aligned to the bottom-right diagonal. `learnable_sink` (H_q,) fp32 adds FlashAttention-4's
attention sinks. Returns out (B, S_q, H_q, D_v), and with `return_softmax_lse` the fp32 lse (B, H_q, S_q).

Two steps, both planned once per call shape and cached: the append (`frost.kv_append`: frost's CuTe DSL append
kernel on a GPU, which also writes the lengths the attention reads; its torch reference on a CPU), then one frost
graph through the public graph API: a paged cache declared as cuDNN's paged SDPA (containers (num_blocks, H_kv,
block_size, D) as strided views of the cache, the table as (B, 1, max_blocks, 1)), a contiguous one as a dense
(B, H_kv, S_cache, D) view with the padding mask. Nothing is copied; lengths are never read on the host. Which
engine serves the graph is frost's choice: frost's own kernels serve the contiguous cache and, with blocks of 16,
32, 64, 128 or 256 rows, the paged one (the wgmma forward on SM90, the mma.sync forward elsewhere, each reading
through the table; docs/paged_kv.md); other block sizes go to the cuDNN engine on a GPU; the reference serves both
on a CPU.

Rotary embeddings, cache_batch_idx, cache_leftpad, softcap and ALiBi raise `UnsupportedArgumentError`;
`num_splits` and `rotary_interleaved` are speed / rotary hints with nothing to do here (frost's plan chooses its own
split count for a decode over a long cache: docs/decode.md).
"""

from __future__ import annotations

from typing import Optional

import torch

from frost.kv_append import plan_kv_append
from frost.torch_face.graphs import _finish, _graph, device_guard, target_of
from frost.torch_face.plans import PLANS
from frost.torch_face.spec import band, default_scale, reject, specialization

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _unserved(rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad, softcap, alibi_slopes) -> None:
    for name, value in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if value is not None:
            reject(name, "<tensor>", "rotary embeddings are not applied by frost (rotate q and k before the call)")
    if cache_batch_idx is not None:
        reject("cache_batch_idx", "<tensor>", "the cache's batch entries must be the batch's own")
    if cache_leftpad is not None:
        reject("cache_leftpad", "<tensor>", "left-padded caches are not served")
    if softcap:
        reject("softcap", softcap, "logit soft-capping is not implemented (pass 0.0)")
    if alibi_slopes is not None:
        reject("alibi_slopes", "<tensor>", "ALiBi biases are not implemented")


def _check(q, k_cache, v_cache, k, v, block_table, cache_seqlens):
    """(paged, capacity per sequence) after the argument checks; errors name the argument."""
    if q.dim() != 4 or k_cache.dim() != 4 or v_cache.dim() != 4:
        reject(
            "q/k_cache/v_cache",
            "<tensors>",
            f"expected 4-d tensors, got q {tuple(q.shape)}, k_cache "
            f"{tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}",
        )
    b = q.shape[0]
    paged = block_table is not None
    if paged:
        if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != b:
            reject(
                "block_table",
                "<tensor>",
                f"expected int32 (B={b}, max_blocks), got {block_table.dtype} {tuple(block_table.shape)}",
            )
        if k_cache.shape[:3] != v_cache.shape[:3]:
            reject(
                "v_cache",
                "<tensor>",
                f"paged caches share (num_blocks, block_size, H_kv): k_cache "
                f"{tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}",
            )
        capacity = block_table.shape[1] * k_cache.shape[1]
    else:
        if k_cache.shape[0] != b or k_cache.shape[:3] != v_cache.shape[:3]:
            reject(
                "k_cache",
                "<tensor>",
                f"a contiguous cache is (B={b}, S_cache, H_kv, D) for K and V; got "
                f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}",
            )
        capacity = k_cache.shape[1]
    if (k is None) != (v is None):
        reject("k" if v is None else "v", "<tensor>", "new keys and values come together")
    if k is not None:
        want = (b, k.shape[1], k_cache.shape[2])
        if (
            tuple(k.shape[:3]) != want
            or tuple(v.shape[:3]) != want
            or k.shape[3] != k_cache.shape[3]
            or v.shape[3] != v_cache.shape[3]
            or k.dtype != k_cache.dtype
            or v.dtype != v_cache.dtype
        ):
            reject(
                "k/v",
                "<tensors>",
                f"new rows are (B, S_new, H_kv, D) like the cache: k {tuple(k.shape)} "
                f"{k.dtype}, v {tuple(v.shape)} {v.dtype}, cache {tuple(k_cache.shape)} {k_cache.dtype}",
            )
        if cache_seqlens is None:
            reject("cache_seqlens", None, "appending k/v needs the cache lengths to write them at")
    if isinstance(cache_seqlens, torch.Tensor):
        if cache_seqlens.dtype != torch.int32 or tuple(cache_seqlens.shape) != (b,):
            reject(
                "cache_seqlens",
                "<tensor>",
                f"expected int32 ({b},), got {cache_seqlens.dtype} {tuple(cache_seqlens.shape)}",
            )
    elif cache_seqlens is not None and not isinstance(cache_seqlens, int):
        reject("cache_seqlens", cache_seqlens, "an int32 tensor (B,), an int, or None")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        reject(
            "q/k_cache/v_cache",
            "<tensors>",
            f"one dtype: q {q.dtype}, k_cache {k_cache.dtype}, v_cache {v_cache.dtype}",
        )
    return paged, capacity


def _build(q4, kc, vc, table4, out4, lse4, lens_q, lens_kv, sinks, scale, bnd, capacity):
    """The attention graph of one call shape: handles q, k, v, o, [stats], seq_len_q, seq_len_kv, [K table, V
    table], [sinks]."""
    g = _graph(q4.dtype, q4.device, "frost_torch_kvcache")
    hq, hk, hv = (g.tensor_like(t, name=n) for n, t in (("q", q4), ("k_cache", kc), ("v_cache", vc)))
    hlq, hlk = g.tensor_like(lens_q, name="seq_len_q"), g.tensor_like(lens_kv, name="seq_len_kv")
    kw = dict(
        attn_scale=default_scale(q4.shape[-1], scale),
        use_padding_mask=True,
        seq_len_q=hlq,
        seq_len_kv=hlk,
        **bnd.graph_keywords(),
    )
    handles = []
    if table4 is not None:
        for role in ("k", "v"):  # one table for both caches, bound twice (a graph port is one role)
            kw[f"paged_attention_{role}_table"] = g.tensor_like(table4, name=f"block_table_{role}")
            handles.append(kw[f"paged_attention_{role}_table"])
        kw["paged_attention_max_seq_len_kv"] = capacity
    if sinks is not None:
        kw["sink_token"] = g.tensor_like(sinks, name="learnable_sink")
        handles.append(kw["sink_token"])
    o, stats = g.sdpa(hq, hk, hv, generate_stats=lse4 is not None, **kw)
    o.set_output(True).set_dim(tuple(out4.shape)).set_stride(tuple(out4.stride()))
    head = [hq, hk, hv, o]
    if lse4 is not None:
        stats.set_output(True).set_dim(tuple(lse4.shape)).set_stride(tuple(lse4.stride()))
        head.append(stats)
    spec = specialization(
        "fwd",
        q4,
        kc,
        vc,
        band=bnd,
        sinks=sinks,
        packed=False,
        arch=g.target.arch,
        scale=scale,
        has_stats=lse4 is not None,
    )
    return _finish(g, (*head, hlq, hlk, *handles), spec, q4.device)


_build.what = "flash_attn_with_kvcache"  # named in the plan cache's errors


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size=(-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes=None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    learnable_sink=None,
):
    """FlashAttention's `flash_attn_with_kvcache` (see the module docstring); k_cache / v_cache are updated in
    place when k / v are given."""
    _unserved(rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad, softcap, alibi_slopes)
    paged, capacity = _check(q, k_cache, v_cache, k, v, block_table, cache_seqlens)
    if q.dtype not in _DTYPES:
        reject("q", "<tensor>", f"dtype {q.dtype} (bf16, fp16, or fp32 on a CPU)")
    sinks = learnable_sink
    if sinks is not None and (sinks.dtype != torch.float32 or tuple(sinks.shape) != (q.shape[2],)):
        reject("learnable_sink", "<tensor>", f"expected fp32 ({q.shape[2]},), got {sinks.dtype} {tuple(sinks.shape)}")
    bnd = band(causal, tuple(window_size) if window_size is not None else None, "bottom_right", causal_wins=True)
    with device_guard(q.device):  # the append and the attention launch on q's device's current stream
        lens_q, lens_kv = _append(q, k_cache, v_cache, k, v, block_table, cache_seqlens, paged, capacity)
        return _attend(
            q, k_cache, v_cache, block_table, lens_q, lens_kv, sinks, softmax_scale, bnd, capacity, return_softmax_lse
        )


def _append(q, k_cache, v_cache, k, v, block_table, cache_seqlens, paged, capacity):
    """Step 1: the new rows written into the cache and the lengths the attention reads, (seq_len_q, seq_len_kv)."""
    b, s_q, _, d = q.shape
    dev = q.device
    seqlens_tensor = isinstance(cache_seqlens, torch.Tensor)
    lens_q = torch.empty(b, dtype=torch.int32, device=dev)
    lens_kv = torch.empty(b, dtype=torch.int32, device=dev)
    append = plan_kv_append(
        _DTYPES[q.dtype], d, v_cache.shape[-1], paged=paged, seqlens_tensor=seqlens_tensor, target=target_of(dev)
    )
    if k is None:  # nothing new: zero rows (views, nothing allocated); the kernel still writes the lengths
        k = k_cache[:1, :0].expand(b, -1, -1, -1)
        v = v_cache[:1, :0].expand(b, -1, -1, -1)
    cache_len = capacity if cache_seqlens is None else (0 if seqlens_tensor else int(cache_seqlens))
    append.execute(
        k,
        v,
        k_cache,
        v_cache,
        block_table,
        cache_seqlens if seqlens_tensor else None,
        lens_q,
        lens_kv,
        cache_len=cache_len,
        s_q=s_q,
    )
    return lens_q, lens_kv


def _attend(q, k_cache, v_cache, block_table, lens_q, lens_kv, sinks, scale, bnd, capacity, return_lse):
    """Step 2: the attention graph over the cache, planned once per key: (B, H, S, D) views of q and out, the
    cache as cuDNN declares it."""
    b, s_q, hq, _ = q.shape
    dev = q.device
    q4 = q.transpose(1, 2)
    kc, vc = k_cache.transpose(1, 2), v_cache.transpose(1, 2)  # paged: (num_blocks, H_kv, block_size, D)
    table4 = block_table[:, None, :, None] if block_table is not None else None
    out = torch.empty((b, s_q, hq, v_cache.shape[-1]), dtype=q.dtype, device=dev)
    out4 = out.transpose(1, 2)
    lse = torch.empty((b, hq, s_q), dtype=torch.float32, device=dev) if return_lse else None
    lse4 = lse.unsqueeze(-1) if lse is not None else None
    key = (
        "kvcache",
        q.dtype,
        dev,
        q4.shape,
        q4.stride(),
        kc.shape,
        kc.stride(),
        vc.shape,
        vc.stride(),
        None if table4 is None else (table4.shape, table4.stride()),
        sinks is None,
        scale,
        bnd,
        lse is not None,
        out4.stride(),
    )
    plan = PLANS.lookup(key) or PLANS.build(
        key, _build, q4, kc, vc, table4, out4, lse4, lens_q, lens_kv, sinks, scale, bnd, capacity
    )
    tensors = [q4, kc, vc, out4, *((lse4,) if lse4 is not None else ()), lens_q, lens_kv]
    if table4 is not None:
        tensors += [table4, table4]
    if sinks is not None:
        tensors.append(sinks)
    plan.run(tuple(tensors), dev)
    return (out, lse) if return_lse else out
