"""Parameters of the SM90 (wgmma + TMA, warp-specialized) SDPA backward main kernel.

The backward is the shared chain of `frost.engines.sdpa_bwd` (preprocess -> main ->
dQ convert); this template is its main kernel for cc 9.0 (`MAIN_TEMPLATE`,
`main_args`). It adds into the fp32 dQ accumulator in row layout, one copy
(`dq_accum_blocked=False`, `dq_splits=0`), which the shared preprocess zeroes
(with the turn counters when deterministic) and the shared dQ convert scales into
dQ's declared strides. No cutlass import here: planning reads this module.
"""

from __future__ import annotations

from typing import Literal

from frost.engines.common.turns import ROTATED
from frost.engines.params import HeadDimSpan, SdpaBwdFeatureParams, check_sdpa_features, round_up, score_mod_tags
from frost.engines.sdpa_args import ragged_tags, ragged_totals
from frost.engines.sdpa_bwd.chain import lengths_args, name_dims, name_tags
from frost.engines.sm90.sdpa_fwd_params import HEAD_DIM_GRANULE as WGMMA_K  # one wgmma K step, as the forward's
from frost.engines.sm90.sdpa_fwd_params import SMEM_BUDGET_BYTES
from frost.errors import TemplateParamsError

#: the head dims the template implements: d_qk and d_v each a multiple of 8 up to 256 (cuDNN's rule). Its tiles span
#: a head dim rounded up (`tile_head_dim`): TMA loads zero-fill the columns past it, TMA stores and reduce-adds
#: clip them, and the other stores and adds skip them, so the declared tensors are read and written as they are.
HEAD_DIMS = HeadDimSpan(multiple=8, maximum=256)
#: key rows of one wgmma M tile: with tile_n = 128 each MMA warpgroup owns 64 keys; with tile_n = 64 both share them
KEYS_PER_WG = 64
#: the steps of LSE / dpsum rows staged ahead in shared memory (by the rows warp, `rows_warp`, or the MMA threads)
ROWS_STAGES = 2


class Sm90BwdParams(SdpaBwdFeatureParams):
    """Plan-time description of one wgmma backward main kernel.

    Features follow `frost.engines.sdpa_args` (sinks and dSink through the shared
    helpers). Knobs change speed only.
    """

    family: Literal["sm90"] = "sm90"
    # knobs
    tile_m: int = 64  # query rows per step (64, 80: dQ split over head-dim halves; 128: over query halves)
    tile_n: int = 128  # key rows per CTA: 128 (a warpgroup per 64 keys) or 64 (warpgroups split head dims)
    num_stages: int = 2  # Q / dO pipeline depth
    dq_fragments: bool = False  # dQ tiles leave in fragment order by a 1D bulk reduce (else rows by tensor TMA)
    dq_red: bool = False  # dQ added from registers by red.global.add (no shared dQ tile, no writer warp)
    dk_first: bool = False  # issue dK before dQ and release Q / dO before dQ is done (always with tile_n=64)
    rows_warp: bool = False  # an idle producer warp stages LSE / dpsum rows (else the MMA threads load them)
    rows_mbar: bool = False  # with rows_warp: the rows change hands through mbarriers, each warpgroup on its own
    pdl: bool = True  # launched as a programmatic dependent of the preprocess (K / V / Q / dO loads overlap its tail)
    # deterministic turns without a band (`frost.engines.common.turns`): "stair" (every walk from the first query
    # tile, turns by key tile) or "rotated" (key tile n's walk starts at query tile n mod M, turns by step)
    det_order: Literal["stair", "rotated"] = "stair"
    sm_count: int = 132  # the target's SMs: a sequence's walks rotate where `turns.rotation_fits`

    @property
    def tile_head_dim(self) -> int:
        """The Q / K (and dQ / dK) tiles' head-dim extent: head_dim rounded up to a wgmma K step, to two where a
        GEMM splits its columns over the two warpgroups (dQ with tile_m = 64, dK with shared keys), and 128
        where dQ^T puts it on the M axis of two 64-row warpgroups (tile_m = 80)."""
        if self.dq_swap:
            return 2 * 64
        return round_up(self.head_dim, WGMMA_K * (1 if self.dq_split_m else 2))

    @property
    def tile_head_dim_v(self) -> int:
        """The V / dO (and dV) tiles' head-dim extent: head_dim_v rounded up to a wgmma K step, to two where the
        warpgroups split dV's columns (shared keys)."""
        return round_up(self.head_dim_v, WGMMA_K * (2 if self.kv_shared else 1))

    @property
    def s_k_blocks(self) -> int:
        """The wgmma k steps of S^T = K Q^T: those d_qk covers (a tile rounded to two steps holds zeros past it)."""
        return -(-self.head_dim // WGMMA_K)

    @property
    def dp_k_blocks(self) -> int:
        """The wgmma k steps of dP^T = V dO^T: those d_v covers."""
        return -(-self.head_dim_v // WGMMA_K)

    @property
    def padded(self) -> bool:
        """A tile is wider than its head dim: the stores and adds that are not TMA skip the columns past it."""
        return (self.tile_head_dim, self.tile_head_dim_v) != (self.head_dim, self.head_dim_v)

    @property
    def kv_shared(self) -> bool:
        """tile_n = 64: both MMA warpgroups share the tile's 64 keys. They split S^T / dP^T by query columns
        and dK / dV (and dQ) by head-dim columns, so P^T and dS^T pass through shared memory; this is what
        leaves room in registers for dK and dV at head dims above 128."""
        return self.tile_n == KEYS_PER_WG

    @property
    def dk_first_order(self) -> bool:
        """The step's last GEMMs run dK then dQ, Q and dO released once dK is done (the next step's loads
        overlap dQ); otherwise dQ then dK, dQ handed to the writer while dK runs."""
        return self.dk_first or self.kv_shared

    @property
    def dq_accum_blocked(self) -> bool:
        """The chain's accumulator contract: plain rows (the TMA reduce-add adds whole row tiles)."""
        return False

    @property
    def dq_accum_tile(self) -> int:
        """The chain's accumulator contract with `dq_fragments`: tiles of tile_m rows in fragment order."""
        return self.tile_m if self.dq_fragments else 0

    @property
    def dq_splits(self) -> int:
        """One accumulator: the deterministic order comes from turns."""
        return 0

    @property
    def dq_swap(self) -> bool:
        """tile_m is not a whole number of 64-row wgmma tiles: dQ^T = K^T dS^T puts the head dim on M."""
        return self.tile_m % 64 != 0

    @property
    def rotated(self) -> bool:
        """The rotated deterministic order (`turns.rotated_turn`) is compiled in."""
        return self.det_order == ROTATED

    @property
    def dq_split_m(self) -> bool:
        """The dQ GEMM splits query rows over the warpgroups (tile_m = 128), else head-dim columns."""
        return self.tile_m == 128

    @property
    def ranked_launch(self) -> bool:
        """The grid launches its batch entries longest first (`tile_scheduler.ranked_batch`): where a CTA walks a
        group of query heads (GQA: its walk that many times longer) over lengths from the device, frost's packed
        form or padding masks. Without GQA the index order measured level or faster, cuDNN's ragged-offset form
        keeps it until a GPU run checks the ranking there, and a dBias shared by the batch entries keeps its
        batch-fastest grid (benchmarks/results/2026-12-03-h200-run19)."""
        return (
            self.walk_group > 1 and (self.is_thd or self.has_seqused) and not self.ragged and self.grid_order == "key"
        )


def smem_bytes(p: Sm90BwdParams) -> int:
    """Shared memory of the main kernel: staged Q and dO, K, V, double-buffered dS (and P^T when the
    warpgroups share the keys), the fp32 dQ tile unless dQ leaves from registers."""
    e, d, dv = 2, p.tile_head_dim, p.tile_head_dim_v
    q = p.num_stages * p.tile_m * d * e
    do = p.num_stages * p.tile_m * dv * e
    k = p.tile_n * d * e
    v = p.tile_n * dv * e
    ds = 2 * p.tile_m * p.tile_n * e * (2 if p.kv_shared else 1)
    dq = 0 if p.dq_red else p.tile_m * d * 4
    rows = 2 * ROWS_STAGES * p.tile_m * 4  # staged LSE and dpsum
    return q + do + k + v + ds + dq + rows + 1024


def accumulator_registers(p: Sm90BwdParams) -> int:
    """fp32 accumulator registers per MMA thread at the step's peak (dK, dV, S, dP; dQ is born after S dies,
    and with shared keys after P^T and dS^T have left for shared memory)."""
    d, dv = p.tile_head_dim, p.tile_head_dim_v
    if p.kv_shared:  # per warpgroup: dK / dV of 64 keys x half the head dims, S^T / dP^T of half the queries
        dkv = KEYS_PER_WG * (d + dv) // 2 // 128
        return dkv + max(2 * KEYS_PER_WG * p.tile_m // 2 // 128, p.tile_m * d // 2 // 128)
    dkv = KEYS_PER_WG * (d + dv) // 128
    sdp = 2 * KEYS_PER_WG * p.tile_m // 128
    return dkv + sdp


def validate(p: Sm90BwdParams) -> None:
    """Raise TemplateParamsError when the template cannot build `p`."""

    def bad(msg: str):
        raise TemplateParamsError(f"Sm90BwdParams: {msg}")

    check_sdpa_features(p, HEAD_DIMS, "Sm90BwdParams")
    if p.tile_n not in (64, 128):
        bad(f"tile_n={p.tile_n} must be 128 (two MMA warpgroups of 64 keys) or 64 (both share the keys)")
    if p.tile_m not in (64, 80, 128):
        bad(f"tile_m={p.tile_m} must be 64, 80 or 128")
    if p.kv_shared and p.tile_m != 64:
        bad(
            f"tile_n=64 splits S^T's query columns and dQ's head dims over the warpgroups: needs tile_m=64 "
            f"(tile_m={p.tile_m})"
        )
    if p.dq_red and p.dq_fragments:
        bad("dq_red and dq_fragments are two ways out for dQ: pick one")
    if p.dq_red and p.dq_swap:
        bad(f"dq_red adds neighbouring dQ columns from registers: tile_m={p.tile_m} transposes dQ")
    if p.dq_fragments and p.ragged:
        bad("dq_fragments stores whole query tiles: the ragged-offset form (sequences anywhere) adds rows")
    if p.dq_fragments and p.dq_swap:
        bad(
            f"dq_fragments needs tile_m a multiple of 64 (tile_m={p.tile_m} transposes dQ, and fragment stores "
            "of the transposed tile make ptxas serialize the wgmmas)"
        )
    if p.dq_fragments and p.padded:
        bad(
            f"dq_fragments stores whole tiles of head_dim columns: head dims ({p.head_dim}, {p.head_dim_v}) pad to "
            f"tiles of ({p.tile_head_dim}, {p.tile_head_dim_v}), whose dQ leaves as rows (a clipping TMA reduce-add)"
        )
    if p.dq_fragments and (p.tile_m * p.head_dim) % 1024:
        bad(f"dq_fragments needs tile_m * head_dim ({p.tile_m * p.head_dim}) to be a multiple of 1024")
    if p.rows_mbar and not p.rows_warp:
        bad("rows_mbar hands the rows warp's stages over through mbarriers: needs rows_warp")
    if p.num_stages not in (1, 2):
        bad(f"num_stages={p.num_stages} must be 1 or 2")
    if p.dq_swap and not 96 < p.head_dim <= 2 * 64:
        bad(
            f"tile_m={p.tile_m} puts dQ's head dim on the M axis of two 64-row warpgroups (a 128-row tile): needs "
            f"head_dim from 104 to 128 (head_dim={p.head_dim})"
        )
    if p.tile_m == 80 and p.head_dim_v != p.head_dim:
        # H200 run 20: d_qk = 128 with d_v = 64 on 80 rows gave gradients 0.2-4x off (norm-relative) on every
        # packed graph; the 80-row kernel is verified only with equal head dims
        bad(
            f"tile_m=80 needs head_dim_v == head_dim (head dims {p.head_dim} x {p.head_dim_v}: its gradients were "
            "wrong on the GPU with d_v below d_qk; 64 rows serve this pair)"
        )
    if p.rotated and not p.deterministic:
        bad("det_order='rotated' orders deterministic turns: needs deterministic=True")
    if p.rotated and (p.has_window_left or p.has_window_right):
        bad("det_order='rotated' rotates whole walks over every query tile: needs no window (not causal)")
    regs = accumulator_registers(p)
    if regs > 208:
        bad(
            f"tile_m={p.tile_m} with head dims ({p.head_dim}, {p.head_dim_v}) on tiles of ({p.tile_head_dim}, "
            f"{p.tile_head_dim_v}) needs {regs} accumulator registers per thread (max 208)"
        )
    need = smem_bytes(p)
    if need > SMEM_BUDGET_BYTES:
        bad(f"tiles need {need} bytes of shared memory, more than {SMEM_BUDGET_BYTES}")


def name_suffix(p: Sm90BwdParams) -> str:
    """The self-describing part of the main kernel's name."""
    parts = name_dims(p) + [f"h{p.num_heads_q}k{p.num_heads_kv}" + (f"v{p.num_heads_v}" if p.num_heads_v else "")]
    parts += name_tags(
        (
            (p.has_window_left, "wl"),
            (p.has_window_right, "wr"),
            (p.bottom_right, "br"),
            (p.is_thd, "thd"),
            (p.has_seqused, "pad"),
            (p.has_dsinks, "dsink"),
            (p.deterministic, "det"),
        )
        + score_mod_tags(p)
    )
    parts += ragged_tags(p)
    parts += [f"rot{p.sm_count}"] * p.rotated
    parts.append(
        f"m{p.tile_m}n{p.tile_n}s{p.num_stages}"
        + "f" * p.dq_fragments
        + "r" * p.dq_red
        + "k" * (p.dk_first and not p.kv_shared)
        + "w" * p.rows_warp
        + "b" * p.rows_mbar
        + "p" * p.pdl
    )
    return "_".join(parts)


# ---------------------------------------------------------------------------------------------
# The chain (frost.engines.sdpa_bwd): the shared preprocess and dQ convert around this main kernel

MAIN_TEMPLATE = "frost.engines.sm90.sdpa_bwd"


def main_args(p: Sm90BwdParams) -> list[str]:
    """q, k, v, do, lse, dk, dv, lengths (cu_seqlens or seqused), bias?, dbias? (written directly), dpsum, dq_accum,
    dq_semaphore?, dbias_accum?, softmax_scale,
    window_left?, window_right?, max_seqlen_q? and max_seqlen_kv? (packed: the grid's key tiles, each length's
    cap), stream. Sinks need nothing here: LSE holds them, and the shared
    helpers compute dSink."""
    args = ["q", "k", "v", "do", "lse", "dk", "dv"] + lengths_args(p) + ["bias"] * p.has_bias
    args += ["dbias"] * (p.has_dbias and not p.dbias_accum) + ["dpsum", "dq_accum"]
    args += ["dq_semaphore"] * p.deterministic + ["dbias_accum"] * p.dbias_accum + ["softmax_scale"]
    args += ["window_left"] * p.has_window_left + ["window_right"] * p.has_window_right
    return args + ["max_seqlen_q", "max_seqlen_kv"] * p.is_thd + ragged_totals(p) + ["stream"]
