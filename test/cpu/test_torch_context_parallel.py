"""torch's own `context_parallel` with frost computing every block, on the CPU: two processes over gloo
(127.0.0.1), frost's provider kernels registered for CPU tensors (`use_for_sdpa(device="cpu")`), torch's
head-tail load balancing (causal) and its all-gather and all-to-all K/V rotations, forward and backward
against float64, with K/V on all query heads and GQA; frost's block kernels are counted in each rank."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch

F = torch.nn.functional

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CASES = [
    (causal, method, heads_kv)
    for causal in (True, False)
    for method in ("allgather", "alltoall")
    for heads_kv in (4, 2)
]  # (is_causal: head-tail balanced, rotation, K/V heads of 4 query heads: GQA at 2)


def _rank(rank, world, port, out_dir):
    """One rank: every case of CASES through torch's context_parallel; errors and call counts to JSON."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        import frost.torch_face as ft
        from frost.torch_face import block
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import (
            _cp_options,
            context_parallel_unshard,
            set_rotate_method,
        )

        ft.use_for_sdpa(device="cpu")
        calls = {"forward": 0, "backward": 0}
        fwd, bwd = block.forward, block.backward

        def counted(name, fn):
            def call(*a, **k):
                calls[name] += 1
                return fn(*a, **k)

            return call

        block.forward, block.backward = counted("forward", fwd), counted("backward", bwd)
        mesh = init_device_mesh("cpu", (world,))
        results = []
        for causal, method, heads_kv in CASES:
            torch.manual_seed(0)
            q, do = torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8)
            k, v = torch.randn(2, heads_kv, 16, 8), torch.randn(2, heads_kv, 16, 8)
            qd, kd, vd = (t.double().requires_grad_(True) for t in (q, k, v))
            gqa = heads_kv != 4
            ref = F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal, enable_gqa=gqa)  # float64, torch's
            want = (ref.detach(), *torch.autograd.grad(ref, (qd, kd, vd), do.double()))
            set_rotate_method(method)
            _cp_options.enable_load_balance = causal  # head-tail balancing needs causal
            before = dict(calls)
            cq, ck, cv, cdo = (t.clone() for t in (q, k, v, do))
            with context_parallel(
                mesh, buffers=[cq, ck, cv, cdo], buffer_seq_dims=[2, 2, 2, 2], no_restore_buffers={cq, ck, cv, cdo}
            ):
                for t in (cq, ck, cv):
                    t.requires_grad_(True)
                out = F.scaled_dot_product_attention(cq, ck, cv, is_causal=causal, enable_gqa=gqa)
                grads = torch.autograd.grad(out, (cq, ck, cv), cdo)
                full = context_parallel_unshard(mesh, [out.detach(), *grads], [2, 2, 2, 2])
            errs = [((a.double() - b).norm() / b.norm()).item() for a, b in zip(full, want)]
            results.append(
                {
                    "case": [causal, method, heads_kv],
                    "errors": errs,
                    "local_seq": out.shape[2],
                    "forward": calls["forward"] - before["forward"],
                    "backward": calls["backward"] - before["backward"],
                }
            )
        ft.restore_sdpa(device="cpu")
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
    finally:
        dist.destroy_process_group()


def test_torchs_context_parallel_runs_every_block_on_frost(tmp_path):
    pytest.importorskip("torch.distributed.tensor.experimental._attention")
    import torch.multiprocessing as mp

    world = 2
    mp.spawn(_rank, args=(world, _free_port(), str(tmp_path)), nprocs=world, join=True)
    for rank in range(world):
        results = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert [r["case"] for r in results] == [list(c) for c in CASES]
        for r in results:
            assert r["local_seq"] == 16 // world  # each rank held its shard
            assert r["forward"] == world and r["backward"] == world, r  # one frost block per ring step
            assert max(r["errors"]) < 1e-5, r  # out, dq, dk, dv against float64


def test_cpu_opt_in_routes_sdpa_to_frost_and_back(monkeypatch):
    import frost.torch_face as ft
    from frost.torch_face import block, provider

    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    calls = []
    fwd = block.forward
    monkeypatch.setattr(block, "forward", lambda *a, **kw: calls.append(1) or fwd(*a, **kw))
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    assert not calls  # not opted in: torch's own attention
    ft.use_for_sdpa(device="cpu")
    try:
        assert provider.cpu_active()
        got = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert calls == [1]
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
        F.scaled_dot_product_attention(q.double(), k.double(), v.double())  # a dtype frost does not serve: torch's
        F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(8, 8, dtype=torch.bool))  # a mask: torch's
        assert calls == [1]
    finally:
        ft.restore_sdpa(device="cpu")
    assert not provider.cpu_active()
    F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert calls == [1]


def test_the_provider_serves_the_flash_ops_torchs_context_parallel_dispatches():
    """torch's CP intercepts aten's flash, efficient and cuDNN attention ops; frost's provider (CUDA and CPU alike)
    registers the flash pair, which SDPA's flash backend calls."""
    cp = pytest.importorskip("torch.distributed.tensor.experimental._context_parallel._attention")
    from frost.torch_face import provider

    intercepted = {op.name().split("::")[1].split(".")[0] for op in cp.custom_ops}
    flash = {n for n in intercepted if "flash" in n}
    assert flash == {"_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward"}
    assert flash <= set(provider.KERNELS)
