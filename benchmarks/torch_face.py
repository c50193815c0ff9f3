"""What the torch face costs over the raw graph API (GPU; prints a table).

    python3 benchmarks/torch_face.py [--batch 4 --seq 4096 --heads 16 --head-dim 128] [--json out.json]
    python3 benchmarks/torch_face.py --host-only      # section 2 alone (a minute, mostly compiles)

1. Forward+backward at 16k tokens (B=4, S=4096, H=16, D=128, bf16, BSHD memory, full and causal):
   `frost.torch_face.attention` under autograd (`torch.autograd.grad`, outputs and workspace allocated per
   call) against one forward and one backward `Graph.execute` on preallocated tensors. Medians of
   CUDA-event-timed loops; the ratio's target is within 3%.
2. Host time of one call on a tiny problem (1x1x128x64, causal), in one table: `attention` without
   autograd (the eager fast path, memoized: BHSD, with `return_lse`, BSHD with its transposes), the custom
   op through the dispatcher (forward and backward), `attention` under autograd (forward, and forward +
   `torch.autograd.grad`), and the raw graph API on preallocated tensors (`Graph.execute`, the
   positional `Graph.executor` and its `launch`, forward and forward + backward); microseconds until the
   calls returned, back to back, with the GPU drained before (target <= 20 us for the first row). The
   last column is the row's cost over the raw `Graph.execute` of the same direction(s).
   `benchmarks/torch_face_host.py` splits the same calls into their parts on the CPU.
3. Planning a new shape whose kernels are already compiled (milliseconds per plan).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import frost
import frost.torch_face as ft

BF16 = torch.bfloat16


def _bshd(b, s, h, d):
    return torch.randn(b, s, h, d, device="cuda", dtype=BF16)


def raw_graphs(q, k, v, causal: bool):
    """Forward and backward graphs on (B, S, H, D) tensors, planned by hand: (run_fwd, run_bwd, engines,
    launch_fwd), the last the forward through `Graph.executor(...).launch` (positional, pinned tensors)."""
    qb, kb, vb = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, S, D) views of BSHD memory
    ob, dob = torch.empty_like(qb), torch.randn_like(qb)
    lse = torch.empty(qb.shape[:3] + (1,), device="cuda", dtype=torch.float32)
    grads = [torch.empty_like(t) for t in (qb, kb, vb)]
    kw = dict(io_data_type=BF16, intermediate_data_type=torch.float32, compute_data_type=torch.float32)
    mask = {"diagonal_band_right_bound": 0} if causal else {}
    scale = q.shape[-1] ** -0.5
    fwd = frost.Graph(**kw)
    fq, fk, fv = (fwd.tensor_like(t, name=n) for t, n in ((qb, "q"), (kb, "k"), (vb, "v")))
    o, st = fwd.sdpa(fq, fk, fv, attn_scale=scale, generate_stats=True, **mask)
    o.set_output(True).set_dim(tuple(ob.shape)).set_stride(tuple(ob.stride()))
    st.set_output(True).set_dim(tuple(lse.shape)).set_stride(tuple(lse.stride()))
    fwd.validate().build_plans()
    bwd = frost.Graph(**kw)
    names = ("q", "k", "v", "o", "dO", "stats")
    tensors = (qb, kb, vb, ob, dob, lse)
    ports = [bwd.tensor_like(t, name=n) for n, t in zip(names, tensors)]
    dq, dk, dv = bwd.sdpa_backward(*ports, attn_scale=scale, **mask)
    for port, t in zip((dq, dk, dv), grads):
        port.set_output(True).set_dim(tuple(t.shape)).set_stride(tuple(t.stride()))
    bwd.validate().build_plans()
    ws_f = torch.empty(max(fwd.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
    ws_b = torch.empty(max(bwd.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
    fpack = {fq: qb, fk: kb, fv: vb, o: ob, st: lse}
    bpack = dict(zip(ports, tensors))
    bpack.update(zip((dq, dk, dv), grads))
    launch = fwd.executor((fq, fk, fv, o, st)).launch
    ftensors = (qb, kb, vb, ob, lse)
    return (
        (lambda: fwd.execute(fpack, ws_f)),
        (lambda: bwd.execute(bpack, ws_b)),
        (fwd.engine_name, bwd.engine_name),
        (lambda: launch(ftensors, ws_f)),
    )


def gpu_ms(fn, iters: int, repeats: int = 5) -> float:
    """Median over `repeats` of the mean CUDA-event time of `iters` back-to-back calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / iters)
    return statistics.median(samples)


def host_us(fn, calls: int) -> float:
    """Microseconds per call until the calls returned (the GPU drained first, the launch queue has room):
    the issue time of frost.bench's probe timer."""
    from frost.bench.timing import host_time_us

    return host_time_us(fn, calls, warmup=50)[1]


def throughput_rows(args) -> list[dict]:
    rows = []
    b, s, h, d = args.batch, args.seq, args.heads, args.head_dim
    for causal in (False, True):
        torch.manual_seed(0)
        q, k, v = _bshd(b, s, h, d), _bshd(b, s, h, d), _bshd(b, s, h, d)
        do = torch.randn_like(q)
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]

        def through_op():
            out = ft.attention(*leaves, causal=causal, layout="bshd")
            torch.autograd.grad(out, leaves, do)

        run_f, run_b, engines, _ = raw_graphs(q, k, v, causal)

        def raw():
            run_f()
            run_b()

        op_ms, raw_ms = gpu_ms(through_op, args.iters), gpu_ms(raw, args.iters)
        flops = 4 * b * h * s * s * d * 3.5 / (2 if causal else 1)  # forward + backward (2.5x)
        rows.append(
            {
                "problem": f"B{b} S{s} H{h} D{d} {'causal' if causal else 'full'}",
                "engines": engines,
                "op_ms": op_ms,
                "raw_ms": raw_ms,
                "ratio": op_ms / raw_ms,
                "op_tflops": flops / op_ms / 1e9,
                "raw_tflops": flops / raw_ms / 1e9,
            }
        )
    return rows


def host_rows(args) -> list[dict]:
    q, k, v, do = (_bshd(1, 128, 1, 64) for _ in range(4))
    qb, kb, vb, dob = (t.transpose(1, 2) for t in (q, k, v, do))
    leaves = [t.detach().requires_grad_(True) for t in (qb, kb, vb)]
    out, lse = torch.ops.frost.sdpa_fwd(qb, kb, vb, None, None, -1, 0, False, False)
    run_f, run_b, _, launch_f = raw_graphs(q, k, v, causal=True)

    def raw_fwd_bwd():
        run_f()
        run_b()

    calls = [  # (name, call, its raw reference: "fwd" or "fwd+bwd")
        ("attention eager (bhsd)", lambda: ft.attention(qb, kb, vb, causal=True), "fwd"),
        ("attention eager, return_lse", lambda: ft.attention(qb, kb, vb, causal=True, return_lse=True), "fwd"),
        ("attention eager, layout='bshd'", lambda: ft.attention(q, k, v, causal=True, layout="bshd"), "fwd"),
        (
            "torch.ops.frost.sdpa_fwd",
            lambda: torch.ops.frost.sdpa_fwd(qb, kb, vb, None, None, -1, 0, False, False),
            "fwd",
        ),
        (
            "torch.ops.frost.sdpa_bwd",
            lambda: torch.ops.frost.sdpa_bwd(dob, qb, kb, vb, out, lse, None, None, -1, 0, False, False),
            "bwd",
        ),
        ("attention under autograd (forward)", lambda: ft.attention(*leaves, causal=True), "fwd"),
        (
            "attention under autograd (fwd+bwd)",
            lambda: torch.autograd.grad(ft.attention(*leaves, causal=True), leaves, dob),
            "fwd+bwd",
        ),
        ("raw Graph.execute (forward)", run_f, "fwd"),
        ("raw Graph.execute (backward)", run_b, "bwd"),
        ("raw Graph.execute (fwd+bwd)", raw_fwd_bwd, "fwd+bwd"),
        ("raw Graph.executor(...).launch (forward)", launch_f, "fwd"),
    ]
    rows = [{"call": name, "host_us": host_us(fn, args.calls), "raw": raw} for name, fn, raw in calls]
    raw_us = {r["raw"]: r["host_us"] for r in rows if r["call"].startswith("raw Graph.execute (")}
    for r in rows:
        r["over_raw_us"] = r["host_us"] - raw_us[r["raw"]]
    return rows


def warm_plan_ms(args) -> dict:
    """Planning a new shape whose kernels are compiled: the plan-cache misses' time, per plan."""
    before = ft.plan_cache_info()
    b, s, h, d = args.batch, args.seq + 128, args.heads, args.head_dim  # a length no row above planned
    leaves = [_bshd(b, s, h, d).requires_grad_(True) for _ in range(3)]
    out = ft.attention(*leaves, causal=True, layout="bshd")
    torch.autograd.grad(out, leaves, torch.randn_like(out))
    torch.cuda.synchronize()
    after = ft.plan_cache_info()
    plans = after["misses"] - before["misses"]
    return {"plans": plans, "ms_per_plan": (after["plan_seconds"] - before["plan_seconds"]) * 1e3 / max(plans, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json", default=None, help="also write the rows here")
    ap.add_argument("--host-only", action="store_true", help="only the host-time table (section 2)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/torch_face.py needs a CUDA GPU")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    through, warm = [], {}
    if not args.host_only:
        through = throughput_rows(args)
        print(f"\n{'forward+backward':<30} {'engines':<36} {'op ms':>8} {'raw ms':>8} {'op/raw':>7} {'TFLOP/s':>8}")
        for r in through:
            print(
                f"{r['problem']:<30} {'/'.join(r['engines']):<36} {r['op_ms']:8.3f} {r['raw_ms']:8.3f} "
                f"{r['ratio']:7.3f} {r['op_tflops']:8.1f}"
            )
    host = host_rows(args)
    print(
        f"\n{'host time, 1x1x128x64 causal':<44} {'us/call':>8} {'over raw':>9}  (raw: Graph.execute of the "
        f"same direction)"
    )
    for r in host:
        print(f"{r['call']:<44} {r['host_us']:8.1f} {r['over_raw_us']:+9.1f}  ({r['raw']})")
    if args.host_only:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "host": host}, f, indent=1
                )
        return 0
    warm = warm_plan_ms(args)
    print(
        f"\nplanning a new shape with compiled kernels: {warm['ms_per_plan']:.2f} ms per plan ({warm['plans']} plans)"
    )
    info = ft.plan_cache_info()
    print(
        f"plans: {info['misses']} built ({info['plan_seconds'] * 1e3:.0f} ms in all, first compiles included), "
        f"{info['hits']} hits"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": torch.cuda.get_device_name(),
                    "torch": torch.__version__,
                    "throughput": through,
                    "host": host,
                    "warm_plan": warm,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
