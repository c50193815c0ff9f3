"""Interleaved timing: rotated order, spread, win / loss / tie by range overlap, the matmul ceiling; the CPU
harness mode end to end (wall-clock samples)."""

from __future__ import annotations

import json

from frost.bench import cli, report
from frost.bench.results import Measurement
from frost.bench.spread import Spread, compare_ms, interleave, rotated
from test.bench_argv import cpu_run_argv


def test_each_round_rotates_the_order_and_every_engine_gets_each_round():
    calls, log = [], []
    samplers = {k: (lambda k=k: calls.append(k) or 1.0) for k in ("a", "b", "c")}
    out = interleave(samplers, rounds=5, order_log=log)
    assert log[:3] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]] and log[3] == log[0]
    assert calls == [k for order in log for k in order]
    assert {k: len(v) for k, v in out.items()} == {"a": 5, "b": 5, "c": 5}
    assert rotated([], 3) == []


def test_overlapping_ranges_are_a_tie_whatever_the_medians():
    mine, peer = Spread.of([1.00, 0.95, 1.10, 1.02, 0.99]), Spread.of([1.05, 1.08, 0.97, 1.20, 1.06])
    v = compare_ms(mine, peer)
    assert v["verdict"] == "tie" and v["ratio"] > 1  # faster median, yet the ranges overlap
    assert v["ratio_lo"] < 1 < v["ratio_hi"]


def test_separate_ranges_are_a_win_or_a_loss():
    fast, slow = Spread.of([0.80, 0.82, 0.81, 0.79, 0.83]), Spread.of([0.90, 0.92, 0.91, 0.95, 0.89])
    win, loss = compare_ms(fast, slow), compare_ms(slow, fast)
    assert win["verdict"] == "win" and loss["verdict"] == "loss"
    assert win["ratio_lo"] > 1 and loss["ratio_hi"] < 1
    assert abs(win["ratio"] - 0.91 / 0.81) < 1e-12


def test_spread_lines_show_range_ratio_verdict_and_ceiling():
    from test.cpu.test_bench import _row

    row = _row()
    peer = row.add(Measurement("fa4", "ok", ms=1.0, info={"spread_ms": [1.0, 0.98, 1.04]}))
    mine = Spread.of([0.8, 0.81, 0.82, 0.8, 0.79])
    row.add(
        Measurement(
            "frost:SdpaFwdDslSm90",
            "ok",
            ms=0.8,
            info={
                "spread_ms": [mine.median, mine.lo, mine.hi],
                "of_ceiling": 0.62,
                "vs": {"fa4": compare_ms(mine, Spread(1.0, 0.98, 1.04, 5))},
            },
        )
    )
    assert peer.tflops
    lines = report.spread_lines([row])
    frost_line = [x for x in lines if "Sm90" in x][0]
    assert "0.8 ms [0.79-0.82]" in frost_line and "62% of ceiling" in frost_line
    assert "1.25x [1.20-1.32] win" in frost_line
    text = report.render_report([row], ceiling={"n": 8192, "tflops": 700.0, "tflops_lo": 690.0, "tflops_hi": 710.0})
    assert "bf16 matmul ceiling (8192^3 GEMM, torch.matmul): 700 TFLOP/s [690-710]" in text


def test_cpu_run_interleaves_and_measures_the_ceiling(tmp_path, capsys):
    argv = cpu_run_argv(tmp_path, "--no-probe", json=None, interleave="5", ceiling="128")
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "Interleaved timing" in out and "matmul ceiling (128^3 GEMM" in out and "% of ceiling" in out
    d = json.loads((tmp_path / "cpu.json").read_text())
    cells = [m for r in d["rows"] for m in r["results"].values() if m.get("info", {}).get("spread_ms")]
    assert cells and all(len(m["info"]["samples_ms"]) == 5 for m in cells)
    med, lo, hi = cells[0]["info"]["spread_ms"]
    assert lo <= med <= hi and cells[0]["ms"] == med
    assert d["settings"]["ceiling"]["tflops"] > 0
