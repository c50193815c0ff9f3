"""Plan time of a forward + backward pair in fresh processes: cold cache, warm cache, saved plan files.

Each measurement is a new interpreter that imports torch (the caller's cost,
reported apart), imports frost, declares the pair and times
`validate() + build_plans()` per graph. Runs:

  cold       an empty cache directory: every kernel compiles (the bwd chain in workers)
  warm       the cache the cold run filled (--repeats runs; median and min)
  plan file  an empty cache directory and the plans the cold run saved (`Graph.load_plan`)

On a GPU machine the target is the device (`--target auto`, discovery timed
apart); anywhere else pass a fake target, e.g. `--target H200` (kernels compile
for its arch on the CPU). Children run a snapshot of the package taken at the
start (so edits to the working tree cannot change the cache fingerprint midway)
and may write bytecode there, as an installed package has, unless --no-bytecode.
`--json` prints the raw runs as JSON.

    python benchmarks/plan_time.py --target H200 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
t = time.perf_counter
a = t(); import torch; t_torch = t() - a
a = t(); import frost; t_frost = t() - a
from frost.target import discover_target, fake_target
cfg = json.loads(sys.argv[1])
a = t()
target = discover_target() if cfg["target"] == "auto" else fake_target(cfg["target"])
t_target = t() - a
if target.is_cpu:
    raise SystemExit("no GPU here: pass a fake target, e.g. --target H200")


def pair(target, b, s, h, d, causal):
    bshd, st = (s * h * d, d, h * d, 1), (h * s, s, 1, 1)
    f = frost.Graph(io_data_type=torch.bfloat16, compute_data_type=torch.float32, target=target, name="fwd")
    q, k, v = (f.tensor(name=n, dim=(b, h, s, d), stride=bshd) for n in "qkv")
    o, lse = f.sdpa(q, k, v, attn_scale=d ** -0.5, generate_stats=True, use_causal_mask=causal)
    o.set_output(True)
    lse.set_output(True)
    g = frost.Graph(io_data_type=torch.bfloat16, compute_data_type=torch.float32, target=target, name="bwd")
    q, k, v, o, do = (g.tensor(name=n, dim=(b, h, s, d), stride=bshd) for n in ("q", "k", "v", "o", "dO"))
    lse = g.tensor(name="stats", dim=(b, h, s, 1), stride=st, data_type=torch.float32)
    for x in g.sdpa_backward(q, k, v, o, do, lse, attn_scale=d ** -0.5, use_causal_mask=causal):
        x.set_output(True)
    return f, g


a = t()
graphs = dict(zip(("fwd", "bwd"), pair(target, *cfg["shape"])))
t_declare = t() - a
plan = {}
for kind, g in graphs.items():
    a = t()
    if cfg["load"]:
        g.load_plan(f"{cfg['load']}/{kind}.plan")
    else:
        g.validate().build_plans(engine=cfg["engines"][kind])
    plan[kind] = t() - a
if cfg["save"]:
    for kind, g in graphs.items():
        g.save_plan(f"{cfg['save']}/{kind}.plan")
s = frost.cache.stats()
print("RESULT " + json.dumps({
    "target": target.name, "arch": target.arch, "import_torch": t_torch, "import_frost": t_frost,
    "target_discovery": t_target, "declare": t_declare, "plan_fwd": plan["fwd"], "plan_bwd": plan["bwd"],
    "plan_total": plan["fwd"] + plan["bwd"], "loader_imports": s["import_seconds"], "loads": s["load_seconds"],
    "compiles": s["compiles"] + s["worker_compiles"], "hits": s["hits"],
    "engines": {k: g.engine_name for k, g in graphs.items()},
    "kernels": {k: g.plan.adapter.kernel_names() for k, g in graphs.items()},
    "cutlass_imported": "cutlass" in sys.modules}))
"""


def child(cfg: dict, cache_dir: Path, tree: Path, bytecode: bool) -> dict:
    env = dict(
        os.environ,
        FROST_CACHE_DIR=str(cache_dir),
        PYTHONPATH=os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]),
    )
    env.pop("FROST_CACHE_DISABLE", None)
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(cfg)],
        env=env,
        cwd=str(tree),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"plan_time child failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    out = json.loads(line[len("RESULT ") :])
    return {**out, "plan_frost": out["plan_total"] - out["loader_imports"] - out["loads"], "process_wall": wall}


ROWS = [
    ("import torch (caller's)", "import_torch"),
    ("import frost", "import_frost"),
    ("target discovery", "target_discovery"),
    ("declare the pair", "declare"),
    ("plan fwd", "plan_fwd"),
    ("plan bwd", "plan_bwd"),
    ("plan fwd+bwd", "plan_total"),
    ("  of which tvm_ffi import", "loader_imports"),
    ("  of which artifact loads", "loads"),
    ("  the rest (frost)", "plan_frost"),
    ("process wall", "process_wall"),
]


def _fmt(v: float) -> str:
    return f"{v:8.2f} s " if v >= 1.0 else f"{v * 1e3:8.1f} ms"


def table(res: dict) -> str:
    cold, warm, pf = res["cold"], res["warm"], res["plan_file"]

    def med(runs, k):
        return statistics.median(r[k] for r in runs)

    cols = ["cold", f"warm median ({len(warm)})", "warm min", f"plan file median ({len(pf)})"]
    lines = [
        f"plan time, fwd+bwd pair {res['workload']} on {cold['target']} ({cold['arch']})",
        f"engines: {cold['engines']['fwd']} + {cold['engines']['bwd']}",
        f"{'':28}" + "".join(f"{c:>22}" for c in cols),
    ]
    for label, k in ROWS:
        vals = [cold[k], med(warm, k), min(r[k] for r in warm), med(pf, k) if pf else float("nan")]
        lines.append(f"{label:28}" + "".join(f"{_fmt(v):>22}" for v in vals))
    for label, k in (("kernels compiled", "compiles"), ("kernels loaded from disk", "hits")):
        vals = [cold[k], max(r[k] for r in warm), min(r[k] for r in warm), max((r[k] for r in pf), default=0)]
        lines.append(f"{label:28}" + "".join(f"{v:>22}" for v in vals))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="auto", help="auto (this GPU) or a fake target: A100, H200, B200, RTX5090")
    ap.add_argument("--repeats", type=int, default=5, help="warm runs (and plan-file runs)")
    ap.add_argument("--shape", default="4,2048,16,128", help="B,S,H,D of the pair (bf16, BSHD)")
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--engine-fwd", default=None, help="force a forward engine (default: the ranking's pick)")
    ap.add_argument("--engine-bwd", default=None)
    ap.add_argument("--no-bytecode", action="store_true", help="keep PYTHONDONTWRITEBYTECODE as the caller set it")
    ap.add_argument("--json", action="store_true", help="print the raw runs as JSON instead of a table")
    a = ap.parse_args(argv)
    b, s, h, d = (int(x) for x in a.shape.split(","))
    causal = not a.no_causal
    cfg = {
        "target": a.target,
        "shape": [b, s, h, d, causal],
        "engines": {"fwd": a.engine_fwd, "bwd": a.engine_bwd},
        "save": None,
        "load": None,
    }
    bytecode = not a.no_bytecode
    with tempfile.TemporaryDirectory(prefix="frost-plan-time-") as tmp:
        tmp = Path(tmp)
        tree = tmp / "tree"
        shutil.copytree(ROOT / "frost", tree / "frost", ignore=shutil.ignore_patterns("__pycache__"))
        plans = tmp / "plans"
        plans.mkdir()
        cold = child({**cfg, "save": str(plans)}, tmp / "cache", tree, bytecode)
        warm = [child(cfg, tmp / "cache", tree, bytecode) for _ in range(a.repeats)]
        pf = [child({**cfg, "load": str(plans)}, tmp / f"empty{i}", tree, bytecode) for i in range(a.repeats)]
    res = {
        "workload": f"bf16 B{b} S{s} H{h} D{d}{' causal' if causal else ''} BSHD",
        "cold": cold,
        "warm": warm,
        "plan_file": pf,
        "warm_plan_total_median_s": statistics.median(r["plan_total"] for r in warm),
    }
    print(json.dumps(res, indent=1) if a.json else table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
