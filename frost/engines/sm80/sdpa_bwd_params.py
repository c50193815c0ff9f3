"""TemplateParams and validator of the mma.sync SDPA backward's main kernel (its knobs: `sdpa_bwd_knobs`).

The chain around it (preprocess, dQ convert, workspace) is the shared skeleton of
`frost.engines.sdpa_bwd`; this module is its part of that contract: `Sm80BwdParams`,
`MAIN_TEMPLATE` and `main_args`. The main kernel (`sdpa_bwd`): one CTA per (key tile,
kv head, batch) recomputes P from the LSE, accumulates dK / dV in registers over every
query head of its GQA group and every query tile in the mask band, and adds dQ partials
into the fp32 accumulator (red.global; in deterministic mode key tiles take turns per
(batch, head, query tile) through a semaphore, so the sum order is fixed, or, with
`dq_splits`, a few CTAs per head each add into their own accumulator copy).

GQA needs no dK / dV workspace: the main kernel's CTA owns one kv head and
walks its query heads itself (K and V heads apart: the smallest run of query heads
that whole K groups and whole V groups both tile, writing each K or V head's tile
when its group ends; `kv_grid_heads`, `walk_group`).
One template serves two arch lines: ``sm80`` (cc 8.x, and cc 9.0 below the wgmma kernel) and ``sm120`` (about 99 KB of
shared memory). No cutlass import here: planning reads this module.
"""

from __future__ import annotations

from typing import Literal

from frost.engines.common.turns import ROTATED, STAIR
from frost.engines.params import SdpaBwdFeatureParams, check_sdpa_features, score_mod_tags
from frost.engines.sdpa_args import ragged_tags, ragged_totals
from frost.engines.sdpa_bwd.chain import lengths_args, name_dims, name_tags
from frost.engines.sdpa_bwd.scratch import uses_turns
from frost.engines.sm80.sdpa_fwd_params import HEAD_DIMS, TileHeadDims
from frost.errors import TemplateParamsError

#: Largest dynamic shared memory one block of each family may ask for (bytes).
SMEM_BUDGET: dict[str, int] = {"sm80": 166912, "sm120": 101376}

#: The main kernel's template module.
MAIN_TEMPLATE = "frost.engines.sm80.sdpa_bwd"


class Sm80BwdParams(TileHeadDims, SdpaBwdFeatureParams):
    """Plan-time description of one mma.sync backward chain (`frost.engines.sdpa_bwd.chain.BwdChainParams`).

    Feature flags mirror the optional arguments of `frost.engines.sdpa_args`;
    the knobs (tiles, stages, warps and the warp arrangement of the three GEMM
    shapes, the step order, the turn order and release) change speed only.
    `benchmarks/sm80_bwd_sweep.py` times them on a GPU.
    """

    family: Literal["sm80", "sm120"] = "sm80"
    # knobs
    tile_m: int = 64  # query rows per main-loop step
    tile_n: int = 128  # key rows per CTA
    num_stages: int = 2  # 2: Q/dO double-buffered; 1: single buffer
    num_warps: int = 8
    sdp_warps_m: int = 2  # warps along the query rows of S = Q.K^T and dP = dO.V^T
    dkv_warps_n: int = 4  # warps along the key rows of dK = dS^T.Q and dV = P^T.dO
    dq_warps_m: int = 2  # warps along the query rows of dQ = dS.K
    # True: a step waits once for its Q and dO (issued together a step earlier) and stores P right
    # after the softmax; False: dO gets its own wait and barrier, P and dS are stored together.
    fused_prefetch: bool = False
    # deterministic dQ turn order per query tile (`frost.engines.common.turns`). "stair": key tiles are
    # launched from the last down, walk their query tiles upward from the diagonal and take turns from the
    # highest key tile down, so a tile's turn comes when it arrives (no serial lag down the band). "rotated"
    # (no windows): key tile n starts its walk at query tile n (wrapping) and each query tile takes the key
    # tiles in the order they arrive; a plan picks it only where `turns.rotation_fits`
    # (`frost.adapters.sm80_plan.planned_det_order`).
    det_order: Literal["stair", "rotated"] = "stair"
    # deterministic: a key tile passes its turn on at the next step's first barrier (its reductions have had
    # a GEMM's time to land, and no extra barrier) instead of right after its reductions. The d=64 default.
    det_late_release: bool = False
    # deterministic, dense: 0 orders the dQ additions through per-tile turns (semaphores). n >= 1 launches n
    # CTAs per (batch, kv head) instead of one per key tile; each walks every n-th key tile (in a zig-zag, so
    # causal work evens out) and adds into its own copy of the fp32 accumulator, which only it writes, so its
    # additions land in program order with no waiting. The dQ convert sums the copies in a fixed order.
    # Costs n accumulator copies of workspace. Deterministic dense chains only (THD keeps turns). Plans pick
    # it per problem and GPU (`frost.adapters.sm80_plan.planned_dq_splits`); 0 is the template's default.
    dq_splits: int = 0

    @property
    def num_threads(self) -> int:
        return 32 * self.num_warps

    @property
    def dq_accum_blocked(self) -> bool:
        """Dense: the fp32 dQ accumulator is stored in 8x8 blocks (rows padded to a multiple of 8), so a
        warp's reduction of its MMA fragment covers whole cache lines instead of 32 bytes of eight rows (4x
        fewer L2 requests; 9-11% faster at d=128, 0-2% at d=64 on the H200). THD keeps rows."""
        return not self.is_thd

    @property
    def dq_accum_tile(self) -> int:
        """The mma.sync chain adds rows (or 8x8 blocks), never wgmma fragment tiles."""
        return 0

    @property
    def pdl(self) -> bool:
        """The mma.sync chain's kernels run strictly one after another (no programmatic dependent launch)."""
        return False


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def smem_bytes(p: Sm80BwdParams) -> int:
    """Shared memory of the main kernel: Q, dO (staged), K, V, P, dS tiles, LSE and dpsum rows.

    Tile buffers are 1 KiB aligned, the row vectors 128 B, in allocation order.
    """
    e = 2
    off = 0
    d, dv = p.tile_head_dim, p.tile_head_dim_v
    for size, a in (
        (p.tile_n * d * e, 1024),
        (p.tile_n * dv * e, 1024),
        (p.num_stages * p.tile_m * d * e, 1024),
        (p.num_stages * p.tile_m * dv * e, 1024),
        (p.tile_m * p.tile_n * e, 1024),
        (p.tile_m * p.tile_n * e, 1024),
        (p.tile_m * 4, 128),
        (p.tile_m * 4, 128),
    ):
        off = _align(off, a) + size
    return _align(off, 1024)


def accumulator_registers(p: Sm80BwdParams) -> int:
    """Peak fp32 accumulator registers per thread of the main kernel.

    dK and dV live throughout; S and dP die once dS is formed, before dQ's accumulator is born.
    """
    t = p.num_threads
    dkv = p.tile_n * (p.tile_head_dim + p.tile_head_dim_v)
    return (dkv + max(2 * p.tile_m * p.tile_n, p.tile_m * p.tile_head_dim)) // t


def validate(p: Sm80BwdParams) -> None:
    """Raise TemplateParamsError when the template cannot build `p`."""

    def bad(msg: str) -> None:
        raise TemplateParamsError(f"Sm80BwdParams: {msg}")

    check_sdpa_features(p, HEAD_DIMS, "Sm80BwdParams")
    if p.num_warps not in (4, 8, 16):
        bad(f"num_warps={p.num_warps} not in (4, 8, 16)")
    if p.num_stages not in (1, 2):
        bad(f"num_stages={p.num_stages} not in (1, 2)")
    if p.tile_m not in (16, 32, 64, 128) or p.tile_n not in (32, 64, 128):
        bad(f"tile_m={p.tile_m} must be 16..128 and tile_n={p.tile_n} 32..128, powers of two")
    w = p.num_warps
    for name, v in (("sdp_warps_m", p.sdp_warps_m), ("dkv_warps_n", p.dkv_warps_n), ("dq_warps_m", p.dq_warps_m)):
        if v < 1 or w % v != 0:
            bad(f"{name}={v} must divide num_warps={w}")
    # every warp tile is a whole number of 16x16 (M x N) MMA blocks (head-dim extents: the tiles')
    for what, extent, warps in _warp_tiles(p):
        if extent % (16 * warps) != 0:
            bad(f"{what}: extent {extent} is not a multiple of 16 x {warps} warps")
    # cp.async tiles: whole rows per pass of the thread block
    for d in (p.tile_head_dim, p.tile_head_dim_v):
        row_threads = (64 if d % 64 == 0 else 32) // 8
        rows_per_pass = p.num_threads // row_threads
        if p.tile_m % rows_per_pass != 0 and rows_per_pass % p.tile_m != 0:
            bad(f"tile_m={p.tile_m} and the copy pass height {rows_per_pass} do not tile")
        if p.tile_n % rows_per_pass != 0 and rows_per_pass % p.tile_n != 0:
            bad(f"tile_n={p.tile_n} and the copy pass height {rows_per_pass} do not tile")
    if p.tile_m > p.num_threads:
        bad(f"tile_m={p.tile_m} exceeds the {p.num_threads} threads that stage its LSE rows")
    if not 0 <= p.dq_splits <= 64:
        bad(f"dq_splits={p.dq_splits} not in 0..64")
    if p.dq_splits and (not p.deterministic or p.is_thd):
        bad(
            f"dq_splits={p.dq_splits} orders a deterministic dense backward; this one is "
            f"{'packed (THD)' if p.is_thd else 'not deterministic'}"
        )
    if p.det_order == ROTATED and (p.has_window_left or p.has_window_right):
        bad("det_order='rotated' walks every query tile from each key tile's own start; windows narrow the walks")
    need = smem_bytes(p)
    if need > SMEM_BUDGET[p.family]:
        bad(f"needs {need} bytes of shared memory, family {p.family} allows {SMEM_BUDGET[p.family]}")
    regs = accumulator_registers(p)
    cap = min(192, 65536 // p.num_threads - 32)  # leave room for operands and addresses
    if regs > cap:
        bad(
            f"tiles {p.tile_m}x{p.tile_n} with d={p.head_dim}/{p.head_dim_v} on {w} warps need {regs} "
            f"fp32 accumulator registers per thread (max {cap})"
        )


def _warp_tiles(p: Sm80BwdParams) -> tuple:
    """(what, extent, warps along it) of the five GEMMs' warp tilings."""
    w, d, dv = p.num_warps, p.tile_head_dim, p.tile_head_dim_v
    return (
        ("S/dP rows", p.tile_m, p.sdp_warps_m),
        ("S/dP cols", p.tile_n, w // p.sdp_warps_m),
        ("dK/dV rows", p.tile_n, p.dkv_warps_n),
        ("dK cols", d, w // p.dkv_warps_n),
        ("dV cols", dv, w // p.dkv_warps_n),
        ("dQ rows", p.tile_m, p.dq_warps_m),
        ("dQ cols", d, w // p.dq_warps_m),
    )


# ---------------------------------------------------------------------------------------------
# The main kernel's arguments and name


def main_args(p: Sm80BwdParams) -> list[str]:
    """q, k, v, do, lse, dk, dv, lengths, bias?, dbias? (written directly), dpsum, dq_accum, dq_semaphore?,
    dbias_accum?, scale, windows, max_seqlen_q? and max_seqlen_kv? (packed), stream."""
    args = ["q", "k", "v", "do", "lse", "dk", "dv"] + lengths_args(p)
    args += ["bias"] * p.has_bias + ["dbias"] * (p.has_dbias and not p.dbias_accum)
    args += ["dpsum", "dq_accum"] + (["dq_semaphore"] if uses_turns(p) else []) + ["dbias_accum"] * p.dbias_accum
    args.append("softmax_scale")
    if p.has_window_left:
        args.append("window_left")
    if p.has_window_right:
        args.append("window_right")
    if p.is_thd:  # the packed form's envelopes: each length is capped at its own
        args += ["max_seqlen_q", "max_seqlen_kv"]
    return args + ragged_totals(p) + ["stream"]


def name_suffix(p: Sm80BwdParams) -> str:
    """The self-describing part of the main kernel's name (style of the forward's names)."""
    det = {STAIR: "det", ROTATED: "detc"}[p.det_order] + ("l" if p.det_late_release else "")
    if p.dq_splits:
        det = f"detsp{p.dq_splits}"  # the turn knobs do not apply
    heads = f"h{p.num_heads_q}k{p.num_heads_kv}" + (f"v{p.num_heads_v}" if p.num_heads_v else "")
    parts = (
        name_dims(p)
        + [heads]
        + name_tags(
            (
                (p.has_window_left, "wl"),
                (p.has_window_right, "wr"),
                (p.bottom_right, "br"),
                (p.is_thd, "thd"),
                (p.has_seqused, "pad"),
                (p.has_dsinks, "dsink"),
                *score_mod_tags(p),
                (p.deterministic, det),
            )
        )
        + ragged_tags(p)
    )
    parts.append(
        f"m{p.tile_m}n{p.tile_n}s{p.num_stages}w{p.num_warps}"
        + ("f" if p.fused_prefetch else "")
        + ("qb" if p.dq_accum_blocked else "")
        + (f"a{p.sdp_warps_m}{p.dkv_warps_n}{p.dq_warps_m}" if _custom_warps(p) else "")
    )
    return "_".join(parts)


def _custom_warps(p: Sm80BwdParams) -> bool:
    """True when the warp arrangement differs from the one the head dim's table lists for these tiles."""
    from frost.engines.sm80.sdpa_bwd_knobs import candidates  # the table probes this module's params

    try:
        cands = candidates(p.head_dim, p.head_dim_v)
    except TemplateParamsError:
        cands = []
    for cand in cands:
        if (cand["tile_m"], cand["tile_n"], cand["num_warps"]) == (p.tile_m, p.tile_n, p.num_warps):
            return (cand["sdp_warps_m"], cand["dkv_warps_n"], cand["dq_warps_m"]) != (
                p.sdp_warps_m,
                p.dkv_warps_n,
                p.dq_warps_m,
            )
    return True
