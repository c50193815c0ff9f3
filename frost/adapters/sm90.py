"""SM90 arch line (cc 9.0): the wgmma + TMA warp-specialized forward and backward.

Each adapter's `plan_knobs(facts, target, requested)` is its planning policy: the measured defaults for the
head dims (and, forward, the target's SM count), the requested knobs honored, then (forward) GQA head
packing and its tile height chosen for the declared shape, two consumer warpgroups with score modifiers,
key tiles that divide a paged cache's block size or span whole blocks of it (16 and 32 rows), and split-KV for
decodes over long caches (the mma.sync forward's choice and combine: `frost.adapters.split_kv`, docs/decode.md).
"""

from __future__ import annotations

from frost.adapters.dsl import fwd_feature_flags
from frost.adapters.dsl_bwd import DslBwdAdapter
from frost.adapters.dsl_fwd import DslFwdAdapter
from frost.adapters.split_kv import SplitKvForward, planned_num_splits, work_tiles
from frost.errors import TemplateParamsError


def _packed_tile_m(facts, target, p) -> int:
    """64-row tiles when the declared shape gives fewer packed tiles than SMs (decode-like).

    Few queries against long keys leave most SMs idle; halving the tile doubles
    the CTAs and shortens each one's per-block latency (H200, d=128, r=8, 8k-32k
    keys: 1.3-1.4x over 128-row tiles). Declared extents only choose the knob; the
    kernel still serves every runtime extent.
    """
    from frost.engines.sm90.sdpa_fwd_params import validate

    if p.tile_m == 64 or work_tiles(facts, p.model_dump(), p.rows_per_query) >= target.sm_count:
        return p.tile_m
    small = p.model_copy(update={"tile_m": 64})
    try:
        validate(small)
    except TemplateParamsError:
        return p.tile_m
    return 64


def _num_splits(facts, target, p) -> int:
    """The plan's split-KV count for the chosen params `p` (`planned_num_splits`, the mma.sync forward's choice,
    over the wgmma forward's work tiles: one CTA per SM); 1 where the template cannot split them."""
    from frost.engines.sm90.sdpa_fwd_params import split_reason

    splits = planned_num_splits(facts, target, p.model_dump(), p.rows_per_query, ctas_per_sm=1)
    if splits > 1 and split_reason(p.model_copy(update={"num_splits": splits})) is not None:
        return 1
    return splits


class SdpaFwdDslSm90(SplitKvForward, DslFwdAdapter):
    engine_name = "SdpaFwdDslSm90"
    template = "frost.engines.sm90.sdpa_fwd"
    params_module = "frost.engines.sm90.sdpa_fwd_params"
    params_class = "Sm90FwdParams"

    @classmethod
    def plan_knobs(cls, facts, target, requested: dict) -> dict:
        from frost.engines.sm90.sdpa_fwd_params import (
            Sm90FwdParams,
            default_knobs,
            pack_gqa_reason,
            paged_tile_n,
            score_mods_of,
        )

        flags = fwd_feature_flags(facts)
        knobs = default_knobs(
            facts.head_dim_qk, facts.head_dim_v, sm_count=target.sm_count, score_mods=score_mods_of(flags)
        )
        if facts.paged is not None:  # each key tile inside one block (one TMA load) or spanning whole ones
            knobs["tile_n"] = paged_tile_n(knobs["tile_n"], facts.paged.block_sizes)
        knobs.update(requested)
        if "pack_gqa" not in requested:
            # GQA packs the heads of a kv head into one M tile wherever the template can;
            # elsewhere (and when a user asks pack_gqa=False) each query head has its own tiles
            knobs["pack_gqa"] = (
                facts.num_heads_q > facts.num_heads_kv
                and pack_gqa_reason(Sm90FwdParams(**flags, **{**knobs, "pack_gqa": True})) is None
            )
        if knobs["pack_gqa"] and "tile_m" not in requested:
            knobs["tile_m"] = _packed_tile_m(facts, target, Sm90FwdParams(**flags, **knobs))
        if "num_splits" not in requested:  # split-KV where the work tiles are few against the SMs, the keys long
            knobs["num_splits"] = _num_splits(facts, target, Sm90FwdParams(**flags, **knobs))
        return knobs


class SdpaBwdDslSm90(DslBwdAdapter):
    """The wgmma + TMA backward main kernel between the shared preprocess and dQ convert."""

    engine_name = "SdpaBwdDslSm90"
    params_module = "frost.engines.sm90.sdpa_bwd_params"
    params_class = "Sm90BwdParams"

    @classmethod
    def plan_knobs(cls, facts, target, requested: dict) -> dict:
        from frost.engines.sm90.sdpa_bwd_knobs import default_knobs

        if facts.deterministic and facts.window_left is None and facts.window_right is None:
            # deterministic without a band: the rotated turn order (1-6% over free order on the H200 against
            # 3-16% for the stair, benchmarks/results/2026-12-01-h200-run11)
            requested = {"det_order": "rotated", **requested}
        return default_knobs(
            facts.head_dim_qk,
            facts.head_dim_v,
            banded=facts.window_right is not None,
            packed=facts.is_thd,
            ragged=facts.ragged is not None,
            sm_count=target.sm_count,
            bias=facts.has_bias,
            alibi=facts.has_alibi,
            dbias=facts.has_dbias,
            **requested,
        )
