"""SM80 arch line (cc 8.x, and cc 9.0 below SM90): the mma.sync + cp.async kernels."""
from __future__ import annotations

from frost.adapters.dsl_bwd import MmaSyncBwdAdapter
from frost.adapters.dsl import fwd_feature_flags
from frost.adapters.dsl_fwd import DslFwdAdapter


class MmaSyncFwdAdapter(DslFwdAdapter):
    """The mma.sync forward template; `family` selects the smem budget and tile table."""

    family = "sm80"
    template = "frost.engines.sm80.sdpa_fwd"
    params_module = "frost.engines.sm80.sdpa_fwd_params"

    def template_params(self):
        from frost.engines.sm80.sdpa_fwd_params import Sm80FwdParams, default_knobs

        f = self.facts
        knobs = dict(default_knobs(self.family, f.head_dim_qk, f.head_dim_v, f.io_dtype,
                                   smem_budget=self.target.smem_per_block_optin or None))
        knobs.update(self.knobs.requested())
        return Sm80FwdParams(family=self.family, **fwd_feature_flags(f), **knobs)


class SdpaFwdDslSm80(MmaSyncFwdAdapter):
    engine_name = "SdpaFwdDslSm80"


class SdpaBwdDslSm80(MmaSyncBwdAdapter):
    engine_name = "SdpaBwdDslSm80"
