"""frost bench tells the truth on any machine: a CPU run's report says its times are wall clock, the PNG carries
GPU, date and commit, and --tokens sizes every workload, the packed mixes too."""

from __future__ import annotations

import json
import struct

import pytest

from frost.bench import cli, plot, report
from frost.bench.workloads import DEFAULT_THD_LENGTHS, DEFAULT_TOKENS, SweepSpec
from test.bench_argv import cpu_run_argv


def _png_text(path) -> dict:
    """The PNG's tEXt chunks (key -> value)."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    out, i = {}, 8
    while i < len(data):
        (n,), kind = struct.unpack(">I", data[i : i + 4]), data[i + 4 : i + 8]
        if kind == b"tEXt":
            k, _, v = data[i + 8 : i + 8 + n].partition(b"\0")
            out[k.decode("latin-1")] = v.decode("latin-1")
        i += 12 + n
    return out


def test_cpu_run_says_wall_clock_not_cuda_events(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the PNG is matplotlib's (the bench extra)")
    argv = cpu_run_argv(tmp_path, "--no-probe")
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "CUDA-event" not in out and "wall-clock time on the CPU" in out
    md = (tmp_path / "cpu.md").read_text()
    assert "CUDA-event" not in md and "harness self-test" in md
    assert json.loads((tmp_path / "cpu.json").read_text())["settings"]["device"] == "cpu"
    text = _png_text(tmp_path / "cpu.png")
    assert "GPU: cpu (harness self-test)" in text["Description"]
    assert "date: 20" in text["Description"] and "frost commit: " in text["Description"]


def test_gpu_legend_keeps_cuda_events():
    assert "CUDA-event-timed" in report.legend("cuda") and "CUDA-event" not in report.legend("cpu")


def test_png_carries_gpu_date_and_commit(tmp_path):
    pytest.importorskip("matplotlib", reason="the PNG is matplotlib's (the bench extra)")
    from test.cpu.test_bench import _synthetic_rows

    env = {"gpu": "NVIDIA H200", "date": "2026-12-03T10:00:00Z", "frost_commit": "5dc85a1"}
    path = plot.write_png(str(tmp_path / "c.png"), _synthetic_rows(), "t", env=env)
    desc = _png_text(path)["Description"]
    assert desc == "GPU: NVIDIA H200  |  date: 2026-12-03T10:00:00Z  |  frost commit: 5dc85a1"


def test_tokens_scale_every_workload():
    for tokens in (4096, 65536):
        spec = SweepSpec(layouts=["bshd", "thd"], tokens=tokens, seqlens=[1024, 4096, 16384])
        ws = spec.expand()
        dense = [w for w in ws if not w.is_thd]
        assert dense and all(w.batch * w.seqlen_q == tokens for w in dense)
        for w in (w for w in ws if w.is_thd):
            assert abs(sum(w.seqlens) - tokens) <= tokens * 0.01 + len(w.seqlens), (w.mix, sum(w.seqlens))
        if tokens < 16384:
            assert any("longer than --tokens" in why for why in spec.skipped)
    # the default keeps the historical fixed mix exactly; lengths given by hand are used as given
    assert SweepSpec().thd_mix("fixed") == DEFAULT_THD_LENGTHS and SweepSpec().tokens == DEFAULT_TOKENS
    assert SweepSpec(tokens=4096, thd_lengths=(10, 20)).thd_mix("fixed") == (10, 20)


def test_tokens_flag_reaches_the_packed_rows_in_the_dry_run(capsys):
    assert cli.main(["--dry-run", "--preset", "smoke", "--tokens", "4k"]) == 0
    out = capsys.readouterr().out
    assert "thd fixed (8 seq, T=16454)" not in out
    line = next(ln for ln in out.splitlines() if ln.startswith("THD mix fixed"))
    assert abs(int(line.split(", ")[1].split()[0]) - 4096) < 64
