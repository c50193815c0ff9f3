"""Host time of one execute on a tiny problem, split into its parts (GPU; prints a table).

    python3 benchmarks/host_time.py [--calls 500]

Rows: the compiled kernel called directly with the bound tensors (the TVM-FFI
call and launch), the binder alone, the adapter's execute on bound tensors
(argument gathering, stream lookup and the kernel call), and Graph.execute end
to end; forward (the default engine and the mma.sync one) and backward,
1x1x128x64 bf16 causal. Per call over back-to-back calls: wall clock until the
GPU drained, and in parentheses until the last call returned (host time alone,
while the launch queue has room). A last line times the current-stream lookup.
The SM90 and mma.sync forwards side by side show what TMA descriptors add to a
call (the same cost, in run 4).
"""

from __future__ import annotations

import argparse

import torch

import frost


def per_call_us(fn, calls: int) -> tuple[float, float]:
    """(wall, issue) microseconds per call: frost.bench's probe timer."""
    from frost.bench.timing import host_time_us

    return host_time_us(fn, calls, warmup=50)


def tiny_graphs(B=1, H=1, S=128, D=64, fwd_engine=None, bwd_engine=None, causal=True):
    """A planned forward and backward of one tiny bf16 problem (BSHD storage): ((graph, pack, workspace) of
    each); the packs map the graphs' tensors to the CUDA tensors they bind."""
    dt = torch.bfloat16
    mk = lambda: torch.randn(B, S, H, D, device="cuda", dtype=dt).permute(0, 2, 1, 3)  # noqa: E731
    q_t, k_t, v_t, do_t = mk(), mk(), mk(), mk()
    o_t, lse_t = torch.empty_like(q_t), torch.empty(B, H, S, 1, device="cuda")
    dq_t, dk_t, dv_t = torch.empty_like(q_t), torch.empty_like(k_t), torch.empty_like(v_t)
    kw = dict(io_data_type=dt, intermediate_data_type=torch.float32, compute_data_type=torch.float32)
    fwd = frost.Graph(**kw)
    q, k, v = (fwd.tensor_like(t, name=n) for t, n in ((q_t, "q"), (k_t, "k"), (v_t, "v")))
    mask = dict(use_causal_mask=True) if causal else {}
    o, st = fwd.sdpa(q, k, v, attn_scale=D**-0.5, generate_stats=True, **mask)
    o.set_output(True).set_dim(list(o_t.shape)).set_stride(list(o_t.stride()))
    st.set_output(True).set_data_type(torch.float32)
    fwd.validate()
    fwd.build_plans(engine=fwd_engine)
    bwd = frost.Graph(**kw)
    bq, bk, bv, bo, bdo = (
        bwd.tensor_like(t, name=n) for t, n in ((q_t, "q"), (k_t, "k"), (v_t, "v"), (o_t, "o"), (do_t, "dO"))
    )
    bst = bwd.tensor_like(lse_t, name="stats")
    dq, dk, dv = bwd.sdpa_backward(bq, bk, bv, bo, bdo, bst, attn_scale=D**-0.5, **mask)
    for t, ref in ((dq, dq_t), (dk, dk_t), (dv, dv_t)):
        t.set_output(True).set_dim(list(ref.shape)).set_stride(list(ref.stride()))
    bwd.validate()
    bwd.build_plans(engine=bwd_engine)
    ws = torch.empty(max(bwd.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
    fwd_pack = {q: q_t, k: k_t, v: v_t, o: o_t, st: lse_t}
    bwd_pack = {bq: q_t, bk: k_t, bv: v_t, bo: o_t, bdo: do_t, bst: lse_t, dq: dq_t, dk: dk_t, dv: dv_t}
    return (fwd, fwd_pack, None), (bwd, bwd_pack, ws)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=500)  # below the launch queue's depth
    a = ap.parse_args(argv)
    rows = []
    graphs = list(zip(("fwd", "bwd"), tiny_graphs())) + [("fwd", tiny_graphs(fwd_engine="sm80")[0])]
    for name, (g, pack, ws) in graphs:
        adapter = g.plan.adapter
        bound = g._binder.bind(pack, ws)
        stream = torch.cuda.current_stream().cuda_stream
        if name == "fwd":
            direct = adapter._args(bound, {"stream": stream})  # the launch arguments execute would pass
            kernel = adapter.kernel
            raw = per_call_us(lambda: kernel(*direct), a.calls)
        else:
            raw = (float("nan"), float("nan"))
        bind = per_call_us(lambda: g._binder.bind(pack, ws), a.calls)
        launch = per_call_us(lambda: adapter.execute(bound, ws, None), a.calls)
        full = per_call_us(lambda: g.execute(pack, ws), a.calls)
        rows.append((name, g.engine_name, raw, bind, launch, full))
    from frost.runtime.context import stream_handle

    stream_us = per_call_us(lambda: stream_handle(None), a.calls)
    print("wall us until the GPU drained (issue us until the calls returned)\n")
    print("| dir | engine | kernel call us | bind us | adapter execute us | execute us |")
    print("|---|---|---:|---:|---:|---:|")
    for name, eng, *times in rows:
        print(f"| {name} | {eng} | " + " | ".join(f"{w:.1f} ({i:.1f})" for w, i in times) + " |")
    print(f"\nthe current stream's handle (stream_handle(None)): {stream_us[1]:.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
