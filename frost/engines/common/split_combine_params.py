"""Params of the split-KV combine kernel, and the host model of split + combine (no cutlass import).

A split-KV forward cuts each query tile's key tiles into `num_splits` pieces (`key_split_range`); split s writes
its O_s (normalized over its own keys, fp32) and LSE_s (natural log, no sink; -inf when it saw no key) to the
workspace. The combine reduces them per query row:
    LSE = log(sum_s exp(LSE_s) + exp(sink))        (the sink, where the graph has one, enters once, here)
    O   = sum_s exp(LSE_s - LSE) * O_s
A row whose LSE is -inf (no key in any split, no sink) gets O = 0, LSE = -inf; dense rows past seq_len_q get
O = 0, LSE = -inf as every forward writes them (docs/lengths.md). Call signature (declared order, the
forward's `o` / `stats` as bound): ``fn(o, [lse], o_partial, lse_partial, [seqused_q], [sinks], stream)``.
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

    # what the shared fake arguments (`frost.engines.common.sdpa_entry.FakeArgs`) read of a params record
    is_thd: bool = False

    @property
    def head_dim(self) -> int:
        return self.head_dim_v

    @property
    def num_heads_kv(self) -> int:
        return self.num_heads_q

    @property
    def heads_v(self) -> int:
        return self.num_heads_q


def validate(p: SplitCombineParams) -> None:
    if p.num_splits < 2 or p.head_dim_v < 1 or p.num_heads_q < 1 or p.is_thd:
        raise TemplateParamsError(
            f"split combine: needs num_splits >= 2, head_dim_v, num_heads_q >= 1 and dense rows; got {p}"
        )


def combine_arg_names(p: SplitCombineParams) -> list[str]:
    """The combine kernel's arguments (contract names of `frost.engines.sdpa_args`), in order."""
    return (
        ["o"]
        + ["lse"] * p.has_lse
        + ["o_partial", "lse_partial"]
        + ["seqused_q"] * p.has_seqused
        + ["sinks"] * p.has_sinks
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


def combine_row(lses, outs, sink=None):
    """The combine of one query row on the host (float math): (O as a list, LSE)."""
    terms = list(lses) + ([sink] if sink is not None else [])
    m = max(terms) if terms else -math.inf
    if m == -math.inf:
        return [0.0] * len(outs[0]), -math.inf
    lse = m + math.log(sum(math.exp(t - m) for t in terms))
    w = [0.0 if x == -math.inf else math.exp(x - lse) for x in lses]
    return [sum(wi * o[c] for wi, o in zip(w, outs)) for c in range(len(outs[0]))], lse
