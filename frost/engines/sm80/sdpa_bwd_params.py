"""TemplateParams, validator, knobs, scratch layout and argument lists of the mma.sync SDPA backward.

The backward is a chain of three kernels launched in order on one stream:

1. ``preprocess`` (`sdpa_bwd_preprocess`): dpsum = rowsum(dO * O), zeroes the fp32
   dQ accumulator (and the deterministic-mode semaphores), and the per-block
   partial sums of dSink.
2. ``main`` (`sdpa_bwd`): one CTA per (key tile, kv head, batch) recomputes P from
   the LSE, accumulates dK / dV in registers over every query head of its GQA
   group and every query tile in the mask band, and adds dQ partials into the
   fp32 accumulator (red.global; in deterministic mode key tiles take turns per
   (batch, head, query tile) through a semaphore, so the sum order is fixed, or,
   with `dq_splits`, a few CTAs per head each add into their own accumulator copy).
3. ``postprocess`` (`sdpa_bwd_postprocess`): dQ = accumulator (copies summed in
   order) * scale in the io dtype, and dSink = the fixed-order sum of the partials.

GQA needs no dK / dV workspace: the main kernel's CTA owns one kv head and
walks its query heads itself. One template serves two arch lines: ``sm80``
(cc 8.x, and cc 9.0 below the wgmma kernel) and ``sm120`` (about 99 KB of
shared memory). No cutlass import here: planning reads this module.
"""
from __future__ import annotations

from typing import Literal

from frost.engines.params import SdpaFeatureParams, check_sdpa_features
from frost.errors import TemplateParamsError
from frost.runtime.workspace import ScratchBuffer, layout_bytes

#: (head_dim, head_dim_v) pairs the template implements.
HEAD_DIMS: tuple[tuple[int, int], ...] = ((64, 64), (96, 96), (128, 128), (256, 256), (192, 128))

#: Largest dynamic shared memory one block of each family may ask for (bytes).
SMEM_BUDGET: dict[str, int] = {"sm80": 166912, "sm120": 101376}

#: Query rows per CTA of the preprocess / postprocess kernels.
ROWS_PER_CTA = 64
#: dSink partial sums per preprocess CTA (one per warp).
PARTIALS_PER_CTA = 4


class Sm80BwdParams(SdpaFeatureParams):
    """Plan-time description of one mma.sync backward chain.

    Feature flags mirror the optional arguments of `frost.engines.sdpa_args`;
    the knobs (tiles, stages, warps and the warp arrangement of the three GEMM
    shapes, the step order, the dQ reduction width, walk and turn orders)
    change speed only. `benchmarks/sm80_bwd_sweep.py` times them on a GPU.
    """

    family: Literal["sm80", "sm120"] = "sm80"
    has_dsinks: bool = False
    deterministic: bool = False
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
    # split order only (fused always does this): store P right after the softmax, before the dO wait
    early_p: bool = False
    # deterministic dQ turn order per query tile. "diag": key tiles are launched from the last down, walk
    # their query tiles upward from the diagonal and take turns from the highest key tile down, so a tile's
    # turn comes when it arrives (no serial lag down the band); "asc": key tile 0 first, query tiles downward.
    # "cyc" (no windows): key tile n starts its walk at query tile n (wrapping) and each query tile takes the
    # key tiles in the order they arrive (`cyclic_turn`), so neighbouring key tiles never queue behind each
    # other. A key tile may wait on one launched after it, so a plan picks "cyc" only where a head's key
    # tiles fit on half the SMs at once (`planned_det_order`).
    det_order: Literal["diag", "asc", "cyc"] = "diag"
    # deterministic: a key tile passes its turn on at the next step's first barrier (its reductions have had
    # a GEMM's time to land, and no extra barrier) instead of right after its reductions. The d=64 default.
    det_late_release: bool = False
    # deterministic: where thread 0 reads its turn (ld.acquire holds its warp until the value returns).
    # "reduce": right before the dQ reductions, while the other warps wait at a barrier; "dq_gemm": before the
    # dQ GEMM, so the other warps compute while warp 0 waits (a stale read is re-polled at the reductions).
    # "dq_gemm" cut the deterministic cost by 1-8% at d=64 and d=128 (1361a54 sweep).
    det_poll: Literal["reduce", "dq_gemm"] = "dq_gemm"
    # deterministic: the warp whose lane 0 passes a turn on (fence + release): "first" is warp 0, which also
    # reads the turns; "last" spreads the two waits over two warps.
    det_release_warp: Literal["first", "last"] = "last"
    # dQ partial reductions on sm_90+: "v2" one 8-byte red per accumulator pair; "v4": lane pairs swap
    # halves (one shuffle per value pair) so each red carries 16 bytes (half as many). sm_8x: scalar.
    dq_red: Literal["v2", "v4"] = "v2"
    # dense: the fp32 dQ accumulator is stored in 8x8 blocks (rows padded to a multiple of 8), so a warp's
    # reduction of its MMA fragment covers whole cache lines instead of 32 bytes of eight rows (4x fewer L2
    # requests; 9-11% faster at d=128, 0-2% at d=64 on the H200). THD keeps rows.
    dq_accum_blocks: bool = True
    # ldmatrix operands of a GEMM loaded one k-slice ahead (more registers, more overlap)
    prefetch_k: bool = True
    # CTAs resident per SM the kernel is built for (registers capped to fit; 2 suits small tiles)
    ctas_per_sm: int = 1
    # deterministic, dense: 0 orders the dQ additions through per-tile turns (semaphores). n >= 1 launches n
    # CTAs per (batch, kv head) instead of one per key tile; each walks every n-th key tile (in a zig-zag, so
    # causal work evens out) and adds into its own copy of the fp32 accumulator, which only it writes, so its
    # additions land in program order with no waiting. The dQ convert sums the copies in a fixed order.
    # Costs n accumulator copies of workspace. Deterministic dense chains only (THD keeps turns). Plans pick
    # it per problem and GPU (`planned_dq_splits`); 0 here is the template's own default.
    dq_splits: int = 0
    # non-deterministic, no right window: key tile n starts its query walk n tiles in (wrapping), so the
    # key tiles of a head do not all add into the same dQ rows at once. Measured within 0.5% of off.
    rotate_m: bool = False

    @property
    def num_threads(self) -> int:
        return 32 * self.num_warps


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def smem_bytes(p: Sm80BwdParams) -> int:
    """Shared memory of the main kernel: Q, dO (staged), K, V, P, dS tiles, LSE and dpsum rows.

    Tile buffers are 1 KiB aligned, the row vectors 128 B, in allocation order.
    """
    e = 2
    off = 0
    for size, a in ((p.tile_n * p.head_dim * e, 1024), (p.tile_n * p.head_dim_v * e, 1024),
                    (p.num_stages * p.tile_m * p.head_dim * e, 1024),
                    (p.num_stages * p.tile_m * p.head_dim_v * e, 1024),
                    (p.tile_m * p.tile_n * e, 1024), (p.tile_m * p.tile_n * e, 1024),
                    (p.tile_m * 4, 128), (p.tile_m * 4, 128)):
        off = _align(off, a) + size
    return _align(off, 1024)


def accumulator_registers(p: Sm80BwdParams) -> int:
    """Peak fp32 accumulator registers per thread of the main kernel.

    dK and dV live throughout; S and dP die once dS is formed, before dQ's accumulator is born.
    """
    t = p.num_threads
    dkv = p.tile_n * (p.head_dim + p.head_dim_v)
    return (dkv + max(2 * p.tile_m * p.tile_n, p.tile_m * p.head_dim)) // t


def validate(p: Sm80BwdParams) -> None:
    """Raise TemplateParamsError when the template cannot build `p`."""

    def bad(msg: str) -> None:
        raise TemplateParamsError(f"Sm80BwdParams: {msg}")

    check_sdpa_features(p, HEAD_DIMS, "Sm80BwdParams")
    if p.has_dsinks and not p.has_sinks:
        bad("dsinks needs sinks")
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
    # every warp tile is a whole number of 16x16 (M x N) MMA blocks
    checks = (
        ("S/dP rows", p.tile_m, p.sdp_warps_m), ("S/dP cols", p.tile_n, w // p.sdp_warps_m),
        ("dK/dV rows", p.tile_n, p.dkv_warps_n), ("dK cols", p.head_dim, w // p.dkv_warps_n),
        ("dV cols", p.head_dim_v, w // p.dkv_warps_n),
        ("dQ rows", p.tile_m, p.dq_warps_m), ("dQ cols", p.head_dim, w // p.dq_warps_m),
    )
    for what, extent, warps in checks:
        if extent % (16 * warps) != 0:
            bad(f"{what}: extent {extent} is not a multiple of 16 x {warps} warps")
    # cp.async tiles: whole rows per pass of the thread block
    for d in (p.head_dim, p.head_dim_v):
        row_threads = (64 if d % 64 == 0 else 32) // 8
        rows_per_pass = p.num_threads // row_threads
        if p.tile_m % rows_per_pass != 0 and rows_per_pass % p.tile_m != 0:
            bad(f"tile_m={p.tile_m} and the copy pass height {rows_per_pass} do not tile")
        if p.tile_n % rows_per_pass != 0 and rows_per_pass % p.tile_n != 0:
            bad(f"tile_n={p.tile_n} and the copy pass height {rows_per_pass} do not tile")
    if p.dq_red == "v4" and (p.head_dim // (w // p.dq_warps_m) // 8) % 2:
        bad(f"dq_red=v4 pairs the dQ MMA's n-atoms: head_dim / {w // p.dq_warps_m} warps / 8 must be even")
    if p.tile_m > p.num_threads:
        bad(f"tile_m={p.tile_m} exceeds the {p.num_threads} threads that stage its LSE rows")
    if not 0 <= p.dq_splits <= 64:
        bad(f"dq_splits={p.dq_splits} not in 0..64")
    if p.dq_splits and (not p.deterministic or p.is_thd):
        bad(f"dq_splits={p.dq_splits} orders a deterministic dense backward; this one is "
            f"{'packed (THD)' if p.is_thd else 'not deterministic'}")
    if p.det_order == "cyc" and (p.has_window_left or p.has_window_right):
        bad("det_order='cyc' walks every query tile from each key tile's own start; windows narrow the walks")
    if p.ctas_per_sm not in (1, 2):
        bad(f"ctas_per_sm={p.ctas_per_sm} not in (1, 2)")
    need = smem_bytes(p) * p.ctas_per_sm
    if need > SMEM_BUDGET[p.family]:
        bad(f"needs {need} bytes of shared memory for {p.ctas_per_sm} CTA(s), family {p.family} allows "
            f"{SMEM_BUDGET[p.family]}")
    regs = accumulator_registers(p)
    cap = min(192, 65536 // (p.num_threads * p.ctas_per_sm) - 32)  # leave room for operands and addresses
    if regs > cap:
        bad(f"tiles {p.tile_m}x{p.tile_n} with d={p.head_dim}/{p.head_dim_v} on {w} warps need {regs} "
            f"fp32 accumulator registers per thread (max {cap})")


# (head_dim, head_dim_v) -> knobs, best first; the first that fits the budget wins.
# d=64 deterministic: the late turn release cut the cost over non-deterministic from 1.17/1.15/1.22 to
# 1.11/1.09/1.14 (4k causal, 16k full, 16k causal) and raised 4k full from 1.22 to 1.25 (H200, 4866a9b sweep);
# at d=128 it lost 0-4%. Reading the turn early (relaxed, before the dV GEMM) and completing the acquire with a
# fence timed 1-3% slower than the plain ld.acquire at both head dims (8bbd725 sweep), so it was dropped.
# P and dS stored with stmatrix on sm_90 timed 0-2% slower than 4-byte stores (1c50e3a sweep): dropped too.
# With the blocked dQ accumulator the 16-byte reductions' shuffles cost more than they save: plain 8-byte ones
# timed 1-4% faster at d=64 (82558bf and 3fde72a sweeps), so d=64 keeps the default "v2".
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


def default_knobs(family: str, head_dim: int, head_dim_v: int, dtype: str = "bf16",
                  smem_budget: int | None = None, **requested) -> dict:
    """Good knobs for a family and head dims; `requested` knobs (e.g. tile_n=64) are honored.

    `smem_budget` (bytes, a target's opt-in limit) tightens the family budget.
    Raises TemplateParamsError when no candidate honoring `requested` fits.
    """
    key = (head_dim, head_dim_v)
    if key not in _CANDIDATES:
        raise TemplateParamsError(f"Sm80BwdParams: no knobs for d_qk={head_dim}, d_v={head_dim_v}")
    budget = min(SMEM_BUDGET[family], smem_budget) if smem_budget else SMEM_BUDGET[family]
    splits = requested.pop("dq_splits", None)  # needs the feature flags the probe lacks; sizes nothing here
    for cand in _CANDIDATES[key]:
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
# Workspace


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def uses_turns(p: Sm80BwdParams) -> bool:
    """Whether the deterministic order comes from per-tile turns (semaphores) rather than split copies."""
    return p.deterministic and p.dq_splits == 0


def cyclic_turn(m, n, n_m, num_n, mn=min):
    """Key tile n's place among the `num_n` key tiles that add into query tile m (of `n_m`) under
    det_order="cyc": key tile n reaches m at step s = (m - n) mod n_m, and a query tile takes key tiles by
    (arrival step, key tile). Plain arithmetic on non-negative values (kernels pass `mn=cutlass.min`).

    Each earlier step j < s brings the key tiles congruent to m - j: num_n // n_m of them, one more for the
    residues below num_n % n_m; `_below` counts those residues over the wrapped run m - s + 1 .. m.
    """
    q, r = num_n // n_m, num_n % n_m
    s = (m - n % n_m + n_m) % n_m

    def _below(x):  # residues v < r among 0 .. x - 1 (x >= 0), counted along the unwrapped line
        return (x // n_m) * r + mn(x % n_m, r)
    return s * q + _below(m + 1 + n_m) - _below(m - s + 1 + n_m) + n // n_m


def planned_det_order(p: Sm80BwdParams, sm_count: int, seq_kv: int) -> str:
    """The turn order a deterministic plan with turns compiles with: "cyc" where it applies (no windows) and
    a head's key tiles (`seq_kv`: the dense length or the THD envelope) fit on half the SMs, so a key tile
    waiting on a later-launched one never holds the SMs that one needs, even with a second such kernel
    running at once; else the params' own."""
    if not uses_turns(p) or p.has_window_left or p.has_window_right or sm_count <= 0:
        return p.det_order
    return "cyc" if 0 < _cdiv(seq_kv, p.tile_n) <= sm_count * p.ctas_per_sm // 2 else p.det_order


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


def choose_dq_splits(sm_count: int, batch: int, num_heads_kv: int, num_key_tiles: int, copy_bytes: int = 0,
                     max_splits: int = 8, min_busy: float = 0.9, max_extra_bytes: int = 1 << 30) -> int:
    """The fewest split copies whose grid keeps at least `min_busy` of the SMs busy over its waves, or 0
    (per-tile turns) when none of 1..max_splits does within `max_extra_bytes` of workspace beyond the one
    accumulator every mode has (`copy_bytes` each).

    A split CTA lives for its whole share of a head, so a grid that leaves a wave part-empty idles those SMs
    for a CTA's lifetime; fewer copies also mean less workspace.
    """
    groups = batch * num_heads_kv
    for splits in range(1, min(max_splits, max(num_key_tiles, 1)) + 1):
        if (splits - 1) * copy_bytes > max_extra_bytes:
            break
        ctas = groups * splits
        waves = _cdiv(ctas, sm_count)
        if ctas / (waves * sm_count) >= min_busy:
            return splits
    return 0


def planned_dq_splits(p: Sm80BwdParams, sm_count: int, batch: int, seq_q: int, seq_kv: int) -> int:
    """The `dq_splits` a deterministic dense plan compiles with on a GPU of `sm_count` SMs (0: turns).

    Split copies beat per-tile turns on every H200 row measured (deterministic cost 2-12% against 8-23%,
    benchmarks/results/2026-11-30-h200-run6), so they are the default wherever `choose_dq_splits` finds a
    count that keeps the SMs busy; a non-deterministic or packed chain, or an unknown SM count, keeps 0.
    """
    if not p.deterministic or p.is_thd or sm_count <= 0:
        return 0
    copy_bytes = batch * p.num_heads_q * accumulator_rows(p, seq_q) * p.head_dim * 4
    return choose_dq_splits(sm_count * p.ctas_per_sm, batch, p.num_heads_kv, _cdiv(seq_kv, p.tile_n),
                            copy_bytes=copy_bytes)


def planned_det_knobs(p: Sm80BwdParams, sm_count: int, batch: int, seq_q: int, seq_kv: int,
                      choose_splits: bool = True) -> dict:
    """The deterministic-mode knobs a plan sets on top of `p` for its problem and GPU (empty when none
    change): split copies where they keep the SMs busy (unless the caller fixed `dq_splits`), else the
    "cyc" turn order where it applies."""
    out = {}
    splits = planned_dq_splits(p, sm_count, batch, seq_q, seq_kv) if choose_splits else p.dq_splits
    if splits != p.dq_splits:
        out["dq_splits"] = splits
    order = p.det_order if splits else planned_det_order(p, sm_count, seq_kv)
    if order != p.det_order:
        out["det_order"] = order
    return out


def blocked_accumulator(p: Sm80BwdParams) -> bool:
    """Whether the dQ accumulator is stored in 8x8 blocks (dense only)."""
    return p.dq_accum_blocks and not p.is_thd


def accumulator_rows(p: Sm80BwdParams, seqlen_q: int) -> int:
    """Rows of a dense dQ accumulator: Sq, padded to whole 8-row blocks when blocked."""
    return _cdiv(seqlen_q, 8) * 8 if blocked_accumulator(p) else seqlen_q


def scratch_layout(p: Sm80BwdParams, batch: int, max_seqlen_q: int, max_seqlen_kv: int,
                   total_q: int = 0, total_kv: int = 0) -> list[tuple[str, str, tuple[int, ...]]]:
    """The workspace buffers of the chain, in carving order: (name, torch dtype name, shape).

    Dense: `max_seqlen_q` is the declared Sq. THD: `total_q` is the packed query
    total (the plan-time envelope to size the workspace, the bound tensor's
    extent to carve views). Every buffer is contiguous, row-major.
    """
    h, d = p.num_heads_q, p.head_dim
    if p.is_thd:
        out = [("dpsum", "float32", (h, total_q)), ("dq_accum", "float32", (h, total_q, d))]
        n_sem = h * (total_q // p.tile_m + batch + 1)
        n_part = h * PARTIALS_PER_CTA * max(_cdiv(total_q, ROWS_PER_CTA), 1)
    else:
        acc_rows = accumulator_rows(p, max_seqlen_q)
        copies = max(p.dq_splits, 1)
        out = [("dpsum", "float32", (batch, h, max_seqlen_q)),
               ("dq_accum", "float32", (copies * batch, h, acc_rows, d))]
        n_sem = batch * h * _cdiv(max_seqlen_q, p.tile_m)
        n_part = h * PARTIALS_PER_CTA * batch * max(_cdiv(max_seqlen_q, ROWS_PER_CTA), 1)
    if uses_turns(p):
        out.append(("dq_semaphore", "int32", (n_sem,)))
    if p.has_dsinks:
        out.append(("dsink_partial", "float32", (n_part,)))
    return out


def scratch_bytes(p: Sm80BwdParams, batch: int, max_seqlen_q: int, max_seqlen_kv: int,
                  total_q: int = 0, total_kv: int = 0) -> int:
    """Workspace bytes of `scratch_layout`, each buffer 256-byte aligned (the adapter's own closed form)."""
    return layout_bytes(ScratchBuffer(n, dt, tuple(shape))
                        for n, dt, shape in scratch_layout(p, batch, max_seqlen_q, max_seqlen_kv, total_q, total_kv))


# ---------------------------------------------------------------------------------------------
# The chain and the argument list of each kernel (names of sdpa_args.py plus the scratch names)

PREPROCESS = "frost.engines.sm80.sdpa_bwd_preprocess"
MAIN = "frost.engines.sm80.sdpa_bwd"
POSTPROCESS = "frost.engines.sm80.sdpa_bwd_postprocess"


def _lengths(p: Sm80BwdParams, q: bool = True, kv: bool = True) -> list[str]:
    out = []
    if p.is_thd:
        out += (["cu_seqlens_q"] if q else []) + (["cu_seqlens_kv"] if kv else [])
    if p.has_seqused:
        out += (["seqused_q"] if q else []) + (["seqused_kv"] if kv else [])
    return out


def preprocess_args(p: Sm80BwdParams) -> list[str]:
    """o, do, lse, lengths (q side), sinks?, dpsum, dq_accum, dq_semaphore?, dsink_partial?, stream."""
    args = ["o", "do", "lse"] + _lengths(p, kv=False)
    if p.has_dsinks:
        args.append("sinks")
    args += ["dpsum", "dq_accum"] + (["dq_semaphore"] if uses_turns(p) else [])
    if p.has_dsinks:
        args.append("dsink_partial")
    return args + ["stream"]


def main_args(p: Sm80BwdParams) -> list[str]:
    """q, k, v, do, lse, dk, dv, lengths, dpsum, dq_accum, dq_semaphore?, scale, windows, max_seqlen_kv?, stream."""
    args = ["q", "k", "v", "do", "lse", "dk", "dv"] + _lengths(p)
    args += ["dpsum", "dq_accum"] + (["dq_semaphore"] if uses_turns(p) else [])
    args.append("softmax_scale")
    if p.has_window_left:
        args.append("window_left")
    if p.has_window_right:
        args.append("window_right")
    if p.is_thd:
        args.append("max_seqlen_kv")
    return args + ["stream"]


def postprocess_args(p: Sm80BwdParams) -> list[str]:
    """dq, dsinks?, dq_accum, dsink_partial?, softmax_scale, stream."""
    args = ["dq"] + (["dsinks"] if p.has_dsinks else []) + ["dq_accum"]
    if p.has_dsinks:
        args.append("dsink_partial")
    return args + ["softmax_scale", "stream"]


#: the params fields each helper kernel reads; its key keeps only these, so main-kernel knobs and mask
#: flags never compile an identical helper twice (has_sinks rides along with has_dsinks)
HELPER_FIELDS = {
    "preprocess": ("family", "dtype", "head_dim", "head_dim_v", "num_heads_q", "is_thd", "has_seqused",
                   "has_sinks", "has_dsinks", "deterministic", "dq_accum_blocks", "dq_splits"),
    "postprocess": ("family", "dtype", "head_dim", "head_dim_v", "num_heads_q", "is_thd", "has_sinks",
                    "has_dsinks", "dq_accum_blocks", "dq_splits"),
}


def stage_params(p: Sm80BwdParams, stage: str) -> Sm80BwdParams:
    """The params one kernel of the chain compiles with: the main kernel's own, or a helper's projection."""
    fields = HELPER_FIELDS.get(stage)
    if fields is None:
        return p
    return Sm80BwdParams(**{f: getattr(p, f) for f in fields})


def bwd_chain(p: Sm80BwdParams) -> list[tuple[str, str, list[str], Sm80BwdParams]]:
    """(stage, template module, argument names, stage params) of each kernel, in launch order."""
    return [(stage, template, names(p), stage_params(p, stage))
            for stage, template, names in (("preprocess", PREPROCESS, preprocess_args), ("main", MAIN, main_args),
                                           ("postprocess", POSTPROCESS, postprocess_args))]


def _dims(p: Sm80BwdParams) -> list[str]:
    """family, dtype and head dims: how every kernel name of the chain begins."""
    return [p.family, p.dtype, f"d{p.head_dim}" + (f"v{p.head_dim_v}" if p.head_dim_v != p.head_dim else "")]


def _tags(flags) -> list[str]:
    return [tag for flag, tag in flags if flag]


def helper_suffix(p: Sm80BwdParams) -> str:
    """The name of a helper kernel: only the fields its key keeps (`HELPER_FIELDS`)."""
    return "_".join(_dims(p) + [f"h{p.num_heads_q}"] + _tags(
        ((p.is_thd, "thd"), (p.has_seqused, "pad"), (p.has_dsinks, "dsink"), (p.deterministic, "det"),
         (blocked_accumulator(p), "qb"), (p.dq_splits > 0, f"sp{p.dq_splits}"))))


def name_suffix(p: Sm80BwdParams) -> str:
    """The self-describing part of every kernel name of the chain (style of the forward's names)."""
    det = ({"diag": "det", "asc": "deta", "cyc": "detc"}[p.det_order] + ("l" if p.det_late_release else "")
           + ("r" if p.det_poll == "reduce" else "") + ("0" if p.det_release_warp == "first" else ""))
    if p.dq_splits:
        det = f"detsp{p.dq_splits}"  # the turn knobs do not apply
    parts = _dims(p) + [f"h{p.num_heads_q}k{p.num_heads_kv}"] + _tags(
        ((p.has_window_left, "wl"), (p.has_window_right, "wr"), (p.bottom_right, "br"), (p.is_thd, "thd"),
         (p.has_seqused, "pad"), (p.has_dsinks, "dsink"), (p.deterministic, det)))
    parts.append(f"m{p.tile_m}n{p.tile_n}s{p.num_stages}w{p.num_warps}" + ("f" if p.fused_prefetch else "")
                 + ("p" if p.early_p and not p.fused_prefetch else "")
                 + ("r4" if p.dq_red == "v4" else "") + ("qb" if blocked_accumulator(p) else "")
                 + ("" if p.prefetch_k else "np")
                 + (f"c{p.ctas_per_sm}" if p.ctas_per_sm > 1 else "") + ("rot" if p.rotate_m else "")
                 + (f"a{p.sdp_warps_m}{p.dkv_warps_n}{p.dq_warps_m}" if _custom_warps(p) else ""))
    return "_".join(parts)


def _custom_warps(p: Sm80BwdParams) -> bool:
    """True when the warp arrangement differs from the one the head dim's table lists for these tiles."""
    for cand in _CANDIDATES.get((p.head_dim, p.head_dim_v), []):
        if (cand["tile_m"], cand["tile_n"], cand["num_warps"]) == (p.tile_m, p.tile_n, p.num_warps):
            return (cand["sdp_warps_m"], cand["dkv_warps_n"], cand["dq_warps_m"]) != (
                p.sdp_warps_m, p.dkv_warps_n, p.dq_warps_m)
    return True


def chain_args(p: Sm80BwdParams, values: dict) -> list[tuple[str, list]]:
    """Bind the chain: (template, positional args) per kernel, in launch order.

    `values` maps argument names (sdpa_args.py names, scratch names from
    `scratch_layout`, scalars, "stream") to the objects to pass.
    """
    out = []
    for _, template, names, _ in bwd_chain(p):
        missing = [n for n in names if n not in values]
        if missing:
            raise KeyError(f"{template}: missing arguments {missing}")
        out.append((template, [values[n] for n in names]))
    return out
