"""Knob sweep of the mma.sync backward chain against FlashAttention-2 (torch's flash backend), one process.

bf16, hidden 2048 (H = 2048 / D), B*S = 16384 tokens, BSHD tensors. Each
problem's FA2 backward is timed once; every variant (knob overrides on top of
`default_knobs`) is compiled in parallel, then timed with frost.bench's event
timer. Ratio = FA2 time / frost time (>= 1 is faster than FA2).

    python benchmarks/sm80_bwd_sweep.py --d 64,128 --s 4096 --causal 0,1 --det 0 \
        --variants '{"64": [{}, {"fused_prefetch": false}], "128": [{}, {"tile_n": 64}]}'

`--ptx` compiles the main kernel of each variant for --arch (default sm_90a)
on the CPU and prints ptxas registers / spills instead (no GPU needed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MAIN = "frost.engines.sm80.sdpa_bwd"


def params(d: int, causal: bool, det: bool, knobs: dict, s: int = 4096, sm_count: int = 132):
    from frost.adapters.sm80_plan import planned_dq_splits
    from frost.engines.sm80.sdpa_bwd_knobs import default_knobs
    from frost.engines.sm80.sdpa_bwd_params import Sm80BwdParams

    knobs = dict(knobs)
    det = bool(knobs.pop("det", det))  # a variant may switch deterministic mode on
    k = default_knobs("sm80", d, d, "bf16")
    k.update(knobs)
    h = 2048 // d
    auto = k.get("dq_splits") == "auto"  # the count a plan picks for the problem and the GPU's SMs (0: turns)
    if auto:
        k["dq_splits"] = 0
    p = Sm80BwdParams(
        family="sm80",
        dtype="bf16",
        head_dim=d,
        head_dim_v=d,
        num_heads_q=h,
        num_heads_kv=h,
        has_window_right=causal,
        deterministic=det,
        **k,
    )
    if auto:
        k["dq_splits"] = planned_dq_splits(p, sm_count, max(16384 // s, 1), s, s)
        p = Sm80BwdParams(**{**p.model_dump(), **k})
    return p


def ptx_report(plist, arch: str) -> None:
    """ptxas -v of each main kernel: registers, spill bytes, and key instruction counts."""
    os.environ.setdefault("CUTE_DSL_KEEP", "ptx")
    from frost.compiler.compile import compile_kernel

    tmp = Path(tempfile.mkdtemp())
    for tag, p in plist:
        try:
            ck = compile_kernel(MAIN, p, arch)
        except Exception as e:  # one bad variant should not hide the others
            print(f"{tag}: compile failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        ptx = tmp / f"{ck.name}.ptx"
        ptx.write_text(ck.ptx or "")
        r = subprocess.run(
            ["ptxas", f"-arch={arch}", "-v", str(ptx), "-o", str(tmp / "k.cubin")], capture_output=True, text=True
        )
        info = " ".join(
            ln.split(":", 1)[-1].strip() for ln in r.stderr.splitlines() if "registers" in ln or "spill" in ln
        )
        counts = {
            k: (ck.ptx or "").count(v)
            for k, v in dict(mma="mma.sync", ldsm="ldmatrix", red="red.global.add", bar="bar.sync").items()
        }
        print(f"{tag}: {ck.name} {counts} | {info}", flush=True)


def timed(fn) -> float:
    from quick_problem import timed as quick_timed

    return quick_timed(fn, warmup=2, reps=10, inner=3)


def problem(d: int, s: int, causal: bool):
    import torch

    b, h = 16384 // s, 2048 // d
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = 1.0 / math.sqrt(d)
    flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
    return b, h, q, k, v, do, scale, flops


def fa2_time(q, k, v, do, causal, scale) -> tuple[float, object, object]:
    """FA2 backward (autograd through torch's flash SDPA) in ms, plus O and LSE of its forward."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale)
        ms = timed(lambda: torch.autograd.grad(out, (qt, kt, vt), do.transpose(1, 2), retain_graph=True))
    res = torch.ops.aten._scaled_dot_product_flash_attention(
        qt.detach(), kt.detach(), vt.detach(), 0.0, causal, False, scale=scale
    )
    return ms, res[0].transpose(1, 2), res[1].contiguous()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--s", default="4096")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--det", default="0")
    ap.add_argument(
        "--variants",
        default="{}",
        help='JSON {"64": [knobs, ...], "128": [...]} ([{}] when absent); "det": true in a variant '
        "switches deterministic mode on for it (with per-tile turns unless the variant sets "
        '"dq_splits"; "auto" is the count a plan would pick)',
    )
    ap.add_argument("--ptx", action="store_true", help="CPU: ptxas registers / spills of each main kernel")
    ap.add_argument("--arch", default=None)
    ap.add_argument("--out", default=None, help="directory for sweep.txt")
    a = ap.parse_args(argv)
    ds = [int(x) for x in a.d.split(",")]
    ss = [int(x) for x in a.s.split(",")]
    cs = [bool(int(x)) for x in a.causal.split(",")]
    dets = [bool(int(x)) for x in a.det.split(",")]
    variants = {int(k): v for k, v in json.loads(a.variants).items()}
    lines = []

    def log(msg):
        print(msg, flush=True)
        lines.append(msg)
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            Path(a.out, "sweep.txt").write_text("\n".join(lines) + "\n")

    import torch

    from frost.target import discover_target, fake_target

    target = discover_target() if torch.cuda.is_available() else fake_target("H200")  # --ptx runs on the CPU
    plist = []  # (tag, d, s, causal, det, knobs, params); params depend on S only through "dq_splits": "auto"
    for d in ds:
        for s in ss:
            for c in cs:
                for det in dets:
                    for vi, kn in enumerate(variants.get(d, [{}])):
                        try:
                            p = params(d, c, det, kn, s, target.sm_count)
                        except Exception as e:
                            log(f"# d{d} v{vi} {kn}: invalid: {e}")
                            continue
                        plist.append((f"d{d} s{s} c{int(c)} det{int(det)} v{vi}", d, s, c, det, kn, p))
    if a.ptx:
        ptx_report([(t, p) for t, *_, p in plist], a.arch or "sm_90a")
        return 0

    from frost.testing.bwd_chain import compile_chains, workspace_views

    if a.arch:
        target = a.arch
    log(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    t0 = time.perf_counter()
    chains = []
    try:
        chains = compile_chains([p for *_, p in plist], target)
    except Exception as e:
        log(f"# compile_many failed ({type(e).__name__}: {str(e)[:300]}); one by one")
        for *_, p in plist:
            try:
                chains.append(compile_chains([p], target)[0])
            except Exception as e2:
                log(f"# compile failed {p}: {str(e2)[:300]}")
                chains.append(None)
    log(f"# compiled {len(plist)} chains in {time.perf_counter() - t0:.0f}s")
    log("| D | S | causal | det | variant | frost ms | TFLOP/s | FA2 ms | FA2 TFLOP/s | FA2/frost |")
    log("|---|---|---|---|---|---|---|---|---|---|")
    for d in ds:
        for s in ss:
            for c in cs:
                b, h, q, k, v, do, scale, flops = problem(d, s, c)
                fa2_ms, o, lse = fa2_time(q, k, v, do, c, scale)
                for (tag, d2, s2, c2, det, kn, p), ch in zip(plist, chains):
                    if d2 != d or s2 != s or c2 != c or ch is None:
                        continue
                    t = dict(
                        q=q,
                        k=k,
                        v=v,
                        do=do,
                        o=o,
                        lse=lse,
                        dq=torch.empty_like(q),
                        dk=torch.empty_like(k),
                        dv=torch.empty_like(v),
                    )
                    scalars = dict(softmax_scale=scale)
                    if c:
                        scalars["window_right"] = 0
                    views = workspace_views(p, t, poison=False)
                    try:
                        ms = timed(lambda: ch(t, scalars, views))
                    except Exception as e:
                        log(f"# {tag} {kn}: run failed: {type(e).__name__}: {str(e)[:300]}")
                        continue
                    log(
                        f"| {d} | {s} | {int(c)} | {int(p.deterministic)} | {json.dumps(kn, separators=(',', ':'))} | "
                        f"{ms:.3f} | {flops / ms / 1e9:.0f} | {fa2_ms:.3f} | {flops / fa2_ms / 1e9:.0f} | "
                        f"{fa2_ms / ms:.3f} |"
                    )
                del q, k, v, do, o, lse
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
