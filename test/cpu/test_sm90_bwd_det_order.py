"""The SM90 backward's deterministic dQ orders (`det_order`), modelled in plain Python.

Each CTA holds one key tile and adds into the query tiles of its walk in walk order; an add into query tile m
waits until m's counter equals the CTA's turn on m. The model checks that the rotated order's closed form is
the order it states (by step, then key tile), that each tile's turns are a permutation, that CTAs running at
once never deadlock (and how many turn latencies they take against the stair order), and why the kernel keeps
the stair order where a sequence's key tiles outnumber the SMs.
"""

from __future__ import annotations

import random

import pytest

from frost.engines.common.turns import rotated_turn, rotation_fits
from frost.engines.sm90.sdpa_bwd_knobs import default_knobs
from frost.engines.sm90.sdpa_bwd_params import Sm90BwdParams, name_suffix, validate
from frost.errors import TemplateParamsError
from frost.testing.cases import sm90_bwd_kwargs


def stair(n_k: int, n_m: int, group: int = 1):
    """Today's order: every walk from query tile 0, turns by key tile."""
    walks = [[(h, m) for h in range(group) for m in range(n_m)] for _ in range(n_k)]
    return walks, {(n, m): n for n in range(n_k) for m in range(n_m)}


def rotated(n_k: int, n_m: int, group: int = 1):
    """The rotated order: key tile n's walk starts at query tile n mod M (per head), turns by `rotated_turn`."""
    walks = [[(h, (n + s) % n_m) for h in range(group) for s in range(n_m)] for n in range(n_k)]
    return walks, {(n, m): rotated_turn(n, m, n_k, n_m) for n in range(n_k) for m in range(n_m)}


def simulate(walks, turns, resident: int | None = None, pick=None) -> int | None:
    """Turn latencies until every CTA is done, or None on a deadlock. Each round, every resident CTA whose next
    add's turn has come performs it (or, with `pick`, only the one it picks). At most `resident` CTAs run at
    once, launched in key-tile order as earlier ones finish (all of them without a limit)."""
    counters = {}
    pos = [0] * len(walks)
    launched = len(walks) if resident is None else min(resident, len(walks))
    rounds = 0
    while any(p < len(w) for p, w in zip(pos, walks)):
        running = [n for n in range(launched) if pos[n] < len(walks[n])]
        ready = [n for n in running if counters.get(walks[n][pos[n]], 0) == turns[n, walks[n][pos[n]][1]]]
        if not ready:
            return None
        for n in [pick(ready)] if pick else ready:
            counters[walks[n][pos[n]]] = counters.get(walks[n][pos[n]], 0) + 1
            pos[n] += 1
        rounds += 1
        while launched < len(walks) and sum(pos[n] < len(walks[n]) for n in range(launched)) < (resident or 0):
            launched += 1
    return rounds


@pytest.mark.parametrize("n_k", range(1, 20))
@pytest.mark.parametrize("n_m", range(1, 20))
def test_rotated_turn_orders_adds_by_step_then_key_tile(n_k, n_m):
    for m in range(n_m):
        by_step = sorted(range(n_k), key=lambda n: ((m - n) % n_m, n))
        turns = [rotated_turn(n, m, n_k, n_m) for n in range(n_k)]
        assert sorted(turns) == list(range(n_k))  # a permutation: the counter ends at N, as the stair order's
        assert [turns[n] for n in by_step] == list(range(n_k))


@pytest.mark.parametrize(
    "n_k,n_m,group", [(1, 1, 1), (3, 7, 1), (7, 3, 2), (16, 16, 2), (32, 32, 1), (64, 32, 1), (33, 32, 4), (10, 40, 1)]
)
def test_concurrent_ctas_never_deadlock(n_k, n_m, group):
    for order in (stair, rotated):
        walks, turns = order(n_k, n_m, group)
        assert simulate(walks, turns) is not None, order.__name__
        rng = random.Random(n_k * 1000 + n_m)
        assert simulate(walks, turns, pick=rng.choice) == n_k * n_m * group  # any interleaving: one add a round


@pytest.mark.parametrize(
    "n_k,n_m,rounds_stair,rounds_rotated",
    [(32, 32, 63, 32), (128, 128, 255, 128), (64, 32, 95, 64), (256, 128, 383, 256)],
)
def test_rotated_walks_skip_the_staircase(n_k, n_m, rounds_stair, rounds_rotated):
    """Stair: key tile n's first add waits n turns (N + M - 1 rounds); rotated: every CTA adds at once."""
    assert simulate(*stair(n_k, n_m)) == rounds_stair
    assert simulate(*rotated(n_k, n_m)) == rounds_rotated


def test_rotation_needs_the_key_tiles_resident():
    """A rotated turn waits on higher key tiles: with fewer SMs than key tiles the resident CTAs wait on ones
    not launched yet, so the kernel keeps the stair order there (`rotation_fits`), which never waits upward."""
    assert simulate(*rotated(8, 8), resident=4) is None
    assert simulate(*stair(8, 8), resident=4) is not None
    assert simulate(*rotated(8, 8), resident=8) is not None


def _two_kernels(order, n_k: int, n_m: int):
    """Two kernels of one order on other streams, their CTAs launched in turn (A0, B0, A1, B1, ...)."""
    walks, turns = order(n_k, n_m)
    both, both_turns = [], {}
    for n in range(n_k):
        for k in range(2):
            for m in range(n_m):
                both_turns[len(both), m] = turns[n, m]
            both.append([(h + 100 * k, m) for h, m in walks[n]])
    return both, both_turns


def test_the_safety_rule_leaves_room_for_a_second_kernel():
    """One rule for both backwards (`turns.rotation_fits`): a sequence's key tiles fit on half the SMs, so two
    rotated kernels running at once never deadlock; with all the SMs each, they can."""
    assert simulate(*_two_kernels(rotated, 8, 8), resident=8) is None
    assert simulate(*_two_kernels(rotated, 8, 8), resident=16) is not None
    assert simulate(*_two_kernels(stair, 8, 8), resident=8) is not None
    assert rotation_fits(66, 132) and not rotation_fits(67, 132)


def test_params_validate_and_name_the_rotated_order():
    det = Sm90BwdParams(**sm90_bwd_kwargs(deterministic=True))
    rot = Sm90BwdParams(**sm90_bwd_kwargs(deterministic=True, knobs=dict(det_order="rotated")))
    assert det.det_order == "stair" and "rot" not in name_suffix(det)
    assert rot.sm_count == 132 and "_det_rot132_" in name_suffix(rot)
    validate(rot)
    assert default_knobs(128, 128, sm_count=78, det_order="rotated")["sm_count"] == 78
    assert "sm_count" not in default_knobs(128, 128, sm_count=78)  # the stair plans' knobs as before
    for flags, word in (
        (dict(), "needs deterministic"),
        (dict(deterministic=True, has_window_right=True), "window"),
        (dict(deterministic=True, has_window_left=True), "window"),
    ):
        with pytest.raises(TemplateParamsError, match=word):
            validate(Sm90BwdParams(**sm90_bwd_kwargs(**flags, knobs=dict(det_order="rotated"))))


@pytest.mark.slow
def test_rotated_kernels_compile_for_sm90a_without_spills(tmp_path):
    from test.compile_runner import compile_groups

    kws = [
        sm90_bwd_kwargs(deterministic=True, knobs=dict(det_order="rotated")),
        sm90_bwd_kwargs(d=256, deterministic=True, knobs=dict(det_order="rotated", num_stages=2, dq_red=True)),
        sm90_bwd_kwargs(is_thd=True, hq=8, hk=2, deterministic=True, knobs=dict(det_order="rotated")),
    ]
    groups = [
        ("sm_90a", [("frost.engines.sm90.sdpa_bwd", "frost.engines.sm90.sdpa_bwd_params.Sm90BwdParams", kw, None)])
        for kw in kws
    ]
    for [r] in compile_groups(groups, tmp_path, timeout=900, ptxas=True):
        assert "_det_rot132_" in r["name"], r
        assert r["wgmma_mma_async"] > 0 and r["local"] == 0, r
        assert r.get("ptxas") is None or r["spill_bytes"] == 0, r
