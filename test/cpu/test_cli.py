"""The `frost` command answers a newcomer's first questions on a CPU-only machine: --version, info, precompile
without the kernels extra, compile progress, messages through the `frost` logger, and what a target is."""

from __future__ import annotations

import json
import logging
import types

import pytest
import torch

import frost
from frost import cli
from frost.version import __version__

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a CPU-only machine reports")


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"frost {__version__}"


def test_unknown_command_is_logged_not_printed(capsys):
    assert cli.main(["nope"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and "unknown command 'nope'" in cap.err


@NO_GPU
def test_info_on_a_cpu_machine(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    assert cli.main(["info", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["frost"] == __version__ and d["torch"] == torch.__version__ and d["gpu"] is None
    assert d["cache"]["dir"] == str(tmp_path) and d["cache"]["bytes"] == 0
    for direction in ("fwd", "bwd"):
        e = d["engines"][direction]
        assert e["serve"] == [f"Sdpa{direction.capitalize()}Reference"]
        assert e["decline"] and all("needs a CUDA GPU" in why for why in e["decline"].values())
    assert cli.main(["info"]) == 0
    text = capsys.readouterr().out
    assert "GPU none" in text and "SdpaFwdDslSm90: needs a CUDA GPU" in text and str(tmp_path) in text


def test_info_for_a_fake_target_names_each_decline(capsys):
    assert cli.main(["info", "--json", "--target", "H200"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["gpu"]["compute_capability"] == "9.0"
    fwd = d["engines"]["fwd"]
    if frost.engines.dsl.dsl_decline_reason() is None:
        assert fwd["serve"][0] == "SdpaFwdDslSm90"
    assert "compute capability 10.0-10.9" in fwd["decline"]["SdpaFwdDslSm100"]
    assert "never chosen silently on a GPU" in fwd["decline"]["SdpaFwdReference"]


def test_info_rejects_an_unknown_target(capsys):
    with pytest.raises(SystemExit):
        cli.main(["info", "--target", "H100"])
    assert "unknown fake target 'H100'" in capsys.readouterr().err


@pytest.fixture
def no_dsl(monkeypatch):
    """This machine as one without the kernels extra: nvidia-cutlass-dsl is not installed."""
    from frost.engines import dsl

    real = dsl.metadata.version

    def version(name):
        if name == "nvidia-cutlass-dsl":
            raise dsl.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(dsl.metadata, "version", version)
    dsl.dsl_decline_reason.cache_clear()
    yield
    dsl.dsl_decline_reason.cache_clear()


def test_precompile_without_the_kernels_extra_names_it(no_dsl, capsys):
    assert cli.main(["precompile", "--probe", "--target", "H200"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'frost[kernels]'" in err and "nvidia-cutlass-dsl" in err
    assert "ModuleNotFoundError" not in err and "Traceback" not in err
    from frost.engines.common.probe_copy_params import ProbeCopyParams
    from frost.plans.precompile import PROBE

    with pytest.raises(ImportError, match=r"frost\[kernels\]"):
        frost.precompile([(PROBE, ProbeCopyParams(dtype="f32"))], frost.target.fake_target("H200"))


def test_precompile_shows_a_bar_that_advances_per_kernel(monkeypatch, capsys):
    pytest.importorskip("tqdm", reason="the progress bar is tqdm's (the kernels extra)")
    from frost.plans import precompile as pre

    def fake_compile_many(specs, target, max_workers=None, progress=None):
        out = []
        for s in specs:
            name = f"frost_probe_copy_{s.params.dtype}"
            if progress is not None:
                progress(name)
            out.append(
                types.SimpleNamespace(
                    name=name, arch="sm_90a", source="compile", compile_seconds=0.0, load_seconds=0.0, digest="x"
                )
            )
        return out

    monkeypatch.setattr(pre, "compile_many", fake_compile_many)
    monkeypatch.setattr(pre, "missing_kernels_extra", lambda: None)
    assert cli.main(["precompile", "--probe", "--target", "H200"]) == 0
    err = capsys.readouterr().err
    assert "frost precompile" in err and "3/3" in err and "frost_probe_copy_f32" in err
    assert cli.main(["precompile", "--probe", "--target", "H200", "--no-progress"]) == 0
    assert "3/3" not in capsys.readouterr().err


def test_compile_many_reports_each_distinct_kernel_once_as_it_finishes(monkeypatch):
    """Workers report in the order they finish; the kernels loaded after them are not reported again."""
    from frost.compiler import workers
    from frost.engines.common.probe_copy_params import ProbeCopyParams
    from frost.plans.precompile import PROBE

    class Disk:
        def lookup(self, key):
            return (None,)

    def fake_pool(specs, target, n, on_done=None):
        for i in reversed(range(len(specs))):
            on_done(i, f"frost_probe_copy_{specs[i].params.dtype}")

    monkeypatch.setattr(workers.cache, "disk", lambda: Disk())
    monkeypatch.setattr(workers, "memo_has", lambda *a: False)
    monkeypatch.setattr(workers, "run_in_workers", fake_pool)
    monkeypatch.setattr(
        workers, "compile_kernel", lambda template, params, target: types.SimpleNamespace(name=f"k_{params.dtype}")
    )
    specs = [(PROBE, ProbeCopyParams(dtype=d)) for d in ("f16", "bf16", "f16", "f32")]
    seen = []
    got = workers.compile_many(specs, frost.target.fake_target("H200"), max_workers=2, progress=seen.append)
    assert [k.name for k in got] == ["k_f16", "k_bf16", "k_f16", "k_f32"]
    assert seen == ["frost_probe_copy_f32", "frost_probe_copy_bf16", "frost_probe_copy_f16"]


def test_cache_messages_go_through_the_frost_logger(caplog):
    from frost.compiler import cache

    with caplog.at_level(logging.WARNING, logger="frost"):
        cache.warn("an entry was corrupt")
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("frost.compiler.cache", "frost cache: an entry was corrupt")
    ]


def test_no_module_prints_to_stderr():
    """Messages go through logging: no `print(..., file=sys.stderr)` left in frost/."""
    from pathlib import Path

    root = Path(frost.__file__).parent
    hits = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if "file=sys.stderr)" in p.read_text()
        and "print(" in p.read_text().split("file=sys.stderr)")[0].rsplit("\n", 3)[-1]
    ]
    assert hits == []


def test_graph_target_takes_a_fake_targets_name_or_says_what_a_target_is():
    g = frost.Graph(io_data_type=torch.bfloat16, target="H200")
    assert g.target == frost.target.fake_target("H200")
    assert frost.Graph(io_data_type=torch.bfloat16, target="rtx5090").target.cc == (12, 0)
    for bad in ("H100", 90, object()):
        with pytest.raises(frost.GraphError, match="a target is the device record frost plans for") as e:
            frost.Graph(io_data_type=torch.bfloat16, target=bad)
        assert "A100, B200, H200, RTX5090" in str(e.value)
