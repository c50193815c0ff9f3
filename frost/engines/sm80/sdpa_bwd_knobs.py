"""The mma.sync backward's tuning table and default knobs: what a plan asks of `Sm80BwdParams` per head dim.

Planning reads this module (no cutlass import); the validator and budgets it probes live in `sdpa_bwd_params`.
"""

from __future__ import annotations

from frost.engines.params import check_sdpa_features
from frost.engines.sm80.sdpa_bwd_params import SMEM_BUDGET, Sm80BwdParams, smem_bytes, validate
from frost.engines.sm80.sdpa_fwd_params import HEAD_DIMS, TUNED_HEAD_DIMS, tile_dim, tuned_head_dims
from frost.errors import TemplateParamsError

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
    (64, 64): [
        dict(
            tile_m=128,
            tile_n=128,
            num_stages=2,
            num_warps=8,
            sdp_warps_m=4,
            dkv_warps_n=4,
            dq_warps_m=4,
            fused_prefetch=True,
            det_late_release=True,
        ),
        dict(tile_m=64, tile_n=128, num_stages=2, num_warps=8, sdp_warps_m=2, dkv_warps_n=4, dq_warps_m=2),
        dict(tile_m=64, tile_n=64, num_stages=2, num_warps=8, sdp_warps_m=2, dkv_warps_n=4, dq_warps_m=2),
    ],
    (96, 96): [
        dict(tile_m=64, tile_n=128, num_stages=2, num_warps=8, sdp_warps_m=2, dkv_warps_n=4, dq_warps_m=4),
        dict(tile_m=64, tile_n=64, num_stages=2, num_warps=8, sdp_warps_m=2, dkv_warps_n=4, dq_warps_m=4),
    ],
    (128, 128): [
        dict(tile_m=64, tile_n=128, num_stages=2, num_warps=8, sdp_warps_m=2, dkv_warps_n=4, dq_warps_m=2),
        dict(tile_m=64, tile_n=64, num_stages=1, num_warps=8, sdp_warps_m=2, dkv_warps_n=4, dq_warps_m=2),
    ],
    (192, 128): [
        dict(tile_m=64, tile_n=64, num_stages=2, num_warps=8, sdp_warps_m=2, dkv_warps_n=4, dq_warps_m=2),
        dict(tile_m=32, tile_n=64, num_stages=1, num_warps=8, sdp_warps_m=2, dkv_warps_n=4, dq_warps_m=2),
    ],
    (256, 256): [
        dict(tile_m=64, tile_n=64, num_stages=2, num_warps=8, sdp_warps_m=2, dkv_warps_n=4, dq_warps_m=2),
        dict(tile_m=64, tile_n=64, num_stages=1, num_warps=8, sdp_warps_m=2, dkv_warps_n=4, dq_warps_m=2),
        dict(tile_m=32, tile_n=32, num_stages=1, num_warps=4, sdp_warps_m=2, dkv_warps_n=2, dq_warps_m=2),
    ],
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


def default_knobs(
    family: str, head_dim: int, head_dim_v: int, dtype: str = "bf16", smem_budget: int | None = None, **requested
) -> dict:
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
    raise TemplateParamsError(
        f"Sm80BwdParams: no knobs for d_qk={head_dim}, d_v={head_dim_v} honoring "
        f"{requested} fit {budget} bytes of shared memory"
    )
