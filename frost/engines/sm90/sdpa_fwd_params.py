"""Parameters of the SM90 (wgmma + TMA, warp-specialized) SDPA forward template.

Feature flags follow `frost.engines.sdpa_args`; knobs change speed only. This
module never imports cutlass, so capability rows and validators can use it
cheaply.
"""

from __future__ import annotations


import math

from frost.engines.params import HeadDimSpan, SdpaFeatureParams, check_sdpa_features, round_up
from frost.errors import TemplateParamsError

#: Head dims the template implements: d_qk and d_v each a multiple of 8, independently, up to 1024 (cuDNN's
#: frontend bounds neither on Hopper from 9.10 on). A d_v above 256 runs in column slices of O (`v_slices`).
HEAD_DIMS = HeadDimSpan(multiple=8, maximum=1024)
#: The widest O / V tile one wgmma PV GEMM covers (its N extent).
MAX_TILE_DIM_V = 256
#: Tiles span a head dim in whole wgmma K steps of this many elements. A head dim between steps (72, 104, ...)
#: is padded up inside the kernel: TMA loads zero-fill the columns past it (zeros add nothing to Q K^T or
#: P V), TMA stores clip them and the row-predicated stores skip them, so the declared tensors are read and
#: written as they are.
HEAD_DIM_GRANULE = 16
SMEM_BUDGET_BYTES = 227 * 1024  # sm_90 opt-in shared memory per block


def tile_dim(d: int) -> int:
    """The head-dim extent of the tiles for head dim `d`: `d` rounded up to a whole granule."""
    return round_up(d, HEAD_DIM_GRANULE)


def slice_dim(head_dim_v: int, slices: int) -> int:
    """The V / O tiles' extent when O's `slices` column slices split d_v evenly (`v_slices`)."""
    return tile_dim(-(-head_dim_v // slices))


class Sm90FwdParams(SdpaFeatureParams):
    # features (plan-time facts)
    has_lse: bool = True
    has_score_max: bool = False  # write the row max of the scaled scores (cuDNN's score_max)
    has_score_sum_exp: bool = False  # write the row sum of exp(score - max) (cuDNN's score_sum_exp)
    has_block_mask: bool = False  # cuDNN's block_mask: one bit per (128 queries, 128 keys) tile pair
    # cuDNN's paged K/V cache: K's and V's container block sizes (0: dense K and V). A key tile lies inside one
    # block (tile_n divides it: one TMA load names the block read from the table on the device) or spans whole
    # blocks (it divides tile_n: one TMA load per block, `paged_span`)
    paged_block_k: int = 0
    paged_block_v: int = 0
    # knobs (speed only)
    tile_m: int = 128
    tile_n: int = 128
    num_stages: int = 2
    intra_wg_overlap: bool = True
    pingpong: bool = True  # a no-op with one consumer warpgroup (tile_m=64)
    separate_o_smem: bool = True  # a preference: O reuses Q's tile when its own does not fit
    persistent: bool = True
    pack_gqa: bool = False  # one M tile holds the r query heads that share a K head and a V head (one stream)
    # O's columns in this many slices, each its own work tile (which recomputes S): how a d_v above 256 runs
    v_slices: int = 1
    sm_count: int = 132
    # split-KV (a knob, as the mma.sync forward's): each work tile's key tiles are cut into this many pieces
    # (`key_split_range`), each its own work tile writing an fp32 partial O and LSE to the workspace; the shared
    # combine kernel (`frost.engines.common.split_combine`) reduces them into O and Stats
    num_splits: int = 1

    @property
    def tile_head_dim(self) -> int:
        """The Q / K tiles' head-dim extent (`tile_dim`)."""
        return tile_dim(self.head_dim)

    @property
    def tile_head_dim_v(self) -> int:
        """The V / O tiles' head-dim extent (`tile_dim`): one slice's, with `v_slices`."""
        return slice_dim(self.head_dim_v, self.v_slices)

    @property
    def paged(self) -> bool:
        """K and V are read through block tables (cuDNN's paged cache)."""
        return self.paged_block_k > 0

    @property
    def split(self) -> bool:
        """The key tiles are cut into splits (partials in the workspace, then the combine kernel)."""
        return self.num_splits > 1

    @property
    def num_mma_wg(self) -> int:
        return self.tile_m // 64

    @property
    def pack_group(self) -> int:
        """r: the query heads that read one K head and one V head (Hq/Hkv when V has K's heads; else the
        largest group dividing both Hq/Hkv and Hq/Hv)."""
        return math.gcd(self.qhead_per_kvhead, self.qhead_per_vhead)

    @property
    def rows_per_query(self) -> int:
        """Tile rows per query position: r when GQA heads are packed, else 1."""
        return self.pack_group if self.pack_gqa else 1


def _smem(p: Sm90FwdParams, separate_o: bool) -> int:
    e = 2
    d, dv = p.tile_head_dim, p.tile_head_dim_v
    q = p.tile_m * d * e
    k = p.num_stages * p.tile_n * d * e
    v = p.num_stages * p.tile_n * dv * e
    o = p.tile_m * dv * e if separate_o else max(0, p.tile_m * dv * e - q)
    return q + k + v + o + 1024  # barriers, padded to the 1 KiB alignment of the tiles


def separate_o(p: Sm90FwdParams) -> bool:
    """Does the O staging tile get its own shared memory? (asked for and it fits; else it reuses Q's)"""
    return p.separate_o_smem and _smem(p, True) <= SMEM_BUDGET_BYTES


def smem_bytes(p: Sm90FwdParams) -> int:
    """Shared memory the template allocates (tiles + barriers + alignment slack)."""
    return _smem(p, separate_o(p))


def pack_gqa_reason(p: Sm90FwdParams):
    """Why the query heads of a kv head cannot share one M tile, or None.

    A packed row is m = s * r + j (query position s, head j of the group). Q and
    O move by TMA with a two-mode (r, rows / r) box, so r must divide the 64 rows
    of one consumer warpgroup's O tile (and so the M tile). Score modifiers take
    one head per tile (its bias rows, its ALiBi slope), so they are served unpacked.
    """
    if p.num_heads_q % p.num_heads_kv != 0 or p.num_heads_q % p.heads_v != 0:
        return None  # check_sdpa_features reports it
    if p.has_score_mods:
        return "pack_gqa is not served with score modifiers (bias, ALiBi): a tile reads one query head's bias and slope"
    if p.has_block_mask:
        return "pack_gqa is not served with block_mask: a tile reads one query head's bits"
    if p.v_slices > 1:
        return (
            "pack_gqa is not combined with column slices of O (v_slices, a d_v above 256): ptxas spills the "
            "packed rows' addressing beside the slice's"
        )
    r = p.pack_group
    if r < 2:
        if p.num_heads_v:
            return (
                f"pack_gqa needs query heads that share both a K head and a V head (Hq/Hkv = "
                f"{p.qhead_per_kvhead}, Hq/Hv = {p.qhead_per_vhead})"
            )
        return f"pack_gqa needs num_heads_q > num_heads_kv (got {p.num_heads_q}:{p.num_heads_kv})"
    if 64 % r != 0:
        return f"pack_gqa needs Hq/Hkv to divide 64 (a warpgroup's rows); Hq/Hkv = {r}"
    return None


def validate(p: Sm90FwdParams) -> None:
    """Raise TemplateParamsError when the template cannot be built for `p`."""

    def bad(msg: str):
        raise TemplateParamsError(f"Sm90FwdParams: {msg}")

    check_sdpa_features(p, HEAD_DIMS, "Sm90FwdParams")
    if p.bottom_right and not (p.has_window_left or p.has_window_right):
        bad("bottom_right only has meaning with a window (causal is window_right=0)")
    if p.tile_m not in (64, 128, 192):
        bad(f"tile_m={p.tile_m} must be 64, 128 or 192 (64 rows per consumer warpgroup)")
    if p.tile_n % 16 != 0 or not 16 <= p.tile_n <= 256:
        bad(f"tile_n={p.tile_n} must be a multiple of 16 in [16, 256]")
    if p.num_stages not in (1, 2, 3, 4):
        bad(f"num_stages={p.num_stages} must be 1..4")
    if not p.intra_wg_overlap:
        bad("only the intra-warpgroup-overlap mainloop is implemented")
    if p.sm_count < 1:
        bad(f"sm_count={p.sm_count} must be positive")
    if p.v_slices < 1:
        bad(f"v_slices={p.v_slices} must be positive")
    if p.tile_head_dim_v > MAX_TILE_DIM_V:
        bad(
            f"d_v={p.head_dim_v} in {p.v_slices} slice(s) makes {p.tile_head_dim_v}-column O tiles, above "
            f"{MAX_TILE_DIM_V}: v_slices must be at least {min_v_slices(p.head_dim_v)}"
        )
    if p.v_slices > 1 and (p.v_slices - 1) * p.tile_head_dim_v >= p.head_dim_v:
        bad(f"v_slices={p.v_slices} leaves the last slice of d_v={p.head_dim_v} empty")
    if p.pack_gqa:
        reason = pack_gqa_reason(p)
        if reason:
            bad(reason)
    reason = split_reason(p)
    if reason:
        bad(reason)
    reason = paged_reason(p)
    if reason:
        bad(reason)
    need = smem_bytes(p)
    if need > SMEM_BUDGET_BYTES:
        bad(f"tiles need {need} bytes of shared memory, more than {SMEM_BUDGET_BYTES}")


#: the paged K/V block sizes the template serves: those a key tile lies inside (64 and up: every default tile_n
#: shrinks to divide them) and those a key tile spans whole (16 and 32: one TMA load per block, each a whole number
#: of the 8-row shared-memory swizzle atoms), up to the largest block the benchmarks and serving engines use
PAGED_BLOCK_SIZES = (16, 32, 64, 128, 256)

#: a block a key tile spans holds whole 8-row swizzle atoms: each block's TMA load fills its own atoms
PAGED_SPAN_ROWS = 8


def paged_tile_n(tile_n: int, block_sizes) -> int:
    """The key tile of a paged cache: the widest multiple of 16 up to `tile_n` that divides every block size, so
    each key tile lies in one block (128 stays 128 on 128- and 256-row blocks; 112 and 80 become 64); where that is
    below 64 (blocks of 16 or 32 rows), the widest that every block size divides or is divided by instead, so a
    key tile spans whole blocks (128 on 16-row blocks; 112 becomes 96 on 32-row blocks)."""
    inside = next(t for t in range(tile_n - tile_n % 16, 0, -16) if all(bs % t == 0 for bs in block_sizes))
    if inside >= min(64, tile_n):
        return inside
    return next(t for t in range(tile_n - tile_n % 16, 0, -16) if all(bs % t == 0 or t % bs == 0 for bs in block_sizes))


def paged_span(block_size: int, tile_n: int) -> bool:
    """Does a key tile span several blocks of this size (one TMA load per block) rather than lie inside one?"""
    return 0 < block_size < tile_n


def paged_reason(p: Sm90FwdParams):
    """Why a paged cache's K and V cannot be read as declared in `p`, or None (dense K and V: None)."""
    if not (p.paged_block_k or p.paged_block_v):
        return None
    if not (p.paged_block_k and p.paged_block_v):
        return "paged_block_k and paged_block_v are both set (a paged cache) or both 0"
    if p.is_thd or not p.has_seqused:
        return "a paged cache takes dense (B, H, S, D) queries with lengths from seqused"
    for role, bs in (("k", p.paged_block_k), ("v", p.paged_block_v)):
        if bs % p.tile_n == 0:
            continue  # a key tile inside one block
        if p.tile_n % bs != 0 or bs % PAGED_SPAN_ROWS != 0:
            return (
                f"tile_n={p.tile_n} must divide the {role} container's block size {bs} (a key tile's TMA load "
                f"lies inside one block) or be a multiple of it, with blocks of a multiple of "
                f"{PAGED_SPAN_ROWS} rows (one TMA load per block)"
            )
    return None


def split_reason(p: Sm90FwdParams):
    """Why `p.num_splits` cannot be served, or None."""
    from frost.engines.sm80.sdpa_fwd_params import MAX_SPLITS

    if not 1 <= p.num_splits <= MAX_SPLITS:
        return f"num_splits={p.num_splits} not in 1..{MAX_SPLITS}"
    if p.split and (p.v_slices > 1 or p.has_block_mask):
        return "num_splits > 1 is not combined with column slices of O (v_slices) or a block_mask"
    return None


def min_v_slices(head_dim_v: int) -> int:
    """The fewest column slices of O whose tiles a wgmma PV GEMM covers (d_v up to 256: one)."""
    n = 1
    while slice_dim(head_dim_v, n) > MAX_TILE_DIM_V:
        n += 1
    return n


def score_mods_of(flags: dict) -> bool:
    """The features whose loads keep the forward on two consumer warpgroups (`default_knobs`' `score_mods`): a
    bias, ALiBi or a block mask, from feature flags as `Sm90FwdParams` takes them."""
    return any(flags.get(f) for f in ("has_bias", "has_alibi", "has_block_mask"))


def default_knobs(
    head_dim: int, head_dim_v: int | None = None, *, sm_count: int = 132, score_mods: bool = False
) -> dict:
    """The best measured configuration per head dim on the H200 (bf16, 16k tokens, hidden 2048).

    Measured against alternatives: persistent beats one-CTA-per-tile by 5-7% unbanded
    and by 3-5% banded (with the zigzag longest-first order); 128x128 beats
    tile_n 144/160/176 for d=128. Three consumer warpgroups (192 rows, a warpgroup's softmax hidden behind two
    others' GEMMs) beat two from d=72 to d=112: 192x112 for tiles up to 96 wide (d=80 1.08x / 1.12x full / causal,
    d=96 1.10x / 1.09x), 192x80 up to 112 (d=112 1.03x); at d=128 192x80 was 0.97x / 1.02x
    (benchmarks/results/2026-12-02-h200-run18). `score_mods` (a bias, ALiBi or a block mask) keeps two (128x128):
    their loads and bit words spill three warpgroups' 160 registers. The knobs that lost (head-fastest order,
    rotated K/V sweeps, early O rescale, L2-sized head sections) were removed; their measurements are
    in benchmarks/results/2026-11-30-h200-run3/README.md, and a wider smem swizzle for padded tiles (`tile_granule`)
    in run 18. d=192 follows FlashAttention-3's shapes and is not tuned.

    Other pairs take the row of the wider of their tile head dims (so a d_v above d_qk gets the registers
    and shared memory its O tile needs). A d_v above 256 runs in the fewest column slices of O that fit
    (`min_v_slices`); the row then follows the slice's width. Above 256 (d_qk) one consumer warpgroup over
    64-key blocks, two stages where they fit, else one, then 32-key blocks (not tuned).
    """
    dv = head_dim if head_dim_v is None else head_dim_v
    try:
        check_sdpa_features(Sm90FwdParams(head_dim=head_dim, head_dim_v=dv), HEAD_DIMS, "Sm90FwdParams")
    except TemplateParamsError as e:
        raise TemplateParamsError(f"{e}; no default knobs") from None
    slices = min_v_slices(dv)
    wide = max(tile_dim(head_dim), slice_dim(dv, slices))
    k = dict(
        tile_m=128,
        tile_n=128,
        num_stages=2,
        intra_wg_overlap=True,
        pingpong=True,
        separate_o_smem=True,
        persistent=True,
        sm_count=sm_count,
        v_slices=slices,
    )
    if wide <= 64:
        k.update(tile_m=192, tile_n=128)
    elif wide <= 96:
        k.update(tile_m=192, tile_n=112)
    elif wide <= 112:
        k.update(tile_m=192, tile_n=80)
    elif wide <= 128:
        k.update(tile_n=128)
    elif wide <= 192:
        # sliced O (d_v above 256) on 96-key blocks: at 112 ptxas spills cuDNN's ragged form's offsets
        k.update(tile_n=96 if slices > 1 else 112 if dv > 128 else 128, separate_o_smem=False)
    elif wide <= 256:
        k.update(tile_n=80, separate_o_smem=False, pingpong=False)
    else:
        k.update(tile_m=64, tile_n=64, pingpong=False)
        for stages, tile_n in ((2, 64), (1, 64), (1, 32)):
            k.update(num_stages=stages, tile_n=tile_n)
            if smem_bytes(Sm90FwdParams(head_dim=head_dim, head_dim_v=dv, **k)) <= SMEM_BUDGET_BYTES:
                break
    if score_mods and k["tile_m"] == 192:
        k.update(tile_m=128, tile_n=128)
    return k
