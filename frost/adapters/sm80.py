"""SM80 arch line (cc 8.x, and cc 9.0 below SM90): the mma.sync + cp.async kernels.

Each adapter's `plan_knobs(facts, target, requested)` is its planning policy: the tuning table's
knobs for the head dims and the target's shared memory, the requested knobs honored, and the choices that
suit the problem and the GPU: the forward's split-KV count (`frost.adapters.split_kv`), the backward's
deterministic mode (`frost.adapters.sm80_plan`).
"""

from __future__ import annotations

from frost.adapters.dsl_bwd import DslBwdAdapter, bwd_feature_flags
from frost.adapters.dsl_fwd import DslFwdAdapter
from frost.adapters.split_kv import SplitKvForward, plan_decode


def _smem_budget(target):
    return target.smem_per_block_optin or None


class MmaSyncFwdAdapter(SplitKvForward, DslFwdAdapter):
    """The mma.sync forward template; `family` selects the smem budget and tile table; split-KV plans run the
    combine after it (`SplitKvForward`)."""

    family = "sm80"
    template = "frost.engines.sm80.sdpa_fwd"
    params_module = "frost.engines.sm80.sdpa_fwd_params"
    params_class = "Sm80FwdParams"

    @classmethod
    def plan_knobs(cls, facts, target, requested: dict) -> dict:
        from frost.engines.sm80.sdpa_fwd_params import Sm80FwdParams, default_knobs, paged_tile_n

        knobs = dict(
            default_knobs(
                cls.family, facts.head_dim_qk, facts.head_dim_v, facts.io_dtype, smem_budget=_smem_budget(target)
            )
        )
        if facts.has_bias and knobs["tile_n"] > 64:
            # the bias's values join the S tile in registers: 128-key tiles (d=64's default) spilled 176 bytes a
            # thread on sm_80 (ptxas), 64-key tiles none; not timed on a GPU yet
            knobs["tile_n"] = 64
        if facts.paged is not None:  # each key tile inside one block of 64 rows or more, or spanning smaller ones
            knobs["tile_n"] = paged_tile_n(knobs["tile_n"], facts.paged.block_sizes)
        knobs.update(requested)
        # decode: GQA packing for short queries, split-KV where the grid is small against the SMs and the keys long
        flags = cls.feature_flags(facts)
        return plan_decode(facts, target, knobs, requested, lambda k: Sm80FwdParams(family=cls.family, **flags, **k))

    def fixed_params(self) -> dict:
        return {"family": self.family}


class MmaSyncBwdAdapter(DslBwdAdapter):
    """The mma.sync backward chain; `family` selects the smem budget and tile table."""

    family = "sm80"
    params_module = "frost.engines.sm80.sdpa_bwd_params"
    params_class = "Sm80BwdParams"

    @classmethod
    def plan_knobs(cls, facts, target, requested: dict) -> dict:
        from frost.adapters.sm80_plan import planned_det_knobs
        from frost.engines.sm80.sdpa_bwd_knobs import default_knobs
        from frost.engines.sm80.sdpa_bwd_params import Sm80BwdParams

        knobs = default_knobs(
            cls.family,
            facts.head_dim_qk,
            facts.head_dim_v,
            facts.io_dtype,
            smem_budget=_smem_budget(target),
            **requested,
        )
        params = Sm80BwdParams(family=cls.family, **bwd_feature_flags(facts), **knobs)
        # deterministic: split accumulator copies (unless requested) or the turn order that suit this problem
        return {
            **knobs,
            **planned_det_knobs(
                params,
                target.sm_count,
                facts.batch,
                facts.seq_q,
                facts.seq_kv,
                choose_splits="dq_splits" not in requested,
            ),
        }

    def fixed_params(self) -> dict:
        return {"family": self.family}


class SdpaFwdDslSm80(MmaSyncFwdAdapter):
    engine_name = "SdpaFwdDslSm80"


class SdpaBwdDslSm80(MmaSyncBwdAdapter):
    engine_name = "SdpaBwdDslSm80"
