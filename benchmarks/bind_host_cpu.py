"""Host time of binding on the CPU (no GPU needed): the binder, the executor's checked path and its
`launch` fast path, with the launch stubbed, for a tiny forward and backward graph (reference engine).

    python3 benchmarks/bind_host_cpu.py [--calls 20000] [--repeats 7]

Prints the median over repeats of the CPU microseconds per call (thread time, so that other
processes on a busy machine do not count). It measures what binding adds to an
execute (the per-tensor checks and the aliasing check), not a kernel launch.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import frost
from frost.runtime.aliasing import REMEMBERED


def _graphs():
    f32 = torch.float32
    kw = dict(io_data_type=f32, intermediate_data_type=f32, compute_data_type=f32)
    mk = lambda: torch.randn(1, 2, 128, 64)  # noqa: E731
    q_t, k_t, v_t, o_t, do_t = mk(), mk(), mk(), mk(), mk()
    lse_t = torch.empty(1, 2, 128, 1)
    dq_t, dk_t, dv_t = mk(), mk(), mk()
    fwd = frost.Graph(**kw)
    q, k, v = (fwd.tensor_like(t, name=n) for t, n in ((q_t, "q"), (k_t, "k"), (v_t, "v")))
    o, st = fwd.sdpa(q, k, v, attn_scale=0.125, generate_stats=True, use_causal_mask=True)
    o.set_output(True)
    st.set_output(True).set_data_type(f32)
    fwd.validate()
    fwd.build_plans()
    bwd = frost.Graph(**kw)
    bq, bk, bv, bo, bdo = (
        bwd.tensor_like(t, name=n) for t, n in ((q_t, "q"), (k_t, "k"), (v_t, "v"), (o_t, "o"), (do_t, "dO"))
    )
    bst = bwd.tensor_like(lse_t, name="stats")
    dq, dk, dv = bwd.sdpa_backward(bq, bk, bv, bo, bdo, bst, attn_scale=0.125, use_causal_mask=True)
    for t in (dq, dk, dv):
        t.set_output(True)
    bwd.validate()
    bwd.build_plans()
    return (
        (fwd, {q: q_t, k: k_t, v: v_t, o: o_t, st: lse_t}),
        (bwd, {bq: q_t, bk: k_t, bv: v_t, bo: o_t, bdo: do_t, bst: lse_t, dq: dq_t, dk: dk_t, dv: dv_t}),
    )


def _us(fn, calls: int, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        t0 = time.thread_time()  # CPU time of this thread: robust on a shared, loaded machine
        for _ in range(calls):
            fn()
        runs.append((time.thread_time() - t0) / calls * 1e6)
    return statistics.median(runs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args(argv)
    print(
        "| dir | tensors | binder.bind us | bind, outputs moved each call us | bind, outputs new each call us "
        "| executor (checked) us | executor.launch us |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, (g, pack) in zip(("fwd", "bwd"), _graphs()):
        ports = list(pack)
        tensors = tuple(pack[p] for p in ports)
        ex = g.executor(ports)
        ex._execute = lambda bound, ws, stream: None  # the launch stubbed: binding alone
        bind = _us(lambda: g._binder.bind(pack, None), a.calls, a.repeats)
        # two packs whose outputs live elsewhere, alternated (double buffering; the aliasing check remembers both)
        packs = [
            {p: (torch.empty_like(t) if p.is_output or p.is_virtual else t) for p, t in pack.items()} for _ in range(2)
        ]
        flip = iter(packs * (a.calls * a.repeats + 1)).__next__
        moved = _us(lambda: g._binder.bind(flip(), None), a.calls, a.repeats)
        # more packs in turn than the check remembers: every call's address set is new to it
        packs = [
            {p: (torch.empty_like(t) if p.is_output or p.is_virtual else t) for p, t in pack.items()}
            for _ in range(REMEMBERED + 1)
        ]
        turn = iter(packs * (a.calls * a.repeats // len(packs) + 1)).__next__
        new = _us(lambda: g._binder.bind(turn(), None), a.calls, a.repeats)
        checked = _us(lambda: ex(tensors), a.calls, a.repeats)
        launch = _us(lambda: ex.launch(tensors), a.calls, a.repeats)
        print(f"| {name} | {len(pack)} | {bind:.2f} | {moved:.2f} | {new:.2f} | {checked:.2f} | {launch:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
