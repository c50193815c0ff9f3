"""The compile boundary and its persistent cache, on the CPU, with the probe copy template.

Cross-process behaviour runs in fresh interpreters (subprocesses) sharing one
cache directory; the probe compiles in about a second, so this stays quick.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from frost.compiler import cache, compile as boundary
from frost.compiler import fingerprint
from frost.engines.common.probe_copy_params import ProbeCopyParams
from frost.target import fake_target
from test.compile_runner import run_py

ROOT = Path(__file__).resolve().parents[2]
PROBE = "frost.engines.common.probe_copy"
ARCH = "sm_90a"


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A frozen copy of the frost package: processes that must agree on the fingerprint import
    the same sources even if the working tree changes meanwhile."""
    import shutil

    root = tmp_path_factory.mktemp("tree")
    shutil.copytree(ROOT / "frost", root / "frost", ignore=shutil.ignore_patterns("__pycache__"))
    return root


COMPILE_PROBE = """
    import json, sys, time
    from frost.compiler import cache
    from frost.compiler.compile import compile_kernel
    from frost.engines.common.probe_copy_params import ProbeCopyParams
    ck = compile_kernel("frost.engines.common.probe_copy", ProbeCopyParams(dtype="{dtype}"), "{arch}")
    print(json.dumps({{"name": ck.name, "source": ck.source, "digest": ck.digest, "path": ck.path,
                      "loader": ck.loader, "stats": cache.stats(), "cutlass": "cutlass" in sys.modules}}))
"""


def test_second_process_hits_with_zero_compiles_and_the_same_digest(tmp_path, tree):
    d = tmp_path / "cache"
    first = run_py(COMPILE_PROBE.format(dtype="f32", arch=ARCH), d, root=tree)
    assert first["source"] == "compile" and first["name"] == "frost_probe_copy_f32"
    assert first["stats"]["compiles"] == 1 and first["stats"]["misses"] == 1 and first["stats"]["hits"] == 0
    second = run_py(COMPILE_PROBE.format(dtype="f32", arch=ARCH), d, root=tree)
    assert second["source"] == "disk"
    assert second["stats"]["compiles"] == 0 and second["stats"]["hits"] == 1 and second["stats"]["misses"] == 0
    assert second["digest"] == first["digest"] and second["path"] == first["path"]
    if second["loader"] == "so":  # the linked library loads through TVM-FFI alone
        assert not second["cutlass"], "a warm-cache load imported cutlass"


def test_loaded_artifact_has_the_fresh_call_signature(tmp_path, tree):
    """A fresh in-memory compile (with a JIT engine: sm_100a is what the DSL assumes without a GPU)
    and the artifact loaded from disk answer the same call the same way."""
    script = """
        import json, torch
        from frost.compiler.compile import compile_kernel
        from frost.engines.common.probe_copy_params import ProbeCopyParams
        ck = compile_kernel("frost.engines.common.probe_copy", ProbeCopyParams(dtype="f32"), "sm_100a")
        out = {"source": ck.source, "fn": type(ck.fn).__name__}
        for name, args in [("cpu", (torch.zeros(8), torch.zeros(8))), ("arity", (torch.zeros(8),)),
                           ("dtype", (torch.zeros(8, dtype=torch.int32), torch.zeros(8)))]:
            try:
                ck(*args)
                out[name] = "ran"
            except Exception as e:
                out[name] = type(e).__name__ + ": " + str(e)
        print(json.dumps(out))
    """
    d = tmp_path / "cache"
    fresh = run_py(script, d, extra_env={"FROST_CACHE_DISABLE": "1"}, root=tree)
    run_py(script, d, root=tree)  # compile, export, load back
    loaded = run_py(script, d, root=tree)
    assert fresh["source"] == "compile" and loaded["source"] == "disk"
    assert fresh["fn"] == loaded["fn"] == "Function"
    for k in ("cpu", "arity", "dtype"):
        assert fresh[k] == loaded[k], k
    assert "probe_copy(src: Tensor([n0], float32), dst: Tensor([n0], float32))" in loaded["cpu"]


def test_corrupt_truncated_and_foreign_entries_are_misses_and_get_replaced(fresh):
    params = ProbeCopyParams(dtype="f16")
    ck = boundary.compile_kernel(PROBE, params, ARCH)
    assert ck.source == "compile" and ck.digest
    obj = Path(ck.path)
    side = obj.with_suffix(".json")
    good = obj.read_bytes()

    def again():
        boundary.clear_memo()
        return boundary.compile_kernel(PROBE, params, ARCH)

    obj.write_bytes(good[: len(good) // 2])  # truncated
    assert again().source == "compile"
    assert cache.stats()["corrupt"] == 1
    assert obj.read_bytes() == good  # replaced, same bytes

    obj.write_bytes(b"\x7fELF garbage" + good[12:])  # corrupt, same size
    assert again().source == "compile" and cache.stats()["corrupt"] == 2

    side.write_text("{not json")  # corrupt sidecar
    assert again().source == "compile" and cache.stats()["corrupt"] == 3

    meta = json.loads(side.read_text())  # a foreign entry sitting at this id
    meta["key"]["params"] = meta["key"]["params"].replace("f16", "bf16")
    side.write_text(json.dumps(meta))
    assert again().source == "compile" and cache.stats()["corrupt"] == 4

    so = obj.with_suffix(".so")
    if so.exists():  # a damaged linked library falls back to the object: still a hit
        so.write_bytes(b"junk")
        hit = again()
        assert hit.source == "disk" and hit.loader == "o"

    assert again().source == "disk"
    assert cache.stats()["compiles"] == 5


def test_racing_processes_compile_a_key_once(tmp_path, tree):
    """Two fresh processes start compiling the same key at the same moment; the file lock
    makes one compile and the other load what it published."""
    d = tmp_path / "cache"
    go = tmp_path / "go"
    script = f"""
        import json, os, sys, time
        import cutlass.cute  # pay the import before the barrier
        from frost.compiler import cache
        from frost.compiler.compile import compile_kernel
        from frost.engines.common.probe_copy_params import ProbeCopyParams
        open(os.path.join({str(tmp_path)!r}, "ready." + str(os.getpid())), "w").close()
        while not os.path.exists({str(go)!r}):
            time.sleep(0.005)
        ck = compile_kernel("frost.engines.common.probe_copy", ProbeCopyParams(dtype="bf16"), "{ARCH}")
        print(json.dumps({{"source": ck.source, "digest": ck.digest, "stats": cache.stats()}}))
    """
    env = dict(os.environ, PYTHONPATH=str(tree), FROST_CACHE_DIR=str(d))
    env.pop("FROST_CACHE_DISABLE", None)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(script)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=str(tree),
        )
        for _ in range(2)
    ]
    deadline = time.time() + 120
    while len(list(tmp_path.glob("ready.*"))) < 2 and time.time() < deadline:
        time.sleep(0.01)
    go.touch()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(o["stats"]["compiles"] for o in outs) == 1
    assert sorted(o["source"] for o in outs) == ["compile", "disk"]
    assert outs[0]["digest"] == outs[1]["digest"]


def test_worker_sees_no_gpu_and_cannot_initialize_cuda(fresh):
    from frost.compiler.compile import KernelSpec
    from frost.compiler.workers import worker_facts

    h200 = fake_target("H200")
    facts = worker_facts(h200, KernelSpec(PROBE, ProbeCopyParams(dtype="f32")))
    assert facts["CUDA_VISIBLE_DEVICES"] == ""
    assert facts["target"] == h200.model_dump()  # the parent's record, not a discovered one
    assert facts["compiled"]["ok"] and facts["compiled"]["name"] == "frost_probe_copy_f32"
    assert facts["cuInit"] != "CUDA_SUCCESS"
    assert facts["torch_cuda_device_count"] == 0
    assert not facts["torch_cuda_initialized_after_compile"]
    assert facts["pid"] != os.getpid()
    # the parent now loads what the worker exported
    ck = boundary.compile_kernel(PROBE, ProbeCopyParams(dtype="f32"), h200)
    assert ck.source == "disk" and ck.digest == facts["compiled"]["digest"]
    assert cache.stats()["compiles"] == 0


def test_compile_many_compiles_in_workers_and_loads_in_order(fresh):
    from frost.compiler.workers import compile_many

    specs = [
        (PROBE, ProbeCopyParams(dtype="bf16")),
        (PROBE, ProbeCopyParams(dtype="f16")),
        (PROBE, ProbeCopyParams(dtype="bf16")),
    ]
    kernels = compile_many(specs, fake_target("H200"), max_workers=2)
    assert [k.name for k in kernels] == ["frost_probe_copy_bf16", "frost_probe_copy_f16", "frost_probe_copy_bf16"]
    assert kernels[0] is kernels[2]
    s = cache.stats()
    assert s["worker_compiles"] == 2 and s["compiles"] == 0 and s["hits"] == 2
    again = compile_many(specs, fake_target("H200"))
    assert [a is k for a, k in zip(again, kernels)] == [True] * 3


def test_precompile_entry_and_cli(fresh, capsys):
    import frost
    from frost.plans.precompile import main

    got = frost.precompile([(PROBE, ProbeCopyParams(dtype="f32"))], fake_target("H200"))
    assert got[0].name == "frost_probe_copy_f32"
    assert main(["--probe", "--target", "H200", "--workers", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [k["name"] for k in out["kernels"]] == [
        "frost_probe_copy_f16",
        "frost_probe_copy_bf16",
        "frost_probe_copy_f32",
    ]
    assert main(["--info"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["dir"] == str(fresh) and info["bytes"] > 0


def test_precompile_takes_graphs(monkeypatch, unpended):
    """A graph contributes the specs of the engine build_plans would pick (nothing compiles here)."""
    import frost
    from frost.plans import precompile as pre

    seen = {}

    def fake_compile_many(specs, target, max_workers=None):
        seen["specs"], seen["target"] = specs, target
        return []

    monkeypatch.setattr(pre, "compile_many", fake_compile_many)
    g = frost.Graph(io_data_type=frost.DataType.BFLOAT16)
    q, k, v = (g.tensor(name=n, dim=(2, 8, 256, 128)) for n in "qkv")
    o, _ = g.sdpa(q, k, v, attn_scale=0.088, generate_stats=False, use_causal_mask=True)
    o.set_output(True)
    frost.precompile([g], fake_target("H200"))
    (spec,) = seen["specs"]
    assert spec.template == "frost.engines.sm90.sdpa_fwd" and seen["target"] == fake_target("H200")


# -- keys ------------------------------------------------------------------------------------
TEMPLATE_SRC = """
import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from frost.engines.common.probe_copy_params import ProbeCopyParams


def kernel_name(params, arch):
    return "frost_test_{name}"


def build(params, arch):
    n = cute.sym_int()
    a = cute.runtime.make_fake_compact_tensor(cutlass.Float32, (n,))
    b = cute.runtime.make_fake_compact_tensor(cutlass.Float32, (n,))
    return host, ({args})


@cute.kernel
def first(a: cute.Tensor, b: cute.Tensor):
    i, _, _ = cute.arch.thread_idx()
    if i < cute.size(a, mode=[0]):
        b[i] = a[i]


@cute.kernel
def second(a: cute.Tensor, b: cute.Tensor):
    i, _, _ = cute.arch.thread_idx()
    if i < cute.size(a, mode=[0]):
        a[i] = b[i]


@cute.jit
def host(a: cute.Tensor, b: cute.Tensor):
    first(a, b).launch(grid=(1, 1, 1), block=(128, 1, 1))
    second(a, b).launch(grid=(1, 1, 1), block=(128, 1, 1))
"""


def write_template(root: Path, name: str, args: str = "a, b") -> str:
    (root / f"{name}.py").write_text(TEMPLATE_SRC.format(name=name, args=args))
    return name


def test_key_follows_template_source_and_arch_not_runtime_extents(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    t = write_template(tmp_path, "tmpl_key")
    p = ProbeCopyParams()
    k90, k80 = fingerprint.full_key(t, p, "sm_90a"), fingerprint.full_key(t, p, "sm_80")
    assert k90 != k80 and fingerprint.entry_id("f", k90) != fingerprint.entry_id("f", k80)
    (tmp_path / "tmpl_key.py").write_text((tmp_path / "tmpl_key.py").read_text() + "\n# edited\n")
    assert fingerprint.full_key(t, p, "sm_90a") == k90  # a process keys the code it loaded
    fingerprint.forget_sources()
    assert fingerprint.full_key(t, p, "sm_90a")["template_sha256"] != k90["template_sha256"]

    # frost's kernel sources and its compile boundary are in the fingerprint; the layers above are not
    import shutil

    src = tmp_path / "frost"
    shutil.copytree(fingerprint.FROST_ROOT, src, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, counts in (
        ("engines/common/probe_copy.py", True),
        ("compiler/naming.py", True),
        ("runtime/workspace.py", True),
        ("bench/cli.py", False),
        ("lowering/lower.py", False),
    ):
        before = fingerprint.sources_digest(src)
        (src / rel).write_text((src / rel).read_text() + "\n# edited\n")
        fingerprint.forget_sources()
        assert (fingerprint.sources_digest(src) != before) == counts, rel
    # and so are code-generation settings, but not diagnostics
    base = fingerprint.fingerprint()
    monkeypatch.setenv("CUTE_DSL_KEEP", "ptx")
    assert fingerprint.fingerprint() == base
    monkeypatch.setenv("CUTE_DSL_LINEINFO", "1")
    assert fingerprint.fingerprint() != base

    # runtime extents are symbolic: the key is the params, and the fake shapes hold no numbers
    import cutlass.cute as cute
    from frost.engines.common import probe_copy

    _, (src_t, dst_t, _) = probe_copy.build(p, "sm_90a")
    assert not any(isinstance(e, int) for e in src_t.shape)
    assert boundary.compile_key(PROBE, p, "sm_90a") == boundary.compile_key(PROBE, ProbeCopyParams(), "sm_90a")
    with pytest.raises(Exception):
        ProbeCopyParams(dtype="f32", n=4096)  # an extent cannot even be a param
    assert isinstance(cute.sym_int(), type(src_t.shape[0]))


def test_a_real_tensor_in_fake_args_raises(tmp_path, monkeypatch, fresh):
    monkeypatch.syspath_prepend(str(tmp_path))
    t = write_template(tmp_path, "tmpl_real", args="a, torch.zeros(4)")
    src = (tmp_path / "tmpl_real.py").read_text()
    (tmp_path / "tmpl_real.py").write_text("import torch\n" + src)
    with pytest.raises(TypeError, match="real tensor reached a compile key"):
        boundary.compile_kernel(t, ProbeCopyParams(), ARCH)
    assert cache.stats()["compiles"] == 0
    from cutlass.cute.runtime import from_dlpack

    for bad in ([torch.zeros(2)], {"x": (1, torch.zeros(2))}, from_dlpack(torch.zeros(4))):
        with pytest.raises(TypeError, match="real tensor"):
            boundary._reject_real_tensors((bad,))


# -- names -----------------------------------------------------------------------------------
def test_ptx_entries_and_exported_symbol_carry_frost_names(tmp_path):
    write_template(tmp_path, "tmpl_two")
    dump = tmp_path / "dump"
    dump.mkdir()
    script = """
        import json
        from frost.compiler.compile import compile_kernel
        from frost.engines.common.probe_copy_params import ProbeCopyParams
        out = {}
        for t in ("frost.engines.common.probe_copy", "tmpl_two"):
            ck = compile_kernel(t, ProbeCopyParams(), "sm_90a")
            out[t] = {"name": ck.name, "ptx": ck.ptx, "symbols": ck.kernel_symbols,
                      "obj": open(ck.path, "rb").read().hex()}
        print(json.dumps(out))
    """
    out = run_py(
        script,
        tmp_path / "cache",
        extra_env={"CUTE_DSL_KEEP": "ptx", "CUTE_DSL_DUMP_DIR": str(dump)},
        extra_path=[tmp_path],
    )
    import re

    probe = out[PROBE]
    assert re.findall(r"\.entry\s+(\w+)", probe["ptx"]) == ["frost_probe_copy_f32"]
    assert probe["symbols"] == ["frost_probe_copy_f32"]
    obj = bytes.fromhex(probe["obj"])
    assert b"__tvm_ffi_frost_probe_copy_f32" in obj and b"kernel_cutlass" not in obj
    two = out["tmpl_two"]
    assert sorted(re.findall(r"\.entry\s+(\w+)", two["ptx"])) == ["frost_test_tmpl_two", "frost_test_tmpl_two__second"]
    assert two["symbols"] == ["frost_test_tmpl_two", "frost_test_tmpl_two__second"]


def test_kernel_names_must_be_frost_symbols(tmp_path, monkeypatch, fresh):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "tmpl_badname.py").write_text(
        "def kernel_name(p, a):\n    return 'probe copy'\ndef build(p, a):\n    raise AssertionError\n"
    )
    with pytest.raises(ValueError, match="frost_"):
        boundary.compile_kernel("tmpl_badname", ProbeCopyParams(), ARCH)


# -- disk layer housekeeping -----------------------------------------------------------------
def _fake_entry(d: Path, stem: str, size: int, age: float) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{stem}.o").write_bytes(b"\0" * size)
    (d / f"{stem}.json").write_text("{}")
    t = time.time() - age
    os.utime(d / f"{stem}.json", (t, t))


def test_size_cap_prunes_stale_fingerprints_first_then_least_recently_used(tmp_path):
    dc = cache.DiskCache(tmp_path, "a" * 64)
    stale = dc.base / ("b" * 16)
    week = 8 * 86400.0
    _fake_entry(stale, "s_new", 1000, age=week)  # another build's, unused for over a week: goes first
    _fake_entry(dc.dir, "c_old", 1000, age=300)
    _fake_entry(dc.dir, "c_mid", 1000, age=200)
    _fake_entry(dc.dir, "c_new", 1000, age=100)
    (dc.dir / ".x.tmp.o").write_bytes(b"0")
    os.utime(dc.dir / ".x.tmp.o", (0, 0))  # an abandoned temp file
    assert dc.prune(limit=2500) == 2
    assert not stale.exists()
    left = sorted(p.name for p in dc.dir.iterdir())
    assert left == ["c_mid.json", "c_mid.o", "c_new.json", "c_new.o"]
    assert dc.prune(limit=10, keep=("c_new",)) == 1
    assert sorted(p.name for p in dc.dir.iterdir()) == ["c_new.json", "c_new.o"]


def test_pruning_keeps_another_builds_directory_in_use(tmp_path):
    """Two frost versions share one cache: the other's directory, opened lately, is not stale; its entries
    compete with ours by last use, and its FINGERPRINT.json keeps it alive."""
    dc = cache.DiskCache(tmp_path, "a" * 64)
    other = dc.base / ("b" * 16)
    _fake_entry(other, "o_used", 1000, age=50)  # hit lately by the other build
    (other / "FINGERPRINT.json").write_text("{}")
    _fake_entry(dc.dir, "c_old", 1000, age=300)
    _fake_entry(dc.dir, "c_new", 1000, age=10)
    assert dc.prune(limit=2500) == 1
    assert (other / "o_used.o").exists() and not (dc.dir / "c_old.o").exists()
    assert dc.prune(limit=1500) == 1  # now the other's entry is the least recently used
    assert not (other / "o_used.o").exists() and (dc.dir / "c_new.o").exists()
    assert other.exists(), "its FINGERPRINT.json was opened lately: the directory stays for its build"


def test_size_cap_applies_after_publish(fresh, monkeypatch):
    monkeypatch.setenv("FROST_CACHE_MAX_BYTES", "1")
    a = boundary.compile_kernel(PROBE, ProbeCopyParams(dtype="f32"), ARCH)
    b = boundary.compile_kernel(PROBE, ProbeCopyParams(dtype="f32"), "sm_80")
    assert Path(b.path).exists() and not Path(a.path).exists()  # the newest entry is kept
    assert cache.stats()["evictions"] >= 1


def test_disable_keeps_everything_in_memory(fresh, monkeypatch):
    monkeypatch.setenv("FROST_CACHE_DISABLE", "1")
    ck = boundary.compile_kernel(PROBE, ProbeCopyParams(dtype="f32"), ARCH)
    assert ck.source == "compile" and ck.digest is None and ck.path is None
    assert not fresh.exists()
    assert boundary.compile_kernel(PROBE, ProbeCopyParams(dtype="f32"), ARCH) is ck
    s = cache.stats()
    assert s["compiles"] == 1 and s["misses"] == 1 and s["memo_hits"] == 1


def test_an_unusable_cache_directory_never_fails_a_compile(tmp_path, monkeypatch, fresh):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("FROST_CACHE_DIR", str(blocker / "cache"))
    ck = boundary.compile_kernel(PROBE, ProbeCopyParams(dtype="f32"), ARCH)
    assert ck.source == "compile" and ck.path is None


def test_public_stats_module_is_cheap():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, json, frost.cache as c; "
            "print(json.dumps([sorted(c.stats()), 'cutlass' in sys.modules, 'tvm_ffi' in sys.modules]))",
        ],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        cwd=str(ROOT),
    )
    keys, cutlass_loaded, tvm_loaded = json.loads(out.stdout)
    assert {"hits", "misses", "compiles", "load_seconds", "compile_seconds"} <= set(keys)
    assert not cutlass_loaded and not tvm_loaded
