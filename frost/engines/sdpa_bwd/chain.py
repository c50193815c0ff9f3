"""The backward chain (preprocess -> main -> dQ convert): its kernels, their argument lists and names.

A backward joins the chain through its params (the `BwdChainParams` protocol), its main template's
module path and the main kernel's argument names (see the package docstring). The helper kernels
compile from `BwdHelperParams`, the few fields they read, so backward plans that differ only in masks,
tiles or other main-kernel knobs share them. No cutlass import: planning reads this module.
"""

from __future__ import annotations

from typing import Protocol

from frost.engines.params import SdpaFeatureParams
from frost.engines.sdpa_args import own_offset_args, ragged_tags, ragged_totals
from frost.engines.sdpa_bwd.scratch import packed_fragments, uses_turns

PREPROCESS = "frost.engines.sdpa_bwd.preprocess"
POSTPROCESS = "frost.engines.sdpa_bwd.postprocess"


class BwdChainParams(Protocol):
    """What the chain reads from a backward's params, besides the `SdpaFeatureParams` feature flags."""

    family: str  # how the chain's kernel names begin ("sm80", "sm120", "sm90", ...)
    deterministic: bool
    has_dsinks: bool
    tile_m: int  # query rows per turn semaphore
    dq_accum_blocked: bool  # the dense dQ accumulator in 8x8 blocks (rows padded to 8); else plain rows
    dq_splits: int  # 0: one accumulator (turns when deterministic); n >= 1: n copies along its batch mode
    dq_accum_tile: int  # 0: rows (or 8x8 blocks); m > 0: tiles of m rows in wgmma fragment order (dense)
    dbias_accum: bool  # dBias through the fp32 accumulator: zeroed by the preprocess, written by the dQ convert
    dbias_accum_per_batch: bool  # that accumulator's batch / head modes are full (else of extent 1)
    dbias_accum_per_head: bool
    dbias_sum_batch: bool  # the dQ convert sums the accumulator's batch / head copies (a deterministic dBias)
    dbias_sum_heads: bool
    pdl: bool  # the main kernel waits for the preprocess itself: the chain launches as programmatic dependents


class BwdHelperParams(SdpaFeatureParams):
    """The compile params of a helper kernel: the fields of `HELPER_FIELDS[stage]`, the rest at defaults.

    The accumulator layout is the helpers' input contract: `dq_accum_blocked` (dense only) stores it in
    8x8 blocks, `dq_accum_tile` > 0 (dense only) in tiles of that many rows, each in the SM90 wgmma
    fragment order (`accum.fragment_coord`), else rows; `dq_splits` copies (0 or 1: one) stack copy-major
    along its batch mode.
    """

    family: str = "sm80"
    has_dsinks: bool = False
    deterministic: bool = False
    dq_accum_blocked: bool = False
    dq_splits: int = 0
    dq_accum_tile: int = 0
    pdl: bool = False  # the main kernel is launched as a programmatic dependent of the preprocess, the dQ convert
    # of the main kernel (cc 9.0 and up)
    dbias_accum: bool = False
    dbias_accum_per_batch: bool = False
    dbias_accum_per_head: bool = False
    dbias_sum_batch: bool = False  # the accumulator's copies along batch / heads sum into one dBias element
    dbias_sum_heads: bool = False


#: the ragged-offset form's fields (the helpers view the bound tensors with them and walk each sequence's rows)
_RAGGED_FIELDS = (
    "token_div_q",
    "token_div_kv",
    "offset_dtype_q",
    "stats_per_batch",
    "token_div_lse",
    "offset_dtype_lse",
)
#: the dBias accumulator's fields (the preprocess zeroes it, the dQ convert writes dBias from it)
_DBIAS_FIELDS = ("dbias_accum", "dbias_accum_per_batch", "dbias_accum_per_head")
#: the dQ convert also sums the copies of a deterministic dBias accumulator
_DBIAS_SUM_FIELDS = ("dbias_sum_batch", "dbias_sum_heads")
#: the fields each helper kernel reads; its key keeps only these (has_sinks rides along with has_dsinks)
HELPER_FIELDS = {
    "preprocess": (
        "family",
        "dtype",
        "head_dim",
        "head_dim_v",
        "num_heads_q",
        "is_thd",
        "has_seqused",
        "has_sinks",
        "has_dsinks",
        "deterministic",
        "dq_accum_blocked",
        "dq_splits",
        "dq_accum_tile",
        *_DBIAS_FIELDS,
        "pdl",
    )
    + _RAGGED_FIELDS,
    "postprocess": (
        "family",
        "dtype",
        "head_dim",
        "head_dim_v",
        "num_heads_q",
        "is_thd",
        "has_sinks",
        "has_dsinks",
        "dq_accum_blocked",
        "dq_splits",
        "dq_accum_tile",
        *_DBIAS_FIELDS,
        *_DBIAS_SUM_FIELDS,
        "pdl",
    )
    + _RAGGED_FIELDS,
}


#: the io tensors each helper reads or writes (its share of the ragged form's own offsets)
HELPER_IO = {"preprocess": ("o", "do"), "postprocess": ("dq",)}
#: the io tensors of a main kernel that may carry their own ragged offsets (q and k lead the groups)
MAIN_IO = ("v", "do", "dk", "dv")


def stage_params(p, stage: str):
    """The params one kernel of the chain compiles with: the main kernel's own, or a helper's projection."""
    fields = HELPER_FIELDS.get(stage)
    if fields is None:
        return p
    own = tuple(o for o in p.own_offsets if o[0] in HELPER_IO[stage])
    return BwdHelperParams(**{f: getattr(p, f) for f in fields}, own_offsets=own)


def lengths_args(p, q: bool = True, kv: bool = True) -> list[str]:
    """The sequence-length arguments of a kernel: cu_seqlens (THD) or seqused (padding), q and / or kv side;
    the ragged-offset form's Stats offsets (`lse_offsets`) and own io offsets (`MAIN_IO`) with a main kernel's
    (both sides)."""
    out = []
    if p.is_thd:
        out += (["cu_seqlens_q"] if q else []) + (["cu_seqlens_kv"] if kv else [])
    if p.has_seqused:
        out += (["seqused_q"] if q else []) + (["seqused_kv"] if kv else [])
    if q and kv and p.token_div_lse:
        out.append("lse_offsets")
    if q and kv:
        out += own_offset_args(p, MAIN_IO)
    return out


def preprocess_args(p) -> list[str]:
    """o, do, lse, lengths (q side), o_offsets? / do_offsets?, lse_offsets? and sinks?, dpsum, dq_accum,
    dq_semaphore?, dsink_partial?, dbias_accum?, (ragged: max_seqlen_q, total_q, total_kv), stream."""
    args = ["o", "do", "lse"] + lengths_args(p, kv=False) + own_offset_args(p, HELPER_IO["preprocess"])
    if p.has_dsinks:
        args += ["lse_offsets"] * (p.token_div_lse > 0) + ["sinks"]
    args += ["dpsum", "dq_accum"] + (["dq_semaphore"] if uses_turns(p) else [])
    if p.has_dsinks:
        args.append("dsink_partial")
    return args + ["dbias_accum"] * p.dbias_accum + ragged_helper_scalars(p) + ["stream"]


def postprocess_args(p) -> list[str]:
    """dq, dsinks?, dbias? (from its accumulator), dq_accum, dsink_partial?, dbias_accum?, (ragged: cu_seqlens_q,
    seqused_q, dq_offsets?), (packed fragment tiles: cu_seqlens_q), softmax_scale, (ragged: max_seqlen_q, total_q,
    total_kv), (packed fragment tiles: max_seqlen_q), stream."""
    args = ["dq"] + (["dsinks"] if p.has_dsinks else []) + ["dbias"] * p.dbias_accum + ["dq_accum"]
    if p.has_dsinks:
        args.append("dsink_partial")
    args += ["dbias_accum"] * p.dbias_accum + ["cu_seqlens_q", "seqused_q"] * p.ragged
    args += own_offset_args(p, HELPER_IO["postprocess"]) + ["cu_seqlens_q"] * packed_fragments(p)
    return args + ["softmax_scale"] + ragged_helper_scalars(p) + ["max_seqlen_q"] * packed_fragments(p) + ["stream"]


def ragged_helper_scalars(p) -> list[str]:
    """The ragged-offset form's helpers walk each sequence's rows (grid: the longest sequence's row blocks per
    batch entry), and view the bound tensors with the token envelopes."""
    return ["max_seqlen_q"] + ragged_totals(p) if p.ragged else []


def bwd_chain(p, main_template: str, main_args: list[str]) -> list[tuple[str, str, list[str], object]]:
    """(stage, template module, argument names, stage params) of each kernel, in launch order."""
    return [
        ("preprocess", PREPROCESS, preprocess_args(p), stage_params(p, "preprocess")),
        ("main", main_template, list(main_args), p),
        ("postprocess", POSTPROCESS, postprocess_args(p), stage_params(p, "postprocess")),
    ]


def chain_of(p) -> list:
    """`bwd_chain` of a backward's params: its params module (the one defining its class) names the main
    template (`MAIN_TEMPLATE`) and its arguments (`main_args`)."""
    import importlib

    pm = importlib.import_module(type(p).__module__)
    return bwd_chain(p, pm.MAIN_TEMPLATE, pm.main_args(p))


def chain_args(chain: list, values: dict) -> list[tuple[str, list]]:
    """Bind a `bwd_chain`: (template, positional args) per kernel, in launch order.

    `values` maps argument names (sdpa_args.py names, scratch names from
    `scratch.scratch_layout`, scalars, "stream") to the objects to pass.
    """
    out = []
    for _, template, names, _ in chain:
        missing = [n for n in names if n not in values]
        if missing:
            raise KeyError(f"{template}: missing arguments {missing}")
        out.append((template, [values[n] for n in names]))
    return out


def name_dims(p) -> list[str]:
    """family, dtype and head dims: how every kernel name of a chain begins."""
    return [p.family, p.dtype, f"d{p.head_dim}" + (f"v{p.head_dim_v}" if p.head_dim_v != p.head_dim else "")]


def name_tags(flags) -> list[str]:
    """The tags of the (flag, tag) pairs whose flag is set, in order."""
    return [tag for flag, tag in flags if flag]


def helper_suffix(p: BwdHelperParams) -> str:
    """The name of a helper kernel: only the fields its key keeps (`HELPER_FIELDS`)."""
    dbias = (
        "dbiasacc"
        + "b" * p.dbias_accum_per_batch
        + "h" * p.dbias_accum_per_head
        + "sum" * (p.dbias_sum_batch or p.dbias_sum_heads)
        + "b" * p.dbias_sum_batch
        + "h" * p.dbias_sum_heads
    )
    return "_".join(
        name_dims(p)
        + [f"h{p.num_heads_q}"]
        + name_tags(
            (
                (p.is_thd, "thd"),
                (p.has_seqused, "pad"),
                (p.has_sinks and not p.has_dsinks, "sink"),
                (p.has_dsinks, "dsink"),
                (p.dbias_accum, dbias),
                (p.deterministic, "det"),
                (p.dq_accum_blocked, "qb"),
                (p.dq_splits > 0, f"sp{p.dq_splits}"),
                (p.dq_accum_tile > 0, f"qf{p.dq_accum_tile}"),
                (p.pdl, "pdl"),
            )
        )
        + ragged_tags(p)
    )
