"""Params of the mma.sync templates in tests: a family's default knobs, then overrides, then feature flags."""
from __future__ import annotations


def params_kwargs(default_knobs, family="sm80", dtype="bf16", d=128, dv=None, hq=4, hk=4, knobs=None,
                  **flags) -> dict:
    """Keyword arguments of Sm80FwdParams / Sm80BwdParams (`default_knobs` of the matching params module)."""
    dv = dv or d
    k = default_knobs(family, d, dv, dtype)
    k.update(knobs or {})
    return dict(family=family, dtype=dtype, head_dim=d, head_dim_v=dv, num_heads_q=hq, num_heads_kv=hk,
                **flags, **k)
