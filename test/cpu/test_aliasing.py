"""Outputs that share memory with another bound tensor (or the workspace) are a BindingError naming both ports;
nothing is written. Inputs may share memory; interleaved views that provably never touch one byte pass."""

from __future__ import annotations

import pytest
import torch

import frost
from frost.errors import BindingError
from frost.runtime.aliasing import byte_span, disjoint, never_touch

SENTINEL = 12345.0
F32 = torch.float32


def _fwd(shape=(1, 2, 8, 16), score_max=False):
    g = frost.Graph(io_data_type=F32, intermediate_data_type=F32, compute_data_type=F32)
    like = torch.empty(shape)
    q, k, v = (g.tensor_like(like, name=n) for n in ("q", "k", "v"))
    extra = {}
    if score_max:
        extra["score_max"] = g.tensor(
            name="smax",
            dim=(shape[0], shape[1], shape[2], 1),
            stride=(shape[1] * shape[2], shape[2], 1, 1),
            data_type=F32,
        )
    o, st = g.sdpa(q, k, v, attn_scale=0.25, generate_stats=True, use_causal_mask=True, **extra)
    o.set_output(True)
    st.set_output(True).set_data_type(F32)
    g.validate()
    g.build_plans()
    return g, (q, k, v, o, st, extra.get("score_max"))


def _bwd(shape=(1, 2, 8, 16)):
    g = frost.Graph(io_data_type=F32, intermediate_data_type=F32, compute_data_type=F32)
    like = torch.empty(shape)
    q, k, v, o, do = (g.tensor_like(like, name=n) for n in ("q", "k", "v", "o", "dO"))
    st = g.tensor_like(torch.empty(*shape[:3], 1), name="stats")
    dq, dk, dv = g.sdpa_backward(q, k, v, o, do, st, attn_scale=0.25, use_causal_mask=True)
    for t in (dq, dk, dv):
        t.set_output(True)
    g.validate()
    g.build_plans()
    return g, (q, k, v, o, do, st, dq, dk, dv)


def _filled(*shape):
    return torch.full(shape, SENTINEL)


def _fwd_pack(ports, q, k, v, o, lse, smax=None):
    pq, pk, pv, po, pst, psm = ports
    pack = {pq: q, pk: k, pv: v, po: o, pst: lse}
    if psm is not None:
        pack[psm] = smax
    return pack


def _raises_untouched(run, text: str, *outs):
    before = [t.clone() for t in outs]
    with pytest.raises(BindingError) as ei:
        run()
    assert text in str(ei.value), str(ei.value)
    for t, b in zip(outs, before):
        assert torch.equal(t, b), "a rejected execute wrote an output"
    return str(ei.value)


def _all_paths(g, ports, tensors, text, *outs):
    """execute, the executor's checked call and its launch fast path raise the same error, writing nothing."""
    pack = {p: t for p, t in zip(ports, tensors) if p is not None}
    live = [p for p in ports if p is not None]
    _raises_untouched(lambda: g.execute(pack), text, *outs)
    ex = g.executor(live)
    _raises_untouched(lambda: ex(tuple(pack[p] for p in live)), text, *outs)
    _raises_untouched(lambda: ex.launch(tuple(pack[p] for p in live)), text, *outs)


def test_output_is_an_input():
    g, ports = _fwd()
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    lse = _filled(1, 2, 8, 1)
    q_before = q.clone()
    pack = (q, k, v, q, lse)
    msg = "output tensor 'sdpa::O' (o) shares memory with tensor 'q'"
    _all_paths(g, ports[:5], pack, msg, q, lse)
    assert torch.equal(q, q_before)


def test_output_a_view_of_v_and_partial_overlap():
    g, ports = _fwd()
    buf = torch.randn(2 * 256 + 64)
    q, k = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    v = buf[:256].view(1, 2, 8, 16)
    o = buf[256 - 32 : 512 - 32].view(1, 2, 8, 16)  # its first 32 elements are v's last
    lse = _filled(1, 2, 8, 1)
    o_tail = o[..., 2:, :].clone()
    _all_paths(g, ports[:5], (q, k, v, o, lse), "output tensor 'sdpa::O' (o) shares memory with tensor 'v'", lse)
    assert torch.equal(o[..., 2:, :], o_tail)


def test_stats_and_score_max_in_one_tensor():
    g, ports = _fwd(score_max=True)
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    o, rows = _filled(1, 2, 8, 16), _filled(1, 2, 8, 1)
    msg = _raises_untouched(lambda: g.execute(_fwd_pack(ports, q, k, v, o, rows, rows)), "shares memory with", o, rows)
    assert "'sdpa::Stats' (stats)" in msg and "'smax' (score_max)" in msg


def test_backward_dq_and_dk_in_one_tensor_and_dq_in_dO():
    g, ports = _bwd()
    q, k, v, o, do = (torch.randn(1, 2, 8, 16) for _ in range(5))
    st = torch.randn(1, 2, 8, 1)
    dq, dv = _filled(1, 2, 8, 16), _filled(1, 2, 8, 16)
    _all_paths(
        g,
        ports,
        (q, k, v, o, do, st, dq, dq, dv),
        "output tensor 'sdpa_backward::dQ' (dQ) shares memory with tensor 'sdpa_backward::dK' (dK)",
        dq,
        dv,
    )
    dk = _filled(1, 2, 8, 16)
    do_before = do.clone()
    _all_paths(
        g,
        ports,
        (q, k, v, o, do, st, do, dk, dv),
        "output tensor 'sdpa_backward::dQ' (dQ) shares memory with tensor 'dO'",
        dk,
        dv,
    )
    assert torch.equal(do, do_before)


def test_inputs_may_share_memory_and_adjacent_spans_pass():
    g, ports = _fwd()
    x = torch.randn(1, 2, 8, 16)
    buf = torch.full((2 * 256 + 16,), SENTINEL)
    o = buf[:256].view(1, 2, 8, 16)
    lse = buf[256:272].view(1, 2, 8, 1)  # starts exactly where o ends
    g.execute(_fwd_pack(ports, x, x, x, o, lse))  # q, k and v one tensor: nothing writes it
    want_o, want_l = torch.empty(1, 2, 8, 16), torch.empty(1, 2, 8, 1)
    g.execute(_fwd_pack(ports, x, x, x, want_o, want_l))
    assert torch.equal(o, want_o) and torch.equal(lse, want_l)
    assert (buf[272:] == SENTINEL).all()


def test_interleaved_gradients_of_one_packed_buffer_pass():
    """dQ, dK, dV as the slices of one (B, S, 3, H, D) buffer (FlashAttention's qkv-packed gradients)."""
    g = frost.Graph(io_data_type=F32, intermediate_data_type=F32, compute_data_type=F32)
    qkv = torch.randn(1, 8, 3, 2, 16)
    q_t, k_t, v_t = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    o_t, do_t = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    st_t = torch.randn(1, 2, 8, 1)
    q, k, v = (g.tensor_like(t, name=n) for t, n in ((q_t, "q"), (k_t, "k"), (v_t, "v")))
    o, do = g.tensor_like(o_t, name="o"), g.tensor_like(do_t, name="dO")
    st = g.tensor_like(st_t, name="stats")
    grads = g.sdpa_backward(q, k, v, o, do, st, attn_scale=0.25)
    dqkv = torch.full((1, 8, 3, 2, 16), SENTINEL)
    views = [dqkv[:, :, i].transpose(1, 2) for i in range(3)]
    for t, view in zip(grads, views):
        t.set_output(True).set_stride(list(view.stride()))
    g.validate()
    g.build_plans()
    pack = {q: q_t, k: k_t, v: v_t, o: o_t, do: do_t, st: st_t, **dict(zip(grads, views))}
    g.execute(pack)
    assert not (dqkv == SENTINEL).any()
    # but one of them bound where it overlaps the input q: refused
    pack[grads[1]] = q_t
    _raises_untouched(lambda: g.execute(pack), "output tensor 'sdpa_backward::dK' (dK) shares memory with tensor 'q'")


def test_remembered_addresses_never_hide_an_alias():
    g, ports = _fwd()
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    o, lse = torch.empty(1, 2, 8, 16), torch.empty(1, 2, 8, 1)
    g.execute(_fwd_pack(ports, q, k, v, o, lse))
    g.execute(_fwd_pack(ports, q, k, v, o, lse))  # the remembered clear set
    for _ in range(2):
        with pytest.raises(BindingError, match="shares memory with tensor 'k'"):
            g.execute(_fwd_pack(ports, q, k, v, k, lse))


def test_recurring_clear_address_sets_are_remembered_and_never_hide_an_alias(monkeypatch):
    """Outputs alternating between buffers found clear are looked up, not sorted again; a set with an alias is
    never remembered, and the memory is bounded (forgotten all at once when full)."""
    from frost.runtime import aliasing

    monkeypatch.setattr(aliasing, "REMEMBERED", 3)
    g, ports = _fwd()
    guard = g._binder.aliasing
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    outs = [(torch.empty(1, 2, 8, 16), torch.empty(1, 2, 8, 1)) for _ in range(4)]
    sorts = []
    monkeypatch.setattr(aliasing, "sorted", lambda x: sorts.append(1) or sorted(x), raising=False)
    for i in (0, 1, 0, 1, 0):
        g.execute(_fwd_pack(ports, q, k, v, *outs[i]))
    assert len(sorts) == 2 and len(guard.seen) == 2  # A and B checked once each
    for _ in range(2):
        with pytest.raises(BindingError, match="shares memory with tensor 'k'"):
            g.execute(_fwd_pack(ports, q, k, v, k, outs[0][1]))
    assert len(guard.seen) == 2
    sorts.clear()
    g.execute(_fwd_pack(ports, q, k, v, *outs[1]))
    assert not sorts
    g.execute(_fwd_pack(ports, q, k, v, *outs[2]))
    g.execute(_fwd_pack(ports, q, k, v, *outs[3]))  # a fourth set: the memory of three starts over
    assert len(guard.seen) == 1
    g.execute(_fwd_pack(ports, q, k, v, *outs[0]))
    assert len(guard.seen) == 2 and len(sorts) == 3


def test_never_touch_proofs():
    m = torch.zeros(8, 32)
    left, right = m[:, :16], m[:, 16:]
    assert never_touch(left, right) and never_touch(right, left)
    assert not never_touch(m[:, :17], m[:, 16:])  # one column shared
    assert never_touch(m[:, ::2], m[:, 1::2])  # even and odd elements
    assert not never_touch(m[:, ::2], m[:, 2::2])  # both hold element 2
    assert not never_touch(m[:4], m[2:])  # one block each (gcd 0): the spans decide
    a, b = byte_span(left), byte_span(right)
    assert a[0] < b[1] and b[0] < a[1]  # their spans do intersect
    assert disjoint([0, 10, 20], (10, 10, 5)) and not disjoint([0, 9, 20], (10, 10, 5))
    assert disjoint([0, 5, 5], (10, 0, 0)) is not None


def test_torch_face_out_argument_is_checked():
    from frost.torch_face import block as run

    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    q_before = q.clone()
    with pytest.raises(BindingError, match="shares memory with tensor 'q'"):
        run.forward(q, k, v, None, 0.25, -1, -1, False, out=q)
    assert torch.equal(q, q_before)
    out = torch.full_like(q, SENTINEL)
    run.forward(q, k, v, None, 0.25, -1, -1, False, out=out)  # a separate out is served
    assert not (out == SENTINEL).any()


def test_the_workspace_counts_as_written():
    from frost.runtime.aliasing import AliasGuard

    buf = torch.zeros(1024, dtype=torch.uint8)
    q, o = buf[:256], buf[512:768]
    guard = AliasGuard(["tensor 'q'", "tensor 'o'"], [False, True], [256, 256], workspace_size=128)
    guard.fast([q.data_ptr() + 1, o.data_ptr() + 1], (q, o), buf[256:384])  # disjoint: fine
    with pytest.raises(BindingError) as ei:
        guard.fast([q.data_ptr() + 1, o.data_ptr() + 1], (q, o), buf[128:])
    assert str(ei.value).startswith("output workspace shares memory with tensor 'q'")
    packed = AliasGuard(["tensor 'q'", "tensor 'o'"], [False, True], [None, None], workspace_size=0)
    with pytest.raises(BindingError, match="output tensor 'o' shares memory with tensor 'q'"):
        packed.fast([0, 0], (buf[:300], buf[256:512]), None)  # spans from the tensors themselves
