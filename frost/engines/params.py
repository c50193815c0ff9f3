"""TemplateParams: the frozen, hashable record that parameterizes one kernel template.

Every field is a plan-time value. Runtime extents (batch, sequence lengths,
packed totals) are never fields: they compile as symbolic ints.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict

from frost.engines.sdpa_args import OWN_OFFSET_ROLES
from frost.errors import TemplateParamsError


def round_up(d: int, granule: int) -> int:
    """`d` rounded up to a whole number of `granule`s (a kernel tile's head-dim extent)."""
    return -(-d // granule) * granule


class HeadDimSpan(BaseModel):
    """Every head dim that is a multiple of `multiple`, from `multiple` up to `maximum`: d_qk and d_v each,
    independently (cuDNN's rule for its SDPA head dims). The templates state theirs in their params module,
    the capability rows theirs (`frost.lowering.capabilities`); test/cpu/test_routing.py checks that the two
    agree."""

    model_config = ConfigDict(frozen=True)

    multiple: int
    maximum: int

    def describe(self) -> str:
        return f"every multiple of {self.multiple} up to {self.maximum} (d_qk and d_v independently)"

    def outside(self, d_qk: int, d_v: int) -> tuple[str, int, str] | None:
        """(name, head dim, what is wrong) of the first of d_qk, d_v outside the span, or None."""
        for name, d in (("d_qk", d_qk), ("d_v", d_v)):
            if d < self.multiple or d % self.multiple != 0:
                return name, d, f"is not a multiple of {self.multiple}"
            if d > self.maximum:
                return name, d, f"is above {self.maximum}"
        return None


class TemplateParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def key(self) -> str:
        """Stable text form used in compile keys."""
        return self.model_dump_json()


class SdpaFeatureParams(TemplateParams):
    """The feature fields every SDPA template shares (the optional arguments of `sdpa_args`)."""

    dtype: Literal["bf16", "fp16"] = "bf16"
    head_dim: int = 128
    head_dim_v: int = 128
    num_heads_q: int = 1
    num_heads_kv: int = 1  # K's heads (V's too unless num_heads_v is set)
    num_heads_v: int = 0  # V's heads where they differ from K's (else 0: one kernel, one key)
    is_thd: bool = False
    has_seqused: bool = False
    has_sinks: bool = False
    has_window_left: bool = False
    has_window_right: bool = False
    bottom_right: bool = False
    # cuDNN's ragged-offset form (`is_thd` with lengths from seqused): the io tensors are bound (B, H, S, D) and
    # viewed (T, H, D); cu_seqlens_q / cu_seqlens_kv hold per-batch element offsets (int32 or int64), divided
    # in-kernel by their group's token stride (the declared S stride). 0: frost's own token prefix sums.
    token_div_q: int = 0
    token_div_kv: int = 0
    offset_dtype_q: Literal["int32", "int64"] = "int32"
    offset_dtype_kv: Literal["int32", "int64"] = "int32"
    # ragged Stats: their own offsets (`lse_offsets`) and token stride; 0 with `stats_per_batch` (B, H, S, 1)
    token_div_lse: int = 0
    offset_dtype_lse: Literal["int32", "int64"] = "int32"
    stats_per_batch: bool = False
    # ragged io tensors whose offsets are not their group leader's (q's for the query group, k's for the key
    # group): another offset tensor, or the same one over another token stride (cuDNN gives every tensor its
    # own). (role, token divisor, offset dtype) in `sdpa_args.OWN_OFFSET_ROLES` order; the kernels read each
    # from `<role>_offsets`
    own_offsets: tuple[tuple[str, int, Literal["int32", "int64"]], ...] = ()
    # score modifiers (sdpa_args.py): an additive bias, full along batch / heads where flagged (else one value
    # broadcast over them), and ALiBi
    has_bias: bool = False
    bias_per_batch: bool = False
    bias_per_head: bool = False
    # the bias's key dim has a non-unit stride (read through a runtime stride); else its unit stride compiles in,
    # so a thread's loads of one row share one address register
    bias_key_strided: bool = False
    has_alibi: bool = False

    @property
    def qhead_per_kvhead(self) -> int:
        return self.num_heads_q // self.num_heads_kv

    @property
    def heads_v(self) -> int:
        """V's head count: num_heads_v, or K's when unset."""
        return self.num_heads_v or self.num_heads_kv

    @property
    def qhead_per_vhead(self) -> int:
        return self.num_heads_q // self.heads_v

    @property
    def ragged(self) -> bool:
        """cuDNN's ragged-offset form (see `token_div_q`)."""
        return self.token_div_q > 0

    def own_div(self, role: str) -> int:
        """The token divisor of `role`'s own ragged offsets, or 0 where it takes its group leader's."""
        return next((div for r, div, _ in self.own_offsets if r == role), 0)

    @property
    def has_score_mods(self) -> bool:
        """Logits get more than the scale (a bias or ALiBi): kernels scale them before the softmax."""
        return self.has_bias or self.has_alibi


class SdpaBwdFeatureParams(SdpaFeatureParams):
    """The feature fields every SDPA backward shares: the gradients beyond dQ / dK / dV and determinism.

    `has_dbias`: the bias gradient (its dims are the bias's). `dbias_accum`: it goes through the fp32 workspace
    accumulator of the chain (zeroed by the preprocess, converted by the dQ convert), because several (batch,
    head) pairs add into one element (a broadcast bias) or a packed batch leaves elements outside every
    sequence; otherwise the main kernel writes it directly.
    """

    has_dsinks: bool = False
    deterministic: bool = False
    has_dbias: bool = False
    dbias_accum: bool = False

    @property
    def dbias_accum_per_batch(self) -> bool:
        """The dBias accumulator is full along batch (B entries; else one); False without an accumulator.
        Deterministic: full along both, one copy per (batch entry, query head), each element written once by a
        plain store; the dQ convert sums the copies a broadcast dBias spans in a fixed order."""
        return self.dbias_accum and (self.bias_per_batch or self.deterministic)

    @property
    def dbias_accum_per_head(self) -> bool:
        """The dBias accumulator is full along heads (H_q; else one); False without an accumulator."""
        return self.dbias_accum and (self.bias_per_head or self.deterministic)

    @property
    def dbias_sum_batch(self) -> bool:
        """The dQ convert sums the accumulator's batch copies into a dBias that broadcasts over batch."""
        return self.dbias_accum_per_batch and not self.bias_per_batch

    @property
    def dbias_sum_heads(self) -> bool:
        """The dQ convert sums the accumulator's head copies into a dBias that broadcasts over heads."""
        return self.dbias_accum_per_head and not self.bias_per_head

    @property
    def walk_group(self) -> int:
        """Query heads one CTA of a backward main kernel walks: a kv head's (Hq / Hkv); with K and V heads apart,
        the least common multiple of K's and V's groups, the smallest run of query heads made of whole K groups
        and whole V groups (the coarser tensor's group where one count divides the other; 6 query heads over K 2
        and V 3: all 6)."""
        return math.lcm(self.qhead_per_kvhead, self.qhead_per_vhead)

    @property
    def kv_grid_heads(self) -> int:
        """A backward main kernel's CTAs per key tile along the heads: one per walk of `walk_group` query heads.
        The walk sums each K head's dK and each V head's dV over that head's whole group, and writes a K or V tile
        where its group ends, so no gradient is split over CTAs."""
        return self.num_heads_q // self.walk_group

    @property
    def walk_heads_k(self) -> int:
        """K heads one walk covers: 1 where K's tile stays for the whole walk, more where it changes within it."""
        return self.walk_group // self.qhead_per_kvhead

    @property
    def walk_heads_v(self) -> int:
        """V heads one walk covers (`walk_heads_k`)."""
        return self.walk_group // self.qhead_per_vhead

    @property
    def batch_fastest(self) -> bool:
        """The main kernel's grid runs the batch entries of a (key tile, kv head) side by side (batch on the
        fastest grid axis): a dBias shared by the batch entries (one fp32 accumulator copy) then takes their adds
        to the same elements at about the same time, in L2, instead of a batch's pass later, after its lines have
        left L2."""
        return self.dbias_accum and not self.dbias_accum_per_batch

    @property
    def grid_order(self) -> str:
        """The main kernel's grid order (`frost.engines.common.grid_order`): "batch" entries fastest
        (`batch_fastest`), else "key" tiles."""
        return "batch" if self.batch_fastest else "key"


def score_mod_tags(p) -> tuple:
    """(flag, tag) pairs naming a kernel's score modifiers: bias, then b / h where it is full along batch /
    heads and s for a strided key dim, alibi, and (backward) dbias, or dbiasacc through the fp32 accumulator."""
    bias = "bias" + "b" * p.bias_per_batch + "h" * p.bias_per_head + "s" * p.bias_key_strided
    tags = ((p.has_bias, bias), (p.has_alibi, "alibi"))
    if isinstance(p, SdpaBwdFeatureParams):
        acc = "dbiasacc" + "st" * (p.dbias_accum and p.deterministic)  # stored copies, summed in order
        tags += ((p.has_dbias, acc if p.dbias_accum else "dbias"),)
    return tags


def check_sdpa_features(p: SdpaFeatureParams, head_dims, who: str) -> None:
    """The checks every SDPA template's validator starts with; raises TemplateParamsError.

    `head_dims`: the (d_qk, d_v) pairs the template implements, or a `HeadDimSpan`.
    """
    if isinstance(head_dims, HeadDimSpan):
        outside = head_dims.outside(p.head_dim, p.head_dim_v)
        if outside:
            name, d, why = outside
            raise TemplateParamsError(f"{who}: head dims (d_qk={p.head_dim}, d_v={p.head_dim_v}): {name}={d} {why}")
    elif (p.head_dim, p.head_dim_v) not in head_dims:
        raise TemplateParamsError(
            f"{who}: head dims (d_qk={p.head_dim}, d_v={p.head_dim_v}) not in {sorted(head_dims)}"
        )
    if p.num_heads_q < 1 or p.num_heads_kv < 1 or p.num_heads_q % p.num_heads_kv != 0:
        raise TemplateParamsError(
            f"{who}: num_heads_q={p.num_heads_q} must be a positive multiple of num_heads_kv={p.num_heads_kv}"
        )
    if p.num_heads_v and (p.num_heads_v == p.num_heads_kv or p.num_heads_q % p.num_heads_v != 0):
        raise TemplateParamsError(
            f"{who}: num_heads_v={p.num_heads_v} must divide num_heads_q={p.num_heads_q} "
            f"and differ from num_heads_kv={p.num_heads_kv} (0 when V has K's heads)"
        )
    if p.is_thd and p.has_seqused and not p.ragged:
        raise TemplateParamsError(f"{who}: seqused is a dense-only padding mask; packed THD uses cu_seqlens")
    if p.ragged and not (p.is_thd and p.has_seqused and p.token_div_kv > 0):
        raise TemplateParamsError(
            f"{who}: the ragged-offset form is packed (is_thd) with lengths from seqused and "
            f"a token stride per group (token_div_q={p.token_div_q}, "
            f"token_div_kv={p.token_div_kv})"
        )
    if (p.token_div_lse or p.stats_per_batch) and not p.ragged:
        raise TemplateParamsError(f"{who}: token_div_lse / stats_per_batch belong to the ragged-offset form")
    if p.token_div_lse and p.stats_per_batch:
        raise TemplateParamsError(f"{who}: Stats are ragged (token_div_lse) or per batch, not both")
    if p.own_offsets:
        _check_own_offsets(p, who)
    for role in ("score_max", "score_sum_exp"):
        if p.ragged and getattr(p, f"has_{role}", False) and not (p.stats_per_batch or p.own_div(role)):
            raise TemplateParamsError(
                f"{who}: a ragged {role} reads its own offsets (own_offsets) or is per batch (stats_per_batch)"
            )
    if (p.bias_per_batch or p.bias_per_head or p.bias_key_strided) and not p.has_bias:
        raise TemplateParamsError(
            f"{who}: bias_per_batch / bias_per_head / bias_key_strided describe a bias; has_bias is False"
        )
    if p.has_alibi and not p.has_window_right:
        raise TemplateParamsError(f"{who}: ALiBi needs a causal mask (has_window_right; cuDNN's rule)")
    if isinstance(p, SdpaBwdFeatureParams):
        if p.has_dsinks and not p.has_sinks:
            raise TemplateParamsError(f"{who}: dsinks needs sinks")
        if p.has_dbias and not p.has_bias:
            raise TemplateParamsError(f"{who}: dbias needs a bias")
        if p.dbias_accum and not p.has_dbias:
            raise TemplateParamsError(f"{who}: dbias_accum without dbias")
        if p.has_dbias and p.is_thd and not p.dbias_accum:
            raise TemplateParamsError(f"{who}: a packed batch's dbias goes through the accumulator (dbias_accum)")


def _check_own_offsets(p: SdpaFeatureParams, who: str) -> None:
    """Own ragged offsets belong to the ragged-offset form: known roles, once each, in order, divisors > 0."""
    if not p.ragged:
        raise TemplateParamsError(f"{who}: own_offsets belong to the ragged-offset form")
    roles = [r for r, _, _ in p.own_offsets]
    if any(r not in OWN_OFFSET_ROLES for r in roles) or roles != sorted(set(roles), key=OWN_OFFSET_ROLES.index):
        raise TemplateParamsError(
            f"{who}: own_offsets roles {roles} must be distinct, from {OWN_OFFSET_ROLES}, in that order"
        )
    bad = [r for r, div, _ in p.own_offsets if div < 1]
    if bad:
        raise TemplateParamsError(f"{who}: own_offsets of {bad} need a token divisor >= 1")
