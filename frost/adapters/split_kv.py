"""Decode on the DSL forwards: the plan-time choices of GQA packing (the mma.sync forward's) and `num_splits` (both
the mma.sync and the wgmma forward's: `planned_num_splits`), the workspace the split partials take, and the
combine kernel's compile and launch beside the forward's (`SplitKvForward`, both forwards' adapters).

When a forward's grid (batch x query heads x query tiles) is small against the SM count and the keys are long
(decode over a long cache), each query tile's key tiles are cut into `num_splits` pieces, each its own CTA; the
pieces' fp32 partial O and LSE go to the plan's workspace and `frost.engines.common.split_combine` reduces them
(docs/decode.md). Plan-time values only: the facts' declared dims and envelopes and the target's SM count.
"""

from __future__ import annotations

from frost.adapters.dsl import LaunchArgs
from frost.runtime.workspace import CarvedViews, ScratchBuffer, layout_bytes

COMBINE_TEMPLATE = "frost.engines.common.split_combine"
#: a split walks at least this many key tiles (512 keys at tile_n = 64): each split loads its query tile, writes
#: fp32 partials and adds a row to the combine, which a shorter share does not earn back (not timed on a GPU yet)
MIN_TILES_PER_SPLIT = 8
#: the partials' workspace is held under this many bytes (fewer splits where it would not fit)
MAX_PARTIAL_BYTES = 1 << 30
#: CTAs of the forward resident per SM that the choice counts on (two fit in the shared memory and registers
#: of every default tile on an A100 / H200 SM: FlashAttention-2 counts two per SM too)
CTAS_PER_SM = 2


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def choose_num_splits(
    sm_count: int, work: int, key_tiles: int, max_splits: int = 128, min_efficiency: float = 0.85
) -> int:
    """The split count a forward of `work` CTAs (batch x heads x query tiles) over `key_tiles` key tiles takes
    on `sm_count` CTA slots (SMs x resident CTAs): 1 when the grid already fills 80% of them or the keys are
    short; else the fewest splits whose wave efficiency (CTAs / (waves x slots)) is within `min_efficiency` of
    the best count's, counts that leave every split's share as the count before skipped (FlashAttention's
    heuristic)."""
    if work <= 0 or work >= 0.8 * sm_count:
        return 1
    most = min(max_splits, sm_count, key_tiles // MIN_TILES_PER_SPLIT)
    if most < 2:
        return 1

    def eligible(s: int) -> bool:
        return s == 1 or cdiv(key_tiles, s) != cdiv(key_tiles, s - 1)

    def efficiency(s: int) -> float:
        waves = work * s / sm_count
        return waves / cdiv(work * s, sm_count)

    best = max(efficiency(s) for s in range(1, most + 1) if eligible(s))
    return next(s for s in range(1, most + 1) if eligible(s) and efficiency(s) >= min_efficiency * best)


def partial_layout(facts, num_splits: int) -> list[ScratchBuffer]:
    """The partials' workspace: O (splits, B, Hq, Sq, Dv) and LSE (splits, B, Hq, Sq), and each split's row max
    (splits, B, Hq, Sq) for score_max / score_sum_exp, fp32, from the declared dims (the bound tensors have them);
    packed batches alike, Sq their max_seq_len_q envelope and the rows local to
    each sequence (the kernels cap every length there)."""
    rows = (num_splits, facts.batch, facts.num_heads_q, facts.seq_q)
    return [
        ScratchBuffer("o_partial", "float32", rows + (facts.head_dim_v,)),
        ScratchBuffer("lse_partial", "float32", rows),
    ] + [ScratchBuffer("max_partial", "float32", rows)] * (facts.has_score_max or facts.has_score_sum_exp)


#: the query tile of a split decode plan whose queries fit in it (unless tile_m or num_warps is requested): 64 rows
#: on 4 warps halve the padded MMA work and the O accumulator of the 128-row tiles; at d=128 ptxas spills 364
#: bytes a thread in the split kernel with 128 rows (152 unsplit), none with 64 (sm_80, ptxas 13.4)
DECODE_TILE = dict(tile_m=64, num_warps=4)


#: GQA packing is planned for queries this short (a decode, or a few speculative tokens)
PACK_MAX_SEQ_Q = 16

#: splits are planned for queries this short only (decodes): longer queries keep the unsplit kernels, whose speed
#: and numerics are measured on the H200, until a GPU run times the split ones (a requested num_splits is honored)
SPLIT_MAX_SEQ_Q = PACK_MAX_SEQ_Q


def plan_decode(facts, target, knobs: dict, requested: dict, params_of) -> dict:
    """`knobs` with the decode choices unless requested: GQA packing (`pack_gqa`) for queries of at most
    `PACK_MAX_SEQ_Q` positions where the template can pack them (`params_of(knobs)`: the params to judge), the
    `DECODE_TILE` where a packed or split decode's query rows fit it, and the `num_splits`."""
    from frost.engines.sm80.sdpa_fwd_params import pack_gqa_reason

    knobs = dict(knobs)
    tile_free = not {"tile_m", "num_warps"} & set(requested)
    if "pack_gqa" not in requested:
        knobs["pack_gqa"] = False
        if facts.seq_q <= PACK_MAX_SEQ_Q and facts.num_heads_q > facts.num_heads_kv:
            trial = dict(knobs, pack_gqa=True)
            if tile_free and packed_rows(facts, trial) <= DECODE_TILE["tile_m"]:
                trial.update(DECODE_TILE)
            if pack_gqa_reason(params_of(trial)) is None:
                knobs = trial
    if "num_splits" in requested:
        return knobs
    if tile_free and packed_rows(facts, knobs) <= DECODE_TILE["tile_m"] < knobs["tile_m"]:
        decode = dict(knobs, **DECODE_TILE)
        splits = planned_num_splits(facts, target, decode)
        if splits > 1:
            return dict(decode, num_splits=splits)
    return dict(knobs, num_splits=planned_num_splits(facts, target, knobs))


def packed_rows(facts, knobs: dict, rows_per_query: int | None = None) -> int:
    """Query rows of one (batch entry, head or KV group): S_q, times the group's heads when packed
    (`rows_per_query`: the heads a packed tile row mode holds, Hq / Hkv unless given)."""
    return facts.seq_q * heads_per_row(facts, knobs, rows_per_query)


def heads_per_row(facts, knobs: dict, rows_per_query: int | None = None) -> int:
    """Query heads a packed tile holds per query position: `rows_per_query` if given, Hq / Hkv when `knobs` pack
    GQA, else 1."""
    if rows_per_query is not None:
        return rows_per_query
    return facts.num_heads_q // facts.num_heads_kv if knobs.get("pack_gqa") else 1


def work_tiles(facts, knobs: dict, rows_per_query: int | None = None) -> int:
    """The query tiles of a forward's grid from the declared shape: batch x (query heads, or KV groups when
    packed) x tiles of `knobs["tile_m"]` rows over each one's `packed_rows`."""
    r = heads_per_row(facts, knobs, rows_per_query)
    return facts.batch * (facts.num_heads_q // r) * cdiv(packed_rows(facts, knobs, r), knobs["tile_m"])


def planned_num_splits(
    facts, target, knobs: dict, rows_per_query: int | None = None, ctas_per_sm: int = CTAS_PER_SM
) -> int:
    """The plan's `num_splits` for the chosen tiles (`knobs`) on `target` (1 for queries longer than
    `SPLIT_MAX_SEQ_Q`), for either forward: its query tiles hold `rows_per_query` heads' rows (`packed_rows`) and
    `ctas_per_sm` of its CTAs fit an SM (the wgmma forward's tiles take one)."""
    if facts.seq_q > SPLIT_MAX_SEQ_Q:
        return 1
    work = work_tiles(facts, knobs, rows_per_query)
    splits = choose_num_splits(ctas_per_sm * (target.sm_count or 0), work, cdiv(facts.seq_kv, knobs["tile_n"]))
    while splits > 1 and layout_bytes(partial_layout(facts, splits)) > MAX_PARTIAL_BYTES:
        splits -= 1
    return splits


def combine_params(params):
    """The combine kernel's params for a split forward's params."""
    from frost.engines.common.split_combine_params import SplitCombineParams

    return SplitCombineParams(
        dtype=params.dtype,
        head_dim_v=params.head_dim_v,
        num_heads_q=params.num_heads_q,
        num_splits=params.num_splits,
        has_lse=params.has_lse,
        has_seqused=params.has_seqused,
        has_sinks=params.has_sinks,
        has_score_max=params.has_score_max,
        has_score_sum_exp=params.has_score_sum_exp,
        is_thd=params.is_thd,
        token_div_q=params.token_div_q,
        offset_dtype_q=params.offset_dtype_q,
        token_div_lse=params.token_div_lse,
        offset_dtype_lse=params.offset_dtype_lse,
        stats_per_batch=params.stats_per_batch,
        own_offsets=tuple(o for o in params.own_offsets if o[0] in ("o", "score_max", "score_sum_exp")),
    )


class SplitKvForward:
    """What a forward adapter whose params have `num_splits` (mma.sync, wgmma) adds for a split plan: the combine
    kernel in its specs and compiled beside the forward, the partials' workspace, the combine launched after the
    forward on the same stream. An unsplit plan runs as the plain forward."""

    def kernel_specs(self) -> list:
        specs = super().kernel_specs()
        if specs[0][1].split:
            specs.append((COMBINE_TEMPLATE, combine_params(specs[0][1])))
        return specs

    def compile(self) -> None:
        super().compile()
        self._split = SplitKv(self.facts, self.params, self.target) if self.params.split else None

    def compiled_kernels(self) -> list:
        split = getattr(self, "_split", None)
        return super().compiled_kernels() + ([split.kernel] if self.compiled and split is not None else [])

    def scratch_workspace_bytes(self) -> int:
        p = self.params if self.compiled else self.validated_params()
        return layout_bytes(partial_layout(self.facts, p.num_splits)) if p.split else 0

    def execute(self, bound: dict, workspace, stream) -> None:
        split = self._split
        if split is None:
            return super().execute(bound, workspace, stream)
        per_call = {**self.per_call(bound, stream), **split.partials(workspace)}
        self.kernel(*self._args(bound, per_call))
        split.combine(bound, per_call)


class SplitKv:
    """A split plan's combine kernel, its launch arguments and the partials carved from the workspace."""

    def __init__(self, facts, params, target):
        from frost.compiler.compile import compile_kernel
        from frost.engines.common.split_combine_params import combine_arg_names

        cp = combine_params(params)
        self.kernel = compile_kernel(COMBINE_TEMPLATE, cp, target)
        self._args = LaunchArgs(combine_arg_names(cp), facts)
        self._views = CarvedViews(partial_layout(facts, params.num_splits))

    def partials(self, workspace) -> dict:
        """{o_partial, lse_partial[, max_partial]}: views of the caller's workspace (checked by the binder against the
        plan)."""
        return self._views(workspace)

    def combine(self, bound: dict, per_call: dict) -> None:
        """Launch the combine on the forward's stream; `per_call` holds the partials, viewed lengths and sinks."""
        self.kernel(*self._args(bound, per_call))
