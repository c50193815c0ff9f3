"""SM120 arch line (cc 12.x): the mma.sync kernels with SM120 budgets (about 99 KB smem per block)."""

from __future__ import annotations

from frost.adapters.sm80 import MmaSyncBwdAdapter, MmaSyncFwdAdapter


class SdpaFwdDslSm120(MmaSyncFwdAdapter):
    engine_name = "SdpaFwdDslSm120"
    family = "sm120"


class SdpaBwdDslSm120(MmaSyncBwdAdapter):
    engine_name = "SdpaBwdDslSm120"
    family = "sm120"
