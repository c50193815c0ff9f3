"""frost's torch face: attention as torch custom ops with autograd, fake kernels and cached plans.

    from frost.torch_face import attention
    out = attention(q, k, v, causal=True)          # (B, H, S, D); layout="bshd" for (B, S, H, D)

Importing this module registers the `torch.ops.frost.*` ops and frost's SDPA provider (never
activated by itself: see `use_for_sdpa`); `import frost` alone loads none of it.
"""

from frost.errors import PlanDuringCaptureError, UnsupportedArgumentError
from frost.torch_face import ops  # noqa: F401  (registers torch.ops.frost.*)
from frost.torch_face.api import attention, varlen_attention
from frost.torch_face.flash import flash_attn_func, flash_attn_varlen_func
from frost.torch_face.kvcache import flash_attn_with_kvcache
from frost.torch_face.plans import clear_plan_cache, plan_cache_info, set_plan_cache_size
from frost.torch_face.provider import PROVIDER_NAME, register as _register_provider, restore_sdpa, use_for_sdpa
from frost.torch_face.spec import Band, Specialization, band, specialization

__all__ = [
    "attention",
    "varlen_attention",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "plan_cache_info",
    "set_plan_cache_size",
    "clear_plan_cache",
    "Band",
    "band",
    "Specialization",
    "specialization",
    "UnsupportedArgumentError",
    "PlanDuringCaptureError",
    "use_for_sdpa",
    "restore_sdpa",
    "PROVIDER_NAME",
]

_register_provider()
