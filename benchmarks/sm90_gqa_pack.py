"""H200 timing of the SM90 forward's GQA packing: packed vs unpacked frost vs FlashAttention-4 (and cuDNN).

bf16, d=128, BSHD tensors. Decode-like rows (few queries against long keys,
bottom-right causal) are memory bound: besides TFLOP/s (design.md's FLOPs,
causal rows counted as the kept fraction of the Sq x Skv rectangle) each row
gives the K+V read rate in GB/s. The anchor rows are GQA 32:8, B=4, S=4096.

    python benchmarks/sm90_gqa_pack.py            # every row
    python benchmarks/sm90_gqa_pack.py --rows decode
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch

TEMPLATE = "frost.engines.sm90.sdpa_fwd"

# (label, B, Hq, Hkv, Sq, Skv, causal); causal means bottom-right (aligned to the last key)
DECODE = [("decode", 8, 32, 4, sq, skv, True) for skv in (8192, 32768) for sq in (1, 16, 128)]
ANCHORS = [("anchor", 4, 32, 8, 4096, 4096, c) for c in (False, True)]


def timed(fn):
    from quick_problem import timed as quick_timed

    return quick_timed(fn, inner=50, min_sample_ms=1.0)


def params(hq, hkv, causal, pack, sm_count, tile_m=None):
    from frost.engines.sm90.sdpa_fwd_params import Sm90FwdParams, default_knobs

    k = default_knobs(128, 128, sm_count=sm_count)
    if tile_m:
        k["tile_m"] = tile_m
    return Sm90FwdParams(
        dtype="bf16",
        head_dim=128,
        head_dim_v=128,
        num_heads_q=hq,
        num_heads_kv=hkv,
        has_lse=True,
        has_window_right=causal,
        bottom_right=causal,
        pack_gqa=pack,
        **k,
    )


def flops(b, hq, sq, skv, causal, d=128):
    kept = sq * skv
    if causal:  # bottom-right: query i sees keys <= i + skv - sq
        kept = sum(min(skv, i + skv - sq + 1) for i in range(sq)) if sq <= 4096 else sq * skv / 2
    return 4 * b * hq * kept * d


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="decode,anchor")
    ap.add_argument("--small-tile", action="store_true", help="also time packed frost with tile_m=64")
    ap.add_argument(
        "--precompile-tests",
        action="store_true",
        help="also compile the SM90 forward kernel tests' kernels (into the disk cache), same pool",
    )
    a = ap.parse_args(argv)
    rows = [r for r in DECODE + ANCHORS if r[0] in a.rows.split(",")]
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, sms {sm}", flush=True)
    from frost.engines.sdpa_args import CanonicalCall
    from frost.compiler.workers import compile_many

    variants = {"packed": dict(pack=True), "unpacked": dict(pack=False)}
    if a.small_tile:
        variants["packed_m64"] = dict(pack=True, tile_m=64)
    keys = sorted({(hq, hkv, c, v) for _, _, hq, hkv, _, _, c in rows for v in variants})
    specs = [(TEMPLATE, params(hq, hkv, c, sm_count=sm, **variants[v])) for hq, hkv, c, v in keys]
    extra = []
    if a.precompile_tests:
        from frost.testing import cases as tc

        cases = tc.SM90_FWD_CASES + tc.SM90_PACK_GQA_CASES + [tc.unpacked(c) for c in tc.SM90_PACK_GQA_TWINS]
        extra = [(TEMPLATE, tc.sm90_params(c, sm)) for c in cases]
    t0 = time.perf_counter()
    compiled = compile_many(specs + extra, "sm_90a")
    print(f"# compiled {len(specs) + len(extra)} kernels in {time.perf_counter() - t0:.1f}s", flush=True)
    cks = {key: CanonicalCall(ck, s[1]) for key, s, ck in zip(keys, specs, compiled)}
    try:
        from flash_attn.cute import flash_attn_func as fa4
    except Exception as e:  # pragma: no cover
        fa4 = None
        print(f"# FA4 unavailable: {e}")

    for label, b, hq, hkv, sq, skv, causal in rows:
        torch.manual_seed(0)
        d = 128
        q = torch.randn(b, sq, hq, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(b, skv, hkv, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(b, skv, hkv, d, dtype=torch.bfloat16, device="cuda")
        o = torch.empty_like(q)
        lse = torch.empty(b, hq, sq, dtype=torch.float32, device="cuda")
        scale = 1.0 / math.sqrt(d)
        stream = torch.cuda.current_stream().cuda_stream
        fns, outs = {}, {}
        if fa4 is not None:
            try:

                def f_fa4(q=q, k=k, v=v):
                    return fa4(q, k, v, softmax_scale=scale, causal=causal)

                r = f_fa4()
                outs["fa4"] = (r[0] if isinstance(r, (tuple, list)) else r).clone()
                fns["fa4"] = f_fa4
            except Exception as e:
                print(f"# FA4 failed: {type(e).__name__}: {e}")
        if sq == skv:
            try:
                from torch.nn.attention import SDPBackend, sdpa_kernel
                import torch.nn.functional as F

                qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

                def f_cudnn():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return F.scaled_dot_product_attention(
                            qt, kt, vt, scale=scale, is_causal=causal, enable_gqa=True
                        )

                f_cudnn()
                fns["cudnn"] = f_cudnn
            except Exception as e:
                print(f"# cuDNN failed: {type(e).__name__}: {str(e)[:200]}")
        for var in variants:
            ck = cks[(hq, hkv, causal, var)]
            args = [q, k, v, o, lse, scale] + ([0] if causal else []) + [stream]

            def f_frost(ck=ck, args=args):
                ck(*args)

            f_frost()
            torch.cuda.synchronize()
            outs[var] = o.clone()
            fns[var] = f_frost
        res = {key: timed(fn) for key, fn in fns.items()}
        fl = flops(b, hq, sq, skv, causal)
        kv_bytes = 2 * b * skv * hkv * d * 2
        line = [f"{label} B={b} H={hq}:{hkv} Sq={sq} Skv={skv} {'causal' if causal else 'nc'}"]
        for key, ms in res.items():
            line.append(f"{key} {ms * 1e3:8.1f}us {fl / ms / 1e9:6.1f}TF {kv_bytes / ms / 1e6:6.0f}GB/s")
        if "fa4" in res:
            line.append("packed/fa4 x%.2f" % (res["fa4"] / res["packed"]))
        line.append("packed/unpacked x%.2f" % (res["unpacked"] / res["packed"]))
        ref = outs.get("fa4", outs["unpacked"])
        errs = {k2: ((x.float() - ref.float()).norm() / ref.float().norm()).item() for k2, x in outs.items()}
        line.append("err " + " ".join(f"{k2}:{e:.1e}" for k2, e in errs.items()))
        print(" | ".join(line), flush=True)
        del q, k, v, o, lse, fns
    return 0


if __name__ == "__main__":
    sys.exit(main())
