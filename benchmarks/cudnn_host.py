"""Host time per call of frost's cuDNN engine against cuDNN through torch, on a tiny problem (GPU; prints a table).

    python3 benchmarks/cudnn_host.py [--calls 500] [--causal] [--json PATH]

The issue's bar: the same library, so frost's execute must cost less host time than torch's SDPA call. Rows, for
the forward and the backward of a 1x1x128x64 bf16 problem (the kernels take a few microseconds, so a call's time
is its host time):

- torch: `F.scaled_dot_product_attention` pinned to the CUDNN_ATTENTION backend (the bench's peer); the backward
  is `torch.autograd.grad` of an output built once, as the bench times it
- torch op: the aten op under it (`_scaled_dot_product_cudnn_attention`), forward only, when it can be called
- frost execute: `Graph.execute(pack, workspace, ExecutionContext())` with the engine planned by name ("cudnn")
- frost executor / frost launch: `Graph.executor(ports)` called with the tensors in port order (every check of
  execute), and its `launch` (devices and alignment only; for callers whose cache key pins the rest)
- frost adapter: the adapter's execute on tensors the binder already checked (execute without the binder)
- cudnn raw: the backend's raw-pointer entry the adapter calls (`_execute_with_raw_ptrs`, pointers in the
  backend's order), when the binding has it
- cudnn ordered / cudnn mapping: the built `cudnn.pygraph`'s own execute, the ordered form (`tensor_uids=`) and
  the mapping form (`{tensor: buffer}`), with the same handle

Per call over back-to-back calls: wall clock until the GPU drained, and in parentheses until the last call returned
(host time alone, while the launch queue has room), as `frost bench --probe` measures.
"""

from __future__ import annotations

import argparse
import json
import math

import torch
import torch.nn.functional as F

import frost
from host_time import per_call_us, tiny_graphs


def _frost_rows(g, pack, calls):
    """frost execute / executor / launch / adapter, cudnn raw / ordered / mapping: (name, (wall, issue)) or
    (name, reason)."""
    from array import array

    from frost.runtime.context import stream_handle

    ws = torch.empty(max(g.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
    ctx = frost.ExecutionContext()
    adapter = g.plan.adapter
    bound = g._binder.bind(pack, ws)
    g.execute(pack, ws, ctx)  # the current stream's handle exists after this
    ports = tuple(pack)
    run = g.executor(ports)
    tensors = tuple(pack[p] for p in ports)
    h, backend = adapter._handles[stream_handle(None)]
    cg, cws = adapter._graph, (ws if adapter._cudnn_ws else None)
    ordered = tuple(bound[r] for r in adapter._roles)
    mapping = {tensor: bound[role] for role, tensor in adapter._pack_roles}
    rows = [
        ("frost execute", lambda: g.execute(pack, ws, ctx)),
        ("frost executor", lambda: run(tensors, ws, ctx)),
        ("frost launch", lambda: run.launch(tensors, ws, ctx)),
        ("frost adapter", lambda: adapter.execute(bound, ws, None)),
    ]
    raw = adapter._raw
    if backend is not None:  # the adapter launches through the raw-pointer entry on this stream
        rws = ws.data_ptr() if adapter._cudnn_ws else 0

        def raw_call():
            ptrs = array("Q", [bound[r].data_ptr() for r in raw.roles])
            raw.execute(ptrs.buffer_info()[0], len(ptrs), rws, backend, raw.plan_index)

        rows.append(("cudnn raw", raw_call))
    if adapter._uids is not None:
        rows.append(("cudnn ordered", lambda: cg.execute(ordered, cws, handle=h, tensor_uids=adapter._uids)))
    rows.append(("cudnn mapping", lambda: cg.execute(mapping, cws, handle=h)))
    out = []
    for name, fn in rows:
        try:
            out.append((name, per_call_us(fn, calls)))
        except Exception as e:  # report, keep going
            out.append((name, f"failed: {type(e).__name__}: {str(e).strip().splitlines()[0][:120]}"))
    form = "raw pointers" if backend is not None else "ordered" if adapter._uids is not None else "mapping"
    out.append(("(binding form frost uses)", form))
    return out


def _torch_rows(t, direction, causal, calls, scale):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = t["q"], t["k"], t["v"]  # the tensors frost binds: (B, H, S, D) views of BSHD storage
    out = []
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        if direction == "fwd":
            rows = [("torch", lambda: F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=causal))]
            op = getattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention", None)
            if op is not None:
                rows.append(("torch op", lambda: op(q, k, v, None, False, 0.0, causal, False, scale=scale)))
        else:
            leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
            o = F.scaled_dot_product_attention(*leaves, scale=scale, is_causal=causal)
            do = t["dO"]
            rows = [("torch", lambda: torch.autograd.grad(o, leaves, do, retain_graph=True))]
        for name, fn in rows:
            try:
                fn()
                out.append((name, per_call_us(fn, calls)))
            except Exception as e:
                out.append((name, f"failed: {type(e).__name__}: {str(e).strip().splitlines()[0][:120]}"))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=500)  # below the launch queue's depth
    ap.add_argument("--causal", action="store_true", help="a causal mask (default: none)")
    ap.add_argument("--json", default=None, help="also write the numbers here")
    a = ap.parse_args(argv)
    (fwd, fwd_pack, _), (bwd, bwd_pack, _) = tiny_graphs(fwd_engine="cudnn", bwd_engine="cudnn", causal=a.causal)
    t = {decl.name: x for decl, x in bwd_pack.items()}
    scale = 64**-0.5
    fwd.execute(
        fwd_pack, torch.empty(max(fwd.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
    )  # O and Stats for the backward
    torch.cuda.synchronize()
    table = {}
    for direction, (g, pack) in (("fwd", (fwd, fwd_pack)), ("bwd", (bwd, bwd_pack))):
        table[direction] = _torch_rows(t, direction, a.causal, a.calls, scale) + _frost_rows(g, pack, a.calls)
    print(
        f"host time per call, 1x1x128x64 bf16{' causal' if a.causal else ''}, {a.calls} calls: wall us until the "
        f"GPU drained (issue us until the calls returned)\n"
    )
    print("| dir | what | us per call |")
    print("|---|---|---:|")
    for direction, rows in table.items():
        for name, v in rows:
            cell = v if isinstance(v, str) else f"{v[0]:.1f} ({v[1]:.1f})"
            print(f"| {direction} | {name} | {cell} |")
    for direction, rows in table.items():
        d = dict(rows)
        mine, theirs = d.get("frost execute"), d.get("torch")
        if isinstance(mine, tuple) and isinstance(theirs, tuple) and all(map(math.isfinite, mine + theirs)):
            print(
                f"\n{direction}: frost execute / torch = {mine[0] / theirs[0]:.2f}x wall, "
                f"{mine[1] / theirs[1]:.2f}x issue ({'below' if mine[1] < theirs[1] else 'NOT below'} torch's)"
            )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({d: {n: v for n, v in rows} for d, rows in table.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
