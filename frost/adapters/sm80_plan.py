"""What an mma.sync backward plan chooses per problem and GPU: the deterministic mode.

Split dQ accumulator copies where they keep the SMs busy, else per-tile turns, in the rotated order where
that is safe. The adapters' `plan_knobs` hooks call these; they read only plan-time values (facts and the
target record).
"""

from __future__ import annotations

from frost.engines.common.turns import ROTATED, rotation_fits
from frost.engines.sdpa_bwd.scratch import accumulator_rows, cdiv, uses_turns


def choose_dq_splits(
    sm_count: int,
    batch: int,
    num_heads_kv: int,
    num_key_tiles: int,
    copy_bytes: int = 0,
    max_splits: int = 8,
    min_busy: float = 0.9,
    max_extra_bytes: int = 1 << 30,
) -> int:
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
        waves = cdiv(ctas, sm_count)
        if ctas / (waves * sm_count) >= min_busy:
            return splits
    return 0


def planned_dq_splits(p, sm_count: int, batch: int, seq_q: int, seq_kv: int) -> int:
    """The `dq_splits` a deterministic dense plan compiles with on a GPU of `sm_count` SMs (0: turns).

    Split copies beat per-tile turns on every H200 row measured (deterministic cost 2-12% against 8-23%,
    benchmarks/results/2026-11-30-h200-run6), so they are the default wherever `choose_dq_splits` finds a
    count that keeps the SMs busy; a non-deterministic or packed chain, or an unknown SM count, keeps 0.
    """
    if not p.deterministic or p.is_thd or sm_count <= 0:
        return 0
    copy_bytes = batch * p.num_heads_q * accumulator_rows(p, seq_q) * p.head_dim * 4
    return choose_dq_splits(sm_count, batch, p.kv_grid_heads, cdiv(seq_kv, p.tile_n), copy_bytes=copy_bytes)


def planned_det_order(p, sm_count: int, seq_kv: int) -> str:
    """The turn order a deterministic plan with turns compiles with: the rotated one where it applies (no
    windows) and a head's key tiles (`seq_kv`: the dense length or the THD envelope) pass the turns' safety
    rule (`turns.rotation_fits`); else the params' own."""
    if not uses_turns(p) or p.has_window_left or p.has_window_right or sm_count <= 0:
        return p.det_order
    key_tiles = cdiv(seq_kv, p.tile_n)
    return ROTATED if 0 < key_tiles and rotation_fits(key_tiles, sm_count) else p.det_order


def planned_det_knobs(p, sm_count: int, batch: int, seq_q: int, seq_kv: int, choose_splits: bool = True) -> dict:
    """The deterministic-mode knobs a plan sets on top of `p` for its problem and GPU (empty when none
    change): split copies where they keep the SMs busy (unless the caller fixed `dq_splits`), else the
    rotated turn order where it applies."""
    out = {}
    splits = planned_dq_splits(p, sm_count, batch, seq_q, seq_kv) if choose_splits else p.dq_splits
    if splits != p.dq_splits:
        out["dq_splits"] = splits
    order = p.det_order if splits else planned_det_order(p, sm_count, seq_kv)
    if order != p.det_order:
        out["det_order"] = order
    return out
