"""Quick H200 timing of the SM90 forward: frost vs FlashAttention-4 (flash_attn.cute) vs cuDNN, same run.

bf16, B*S = 16384 tokens, hidden 2048 (H = 2048/D), BSHD tensors. TFLOP/s =
4*B*H*S*S*D (halved when causal) / median time; medians of CUDA-event timed
loops. Several frost knob sets can be timed side by side:

    python benchmarks/sm90_fwd_quick.py --d 128 --s 4096,16384 --causal 0,1 \
        --variants '[{}, {"persistent": false}]'
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch

from quick_problem import bshd_problem, timed

TEMPLATE = "frost.engines.sm90.sdpa_fwd"


def frost_params(d, causal, knobs, sm_count):
    from frost.engines.sm90.sdpa_fwd_params import Sm90FwdParams, default_knobs

    k = default_knobs(d, d, sm_count=sm_count)
    k.update(knobs)
    return Sm90FwdParams(
        dtype="bf16",
        head_dim=d,
        head_dim_v=d,
        num_heads_q=2048 // d,
        num_heads_kv=2048 // d,
        has_lse=True,
        has_window_right=causal,
        **k,
    )


def smoke(kernels):
    """Each benchmark kernel on a small ragged problem vs the reference math."""
    from frost.adapters.reference_math import RefArgs, sdpa_fwd_reference

    for (d, causal, var), ck in kernels.items():
        h = 2048 // d
        torch.manual_seed(0)
        b, s = 2, 333
        q, k, v = (torch.randn(b, s, h, d, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        o = torch.full_like(q, float("nan"))
        lse = torch.full((b, h, s), float("nan"), dtype=torch.float32, device="cuda")
        scale = 1.0 / math.sqrt(d)
        ck(q, k, v, o, lse, scale, *([0] if causal else []), torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        ro, rl = sdpa_fwd_reference(q, k, v, RefArgs(scale, window_right=0 if causal else None))
        err = ((o.float() - ro).norm() / ro.norm()).item()
        lerr = (lse - rl).abs().max().item()
        print(
            f"# smoke d={d} causal={causal} {var}: o rel err {err:.2e}, lse max err {lerr:.2e}, "
            f"nan {torch.isnan(o).sum().item()}",
            flush=True,
        )


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", default="128")
    ap.add_argument("--s", default="4096,16384")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--variants", default="[{}]", help="JSON list of knob overrides for frost")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument(
        "--precompile-tests",
        action="store_true",
        help="also compile frost.testing.cases' SM90 forward cases in the same worker pool",
    )
    ap.add_argument("--smoke", action="store_true", help="small correctness check of each frost kernel first")
    ap.add_argument("--repeat", type=int, default=1, help="time every implementation this many rounds, interleaved")
    a = ap.parse_args(argv)
    ds = [int(x) for x in a.d.split(",")]
    ss = [int(x) for x in a.s.split(",")]
    cs = [bool(int(x)) for x in a.causal.split(",")]
    variants = json.loads(a.variants)
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, sms {sm_count}", flush=True)

    from frost.engines.sdpa_args import CanonicalCall
    from frost.compiler.workers import compile_many

    specs = [(TEMPLATE, frost_params(d, c, v, sm_count)) for d in ds for c in cs for v in variants]
    extra = []
    if a.precompile_tests:
        from frost.testing.cases import SM90_FWD_CASES, sm90_params

        extra = [(TEMPLATE, sm90_params(c, sm_count)) for c in SM90_FWD_CASES]
    t0 = time.perf_counter()
    cks = compile_many(specs + extra, "sm_90a")
    kernels = {
        (s[1].head_dim, s[1].has_window_right, json.dumps(v, sort_keys=True)): CanonicalCall(ck, s[1])
        for s, ck, v in zip(specs, cks, [v for d in ds for c in cs for v in variants])
    }
    print(f"# compiled {len(specs) + len(extra)} frost kernels in {time.perf_counter() - t0:.1f}s", flush=True)
    if a.smoke:
        smoke(kernels)

    fa4 = None
    if not a.no_peers:
        try:
            from flash_attn.cute import flash_attn_func as fa4
        except Exception as e:  # pragma: no cover
            print(f"# FA4 unavailable: {e}")
    rows = []
    for d in ds:
        h = 2048 // d
        for s in ss:
            b = 16384 // s
            for causal in cs:
                q, k, v, o, lse, scale, flops = bshd_problem(b, s, h, d, causal)
                stream = torch.cuda.current_stream().cuda_stream
                res = {}
                fns = {}
                ref = None
                if fa4 is not None:
                    try:

                        def f_fa4(q=q, k=k, v=v):
                            return fa4(q, k, v, softmax_scale=scale, causal=causal)

                        ref = f_fa4()
                        ref = ref[0] if isinstance(ref, (tuple, list)) else ref
                        fns["fa4"] = f_fa4
                    except Exception as e:
                        print(f"# FA4 failed d={d} s={s} causal={causal}: {type(e).__name__}: {e}")
                if not a.no_peers:
                    try:
                        from torch.nn.attention import SDPBackend, sdpa_kernel
                        import torch.nn.functional as F

                        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

                        def f_cudnn():
                            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                                return F.scaled_dot_product_attention(qt, kt, vt, scale=scale, is_causal=causal)

                        f_cudnn()
                        fns["cudnn"] = f_cudnn
                    except Exception as e:
                        print(f"# cuDNN failed d={d} s={s} causal={causal}: {type(e).__name__}: {e}")
                for vi, var in enumerate(variants):
                    ck = kernels[(d, causal, json.dumps(var, sort_keys=True))]
                    args = [q, k, v, o, lse, scale] + ([0] if causal else []) + [stream]

                    def f_frost(ck=ck, args=args):
                        ck(*args)

                    f_frost()
                    torch.cuda.synchronize()
                    err = float("nan")
                    if ref is not None:
                        err = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
                    fns[f"frost{vi}"] = f_frost
                    res[f"err{vi}"] = err
                rounds = {key: [] for key in fns}
                for _ in range(a.repeat):
                    for key, fn in fns.items():
                        rounds[key].append(timed(fn))
                for key, ts in rounds.items():
                    res[key] = statistics.median(ts)
                spread = {key: (max(ts) - min(ts)) / min(ts) for key, ts in rounds.items() if len(ts) > 1}
                line = [f"d={d:3d} s={s:5d} {'causal' if causal else 'nc    '}"]
                for key in ["fa4", "cudnn"] + [f"frost{i}" for i in range(len(variants))]:
                    if key in res:
                        line.append(f"{key} {res[key]:7.3f}ms {flops / res[key] / 1e9:6.1f}TF")
                for i in range(len(variants)):
                    t = res[f"frost{i}"]
                    r = [f"v{i}"]
                    if "fa4" in res:
                        r.append(f"x{res['fa4'] / t:.3f}fa4")
                    if "cudnn" in res:
                        r.append(f"x{res['cudnn'] / t:.3f}cudnn")
                    r.append(f"err {res[f'err{i}']:.1e}")
                    line.append(" ".join(r))
                if spread:
                    line.append("spread " + " ".join(f"{k}:{v * 100:.1f}%" for k, v in spread.items()))
                print(" | ".join(line), flush=True)
                rows.append(res)
                del q, k, v, o, lse, fns
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
