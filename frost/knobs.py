"""Knobs: speed-only choices a user may request. A requested knob is honored or the engine is ineligible."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict


class Knobs(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tile_m: Optional[int] = None
    tile_n: Optional[int] = None
    num_stages: Optional[int] = None
    num_warps: Optional[int] = None
    pack_gqa: Optional[bool] = None  # SM90 and mma.sync forwards: one M tile holds the query heads of a kv head (GQA)
    # SM90 forward: O's columns in this many slices, each its own work tile recomputing S (a d_v above 256 needs
    # at least ceil(d_v / 256); unset, the plan takes the fewest)
    v_slices: Optional[int] = None
    # mma.sync deterministic dense backward: fp32 dQ accumulator copies (0: per-tile turns, one accumulator of
    # workspace). Unset, the plan picks the count that keeps the SMs busy within 1 GiB of extra workspace.
    dq_splits: Optional[int] = None
    # SM90 wgmma deterministic backward without a band: "stair" (walks from the same query tile) or "rotated"
    # (each key tile's walk from its own query tile; turns by step)
    det_order: Optional[str] = None
    # mma.sync forward: key blocks cut into this many splits, each its own CTA writing an fp32 partial O and LSE,
    # reduced by a combine kernel (split-KV decode). Unset, the plan picks it (`frost.adapters.split_kv`)
    num_splits: Optional[int] = None

    def requested(self) -> dict:
        return {k: v for k, v in self.model_dump().items() if v is not None}
