"""The benchmark harness on the CPU: flags, FLOP convention, table, ratio, writers, dry run.

The frost runner is exercised through the real graph API with the CPU-serving
reference engine, so API drift shows up here before anyone spends GPU time.
"""

from __future__ import annotations

import json
import math
import sys

import pytest

from frost.bench import cli, report
from frost.bench.flops import BWD_FACTOR, sdpa_flops, tflops
from frost.bench.impl import CHECK_FAILED, FAILED, MISSING, NA, OK
from frost.bench.inputs import buffer_count, cu_seqlens_of
from frost.bench.results import Measurement, Row, impl_columns, rows_from_dict
from frost.bench.timing import choose_inner
from frost.bench.workloads import DEFAULT_THD_LENGTHS, Workload, parse_gqa, parse_head_dim, parse_size, random_mix
from test.bench_argv import cpu_run_argv


def _spec(argv):
    return cli.spec_from_args(cli.build_parser().parse_args(argv))


# ---- flags ----------------------------------------------------------------------
def test_parse_helpers():
    assert parse_size("4096") == 4096 and parse_size("4k") == 4096 and parse_size("16K") == 16384
    assert parse_head_dim("128") == (128, 128) and parse_head_dim("192x128") == (192, 128)
    assert parse_gqa("4") == 4 and parse_gqa("32:8") == 4
    with pytest.raises(ValueError):
        parse_size("zero")
    with pytest.raises(ValueError):
        parse_gqa("6:4")


def test_default_preset_expands_the_full_sweep():
    spec = _spec([])
    ws = spec.expand()
    dense = [w for w in ws if not w.is_thd]
    thd = [w for w in ws if w.is_thd]
    assert len(dense) == 2 * 3 * 2 * 6  # dir x D x mask x S
    assert len(thd) == 2 * 3 * 2 * 2  # dir x D x mask x mix
    for w in dense:
        assert w.batch * w.seqlen_q == 16384 and w.heads_q * w.d_v == 2048 and w.heads_kv == w.heads_q
    assert {w.seqlen_q for w in dense} == {512, 1024, 2048, 4096, 8192, 16384}
    assert [w.direction for w in spec.probes()] == ["fwd", "bwd"]
    assert all((w.batch, w.heads_q, w.seqlen_q, w.d_qk) == (1, 1, 128, 64) for w in spec.probes())


def test_flags_override_the_preset():
    spec = _spec(
        [
            "--preset",
            "quick",
            "--head-dim",
            "192x128",
            "--dtype",
            "fp16",
            "--causal",
            "yes",
            "--gqa",
            "1,32:8",
            "--seqlen",
            "1k,8k",
            "--tokens",
            "32k",
            "--hidden",
            "4096",
            "--layout",
            "bshd",
            "--direction",
            "bwd",
            "--no-probe",
        ]
    )
    ws = spec.expand()
    assert spec.probes() == []
    assert len(ws) == 2 * 2  # gqa x S
    for w in ws:
        assert (w.d_qk, w.d_v, w.dtype, w.causal, w.direction) == (192, 128, "fp16", True, "bwd")
        assert w.heads_q == 32 and w.heads_kv in (32, 8) and w.batch * w.seqlen_q == 32768


def test_impossible_gqa_is_left_out_not_fatal():
    spec = _spec(["--head-dim", "64,256", "--gqa", "16", "--layout", "bshd", "--seqlen", "4k"])
    ws = spec.expand()
    assert {w.d_qk for w in ws} == {64}  # hidden 2048 / 256 = 8 heads: ratio 16 cannot apply
    assert any("256" in s for s in spec.skipped)
    with pytest.raises(ValueError):
        _spec(["--head-dim", "256", "--gqa", "16"]).expand()


def test_heads_fix_the_head_count_of_a_head_dim_sweep():
    """`--heads` keeps every head dim of a sweep at one head count; without it hidden 2048 leaves 80, 96 and 112
    out, naming the flag."""
    dims = ["--head-dim", "80,96,112,128", "--layout", "bshd", "--seqlen", "16k", "--direction", "fwd"]
    spec = _spec(dims + ["--heads", "16", "--gqa", "1,4"])
    ws = spec.expand()
    assert sorted({w.d_qk for w in ws}) == [80, 96, 112, 128] and not spec.skipped
    assert {(w.heads_q, w.heads_kv) for w in ws} == {(16, 16), (16, 4)}
    plain = _spec(dims)
    assert {w.d_qk for w in plain.expand()} == {128}
    assert any("80" in s and "--heads" in s for s in plain.skipped)
    odd = _spec(dims + ["--heads", "16", "--gqa", "3"])
    with pytest.raises(ValueError, match=r"GQA ratio 3 does not divide Hq=16 \(--heads\)"):
        odd.expand()


def test_deterministic_flag_doubles_backward_rows_only():
    base = ["--preset", "quick", "--layout", "bshd", "--seqlen", "4k", "--no-probe"]
    plain = _spec(base).expand()
    assert _spec(base + ["--deterministic", "no"]).expand() == plain
    assert not any(w.deterministic for w in plain)
    both = _spec(base + ["--deterministic", "both"]).expand()
    fwd, bwd = [w for w in both if w.direction == "fwd"], [w for w in both if w.direction == "bwd"]
    assert fwd == [w for w in plain if w.direction == "fwd"]  # forward rows ignore the flag
    assert len(bwd) == 2 * len([w for w in plain if w.direction == "bwd"])
    for nondet, det in zip(bwd[::2], bwd[1::2]):  # each backward row, then its deterministic twin
        assert not nondet.deterministic and det.deterministic
        assert det == Workload(**{**nondet.__dict__, "deterministic": True})
    only = _spec(base + ["--deterministic", "yes", "--direction", "bwd"]).expand()
    assert only and all(w.deterministic for w in only)
    assert _spec(base + ["--deterministic", "both"]).probes() == _spec(base).probes()


def test_deterministic_label_and_round_trip():
    w = Workload("bwd", "bf16", 128, 128, 16, 16, True, batch=4, seqlen_q=4096, seqlen_kv=4096, deterministic=True)
    assert w.direction_label == "bwd det" and w.label == "bwd det bf16 d128 4x4096 h16 causal"
    assert Workload.from_dict(w.to_dict()) == w
    legacy = {k: v for k, v in w.to_dict().items() if k != "deterministic"}  # JSON written before the flag
    assert not Workload.from_dict(legacy).deterministic


def test_bad_flags_exit_with_usage():
    for argv in (
        ["--dtype", "fp8"],
        ["--direction", "sideways"],
        ["--causal", "maybe"],
        ["--impl", "xformers"],
        ["--deterministic", "maybe"],
    ):
        with pytest.raises(SystemExit):
            cli.build_parser().parse_args(argv)


def test_thd_mixes():
    spec = _spec(["--layout", "thd"])
    assert spec.thd_mix("fixed") == DEFAULT_THD_LENGTHS
    mix = random_mix(16384, 8192, seed=3)
    assert sum(mix) == 16384 and all(1 <= n <= 8192 for n in mix) and len(mix) > 2
    assert mix == random_mix(16384, 8192, seed=3) and mix != random_mix(16384, 8192, seed=4)
    assert cu_seqlens_of([3, 0, 5]) == [0, 3, 3, 8]


# ---- FLOPs ------------------------------------------------------------------------
def test_flop_convention():
    f = sdpa_flops(heads=16, d_qk=128, batch=4, seqlen_q=4096)
    assert f == 4 * 4 * 16 * 4096 * 4096 * 128
    assert sdpa_flops(heads=16, d_qk=128, batch=4, seqlen_q=4096, causal=True) == f / 2
    assert sdpa_flops(heads=16, d_qk=128, batch=4, seqlen_q=4096, direction="bwd") == BWD_FACTOR * f
    assert sdpa_flops(heads=16, d_qk=192, d_v=128, batch=2, seqlen_q=1024) == 2 * 2 * 16 * 1024 * 1024 * (192 + 128)
    assert sdpa_flops(heads=8, d_qk=64, batch=1, seqlen_q=100, seqlen_kv=300) == 4 * 8 * 100 * 300 * 64
    lens = [4096, 517, 1]
    thd = sdpa_flops(heads=16, d_qk=128, seqlens_q=lens, causal=True, direction="bwd")
    assert thd == 2.5 * sum(4 * 16 * n * n * 128 for n in lens) / 2
    assert tflops(1e12, 1.0) == pytest.approx(1000.0) and tflops(1e12, None) is None
    with pytest.raises(ValueError):
        sdpa_flops(heads=1, d_qk=64, seqlen_q=1, direction="sideways")


def test_workload_flops_match_the_formula():
    w = Workload("bwd", "bf16", 192, 128, 16, 4, True, layout="thd", seqlens=(100, 7), mix="x")
    assert w.flops() == 2.5 * sum(2 * 16 * n * n * (192 + 128) for n in (100, 7)) / 2
    d = Workload("fwd", "bf16", 128, 128, 16, 16, False, batch=4, seqlen_q=4096, seqlen_kv=4096)
    assert d.flops() == 4 * 4 * 16 * 4096 * 4096 * 128
    assert Workload.from_dict(w.to_dict()) == w


# ---- rows, ratio, table -----------------------------------------------------------------
def _row(direction="fwd", causal=False, probe=False):
    w = (
        Workload(direction, "bf16", 64, 64, 1, 1, False, batch=1, seqlen_q=128, seqlen_kv=128, probe=True)
        if probe
        else Workload(direction, "bf16", 128, 128, 16, 16, causal, batch=4, seqlen_q=4096, seqlen_kv=4096)
    )
    return Row(w)


def _synthetic_rows():
    r1 = _row()
    fl = r1.flops
    ms_at = lambda t: fl / (t * 1e12) * 1e3  # noqa: E731  ms for a target TFLOP/s
    r1.add(Measurement("cudnn", OK, ms=ms_at(600.0)))
    r1.add(Measurement("fa2", OK, ms=ms_at(350.0)))
    r1.add(Measurement("fa4", MISSING, reason="flash-attn-4 not installed"))
    r1.add(Measurement("frost:sm90", OK, ms=ms_at(660.0), rel_err=3.1e-3))
    r1.add(Measurement("frost:sm80", CHECK_FAILED, ms=ms_at(300.0), rel_err=0.5, reason="rel err 5.00e-01 > tol"))
    r1.reference = "cudnn"
    r2 = _row("bwd", causal=True)
    r2.add(Measurement("cudnn", FAILED, reason="run: RuntimeError: boom"))
    r2.add(Measurement("fa2", OK, ms=r2.flops / (250e12) * 1e3))
    r2.add(Measurement("fa4", NA, reason="not offered"))
    r2.add(Measurement("frost:sm90", OK, ms=r2.flops / (500e12) * 1e3, rel_err=float("inf")))
    p = _row(probe=True)
    p.add(Measurement("cudnn", OK, host_us=46.0))
    p.add(Measurement("fa2", OK, host_us=43.0))
    p.add(Measurement("frost:sm90", OK, host_us=21.5, issue_us=9.5))
    return [r1, r2, p]


def test_ratio_against_the_best_peer():
    r1, r2, p = _synthetic_rows()
    assert r1.best_peer().impl == "cudnn"
    assert r1.ratio("frost:sm90") == pytest.approx(1.1)
    assert r1.ratio("frost:sm80") == pytest.approx(0.5)  # timed, though its check failed
    assert r2.best_peer().impl == "fa2" and r2.ratio("frost:sm90") == pytest.approx(2.0)
    assert p.best_peer().impl == "fa2" and p.ratio("frost:sm90") == pytest.approx(0.5)
    empty = _row()
    empty.add(Measurement("frost:sm90", OK, ms=1.0))
    assert empty.best_peer() is None and empty.ratio("frost:sm90") is None
    assert impl_columns([r1, r2]) == ["cudnn", "fa2", "fa4", "frost:sm90", "frost:sm80"]


def test_table_cells_statuses_and_footnotes():
    rows = _synthetic_rows()
    notes = report.Footnotes()
    headers, body = report.throughput_table(rows, notes)
    assert headers[:6] == ["dir", "dtype", "D", "shape", "heads", "mask"]
    assert headers[6:11] == ["cuDNN", "FA2", "FA4", "frost:sm90", "frost:sm80"]
    assert headers[11:] == ["best", "sm90/best", "sm80/best", "sm90 err", "sm80 err"]
    fwd, bwd = body
    assert fwd[6:9] == ["600", "350", "miss[1]"]
    assert fwd[9] == "660" and fwd[10].startswith("300!")
    assert fwd[11:] == ["cuDNN", "1.10x", "0.50x", "3.1e-03", "5.0e-01"]
    assert bwd[6].startswith("FAIL[") and bwd[8].startswith("n/a[")
    assert bwd[11:14] == ["FA2", "2.00x", "-"] and bwd[14] == "inf"
    text = "\n".join(notes.lines())
    assert "flash-attn-4 not installed" in text and "RuntimeError: boom" in text and "check failed" in text
    ph, pb = report.probe_table(rows)
    assert ph[-1] == "sm90/best" and pb[0][-1] == "0.50x" and pb[0][-2] == "FA2"
    assert "21.5 (9.5)" in pb[0] and "46.0" in pb[0]  # wall (issue) where the issue time was measured


def test_rendered_report_text_and_markdown():
    rows = _synthetic_rows()
    text = report.render_report(rows)
    lines = text.splitlines()
    assert any(line.startswith("dir") and "sm90/best" in line for line in lines)
    assert "1.10x" in text and "[1] fa4 missing" in text and "Host time per call" in text
    md = report.render_report(rows, markdown=True)
    assert "| dir | dtype | D | shape | heads | mask |" in md and "|---|---|---|---|---|---|---:" in md
    assert "- [1] fa4 missing" in md


def _deterministic_pair():
    base = _row("bwd", causal=True)
    det = Row(Workload(**{**base.workload.__dict__, "deterministic": True}))
    base.add(Measurement("cudnn", OK, ms=1.0))
    base.add(Measurement("fa4", OK, ms=2.0))
    base.add(Measurement("frost:sm90", OK, ms=4.0))
    base.add(Measurement("frost:sm80", OK, ms=8.0))
    det.add(Measurement("cudnn", NA, reason="torch SDPA (CUDNN_ATTENTION) offers no per-call deterministic backward"))
    det.add(Measurement("fa4", OK, ms=3.0))
    det.add(Measurement("frost:sm90", OK, ms=4.6))
    det.add(Measurement("frost:sm80", FAILED, reason="run: boom"))
    return base, det


def test_deterministic_ratio_line():
    from frost.bench.results import deterministic_pairs, deterministic_ratios, report_dict

    base, det = _deterministic_pair()
    rows = _synthetic_rows() + [base, det]
    assert deterministic_pairs(rows) == [(base, det)]
    ratios = deterministic_ratios(base, det)
    assert set(ratios) == {"fa4", "frost:sm90"}  # only what was timed in both modes
    assert ratios["frost:sm90"] == pytest.approx(1.15) and ratios["fa4"] == pytest.approx(1.5)
    assert report.deterministic_lines(rows) == ["bwd bf16 d128 4x4096 h16 causal: frost:sm90 1.15x, FA4 1.50x"]
    md = report.render_report(rows, markdown=True)
    assert "- bwd bf16 d128 4x4096 h16 causal: frost:sm90 1.15x, FA4 1.50x" in md
    assert "| bwd det | bf16 |" in md and "no per-call deterministic backward" in md
    assert "Deterministic backward" not in report.render_report(_synthetic_rows())
    doc = report_dict(rows, {}, {})
    assert doc["deterministic_ratios"][0]["label"] == base.workload.label
    assert doc["deterministic_ratios"][0]["ratios"]["frost:sm90"] == pytest.approx(1.15)
    assert report.deterministic_lines([det]) == []  # no twin, no line


def test_peers_on_deterministic_rows():
    from frost.bench.impl import Unsupported
    from frost.bench.inputs import Inputs
    from frost.bench.peers import TorchSdpaPeer, _deterministic_kwargs

    w = Workload("bwd", "bf16", 64, 64, 2, 2, False, batch=1, seqlen_q=16, seqlen_kv=16, deterministic=True)
    with pytest.raises(Unsupported, match="deterministic"):
        TorchSdpaPeer("cudnn", "cuDNN", "CUDNN_ATTENTION")._forward_fn(Inputs(w, []))

    def with_option(q, k, v, softmax_scale=None, causal=False, deterministic=False):
        pass

    def without_option(q, k, v, softmax_scale=None, causal=False):
        pass

    assert _deterministic_kwargs(with_option) == {"deterministic": True}
    with pytest.raises(Unsupported, match="without_option has no deterministic option"):
        _deterministic_kwargs(without_option)


def test_json_writer_round_trip(tmp_path):
    rows = _synthetic_rows()
    env = {"gpu": "NVIDIA H200", "driver": "580.159", "frost_commit": "abc123"}
    path = report.write_json(str(tmp_path / "r.json"), rows, env, {"preset": "quick"})
    doc = json.loads(open(path).read())
    assert doc["schema"] == "frost-bench/1" and doc["env"]["gpu"] == "NVIDIA H200"
    assert len(doc["rows"]) == 2 and len(doc["probe"]) == 1
    first = doc["rows"][0]
    assert first["best_peer"] == "cudnn" and first["ratios"]["frost:sm90"] == pytest.approx(1.1)
    assert first["results"]["frost:sm90"]["tflops"] == pytest.approx(660.0)
    assert first["flops"] == rows[0].flops and first["reference"] == "cudnn"
    assert doc["rows"][1]["results"]["frost:sm90"]["rel_err"] == "inf"
    back = rows_from_dict(doc)
    assert [r.workload for r in back] == [r.workload for r in rows]
    assert math.isinf(back[1].measurements["frost:sm90"].rel_err)
    assert back[0].ratio("frost:sm90") == pytest.approx(1.1)


def test_markdown_file_names_the_environment(tmp_path):
    env = {
        "gpu": "NVIDIA H200",
        "driver": "580.159",
        "torch": "2.11.0",
        "cudnn": "9.19.0",
        "cutlass_dsl": "4.8.1",
        "flash_attn_4": "4.0.0b36",
        "frost_commit": "abc123",
    }
    path = report.write_markdown(str(tmp_path / "r.md"), _synthetic_rows(), env, {"timing": {"reps": 20}})
    md = open(path).read()
    for needle in (
        "NVIDIA H200",
        "580.159",
        "2.11.0",
        "9.19.0",
        "4.8.1",
        "4.0.0b36",
        "abc123",
        "reps=20",
        "| cuDNN | FA2 | FA4 |",
    ):
        assert needle in md


def test_png_writer(tmp_path):
    pytest.importorskip("matplotlib")
    from frost.bench.plot import write_png

    path = write_png(str(tmp_path / "c.png"), _synthetic_rows())
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_png_writer_without_matplotlib(tmp_path, monkeypatch):
    from frost.bench import plot

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert plot.matplotlib_missing() is not None
    assert plot.write_png(str(tmp_path / "c.png"), _synthetic_rows()) is None
    assert not (tmp_path / "c.png").exists()


# ---- method helpers -------------------------------------------------------------------
def test_buffer_rotation_and_inner_loop():
    assert buffer_count(set_bytes=256 << 20, l2_bytes=60 << 20, max_sets=8) == 1
    assert buffer_count(set_bytes=1 << 20, l2_bytes=60 << 20, max_sets=8) == 8
    assert buffer_count(set_bytes=40 << 20, l2_bytes=60 << 20, max_sets=8) == 3
    assert buffer_count(set_bytes=1 << 20, l2_bytes=0, max_sets=8) == 1
    assert choose_inner(0.01, 2.0, 100) == 100 and choose_inner(5.0, 2.0, 100) == 1 and choose_inner(0.5, 2.0, 100) == 4


def test_engine_names_and_filters():
    from frost.bench.frost_runner import engine_short
    from frost.bench.runner import engine_selected

    assert engine_short("SdpaFwdDslSm90") == "sm90" == engine_short("SdpaBwdDslSm90")
    assert engine_short("SdpaFwdReference") == "reference"
    assert engine_selected("SdpaFwdDslSm90", [], [])
    assert engine_selected("SdpaFwdDslSm90", ["sm9*"], []) and not engine_selected("SdpaFwdDslSm80", ["sm9*"], [])
    assert not engine_selected("SdpaFwdDslSm80", [], ["sm80"])


# ---- dry run -----------------------------------------------------------------------------
def test_dry_run_lists_without_a_gpu(capsys, monkeypatch):
    """On a GPU-less host the dry run lists the sweep without initializing CUDA, and lists no peer as available."""
    import torch

    def no_init(*a, **k):
        raise AssertionError("--dry-run initialized CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "init", no_init)
    assert cli.main(["--dry-run", "--preset", "quick"]) == 0
    out = capsys.readouterr().out
    assert "no CUDA device here: nothing here can be timed on a GPU" in out
    peers = [line for line in out.splitlines() if line.startswith("  ") and line.split()[0] in IMPL_KEYS]
    assert len(peers) == 4 and not any(": available" in line for line in peers), peers
    assert all("missing: " in line for line in peers if not line.split()[0] == "frost")
    assert "only the reference engine would serve" in out
    assert "16 workloads, 2 probe rows" in out
    for needle in (
        "cudnn",
        "fa2",
        "fa4",
        "frost",
        "4x4096",
        "1x16384",
        "thd fixed (8 seq, T=16454)",
        "1x128 (probe)",
        "4096,2048,1024,3000,517,5000,768,1",
        "would write: frost-bench.json",
    ):
        assert needle in out
    assert len([line for line in out.splitlines() if line.strip()[:3].strip().isdigit()]) == 18


IMPL_KEYS = ("cudnn", "fa2", "fa4", "frost")


def test_dry_run_on_a_gpu_host_lists_the_peers_it_can_import(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cli.main(["--dry-run", "--preset", "smoke", "--impl", "cudnn,fa2"]) == 0
    out = capsys.readouterr().out
    assert "no CUDA device here" not in out
    assert "cudnn  " in out and "fa2    " in out and out.count(": available") == 2


def test_dry_run_lists_deterministic_rows(capsys):
    assert (
        cli.main(["--dry-run", "--preset", "quick", "--layout", "bshd", "--seqlen", "4k", "--deterministic", "both"])
        == 0
    )
    out = capsys.readouterr().out
    assert "6 workloads, 2 probe rows" in out and "deterministic backward: 2 rows" in out
    dirs = [
        line.split()[1:3] for line in out.splitlines() if line.strip()[:3].strip().isdigit() and "(probe)" not in line
    ]
    assert dirs[:6] == [
        ["fwd", "bf16"],
        ["fwd", "bf16"],
        ["bwd", "bf16"],
        ["bwd", "det"],
        ["bwd", "bf16"],
        ["bwd", "det"],
    ]


def test_dry_run_results_dir_paths(capsys):
    assert cli.main(["--dry-run", "--preset", "smoke", "--results-dir", "benchmarks/results", "--name", "x"]) == 0
    out = capsys.readouterr().out
    assert "benchmarks/results/x.json" in out and "benchmarks/results/x.md" in out and "benchmarks/results/x.png" in out
    assert "frost-bench.json" not in out


# ---- frost through its graph API (CPU reference engine) ---------------------------------
@pytest.mark.parametrize(
    "w",
    [
        Workload("fwd", "bf16", 64, 64, 4, 2, True, batch=2, seqlen_q=33, seqlen_kv=33),
        Workload("fwd", "fp16", 192, 128, 2, 2, False, layout="thd", seqlens=(17, 1, 40), mix="t"),
        Workload("bwd", "bf16", 64, 64, 4, 2, True, batch=2, seqlen_q=33, seqlen_kv=33),
        Workload("bwd", "bf16", 64, 64, 2, 2, True, layout="thd", seqlens=(17, 1, 40), mix="t"),
    ],
    ids=lambda w: w.label,
)
def test_frost_runner_through_the_graph_api(w):
    from frost.bench import check, frost_runner
    from frost.bench.inputs import make_inputs
    from frost.bench.reference import reference_backward, reference_forward

    names = frost_runner.list_engines(w)
    assert names, "the CPU reference engine should accept every graph here"
    inputs = make_inputs(w, 2, "cpu")
    eng = frost_runner.FrostEngine(names[-1])
    prep = eng.prepare(inputs)
    assert len(prep.calls) == 2
    prep.poison(1)
    prep.calls[1]()
    outs = prep.outputs(1)
    b = inputs.sets[1]
    ref = (
        (reference_forward(w, b.q, b.k, b.v)[0],)
        if w.direction == "fwd"
        else reference_backward(w, b.q, b.k, b.v, b.do)
    )
    assert check.unwritten(outs) == 0
    assert check.compare(outs, ref) < 1e-2


@pytest.mark.parametrize("layout", ["bshd", "thd"])
def test_frost_runner_builds_a_deterministic_backward(layout):
    from frost.bench import check, frost_runner
    from frost.bench.inputs import make_inputs
    from frost.bench.reference import reference_backward

    dense = dict(batch=2, seqlen_q=33, seqlen_kv=33) if layout == "bshd" else dict(seqlens=(17, 1, 40), mix="t")
    w = Workload("bwd", "bf16", 64, 64, 4, 2, True, layout=layout, deterministic=True, **dense)
    geom = frost_runner._stats_geom(w)
    assert frost_runner._BwdGraph(w, geom).g.facts.deterministic
    assert not frost_runner._BwdGraph(Workload(**{**w.__dict__, "deterministic": False}), geom).g.facts.deterministic
    inputs = make_inputs(w, 1, "cpu")
    prep = frost_runner.FrostEngine(frost_runner.list_engines(w)[-1]).prepare(inputs)
    assert prep.info["deterministic"] is True
    prep.poison(0)
    prep.calls[0]()
    b = inputs.sets[0]
    assert check.compare(prep.outputs(0), reference_backward(w, b.q, b.k, b.v, b.do)) < 1e-2


def test_cpu_self_test_end_to_end(tmp_path, capsys):
    argv = cpu_run_argv(
        tmp_path,
        layout="bshd,thd",
        thd_mix="fixed",
        thd_lengths="20,1,11",
        causal="yes",
        direction=None,
        probe_calls="3",
    )
    assert cli.main(argv) == 0
    doc = json.loads((tmp_path / "cpu.json").read_text())
    assert (tmp_path / "cpu.md").exists()
    assert len(doc["rows"]) == 4 and len(doc["probe"]) == 2
    for probe in doc["probe"]:
        m = probe["results"]["frost:reference"]
        assert 0 < m["issue_us"] <= m["host_us"], m
    for row in doc["rows"]:
        m = row["results"]["frost:reference"]
        assert m["status"] == "ok", m
        assert m["rel_err"] < 1e-2 and m["tflops"] > 0
        assert row["reference"] == "fp32-math"
    assert "frost:reference" in capsys.readouterr().out


def test_cpu_self_test_deterministic_pair(tmp_path):
    argv = cpu_run_argv(tmp_path, "--no-probe", causal="yes", direction="bwd", deterministic="both", name="det")
    assert cli.main(argv) == 0
    doc = json.loads((tmp_path / "det.json").read_text())
    assert [r["label"] for r in doc["rows"]] == ["bwd bf16 d64 2x32 h2 causal", "bwd det bf16 d64 2x32 h2 causal"]
    assert [r["results"]["frost:reference"]["info"]["deterministic"] for r in doc["rows"]] == [False, True]
    assert doc["settings"]["sweep"]["deterministic"] == [False, True]
    (pair,) = doc["deterministic_ratios"]
    assert pair["ratios"]["frost:reference"] > 0
    assert "- bwd bf16 d64 2x32 h2 causal: frost:reference " in (tmp_path / "det.md").read_text()


def test_reference_needs_a_peer_that_agrees():
    import torch

    from frost.bench.check import choose_reference

    good = (torch.ones(4, 4),)
    close = (torch.ones(4, 4) * 1.001,)
    garbage = (torch.randn(4, 4) * 10,)
    order = ("cudnn", "fa4", "fa2")
    # the preferred peer returns finite garbage: the first pair that agrees decides
    key, outs, notes = choose_reference({"cudnn": garbage, "fa4": good, "fa2": close}, order, 2e-2)
    assert key == "fa4" and outs is good and "cudnn" in notes
    # a lone finite peer is the reference; a non-finite one never is
    nan = (torch.full((4, 4), float("nan")),)
    key, outs, notes = choose_reference({"cudnn": nan, "fa4": good}, order, 2e-2)
    assert key == "fa4" and "not finite" in notes["cudnn"]
    # peers that all disagree leave the choice to the caller (the float32 math)
    key, outs, _ = choose_reference({"cudnn": garbage, "fa4": good}, order, 2e-2)
    assert key is None and outs is None
    assert choose_reference({}, order, 2e-2)[0] is None


# ---- frost's cuDNN engine beside cuDNN through torch --------------------------------------
def _cudnn_rows():
    """A forward and a backward row and a probe where frost:cudnn and the cuDNN peer both ran."""
    rows = []
    for direction, frost_tf, cudnn_tf in (("fwd", 588.0, 600.0), ("bwd", 450.0, 440.0)):
        r = _row(direction)
        ms_at = lambda t, r=r: r.flops / (t * 1e12) * 1e3  # noqa: E731
        r.add(Measurement("cudnn", OK, ms=ms_at(cudnn_tf)))
        r.add(Measurement("fa2", OK, ms=ms_at(350.0)))
        r.add(Measurement("frost:sm90", OK, ms=ms_at(660.0), rel_err=3e-3))
        r.add(Measurement("frost:cudnn", OK, ms=ms_at(frost_tf), rel_err=1e-4))
        rows.append(r)
    p = _row(probe=True)
    p.add(Measurement("cudnn", OK, host_us=40.0, issue_us=30.0))
    p.add(Measurement("frost:cudnn", OK, host_us=20.0, issue_us=15.0))
    return rows + [p]


def test_cudnn_engine_column_compares_with_cudnn_through_torch():
    fwd, bwd, probe = _cudnn_rows()
    assert fwd.ratio_to("frost:cudnn", "cudnn") == pytest.approx(0.98)
    assert bwd.ratio_to("frost:cudnn", "cudnn") == pytest.approx(450 / 440)
    assert probe.ratio_to("frost:cudnn", "cudnn") == pytest.approx(0.5)
    assert fwd.ratio_to("frost:cudnn", "fa4") is None  # a peer that did not run
    failed = _row()
    failed.add(Measurement("cudnn", FAILED, reason="boom"))
    failed.add(Measurement("frost:cudnn", OK, ms=1.0))
    assert failed.ratio_to("frost:cudnn", "cudnn") is None
    headers, body = report.throughput_table([fwd, bwd])
    assert headers[6:11] == ["cuDNN", "FA2", "frost:sm90", "frost:cudnn", "best"]
    i = headers.index("cudnn/cuDNN")
    assert headers[i - 2 : i + 3] == ["sm90/best", "cudnn/best", "cudnn/cuDNN", "sm90 err", "cudnn err"]
    assert [line[i] for line in body] == ["0.98x", "1.02x"]
    ph, pb = report.probe_table([probe])
    assert ph[-1] == "cudnn/cuDNN" and pb[0][-1] == "0.50x"
    # without frost's cuDNN engine there is no such column
    assert "cudnn/cuDNN" not in report.throughput_table(_synthetic_rows())[0]


def test_cudnn_engine_summary_in_the_report_and_the_json(tmp_path):
    rows = _cudnn_rows()
    lines = report.cudnn_engine_lines(rows)
    assert lines[0] == "fwd: 0.98x over 1 rows; 1 of 1 within 3% of cuDNN or faster"
    assert lines[1].startswith("bwd: 1.02x over 1 rows; 1 of 1 within 3%")
    assert lines[2] == "fwd host time per call: frost:cudnn 20.0 us, cuDNN (torch) 40.0 us: 0.50x"
    slow = _row()
    slow.add(Measurement("cudnn", OK, ms=slow.flops / 600e12 * 1e3))
    slow.add(Measurement("frost:cudnn", OK, ms=slow.flops / 570e12 * 1e3))
    assert (
        report.cudnn_engine_lines([rows[0], slow])[0]
        == "fwd: 0.95x - 0.98x (median 0.96x) over 2 rows; 1 of 2 within 3% of cuDNN or faster"
    )
    text = report.render_report(rows)
    assert "the same library behind two front ends" in text and "1 of 1 within 3%" in text
    md = report.render_report(rows, markdown=True)
    assert "| cudnn/cuDNN |" in md and "- fwd: 0.98x over 1 rows" in md
    path = report.write_json(str(tmp_path / "r.json"), rows, {"gpu": "test"}, {})
    doc = json.loads(open(path).read())
    assert doc["rows"][0]["vs_cudnn"]["frost:cudnn"] == pytest.approx(0.98)
    assert doc["rows"][0]["vs_cudnn"]["frost:sm90"] == pytest.approx(1.1)
    summary = {(e["direction"], e["probe"]): e for e in doc["cudnn_engine_vs_cudnn"]}
    assert summary[("fwd", False)]["within"] == 1 and summary[("fwd", True)]["frost_us"] == 20.0
    assert [r.ratio_to("frost:cudnn", "cudnn") for r in rows_from_dict(doc)] == pytest.approx([0.98, 450 / 440, 0.5])


def test_cudnn_engine_names_and_filters():
    from frost.bench.frost_runner import FrostEngine, engine_short
    from frost.bench.runner import engine_selected

    assert engine_short("SdpaFwdCudnn") == "cudnn" == engine_short("SdpaBwdCudnn")
    assert FrostEngine("SdpaBwdCudnn").key == "frost:cudnn"
    assert engine_selected("SdpaFwdCudnn", ["cudnn"], []) and engine_selected("SdpaBwdCudnn", ["cudnn", "sm90"], [])
    assert not engine_selected("SdpaFwdDslSm90", ["cudnn"], []) and not engine_selected("SdpaFwdCudnn", [], ["cud*"])


def test_cudnn_preset_dry_run(capsys):
    assert cli.main(["--dry-run", "--preset", "cudnn", "--impl", "cudnn,frost", "--frost-engines", "cudnn"]) == 0
    out = capsys.readouterr().out
    assert "16 workloads, 2 probe rows, preset cudnn" in out
    assert "frost:cudnn  frost's cuDNN engine" in out and "missing: nvidia-cudnn-frontend is not installed" in out
    assert "fa2" not in out.split("#")[0]  # only the implementations asked for
    assert cli.main(["--dry-run", "--preset", "cudnn", "--exclude-engines", "cudnn"]) == 0
    assert "frost:cudnn" not in capsys.readouterr().out


def test_a_declining_engine_is_na_not_a_failure():
    """Asked to build where it cannot (here: no GPU, no binding), the cuDNN engine's row is n/a."""
    from frost.bench.frost_runner import FrostEngine
    from frost.bench.impl import Unsupported
    from frost.bench.inputs import make_inputs

    w = Workload("fwd", "bf16", 64, 64, 2, 2, True, batch=1, seqlen_q=32, seqlen_kv=32)
    with pytest.raises(Unsupported, match="SdpaFwdCudnn"):
        FrostEngine("SdpaFwdCudnn").prepare(make_inputs(w, 1, "cpu"))


def test_runner_times_frost_cudnn_beside_the_cudnn_peer(monkeypatch, tmp_path):
    """The wiring on the CPU: frost:cudnn rows (a stand-in that runs the reference engine) next to a cuDNN peer
    (the same stand-in), the cudnn/cuDNN column and the summary in the written report."""
    from frost.bench import frost_runner
    from frost.bench.impl import Implementation
    from frost.bench.runner import Progress, Runner, RunOptions
    from frost.bench.timing import TimingOptions

    real_prepare = frost_runner.FrostEngine.prepare

    def prepare(self, inputs):
        if "Cudnn" not in self.engine:
            return real_prepare(self, inputs)
        prep = real_prepare(frost_runner.FrostEngine(self.engine.replace("Cudnn", "Reference")), inputs)
        prep.info["engine_name"] = self.engine
        return prep

    monkeypatch.setattr(frost_runner.FrostEngine, "prepare", prepare)
    monkeypatch.setattr(
        frost_runner,
        "list_engines",
        lambda w: (
            ["SdpaFwdReference", "SdpaFwdCudnn"] if w.direction == "fwd" else ["SdpaBwdReference", "SdpaBwdCudnn"]
        ),
    )

    class CudnnPeer(Implementation):
        key, label = "cudnn", "cuDNN (stand-in)"

        def prepare(self, inputs):
            name = "SdpaFwdReference" if inputs.workload.direction == "fwd" else "SdpaBwdReference"
            return real_prepare(frost_runner.FrostEngine(name), inputs)

    dense = dict(batch=2, seqlen_q=32, seqlen_kv=32)
    workloads = [
        Workload("fwd", "bf16", 64, 64, 1, 1, False, batch=1, seqlen_q=128, seqlen_kv=128, probe=True),
        Workload("fwd", "bf16", 64, 64, 2, 2, True, **dense),
        Workload("bwd", "bf16", 64, 64, 2, 2, True, **dense),
    ]
    opts = RunOptions(
        impls=["cudnn", "frost"], timing=TimingOptions(warmup=1, reps=2, mode="loop"), probe_calls=3, device="cpu"
    )
    rows = Runner(opts, [CudnnPeer()], Progress(0, enabled=False)).run(workloads)
    for r in rows:
        assert r.measurements["frost:cudnn"].status == OK, r.measurements["frost:cudnn"]
        assert r.ratio_to("frost:cudnn", "cudnn") > 0
    assert rows[1].reference == "cudnn" and rows[1].measurements["frost:cudnn"].rel_err < 1e-6
    text = report.render_report(rows)
    assert "cudnn/cuDNN" in text and "fwd host time per call: frost:cudnn" in text
    assert any(line.startswith("bwd: ") and "within 3%" in line for line in text.splitlines())


@pytest.mark.parametrize("peer_wrong", [True, False])
def test_a_lone_peer_that_frost_disagrees_with_meets_the_float32_math(peer_wrong):
    """With one peer, frost failing its check asks the float32 math: a wrong peer is noted and frost is checked
    against the math instead; a right peer leaves frost's failure standing."""
    import torch

    from frost.bench import frost_runner
    from frost.bench.impl import Implementation
    from frost.bench.runner import Progress, Runner, RunOptions
    from frost.bench.timing import TimingOptions

    real_prepare = frost_runner.FrostEngine.prepare

    def skewed(prep):
        outputs = prep.outputs

        def wrong(i):
            return tuple(t * 1.5 for t in outputs(i))

        prep.outputs = wrong
        return prep

    class Peer(Implementation):
        key, label = "fa4", "FA4 (stand-in)"

        def prepare(self, inputs):
            prep = real_prepare(frost_runner.FrostEngine("SdpaFwdReference"), inputs)
            return skewed(prep) if peer_wrong else prep

    def frost_prepare(self, inputs):
        prep = real_prepare(self, inputs)
        return prep if peer_wrong else skewed(prep)

    import unittest.mock as mock

    with (
        mock.patch.object(frost_runner, "list_engines", lambda w: ["SdpaFwdReference"]),
        mock.patch.object(frost_runner.FrostEngine, "prepare", frost_prepare),
    ):
        w = Workload("fwd", "bf16", 64, 64, 2, 2, False, batch=1, seqlen_q=32, seqlen_kv=32)
        opts = RunOptions(impls=["fa4", "frost"], timing=TimingOptions(warmup=1, reps=2, mode="loop"), device="cpu")
        [row] = Runner(opts, [Peer()], Progress(0, enabled=False)).run([w])
    fm, pm = row.measurements["frost:reference"], row.measurements["fa4"]
    assert torch.isfinite(torch.tensor(fm.rel_err))
    if peer_wrong:
        assert fm.status == OK and fm.rel_err < 1e-2, fm
        assert "checked against fp32-math: fa4, the only peer, disagrees" in fm.note
        assert "disagrees with the fp32 math" in pm.note and row.reference == "fp32-math (fa4 disputed)"
    else:
        assert fm.status == CHECK_FAILED and "vs fa4" in fm.reason, fm
        assert "disagrees" not in (pm.note or "") and row.reference == "fa4"
