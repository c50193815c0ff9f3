"""`frost bench` paged rows on the CPU: the preset's decode and prefill rows, the dry run listing them without a
GPU, and the frost runner declaring cuDNN's paged cache through the graph API (the reference engine serves it)
against the harness's own gather-then-attend math."""

from __future__ import annotations

import json

import pytest

from frost.bench import cli
from frost.bench.workloads import Workload


def _spec(argv):
    return cli.spec_from_args(cli.build_parser().parse_args(argv))


def test_the_paged_preset_has_decode_and_prefill_rows_per_block_size():
    spec = _spec(["--preset", "paged"])
    rows = spec.expand()
    paged = [w for w in rows if w.is_paged]
    assert {w.block_size for w in paged} == {16, 64, 128, 256}
    decode = [w for w in paged if w.seqlen_q == 1]
    prefill = [w for w in paged if w.seqlen_q > 1]
    assert len(decode) == len(prefill) == 4
    # each shape's contiguous twin once, before its paged rows: the dense decode and the dense causal prefill
    twins = [w for w in rows if not w.is_paged]
    assert twins == [decode[0].contiguous_twin(), prefill[0].contiguous_twin()]
    assert rows.index(twins[0]) < rows.index(decode[0]) and twins[0].is_decode and not twins[1].is_decode
    w = decode[0]
    assert (w.batch, w.seqlen_kv, w.heads_q, w.heads_kv, w.causal) == (64, 8192, 32, 8, False)
    assert w.kv_bytes() == 64 * 8192 * 8 * 256 * 2 and w.blocks_per_seq == 8192 // w.block_size
    assert all(p.causal and p.seqlen_q == p.seqlen_kv for p in prefill)
    assert "paged16 decode 64x1x8192" in w.label


def test_paged_backward_rows_are_left_out_with_the_reason():
    spec = _spec(["--preset", "quick", "--layout", "paged", "--seqlen", "1k"])
    rows = spec.expand()
    assert rows and all(w.direction == "fwd" for w in rows)
    assert any("forward only" in s for s in spec.skipped)


def test_dry_run_lists_paged_rows_without_a_gpu(capsys, monkeypatch):
    import torch

    def no_init(*a, **k):
        raise AssertionError("--dry-run initialized CUDA")

    # asking whether a GPU exists is allowed (the dry run says which peers could run); starting CUDA is not
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "init", no_init)
    assert cli.main(["--dry-run", "--preset", "paged"]) == 0
    out = capsys.readouterr().out
    assert "10 workloads" in out and "paged K/V: 8 rows" in out
    for needle in ("paged16 decode 64x1x8192", "paged256 prefill 2x8192x8192", "FA4 with page_table"):
        assert needle in out


@pytest.mark.parametrize(
    "w",
    [
        Workload("fwd", "bf16", 64, 64, 4, 2, False, layout="paged", batch=3, seqlen_q=1, seqlen_kv=70, block_size=16),
        Workload("fwd", "fp16", 64, 64, 4, 1, True, layout="paged", batch=2, seqlen_q=40, seqlen_kv=40, block_size=32),
    ],
    ids=lambda w: w.label,
)
def test_frost_runner_declares_the_paged_cache(w):
    from frost.bench import check, frost_runner
    from frost.bench.inputs import make_inputs
    from frost.bench.reference import reference_forward

    names = frost_runner.list_engines(w)
    assert names[-1] == "SdpaFwdReference"
    inputs = make_inputs(w, 2, "cpu")
    b = inputs.sets[1]
    assert tuple(b.k.shape) == (w.num_blocks, w.block_size, w.heads_kv, w.d_qk)
    prep = frost_runner.FrostEngine(names[-1]).prepare(inputs)
    prep.poison(1)
    prep.calls[1]()
    outs = prep.outputs(1)
    ref = reference_forward(w, b.q, b.k, b.v, table=b.table)[0]
    assert check.unwritten(outs) == 0 and check.compare(outs, (ref,)) < 1e-2
    # the table matters: the same caches read through another table give other outputs
    other = reference_forward(w, b.q, b.k, b.v, table=b.table.flip(0).contiguous())[0]
    assert check.compare(outs, (other,)) > 1e-1


def test_cpu_paged_rows_end_to_end(tmp_path):
    argv = [
        "--device",
        "cpu",
        "--preset",
        "paged",
        "--tokens",
        "96",
        "--heads",
        "4",
        "--gqa",
        "2",
        "--seqlen",
        "48",
        "--head-dim",
        "64",
        "--reps",
        "2",
        "--warmup",
        "1",
        "--impl",
        "frost",
        "-q",
        "--results-dir",
        str(tmp_path),
        "--name",
        "paged",
        "--json",
        "",
        "--png",
        "",
    ]
    assert cli.main(argv) == 0
    doc = json.loads((tmp_path / "paged.json").read_text())
    assert len(doc["rows"]) == 10  # 8 paged rows and the 2 contiguous twins
    for row in doc["rows"]:
        m = row["results"]["frost:reference"]
        assert m["status"] == "ok", m
        assert m["rel_err"] < 1e-2
        assert ("kv_tb_s" in m["info"]) == ("paged" in row["label"] or "x1x" in row["label"])
    pairs = doc["paged_vs_contiguous"]
    assert len(pairs) == 8 and all(p["ratios"]["frost:reference"]["ratio"] > 0 for p in pairs)
    assert "Paged against contiguous" in (tmp_path / "paged.md").read_text()


def test_paged_against_contiguous_compares_interleaved_samples():
    from frost.bench.report import paged_lines
    from frost.bench.results import Measurement, Row, paged_vs_contiguous

    w = Workload("fwd", "bf16", 64, 64, 4, 2, False, layout="paged", batch=3, seqlen_q=1, seqlen_kv=70, block_size=16)

    def row(workload, samples):
        r = Row(workload)
        r.add(Measurement("frost:sm90", "ok", ms=sorted(samples)[len(samples) // 2], info={"samples_ms": samples}))
        r.add(Measurement("cudnn", "ok", ms=1.0))  # peers are left out: the comparison is frost's own
        return r

    paged, twin = row(w, [1.10, 1.11, 1.12]), row(w.contiguous_twin(), [1.00, 1.01, 1.02])
    v = paged_vs_contiguous(paged, twin)
    assert list(v) == ["frost:sm90"] and v["frost:sm90"]["verdict"] == "loss"
    assert abs(v["frost:sm90"]["ratio"] - 1.01 / 1.11) < 1e-9
    assert v["frost:sm90"]["ratio_lo"] < v["frost:sm90"]["ratio"] < v["frost:sm90"]["ratio_hi"]
    (line,) = paged_lines([twin, paged])
    assert line.startswith(w.label) and "sm90 0.910x" in line and "loss" in line
