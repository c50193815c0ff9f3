"""The torch face's cheap paths on the CPU (reference engine): the memoized eager `attention`, the Stats-free
inference plan, pinned launches and the ops' own autograd kernels give the same results and raise the same
errors as the whole way (`Graph.executor` itself: test_executor.py)."""

from __future__ import annotations

import pytest
import torch

import frost.torch_face as ft
from frost.testing.host_floor import NullAttention
from frost.torch_face import block, plans
from test.helpers import error_of

BF16 = torch.bfloat16


def _rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def _op_forward(q, k, v, bshd=False, **kw):
    """The same call through the custom op (the dispatcher, a plan with Stats)."""
    b = ft.band(
        kw.get("causal", False),
        kw.get("window"),
        kw.get("diagonal_alignment", "top_left"),
        causal_wins=kw.get("_causal_wins", False),
    )
    if bshd:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    out, lse = torch.ops.frost.sdpa_fwd(q, k, v, None, kw.get("scale"), b.left, b.right, b.bottom_right, False)
    return (out.transpose(1, 2) if bshd else out), lse


CALLS = [
    dict(),
    dict(causal=True),
    dict(causal=True, return_lse=True),
    dict(window=(3, 2), diagonal_alignment="bottom_right", sk=13),
    dict(layout="bshd", causal=True),
    dict(layout="bshd", return_lse=True, hkv=2),
    dict(dv=24),
    dict(layout="bshd", dv=24, scale=0.3),
]


def _inputs(case, dtype=torch.float32):
    torch.manual_seed(1)
    b, hq, sq, d = 2, 4, 9, 16
    hkv, sk, dv = case.get("hkv", hq), case.get("sk", sq), case.get("dv", d)
    if case.get("layout") == "bshd":
        return _rand(b, sq, hq, d, dtype=dtype), _rand(b, sk, hkv, d, dtype=dtype), _rand(b, sk, hkv, dv, dtype=dtype)
    return _rand(b, hq, sq, d, dtype=dtype), _rand(b, hkv, sk, d, dtype=dtype), _rand(b, hkv, sk, dv, dtype=dtype)


@pytest.mark.parametrize("case", CALLS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()) or "plain")
def test_memoized_eager_calls_match_the_whole_way_and_the_op(case):
    kw = {k: v for k, v in case.items() if k not in ("hkv", "sk", "dv")}
    q, k, v = _inputs(case)
    ft.clear_plan_cache()
    first = ft.attention(q, k, v, **kw)  # the whole way; memoizes
    misses = ft.plan_cache_info()["misses"]
    assert len(plans.PLANS.memo) == 1
    again = ft.attention(q, k, v, **kw)  # the memo
    info = ft.plan_cache_info()
    assert info["misses"] == misses and info["hits"] >= 1
    want_out, want_lse = _op_forward(q, k, v, bshd=kw.get("layout") == "bshd", **kw)
    for got in (first, again):
        out, lse = got if kw.get("return_lse") else (got, None)
        assert torch.equal(out, want_out)
        assert out.shape == want_out.shape and out.stride() == want_out.stride() and out.dtype == want_out.dtype
        if lse is not None:
            assert torch.equal(lse, want_lse) and lse.stride() == want_lse.stride()


def test_memoized_call_allocates_and_launches_only(monkeypatch):
    q = _rand(1, 2, 8, 16)
    ft.clear_plan_cache()
    ft.attention(q, q, q, causal=True)
    called = []
    for name in ("forward", "out_like", "dense_lse"):
        monkeypatch.setattr(block, name, lambda *a, _n=name, **k: called.append(_n))
    monkeypatch.setattr(plans.PlanCache, "lookup", lambda *a: called.append("lookup"))
    out = ft.attention(q, q, q, causal=True)
    assert not called and out.shape == q.shape
    assert torch.isfinite(out).all()


def test_inference_plans_without_stats_and_training_with():
    ft.clear_plan_cache()
    q = _rand(1, 2, 8, 16)
    ft.attention(q, q, q, causal=True)
    ft.attention(q, q, q, causal=True, return_lse=True)
    ft.attention(q.clone().requires_grad_(True), q, q, causal=True)  # autograd: the op, with Stats
    specs = [s for s in ft.plan_cache_info()["specializations"] if s.direction == "fwd"]
    assert sorted(s.has_stats for s in specs) == [False, True]
    assert ft.plan_cache_info()["misses"] == 2  # the op's plan is return_lse's


def test_memo_follows_evictions_and_clears():
    ft.clear_plan_cache()
    ft.set_plan_cache_size(1)
    try:
        a, b = _rand(1, 2, 8, 16), _rand(1, 2, 12, 16)
        out_a = ft.attention(a, a, a)
        ft.attention(b, b, b)  # evicts a's plan: its memo entry goes too
        assert len(plans.PLANS.memo) == 1
        again = ft.attention(a, a, a)  # plans again
        assert torch.equal(again, out_a)
        info = ft.plan_cache_info()
        assert info["misses"] == 3 and info["evictions"] == 2
    finally:
        ft.set_plan_cache_size(plans.DEFAULT_SIZE)
    ft.clear_plan_cache()
    assert not plans.PLANS.memo


BAD_CALLS = [  # (name, call) with a memoized good call of the same shapes before each
    ("k dtype", lambda q, k, v: ft.attention(q, k.double(), v, causal=True)),
    ("v on meta", lambda q, k, v: ft.attention(q, k, v.to("meta"), causal=True)),
    ("layout", lambda q, k, v: ft.attention(q, k, v, causal=True, layout="bhds")),
    ("window vs causal", lambda q, k, v: ft.attention(q, k, v, causal=True, window=(2, 3))),
    ("dropout", lambda q, k, v: ft.attention(q, k, v, causal=True, dropout_p=0.1)),
    ("alignment", lambda q, k, v: ft.attention(q, k, v, causal=True, diagonal_alignment="center")),
    ("3-D k", lambda q, k, v: ft.attention(q, k[0], v, causal=True)),
    ("sinks shape", lambda q, k, v: ft.attention(q, k, v, causal=True, sinks=torch.zeros(3))),
]


@pytest.mark.parametrize("name,bad", BAD_CALLS, ids=[n for n, _ in BAD_CALLS])
def test_errors_are_the_same_with_and_without_the_memo(name, bad):
    q = _rand(1, 2, 8, 16)
    k, v = _rand(1, 2, 8, 16), _rand(1, 2, 8, 16)
    ft.clear_plan_cache()
    cold = error_of(lambda: bad(q, k, v))
    ft.attention(q, k, v, causal=True)  # memoized
    ft.attention(q, k, v, causal=True)
    warm = error_of(lambda: bad(q, k, v))
    assert cold is not None and warm == cold


def test_eager_path_is_not_taken_under_modes_or_autograd(monkeypatch):
    from torch.overrides import TorchFunctionMode

    q = _rand(1, 2, 8, 16)
    ft.attention(q, q, q)  # memoized
    seen = []
    op = block.forward
    monkeypatch.setattr(block, "forward", lambda *a, **k: seen.append(k) or op(*a, **k))

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Mode():
        ft.attention(q, q, q)  # a mode: through the op, whose kernel is block.forward (with Stats)
    leaf = q.clone().requires_grad_(True)
    out = ft.attention(leaf, q, q)
    assert out.grad_fn is not None
    assert seen == [{}, {}]
    out.sum().backward()
    assert leaf.grad is not None and torch.isfinite(leaf.grad).all()


def test_double_backward_is_refused_clearly():
    q = _rand(1, 2, 8, 16).requires_grad_(True)
    out = ft.attention(q, q, q, causal=True)
    (g,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="frost::sdpa_bwd has no derivative"):
        g.sum().backward()


def test_autograd_gradients_match_the_plain_backward():
    torch.manual_seed(2)
    q, k, v, do = (_rand(2, 4, 8, 16) for _ in range(4))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = ft.attention(*leaves, causal=True, return_lse=True)
    out.backward(do)
    assert lse.grad_fn is None and not lse.requires_grad
    dq, dk, dv, _ = block.backward(do, q, k, v, out.detach(), lse, None, None, -1, 0, False, False)
    for got, want in zip((t.grad for t in leaves), (dq, dk, dv)):
        assert torch.equal(got, want)


def test_op_registrations_keep_their_schemas():
    for name, head in (
        ("sdpa_fwd", "frost::sdpa_fwd(Tensor q, Tensor k, Tensor v, Tensor? sinks, float? scale, "),
        ("sdpa_bwd", "frost::sdpa_bwd(Tensor dout, Tensor q, "),
        ("sdpa_varlen_fwd", "frost::sdpa_varlen_fwd(Tensor q, "),
        ("sdpa_varlen_bwd", "frost::sdpa_varlen_bwd(Tensor dout, "),
    ):
        op = getattr(torch.ops.frost, name).default
        assert str(op._schema).startswith(head)
        assert torch.Tag.pt2_compliant_tag in op.tags


def _leaves(*shape, n=3, seed=3):
    torch.manual_seed(seed)
    return [_rand(*shape).requires_grad_(True) for _ in range(n)]


def _op_events(fn) -> set:
    """The frost ops that went through torch's dispatcher while `fn` ran (the profiler records each op call)."""
    with torch.autograd.profiler.profile() as prof:
        fn()
    return {e.name for e in prof.function_events if e.name.startswith("frost::")}


def _fwd_bwd(leaves, do, **kw):
    return torch.autograd.grad(ft.attention(*leaves, **kw), leaves, do)


def test_lean_autograd_path_skips_the_dispatcher_and_matches_the_op():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Mode(TorchDispatchMode):  # any mode (active in the backward too): the op path
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    leaves = _leaves(2, 4, 8, 16)
    do = _rand(2, 4, 8, 16)
    ft.clear_plan_cache()
    lean = [_fwd_bwd(leaves, do, causal=True) for _ in range(3)]  # the whole way, then the training memo twice
    assert any(key[-1] for key in plans.PLANS.memo)  # a training entry
    assert _op_events(lambda: _fwd_bwd(leaves, do, causal=True)) == set()
    with Mode():
        assert _op_events(lambda: _fwd_bwd(leaves, do, causal=True)) >= {"frost::sdpa_fwd", "frost::sdpa_bwd"}
        via_op = _fwd_bwd(leaves, do, causal=True)
    for got in lean:
        for a, b in zip(got, via_op):
            assert torch.equal(a, b)


@pytest.mark.parametrize(
    "case",
    [dict(layout="bshd", return_lse=True), dict(window=(3, 1), sk=13), dict(hkv=2), dict(dv=24, scale=0.3)],
    ids=["bshd-lse", "window", "gqa", "dv"],
)
def test_training_memo_gives_the_ops_gradients(case):
    kw = {k: v for k, v in case.items() if k not in ("hkv", "sk", "dv")}
    q, k, v = (t.requires_grad_(True) for t in _inputs(case))
    ft.clear_plan_cache()
    results = []
    for _ in range(3):  # the whole way (memoized), then the memo twice
        got = ft.attention(q, k, v, **kw)
        out, lse = got if kw.get("return_lse") else (got, None)
        results.append((out, lse, *torch.autograd.grad(out, (q, k, v), torch.ones_like(out))))
    qd, kd, vd = (t.detach() for t in (q, k, v))
    want_out, want_lse = _op_forward(qd, kd, vd, bshd=kw.get("layout") == "bshd", **kw)
    for out, lse, dq, dk, dv in results:
        assert torch.equal(out.detach(), want_out) and out.stride() == want_out.stride()
        if lse is not None:
            assert torch.equal(lse, want_lse)
        assert torch.equal(dq, results[0][2]) and torch.equal(dk, results[0][3]) and torch.equal(dv, results[0][4])
    b = ft.band(False, kw.get("window"))
    bshd = kw.get("layout") == "bshd"
    t = (lambda x: x.transpose(1, 2)) if bshd else (lambda x: x)
    dq, dk, dv, _ = block.backward(
        torch.ones_like(t(want_out)),
        t(qd),
        t(kd),
        t(vd),
        t(want_out),
        want_lse,
        None,
        kw.get("scale"),
        b.left,
        b.right,
        b.bottom_right,
        False,
    )
    for got, want in zip(results[0][2:], (dq, dk, dv)):
        assert torch.equal(got, t(want))


def test_lean_varlen_autograd_matches_the_op():
    torch.manual_seed(5)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    q, k, v = (_rand(12, 2, 16).requires_grad_(True) for _ in range(3))
    do = _rand(12, 2, 16)
    leaves = (q, k, v)
    lean = torch.autograd.grad(ft.varlen_attention(q, k, v, cu, cu, 8, 8, causal=True), leaves, do)
    assert (
        _op_events(lambda: torch.autograd.grad(ft.varlen_attention(q, k, v, cu, cu, 8, 8, causal=True), leaves, do))
        == set()
    )
    out = torch.ops.frost.sdpa_varlen_fwd(q, k, v, cu, cu, 8, 8, None, None, -1, 0, False, False)[0]
    for a, b in zip(lean, torch.autograd.grad(out, leaves, do)):
        assert torch.equal(a, b)


def test_host_time_of_forward_and_backward_under_autograd(monkeypatch):
    """frost's share of one training step's attention host time (forward + `autograd.grad`, launches stubbed):
    the median over many interleaved bursts of frost's time minus torch's floor (a kernel-less autograd.Function
    with the same outputs) stays within 40 us. Through the dispatcher it was about 70 us."""
    import statistics
    import time

    from frost.adapters import reference

    ft.clear_plan_cache()  # plans made after the stub bind it
    monkeypatch.setattr(reference.SdpaFwdReference, "execute", lambda self, bound, workspace, stream: None)
    monkeypatch.setattr(reference.SdpaBwdReference, "execute", lambda self, bound, workspace, stream: None)
    try:
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(1, 128, 1, 64, dtype=BF16) for _ in range(4))
        leaves = [t.transpose(1, 2).detach().requires_grad_(True) for t in (q, k, v)]
        do = do.transpose(1, 2)

        def frost_step():
            return torch.autograd.grad(ft.attention(*leaves, causal=True), leaves, do)

        def floor_step():
            return torch.autograd.grad(NullAttention.apply(*leaves)[0], leaves, do)

        def burst(fn, n=50):
            t0 = time.thread_time_ns()
            for _ in range(n):
                fn()
            return (time.thread_time_ns() - t0) / n / 1e3

        for _ in range(100):
            frost_step(), floor_step()
        shares = [burst(frost_step) - burst(floor_step) for _ in range(41)]
        share = statistics.median(shares)
        assert share <= 40.0, f"frost's share of fwd+bwd host time {share:.1f} us (bursts: {sorted(shares)})"
    finally:
        ft.clear_plan_cache()


def test_training_memo_survives_evictions():
    """A memoized training step whose forward or backward plan was evicted plans again and gives the same
    gradients (the memo forgets a dead forward; a dead backward plan is rebuilt by its strides)."""
    leaves = _leaves(1, 2, 8, 16)
    other = _leaves(1, 2, 12, 16, seed=4)
    do, do_other = _rand(1, 2, 8, 16), _rand(1, 2, 12, 16)
    ft.clear_plan_cache()
    want = _fwd_bwd(leaves, do, causal=True)
    ft.set_plan_cache_size(2)
    try:
        for _ in range(3):
            _fwd_bwd(other, do_other, causal=True)  # two plans of another shape evict this one's
            for _ in range(2):
                got = _fwd_bwd(leaves, do, causal=True)
                for a, b in zip(got, want):
                    assert torch.equal(a, b)
        assert ft.plan_cache_info()["evictions"] >= 4
    finally:
        ft.set_plan_cache_size(plans.DEFAULT_SIZE)
        ft.clear_plan_cache()


def test_training_memo_rebuilds_a_dead_backward_plan():
    leaves = _leaves(1, 2, 8, 16)
    x, do = _rand(1, 2, 12, 16), _rand(1, 2, 8, 16)
    ft.clear_plan_cache()
    ft.set_plan_cache_size(2)
    try:
        want = _fwd_bwd(leaves, do, causal=True)  # the whole way: forward and backward plans, memoized
        _fwd_bwd(leaves, do, causal=True)  # the memo: its backward plan recorded by the gradient's strides
        out = ft.attention(*leaves, causal=True)  # the forward plan is now the more recent
        ft.attention(x, x, x)  # evicts the backward plan only
        misses = ft.plan_cache_info()["misses"]
        got = torch.autograd.grad(out, leaves, do)
        assert ft.plan_cache_info()["misses"] == misses + 1  # the dead backward plan was planned again
        for a, b in zip(got, want):
            assert torch.equal(a, b)
    finally:
        ft.set_plan_cache_size(plans.DEFAULT_SIZE)
        ft.clear_plan_cache()
