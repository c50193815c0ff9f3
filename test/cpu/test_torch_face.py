"""The torch face on the CPU (reference engine): ops, autograd, fake kernels, compile, plan cache, provider."""

from __future__ import annotations

import math
import subprocess
import sys
import threading

import pytest
import torch

import frost.torch_face as ft
from frost.torch_face import block, plans, provider
from test import oracle

F = torch.nn.functional


def _rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def _mask_kw(causal=False, window=None, bottom_right=False):
    """test/oracle.py's cuDNN-style keywords of a FlashAttention-style window."""
    kw = {"alignment": "BOTTOM_RIGHT" if bottom_right else "TOP_LEFT"}
    left, right = window if window is not None else (-1, -1)
    if causal:
        right = 0
    if left is not None and left >= 0:
        kw["left_bound"] = left + 1
    if right is not None and right >= 0:
        kw["right_bound"] = right
    return kw


def _close(x, ref, tol=2e-5):
    err = ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert err < tol, f"relative error {err:.2e} >= {tol:.0e}"


CASES = [
    dict(),
    dict(causal=True),
    dict(hkv=1),
    dict(hkv=2, causal=True, sinks=True),
    dict(window=(3, 2)),
    dict(window=(4, 0), bottom_right=True, sk=13),
    dict(layout="bshd", causal=True, hkv=2),
    dict(dv=24),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()) or "plain")
def test_attention_forward_backward_matches_the_oracle(case):
    b, hq, sq, d = 2, 4, 9, 16
    hkv, sk, dv = case.get("hkv", hq), case.get("sk", sq), case.get("dv", d)
    bshd = case.get("layout") == "bshd"
    torch.manual_seed(0)
    q, k, v, do = _rand(b, hq, sq, d), _rand(b, hkv, sk, d), _rand(b, hkv, sk, dv), _rand(b, hq, sq, dv)
    sinks = _rand(hq) if case.get("sinks") else None
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    sink_leaf = sinks.clone().requires_grad_(True) if sinks is not None else None
    args = [t.transpose(1, 2) if bshd else t for t in leaves]
    out, lse = ft.attention(
        *args,
        causal=case.get("causal", False),
        window=case.get("window"),
        sinks=sink_leaf,
        layout="bshd" if bshd else "bhsd",
        return_lse=True,
        diagonal_alignment="bottom_right" if case.get("bottom_right") else "top_left",
    )
    out_bhsd = out.transpose(1, 2) if bshd else out
    out_bhsd.backward(do)
    mask = _mask_kw(case.get("causal", False), case.get("window"), case.get("bottom_right", False))
    o_ref, lse_ref, dq, dk, dv_ref, dsink = oracle.attention_grads(
        q, k, v, do, scale=1 / math.sqrt(d), sink=sinks, **mask
    )
    _close(out_bhsd.detach(), o_ref)
    torch.testing.assert_close(lse.double(), lse_ref, rtol=1e-5, atol=1e-5)
    for got, ref in zip(leaves, (dq, dk, dv_ref)):
        _close(got.grad, ref)
    if sinks is not None:
        _close(sink_leaf.grad, dsink)
    assert lse.dtype == torch.float32 and lse.shape == (b, hq, sq)


def test_varlen_matches_the_oracle_per_sequence():
    torch.manual_seed(1)
    lens_q, lens_k = [5, 0, 11, 3], [7, 4, 11, 9]
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    q, k, v = _rand(sum(lens_q), 4, 16), _rand(sum(lens_k), 2, 16), _rand(sum(lens_k), 2, 16)
    do = _rand(sum(lens_q), 4, 16)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = ft.varlen_attention(
        *leaves, cu_q, cu_k, max(lens_q), max(lens_k), causal=True, diagonal_alignment="bottom_right", return_lse=True
    )
    out.backward(do)
    o_ref, lse_ref, dq, dk, dv, _ = oracle.attention_grads(
        q,
        k,
        v,
        do,
        scale=0.25,
        cu_seq_len_q=cu_q.tolist(),
        cu_seq_len_kv=cu_k.tolist(),
        right_bound=0,
        alignment="BOTTOM_RIGHT",
    )
    _close(out.detach(), o_ref)
    assert lse.shape == (4, q.shape[0])  # head-major, as FlashAttention's varlen lse
    torch.testing.assert_close(lse.t().double(), lse_ref, rtol=1e-5, atol=1e-5)
    for got, ref in zip(leaves, (dq, dk, dv)):
        _close(got.grad, ref)


def _fa_window_reference(q, k, v, window, causal):
    """FlashAttention's definition written out: query i keeps keys i + sk - sq - wl <= j <= i + sk - sq + wr."""
    sq, sk = q.shape[1], k.shape[1]
    wl, wr = window
    if causal:
        wr = 0
    i = torch.arange(sq).view(-1, 1)
    j = torch.arange(sk).view(1, -1)
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if wl >= 0:
        keep &= j >= i + sk - sq - wl
    if wr >= 0:
        keep &= j <= i + sk - sq + wr
    qq, kk, vv = (t.transpose(1, 2).double() for t in (q, k, v))
    return F.scaled_dot_product_attention(qq, kk, vv, attn_mask=keep).transpose(1, 2)


@pytest.mark.parametrize(
    "window,causal", [((2, 1), False), ((3, -1), False), ((-1, 2), False), ((2, 5), True), ((0, 0), False)]
)
def test_flash_attn_func_window_is_flash_attentions(window, causal):
    torch.manual_seed(2)
    q, k, v = _rand(2, 7, 4, 16), _rand(2, 11, 4, 16), _rand(2, 11, 4, 16)
    out = ft.flash_attn_func(q, k, v, causal=causal, window_size=window)
    assert out.shape == q.shape
    _close(out, _fa_window_reference(q, k, v, window, causal))


def test_band_maps_onto_frosts_bounds():
    assert ft.band(False, (3, 2)).graph_keywords() == {"diagonal_band_left_bound": 4, "diagonal_band_right_bound": 2}
    assert ft.band(True).graph_keywords() == {"diagonal_band_right_bound": 0}
    assert ft.band(True, (None, -1), "bottom_right").graph_keywords() == {
        "diagonal_band_right_bound": 0,
        "diagonal_alignment": "BOTTOM_RIGHT",
    }
    assert ft.band(False).graph_keywords() == {}
    with pytest.raises(ValueError, match="causal=True"):
        ft.band(True, (4, 3))
    assert ft.band(True, (4, 3), causal_wins=True) == ft.Band(4, 0, False)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(dropout_p=0.1), "dropout_p"),
        (dict(softcap=30.0), "softcap"),
        (dict(alibi_slopes=torch.ones(4)), "alibi_slopes"),
    ],
)
def test_flash_attn_func_names_what_it_does_not_serve(kwargs, name):
    q = _rand(1, 8, 4, 16)
    with pytest.raises(ft.UnsupportedArgumentError, match=name):
        ft.flash_attn_func(q, q, q, **kwargs)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match=name):
        ft.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 8, 8, **kwargs)


@pytest.mark.parametrize("returns", ["attn_probs", "lse"])
def test_flash_attn_func_returns_lse_and_learns_sinks_as_the_peers(returns):
    """FlashAttention 2's return_attn_probs -> (out, lse, None), FlashAttention 4's return_lse -> (out, lse) and
    its learnable_sink (bf16, as FlashAttention 4 takes it), with its gradient, against float64 math."""
    torch.manual_seed(6)
    b, sq, sk, hq, hkv, d = 2, 7, 11, 4, 2, 16
    q, k, v, do = _rand(b, sq, hq, d), _rand(b, sk, hkv, d), _rand(b, sk, hkv, d), _rand(b, sq, hq, d)
    sink = _rand(hq).bfloat16()
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, sink)]
    got = ft.flash_attn_func(
        *leaves[:3],
        causal=True,
        learnable_sink=leaves[3],
        **({"return_attn_probs": True} if returns == "attn_probs" else {"return_lse": True}),
    )
    assert len(got) == (3 if returns == "attn_probs" else 2)
    out, lse = got[:2]
    if returns == "attn_probs":
        assert got[2] is None
    out.backward(do)
    bhsd = [t.transpose(1, 2) for t in (q, k, v, do)]
    o_ref, lse_ref, dq, dk, dv, dsink = oracle.attention_grads(
        *bhsd, scale=1 / math.sqrt(d), sink=sink.float(), right_bound=0, alignment="BOTTOM_RIGHT"
    )
    _close(out.detach().transpose(1, 2), o_ref)
    assert lse.shape == (b, hq, sq) and lse.dtype == torch.float32 and not lse.requires_grad
    torch.testing.assert_close(lse.double(), lse_ref, rtol=1e-5, atol=1e-5)
    for got_grad, ref in zip(leaves[:3], (dq, dk, dv)):
        _close(got_grad.grad.transpose(1, 2), ref)
    assert leaves[3].grad.dtype == torch.bfloat16
    _close(leaves[3].grad.float(), dsink, tol=1e-2)  # a bf16 gradient


def test_flash_attn_varlen_func_returns_lse_and_learns_sinks():
    torch.manual_seed(7)
    lens_q, lens_k = [5, 11, 3], [7, 11, 9]
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    q, k, v = _rand(sum(lens_q), 4, 16), _rand(sum(lens_k), 2, 16), _rand(sum(lens_k), 2, 16)
    do, sink = _rand(sum(lens_q), 4, 16), _rand(4)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, sink)]
    out, lse, none = ft.flash_attn_varlen_func(
        *leaves[:3], cu_q, cu_k, max(lens_q), max(lens_k), causal=True, return_attn_probs=True, learnable_sink=leaves[3]
    )
    out4, lse4 = ft.flash_attn_varlen_func(
        *leaves[:3], cu_q, cu_k, max(lens_q), max(lens_k), causal=True, return_lse=True, learnable_sink=leaves[3]
    )
    assert none is None and torch.equal(out, out4) and torch.equal(lse, lse4)
    out.backward(do)
    o_ref, lse_ref, dq, dk, dv, dsink = oracle.attention_grads(
        q,
        k,
        v,
        do,
        scale=0.25,
        sink=sink,
        cu_seq_len_q=cu_q.tolist(),
        cu_seq_len_kv=cu_k.tolist(),
        right_bound=0,
        alignment="BOTTOM_RIGHT",
    )
    _close(out.detach(), o_ref)
    assert lse.shape == (4, q.shape[0])
    torch.testing.assert_close(lse.t().double(), lse_ref, rtol=1e-5, atol=1e-5)
    for got, ref in zip(leaves, (dq, dk, dv, dsink)):
        _close(got.grad, ref)


def test_flash_attn_varlen_func_rejects_paged_kv():
    q = _rand(8, 4, 16)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ft.UnsupportedArgumentError, match="block_table.*flash_attn_with_kvcache serves paged"):
        ft.flash_attn_varlen_func(q, q, q, cu, cu, 8, 8, block_table=torch.zeros(1, 1, dtype=torch.int32))


def test_ops_pass_opcheck():
    """Schema, fake kernels (also with dynamic shapes), autograd registration, as torch.library checks them."""
    torch.manual_seed(3)
    q, k, v = _rand(2, 4, 8, 16), _rand(2, 2, 8, 16), _rand(2, 2, 8, 16)
    q_bshd = _rand(2, 8, 4, 16).transpose(1, 2)  # a layout the output must copy
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    torch.library.opcheck(torch.ops.frost.sdpa_fwd, (*leaves, None, None, -1, 0, False, False))
    torch.library.opcheck(torch.ops.frost.sdpa_fwd, (q_bshd, k, v, _rand(4), 0.3, 2, 1, True, False))
    out, lse = torch.ops.frost.sdpa_fwd(q.detach(), k.detach(), v.detach(), None, None, -1, 0, False, False)
    torch.library.opcheck(
        torch.ops.frost.sdpa_bwd,
        (_rand(2, 4, 8, 16), q.detach(), k.detach(), v.detach(), out, lse, None, None, -1, 0, False, False),
    )
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    qp, kp, vp = _rand(8, 4, 16), _rand(8, 2, 16), _rand(8, 2, 16)
    torch.library.opcheck(torch.ops.frost.sdpa_varlen_fwd, (qp, kp, vp, cu, cu, 5, 5, None, None, -1, 0, False, False))


def test_fake_outputs_match_real_metadata():
    from torch._subclasses.fake_tensor import FakeTensorMode

    q = _rand(2, 8, 4, 16).transpose(1, 2)  # BSHD memory: out must keep it
    k, v = _rand(2, 2, 8, 16), _rand(2, 2, 8, 24)
    real = torch.ops.frost.sdpa_fwd(q, k, v, None, None, -1, -1, False, False)
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        fake = torch.ops.frost.sdpa_fwd(fq, fk, fv, None, None, -1, -1, False, False)
    for r, f in zip(real, fake):
        assert (r.shape, r.stride(), r.dtype) == (f.shape, f.stride(), f.dtype)
    assert real[0].stride() == (8 * 4 * 24, 24, 4 * 24, 1)


def _model_step(fn, q, k, v):
    out = fn(q, k, v)
    (out.float() ** 2).sum().backward()
    return out.detach()


def test_torch_compile_fullgraph_dynamic_forward_and_backward():
    """Dynamo + AOT autograd trace the ops whole (fake kernels, autograd formula), with dynamic shapes."""
    torch._dynamo.reset()

    def f(q, k, v):
        return ft.attention(q, k, v, causal=True, layout="bshd")

    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")
    for s in (8, 12):
        torch.manual_seed(s)
        base = [_rand(2, s, 4, 16) for _ in range(3)]
        eager = [t.clone().requires_grad_(True) for t in base]
        comp = [t.clone().requires_grad_(True) for t in base]
        torch.testing.assert_close(_model_step(compiled, *comp), _model_step(f, *eager))
        for a, b in zip(comp, eager):
            torch.testing.assert_close(a.grad, b.grad)


def test_torch_compile_fullgraph_inductor_on_the_cpu():
    """Inductor's own lowering around the op (its outputs' strides come from the fake kernel)."""
    torch._dynamo.reset()

    def f(q, k, v):
        return ft.attention(q, k, v, causal=True, layout="bshd") * 2.0

    torch.manual_seed(5)
    base = [_rand(2, 8, 4, 16) for _ in range(3)]
    eager = [t.clone().requires_grad_(True) for t in base]
    comp = [t.clone().requires_grad_(True) for t in base]
    torch.testing.assert_close(_model_step(torch.compile(f, fullgraph=True), *comp), _model_step(f, *eager))
    for a, b in zip(comp, eager):
        torch.testing.assert_close(a.grad, b.grad)


def test_dense_plans_are_per_shape_and_share_a_specialization():
    ft.clear_plan_cache()
    for b, s in ((1, 8), (3, 8), (1, 16)):
        ft.attention(_rand(b, 2, s, 16), _rand(b, 2, s, 16), _rand(b, 2, s, 16), causal=True)
    info = ft.plan_cache_info()
    assert info["misses"] == 3 and len(info["specializations"]) == 1
    ft.attention(_rand(1, 2, 8, 16), _rand(1, 2, 8, 16), _rand(1, 2, 8, 16), causal=False)
    info = ft.plan_cache_info()
    assert info["misses"] == 4 and len(info["specializations"]) == 2
    ft.attention(_rand(3, 2, 8, 16), _rand(3, 2, 8, 16), _rand(3, 2, 8, 16), causal=True)
    assert ft.plan_cache_info()["hits"] == 1


def test_specialization_never_holds_batch_or_lengths():
    kw = dict(band=ft.band(True), sinks=None, packed=False, arch="sm_90a", scale=None)
    one = ft.specialization("fwd", _rand(1, 4, 8, 64), _rand(1, 2, 8, 64), _rand(1, 2, 8, 64), **kw)
    two = ft.specialization("fwd", _rand(5, 4, 300, 64), _rand(5, 2, 77, 64), _rand(5, 2, 77, 64), **kw)
    assert one == two and hash(one) == hash(two)
    other = ft.specialization(
        "fwd", _rand(1, 4, 8, 64), _rand(1, 2, 8, 64), _rand(1, 2, 8, 64), **{**kw, "band": ft.band(False)}
    )
    assert other != one
    bshd = ft.specialization("fwd", *(_rand(1, 8, h, 64).transpose(1, 2) for h in (4, 2, 2)), **kw)
    assert bshd != one  # the layout class (stride order) is part of it


def test_varlen_totals_share_a_plan_within_an_envelope():
    ft.clear_plan_cache()
    for total in (100, 104, 111):  # one envelope: 112
        cu = torch.tensor([0, total // 2, total], dtype=torch.int32)
        x = _rand(total, 2, 16)
        ft.varlen_attention(x, x, x, cu, cu, 64, 64, causal=True)
    assert ft.plan_cache_info()["misses"] == 1


def test_no_plan_is_built_during_capture(monkeypatch):
    ft.clear_plan_cache()
    q = _rand(1, 2, 8, 16)
    ft.attention(q, q, q)  # warm-up: the plan exists
    monkeypatch.setattr(plans, "capturing", lambda: True)
    ft.attention(q, q, q)  # a cached plan launches during capture
    q2 = _rand(2, 2, 8, 16)
    with pytest.raises(ft.PlanDuringCaptureError, match="warm-up"):
        ft.attention(q2, q2, q2)


def test_plan_cache_is_bounded():
    ft.clear_plan_cache()
    ft.set_plan_cache_size(2)
    try:
        for s in (4, 5, 6):
            x = _rand(1, 2, s, 16)
            ft.attention(x, x, x)
        info = ft.plan_cache_info()
        assert info["size"] == 2 and info["evictions"] == 1
    finally:
        ft.set_plan_cache_size(plans.DEFAULT_SIZE)


def test_threads_plan_each_shape_once():
    ft.clear_plan_cache()
    x = _rand(2, 2, 24, 16)
    errors = []

    def call():
        try:
            ft.attention(x, x, x, causal=True)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and ft.plan_cache_info()["misses"] == 1


def test_deterministic_defaults_to_torchs_flag():
    ft.clear_plan_cache()
    q = _rand(1, 2, 8, 16).requires_grad_(True)
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        ft.attention(q, q, q).sum().backward()
    finally:
        torch.use_deterministic_algorithms(prev)
    bwd = [s for s in ft.plan_cache_info()["specializations"] if s.direction == "bwd"]
    assert bwd and bwd[0].deterministic


def test_eager_inference_skips_the_dispatcher_and_agrees(monkeypatch):
    q = _rand(1, 2, 8, 16)
    direct = ft.attention(q, q, q, causal=True)
    via_op = torch.ops.frost.sdpa_fwd(q, q, q, None, None, -1, 0, False, False)[0]
    assert torch.equal(direct, via_op)
    calls, forward = [], block.forward
    monkeypatch.setattr(block, "forward", lambda *a, **k: calls.append(1) or forward(*a, **k))
    ft.clear_plan_cache()  # no memoized training forward: the first autograd call goes the whole way
    ft.attention(q.clone().requires_grad_(True), q, q)  # autograd: the op's node, whose kernel calls block.forward
    assert calls == [1]


def test_expanded_gradients_are_served():
    q = _rand(1, 2, 8, 16).requires_grad_(True)
    ft.attention(q, q, q).sum().backward()  # sum()'s gradient is an expanded (stride 0) tensor
    assert torch.isfinite(q.grad).all()


def test_reference_backward_ignores_grad_mode():
    q, do = _rand(1, 2, 8, 16), _rand(1, 2, 8, 16)
    out, lse = block.forward(q, q, q, None, None, -1, -1, False)
    with torch.no_grad():
        dq = block.backward(do, q, q, q, out, lse, None, None, -1, -1, False, False)[0]
    assert dq.abs().sum() > 0


def test_provider_kernels_honor_the_aten_contracts():
    torch.manual_seed(4)
    q, k, v = _rand(2, 4, 9, 16), _rand(2, 2, 9, 16), _rand(2, 2, 9, 16)
    out, lse, cq, ck, mq, mk, rng, unused, dbg = provider.sdpa_flash_forward(q, k, v, 0.0, True, False, scale=0.2)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.2, enable_gqa=True)
    _close(out, ref)
    assert out.stride() == torch.empty_like(q).stride() and lse.shape == (2, 4, 9) and (mq, mk) == (9, 9)
    assert rng.shape == (2,) and unused.shape == () and dbg.numel() == 0
    do = _rand(2, 4, 9, 16)
    dq, dk, dv = provider.sdpa_flash_backward(
        do, q, k, v, out, lse, None, None, 9, 9, 0.0, True, rng, unused, scale=0.2
    )
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    F.scaled_dot_product_attention(*leaves, is_causal=True, scale=0.2, enable_gqa=True).backward(do)
    for got, want in zip((dq, dk, dv), leaves):
        _close(got, want.grad.double())
    # aten::_flash_attention_forward, dense BSHD and packed
    qb, kb, vb = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    o2, lse2, *_ = provider.flash_forward(qb, kb, vb, None, None, 9, 9, 0.0, True, False, scale=0.2)
    assert o2.shape == qb.shape and o2.stride() == qb.stride()
    _close(o2.transpose(1, 2), ref)
    cu = torch.tensor([0, 9, 18], dtype=torch.int32)
    o3, lse3, *_ = provider.flash_forward(
        qb.flatten(0, 1), kb.flatten(0, 1), vb.flatten(0, 1), cu, cu, 9, 9, 0.0, True, False, scale=0.2
    )
    assert lse3.shape == (4, 18)
    _close(o3.view(2, 9, 4, 16).transpose(1, 2), ref)
    g = provider.flash_backward(
        do.transpose(1, 2).contiguous().flatten(0, 1),
        qb.flatten(0, 1),
        kb.flatten(0, 1),
        vb.flatten(0, 1),
        o3,
        lse3,
        cu,
        cu,
        9,
        9,
        0.0,
        True,
        rng,
        unused,
        scale=0.2,
    )
    _close(g[0].view(2, 9, 4, 16).transpose(1, 2), leaves[0].grad.double())
    with pytest.raises(ft.UnsupportedArgumentError, match="dropout_p"):
        provider.sdpa_flash_forward(q, k, v, 0.1)
    with pytest.raises(ft.UnsupportedArgumentError, match="seqused_k"):
        provider.flash_forward(qb, kb, vb, None, None, 9, 9, 0.0, False, False, seqused_k=cu)


def test_provider_registers_and_activates_on_request():
    from torch.nn import attention as attn

    if not hasattr(attn, "register_flash_attention_impl"):
        with pytest.raises(RuntimeError, match="no flash-attention provider registry"):
            ft.use_for_sdpa()
        return
    assert ft.PROVIDER_NAME in attn.list_flash_attention_impls()
    assert attn.current_flash_attention_impl() != ft.PROVIDER_NAME  # importing never activates
    ft.use_for_sdpa()
    try:
        assert attn.current_flash_attention_impl() == ft.PROVIDER_NAME and provider.active()
    finally:
        ft.restore_sdpa()
    assert attn.current_flash_attention_impl() is None


def _env():
    """This checkout first on the path of a subprocess."""
    import os
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}


def test_importing_frost_leaves_the_torch_face_unloaded():
    code = "import sys, frost; assert 'frost.torch_face' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env())
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_train_gpt_example_runs_tiny_on_the_cpu(tmp_path):
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    cmd = [
        sys.executable,
        str(root / "examples" / "train_gpt.py"),
        "--device",
        "cpu",
        "--layers",
        "1",
        "--width",
        "64",
        "--heads",
        "2",
        "--context",
        "64",
        "--steps",
        "2",
        "--out-dir",
        str(tmp_path),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env())
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json.loads((tmp_path / "frost_summary.json").read_text())
    assert math.isfinite(summary["final_loss"]) and summary["frost_plans"]["plans"] >= 2
    assert (tmp_path / "frost_loss.png").stat().st_size > 0


def test_provider_restores_where_torch_has_no_restore(monkeypatch):
    """torch 2.10 / 2.11's registry has no restore_flash_attention_impl: frost undoes its own activation."""
    from torch.nn import attention as attn

    if not hasattr(attn, "activate_flash_attention_impl"):
        pytest.skip("this torch has no provider registry")
    monkeypatch.delattr(attn, "restore_flash_attention_impl", raising=False)
    ft.use_for_sdpa()
    assert provider.active() and provider._HANDLE is not None
    ft.restore_sdpa()
    assert attn.current_flash_attention_impl() is None and provider._HANDLE is None


def test_provider_says_when_torch_has_no_registry(monkeypatch):
    from torch.nn import attention as attn

    monkeypatch.delattr(attn, "register_flash_attention_impl", raising=False)
    with pytest.raises(RuntimeError, match="no flash-attention provider registry"):
        ft.use_for_sdpa()
    assert provider.register() is False


_DISPATCH_SCRIPT = r"""
import torch
import frost.torch_face as ft
from frost.torch_face import provider
lib = torch.library.Library("aten", "IMPL", "CPU")  # the provider's kernels on the CPU key, in this process only
for name, fn in provider.KERNELS.items():
    if hasattr(torch.ops.aten, name):
        lib.impl(name, fn, "CPU")
torch.manual_seed(0)
q, k, v = (torch.randn(2, 4, 9, 16) for _ in range(3))
qg = q.clone().requires_grad_(True)
r = torch.ops.aten._scaled_dot_product_flash_attention(qg, k, v, 0.0, True, False, scale=0.2)
assert len(r) == 9 and r[2] is None and (r[4], r[5]) == (9, 9)
ref = qg.detach().clone().requires_grad_(True)
want = torch.nn.functional.scaled_dot_product_attention(ref, k, v, is_causal=True, scale=0.2)
assert (r[0] - want).abs().max() < 1e-5
r[0].backward(torch.ones_like(want))  # aten's derivative formula calls the backward op: frost's kernel
want.backward(torch.ones_like(want))
assert (qg.grad - ref.grad).abs().max() < 1e-5
qb = q.transpose(1, 2).contiguous()
cu = torch.tensor([0, 9, 18], dtype=torch.int32)
r3 = torch.ops.aten._flash_attention_forward(qb.flatten(0, 1), qb.flatten(0, 1), qb.flatten(0, 1), cu, cu, 9, 9, 0.0,
                                             True, False, window_size_left=3)
g3 = torch.ops.aten._flash_attention_backward(torch.ones_like(r3[0]), qb.flatten(0, 1), qb.flatten(0, 1),
                                              qb.flatten(0, 1), r3[0], r3[1], cu, cu, 9, 9, 0.0, True, r3[2], r3[3],
                                              window_size_left=3)
assert r3[1].shape == (4, 18) and [tuple(t.shape) for t in g3] == [(18, 4, 16)] * 3
print("ok")
"""


def test_provider_kernels_through_torchs_dispatcher():
    """aten's flash ops reach the provider's Python kernels with their schema's arguments (CPU key, subprocess)."""
    out = subprocess.run(
        [sys.executable, "-c", _DISPATCH_SCRIPT], capture_output=True, text=True, timeout=300, env=_env()
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("scale", ["abc", float("nan"), float("inf"), True, [0.5]])
def test_a_bad_scale_is_an_error_naming_scale(scale):
    from frost.torch_face import attention, varlen_attention

    q = torch.randn(1, 2, 8, 16)
    want = f"scale must be a finite number (or None for 1/sqrt(head_dim)), got {scale!r}"
    with pytest.raises(ValueError) as ei:
        attention(q, q, q, scale=scale)
    assert str(ei.value) == want
    p = torch.randn(8, 2, 16)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError) as ei:
        varlen_attention(p, p, p, cu, cu, 8, 8, scale=scale)
    assert str(ei.value) == want


@pytest.mark.parametrize("strides", [(256, 128, 8, 1), (256, 8, 16, 1)], ids=["rows overlap", "heads overlap"])
def test_overlapping_input_strides_are_copied_as_the_readme_promises(strides):
    """Two indices of q address one element: frost cannot bind that layout, so the torch face copies it."""
    from frost.torch_face import attention
    from frost.torch_face.ops import overlaps, servable

    base = torch.randn(1000)
    q = base.as_strided((1, 2, 8, 16), strides)
    k, v = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    assert overlaps(q.shape, q.stride()) and servable(q) is not q and servable(q).is_contiguous()
    out = attention(q, k, v)
    assert torch.equal(out, attention(q.contiguous(), k, v))
    fine = torch.randn(1, 8, 2, 16).transpose(1, 2)  # BSHD storage: served as laid out, no copy
    assert not overlaps(fine.shape, fine.stride()) and servable(fine) is fine


def test_the_copy_rule_is_the_graphs_overlap_rule():
    """servable copies exactly the layouts a graph declaration refuses as overlapping."""
    import random

    from frost.ir.tensor import _overlaps
    from frost.torch_face.ops import overlaps

    rng = random.Random(7)
    for _ in range(5000):
        n = rng.randint(1, 4)
        dims, strides = [rng.randint(1, 4) for _ in range(n)], [rng.randint(0, 40) for _ in range(n)]
        assert overlaps(dims, strides) == _overlaps(dims, strides), (dims, strides)
