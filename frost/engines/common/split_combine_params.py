"""Params of the split-KV combine kernel, and the host model of split + combine (no cutlass import).

A split-KV forward cuts each query tile's key tiles into `num_splits` pieces (`key_split_range`); split s writes
its O_s (normalized over its own keys, fp32) and LSE_s (natural log, no sink; -inf when it saw no key) to the
workspace. The combine reduces them per query row:
    LSE = log(sum_s exp(LSE_s) + exp(sink))        (the sink, where the graph has one, enters once, here)
    O   = sum_s exp(LSE_s - LSE) * O_s
With cuDNN's score_max / score_sum_exp, split s also writes its row max M_s (natural units, no sink; -inf when it
saw no key) and the combine writes score_max = max(max_s M_s, sink) and score_sum_exp = exp(LSE - score_max)
(the sum of exp(logit - score_max) over every key and the sink: -inf and 0 where the row saw none).
A row whose LSE is -inf (no key in any split, no sink) gets O = 0, LSE = -inf; dense rows past seq_len_q get
O = 0, LSE = -inf as every forward writes them (docs/lengths.md). Call signature (declared order, the
forward's `o` / `stats` / score outputs as bound): ``fn(o, [lse], [score_max], [score_sum_exp], o_partial,
lse_partial, [max_partial], [seqused_q], [sinks], stream)``.

Packed batches (`is_thd`: frost's packed form or cuDNN's ragged offsets) keep their partials per batch entry as a
dense batch's, (splits, B, H_q, max_seq_len_q[, D_v]) with rows local to the sequence, so their size comes from
the declared B and envelope alone; the combine finds each sequence's first token and length on the device (as the
forwards do, capped at max_seqlen_q) and writes only the rows inside it. Its call: the outputs and partials as the
dense one's, then ``cu_seqlens_q, [seqused_q], [lse_offsets], [o_offsets], [score_max_offsets],
[score_sum_exp_offsets], [sinks], max_seqlen_q, [total_q], stream``.
"""

from __future__ import annotations

import math
from typing import Literal

from frost.engines.params import TemplateParams
from frost.errors import TemplateParamsError


class SplitCombineParams(TemplateParams):
    dtype: Literal["bf16", "fp16"] = "bf16"
    head_dim_v: int = 128
    num_heads_q: int = 1
    num_splits: int = 2
    has_lse: bool = False
    has_seqused: bool = False  # rows past seq_len_q are padding (O = 0, LSE = -inf)
    has_sinks: bool = False
    has_score_max: bool = False  # cuDNN's score_max output (each split's row max from `max_partial`)
    has_score_sum_exp: bool = False  # cuDNN's score_sum_exp output

    # packed batches (docs/decode.md): frost's packed form, or cuDNN's ragged offsets (the forward's fields of
    # the query group, Stats and O's own offsets: `frost.engines.params.SdpaFeatureParams`)
    is_thd: bool = False
    token_div_q: int = 0
    offset_dtype_q: Literal["int32", "int64"] = "int32"
    token_div_lse: int = 0
    offset_dtype_lse: Literal["int32", "int64"] = "int32"
    stats_per_batch: bool = False
    own_offsets: tuple[tuple[Literal["o", "score_max", "score_sum_exp"], int, Literal["int32", "int64"]], ...] = ()

    @property
    def has_score_stats(self) -> bool:
        """score_max or score_sum_exp is written (the forward writes each split's row max)."""
        return self.has_score_max or self.has_score_sum_exp

    @property
    def ragged(self) -> bool:
        """cuDNN's ragged-offset form (element offsets divided by `token_div_q`)."""
        return self.token_div_q > 0

    def own_div(self, role: str) -> int:
        """The token divisor of `role`'s own ragged offsets, or 0 where it takes q's."""
        return next((div for r, div, _ in self.own_offsets if r == role), 0)

    @property
    def head_dim(self) -> int:
        return self.head_dim_v

    @property
    def num_heads_kv(self) -> int:
        return self.num_heads_q

    @property
    def heads_v(self) -> int:
        return self.num_heads_q

    @property
    def offset_dtype_kv(self) -> str:
        return "int32"


def validate(p: SplitCombineParams) -> None:
    if p.num_splits < 2 or p.head_dim_v < 1 or p.num_heads_q < 1:
        raise TemplateParamsError(f"split combine: needs num_splits >= 2, head_dim_v and num_heads_q >= 1; got {p}")
    if p.ragged and not (p.is_thd and p.has_seqused):
        raise TemplateParamsError(f"split combine: the ragged-offset form is packed with lengths from seqused; got {p}")
    if not p.is_thd and (p.ragged or p.stats_per_batch or p.token_div_lse or p.own_offsets):
        raise TemplateParamsError(f"split combine: ragged fields on a dense batch; got {p}")
    if p.is_thd and p.has_seqused and not p.ragged:
        raise TemplateParamsError(f"split combine: frost's packed form reads lengths from cu_seqlens_q; got {p}")


def combine_arg_names(p: SplitCombineParams) -> list[str]:
    """The combine kernel's arguments (contract names of `frost.engines.sdpa_args`), in order."""
    outs = ["o"] + ["lse"] * p.has_lse + ["score_max"] * p.has_score_max + ["score_sum_exp"] * p.has_score_sum_exp
    partials = ["o_partial", "lse_partial"] + ["max_partial"] * p.has_score_stats
    if not p.is_thd:
        return outs + partials + ["seqused_q"] * p.has_seqused + ["sinks"] * p.has_sinks + ["stream"]
    return (
        outs
        + partials
        + ["cu_seqlens_q"]
        + ["seqused_q"] * p.has_seqused
        + ["lse_offsets"] * (p.has_lse and p.token_div_lse > 0)
        + [f"{role}_offsets" for role, _, _ in p.own_offsets]
        + ["sinks"] * p.has_sinks
        + ["max_seqlen_q"]
        + ["total_q"] * p.ragged
        + ["stream"]
    )


def key_split_range(n_min, n_max, split, num_splits: int, lesser=min):
    """(lo, hi): the key tiles split `split` of `num_splits` walks of a query tile's band [n_min, n_max):
    ceil((n_max - n_min) / num_splits) tiles each from n_min up, the last ones shorter or empty (lo == hi: an
    empty partial, LSE = -inf). One source for the kernel (device ints, `lesser=cutlass.min`: plain arithmetic
    the DSL traces as it runs) and the host model, so both cut the same way. The range comes from the actual
    lengths on the device, so a replay with new lengths cuts the new range."""
    per = (n_max - n_min + (num_splits - 1)) // num_splits
    lo = lesser(n_min + split * per, n_max)
    return lo, lesser(lo + per, n_max)


def combine_score_stats(maxes, lse: float, sink=None):
    """score_max and score_sum_exp of one query row on the host from each split's row max and the combined LSE."""
    m = max(list(maxes) + ([sink] if sink is not None else []), default=-math.inf)
    return m, 0.0 if m == -math.inf else math.exp(lse - m)


def combine_row(lses, outs, sink=None):
    """The combine of one query row on the host (float math): (O as a list, LSE)."""
    terms = list(lses) + ([sink] if sink is not None else [])
    m = max(terms) if terms else -math.inf
    if m == -math.inf:
        return [0.0] * len(outs[0]), -math.inf
    lse = m + math.log(sum(math.exp(t - m) for t in terms))
    w = [0.0 if x == -math.inf else math.exp(x - lse) for x in lses]
    return [sum(wi * o[c] for wi, o in zip(w, outs)) for c in range(len(outs[0]))], lse
