"""score_max / score_sum_exp and split K/V heads on the reference engine (CPU) against the float64 oracle: frost's
packed form, and cuDNN's ragged-offset form with one row statistic ragged and one per batch."""

from __future__ import annotations

import torch

import frost
from test import oracle


def _close(got, want):
    torch.testing.assert_close(got.double(), want.double(), atol=1e-5, rtol=1e-5)


def test_packed_split_heads_with_row_stats_and_a_sink():
    hq, hk, hv, d = 8, 2, 4, 16
    cu_q, cu_kv = [0, 3, 3, 12], [0, 5, 9, 18]  # query lengths 3, 0 (an empty sequence), 9; keys 5, 4, 9
    g = frost.pygraph(io_data_type=frost.data_type.FLOAT)
    q, k, v = g.tensor((12, hq, d)), g.tensor((18, hk, d)), g.tensor((18, hv, d))
    cq, ck = (g.tensor((4,), (1,), frost.data_type.INT32) for _ in range(2))
    sink = g.tensor((hq,), (1,), frost.data_type.FLOAT)
    mx = g.tensor((12, hq, 1), (1, 12, 1), frost.data_type.FLOAT)  # head-major
    se = g.tensor((12, hq, 1), (hq, 1, 1), frost.data_type.FLOAT)
    o, _ = g.sdpa(
        q,
        k,
        v,
        attn_scale=0.3,
        use_causal_mask=True,
        cu_seq_len_q=cq,
        cu_seq_len_kv=ck,
        max_seq_len_q=9,
        max_seq_len_kv=9,
        sink_token=sink,
        score_max=mx,
        score_sum_exp=se,
    )
    o.set_output(True)
    g.validate()
    g.build_plans()
    t = {
        q: torch.randn(12, hq, d),
        k: torch.randn(18, hk, d),
        v: torch.randn(18, hv, d),
        sink: torch.randn(hq),
        cq: torch.tensor(cu_q, dtype=torch.int32),
        ck: torch.tensor(cu_kv, dtype=torch.int32),
    }
    outs = {
        o: torch.full((12, hq, d), float("nan")),
        mx: torch.full((hq, 12, 1), float("nan")).permute(1, 0, 2),
        se: torch.full((12, hq, 1), float("nan")),
    }
    g.execute({**t, **outs}, None)
    ro, _, rmax, rsum = oracle.attention(
        t[q], t[k], t[v], scale=0.3, sink=t[sink], causal=True, cu_seq_len_q=cu_q, cu_seq_len_kv=cu_kv, row_stats=True
    )
    _close(outs[o], ro)
    _close(outs[mx][..., 0], rmax)
    _close(outs[se][..., 0], rsum)


def test_ragged_form_row_stats_ragged_and_per_batch():
    b, h, s, d = 3, 2, 8, 16
    lens_q, lens_kv = [5, 0, 8], [7, 3, 8]
    g = frost.pygraph(io_data_type=frost.data_type.FLOAT)
    stride = (s * h * d, d, h * d, 1)
    q, k, v = (g.tensor((b, h, s, d), stride) for _ in range(3))
    lq, lk = (g.tensor((b, 1, 1, 1), (1, 1, 1, 1), frost.data_type.INT32) for _ in range(2))
    off_q, off_kv, off_st = (g.tensor((b + 1, 1, 1, 1), (1, 1, 1, 1), frost.data_type.INT64) for _ in range(3))
    for t_, off in ((q, off_q), (k, off_kv), (v, off_kv)):
        t_.set_ragged_offset(off)
    mx = g.tensor((b, h, s, 1), (s * h, 1, h, 1), frost.data_type.FLOAT)
    mx.set_ragged_offset(off_st)
    se = g.tensor((b, h, s, 1), (h * s, s, 1, 1), frost.data_type.FLOAT)  # per batch, no offset
    o, _ = g.sdpa(
        q,
        k,
        v,
        attn_scale=0.25,
        use_padding_mask=True,
        seq_len_q=lq,
        seq_len_kv=lk,
        diagonal_band_right_bound=0,
        score_max=mx,
        score_sum_exp=se,
    )
    o.set_output(True).set_ragged_offset(off_q)
    g.validate()
    assert g.facts.ragged.stats_per_batch
    g.build_plans()
    pq = torch.tensor([0, 5, 5, 13]).view(-1, 1, 1, 1)
    pk = torch.tensor([0, 7, 10, 18]).view(-1, 1, 1, 1)
    x = {n: torch.randn(b * s * h * d).as_strided((b, h, s, d), stride) for n in "qkv"}
    ot = torch.full((b * s * h * d,), float("nan")).as_strided((b, h, s, d), stride)
    mt = torch.full((b * s * h,), float("nan")).as_strided((b, h, s, 1), (s * h, 1, h, 1))
    st = torch.full((b, h, s, 1), float("nan"))
    g.execute(
        {
            q: x["q"],
            k: x["k"],
            v: x["v"],
            o: ot,
            mx: mt,
            se: st,
            lq: torch.tensor(lens_q, dtype=torch.int32).view(-1, 1, 1, 1),
            lk: torch.tensor(lens_kv, dtype=torch.int32).view(-1, 1, 1, 1),
            off_q: pq * h * d,
            off_kv: pk * h * d,
            off_st: pq * h,
        },
        None,
    )
    flat = {n: t.permute(0, 2, 1, 3).reshape(b * s, h, d) for n, t in x.items()}  # token rows in memory order
    _, _, rmax, rsum = oracle.attention(
        flat["q"],
        flat["k"],
        flat["v"],
        scale=0.25,
        causal=True,
        row_stats=True,
        cu_seq_len_q=pq.view(-1).tolist(),
        cu_seq_len_kv=pk.view(-1).tolist(),
    )
    got_max = mt[..., 0].permute(0, 2, 1).reshape(b * s, h)[:13]  # the ragged rows
    _close(got_max, rmax[:13])
    for i in range(b):  # per batch: the sequence's rows, then -inf / 0 past its length
        rows = rsum[int(pq[i]) : int(pq[i + 1])].t()
        _close(st[i, :, : lens_q[i], 0], rows)
        assert torch.equal(st[i, :, lens_q[i] :, 0], torch.zeros(h, s - lens_q[i]))
