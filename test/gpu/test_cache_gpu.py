"""Cached artifacts run on the GPU exactly like fresh compiles, in fresh processes.

One process compiles the probe copy kernel into an empty cache; fresh processes
load it back (through the linked library and through the object loader), run
it with lengths it never saw, on a side stream, and time the host cost of a
call. Set FROST_GPU_RESULTS to a directory to keep the measurements as JSON.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from test.compile_runner import run_py

pytestmark = pytest.mark.gpu


SCRIPT = """
    import json, sys, time
    import torch
    from frost.compiler import cache
    from frost.compiler.compile import compile_kernel
    from frost.engines.common.probe_copy_params import ProbeCopyParams
    from frost.target import discover_target

    target = discover_target()
    t0 = time.perf_counter()
    kernels = {d: compile_kernel("frost.engines.common.probe_copy", ProbeCopyParams(dtype=d), target)
               for d in ("f32", "bf16")}
    plan_s = time.perf_counter() - t0
    out = {"plan_s": plan_s, "stats": cache.stats(), "arch": target.arch,
           "kernels": {d: {"name": k.name, "source": k.source, "loader": k.loader, "digest": k.digest}
                       for d, k in kernels.items()}}
    dt = {"f32": torch.float32, "bf16": torch.bfloat16}
    ok = True
    side = torch.cuda.Stream()
    for d, k in kernels.items():
        for n in {lengths}:
            src = torch.randn(n, device="cuda").to(dt[d])
            dst = torch.full_like(src, float("nan"))
            side.wait_stream(torch.cuda.current_stream())  # src and dst are written on the default stream
            with torch.cuda.stream(side):  # the env stream: torch's current stream
                k(src, dst)
            side.synchronize()
            ok &= bool(torch.equal(src, dst))
    out["correct"] = ok

    # host time per call of a loaded artifact, tiny problem
    k = kernels["f32"]
    a = torch.randn(256, device="cuda"); b = torch.empty_like(a)
    for _ in range(200):
        k(a, b)
    torch.cuda.synchronize()
    for label, f in (("CompiledKernel", k), ("fn", k.fn)):
        t0 = time.perf_counter()
        for _ in range(2000):
            f(a, b)
        out["host_us_" + label] = (time.perf_counter() - t0) / 2000 * 1e6
        torch.cuda.synchronize()

    # the profiler sees the frost name
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            k(a, b)
            torch.cuda.synchronize()
        out["profiled_kernels"] = sorted({e.name for e in prof.events() if "probe" in e.name or "frost" in e.name})
    except Exception as e:
        out["profiled_kernels"] = "unavailable: " + repr(e)
    out["cutlass_imported"] = "cutlass" in sys.modules
    print(json.dumps(out))
"""


def _run(cache_dir: Path, lengths, env=None) -> dict:
    return run_py(SCRIPT.replace("{lengths}", repr(lengths)), cache_dir, extra_env=env, timeout=600)


def test_compiled_then_loaded_in_fresh_processes_runs_correctly(tmp_path):
    d = tmp_path / "cache"
    runs = {
        "compile": _run(d, [1, 1000, 4097]),
        "load_so": _run(d, [7, 300001, 257]),
        "load_o": _run(d, [2, 65536], {"FROST_CACHE_LOADER": "o"}),
        "in_memory": _run(d, [3, 1025], {"FROST_CACHE_DISABLE": "1"}),
    }
    out_dir = os.environ.get("FROST_GPU_RESULTS")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "cache_gpu.json").write_text(json.dumps(runs, indent=1))
    for label, r in runs.items():
        print(label, {k: v for k, v in r.items() if k != "stats"}, r["stats"])
        assert r["correct"], label
        assert r["kernels"]["f32"]["name"] == "frost_probe_copy_f32"
    assert runs["compile"]["stats"]["compiles"] == 2
    for label in ("load_so", "load_o"):
        r = runs[label]
        assert r["stats"]["compiles"] == 0 and r["stats"]["hits"] == 2, label
        for d, first in runs["compile"]["kernels"].items():
            got = r["kernels"][d]
            assert got["source"] == "disk" and (got["name"], got["digest"]) == (first["name"], first["digest"]), label
    assert runs["load_o"]["kernels"]["f32"]["loader"] == "o"
    if runs["load_so"]["kernels"]["f32"]["loader"] == "so":
        assert not runs["load_so"]["cutlass_imported"]
    names = runs["load_so"]["profiled_kernels"]
    if isinstance(names, list) and names:
        assert "frost_probe_copy_f32" in names, names


def test_worker_compiled_artifacts_run_in_the_parent(tmp_path):
    script = """
        import json, torch
        from frost.compiler import cache
        from frost.engines.common.probe_copy_params import ProbeCopyParams
        from frost.target import discover_target
        from frost.compiler.workers import compile_many
        torch.cuda.init()  # the parent has CUDA; the workers must not need it
        ks = compile_many([("frost.engines.common.probe_copy", ProbeCopyParams(dtype=d)) for d in ("f16", "bf16")],
                          discover_target(), max_workers=2)
        ok = True
        for k, dt in zip(ks, (torch.float16, torch.bfloat16)):
            src = torch.randn(12345, device="cuda").to(dt); dst = torch.zeros_like(src)
            k(src, dst); torch.cuda.synchronize()
            ok &= bool(torch.equal(src, dst))
        print(json.dumps({"ok": ok, "stats": cache.stats()}))
    """
    out = run_py(script, tmp_path / "cache", timeout=600)
    assert out["ok"] and out["stats"]["worker_compiles"] == 2 and out["stats"]["compiles"] == 0
