"""The reference backward uses the O and Stats it is bound, as every engine's backward does.

A block of a longer row (a ring step of context parallelism) is handed the row's merged O and LSE, not its own;
a backward that recomputed them from the block's Q/K/V would give wrong gradients. Two checks: arbitrary bound
O/LSE against float64 closed-form math that reads them, and a key split whose two halves' gradients, each
computed with the whole row's O/LSE, add up to the float64 oracle's gradients of the whole row.
"""

from __future__ import annotations

import pytest
import torch

import frost
from frost.target import CPU
from test import oracle
from test.helpers import assert_close


def _bwd(q, k, v, o, do, lse, *, scale, sink=None, dsink=False, thd=None, **mask):
    """Run frost's backward (reference engine, CPU) on exactly the bound tensors; (dq, dk, dv, dsink or None).
    Dense tensors are (B, H, S, D), lse (B, H, S, 1); with `thd` = (cu_q, cu_kv, max_q, max_kv), (T, H, D) and
    lse (T, H, 1)."""
    g = frost.Graph(
        io_data_type=q.dtype, intermediate_data_type=torch.float32, compute_data_type=torch.float32, target=CPU
    )
    roles = (("q", q), ("k", k), ("v", v), ("o", o), ("dO", do), ("stats", lse))
    hs = {r: g.tensor_like(t, name=r) for r, t in roles}
    pack = {hs[r]: t for r, t in roles}
    kw = dict(mask)
    if thd is not None:
        cu_q, cu_kv, max_q, max_kv = thd
        for name, t in (("cu_seq_len_q", cu_q), ("cu_seq_len_kv", cu_kv)):
            h = g.tensor_like(t, name=name)
            kw[name] = h
            pack[h] = t
        kw.update(max_seq_len_q=max_q, max_seq_len_kv=max_kv)
    dsink_t = None
    if sink is not None:
        h = g.tensor_like(sink, name="sink")
        kw["sink_token"] = h
        pack[h] = sink
        if dsink:
            dsink_t = torch.full_like(sink, float("nan"))
            kw["dSink_token"] = g.tensor_like(dsink_t, name="dSink")
            pack[kw["dSink_token"]] = dsink_t
    grads = g.sdpa_backward(hs["q"], hs["k"], hs["v"], hs["o"], hs["dO"], hs["stats"], attn_scale=scale, **kw)
    for h in grads:
        h.set_output(True)
    g.build_operation_graph().build_plans(engine="reference")
    outs = [torch.full(t.shape, float("nan"), dtype=t.dtype) for t in (q, k, v)]
    pack.update(dict(zip(grads, outs)))
    g.execute(pack, None)
    return (*outs, dsink_t)


def _closed_form(q, k, v, o, do, lse, *, scale, sink=None, causal=False):
    """float64 gradients of dense (B, H, S, D) attention with O and LSE (B, H, S, 1) taken as given."""
    q, k, v, o, do, lse = (t.double() for t in (q, k, v, o, do, lse[..., 0]))
    rep = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = torch.einsum("bhqd,bhkd->bhqk", q, kk) * scale
    if causal:
        sq, sk = s.shape[-2:]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.exp(s - lse.unsqueeze(-1))
    di = (do * o).sum(-1)
    ds = p * (torch.einsum("bhqd,bhkd->bhqk", do, vv) - di.unsqueeze(-1))
    dq = torch.einsum("bhqk,bhkd->bhqd", ds, kk) * scale
    dk = torch.einsum("bhqk,bhqd->bhkd", ds, q) * scale
    dv = torch.einsum("bhqk,bhqd->bhkd", p, do)
    fold = lambda t: t.reshape(t.shape[0], k.shape[1], rep, *t.shape[2:]).sum(2)  # noqa: E731
    dsink = None if sink is None else -(torch.exp(sink.double().view(1, -1, 1) - lse) * di).sum((0, 2))
    return dq, fold(dk), fold(dv), dsink


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bound_o_and_lse_are_used_as_given(causal, dtype):
    gen = torch.Generator().manual_seed(3)
    b, hq, hk, s, d = 2, 4, 2, 7, 8
    q, do = (torch.randn(b, hq, s, d, generator=gen).to(dtype) for _ in range(2))
    k, v = (torch.randn(b, hk, s, d, generator=gen).to(dtype) for _ in range(2))
    sink = torch.randn(hq, generator=gen)
    own_o, own_lse = oracle.attention(q, k, v, scale=0.3, sink=sink, causal=causal)
    o = (own_o + torch.randn(own_o.shape, generator=gen)).to(dtype)  # neither O nor LSE is the block's own
    lse = (own_lse + 0.5 + torch.rand(own_lse.shape, generator=gen)).float().unsqueeze(-1)
    mask = dict(use_causal_mask=True) if causal else {}
    got = _bwd(q, k, v, o, do, lse, scale=0.3, sink=sink, dsink=True, **mask)
    want = _closed_form(q, k, v, o, do, lse, scale=0.3, sink=sink, causal=causal)
    own = _closed_form(q, k, v, own_o, do, own_lse.unsqueeze(-1), scale=0.3, causal=causal)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    for g, w, o_w, what in zip(got, want, own, ("dQ", "dK", "dV", "dSink")):
        assert_close(g, w, what=what, **tol)
        if o_w is not None:  # the check can fail: the block's own O/LSE give other gradients
            assert (g.double() - o_w).abs().max() > 0.1, what


def test_key_halves_with_the_rows_o_and_lse_add_up_to_the_whole():
    """Two K/V halves, each backward bound the whole row's O and LSE: dQ sums, dK/dV concatenate."""
    gen = torch.Generator().manual_seed(5)
    b, hq, hk, s, d = 1, 4, 1, 10, 8
    q, do = (torch.randn(b, hq, s, d, generator=gen) for _ in range(2))
    k, v = (torch.randn(b, hk, s, d, generator=gen) for _ in range(2))
    o, lse, dq_w, dk_w, dv_w, _ = oracle.attention_grads(q, k, v, do, scale=0.4)
    o, lse = o.float(), lse.float().unsqueeze(-1)
    halves = [_bwd(q, k[:, :, sl], v[:, :, sl], o, do, lse, scale=0.4) for sl in (slice(0, 4), slice(4, s))]
    assert_close(halves[0][0] + halves[1][0], dq_w, what="dQ")
    assert_close(torch.cat([halves[0][1], halves[1][1]], 2), dk_w, what="dK")
    assert_close(torch.cat([halves[0][2], halves[1][2]], 2), dv_w, what="dV")


def test_packed_key_halves_with_the_rows_o_and_lse():
    """The same split over a packed batch: the bound (T, H, 1) Stats are read per sequence."""
    gen = torch.Generator().manual_seed(6)
    lens, hq, hk, d = (3, 6), 2, 2, 8
    tq = sum(lens)
    q, do = (torch.randn(tq, hq, d, generator=gen) for _ in range(2))
    k, v = (torch.randn(tq, hk, d, generator=gen) for _ in range(2))
    cu = [0, 3, 9]
    o, lse, dq_w, dk_w, dv_w, _ = oracle.attention_grads(q, k, v, do, scale=0.4, cu_seq_len_q=cu, cu_seq_len_kv=cu)
    o, lse = o.float(), lse.float().unsqueeze(-1)
    split = ([0, 1, 3, 4, 5, 6], [2, 7, 8])  # sequence 0's keys 0-1 | 2, sequence 1's 3-6 | 7-8
    got_dq = torch.zeros_like(q)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for idx, cu_kv in zip(split, ([0, 2, 6], [0, 1, 3])):
        t = torch.tensor
        parts = _bwd(
            q,
            k[idx],
            v[idx],
            o,
            do,
            lse,
            scale=0.4,
            thd=(t(cu, dtype=torch.int32), t(cu_kv, dtype=torch.int32), max(lens), len(idx) // 2 + 1),
        )
        got_dq += parts[0]
        dk[idx], dv[idx] = parts[1], parts[2]
    assert_close(got_dq, dq_w, what="dQ")
    assert_close(dk, dk_w, what="dK")
    assert_close(dv, dv_w, what="dV")
