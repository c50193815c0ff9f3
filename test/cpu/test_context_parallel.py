"""frost.distributed against the float64 oracle: one start of gloo processes per world size runs every case
(ring / all_gather / ulysses; causal head-tail, full, sliding window, GQA, sinks, packed documents; forward and
backward; bitwise reproducible deterministic backward; the CUDA side-stream ordering, driven with recording
streams). Each rank compares its own shares with the sharded oracle and reports; the test asserts here."""

from __future__ import annotations

import json
import os
import socket
import traceback
from datetime import timedelta

import pytest
import torch

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

# name: (scheme, causal, window, hq, hkv, sinks, packed lengths or None, dtype)
CASES = {
    "ring-causal-gqa-sinks": ("ring", True, None, 4, 2, True, None, torch.float32),
    "ring-full-mqa": ("ring", False, None, 4, 1, False, None, torch.float32),
    "ring-causal-packed-sinks": ("ring", True, None, 2, 2, True, (8, 24, 16), torch.float32),
    "ring-full-packed": ("ring", False, None, 2, 1, False, (16, 8), torch.float32),
    "ring-causal-bf16": ("ring", True, None, 4, 2, False, None, torch.bfloat16),
    "all_gather-causal-gqa-sinks": ("all_gather", True, None, 4, 2, True, None, torch.float32),
    "all_gather-window": ("all_gather", True, (5, 0), 4, 2, True, None, torch.float32),
    "all_gather-window-packed": ("all_gather", True, (3, 0), 2, 1, False, (8, 24), torch.float32),
    "all_gather-full": ("all_gather", False, None, 2, 2, False, None, torch.float32),
    "ulysses-causal-gqa-sinks-packed": ("ulysses", True, None, 4, 2, True, (8, 24), torch.float32),
    "ulysses-band": ("ulysses", False, (3, 2), 4, 4, False, None, torch.float32),
    "ulysses-causal-window": ("ulysses", True, (4, 0), 4, 1, True, None, torch.float32),
}
B, S, D = 2, 16, 8


def _inputs(case, seed=0):
    scheme, causal, window, hq, hkv, sinks, lens, dtype = case
    gen = torch.Generator().manual_seed(seed)
    if lens is None:
        shapes = ((B, hq, S, D), (B, hkv, S, D), (B, hkv, S, D), (B, hq, S, D))
    else:
        t = sum(lens)
        shapes = ((t, hq, D), (t, hkv, D), (t, hkv, D), (t, hq, D))
    q, k, v, do = (torch.randn(s, generator=gen).to(dtype) for s in shapes)
    sink = torch.randn(hq, generator=gen) if sinks else None
    return q, k, v, do, sink


def _oracle_kwargs(case):
    scheme, causal, window, hq, hkv, sinks, lens, dtype = case
    kw = dict(causal=causal) if causal else {}
    if window is not None:
        kw["left_bound"] = window[0] + 1
        if not causal:
            kw["right_bound"] = window[1]
    if lens is not None:
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        kw.update(cu_seq_len_q=cu, cu_seq_len_kv=cu)
    return kw


def _run_case(name, case, rank, world, deterministic=False):
    """This rank's (out, dq, dk, dv, summed dsink) of the case, and the oracle's shares of them."""
    from frost.distributed import context_parallel_attention, local_cu_seqlens, shard_sequence
    from test import oracle

    scheme, causal, window, hq, hkv, sinks, lens, dtype = case
    q, k, v, do, sink = _inputs(case)
    scale = D**-0.5
    want = oracle.attention_grads(q, k, v, do, scale=scale, sink=sink, **_oracle_kwargs(case))
    cu = None
    if lens is not None:
        cu_g = _oracle_kwargs(case)["cu_seq_len_q"]
        share = lambda t: shard_sequence(t, rank=rank, world=world, dim=0, cu_seqlens=cu_g)  # noqa: E731
        cu = local_cu_seqlens(cu_g, world)
    else:
        share = lambda t: shard_sequence(t, rank=rank, world=world, dim=2)  # noqa: E731
    leaves = [share(t).requires_grad_(True) for t in (q, k, v)]
    sink_leaf = sink.clone().requires_grad_(True) if sink is not None else None
    out = context_parallel_attention(
        *leaves,
        scheme=scheme,
        causal=causal,
        window=window,
        scale=scale,
        sinks=sink_leaf,
        deterministic=deterministic,
        cu_seqlens=cu,
    )
    out.backward(share(do))
    got = [out.detach(), *(t.grad for t in leaves)]
    wants = [share(want[0]), share(want[2]), share(want[3]), share(want[4])]
    if sink is not None:
        ds = sink_leaf.grad.clone()
        dist.all_reduce(ds)  # each rank holds its rows' share
        got.append(ds)
        wants.append(want[5])
    return got, wants


def _rel(got, want):
    want = want.double()
    return ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()


class _Recorder:
    """Stand-ins for CUDA streams: they log the order of the side-stream policy's waits and posts."""

    def __init__(self, log, name):
        self.log, self.name = log, name

    def wait_stream(self, other):
        self.log.append(f"{self.name} waits {other.name}")


def _overlap_case(rank, world):
    """The ring's CUDA side-stream path, its streams recorded: every post is preceded by side waiting on the
    compute stream, and compute waits on side before each received block is used."""
    import contextlib

    from frost.distributed import comm

    log = []
    current, side = _Recorder(log, "current"), _Recorder(log, "side")

    @contextlib.contextmanager
    def use(stream):
        log.append(f"post on {stream.name}")
        yield

    def record(buf, stream):
        log.append(f"record on {stream.name}")

    real = comm.overlap_for
    comm.overlap_for = lambda device: comm.SideStream(current, side, use, record)
    try:
        got, wants = _run_case("overlap", CASES["ring-causal-gqa-sinks"], rank, world)
    finally:
        comm.overlap_for = real
    post = ["side waits current", "record on side", "record on side", "post on side"]
    # forward: W-1 K/V posts; backward: W-1 K/V posts and W dK/dV posts
    starts = [i for i in range(len(log)) if log[i : i + 4] == post]
    joins = [i for i, e in enumerate(log) if e == "current waits side"]
    ok = len(starts) == 3 * world - 2 and len(joins) == len(starts) and len(log) == 5 * len(starts)
    errs = [_rel(g, w) for g, w in zip(got, wants)]
    return dict(ok=ok, log=log[:12], errs=errs)


def _unshard_case(rank, world) -> bool:
    """unshard_sequence inverts shard_sequence, dense and packed; a share is not the plain contiguous slice."""
    from frost.distributed import shard_positions, shard_sequence, unshard_sequence

    x = torch.arange(2 * 3 * S, dtype=torch.float32).view(2, 3, S, 1)
    share = shard_sequence(x, rank=rank, world=world, dim=2)
    cu = [0, 8, 32, 48]
    p = torch.arange(48.0).view(48, 1, 1)
    p_share = shard_sequence(p, rank=rank, world=world, dim=0, cu_seqlens=cu)
    c = S // (2 * world)
    head_tail = list(range(rank * c, (rank + 1) * c)) + list(range(S - (rank + 1) * c, S - rank * c))
    return (
        torch.equal(unshard_sequence(share, dim=2), x)
        and torch.equal(unshard_sequence(p_share, dim=0, cu_seqlens=cu), p)
        and shard_positions(S, rank=rank, world=world).tolist() == head_tail
        and torch.equal(share[0, 0, :, 0], x[0, 0, head_tail, 0])
    )


def _warm():
    """Import in the parent what every worker needs (forked children then start at once), first backward
    included: autograd loads its symbolic-shape module on first use."""
    import frost.distributed  # noqa: F401
    from test import oracle

    x = torch.randn(1, 1, 2, 2, requires_grad=True)
    oracle.attention(x, x, x, scale=1.0)[0].sum().backward()


def _worker(rank, world, port, out_dir):
    results = {}
    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
        )
        torch.manual_seed(0)
        for name, case in CASES.items():
            try:
                got, wants = _run_case(name, case, rank, world)
                results[name] = [_rel(g, w) for g, w in zip(got, wants)]
            except Exception:
                results[name] = traceback.format_exc()
        try:
            runs = [
                _run_case("det", CASES["ring-causal-packed-sinks"], rank, world, deterministic=True)[0]
                for _ in range(2)
            ]
            runs += [_run_case("det", CASES["all_gather-window"], rank, world, deterministic=True)[0] for _ in range(2)]
            results["deterministic"] = all(torch.equal(a, b) for a, b in zip(runs[0], runs[1])) and all(
                torch.equal(a, b) for a, b in zip(runs[2], runs[3])
            )
        except Exception:
            results["deterministic"] = traceback.format_exc()
        try:
            results["unshard"] = _unshard_case(rank, world)
        except Exception:
            results["unshard"] = traceback.format_exc()
        try:
            results["overlap"] = _overlap_case(rank, world)
        except Exception:
            results["overlap"] = traceback.format_exc()
        dist.destroy_process_group()
    except Exception:
        results["setup"] = traceback.format_exc()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("world", [2, 4])
def test_context_parallel_matches_float64(world, tmp_path):
    import multiprocessing

    import torch.multiprocessing as mp

    # forked after the imports (seconds each on a loaded CPU); spawned where fork is not offered
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    if method == "fork":
        _warm()
    mp.start_processes(_worker, args=(world, _free_port(), str(tmp_path)), nprocs=world, join=True, start_method=method)
    failures = []
    for rank in range(world):
        res = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert "setup" not in res, res["setup"]
        for name, case in CASES.items():
            errs = res[name]
            if isinstance(errs, str):
                failures.append(f"rank {rank} {name}:\n{errs}")
                continue
            tol = 2e-2 if case[-1] == torch.bfloat16 else 1e-5
            what = ["out", "dq", "dk", "dv", "dsink"]
            bad = [f"{w} {e:.2e}" for w, e in zip(what, errs) if not e <= tol]
            if bad:
                failures.append(f"rank {rank} {name}: rel err {', '.join(bad)} (tol {tol})")
        if res["deterministic"] is not True:
            failures.append(f"rank {rank}: deterministic backward not bitwise reproducible: {res['deterministic']}")
        if res["unshard"] is not True:
            failures.append(f"rank {rank}: unshard_sequence(shard_sequence(x)) != x: {res['unshard']}")
        ov = res["overlap"]
        if isinstance(ov, str) or not ov["ok"] or not all(e <= 1e-5 for e in ov["errs"]):
            failures.append(f"rank {rank}: side-stream ordering: {ov}")
    assert not failures, "\n".join(failures)
