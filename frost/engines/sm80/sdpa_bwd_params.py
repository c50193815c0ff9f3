"""TemplateParams, validator and tuning table of the mma.sync SDPA backward's main kernel.

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
from frost.engines.sm80.sdpa_fwd_params import HEAD_DIMS, TUNED_HEAD_DIMS, TileHeadDims, tile_dim, tuned_head_dims
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
    for size, a in ((p.tile_n * d * e, 1024), (p.tile_n * dv * e, 1024),
                    (p.num_stages * p.tile_m * d * e, 1024),
                    (p.num_stages * p.tile_m * dv * e, 1024),
                    (p.tile_m * p.tile_n * e, 1024), (p.tile_m * p.tile_n * e, 1024),
                    (p.tile_m * 4, 128), (p.tile_m * 4, 128)):
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
        bad(f"dq_splits={p.dq_splits} orders a deterministic dense backward; this one is "
            f"{'packed (THD)' if p.is_thd else 'not deterministic'}")
    if p.det_order == ROTATED and (p.has_window_left or p.has_window_right):
        bad("det_order='rotated' walks every query tile from each key tile's own start; windows narrow the walks")
    need = smem_bytes(p)
    if need > SMEM_BUDGET[p.family]:
        bad(f"needs {need} bytes of shared memory, family {p.family} allows {SMEM_BUDGET[p.family]}")
    regs = accumulator_registers(p)
    cap = min(192, 65536 // p.num_threads - 32)  # leave room for operands and addresses
    if regs > cap:
        bad(f"tiles {p.tile_m}x{p.tile_n} with d={p.head_dim}/{p.head_dim_v} on {w} warps need {regs} "
            f"fp32 accumulator registers per thread (max {cap})")


def _warp_tiles(p: Sm80BwdParams) -> tuple:
    """(what, extent, warps along it) of the five GEMMs' warp tilings."""
    w, d, dv = p.num_warps, p.tile_head_dim, p.tile_head_dim_v
    return (("S/dP rows", p.tile_m, p.sdp_warps_m), ("S/dP cols", p.tile_n, w // p.sdp_warps_m),
            ("dK/dV rows", p.tile_n, p.dkv_warps_n), ("dK cols", d, w // p.dkv_warps_n),
            ("dV cols", dv, w // p.dkv_warps_n),
            ("dQ rows", p.tile_m, p.dq_warps_m), ("dQ cols", d, w // p.dq_warps_m))


# (head_dim, head_dim_v) -> knobs, best first; the first that fits the budget wins.
# d=64 deterministic: the late turn release cut the cost over non-deterministic from 1.17/1.15/1.22 to
# 1.11/1.09/1.14 (4k causal, 16k full, 16k causal) and raised 4k full from 1.22 to 1.25 (H200, 4866a9b sweep);
# at d=128 it lost 0-4%. Reading the turn early (relaxed, before the dV GEMM) and completing the acquire with a
# fence timed 1-3% slower than the plain ld.acquire at both head dims (8bbd725 sweep), so it was dropped.
# P and dS stored with stmatrix on sm_90 timed 0-2% slower than 4-byte stores (1c50e3a sweep): dropped too.
# Knobs no row picked were removed; benchmarks/results records the sweeps that retired each.
# Head dims outside these rows take the rows of their covering tuned pair (`tuned_head_dims`), each with its
# warps re-arranged where the tile width asks for it (`candidates`); not tuned at their own dims yet.
_CANDIDATES: dict[tuple[int, int], list[dict]] = {
    (64, 64): [dict(tile_m=128, tile_n=128, num_stages=2, num_warps=8, sdp_warps_m=4, dkv_warps_n=4, dq_warps_m=4,
                    fused_prefetch=True, det_late_release=True),
               dict(tile_m=64, tile_n=128, num_stages=2, num_warps=8, sdp_warps_m=2, dkv_warps_n=4, dq_warps_m=2),
               dict(tile_m=64, tile_n=64, num_stages=2, num_warps=8, sdp_warps_m=2, dkv_warps_n=4, dq_warps_m=2)],
    (96, 96): [dict(tile_m=64, tile_n=128, num_stages=2, num_warps=8, sdp_warps_m=2, dkv_warps_n=4, dq_warps_m=4),
               dict(tile_m=64, tile_n=64, num_stages=2, num_warps=8, sdp_warps_m=2, dkv_warps_n=4, dq_warps_m=4)],
    (128, 128): [dict(tile_m=64, tile_n=128, num_stages=2, num_warps=8, sdp_warps_m=2, dkv_warps_n=4,
                      dq_warps_m=2),
                 dict(tile_m=64, tile_n=64, num_stages=1, num_warps=8, sdp_warps_m=2, dkv_warps_n=4,
                      dq_warps_m=2)],
    (192, 128): [dict(tile_m=64, tile_n=64, num_stages=2, num_warps=8, sdp_warps_m=2, dkv_warps_n=4, dq_warps_m=2),
                 dict(tile_m=32, tile_n=64, num_stages=1, num_warps=8, sdp_warps_m=2, dkv_warps_n=4,
                      dq_warps_m=2)],
    (256, 256): [dict(tile_m=64, tile_n=64, num_stages=2, num_warps=8, sdp_warps_m=2, dkv_warps_n=4, dq_warps_m=2),
                 dict(tile_m=64, tile_n=64, num_stages=1, num_warps=8, sdp_warps_m=2, dkv_warps_n=4, dq_warps_m=2),
                 dict(tile_m=32, tile_n=32, num_stages=1, num_warps=4, sdp_warps_m=2, dkv_warps_n=2,
                      dq_warps_m=2)],
}


def candidates(head_dim: int, head_dim_v: int) -> list[dict]:
    """The tuning table's knobs for these head dims, best first: the table's own rows, or those of the
    covering tuned pair (`tuned_head_dims`), then of the larger tuned pairs that cover the tile dims too,
    each with its dQ warps re-arranged along the query rows where the tile width does not split into 16
    columns per warp (e.g. 160 = 5 x 32 columns over 4 warps becomes 2 warps)."""
    probe = Sm80BwdParams(head_dim=head_dim, head_dim_v=head_dim_v)
    try:
        check_sdpa_features(probe, HEAD_DIMS, "Sm80BwdParams")
    except TemplateParamsError as e:
        raise TemplateParamsError(f"{e}; no knobs") from None
    key = (head_dim, head_dim_v)
    if key in _CANDIDATES:
        return list(_CANDIDATES[key])
    d, dv = tile_dim(head_dim), tile_dim(head_dim_v)
    first = TUNED_HEAD_DIMS.index(tuned_head_dims(head_dim, head_dim_v))
    out = []
    for a, b in TUNED_HEAD_DIMS[first:]:
        if a < d or b < dv:
            continue
        for cand in _CANDIDATES[(a, b)]:
            w, dq_m = cand["num_warps"], cand["dq_warps_m"]
            while dq_m < w and d % (16 * (w // dq_m)) != 0:
                dq_m *= 2
            arranged = {**cand, "dq_warps_m": dq_m}
            if cand["tile_m"] % (16 * dq_m) == 0 and d % (16 * (w // dq_m)) == 0 and arranged not in out:
                out.append(arranged)
    return out


def default_knobs(family: str, head_dim: int, head_dim_v: int, dtype: str = "bf16",
                  smem_budget: int | None = None, **requested) -> dict:
    """Good knobs for a family and head dims; `requested` knobs (e.g. tile_n=64) are honored.

    `smem_budget` (bytes, a target's opt-in limit) tightens the family budget.
    Raises TemplateParamsError when no candidate honoring `requested` fits.
    """
    budget = min(SMEM_BUDGET[family], smem_budget) if smem_budget else SMEM_BUDGET[family]
    splits = requested.pop("dq_splits", None)  # needs the feature flags the probe lacks; sizes nothing here
    for cand in candidates(head_dim, head_dim_v):
        knobs = {**cand, **requested}
        probe = Sm80BwdParams(family=family, dtype=dtype, head_dim=head_dim, head_dim_v=head_dim_v, **knobs)
        try:
            validate(probe)
        except TemplateParamsError:
            continue
        if smem_bytes(probe) <= budget:
            return knobs if splits is None else {**knobs, "dq_splits": splits}
    raise TemplateParamsError(f"Sm80BwdParams: no knobs for d_qk={head_dim}, d_v={head_dim_v} honoring "
                              f"{requested} fit {budget} bytes of shared memory")


# ---------------------------------------------------------------------------------------------
# The main kernel's walks, turns and arguments


def split_tile(it, split, splits: int):
    """The key tile of step `it` of split CTA `split` (`dq_splits`): rounds of `splits` tiles, walked forward
    and backward in turn, so the CTAs' causal work evens out. Plain arithmetic: kernels call it on Int32s."""
    return it * splits + split + (it % 2) * (splits - 1 - 2 * split)


def split_tile_count(num_n, split, splits: int):
    """How many of `num_n` key tiles `split_tile` gives split CTA `split`: the whole rounds, plus one when its
    place in the last, partial round lies inside it."""
    rounds = num_n // splits
    rest = num_n - rounds * splits
    place = split + (rounds % 2) * (splits - 1 - 2 * split)
    return rounds + (rest - place + splits - 1) // splits  # + 1 exactly when place < rest


def main_args(p: Sm80BwdParams) -> list[str]:
    """q, k, v, do, lse, dk, dv, lengths, bias?, dbias? (written directly), dpsum, dq_accum, dq_semaphore?,
    dbias_accum?, scale, windows, max_seqlen_kv?, stream."""
    args = ["q", "k", "v", "do", "lse", "dk", "dv"] + lengths_args(p)
    args += ["bias"] * p.has_bias + ["dbias"] * (p.has_dbias and not p.dbias_accum)
    args += ["dpsum", "dq_accum"] + (["dq_semaphore"] if uses_turns(p) else []) + ["dbias_accum"] * p.dbias_accum
    args.append("softmax_scale")
    if p.has_window_left:
        args.append("window_left")
    if p.has_window_right:
        args.append("window_right")
    if p.is_thd:
        args.append("max_seqlen_kv")
    return args + ragged_totals(p) + ["stream"]


def name_suffix(p: Sm80BwdParams) -> str:
    """The self-describing part of the main kernel's name (style of the forward's names)."""
    det = {STAIR: "det", ROTATED: "detc"}[p.det_order] + ("l" if p.det_late_release else "")
    if p.dq_splits:
        det = f"detsp{p.dq_splits}"  # the turn knobs do not apply
    heads = f"h{p.num_heads_q}k{p.num_heads_kv}" + (f"v{p.num_heads_v}" if p.num_heads_v else "")
    parts = name_dims(p) + [heads] + name_tags(
        ((p.has_window_left, "wl"), (p.has_window_right, "wr"), (p.bottom_right, "br"), (p.is_thd, "thd"),
         (p.has_seqused, "pad"), (p.has_dsinks, "dsink"), *score_mod_tags(p), (p.deterministic, det))) + ragged_tags(p)
    parts.append(f"m{p.tile_m}n{p.tile_n}s{p.num_stages}w{p.num_warps}" + ("f" if p.fused_prefetch else "")
                 + ("qb" if p.dq_accum_blocked else "")
                 + (f"a{p.sdp_warps_m}{p.dkv_warps_n}{p.dq_warps_m}" if _custom_warps(p) else ""))
    return "_".join(parts)


def _custom_warps(p: Sm80BwdParams) -> bool:
    """True when the warp arrangement differs from the one the head dim's table lists for these tiles."""
    try:
        cands = candidates(p.head_dim, p.head_dim_v)
    except TemplateParamsError:
        cands = []
    for cand in cands:
        if (cand["tile_m"], cand["tile_n"], cand["num_warps"]) == (p.tile_m, p.tile_n, p.num_warps):
            return (cand["sdp_warps_m"], cand["dkv_warps_n"], cand["dq_warps_m"]) != (
                p.sdp_warps_m, p.dkv_warps_n, p.dq_warps_m)
    return True
