"""SM100 arch line (cc 10.x): tcgen05 + TMEM. No kernel yet; the capability row declines with that reason."""

from __future__ import annotations

from frost.adapters.base import SdpaBwdAdapter, SdpaFwdAdapter


class SdpaFwdDslSm100(SdpaFwdAdapter):
    engine_name = "SdpaFwdDslSm100"

    def check_support(self) -> None:
        raise self.decline("the SM100 (tcgen05 + TMEM) forward kernel is not written yet")


class SdpaBwdDslSm100(SdpaBwdAdapter):
    engine_name = "SdpaBwdDslSm100"

    def check_support(self) -> None:
        raise self.decline("the SM100 (tcgen05 + TMEM) backward kernel is not written yet")
