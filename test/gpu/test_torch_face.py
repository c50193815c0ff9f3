"""The torch face on a GPU: ops vs a float64 oracle, torch.compile, CUDA graphs, streams, determinism, provider.

Four specializations serve every test (their kernels compile once; strides are runtime values, so BSHD and
BHSD share them): dense causal 4/4 heads, dense GQA 8/2 with a bottom-right window, packed GQA 8/2 causal
bottom-right, and the deterministic backward of the first; D = 128, bf16. Eager inference calls of the
first (no autograd, no return_lse) add its forward without Stats.
Run: python3 -m pytest -q -m gpu test/gpu/test_torch_face.py
"""

from __future__ import annotations

import math

import pytest
import torch

import frost.torch_face as ft
from test import oracle
from test.gpu.graph_cases import rel_err, runs_while_default_blocked

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16
D = 128


def _dense(b, s, h, layout, seed, d=D):
    """(B, H, S, D) logical; memory (B, S, H, D) when layout is bshd."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(b, s, h, d, device="cuda", dtype=BF16, generator=g)
    return x.transpose(1, 2) if layout == "bshd" else x.transpose(1, 2).contiguous()


def _args(t, layout):
    return t.transpose(1, 2) if layout == "bshd" else t


def _oracle_kw(causal, window, bottom_right):
    kw = {"alignment": "BOTTOM_RIGHT" if bottom_right else "TOP_LEFT"}
    left, right = window if window else (-1, -1)
    right = 0 if causal else right
    if left >= 0:
        kw["left_bound"] = left + 1
    if right >= 0:
        kw["right_bound"] = right
    return kw


def _check(name, got, want, tol):
    err = rel_err(got.float().cpu(), want)
    assert err < tol, f"{name}: relative error {err:.3e} vs the float64 oracle (limit {tol:.0e})"


DENSE = [
    dict(id="bshd-causal", layout="bshd", hq=4, hkv=4, sq=512, sk=512, causal=True, window=None, br=False),
    dict(id="bhsd-causal", layout="bhsd", hq=4, hkv=4, sq=512, sk=512, causal=True, window=None, br=False),
    dict(id="gqa-window-br", layout="bshd", hq=8, hkv=2, sq=384, sk=512, causal=False, window=(96, 32), br=True),
]


@pytest.mark.parametrize("c", DENSE, ids=[c["id"] for c in DENSE])
def test_attention_forward_backward_vs_float64_oracle(c):
    b = 2
    q, k, v = (
        _dense(b, s, h, c["layout"], i)
        for i, (s, h) in enumerate(((c["sq"], c["hq"]), (c["sk"], c["hkv"]), (c["sk"], c["hkv"])))
    )
    do = _dense(b, c["sq"], c["hq"], "bhsd", 7)
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    out, lse = ft.attention(
        *(_args(t, c["layout"]) for t in leaves),
        causal=c["causal"],
        window=c["window"],
        layout=c["layout"],
        return_lse=True,
        diagonal_alignment="bottom_right" if c["br"] else "top_left",
    )
    out_bhsd = _args(out, c["layout"])
    assert out_bhsd.stride() == torch.empty_like(q).stride(), "out must keep q's memory layout"
    out_bhsd.backward(do)
    ref = oracle.attention_grads(
        *(t.float().cpu() for t in (q, k, v, do)),
        scale=1 / math.sqrt(D),
        **_oracle_kw(c["causal"], c["window"], c["br"]),
    )
    _check("out", out_bhsd.detach(), ref[0], 1e-2)
    finite = torch.isfinite(ref[1])
    assert torch.allclose(lse.cpu().double()[finite], ref[1][finite], atol=2e-2), "lse differs from the oracle"
    for name, leaf, want in zip(("dq", "dk", "dv"), leaves, ref[2:5]):
        _check(name, leaf.grad, want, 2e-2)


def _packed(lens_q, lens_k, hq=8, hkv=2, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    tq, tk = sum(lens_q), sum(lens_k)
    q = torch.randn(tq, hq, D, device="cuda", dtype=BF16, generator=g)
    k = torch.randn(tk, hkv, D, device="cuda", dtype=BF16, generator=g)
    v = torch.randn(tk, hkv, D, device="cuda", dtype=BF16, generator=g)
    return q, k, v, _cu(lens_q), _cu(lens_k)


def _cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int32)


MAX_SEQ = 512  # the packed tests' static envelope


def test_varlen_forward_backward_vs_float64_oracle():
    lens_q, lens_k = [300, 1, 0, 211], [300, 64, 17, 350]
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k)
    do = torch.randn_like(q)
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    out = ft.flash_attn_varlen_func(*leaves, cu_q, cu_k, MAX_SEQ, MAX_SEQ, causal=True)
    out.backward(do)
    ref = oracle.attention_grads(
        *(t.float().cpu() for t in (q, k, v, do)),
        scale=1 / math.sqrt(D),
        cu_seq_len_q=cu_q.tolist(),
        cu_seq_len_kv=cu_k.tolist(),
        right_bound=0,
        alignment="BOTTOM_RIGHT",
    )
    _check("out", out.detach(), ref[0], 1e-2)
    for name, leaf, want in zip(("dq", "dk", "dv"), leaves, ref[2:5]):
        _check(name, leaf.grad, want, 2e-2)


def _step(fn, base, do):
    leaves = [t.detach().clone().requires_grad_(True) for t in base]
    out = fn(*leaves)
    out.backward(do)
    return out.detach(), [t.grad for t in leaves]


def _bshd_causal(q, k, v):
    return ft.attention(q, k, v, causal=True, layout="bshd")


def _bshd_inputs(s, seed):
    return [_dense(2, s, 4, "bshd", seed + i).transpose(1, 2) for i in range(3)]  # (B, S, H, D)


def _compare(got, want, what):
    out, grads = got
    out_ref, grads_ref = want
    assert rel_err(out, out_ref) < 1e-2, f"{what}: out differs from eager frost"
    for name, a, b in zip(("dq", "dk", "dv"), grads, grads_ref):
        assert rel_err(a, b) < 1e-2, f"{what}: {name} differs from eager frost"


def test_torch_compile_fullgraph_dynamic_forward_backward():
    torch._dynamo.reset()
    compiled = torch.compile(_bshd_causal, fullgraph=True, dynamic=True)
    for s in (512, 384):  # a second length must not need a recompile to be right
        base = _bshd_inputs(s, 10 + s)
        do = torch.randn_like(base[0])
        _compare(_step(compiled, base, do), _step(_bshd_causal, base, do), f"compiled S={s}")


def test_torch_compile_reduce_overhead():
    torch._dynamo.reset()
    compiled = torch.compile(_bshd_causal, mode="reduce-overhead")
    base = _bshd_inputs(512, 20)
    do = torch.randn_like(base[0])
    want = _step(_bshd_causal, base, do)
    for i in range(3):  # warm-up runs, then CUDA-graph replays
        got = _step(compiled, base, do)
        _compare((got[0].clone(), [g.clone() for g in got[1]]), want, f"reduce-overhead call {i}")


def test_cuda_graph_replays_honor_rewritten_packed_lengths():
    lens = [200, 56, 256]
    q, k, v, cu_q, cu_k = _packed(lens, lens, seed=3)
    do = torch.randn_like(q)

    def body():
        out, lse = ft.varlen_attention(
            q, k, v, cu_q, cu_k, MAX_SEQ, MAX_SEQ, causal=True, return_lse=True, diagonal_alignment="bottom_right"
        )
        grads = torch.ops.frost.sdpa_varlen_bwd(
            do, q, k, v, out, lse, cu_q, cu_k, MAX_SEQ, MAX_SEQ, None, None, -1, 0, True, False
        )
        return out, grads[0]

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()  # warm-up: the plans exist before capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, dq = body()
    for new in ([256, 256, 0], [1, 511, 0], [100, 100, 312]):
        cu_q.copy_(_cu(new))
        cu_k.copy_(_cu(new))
        graph.replay()
        torch.cuda.synchronize()
        eager_out, eager_dq = body()
        assert rel_err(out, eager_out) < 1e-2, f"replayed out ignores the new lengths {new}"
        assert rel_err(dq, eager_dq) < 1e-2, f"replayed dq ignores the new lengths {new}"


def test_runs_on_the_current_non_default_stream():
    q, k, v = (_dense(2, 512, 4, "bshd", 30 + i) for i in range(3))
    do = torch.randn_like(q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())

    def calls():
        out, lse = ft.attention(q, k, v, causal=True, return_lse=True)
        return out, torch.ops.frost.sdpa_bwd(do, q, k, v, out, lse, None, None, -1, 0, False, False)[0]

    with torch.cuda.stream(side):  # warm-up on the side stream: plans exist, its allocator pool holds the blocks
        out, _ = calls()
    torch.cuda.synchronize()
    got = []

    def launch():
        with torch.cuda.stream(side):
            got.extend(calls())

    finished, still_blocked = runs_while_default_blocked(launch, side)
    out2, dq = got
    assert finished, "the call waited on the (blocked) default stream: something ran off the current stream"
    assert still_blocked
    torch.cuda.synchronize()
    assert torch.equal(out2, out) and torch.isfinite(dq).all()


def test_deterministic_mode_gives_bitwise_equal_gradients():
    base = _bshd_inputs(512, 40)
    do = torch.randn_like(base[0])
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        runs = [_step(_bshd_causal, base, do)[1] for _ in range(3)]
    finally:
        torch.use_deterministic_algorithms(prev)
    for name, *grads in zip(("dq", "dk", "dv"), *runs):
        assert all(torch.equal(grads[0], g) for g in grads[1:]), f"{name} differs between deterministic runs"
    det = [s for s in ft.plan_cache_info()["specializations"] if s.direction == "bwd" and s.deterministic]
    assert det, "no deterministic backward plan was built"


def test_sdpa_provider_runs_frost_kernels():
    from torch.nn import attention as attn

    if not hasattr(attn, "activate_flash_attention_impl"):
        pytest.skip(f"torch {torch.__version__} has no flash-attention provider registry")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (_dense(2, 512, 4, "bhsd", 50 + i) for i in range(3))
    do = torch.randn_like(q)
    own = _step(lambda a, b, c: ft.attention(a, b, c, causal=True), (q, k, v), do)
    info = ft.plan_cache_info()
    lookups = info["hits"] + info["misses"]
    ft.use_for_sdpa()
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            via = _step(
                lambda a, b, c: torch.nn.functional.scaled_dot_product_attention(a, b, c, is_causal=True), (q, k, v), do
            )
        info = ft.plan_cache_info()
        assert info["hits"] + info["misses"] >= lookups + 2, "SDPA's flash ops did not reach frost's plan cache"
        assert torch.equal(via[0], own[0]), "SDPA through frost differs from frost's own forward"
        assert via[0].stride() == q.stride()
        _compare(via, own, "SDPA provider")
        # torch's varlen entry point (aten::_flash_attention_forward with cu_seqlens): FlashAttention's masks
        lens = [300, 212]
        qp, kp, vp, cu_q, cu_k = _packed(lens, lens, seed=6)
        got = torch.ops.aten._flash_attention_forward(qp, kp, vp, cu_q, cu_k, MAX_SEQ, MAX_SEQ, 0.0, True, False)
        want = ft.flash_attn_varlen_func(qp, kp, vp, cu_q, cu_k, MAX_SEQ, MAX_SEQ, causal=True)
        assert torch.equal(got[0], want) and got[1].shape == (8, sum(lens))
    finally:
        ft.restore_sdpa()


def test_train_gpt_example_runs_a_few_steps(tmp_path):
    """The example's GPU path (bf16 autocast), eager for speed; D=128 with 4 heads reuses the kernels above."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    cmd = [
        sys.executable,
        str(root / "examples" / "train_gpt.py"),
        "--attention",
        "frost",
        "--layers",
        "1",
        "--width",
        "512",
        "--heads",
        "4",
        "--context",
        "128",
        "--batch",
        "2",
        "--steps",
        "3",
        "--log-every",
        "1",
        "--compile",
        "off",
        "--data-mb",
        "1",
        "--out-dir",
        str(tmp_path),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    summary = json.loads((tmp_path / "frost_summary.json").read_text())
    assert math.isfinite(summary["final_loss"]) and summary["final_loss"] < 6.0


def test_eager_paths_agree_bitwise_and_allocate_only_their_outputs():
    """The memoized eager call (its Stats-free plan, and with return_lse) and the op give the same bits; a
    memoized call allocates its outputs and nothing else, and never syncs."""
    q, k, v = (_dense(2, 512, 4, "bshd", 60 + i) for i in range(3))
    via_op = torch.ops.frost.sdpa_fwd(q, k, v, None, None, -1, 0, False, False)
    first = ft.attention(q, k, v, causal=True)  # the whole way: a Stats-free plan, memoized
    out_lse, lse = ft.attention(q, k, v, causal=True, return_lse=True)
    torch.cuda.synchronize()
    for lse_too, outputs in ((False, 1), (True, 2)):
        before = torch.cuda.memory_stats()["allocation.all.allocated"]
        torch.cuda.set_sync_debug_mode("error")
        try:
            again = ft.attention(q, k, v, causal=True, return_lse=lse_too)  # the memo
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert torch.cuda.memory_stats()["allocation.all.allocated"] - before == outputs
        assert torch.equal(again[0] if lse_too else again, via_op[0])
    assert torch.equal(first, via_op[0]), "the Stats-free forward differs from the one that writes lse"
    assert torch.equal(out_lse, via_op[0]) and torch.equal(lse, via_op[1])
    assert first.stride() == via_op[0].stride() == q.stride()


def test_a_new_shape_during_capture_raises_a_warm_up_error():  # last: it abandons a capture
    q = _dense(1, 320, 4, "bhsd", 5)  # a shape no other test plans
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ft.PlanDuringCaptureError, match="warm-up"):
        with torch.cuda.graph(graph):
            ft.attention(q, q, q, causal=True)
