"""Appending new keys and values to a KV cache: the step a serving loop runs before attending over the cache.

`plan_kv_append(...)` is planned once per (dtype, head dims, paged, where the lengths come from, target): on a GPU
it compiles frost's CuTe DSL append kernel (`frost.engines.common.kv_append`), on a CPU it is the kernel's torch
reference (`kv_append_params.reference_append`). `execute` writes the new rows into the cache in place and the
lengths the attention graph then reads (`seq_len_q`, `seq_len_kv`); on a GPU it launches on the given stream (the
current one by default), allocates nothing and reads nothing back to the host.
"""

from __future__ import annotations

from typing import Optional

from frost.engines.common.kv_append_params import KvAppendParams, reference_append, validate

TEMPLATE = "frost.engines.common.kv_append"


class KvAppendPlan:
    """One planned append: `execute(...)` binds the tensors and launches (GPU) or writes them in torch (CPU)."""

    def __init__(self, params: KvAppendParams, target):
        validate(params)
        self.params = params
        self.target = target
        self._kernel = None
        if not target.is_cpu:
            from frost.compiler.compile import compile_kernel

            self._kernel = compile_kernel(TEMPLATE, params, target)

    def execute(
        self,
        k_new,
        v_new,
        k_cache,
        v_cache,
        table,
        cache_seqlens,
        seq_len_q,
        seq_len_kv,
        *,
        cache_len: int = 0,
        s_q: int = 1,
        stream=None,
    ) -> None:
        """k_new/v_new (B, S_new, H, D) (S_new may be 0); caches (B, S_cache, H, D) or paged (num_blocks,
        block_size, H, D) with `table` (B, max_blocks) int32; `cache_seqlens` (B,) int32 or None (then every
        sequence holds `cache_len` rows); seq_len_q / seq_len_kv (B,) int32, written."""
        p = self.params
        if (table is not None) != p.paged or (cache_seqlens is not None) != p.seqlens_tensor:
            raise ValueError(
                f"kv append planned for paged={p.paged}, seqlens_tensor={p.seqlens_tensor}; got "
                f"table {'set' if table is not None else 'None'}, cache_seqlens "
                f"{'set' if cache_seqlens is not None else 'None'}"
            )
        if self._kernel is None:
            reference_append(
                k_new, v_new, k_cache, v_cache, table, cache_seqlens, cache_len, s_q, seq_len_q, seq_len_kv
            )
            return
        from frost.runtime.context import stream_handle

        # stand-ins the kernel never reads (views: nothing is allocated): a contiguous cache's table, a scalar
        # length's tensor
        table = table if table is not None else seq_len_kv.view(-1, 1)
        seqlens = cache_seqlens if cache_seqlens is not None else seq_len_kv
        self._kernel(
            k_new,
            v_new,
            k_cache,
            v_cache,
            table,
            seqlens,
            seq_len_q,
            seq_len_kv,
            int(cache_len),
            int(s_q),
            stream_handle(stream),
        )


_PLANS: dict = {}


def plan_kv_append(
    dtype: str, head_dim: int, head_dim_v: int, *, paged: bool, seqlens_tensor: bool, target
) -> KvAppendPlan:
    """The append plan for these plan-time values on `target` (kept for the process)."""
    params = KvAppendParams(
        dtype=dtype, head_dim=head_dim, head_dim_v=head_dim_v, paged=paged, seqlens_tensor=seqlens_tensor
    )
    key = (params, getattr(target, "arch", None), target.is_cpu)
    plan: Optional[KvAppendPlan] = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = KvAppendPlan(params, target)
    return plan
