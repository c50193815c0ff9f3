"""Saved plans: a plan written by one process builds in a fresh one without compiling.

The compiling tests save an SM80 forward THD plan and an SM80 backward plan for a
fake H200 (kernels compile for sm_90a here) and load them in fresh interpreters
with an empty cache directory. Every process runs a frozen copy of the package, so
all of them see one fingerprint even if the working tree changes meanwhile. The
quick tests use the reference engine (no kernels) and hand-made damaged files.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import frost
from frost.target import CPU, fake_target
from frost.errors import GraphError, PlanFileError
from test import plan_graphs
from test.compile_runner import run_py as run_fresh

ROOT = Path(__file__).resolve().parents[2]
PROBE = "frost.engines.common.probe_copy"
PROBE_PARAMS = "frost.engines.common.probe_copy_params:ProbeCopyParams"

GRAPHS = inspect.getsource(plan_graphs)

SAVE = (
    GRAPHS
    + """
import json, sys
out = {}
for kind, path in zip(("fwd", "bwd"), sys.argv[1:3]):
    g = BUILD[kind](fake_target("H200"))
    g.validate().build_plans(engine="sm80")
    g.save_plan(path)
    out[kind] = {"engine": g.engine_name, "names": g.plan.adapter.kernel_names(),
                 "workspace": g.get_workspace_size()}
out["stats"] = frost.cache.stats()
print(json.dumps(out))
"""
)

LOAD = (
    GRAPHS
    + """
import json, sys, warnings
kind, path, target = sys.argv[1:4]
g = BUILD[kind](fake_target(target))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    frost.load_plan(path, g)
if len(sys.argv) > 4:  # save the loaded plan again
    g.save_plan(sys.argv[4])
print(json.dumps({"engine": g.engine_name, "names": g.plan.adapter.kernel_names(), "stats": frost.cache.stats(),
                  "workspace": g.get_workspace_size(), "cutlass": "cutlass" in sys.modules,
                  "archs": sorted({k.arch for k in g.plan.adapter.compiled_kernels()}),
                  "warnings": [str(w.message) for w in caught if issubclass(w.category, UserWarning)],
                  "categories": [w.category.__name__ for w in caught if issubclass(w.category, UserWarning)]}))
"""
)


def run_py(script: str, args, cache_dir: Path, root: Path, extra_env=None) -> dict:
    """compile_runner.run_py with no visible GPU and room for compiles."""
    return run_fresh(
        script,
        cache_dir,
        args=args,
        root=root,
        timeout=900,
        extra_env={"CUDA_VISIBLE_DEVICES": "", **(extra_env or {})},
    )


def rewrite(src: Path, dst: Path, header_update=None, members=None, drop=()) -> Path:
    """Copy a plan file, changing header fields (a function of the header dict) and member bytes."""
    with zipfile.ZipFile(src) as z:
        files = {n: z.read(n) for n in z.namelist()}
    header = json.loads(files.pop("plan.json"))
    if header_update is not None:
        header_update(header)
    files.update(members or {})
    with zipfile.ZipFile(dst, "w") as z:
        z.writestr("plan.json", json.dumps(header))
        for n, data in files.items():
            if n not in drop:
                z.writestr(n, data)
    return dst


# -- compiling: save in one process, load in fresh ones ----------------------------------------------------
@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Both plans saved by one process from a frozen copy of the package (compiles fwd + the bwd chain)."""
    base = tmp_path_factory.mktemp("plans")
    tree = base / "tree"
    shutil.copytree(ROOT / "frost", tree / "frost", ignore=shutil.ignore_patterns("__pycache__"))
    files = {"fwd": base / "fwd.plan", "bwd": base / "bwd.plan"}
    out = run_py(SAVE, [files["fwd"], files["bwd"]], base / "cache", tree)
    return {"tree": tree, "files": files, "out": out, "base": base}


@pytest.mark.slow
@pytest.mark.parametrize("kind,n_kernels", [("fwd", 1), ("bwd", 3)])
def test_fresh_process_with_an_empty_cache_loads_without_compiling(saved, tmp_path, kind, n_kernels):
    want = saved["out"][kind]
    assert want["engine"] == ("SdpaFwdDslSm80" if kind == "fwd" else "SdpaBwdDslSm80")
    assert len(want["names"]) == n_kernels and all(n.startswith("frost_sdpa_") for n in want["names"])
    empty = tmp_path / "empty-cache"
    got = run_py(LOAD, [kind, saved["files"][kind], "H200"], empty, saved["tree"])
    assert got["stats"]["compiles"] == 0 and got["stats"]["worker_compiles"] == 0, got["stats"]
    assert got["stats"]["hits"] == n_kernels and got["stats"]["misses"] == 0, got["stats"]
    assert got["names"] == want["names"] and got["engine"] == want["engine"]
    assert got["workspace"] == want["workspace"]
    assert got["warnings"] == []
    assert got["archs"] == ["sm_90a"]
    if shutil.which("cc") or shutil.which("gcc"):  # the linked libraries came along: no cutlass needed
        assert not got["cutlass"], "loading a saved plan imported cutlass"
    # the artifacts were published into the (formerly empty) cache: a later plain build hits it too
    assert len(list(empty.rglob("*.o"))) == n_kernels


@pytest.mark.slow
def test_with_the_disk_layer_off_the_kernels_load_into_memory_and_save_again(saved, tmp_path):
    again = tmp_path / "again.plan"
    got = run_py(
        LOAD,
        ["bwd", saved["files"]["bwd"], "H200", again],
        tmp_path / "unused",
        saved["tree"],
        {"FROST_CACHE_DISABLE": "1"},
    )
    assert got["stats"]["compiles"] == 0 and got["names"] == saved["out"]["bwd"]["names"], got
    assert got["warnings"] == [] and not (tmp_path / "unused").exists()

    def members(path):
        with zipfile.ZipFile(path) as z:
            return [(k["name"], k["sha256"]) for k in json.loads(z.read("plan.json"))["kernels"]]

    assert members(again) == members(saved["files"]["bwd"])


@pytest.mark.slow
def test_a_file_from_another_frost_build_loads_and_compiles_with_a_warning(saved, tmp_path):
    def other_build(h):
        h["fingerprint"] = "0" * 64
        h["fingerprint_inputs"]["sources"] = "elsewhere"

    other = rewrite(saved["files"]["fwd"], tmp_path / "other.plan", other_build)
    got = run_py(LOAD, ["fwd", other, "H200"], tmp_path / "cache", saved["tree"])
    assert got["stats"]["compiles"] == 1 and got["names"] == saved["out"]["fwd"]["names"]
    assert any("another frost build" in w and "sources" in w for w in got["warnings"]), got["warnings"]
    assert got["categories"] == ["PlanFileWarning"] * len(got["warnings"])


@pytest.mark.slow
def test_a_file_saved_for_another_arch_loads_and_compiles_for_this_one(saved, tmp_path):
    got = run_py(LOAD, ["fwd", saved["files"]["fwd"], "A100"], tmp_path / "cache", saved["tree"])
    assert got["stats"]["compiles"] == 1 and got["archs"] == ["sm_80"]
    assert got["engine"] == "SdpaFwdDslSm80"
    assert any("sm_90a" in w and "sm_80" in w for w in got["warnings"]), got["warnings"]


@pytest.mark.slow
def test_an_artifact_that_cannot_be_loaded_is_compiled_with_a_warning(saved, tmp_path):
    """Self-consistent but unloadable bytes (digests recomputed, no linked library) pass the file's checks;
    the cache's loader rejects them and the kernel compiles instead."""
    import hashlib

    junk = b"\x7fELF this is not an object file" * 64

    def point_at_junk(h):
        rec = h["kernels"][0]
        rec.update(size=len(junk), sha256=hashlib.sha256(junk).hexdigest(), so_member=None, so_sha256=None)

    bad = rewrite(
        saved["files"]["fwd"], tmp_path / "junk.plan", point_at_junk, {"kernels/0.o": junk}, drop=("kernels/0.so",)
    )
    got = run_py(LOAD, ["fwd", bad, "H200"], tmp_path / "cache", saved["tree"])
    assert got["stats"]["compiles"] == 1 and got["stats"]["corrupt"] == 1
    assert got["names"] == saved["out"]["fwd"]["names"]
    assert any("could not be loaded and were compiled" in w for w in got["warnings"]), got["warnings"]


@pytest.mark.slow
def test_a_changed_member_is_a_plan_file_error(saved, tmp_path):
    with zipfile.ZipFile(saved["files"]["bwd"]) as z:
        obj = bytearray(z.read("kernels/1.o"))
    obj[len(obj) // 2] ^= 0xFF
    bad = rewrite(saved["files"]["bwd"], tmp_path / "flipped.plan", members={"kernels/1.o": bytes(obj)})
    g = _exec(GRAPHS)["bwd_dense"](fake_target("H200"))
    with pytest.raises(PlanFileError, match="kernels/1.o"):
        g.load_plan(bad)


def _exec(src: str) -> dict:
    ns: dict = {}
    exec(compile(src, "<graphs>", "exec"), ns)
    return ns


# -- quick: the reference engine (no kernels), mismatches and damaged files ----------------------------------
def _ref_graph(d=16, causal=True, name="q", graph="g", node="sdpa", kv=("k", "v")):
    g = frost.Graph(io_data_type=torch.float32, target=CPU, name=graph)
    q = g.tensor(name=name, dim=(2, 4, 32, d))
    k = g.tensor(name=kv[0], dim=(2, 2, 32, d))
    v = g.tensor(name=kv[1], dim=(2, 2, 32, d))
    o, st = g.sdpa(q, k, v, attn_scale=0.25, generate_stats=True, use_causal_mask=causal, name=node)
    o.set_output(True)
    st.set_output(True)
    return g


@pytest.fixture
def ref_plan(tmp_path) -> Path:
    g = _ref_graph()
    g.validate().build_plans()
    assert g.engine_name == "SdpaFwdReference"
    return Path(g.save_plan(tmp_path / "ref.plan"))


def test_reference_plan_round_trip(ref_plan):
    g = _ref_graph()
    assert frost.load_plan(ref_plan, g) is g
    assert g.engine_name == "SdpaFwdReference" and g.get_workspace_size() == 0


def test_renamed_tensors_graph_and_node_load_the_same_plan(ref_plan):
    """Names only label errors: a plan saved for one spelling loads for another and runs the same."""
    g = _ref_graph(name="query", graph="renamed", node="attn", kv=("key", "value"))
    assert frost.load_plan(ref_plan, g) is g and g.engine_name == "SdpaFwdReference"
    with pytest.raises(PlanFileError, match=r"tensor 'query' \(q\) dim: saved \[2, 4, 32, 16\], here \[2, 4, 32, 32\]"):
        _ref_graph(d=32, name="query").load_plan(ref_plan)


def test_facts_mismatch_names_what_differs(ref_plan):
    with pytest.raises(GraphError) as e:
        _ref_graph(d=32).load_plan(ref_plan)
    assert isinstance(e.value, PlanFileError)
    msg = str(e.value)
    assert "head_dim_qk: saved 16, here 32" in msg, msg
    assert "tensor 'q' dim: saved [2, 4, 32, 16], here [2, 4, 32, 32]" in msg, msg
    with pytest.raises(PlanFileError, match="window_right: saved 0, here None"):
        _ref_graph(causal=False).load_plan(ref_plan)


def test_load_validates_the_graph_first(ref_plan):
    g = frost.Graph(io_data_type=torch.float32, target=CPU)
    with pytest.raises(GraphError, match="no SDPA node"):
        g.load_plan(ref_plan)


def _zip(path: Path, files: dict) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for n, data in files.items():
            z.writestr(n, data)
    return path


def test_damaged_files_raise_plan_file_error(ref_plan, tmp_path):
    good = ref_plan.read_bytes()
    header = json.loads(zipfile.ZipFile(ref_plan).read("plan.json"))
    cases = {
        "missing": tmp_path / "nope.plan",
        "garbage": tmp_path / "garbage.plan",
        "truncated": tmp_path / "truncated.plan",
        "no header": _zip(tmp_path / "noheader.plan", {"x": b"1"}),
        "bad json": _zip(tmp_path / "badjson.plan", {"plan.json": b"{not json"}),
        "not a plan": _zip(tmp_path / "magic.plan", {"plan.json": json.dumps({"magic": "zip"})}),
        "future": _zip(tmp_path / "future.plan", {"plan.json": json.dumps({**header, "version": 99})}),
        "malformed": _zip(tmp_path / "malformed.plan", {"plan.json": json.dumps({**header, "kernels": 3})}),
        "missing member": _zip(
            tmp_path / "member.plan",
            {
                "plan.json": json.dumps(
                    {
                        **header,
                        "kernels": [
                            {
                                "name": "frost_x",
                                "template": PROBE,
                                "params_type": PROBE_PARAMS,
                                "params": {},
                                "arch": "sm_90a",
                                "key": {},
                                "member": "kernels/0.o",
                                "size": 1,
                                "sha256": "0" * 64,
                            }
                        ],
                    }
                )
            },
        ),
        "digest": _zip(
            tmp_path / "digest.plan",
            {
                "kernels/0.o": b"x",
                "plan.json": json.dumps(
                    {
                        **header,
                        "kernels": [
                            {
                                "name": "frost_x",
                                "template": PROBE,
                                "params_type": PROBE_PARAMS,
                                "params": {},
                                "arch": "sm_90a",
                                "key": {},
                                "member": "kernels/0.o",
                                "size": 1,
                                "sha256": "0" * 64,
                            }
                        ],
                    }
                ),
            },
        ),
    }
    cases["garbage"].write_bytes(b"\x00\x01 not a zip at all" * 10)
    cases["truncated"].write_bytes(good[: len(good) // 2])
    for what, path in cases.items():
        with pytest.raises(PlanFileError) as e:
            _ref_graph().load_plan(path)
        assert str(path) in str(e.value), (what, str(e.value))
        assert type(e.value) is PlanFileError, what


def test_saving_needs_a_plan(tmp_path):
    g = _ref_graph()
    with pytest.raises(GraphError, match="no plan"):
        g.save_plan(tmp_path / "x.plan")
    assert not (tmp_path / "x.plan").exists()


def test_frost_cache_is_there_after_import_frost_and_tests_use_a_private_cache_dir():
    code = "import frost, json, sys; print(json.dumps([sorted(frost.cache.stats()), 'cutlass' in sys.modules]))"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    keys, cutlass = json.loads(r.stdout.strip().splitlines()[-1])
    assert "compiles" in keys and "hits" in keys and not cutlass
    assert os.environ.get("FROST_CACHE_DIR"), "test/conftest.py sets a cache directory"
    assert frost.cache.cache_dir() != Path.home() / ".cache" / "frost"
