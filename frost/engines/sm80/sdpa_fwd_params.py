"""TemplateParams, validator and default knobs of the mma.sync SDPA forward template.

One template serves two arch lines: `sm80` (cc 8.x, and cc 9.0 as a fallback
below the wgmma kernel) and `sm120` (cc 12.x, about 99 KB of shared memory per
block). The family only changes the budgets and the knob defaults; the kernel
code is the same. No cutlass import here: the capability rows and the lowering
read this module while planning.
"""

from __future__ import annotations

from typing import Literal

from frost.engines.params import HeadDimSpan, SdpaFeatureParams, check_sdpa_features, round_up
from frost.errors import TemplateParamsError

#: Head dims the mma.sync templates (forward and backward) implement: d_qk and d_v each a multiple of 8
#: from 8 up to 256, independently.
HEAD_DIMS = HeadDimSpan(multiple=8, maximum=256)

#: The (head_dim, head_dim_v) pairs the tuning tables were measured at; every other pair takes the knobs of
#: the first of these that covers its tile dims (`tuned_head_dims`).
TUNED_HEAD_DIMS: tuple[tuple[int, int], ...] = ((64, 64), (96, 96), (128, 128), (192, 128), (256, 256))

#: Tiles span a head dim in whole granules of this many elements (the 8 x 32 swizzle atom; 8 x 64 where the
#: dim is a multiple of 64). A head dim between granules (72, 80, 112, ...) is padded up inside the kernel:
#: its loads fill the columns past the head dim with zeros and its stores skip them, so the declared
#: tensors are read and written as they are.
HEAD_DIM_GRANULE = 32


def tile_dim(d: int) -> int:
    """The head-dim extent of a kernel's tiles for head dim `d`: `d` rounded up to a whole granule."""
    return round_up(d, HEAD_DIM_GRANULE)


def tuned_head_dims(head_dim: int, head_dim_v: int) -> tuple[int, int]:
    """The tuned pair whose knobs (head_dim, head_dim_v) takes: itself when tuned, else the first tuned pair
    whose dims cover its tile dims (so its shared memory and registers fit wherever the tuned pair's do)."""
    if (head_dim, head_dim_v) in TUNED_HEAD_DIMS:
        return head_dim, head_dim_v
    d, dv = tile_dim(head_dim), tile_dim(head_dim_v)
    return next((a, b) for a, b in TUNED_HEAD_DIMS if a >= d and b >= dv)


#: Largest dynamic shared memory one block of each family may ask for (bytes).
#: sm80 is the A100's opt-in limit, so an sm80 artifact also fits every 9.0 part;
#: cc 8.6 / 8.9 parts have the sm120-sized budget (the adapter checks the target).
SMEM_BUDGET: dict[str, int] = {"sm80": 166912, "sm120": 101376}

_ELEM_BYTES = {"bf16": 2, "fp16": 2}

#: the most key-tile splits one forward takes (split-KV decode; the combine kernel unrolls over them)
MAX_SPLITS = 128


class TileHeadDims:
    """The tiles' head-dim extents of an mma.sync template (forward and backward alike)."""

    @property
    def tile_head_dim(self) -> int:
        """The Q / K (and dQ / dK) tiles' head-dim extent (`tile_dim`): head_dim, or head_dim padded up to a
        granule (loads zero-fill the columns past head_dim, stores and dQ adds skip them)."""
        return tile_dim(self.head_dim)

    @property
    def tile_head_dim_v(self) -> int:
        """The V / O (and dO / dV) tiles' head-dim extent (`tile_dim`)."""
        return tile_dim(self.head_dim_v)


class Sm80FwdParams(TileHeadDims, SdpaFeatureParams):
    """Plan-time description of one mma.sync forward kernel.

    Feature flags mirror the optional arguments of `frost.engines.sdpa_args`;
    `tile_m`, `tile_n`, `num_stages` and `num_warps` are knobs (speed only).
    """

    family: Literal["sm80", "sm120"] = "sm80"
    has_lse: bool = False
    has_score_max: bool = False  # write the row max of the scaled scores (cuDNN's score_max)
    has_score_sum_exp: bool = False  # write the row sum of exp(score - max) (cuDNN's score_sum_exp)
    has_block_mask: bool = False  # cuDNN's block_mask: one bit per (128 queries, 128 keys) tile pair
    # cuDNN's paged K/V cache: K's and V's container block sizes (0: dense K and V). Each key tile lies inside
    # one block (tile_n divides the block) or spans whole blocks (the block divides tile_n: each row read from its
    # own block, `paged_span`), read through the block tables (`frost.engines.common.paged`)
    paged_block_k: int = 0
    paged_block_v: int = 0
    # knobs
    tile_m: int = 128
    tile_n: int = 64
    num_stages: int = 1
    num_warps: int = 4
    # split-KV (a knob): each CTA walks one of this many pieces of its key tiles and writes an fp32 partial O and
    # LSE to the workspace; a combine kernel (`frost.engines.common.split_combine`) reduces them into O and Stats
    num_splits: int = 1
    # GQA packing (a knob): one query tile holds the query heads of a KV group, row m of group g being query
    # position m // r of head g * r + m % r (r = Hq / Hkv; `frost.engines.common.gqa_rows`)
    pack_gqa: bool = False

    @property
    def num_threads(self) -> int:
        return 32 * self.num_warps

    @property
    def rows_per_query(self) -> int:
        """Tile rows per query position: r = Hq / Hkv packed (`pack_gqa`), else 1."""
        return self.num_heads_q // self.num_heads_kv if self.pack_gqa else 1

    @property
    def split(self) -> bool:
        """The key tiles are cut into splits (partials in the workspace, then the combine kernel)."""
        return self.num_splits > 1

    @property
    def paged(self) -> bool:
        """K and V are read through block tables (cuDNN's paged cache)."""
        return self.paged_block_k > 0


def pack_gqa_reason(p: Sm80FwdParams) -> str | None:
    """Why the query heads of a KV group cannot share this forward's query tiles (None: they can)."""
    r = p.num_heads_q // p.num_heads_kv
    if r < 2:
        return "needs more query heads than KV heads"
    if p.tile_m % r:
        return f"tile_m={p.tile_m} is not a multiple of the {r} query heads of a group"
    if p.num_heads_v or p.has_score_mods or p.has_block_mask:
        return "serves V on K's heads, no bias, ALiBi or block mask"
    return None


def smem_bytes(p: Sm80FwdParams) -> int:
    """Dynamic shared memory the kernel asks for: Q tile + staged K and V tiles.

    O reuses the Q buffer in the epilogue. Each buffer is 1 KiB aligned.
    """
    eb = _ELEM_BYTES[p.dtype]

    def align(n: int) -> int:
        return (n + 1023) // 1024 * 1024

    q = align(p.tile_m * p.tile_head_dim * eb)
    k = align(p.tile_n * p.tile_head_dim * p.num_stages * eb)
    v = align(p.tile_n * p.tile_head_dim_v * p.num_stages * eb)
    return q + k + v


def validate(p: Sm80FwdParams) -> None:
    """Raise TemplateParamsError when the template cannot build `p`."""

    def bad(msg: str) -> None:
        raise TemplateParamsError(f"Sm80FwdParams: {msg}")

    check_sdpa_features(p, HEAD_DIMS, "Sm80FwdParams")
    if p.num_warps not in (4, 8):
        bad(f"num_warps={p.num_warps} not in (4, 8)")
    if p.tile_m % (16 * p.num_warps) != 0 or p.tile_m > 256:
        bad(f"tile_m={p.tile_m} must be a multiple of 16*num_warps={16 * p.num_warps} and <= 256")
    if p.tile_n not in (32, 64, 96, 128):
        bad(f"tile_n={p.tile_n} not in (32, 64, 96, 128)")
    if p.num_stages not in (1, 2, 3):
        bad(f"num_stages={p.num_stages} not in (1, 2, 3)")
    # cp.async row coverage: threads cover whole rows of a tile per pass
    for d in (p.tile_head_dim, p.tile_head_dim_v):
        kblk = 64 if d % 64 == 0 else 32
        rows_per_pass = p.num_threads // (kblk // 8)
        if p.tile_n % rows_per_pass != 0 or p.tile_m % rows_per_pass != 0:
            bad(f"tile_m={p.tile_m} / tile_n={p.tile_n} not a multiple of the copy pass height {rows_per_pass}")
    if p.paged_block_k or p.paged_block_v:
        if not (p.paged_block_k and p.paged_block_v):
            bad("paged_block_k and paged_block_v are both set (a paged cache) or both 0")
        if p.is_thd or not p.has_seqused:
            bad("a paged cache takes dense (B, H, S, D) queries with lengths from seqused")
        for role, bs in (("k", p.paged_block_k), ("v", p.paged_block_v)):
            if bs % p.tile_n != 0 and p.tile_n % bs != 0:
                bad(
                    f"tile_n={p.tile_n} must divide the {role} container's block size {bs} (a key tile lies "
                    f"inside one block) or be a multiple of it (a key tile spans whole blocks)"
                )
    if not 1 <= p.num_splits <= MAX_SPLITS:
        bad(f"num_splits={p.num_splits} not in 1..{MAX_SPLITS}")
    if p.pack_gqa:
        reason = pack_gqa_reason(p)
        if reason:
            bad(f"pack_gqa: {reason}")
    need = smem_bytes(p)
    if need > SMEM_BUDGET[p.family]:
        bad(f"needs {need} bytes of shared memory, family {p.family} allows {SMEM_BUDGET[p.family]}")
    # per-thread fp32 accumulator registers for O and S: keep well under 255
    acc_regs = (p.tile_m * p.tile_head_dim_v + p.tile_m * p.tile_n) // p.num_threads
    if acc_regs > 192:
        bad(
            f"tile {p.tile_m}x{p.tile_n} with d_v={p.head_dim_v} (tiles of {p.tile_head_dim_v}) on {p.num_warps} warps "
            f"needs {acc_regs} accumulator registers per thread (max 192)"
        )


# (family, head_dim, head_dim_v) -> (tile_m, tile_n, num_stages, num_warps), for the TUNED_HEAD_DIMS; every
# other pair takes its covering tuned pair's row (`tuned_head_dims`; not tuned at its own dims yet).
# H200 (sm_90a build), bf16, S=4096, hidden 2048: d64 128x128x2 stages beat 1 stage by ~9%;
# d128 128x64 with 1 stage beat 2 stages by ~9% (register pressure); 8 warps of 16 rows lost
# 15-20% at d <= 128 (twice the K/V smem reads per FLOP); d256 64x64 on 4 warps beat
# 128x64 on 8 warps by 2-7%. d192/v128 keeps 128x64 on 8 warps (validated, not tuned).
_DEFAULTS: dict[tuple[str, int, int], tuple[int, int, int, int]] = {
    ("sm80", 64, 64): (128, 128, 2, 4),
    ("sm80", 96, 96): (128, 64, 1, 4),
    ("sm80", 128, 128): (128, 64, 1, 4),
    ("sm80", 192, 128): (128, 64, 1, 8),
    ("sm80", 256, 256): (64, 64, 1, 4),
    ("sm120", 64, 64): (128, 128, 1, 4),
    ("sm120", 96, 96): (128, 64, 1, 4),
    ("sm120", 128, 128): (128, 64, 1, 4),
    ("sm120", 192, 128): (64, 64, 1, 4),
    ("sm120", 256, 256): (64, 64, 1, 4),
}

# Fallbacks tried in order when a caller's smem budget rejects the default.
_SMALL_SMEM = [(128, 64, 1, 4), (64, 64, 1, 4), (64, 32, 1, 4)]


def _valid(p: Sm80FwdParams) -> bool:
    try:
        validate(p)
    except TemplateParamsError:
        return False
    return True


#: the paged K/V block sizes the template serves: multiples of every default tile_n (a key tile inside one block),
#: and 16 and 32, which divide every default tile_n (a key tile spans whole blocks, `paged_span`)
PAGED_BLOCK_SIZES = (16, 32, 64, 128, 256)


def paged_tile_n(tile_n: int, block_sizes) -> int:
    """The key tile of a paged cache: `tile_n`, shrunk to the smallest block size of 64 rows or more so each tile
    lies in such a block; blocks below 64 rows (16, 32) do not shrink it: a tile spans them (`paged_span`)."""
    return min([tile_n, *(bs for bs in block_sizes if bs >= 64)])


def paged_span(block_size: int, tile_n: int) -> bool:
    """Does a key tile span several blocks of this size (each row from its own block) rather than lie inside one?"""
    return 0 < block_size < tile_n


def default_knobs(
    family: str, head_dim: int, head_dim_v: int, dtype: str = "bf16", smem_budget: int | None = None
) -> dict:
    """Good tile knobs per family and head dim (dict of tile_m, tile_n, num_stages, num_warps).

    Head dims outside the tuning table take the row of their covering tuned pair (`tuned_head_dims`).
    `smem_budget` (bytes, e.g. a cc 8.6 target's opt-in limit) picks the first
    smaller configuration that fits when the family default does not.
    """
    probe = Sm80FwdParams(family=family, dtype=dtype, head_dim=head_dim, head_dim_v=head_dim_v)
    try:
        check_sdpa_features(probe, HEAD_DIMS, "Sm80FwdParams")
    except TemplateParamsError as e:
        raise TemplateParamsError(f"{e}; no default knobs") from None
    key = (family, *tuned_head_dims(head_dim, head_dim_v))
    budget = min(SMEM_BUDGET[family], smem_budget) if smem_budget else SMEM_BUDGET[family]
    for tm, tn, st, nw in [_DEFAULTS[key]] + _SMALL_SMEM:
        probe = Sm80FwdParams(
            family=family,
            dtype=dtype,
            head_dim=head_dim,
            head_dim_v=head_dim_v,
            tile_m=tm,
            tile_n=tn,
            num_stages=st,
            num_warps=nw,
        )
        if smem_bytes(probe) <= budget and _valid(probe):
            return dict(tile_m=tm, tile_n=tn, num_stages=st, num_warps=nw)
    raise TemplateParamsError(
        f"Sm80FwdParams: no tile configuration for d_qk={head_dim}, d_v={head_dim_v} fits {budget} bytes"
    )
