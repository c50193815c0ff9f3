"""Fresh-interpreter runners for the CPU tests: kernel-compiling scripts (PTX kept, no cache, no GPU, a RESULT
line) and cache/plan scripts (`run_py`, a JSON last line)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from frost.testing.length_clamps import count_length_loads, unclamped_loads

ROOT = Path(__file__).resolve().parents[1]


def run_py(
    script: str, cache_dir: Path, *, args=(), root: Path = ROOT, extra_env=None, extra_path=(), timeout: int = 300
) -> dict:
    """Run `script` in a fresh interpreter on the package under `root` with `cache_dir` as its cache;
    its last output line is JSON."""
    env = dict(
        os.environ,
        FROST_CACHE_DIR=str(cache_dir),
        PYTHONPATH=os.pathsep.join([str(root), *map(str, extra_path), os.environ.get("PYTHONPATH", "")]),
    )
    env.pop("FROST_CACHE_DISABLE", None)
    env.update(extra_env or {})
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
        env=env,
        cwd=str(root),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, f"subprocess failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_compile_script(script: str, args: list, cwd, timeout: int = 600) -> list:
    env = dict(
        os.environ,
        CUTE_DSL_KEEP="ptx,ir",
        FROST_CACHE_DISABLE="1",
        CUDA_VISIBLE_DEVICES="",
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    r = subprocess.run(
        [sys.executable, "-c", script, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert r.returncode == 0, r.stderr[-4000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


_SPECS_SCRIPT = textwrap.dedent("""
    import importlib, json, sys
    from test.compile_runner import ptx_facts, ptxas_facts
    from frost.compiler.compile import compile_kernel
    arch, ptxas = sys.argv[1], sys.argv[3] == "1"
    out = []
    for template, params_class, kw, tag in json.loads(sys.argv[2]):
        module, name = params_class.rsplit(".", 1)
        params = getattr(importlib.import_module(module), name)(**kw)
        ck = compile_kernel(template, params, arch)
        out.append(dict(ptx_facts(ck), **(ptxas_facts(ck.ptx, arch) if ptxas else {}), tag=tag))
    print("RESULT " + json.dumps(out))
""")


def compile_groups(groups: list, cwd, timeout: int = 900, ptxas: bool = False) -> list:
    """Compile groups of specs, each in its own fresh interpreter, two at a time.

    `groups` is a list of (arch, specs), a spec being (template module, dotted params class, params
    kwargs, tag); returns, per group, each spec's `ptx_facts` plus its tag (and, with `ptxas`, its
    `ptxas_facts`).
    """

    def one(group):
        arch, specs = group
        return run_compile_script(_SPECS_SCRIPT, [arch, json.dumps(specs), "1" if ptxas else "0"], cwd, timeout)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(one, groups))
    # every kernel any compile test builds clamps the lengths and offsets it reads from the device
    # (the opt-in length check compares the values as they are: that is its job)
    unclamped = {
        o["name"]: o["unclamped"]
        for outs in results
        for o in outs
        if o.get("unclamped") and not o["name"].startswith("frost_length_check")
    }
    assert not unclamped, f"lengths read from the device without the clamp (docs/lengths.md): {unclamped}"
    return results


# what ptxas may spill in a wgmma forward with a bias: its predicated bias loads (issued together, a row of the
# tile at a time) keep more registers live than branching per element did, and in the tightest kernels (packed,
# or beside a block mask) ptxas moves a few per-tile values to the stack, stored before the key loop and reloaded
# after it, never inside it (44 bytes in the packed kernel of the covering set, 8 beside a block mask)
BIAS_TILE_SPILL_BYTES = 48
# ptxas 13.4 (the test extra's) spills more in the packed (THD) wgmma forward with a bias and GQA: 196 bytes before
# the length clamps, 160 after (the 44 above was an older ptxas's count). Held here so that it cannot grow while the
# H200 verification measures whether these spills sit inside the key loop.
BIAS_THD_SPILL_BYTES = 160

# instruction counts the compile tests assert on (substring -> key)
PTX_COUNTS = {
    "mma_sync": "mma.sync.aligned.m16n8k16",
    "wgmma": "wgmma",
    "wgmma_mma_async": "wgmma.mma_async",
    "tma": "cp.async.bulk.tensor",
    "setmaxnreg": "setmaxnreg",
    "ldmatrix": "ldmatrix",
    "ldmatrix_trans": ".trans",
    "ldmatrix_x4_trans": "ldmatrix.sync.aligned.m8n8.x4.trans",
    "cp_async": "cp.async.cg.shared.global",
    "ex2": "ex2.approx",
    "red_v2": "red.global.add.v2.f32",
    "red": "red.global.add.f32",
    "sem": "ld.acquire.gpu",
    "tma_reduce": "cp.reduce.async.bulk.tensor",
    "bulk_reduce": "cp.reduce.async.bulk.global.shared::cta",
    "sts_v4": "st.shared.v4",
    "ldg_v4": "ld.global.v4",
    "stg_v4": "st.global.v4",
    "pdl_wait": "griddepcontrol.wait",
    "ballot": "vote.sync.ballot",
}


def ptx_facts(ck) -> dict:
    """What a compile test checks of one CompiledKernel: its names, target and instruction counts."""
    ptx = ck.ptx or ""
    out = {
        "name": ck.name,
        "entries": re.findall(r"\.entry\s+(\w+)", ptx),
        "target": re.findall(r"\.target\s+(\w+)", ptx),
        "seconds": ck.compile_seconds,
        "local": ptx.count("ld.local") + ptx.count("st.local"),
    }
    out.update({k: ptx.count(pattern) for k, pattern in PTX_COUNTS.items()})
    if ck.mlir:  # the length clamps (docs/lengths.md): integer loads from global memory, and those not clamped
        out.update(length_loads=count_length_loads(ck.mlir), unclamped=unclamped_loads(ck.mlir))
    return out


def find_ptxas() -> str | None:
    """The ptxas of the test extra's nvidia-cuda-nvcc (new enough for the DSL's PTX version), else the PATH's."""
    import importlib.util
    import shutil

    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        for cuda in ("cu13", "cuda_nvcc"):
            candidate = Path(base) / cuda / "bin" / "ptxas"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return shutil.which("ptxas")


def ptxas_facts(ptx: str, arch: str) -> dict:
    """What `ptxas -v` says of a PTX module: registers per thread and spill bytes (stores + loads), or
    `ptxas: None` where no ptxas is found (the test extra installs one)."""
    import tempfile

    ptxas = find_ptxas()
    if ptxas is None:
        return {"ptxas": None}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.ptx"
        path.write_text(ptx)
        r = subprocess.run(
            [ptxas, f"-arch={arch}", "-v", str(path), "-o", str(path.with_suffix(".cubin"))],
            capture_output=True,
            text=True,
        )
    assert r.returncode == 0, r.stderr[-4000:]
    text = r.stdout + r.stderr
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", text))
    return {
        "ptxas": text,
        "registers": max(int(n) for n in re.findall(r"Used (\d+) registers", text)),
        "spill_bytes": spills,
    }


def check_head_dim_cover(cover: dict, head_dim_cover: dict, tuned) -> list:
    """The mma.sync covering sets: the tuned head dims in `cover`, and in `head_dim_cover` every representative
    untuned dim on sm_80 (padded and unpadded, d_qk != d_v both ways) for both families. Returns the untuned
    cases' keyword arguments for the direction's own flag checks."""
    kws = [kw for arch in cover for kw in cover[arch]]
    assert {(k["head_dim"], k["head_dim_v"]) for k in kws} == set(tuned)
    on_sm80 = {(k["head_dim"], k["head_dim_v"]) for k in head_dim_cover["sm_80"]}
    assert {d for d, _ in on_sm80} >= {8, 32, 40, 48, 72, 80, 112, 160, 192}
    assert (192, 64) in on_sm80
    others = [kw for arch in head_dim_cover for kw in head_dim_cover[arch]]
    assert any(k["head_dim"] < k["head_dim_v"] for k in others) and {k["family"] for k in others} == {"sm80", "sm120"}
    return others
