"""The wgmma backward's default knobs per head dim and problem, with the measurements behind each choice.

Planning reads this module (no cutlass import); the validator and budgets live in `sdpa_bwd_params`.
"""

from __future__ import annotations

from frost.engines.common.turns import ROTATED
from frost.engines.params import round_up
from frost.engines.sm90.sdpa_bwd_params import WGMMA_K, Sm90BwdParams, smem_bytes
from frost.engines.sm90.sdpa_fwd_params import SMEM_BUDGET_BYTES


def default_knobs(
    head_dim: int,
    head_dim_v: int | None = None,
    banded: bool = False,
    packed: bool = False,
    sm_count: int = 132,
    ragged: bool = False,
    bias: bool = False,
    alibi: bool = False,
    dbias: bool = False,
    **requested,
) -> dict:
    """Good knobs per head dim (`banded`: a right bound, e.g. causal; `packed`: THD; `ragged`: cuDNN's
    ragged-offset form of it; `bias`, `alibi`: the score modifiers, `dbias`: with dBias); `requested` knobs are
    honored (the validator judges them).

    Measured on the H200 (bf16, 16k tokens; benchmarks/results/2026-12-01-h200-run7 and -run8): d=64 takes
    128 query rows per step (1.12-1.20x faster than 64), d=96 64 rows; both store dQ in fragment order
    (`dq_fragments`: 1.00-1.05x). d=128 takes 64 rows in fragment order, its LSE / dpsum rows staged by the
    rows warp: under a band 0.99-1.06x the 80-row kernel (run 9), without one 1.02x (run 10: 0.934 / 0.969x
    FlashAttention-4 at 16k / 4k against 0.916 / 0.951x); packed batches (row stores only) take 80 rows
    without a band (dQ^T = K^T dS^T: fragment stores of that tile make ptxas serialize its wgmmas). Above d=128 the
    warpgroups share 64 keys (`tile_n=64`): d=192x128 with two Q / dO stages and fragment tiles (0.81-0.85x
    FlashAttention-4 at 16k
    tokens; one stage 0.76-0.80x, register adds 0.46-0.53x), d=256 with one stage and fragment tiles
    (1.19-1.22x FA4; row tiles 1.13-1.15x; two stages with register adds 0.75-0.81x: the adds cost more than
    the second stage gains) (benchmarks/results/2026-12-01-h200-run9).

    Other head dims take the knobs of their tiles' widest head dim (`tile_head_dim`, rounded to a wgmma K step:
    up to 64, 96, 128, or above with shared keys, two stages where they fit), unmeasured; padded tiles add dQ
    as rows (`dq_fragments` needs whole tiles). A requested rotated order (`det_order`) takes the target's
    `sm_count`.
    """
    if requested.get("det_order") == ROTATED:
        requested = {"sm_count": sm_count, **requested}
    dv = head_dim_v or head_dim
    widest = max(round_up(head_dim, WGMMA_K), round_up(dv, WGMMA_K))
    if widest > 128:  # shared keys; two Q / dO stages where they fit beside the dQ tile (d=256: one)
        k = {**dict(tile_m=64, tile_n=64, num_stages=2, dq_red=False), **requested}
        if "num_stages" not in requested and smem_bytes(_probe(head_dim, dv, k)) > SMEM_BUDGET_BYTES:
            k["num_stages"] = 1
    else:  # tiles up to 64 wide take 128 rows, up to 96 64 rows, up to 128 as d=128 (80 rows need d_qk > 96);
        # packed tiles of 16 columns 64 rows (with 128 their row stores spill)
        # d_qk=128 takes 64 rows (fragment dQ, rows warp) band or not; d_qk in (96, 128) (padded: row dQ) and
        # packed batches take 80 without a band
        # 80 rows only with d_v = d_qk (`validate`: with d_v = 64 under d_qk = 128 its gradients were wrong)
        wide_qk = 96 < head_dim <= 128 and dv == head_dim
        tile_m = (
            128
            if widest <= 64 and not (packed and widest <= WGMMA_K)
            else 80
            if widest > 96 and wide_qk and (packed or (not banded and head_dim != 128))
            else 64
        )
        if ((bias or alibi) and tile_m == 80) or (tile_m == 128 and (bias or (packed and dbias))):
            # the modifiers' registers spill the 80-row kernel; a bias's loads (212-476 bytes, with dBias or not)
            # and dBias's adds (packed) the 128-row one
            tile_m = 64
        k = {**dict(tile_m=tile_m, tile_n=128, num_stages=2), **requested}
    # packed tiles up to 64 wide add dQ in fragment order too, each sequence from its own tiles (run 12: 0.92-0.96x
    # FlashAttention-4 against 0.88-0.91x with rows); wider packed tiles keep rows (80-row tiles; 64-row fragment
    # tiles were within 2% of them without a band and 1-9% slower under one)
    k.setdefault(
        "dq_fragments",
        (not packed or (widest <= 64 and not ragged))
        and not k.get("dq_red")
        and k["tile_m"] % 64 == 0
        and (k["tile_m"] * head_dim) % 1024 == 0
        and not _probe(head_dim, dv, k).padded,
    )
    if widest > 128:
        return k
    # the rows warp frees the MMA threads of the LSE / dpsum loads, handing its stages over through mbarriers (a
    # warpgroup waits for the rows, not for the other one). Measured against MMA-thread loads, ratio to
    # FlashAttention-4 in the same process: d=128 dense 0.956-0.984x (run 13; named barriers 0.920-0.995x),
    # d=64 dense 0.959-0.971x against 0.935-0.967x, d=96 0.955-0.973x against 0.915-0.932x, packed d=128
    # 0.947-1.028x against 0.928-0.948x, packed d=96 0.894-0.926x against 0.839-0.909x, packed d=64 0.867-0.984x
    # against 0.902-0.952x (run 14; its only loss the 18-sequence mix without a band). The dense d=128
    # 80-row kernel keeps the MMA-thread loads (with the rows warp ptxas serializes its wgmmas). Dense d_qk from 72
    # to 88 (padded tiles, row dQ) takes the rows warp too: d=80 1.04-1.06x (its rows warp spills one 8-byte value
    # per step in its 24 registers), and the 80-row kernel at d_qk 104 / 112 (clean; d=112 1.04x without a band;
    # at d=120 ptxas serializes) (run 18); d=112 under a band (64 rows) gained nothing. Other head dims are
    # unmeasured and keep the MMA-thread loads
    measured = (
        head_dim in (64, 96, 128)
        and (packed or (k["dq_fragments"] and k["tile_m"] != 80))
        or not packed
        and (64 < head_dim < 96 or 96 < head_dim <= 112 and k["tile_m"] == 80)
    )
    k.setdefault("rows_warp", head_dim == dv and measured)
    k.setdefault("rows_mbar", k["rows_warp"])
    return k


def _probe(head_dim: int, head_dim_v: int, knobs: dict) -> Sm90BwdParams:
    """Params with these head dims and knobs (no features): what the knobs' tiles and paths come to."""
    return Sm90BwdParams(head_dim=head_dim, head_dim_v=head_dim_v, **knobs)
