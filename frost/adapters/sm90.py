"""SM90 arch line (cc 9.0): the wgmma + TMA warp-specialized forward."""
from __future__ import annotations

from frost.adapters.dsl_fwd import DslFwdAdapter, PendingBwdAdapter, fwd_feature_flags


class SdpaFwdDslSm90(DslFwdAdapter):
    engine_name = "SdpaFwdDslSm90"
    template = "frost.engines.sm90.sdpa_fwd"
    params_module = "frost.engines.sm90.sdpa_fwd_params"

    def template_params(self):
        from frost.engines.sm90.sdpa_fwd_params import Sm90FwdParams, default_knobs

        f = self.facts
        knobs = default_knobs(f.head_dim_qk, f.head_dim_v, causal_or_window=f.window_right is not None
                              or f.window_left is not None, sm_count=self.target.sm_count)
        knobs.update(self.knobs.requested())
        knobs.pop("num_warps", None)
        return Sm90FwdParams(**fwd_feature_flags(f), **knobs)


class SdpaBwdDslSm90(PendingBwdAdapter):
    engine_name = "SdpaBwdDslSm90"
