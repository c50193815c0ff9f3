"""Host time of the torch face per call on the CPU, the engine's launch stubbed (prints a table).

    python3 benchmarks/torch_face_host.py [--calls 300 --repeats 25] [--profile ROW] [--json out.json]

The problem is the GPU benchmark's (`benchmarks/torch_face.py`): 1x1x128x64 bf16 causal, BHSD views of
BSHD memory, planned on the reference engine whose `execute` is replaced by a no-op before planning, so
every row is the Python and torch work around the launch: argument checks, the plan cache, output
allocation, binding checks, the dispatcher and autograd. Times are CPU time of this thread
(`time.thread_time_ns`), the minimum over `--repeats` bursts of `--calls` calls: robust on a busy machine,
but CPU tensors, so a GPU host adds its own allocator and launch costs (the GPU benchmark measures those).

Tables: every path (eager `attention`, the custom op, autograd, raw `Graph.execute`, the executor; and
torch's floor for any autograd.Function attention, a kernel-less one with frost's outputs and saved tensors,
which `attention under autograd (fwd+bwd)` cannot go below), then the split of one eager `attention` call
(its memoized path) into its phases, each timed alone.
`--profile ROW` prints cProfile's top functions for one row (its name as printed).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from frost.adapters import reference
from frost.testing.host_floor import NullAttention

reference.SdpaFwdReference.execute = lambda self, bound, workspace, stream: None  # the launch, stubbed
reference.SdpaBwdReference.execute = lambda self, bound, workspace, stream: None

import frost.torch_face as ft  # noqa: E402  (after the stub: plans bind the stubbed execute)
from frost.torch_face import api, block, plans  # noqa: E402


def cpu_us(fn, calls: int, repeats: int) -> float:
    """Microseconds of this thread's CPU time per call: the best of `repeats` bursts of `calls` calls."""
    for _ in range(max(calls // 4, 50)):
        fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time_ns() - t0) / calls / 1e3)
    return best


def problem():
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(1, 128, 1, 64, dtype=torch.bfloat16) for _ in range(4))  # (B, S, H, D) memory
    return q, k, v, do.transpose(1, 2)


def _raw_forward(qb, kb, vb):
    """The cached forward plan with Stats (the op's), its ports and freshly allocated outputs."""
    out, lse = block.forward(qb, kb, vb, None, None, -1, 0, False)
    entry = next(e for e in plans.PLANS.entries() if e.spec.direction == "fwd" and e.spec.has_stats)
    return entry, (qb, kb, vb, out, lse.unsqueeze(-1))


def null_fwd_bwd(leaves, do):
    """`torch.autograd.grad` through `NullAttention`: what fwd+bwd under autograd costs before frost does anything."""
    return torch.autograd.grad(NullAttention.apply(*leaves)[0], leaves, do)


def path_rows(args) -> dict:
    q, k, v, do = problem()
    qb, kb, vb = (t.transpose(1, 2) for t in (q, k, v))
    leaves = [t.detach().clone().requires_grad_(True) for t in (qb, kb, vb)]
    out, lse = torch.ops.frost.sdpa_fwd(qb, kb, vb, None, None, -1, 0, False, False)
    entry, tensors = _raw_forward(qb, kb, vb)
    pack = dict(zip(entry.handles, tensors))
    rows = {
        "attention eager (bhsd)": lambda: ft.attention(qb, kb, vb, causal=True),
        "attention eager, return_lse": lambda: ft.attention(qb, kb, vb, causal=True, return_lse=True),
        "attention eager, layout='bshd'": lambda: ft.attention(q, k, v, causal=True, layout="bshd"),
        "flash_attn_func": lambda: ft.flash_attn_func(q, k, v, causal=True),
        "torch.ops.frost.sdpa_fwd": lambda: torch.ops.frost.sdpa_fwd(qb, kb, vb, None, None, -1, 0, False, False),
        "block.forward (the op's kernel)": lambda: block.forward(qb, kb, vb, None, None, -1, 0, False),
        "attention under autograd (forward)": lambda: ft.attention(*leaves, causal=True),
        "attention under autograd (fwd+bwd)": lambda: torch.autograd.grad(
            ft.attention(*leaves, causal=True), leaves, do
        ),
        "torch floor: null Function, fwd+bwd": lambda: null_fwd_bwd(leaves, do),
        "torch.ops.frost.sdpa_bwd": lambda: torch.ops.frost.sdpa_bwd(
            do, qb, kb, vb, out, lse, None, None, -1, 0, False, False
        ),
        "raw Graph.execute (forward)": lambda: entry.graph.execute(pack, None),
    }
    if hasattr(entry.graph, "executor"):
        ex = entry.graph.executor(entry.handles)
        rows["Graph.executor(...)(tensors)"] = lambda: ex(tensors)
        rows["Graph.executor(...).launch(tensors)"] = lambda: ex.launch(tensors)
    return rows


def phase_rows(args) -> dict:
    """One memoized eager `attention(qb, kb, vb, causal=True)` call, phase by phase."""
    q, k, v, _ = problem()
    qb, kb, vb = (t.transpose(1, 2) for t in (q, k, v))
    ft.attention(qb, kb, vb, causal=True)  # memoizes the call
    key = (
        qb.shape,
        qb.stride(),
        kb.shape,
        kb.stride(),
        vb.shape,
        vb.stride(),
        qb.dtype,
        kb.dtype,
        vb.dtype,
        qb.device,
        True,
        None,
        None,
        "bhsd",
        False,
        "top_left",
        False,
        False,
    )
    hit = plans.PLANS.memo.get(key)
    if hit is None:
        raise SystemExit("the eager call was not memoized under the expected key: update phase_rows")
    out = torch.empty_like(qb)
    stats = plans.PLANS.stats

    def bookkeeping():
        hit.plan.used = next(plans.TICKS)
        stats.hits += 1

    return {
        "function call (an empty Python function)": lambda: _empty(qb, kb, vb, causal=True),
        "gate: is_compiling + no mode/subclass, no grad": lambda: (
            api._lean(qb, kb, vb) and not api._needs_grad(qb, kb, vb)
        ),
        "memo key (18 values) + dict lookup": lambda: plans.PLANS.memo.get(
            (
                qb.shape,
                qb.stride(),
                kb.shape,
                kb.stride(),
                vb.shape,
                vb.stride(),
                qb.dtype,
                kb.dtype,
                vb.dtype,
                qb.device,
                True,
                None,
                None,
                "bhsd",
                False,
                "top_left",
                False,
                False,
            )
        ),
        "recency tick + hit count": bookkeeping,
        "out = torch.empty_like(q)": lambda: torch.empty_like(qb),
        "executor.launch: device/alignment checks + stub": lambda: hit.launch((qb, kb, vb, out)),
        "whole call": lambda: ft.attention(qb, kb, vb, causal=True),
    }


def _empty(
    q,
    k,
    v,
    *,
    causal=False,
    window=None,
    scale=None,
    sinks=None,
    deterministic=None,
    layout="bhsd",
    return_lse=False,
    diagonal_alignment="top_left",
    dropout_p=0.0,
    _causal_wins=False,
):
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=25)
    ap.add_argument("--profile", default=None, help="cProfile one row (its printed name)")
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args(argv)
    print(
        f"torch {torch.__version__}, CPU, reference engine with its execute stubbed; "
        f"CPU us per call (best of {args.repeats} x {args.calls})"
    )
    rows = path_rows(args)
    phases = phase_rows(args)
    if args.profile:
        import cProfile
        import pstats

        fn = {**rows, **phases}[args.profile]
        for _ in range(200):
            fn()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls * 10):
            fn()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return 0
    result = {"paths": {}, "phases": {}}
    print(f"\n{'path':<44} {'us/call':>8}")
    for name, fn in rows.items():
        result["paths"][name] = us = cpu_us(fn, args.calls, args.repeats)
        print(f"{name:<44} {us:8.2f}")
    print(f"\n{'eager attention (memoized), by phase':<52} {'us':>6}")
    total = 0.0
    for name, fn in phases.items():
        result["phases"][name] = us = cpu_us(fn, args.calls, args.repeats)
        if name != "whole call":
            total += us
        print(f"{name:<52} {us:6.2f}")
    print(f"{'sum of the phases':<52} {total:6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, **result}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
