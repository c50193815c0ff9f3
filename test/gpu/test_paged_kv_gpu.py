"""Paged K/V caches on a GPU: frost's append kernel against its torch reference (writes and lengths, contiguous and
paged, a scalar or per-sequence length), `flash_attn_with_kvcache` against the CPU reference engine, and a paged
graph on the cuDNN engine against the reference (same graph, engine by name); CUDA-graph capture of the append with
new lengths written into the same tensors. Run: python3 -m pytest -q -m gpu test/gpu/test_paged_kv_gpu.py
"""

from __future__ import annotations

import pytest
import torch

from frost.engines.common.kv_append_params import reference_append
from frost.kv_append import plan_kv_append
from frost.target import discover_target

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16


def _caches(paged, b=3, hk=2, d=128, bs=64, blocks=6, cap=320, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    if paged:
        n = b * blocks + 2
        kc = torch.randn(n, bs, hk, d, device="cuda", dtype=BF16, generator=g)
        vc = torch.randn(n, bs, hk, d, device="cuda", dtype=BF16, generator=g)
        table = torch.randperm(n, device="cuda", generator=g)[: b * blocks].reshape(b, blocks).to(torch.int32)
        return kc, vc, table
    kc = torch.randn(b, cap, hk, d, device="cuda", dtype=BF16, generator=g)
    vc = torch.randn(b, cap, hk, d, device="cuda", dtype=BF16, generator=g)
    return kc, vc, None


@pytest.mark.parametrize("paged", [True, False])
@pytest.mark.parametrize("tensor_lens", [True, False])
def test_append_kernel_matches_its_reference(paged, tensor_lens):
    kc, vc, table = _caches(paged)
    b, hk, d = 3, 2, 128
    k = torch.randn(b, 5, hk, d, device="cuda", dtype=BF16)
    v = torch.randn(b, 5, hk, d, device="cuda", dtype=BF16)
    lens = torch.tensor([0, 60, 300], dtype=torch.int32, device="cuda") if tensor_lens else None
    want_kc, want_vc = kc.cpu(), vc.cpu()
    want_q, want_kv = torch.empty(b, dtype=torch.int32), torch.empty(b, dtype=torch.int32)
    reference_append(
        k.cpu(),
        v.cpu(),
        want_kc,
        want_vc,
        None if table is None else table.cpu(),
        None if lens is None else lens.cpu(),
        7,
        4,
        want_q,
        want_kv,
    )
    plan = plan_kv_append("bf16", d, d, paged=paged, seqlens_tensor=tensor_lens, target=discover_target())
    lq, lkv = (
        torch.full((b,), -1, dtype=torch.int32, device="cuda"),
        torch.full((b,), -1, dtype=torch.int32, device="cuda"),
    )
    plan.execute(k, v, kc, vc, table, lens, lq, lkv, cache_len=7, s_q=4)
    torch.cuda.synchronize()
    assert torch.equal(kc.cpu(), want_kc) and torch.equal(vc.cpu(), want_vc)
    assert torch.equal(lq.cpu(), want_q) and torch.equal(lkv.cpu(), want_kv)


def test_append_replays_in_a_cuda_graph_with_new_lengths():
    kc, vc, table = _caches(True)
    b, hk, d = 3, 2, 128
    k = torch.randn(b, 1, hk, d, device="cuda", dtype=BF16)
    v = torch.randn(b, 1, hk, d, device="cuda", dtype=BF16)
    lens = torch.tensor([1, 2, 3], dtype=torch.int32, device="cuda")
    lq, lkv = torch.empty(b, dtype=torch.int32, device="cuda"), torch.empty(b, dtype=torch.int32, device="cuda")
    plan = plan_kv_append("bf16", d, d, paged=True, seqlens_tensor=True, target=discover_target())
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        plan.execute(k, v, kc, vc, table, lens, lq, lkv, s_q=1)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.execute(k, v, kc, vc, table, lens, lq, lkv, s_q=1)
    lens.copy_(torch.tensor([100, 200, 300], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    assert lkv.tolist() == [101, 201, 301]
    for i, pos in enumerate((100, 200, 300)):
        blk = int(table[i, pos // 64])
        assert torch.equal(kc[blk, pos % 64], k[i, 0])


@pytest.mark.parametrize("paged", [True, False])
def test_flash_attn_with_kvcache_matches_the_cpu_reference(paged):
    from frost.torch_face import flash_attn_with_kvcache

    kc, vc, table = _caches(paged, seed=3)
    b, hq, hk, d = 3, 8, 2, 128
    q = torch.randn(b, 4, hq, d, device="cuda", dtype=BF16)
    k = torch.randn(b, 4, hk, d, device="cuda", dtype=BF16)
    v = torch.randn(b, 4, hk, d, device="cuda", dtype=BF16)
    lens = torch.tensor([0, 61, 300], dtype=torch.int32, device="cuda")
    cpu = [t.cpu() if t is not None else None for t in (q, kc, vc, k, v, lens, table)]
    try:
        out = flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, block_table=table, causal=True)
    except NotImplementedError as e:  # paged without the cuDNN engine: a decline naming the feature
        assert paged and "paged" in str(e)
        pytest.skip(f"no engine serves paged caches here: {e}")
    want = flash_attn_with_kvcache(
        cpu[0], cpu[1], cpu[2], cpu[3], cpu[4], cache_seqlens=cpu[5], block_table=cpu[6], causal=True
    )
    assert torch.equal(kc.cpu(), cpu[1]) and torch.equal(vc.cpu(), cpu[2])
    err = (out.cpu().double() - want.double()).norm() / want.double().norm()
    assert err < 1e-2


@pytest.mark.parametrize("paged", [True, False])
def test_kvcache_decode_step_replays_in_a_cuda_graph_with_new_lengths_and_table(paged):
    """One decode step captured once: a replay after new lengths (and, paged, a new table) are written into the
    same tensors gives what an eager call on those values gives."""
    from frost.torch_face import flash_attn_with_kvcache

    kc, vc, table = _caches(paged, seed=5)
    b, hq, hk, d = 3, 8, 2, 128
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=BF16)
    k = torch.randn(b, 1, hk, d, device="cuda", dtype=BF16)
    v = torch.randn(b, 1, hk, d, device="cuda", dtype=BF16)
    lens = torch.tensor([3, 9, 27], dtype=torch.int32, device="cuda")

    def step():
        return flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, block_table=table, causal=True)

    try:
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            step()  # plans outside capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
    except NotImplementedError as e:
        assert paged and "paged" in str(e)
        pytest.skip(f"no engine serves paged caches here: {e}")
    lens.copy_(torch.tensor([100, 5, 250], dtype=torch.int32))
    if paged:
        table.copy_(table.flip(0))
    graph.replay()
    torch.cuda.synchronize()
    got = out.clone()
    lens.copy_(torch.tensor([100, 5, 250], dtype=torch.int32))
    want = step()
    torch.cuda.synchronize()
    assert torch.equal(got, want)
