"""Relative error of frost.distributed against float64 at several world sizes (gloo processes on the CPU, the
reference engine computing every block): the error must not grow with the number of ranks.

    python benchmarks/context_parallel_accuracy.py [--worlds 1 2 4 8] [--seq 256]

Prints a markdown table (docs/context_parallel.md holds the last one): per scheme, dtype and world size, the
relative error (||got - want|| / ||want||) of out, dq, dk and dv over the whole (causal, GQA) sequence.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SCHEMES = ("ring", "all_gather", "ulysses")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _truth(q, k, v, do, scale):
    """float64 causal GQA attention and its gradients by autograd, on (B, H, S, D)."""
    leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    qq, kk, vv = leaves
    rep = qq.shape[1] // kk.shape[1]
    kk, vv = kk.repeat_interleave(rep, 1), vv.repeat_interleave(rep, 1)
    s = torch.einsum("bhqd,bhkd->bhqk", qq, kk) * scale
    n = s.shape[-1]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    o = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, -1), vv)
    return [o.detach(), *torch.autograd.grad(o, leaves, do.double())]


def _rel(got, want) -> float:
    return ((got.double() - want).norm() / want.norm()).item()


def _worker(rank, world, port, args, out_dir):
    from frost.distributed import context_parallel_attention, shard_sequence, unshard_sequence

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=300)
    )
    rows = []
    for dname, dtype in DTYPES.items():
        gen = torch.Generator().manual_seed(0)
        shapes = [(1, args.heads, args.seq, args.dim), (1, args.kv_heads, args.seq, args.dim)]
        q, k, v, do = (torch.randn(shapes[i in (1, 2)], generator=gen).to(dtype) for i in range(4))
        scale = args.dim**-0.5
        want = _truth(q, k, v, do, scale) if rank == 0 else None
        for scheme in SCHEMES:
            if scheme == "ulysses" and args.heads % world:
                continue
            leaves = [shard_sequence(t, rank=rank, world=world).requires_grad_(True) for t in (q, k, v)]
            out = context_parallel_attention(*leaves, scheme=scheme, causal=True, scale=scale)
            out.backward(shard_sequence(do, rank=rank, world=world))
            got = [unshard_sequence(t) for t in (out.detach(), *(x.grad for x in leaves))]
            if rank == 0:
                rows.append(dict(scheme=scheme, dtype=dname, world=world, errs=[_rel(g, w) for g, w in zip(got, want)]))
    dist.destroy_process_group()
    if rank == 0:
        with open(os.path.join(out_dir, "rows.json"), "w") as f:
            json.dump(rows, f)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument(
        "--start-method",
        choices=("fork", "spawn"),
        default=None,
        help="how the ranks start (default: fork where offered, after one import; else spawn)",
    )
    args = p.parse_args()
    import frost.distributed  # noqa: F401  (imported once, before the fork)

    method = args.start_method or ("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    rows = []
    for world in args.worlds:
        with tempfile.TemporaryDirectory() as d:
            mp.start_processes(_worker, args=(world, _port(), args, d), nprocs=world, join=True, start_method=method)
            with open(os.path.join(d, "rows.json")) as f:
                rows += json.load(f)
    print(
        f"causal GQA, B=1, S={args.seq}, Hq={args.heads}, Hkv={args.kv_heads}, D={args.dim}; "
        "rel err vs float64 (out / dq / dk / dv)\n"
    )
    print("| scheme | dtype | " + " | ".join(f"W={w}" for w in args.worlds) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in args.worlds) + " |")
    for scheme in SCHEMES:
        for dname in DTYPES:
            cells = []
            for w in args.worlds:
                r = [x for x in rows if x["scheme"] == scheme and x["dtype"] == dname and x["world"] == w]
                cells.append(" / ".join(f"{e:.1e}" for e in r[0]["errs"]) if r else "—")
            print(f"| {scheme} | {dname} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
