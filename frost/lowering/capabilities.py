"""Capability rows: one record of data per engine. Rows judge nothing; `mismatch` does."""

from __future__ import annotations

from typing import Optional, Union

from pydantic import BaseModel, ConfigDict

from frost.engines.params import HeadDimSpan
from frost.engines.sm80.sdpa_fwd_params import PAGED_BLOCK_SIZES
from frost.engines.sm90.sdpa_fwd_params import PAGED_BLOCK_SIZES as SM90_PAGED_BLOCK_SIZES

#: the head dims the pending SM100 line states
FIXED_HEAD_DIMS = ((64, 64), (96, 96), (128, 128), (192, 128), (256, 256))
#: the mma.sync kernels pad a head dim up to their tiles' 32-element granule inside the kernel
MMA_SYNC_HEAD_DIMS = HeadDimSpan(multiple=8, maximum=256)
#: the wgmma forward pads a head dim up to a 16-element wgmma K step inside the kernel; d_qk and d_v go up to
#: 1024, a d_v above 256 in column slices of O (`frost.engines.sm90.sdpa_fwd_params.HEAD_DIMS`)
SM90_FWD_HEAD_DIMS = HeadDimSpan(multiple=8, maximum=1024)
KERNEL_FEATURES = frozenset(
    {"causal", "window_left", "window_right", "bottom_right", "gqa", "padding", "sinks", "thd", "stats"}
)
#: K and V with different head counts (each dividing the query heads), nested or not: every DSL engine serves them
#: (the backwards' CTAs walk the smallest run of query heads made of whole K groups and whole V groups, and write a K
#: or V head's tile where that head's group ends; the wgmma backward then loads the next head's tile by TMA,
#: `frost.engines.sm90.sdpa_bwd.swap_fine`)
SPLIT_HEAD_FEATURES = frozenset({"split_kv_heads", "unnested_kv_heads"})
#: the forwards' extras: split heads and the row max / sum-of-exp outputs (the two halves of Stats)
FWD_EXTRA_FEATURES = SPLIT_HEAD_FEATURES | {"score_max", "score_sum_exp"}
#: cuDNN's block_mask (forward only: cuDNN's backward has none): the mma.sync forward tests its bits per key tile,
#: the wgmma forward skips the key blocks whose bits are all clear and masks bit by bit the ones that straddle
BLOCK_MASK_FEATURES = frozenset({"block_mask"})
#: cuDNN's score modifiers: an additive bias, its gradient, ALiBi
SCORE_MOD_FEATURES = frozenset({"bias", "dbias", "alibi"})
#: the DSL kernels also serve cuDNN's ragged-offset form (element offsets divided in-kernel, every io tensor and row
#: output from its own offsets, per-batch Stats too; row outputs all ragged or all per batch: frost.adapters.dsl
#: .ragged_decline_reason)
DSL_FEATURES = KERNEL_FEATURES | {"ragged_offsets", "stats_per_batch"}
#: the mma.sync kernels read the bias and compute ALiBi in registers (frost.engines.common.score_mod)
MMA_SYNC_FEATURES = DSL_FEATURES | SCORE_MOD_FEATURES
#: the wgmma forward reads the bias and computes ALiBi in registers too (no GQA packing with them); the wgmma
#: backward serves them and dBias (SCORE_MOD_FEATURES)
WGMMA_SCORE_MOD_FEATURES = frozenset({"bias", "alibi"})


class CapabilityRow(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    adapter: str  # "module:Class", imported lazily
    direction: str  # "fwd" | "bwd"
    cc_min: tuple[int, int]
    cc_max: tuple[int, int]
    priority: int  # lower ranks first among engines that accept
    dtypes: tuple[str, ...]
    head_dims: Optional[Union[tuple[tuple[int, int], ...], HeadDimSpan]]  # None: any
    features: frozenset[str]
    knob_choices: dict[str, tuple[Union[bool, int, str], ...]] = {}
    vector_bytes: int = 16  # non-unit strides must be multiples of this many bytes
    pending: Optional[str] = None  # a kernel that is not available yet, and why
    explicit_only_on_gpu: bool = False  # the reference: never chosen silently on a GPU
    serves_cpu: bool = False
    int32_extents: bool = False  # its kernels take S, token totals and max_seq_len as 32-bit ints
    # with "paged_attention" in features: the container block sizes served (None: any, the engine's own check
    # judges the rest)
    paged_block_sizes: Optional[tuple[int, ...]] = None


def _fwd_bwd(
    name: str,
    module: str,
    cls: str,
    *,
    pending_fwd=None,
    pending_bwd=None,
    bwd_knobs=None,
    fwd_knobs=None,
    fwd_features=frozenset(),
    bwd_features=frozenset(),
    **kw,
) -> list[CapabilityRow]:
    """The forward and backward rows of one arch line; `bwd_knobs` / `fwd_knobs` are knob choices only one
    direction has, `fwd_features` / `bwd_features` features only one direction serves."""
    kw.setdefault("int32_extents", True)  # the CuTe DSL kernels' extent arguments are Int32
    bwd = {
        **kw,
        "features": kw["features"] | {"deterministic"} | bwd_features,
        "knob_choices": {**kw.get("knob_choices", {}), **(bwd_knobs or {})},
    }
    fwd = {
        **kw,
        "features": kw["features"] | fwd_features,
        "knob_choices": {**kw.get("knob_choices", {}), **(fwd_knobs or {})},
    }
    return [
        CapabilityRow(
            name=f"SdpaFwdDsl{name}", adapter=f"{module}:SdpaFwdDsl{cls}", direction="fwd", pending=pending_fwd, **fwd
        ),
        CapabilityRow(
            name=f"SdpaBwdDsl{name}", adapter=f"{module}:SdpaBwdDsl{cls}", direction="bwd", pending=pending_bwd, **bwd
        ),
    ]


def _mma_sync(name: str, module: str, *, cc: tuple, priority: int, num_stages: tuple) -> list[CapabilityRow]:
    """The rows of an mma.sync arch line (SM80 and SM120 share the template): they differ in the compute
    capabilities they take, their priority and the pipeline depths their shared memory allows (`module`: the
    adapters' dotted path, spelled out for the layer check)."""
    return _fwd_bwd(
        name,
        module,
        name,
        cc_min=cc[0],
        cc_max=cc[1],
        priority=priority,
        dtypes=("bf16", "fp16"),
        head_dims=MMA_SYNC_HEAD_DIMS,
        features=MMA_SYNC_FEATURES,
        fwd_features=FWD_EXTRA_FEATURES | BLOCK_MASK_FEATURES | PAGED_FEATURES,
        bwd_features=SPLIT_HEAD_FEATURES,
        paged_block_sizes=PAGED_BLOCK_SIZES,
        knob_choices={"tile_m": (64, 128), "tile_n": (32, 64, 128), "num_stages": num_stages, "num_warps": (4, 8)},
        bwd_knobs=MMA_SYNC_BWD_KNOBS,
        fwd_knobs=MMA_SYNC_FWD_KNOBS,
    )


#: the reference also serves cuDNN's ragged-offset form (it reads the offsets on the host)
REFERENCE_FEATURES = KERNEL_FEATURES | FWD_EXTRA_FEATURES | SCORE_MOD_FEATURES | {"ragged_offsets", "stats_per_batch"}
#: the cuDNN engine: every arch cuDNN serves, ranked below every DSL engine (and above the reference oracle);
#: cuDNN's own check_support judges head dims and the rest at plan time. Packed graphs go through cuDNN's ragged
#: form (frost's and cuDNN's own declarations alike; see frost/adapters/cudnn_lowering.py)
CUDNN_PRIORITY = 90
CUDNN_FEATURES = (
    KERNEL_FEATURES | FWD_EXTRA_FEATURES | {"bias", "dropout", "rng_dump", "alibi", "ragged_offsets", "stats_per_batch"}
)
#: cuDNN's paged K/V cache (forward only, as in cuDNN): the reference gathers through the tables, the cuDNN engine
#: lowers it to cuDNN's paged SDPA, the mma.sync forward reads each key tile from its block, or each row of a tile
#: spanning smaller blocks from its own (`frost.engines.sm80.sdpa_fwd_params.PAGED_BLOCK_SIZES`), the wgmma forward
#: loads each key tile by TMA from its block, or from each block of smaller ones it spans
#: (`frost.engines.sm90.sdpa_fwd_params.PAGED_BLOCK_SIZES`)
PAGED_FEATURES = frozenset({"paged_attention"})

MMA_SYNC_BWD_KNOBS = {"dq_splits": tuple(range(9))}
#: the forwards' split-KV counts (`frost.engines.sm80.sdpa_fwd_params.MAX_SPLITS`, the wgmma forward's too)
SPLIT_KNOB = {"num_splits": tuple(range(1, 129))}
#: the mma.sync forward's decode knobs: split-KV, GQA packing
MMA_SYNC_FWD_KNOBS = {**SPLIT_KNOB, "pack_gqa": (False, True)}


#: what the wgmma backward serves so far; the mma.sync backward (ranked after it on cc 9.0) serves the rest
SM90_BWD_FEATURES = DSL_FEATURES | {"deterministic"} | SCORE_MOD_FEATURES | SPLIT_HEAD_FEATURES
#: the wgmma backward pads a head dim up to its tiles' wgmma granule inside the kernel (`tile_head_dim`)
SM90_BWD_HEAD_DIMS = HeadDimSpan(multiple=8, maximum=256)

ROWS: tuple[CapabilityRow, ...] = tuple(
    _fwd_bwd(
        "Sm90",
        "frost.adapters.sm90",
        "Sm90",
        cc_min=(9, 0),
        cc_max=(9, 0),
        priority=10,
        dtypes=("bf16", "fp16"),
        head_dims=SM90_FWD_HEAD_DIMS,
        features=DSL_FEATURES,
        fwd_features=FWD_EXTRA_FEATURES | WGMMA_SCORE_MOD_FEATURES | BLOCK_MASK_FEATURES | PAGED_FEATURES,
        paged_block_sizes=SM90_PAGED_BLOCK_SIZES,
        knob_choices={
            "tile_m": (64, 128, 192),
            "tile_n": tuple(range(16, 257, 16)),
            "num_stages": (1, 2, 3, 4),
            "pack_gqa": (False, True),
            "v_slices": (1, 2, 3, 4),
            **SPLIT_KNOB,
        },
    )[:1]
    + [
        CapabilityRow(
            name="SdpaBwdDslSm90",
            adapter="frost.adapters.sm90:SdpaBwdDslSm90",
            direction="bwd",
            cc_min=(9, 0),
            cc_max=(9, 0),
            priority=10,
            dtypes=("bf16", "fp16"),
            int32_extents=True,
            head_dims=SM90_BWD_HEAD_DIMS,
            features=SM90_BWD_FEATURES,
            knob_choices={
                "tile_m": (64, 80, 128),
                "tile_n": (64, 128),
                "num_stages": (1, 2),
                "dq_fragments": (False, True),
                "dq_red": (False, True),
                "dk_first": (False, True),
                "rows_warp": (False, True),
                "rows_mbar": (False, True),
                "pdl": (False, True),
                "det_order": ("stair", "rotated"),
            },
        )
    ]
    + _mma_sync("Sm80", "frost.adapters.sm80", cc=((8, 0), (9, 0)), priority=20, num_stages=(1, 2, 3))
    + _mma_sync("Sm120", "frost.adapters.sm120", cc=((12, 0), (12, 9)), priority=10, num_stages=(1, 2))
    + _fwd_bwd(
        "Sm100",
        "frost.adapters.sm100",
        "Sm100",
        cc_min=(10, 0),
        cc_max=(10, 9),
        priority=10,
        dtypes=("bf16", "fp16"),
        head_dims=FIXED_HEAD_DIMS,
        features=DSL_FEATURES,
        pending_fwd="the SM100 (tcgen05 + TMEM) kernels are not written yet",
        pending_bwd="the SM100 (tcgen05 + TMEM) kernels are not written yet",
    )
    + [
        CapabilityRow(
            name=f"Sdpa{d.capitalize()}Cudnn",
            adapter=f"frost.adapters.cudnn:Sdpa{d.capitalize()}Cudnn",
            direction=d,
            cc_min=(8, 0),
            cc_max=(12, 9),
            priority=CUDNN_PRIORITY,
            dtypes=("bf16", "fp16"),
            head_dims=None,
            features=CUDNN_FEATURES
            | ({"deterministic", "dbias"} if d == "bwd" else BLOCK_MASK_FEATURES | PAGED_FEATURES),
        )
        for d in ("fwd", "bwd")
    ]
    + [
        CapabilityRow(
            name="SdpaFwdReference",
            adapter="frost.adapters.reference:SdpaFwdReference",
            direction="fwd",
            cc_min=(0, 0),
            cc_max=(99, 99),
            priority=100,
            dtypes=("bf16", "fp16", "fp32"),
            head_dims=None,
            features=REFERENCE_FEATURES | BLOCK_MASK_FEATURES | PAGED_FEATURES,
            vector_bytes=1,
            explicit_only_on_gpu=True,
            serves_cpu=True,
        ),
        CapabilityRow(
            name="SdpaBwdReference",
            adapter="frost.adapters.reference:SdpaBwdReference",
            direction="bwd",
            cc_min=(0, 0),
            cc_max=(99, 99),
            priority=100,
            dtypes=("bf16", "fp16", "fp32"),
            head_dims=None,
            features=REFERENCE_FEATURES | {"deterministic"},
            vector_bytes=1,
            explicit_only_on_gpu=True,
            serves_cpu=True,
        ),
    ]
)

_ALIASES = {
    "reference": "Reference",
    "ref": "Reference",
    "sm80": "DslSm80",
    "sm90": "DslSm90",
    "sm100": "DslSm100",
    "sm120": "DslSm120",
    "cudnn": "Cudnn",
}


def rows_for(direction: str) -> list[CapabilityRow]:
    return [r for r in ROWS if r.direction == direction]


def resolve_engine_name(name: str, direction: str) -> str:
    """Full engine name from a full name or a short alias ('sm80', 'reference')."""
    full = {r.name for r in rows_for(direction)}
    if name in full:
        return name
    tail = _ALIASES.get(name.lower())
    if tail is not None:
        cand = f"Sdpa{'Fwd' if direction == 'fwd' else 'Bwd'}{tail}"
        if cand in full:
            return cand
    from frost.errors import GraphError

    raise GraphError(f"unknown engine {name!r}; known: {sorted(full)} or aliases {sorted(_ALIASES)}")
