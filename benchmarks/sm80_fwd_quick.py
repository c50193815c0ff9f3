"""Quick timing of the mma.sync forward on the local GPU against FlashAttention-2 (torch's flash backend).

bf16, B*S = 16384 tokens, hidden 2048 (H = 2048/D), BSHD tensors, LSE written.
TFLOP/s = 4*B*H*S*S*D (halved when causal) / median time of CUDA-event timed
loops; the ratio is frost time vs FA2 time measured in the same run. Several
knob sets can be timed side by side:

    python benchmarks/sm80_fwd_quick.py --d 64,128 --s 4096 --causal 0,1 \
        --variants '[{}, {"num_stages": 1}, {"tile_n": 32}]'
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from quick_problem import bshd_problem, timed

TEMPLATE = "frost.engines.sm80.sdpa_fwd"


def frost_params(d, causal, knobs, family="sm80"):
    from frost.engines.sm80.sdpa_fwd_params import Sm80FwdParams, default_knobs

    knobs = dict(knobs)
    family = knobs.pop("family", family)
    k = default_knobs(family, d, d, "bf16")
    k.update(knobs)
    return Sm80FwdParams(
        family=family,
        dtype="bf16",
        head_dim=d,
        head_dim_v=d,
        num_heads_q=2048 // d,
        num_heads_kv=2048 // d,
        has_lse=True,
        has_window_right=causal,
        **k,
    )


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--s", default="4096")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--variants", default="[{}]", help="JSON list of knob overrides (may set family)")
    ap.add_argument("--arch", default=None, help="compile arch (default: the device's)")
    a = ap.parse_args(argv)
    ds = [int(x) for x in a.d.split(",")]
    ss = [int(x) for x in a.s.split(",")]
    cs = [bool(int(x)) for x in a.causal.split(",")]
    variants = json.loads(a.variants)
    from frost.target import discover_target
    from frost.engines.sdpa_args import CanonicalCall
    from frost.compiler.workers import compile_many

    arch = a.arch or discover_target().arch
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, arch {arch}", flush=True)
    keys, specs = [], []
    for d in ds:
        for c in cs:
            for vi, v in enumerate(variants):
                try:
                    specs.append((TEMPLATE, frost_params(d, c, v)))
                    keys.append((d, c, vi))
                except Exception as e:
                    print(f"# variant {v} d={d}: {e}")
    t0 = time.perf_counter()
    kernels = {k: CanonicalCall(ck, p) for k, (_, p), ck in zip(keys, specs, compile_many(specs, arch))}
    print(f"# compiled {len(specs)} frost kernels in {time.perf_counter() - t0:.1f}s", flush=True)
    for (d, c, vi), (_, p) in zip(keys, specs):
        if c == cs[0] and d == ds[0]:
            print(f"# v{vi}: {p.family} m{p.tile_m} n{p.tile_n} s{p.num_stages} w{p.num_warps}")

    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    rows = []
    for d in ds:
        h = 2048 // d
        for s in ss:
            b = 16384 // s
            for causal in cs:
                q, k, v, o, lse, scale, flops = bshd_problem(b, s, h, d, causal)
                stream = torch.cuda.current_stream().cuda_stream
                qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

                def f_fa2():
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        return F.scaled_dot_product_attention(qt, kt, vt, scale=scale, is_causal=causal)

                ref = f_fa2().transpose(1, 2).float()
                res = {"fa2": timed(f_fa2)}
                line = [
                    f"d={d:3d} s={s:5d} {'causal' if causal else 'nc    '}",
                    f"fa2 {res['fa2']:7.3f}ms {flops / res['fa2'] / 1e9:6.1f}TF",
                ]
                for vi in range(len(variants)):
                    ck = kernels.get((d, causal, vi))
                    if ck is None:
                        continue
                    args = [q, k, v, o, lse, scale] + ([0] if causal else []) + [stream]

                    def f_frost():
                        ck(*args)

                    f_frost()
                    torch.cuda.synchronize()
                    err = ((o.float() - ref).norm() / ref.norm()).item()
                    t = timed(f_frost)
                    res[f"v{vi}"] = t
                    line.append(f"v{vi} {t:7.3f}ms {flops / t / 1e9:6.1f}TF x{res['fa2'] / t:.3f} err {err:.1e}")
                print(" | ".join(line), flush=True)
                rows.append(res)
                del q, k, v, o, lse
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
