"""Quick H200 timing of the wgmma backward chain against FlashAttention-4's backward, in one run.

bf16, B*S = 16384 tokens, hidden 2048 (H = 2048/D), BSHD tensors. TFLOP/s = 2.5 x the forward FLOPs of
design.md / median time (CUDA-event timed loops). frost times its whole chain (preprocess, main kernel, dQ
convert); FA4 times `torch.autograd.grad` of its output (its own three kernels). Knob sets of the wgmma
backward can be timed side by side, and the mma.sync chain with `--sm80`:

    python benchmarks/sm90_bwd_quick.py --d 64,128 --s 4096,16384 --causal 0,1 --variants '[{}, {"tile_m": 128}]'

A variant may also set `deterministic` (a feature, not a knob), e.g. the deterministic orders side by side:

    python benchmarks/sm90_bwd_quick.py --causal 0 --variants \
        '[{}, {"deterministic": true}, {"deterministic": true, "det_order": "rotated"}]'

A variant the params reject for a problem (a rotated order under causal) is left out of that problem.
`--thd fixed,random` times frost bench's packed length mixes (FA4 through its varlen entry) instead of --s;
`uniform:S` packs 16384 / S sequences of S tokens (a dense batch's shape).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch

from frost.bench.flops import sdpa_flops
from quick_problem import timed


def chain_for(params_list, target):
    """One maker per params: given named canonical tensors, it returns a callable running the whole chain."""
    from frost.testing.bwd_chain import compile_chains, workspace_views

    out = []
    for chain in compile_chains(params_list, target):

        def make(t, scalars, chain=chain):
            views = workspace_views(chain.p, t, poison=False)

            def run():
                chain(t, scalars, views)

            return run

        out.append(make)
    return out


class _Problem:
    """One timed problem: dense B x S (16384 tokens) or a packed length mix; bf16 tensors on the GPU, FLOPs
    summed per sequence by design.md's convention."""

    def __init__(self, lens, dense_b, h, hk, d, dv, causal):
        torch.manual_seed(0)
        self.lens, self.scale, self.causal = lens, 1.0 / math.sqrt(d), causal
        self.h, self.d, self.dv = h, d, dv
        if dense_b:
            b, s = dense_b, lens[0]
            lead = (b, s)
            self.label, self.cu, self.max_len = f"s={s:5d}", None, s
        else:
            lead = (sum(lens),)
            cu = [0]
            for n in lens:
                cu.append(cu[-1] + n)
            self.cu = torch.tensor(cu, dtype=torch.int32, device="cuda")
            self.max_len = max(lens)
            self.label = f"thd[{len(lens)}]"
        self.q = torch.randn(*lead, h, d, dtype=torch.bfloat16, device="cuda")
        self.k = torch.randn(*lead, hk, d, dtype=torch.bfloat16, device="cuda")
        self.v = torch.randn(*lead, hk, dv, dtype=torch.bfloat16, device="cuda")
        self.do = torch.randn(*lead, h, dv, dtype=torch.bfloat16, device="cuda")

    def flops(self, causal):
        return sum(
            sdpa_flops(heads=self.h, d_qk=self.d, d_v=self.dv, causal=causal, direction="bwd", batch=1, seqlen_q=n)
            for n in self.lens
        )


def _problem(shape, h, hk, d, dv, causal):
    kind, val = shape
    if kind == "bshd":
        return _Problem([val] * (16384 // val), 16384 // val, h, hk, d, dv, causal)
    from frost.bench.workloads import DEFAULT_THD_LENGTHS, random_mix

    if val.startswith("uniform"):  # uniform:S, 16384 / S sequences of S (a dense batch's shape, packed)
        n = int(val.split(":")[1])
        lens = (n,) * (16384 // n)
    else:
        lens = DEFAULT_THD_LENGTHS if val == "fixed" else random_mix(16384, 8192, 0)
    return _Problem(list(lens), 0, h, hk, d, dv, causal)


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def fa4_call(fa4, fa4_varlen, pr, q, k, v, **kw):
    """FA4's forward on the problem (dense or varlen), with its autograd backward behind it."""
    if pr.cu is None:
        return fa4(q, k, v, softmax_scale=pr.scale, causal=pr.causal, **kw)
    return fa4_varlen(
        q,
        k,
        v,
        cu_seqlens_q=pr.cu,
        cu_seqlens_k=pr.cu,
        max_seqlen_q=pr.max_len,
        max_seqlen_k=pr.max_len,
        softmax_scale=pr.scale,
        causal=pr.causal,
        **kw,
    )


def _args(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", default="128")
    ap.add_argument("--s", default="4096,16384")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--hkv", default="", help="kv heads (GQA); default = query heads")
    ap.add_argument("--dv", default="", help="V's head dim (e.g. 128 with --d 192); default = d")
    ap.add_argument(
        "--variants", default="[{}]", help="JSON list of knob overrides for the wgmma backward (and `deterministic`)"
    )
    ap.add_argument("--sm80", action="store_true", help="also time the mma.sync chain")
    ap.add_argument("--reps", type=int, default=15, help="timed samples per implementation (median reported)")
    ap.add_argument(
        "--thd",
        default="",
        help="packed batches instead of dense: fixed, random or both "
        "(frost bench's length mixes over 16384 tokens); --s is then ignored",
    )
    return ap.parse_args(argv)


def _chain_params(a, target, ds, cs, variants):
    """(keys, params) of every chain to time: (d, causal, variant name) and its params, per head dim, mask and
    variant (those the params reject left out, with a note), then the mma.sync chain with --sm80."""
    from frost.engines.sm90.sdpa_bwd_knobs import default_knobs
    from frost.engines.sm90.sdpa_bwd_params import Sm90BwdParams, validate
    from frost.errors import TemplateParamsError

    keys, params = [], []
    for d in ds:
        h = 2048 // d
        hk = int(a.hkv) if a.hkv else h
        for c in cs:
            for vi, var in enumerate(variants):
                knobs = {k: v for k, v in var.items() if k != "deterministic"}
                p = Sm90BwdParams(
                    dtype="bf16",
                    head_dim=d,
                    head_dim_v=_dv_of(a, d),
                    num_heads_q=h,
                    num_heads_kv=hk,
                    has_window_right=c,
                    is_thd=bool(a.thd),
                    deterministic=bool(var.get("deterministic", False)),
                    **default_knobs(d, _dv_of(a, d), banded=c, packed=bool(a.thd), sm_count=target.sm_count, **knobs),
                )
                try:
                    validate(p)
                except TemplateParamsError as e:
                    print(f"# d={d} causal={int(c)} v{vi} left out: {e}", flush=True)
                    continue
                keys.append((d, c, f"v{vi}"))
                params.append(p)
            if a.sm80:
                from frost.engines.sm80.sdpa_bwd_knobs import default_knobs as k80
                from frost.engines.sm80.sdpa_bwd_params import Sm80BwdParams

                keys.append((d, c, "sm80"))
                params.append(
                    Sm80BwdParams(
                        family="sm80",
                        dtype="bf16",
                        head_dim=d,
                        head_dim_v=_dv_of(a, d),
                        num_heads_q=h,
                        num_heads_kv=hk,
                        has_window_right=c,
                        is_thd=bool(a.thd),
                        **k80("sm80", d, _dv_of(a, d)),
                    )
                )
    return keys, params


def _dv_of(a, d):
    return int(a.dv) if a.dv else d


def _peer():
    """FA4's dense and varlen entries, or (None, None) with a note."""
    try:
        from flash_attn.cute import flash_attn_func as fa4
        from flash_attn.cute import flash_attn_varlen_func as fa4_varlen
    except Exception as e:  # pragma: no cover
        fa4 = fa4_varlen = None
        print(f"# FA4 unavailable: {e}")
    return fa4, fa4_varlen


def _time_peer(fa4, fa4_varlen, pr, d, c, reps, res, grads):
    """Time FA4's backward on the problem into `res` / `grads`; returns (O, LSE) for frost's chains: FA4's, or
    the float reference's where FA4 is missing or fails at this shape."""
    peer = fa4 is not None
    if peer:
        qr, kr, vr = (x.clone().requires_grad_() for x in (pr.q, pr.k, pr.v))
        out = _first(fa4_call(fa4, fa4_varlen, pr, qr, kr, vr))

        def f_fa4(out=out, qr=qr, kr=kr, vr=vr, do=pr.do):
            return torch.autograd.grad(out, (qr, kr, vr), do, retain_graph=True)

        try:
            grads["fa4"] = f_fa4()
        except Exception as e:  # FA4 does not build every shape (its D=112 80-row backward)
            print(f"# FA4 failed at d={d} causal={c}: {type(e).__name__}: {str(e).splitlines()[-1]}")
            peer = False
    if peer:
        res["fa4"] = timed(f_fa4, reps=reps)
        o, lse = fa4_call(fa4, fa4_varlen, pr, pr.q, pr.k, pr.v, return_lse=True)[:2]
        lse = lse.contiguous()
    else:  # O and LSE from the float reference
        from frost.adapters.reference_math import RefArgs, sdpa_fwd_reference

        o, lse = sdpa_fwd_reference(
            pr.q, pr.k, pr.v, RefArgs(pr.scale, cu_seqlens_q=pr.cu, cu_seqlens_kv=pr.cu, window_right=0 if c else None)
        )
        o = o.to(pr.q.dtype)
    return o, lse


def _time_chains(pr, chains, o, lse, c, reps, res, grads):
    """Time each of frost's chains (`chains`: (name, maker)) on the problem into `res` / `grads`."""
    for name, make in chains:
        t = dict(
            q=pr.q,
            k=pr.k,
            v=pr.v,
            o=o,
            do=pr.do,
            lse=lse,
            dq=torch.empty_like(pr.q),
            dk=torch.empty_like(pr.k),
            dv=torch.empty_like(pr.v),
        )
        sc = dict(softmax_scale=pr.scale, **({"window_right": 0} if c else {}))
        if pr.cu is not None:
            t.update(cu_seqlens_q=pr.cu, cu_seqlens_kv=pr.cu)
            sc.update(max_seqlen_q=pr.max_len, max_seqlen_kv=pr.max_len)
        run = make(t, sc)
        run()
        torch.cuda.synchronize()
        grads[name] = (t["dq"].clone(), t["dk"].clone(), t["dv"].clone())
        res[name] = timed(run, reps=reps)


def _report(pr, d, h, hk, c, res, grads):
    """One line per problem: each implementation's time and TFLOP/s, then frost's speed-up over FA4 and its
    gradients' relative errors against FA4's."""
    line = [f"d={d:3d} {pr.label} h={h}/{hk} {'causal' if c else 'nc    '}"]
    for name, ms in res.items():
        line.append(f"{name} {ms:7.3f}ms {pr.flops(c) / ms / 1e9:6.1f}TF")
    if "fa4" in res:
        for name, ms in res.items():
            if name != "fa4":
                errs = [
                    ((g.float() - r.float()).norm() / r.float().norm()).item()
                    for g, r in zip(grads[name], grads["fa4"])
                ]
                line.append(f"{name} x{res['fa4'] / ms:.3f}fa4 err vs fa4 " + "/".join(f"{e:.1e}" for e in errs))
    print(" | ".join(line), flush=True)


def main(argv=None):
    a = _args(argv)
    from frost.target import discover_target

    target = discover_target()
    ds = [int(x) for x in a.d.split(",")]
    ss = [int(x) for x in a.s.split(",")]
    cs = [bool(int(x)) for x in a.causal.split(",")]
    variants = json.loads(a.variants)
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    keys, params = _chain_params(a, target, ds, cs, variants)
    t0 = time.perf_counter()
    makers = dict(zip(keys, chain_for(params, target)))
    print(f"# compiled {len(params)} chains in {time.perf_counter() - t0:.1f}s", flush=True)
    fa4, fa4_varlen = _peer()
    shapes = [("thd", m) for m in a.thd.split(",")] if a.thd else [("bshd", s) for s in ss]
    for d in ds:
        h = 2048 // d
        hk = int(a.hkv) if a.hkv else h
        for shape in shapes:
            for c in cs:
                pr = _problem(shape, h, hk, d, _dv_of(a, d), c)
                res, grads = {}, {}
                o, lse = _time_peer(fa4, fa4_varlen, pr, d, c, a.reps, res, grads)
                chains = [(key[2], makers[key]) for key in keys if key[0] == d and key[1] == c]
                _time_chains(pr, chains, o, lse, c, a.reps, res, grads)
                _report(pr, d, h, hk, c, res, grads)
                del pr, o, lse, grads
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
