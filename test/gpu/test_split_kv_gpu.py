"""Decode on the mma.sync forward (`engine="sm80"`) and the wgmma forward (`engine="sm90"`, on an H100 / H200; each
test runs once per engine), on a GPU, against the float64 oracle: split-KV over long caches
(1 x 32k and 2 x 128k keys, GQA 32:8, D=128), dense and paged, sinks, a causal band, empty sequences, requested
split counts with empty splits, a CUDA-graph replay after new lengths are written into the same tensors, and GQA
packing (the query heads of a KV group in one tile) with and without splits; packed (THD) query batches in frost's
packed form and cuDNN's ragged offsets (ragged lengths, empty sequences, 1..16 query tokens, replays), and
score_max / score_sum_exp of split decodes, dense, paged and packed. The
workspace is poisoned (NaN) before each run, O and Stats too: every element the combine reads or writes must be
written. Run: python3 -m pytest -q -m gpu test/gpu/test_split_kv_gpu.py
"""

from __future__ import annotations

import math

import pytest
import torch

import frost
from test import oracle
from test.gpu.graph_cases import capture_after_clean_execute
from test.oracle import assert_close_to_oracle

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16
HQ, HKV, D = 32, 8, 128
#: the engine and device under test (a host dry run of these helpers may set "reference" and "cpu"); the `engine`
#: fixture sets ENGINE to each of ENGINES in turn
ENGINE, DEVICE = "sm80", "cuda"
ENGINES = {"sm80": "SdpaFwdDslSm80", "sm90": "SdpaFwdDslSm90"}
SCALE = 1.0 / math.sqrt(D)


@pytest.fixture(autouse=True, params=list(ENGINES))
def engine(request):
    """Each test on each DSL forward; the wgmma one only on an SM90 GPU."""
    global ENGINE
    if request.param == "sm90" and torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma forward runs on SM90 GPUs")
    ENGINE = request.param
    yield request.param
    ENGINE = "sm80"


def _graph(batch, sq, skv, *, paged=0, lens=False, sink=False, knobs=None, scores=False, **sdpa_kw):
    """A decode graph on the GPU: (graph, pack, inputs). Dense K/V (B, Hkv, Skv, D), or a paged cache of block
    size `paged` whose blocks are a shuffled pool; `lens`: a padding mask (seq_len_q / seq_len_kv tensors);
    `scores`: score_max and score_sum_exp outputs (poisoned) too."""
    gen = torch.Generator().manual_seed(batch * 7 + sq + skv % 97 + paged)
    x = {"q": torch.randn(batch, HQ, sq, D, generator=gen).to(BF16)}
    g = frost.pygraph(
        io_data_type=frost.data_type.BFLOAT16,
        intermediate_data_type=frost.data_type.FLOAT,
        compute_data_type=frost.data_type.FLOAT,
    )
    kw = dict(sdpa_kw)
    if paged:
        per_seq = -(-skv // paged)
        blocks = batch * per_seq + 5
        x["kc"], x["vc"] = (torch.randn(blocks, HKV, paged, D, generator=gen).to(BF16) for _ in range(2))
        perm = torch.randperm(blocks, generator=gen)[: batch * per_seq].to(torch.int32)
        x["kt"] = perm.reshape(batch, 1, per_seq, 1)
        x["vt"] = perm.flip(0).reshape(batch, 1, per_seq, 1).contiguous()
        kw.update(paged_attention_max_seq_len_kv=skv)
    else:
        x["k"], x["v"] = (torch.randn(batch, HKV, skv, D, generator=gen).to(BF16) for _ in range(2))
    if lens or paged:
        x["lq"] = torch.full((batch, 1, 1, 1), sq, dtype=torch.int32)
        x["lk"] = torch.full((batch, 1, 1, 1), skv, dtype=torch.int32)
    if sink:
        x["sink"] = torch.randn(1, HQ, 1, 1, generator=gen) * 2
    if scores:
        x["smax"], x["ssum"] = (torch.full((batch, HQ, sq, 1), float("nan")) for _ in range(2))
    t = {n: g.tensor(name=n, dim=v.shape, stride=v.stride(), data_type=_dtype(v)) for n, v in x.items()}
    if scores:
        kw.update(score_max=t["smax"], score_sum_exp=t["ssum"])
    k, v = (t["kc"], t["vc"]) if paged else (t["k"], t["v"])
    if paged:
        kw.update(paged_attention_k_table=t["kt"], paged_attention_v_table=t["vt"])
    if "lq" in t:
        kw.update(use_padding_mask=True, seq_len_q=t["lq"], seq_len_kv=t["lk"])
    if sink:
        kw["sink_token"] = t["sink"]
    o, st = g.sdpa(q=t["q"], k=k, v=v, attn_scale=SCALE, generate_stats=True, **kw)
    x["o"] = torch.full((batch, HQ, sq, D), float("nan"), dtype=BF16)
    x["lse"] = torch.full((batch, HQ, sq, 1), float("nan"))
    o.set_output(True).set_dim(x["o"].shape).set_stride(x["o"].stride())
    st.set_output(True).set_data_type(frost.data_type.FLOAT).set_dim(x["lse"].shape).set_stride(x["lse"].stride())
    t["o"], t["lse"] = o, st
    g.validate()
    g.build_plans(engine=ENGINE, knobs=knobs)
    assert ENGINE not in ENGINES or g.engine_name == ENGINES[ENGINE], g.engine_name
    dev = {n: v.to(DEVICE) for n, v in x.items()}
    pack = {t[n]: dev[n] for n in x}
    return g, pack, x, dev


def _dtype(v):
    return {BF16: frost.data_type.BFLOAT16, torch.float32: frost.data_type.FLOAT, torch.int32: frost.data_type.INT32}[
        v.dtype
    ]


def _workspace(g):
    """The plan's workspace, poisoned with NaN (0xFF bytes): a partial the forward leaves unwritten shows."""
    assert ENGINE not in ENGINES or g.get_workspace_size() > 0  # a split plan's partials
    return torch.full((g.get_workspace_size(),), 255, dtype=torch.uint8, device=DEVICE)


def _keys(x, b, lk):
    """Sequence b's first lk keys and values as (Hkv, lk, D) float64 (gathered through the tables when paged)."""
    if "kc" not in x or lk == 0:
        return x["k" if "k" in x else "kc"][b, :, :lk].double(), x["v" if "v" in x else "vc"][b, :, :lk].double()
    bs = x["kc"].shape[2]
    out = []
    for c, table in ((x["kc"], x["kt"]), (x["vc"], x["vt"])):
        blocks = table[b, 0, : -(-lk // bs), 0].long()
        out.append(c[blocks].permute(1, 0, 2, 3).reshape(HKV, -1, D)[:, :lk].double())
    return out


def _oracle(x, lens_q, lens_kv, **mask):
    """The float64 oracle, one (sequence, KV group) at a time (a 128k cache in float64 stays small)."""
    b_n, _, sq, _ = x["q"].shape
    qpk = HQ // HKV
    o = torch.zeros(b_n, HQ, sq, D, dtype=torch.float64)
    lse = torch.full((b_n, HQ, sq), -math.inf, dtype=torch.float64)
    s_max, s_sum = lse.clone(), torch.zeros_like(lse)
    for b in range(b_n):
        k, v = _keys(x, b, lens_kv[b])
        for kh in range(HKV):
            hs = slice(kh * qpk, (kh + 1) * qpk)
            sink = x["sink"].reshape(-1)[hs] if "sink" in x else None
            ob, lb, mb, zb = oracle.attention(
                x["q"][b : b + 1, hs],
                k[None, kh : kh + 1],
                v[None, kh : kh + 1],
                scale=SCALE,
                sink=sink,
                seq_len_q=[lens_q[b]],
                seq_len_kv=[lens_kv[b]],
                row_stats=True,
                **mask,
            )
            o[b, hs], lse[b, hs] = ob[0], lb.reshape(qpk, sq)
            s_max[b, hs], s_sum[b, hs] = mb.reshape(qpk, sq), zb.reshape(qpk, sq)
    return o, lse, s_max, s_sum


def _check_scores(got_max, got_sum, want_max, want_sum):
    """score_max (natural units, like the LSE) and score_sum_exp (1 up to the number of keys) against the oracle."""
    assert_close_to_oracle(got_max, want_max, rel=1e-4, max_abs=1e-2, name="score_max", io_dtype=BF16)
    assert_close_to_oracle(got_sum, want_sum, rel=1e-3, name="score_sum_exp", io_dtype=BF16)


def _check(g, dev, x, lens_q, lens_kv, **mask):
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    o, lse, s_max, s_sum = _oracle(x, lens_q, lens_kv, **mask)
    assert_close_to_oracle(dev["o"], o, rel=1e-2, name="O", io_dtype=BF16)
    assert_close_to_oracle(dev["lse"][..., 0], lse, rel=1e-4, max_abs=1e-2, name="LSE", io_dtype=BF16)
    if "smax" in dev:
        _check_scores(dev["smax"][..., 0], dev["ssum"][..., 0], s_max, s_sum)


def _split_count(g) -> int:
    return g.plan.adapter.params.num_splits if ENGINE in ENGINES else 2


def _packed(g) -> bool:
    return g.plan.adapter.params.pack_gqa if ENGINE in ENGINES else True


CASES = {  # name: (batch, sq, skv, paged block size, graph keywords, oracle mask)
    "dense-1x32k": (1, 1, 32768, 0, {}, {}),
    "dense-2x128k": (2, 1, 131072, 0, {}, {}),
    "dense-1x32k-sinks": (1, 1, 32768, 0, dict(sink=True), {}),
    "dense-2x128k-sq4-causal": (
        2,
        4,
        131072,
        0,
        dict(use_causal_mask_bottom_right=True),
        dict(causal_bottom_right=True),
    ),
    "paged-1x32k": (1, 1, 32768, 64, {}, {}),
    "paged-2x128k": (2, 1, 131072, 128, {}, {}),
    "paged16-1x32k-sinks": (1, 1, 32768, 16, dict(sink=True), {}),  # the wgmma forward's tiles span 16-row blocks
    "paged-2x128k-sinks-causal": (
        2,
        1,
        131072,
        256,
        dict(sink=True, use_causal_mask_bottom_right=True),
        dict(causal_bottom_right=True),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_split_decode_matches_the_oracle(case):
    batch, sq, skv, paged, kw, mask = CASES[case]
    g, pack, x, dev = _graph(batch, sq, skv, paged=paged, **kw)
    assert _split_count(g) > 1, "a long decode on an H200 is split"
    g.execute(pack, _workspace(g))
    lens_q, lens_kv = [sq] * batch, [skv] * batch
    _check(g, dev, x, lens_q, lens_kv, **mask)


@pytest.mark.parametrize("paged", [0, 128])
def test_lengths_below_the_envelope_and_an_empty_sequence(paged):
    """Sequences of 32k, 0 and 5000 keys in a 32k envelope (and a padding query row): the empty one is O = 0,
    LSE = -inf; most splits of the short one are empty."""
    g, pack, x, dev = _graph(3, 2, 32768, paged=paged, lens=True, sink=False)
    lens_q, lens_kv = [2, 1, 2], [32768, 0, 5000]
    for n, vals in (("lq", lens_q), ("lk", lens_kv)):
        dev[n].copy_(torch.tensor(vals, dtype=torch.int32).reshape(3, 1, 1, 1))
    g.execute(pack, _workspace(g))
    _check(g, dev, x, lens_q, lens_kv)


@pytest.mark.parametrize("splits", [2, 3, 128])
def test_requested_split_counts_with_empty_splits(splits):
    """A requested count is honored; 128 splits of 1000 keys (16 key tiles) leave most splits empty."""
    g, pack, x, dev = _graph(1, 1, 1000, lens=True, knobs=frost.Knobs(num_splits=splits), sink=True)
    assert _split_count(g) == splits
    g.execute(pack, _workspace(g))
    _check(g, dev, x, [1], [1000])


@pytest.mark.parametrize("paged", [0, 128])
def test_capture_replay_follows_new_lengths(paged):
    """Captured once; a replay after new lengths are copied into the same device tensors cuts the new key range
    into splits on the device and gives the oracle's answer for them."""
    g, pack, x, dev = _graph(2, 1, 131072, paged=paged, lens=True, sink=True)
    ws = _workspace(g)  # held while the graph replays into it
    graph = capture_after_clean_execute(g, pack, ws, torch.cuda.Stream())
    for lens_kv in ([131072, 77], [3, 100000], [0, 131072]):
        dev["lk"].copy_(torch.tensor(lens_kv, dtype=torch.int32).reshape(2, 1, 1, 1))
        dev["o"].fill_(float("nan"))
        dev["lse"].fill_(float("nan"))
        graph.replay()
        _check(g, dev, x, [1, 1], lens_kv)


def _set_lengths(dev, lens_q, lens_kv):
    for n, vals in (("lq", lens_q), ("lk", lens_kv)):
        dev[n].copy_(torch.tensor(vals, dtype=torch.int32).reshape(len(vals), 1, 1, 1))


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("paged", [0, 128])
def test_packed_and_unpacked_split_decodes(pack, paged):
    """The same split decode with the 4 query heads of each KV group in one tile, and with a tile per head: three
    query positions under a bottom-right causal band, sinks, a shorter second sequence."""
    g, pack_, x, dev = _graph(
        2,
        3,
        40000,
        paged=paged,
        lens=True,
        sink=True,
        knobs=frost.Knobs(pack_gqa=pack),
        use_causal_mask_bottom_right=True,
    )
    assert _packed(g) == pack and _split_count(g) > 1
    lens_q, lens_kv = [3, 2], [40000, 9000]
    _set_lengths(dev, lens_q, lens_kv)
    g.execute(pack_, _workspace(g))
    _check(g, dev, x, lens_q, lens_kv, causal_bottom_right=True)


@pytest.mark.parametrize("paged", [0, 64])
def test_packed_decode_without_splits(paged):
    """GQA packing alone (a short cache: no split, no workspace): 16 query positions of 4 heads fill a 64-row
    tile; padding positions, an empty query sequence, sinks and a bottom-right causal band."""
    g, pack_, x, dev = _graph(4, 16, 256, paged=paged, lens=True, sink=True, use_causal_mask_bottom_right=True)
    assert ENGINE not in ENGINES or (_packed(g) and _split_count(g) == 1 and g.get_workspace_size() == 0)
    lens_q, lens_kv = [16, 1, 7, 0], [256, 100, 7, 50]
    _set_lengths(dev, lens_q, lens_kv)
    g.execute(pack_, None)
    _check(g, dev, x, lens_q, lens_kv, causal_bottom_right=True)


# ---------------------------------------------------------------- packed (THD) query batches

#: the packed forms: frost's own ((T, H, D) tensors, cu_seq_len prefix sums), cuDNN's ragged offsets with Stats per
#: batch entry (B, H, S, 1), and cuDNN's ragged offsets with ragged Stats (their own offsets, token stride H)
PACKED_FORMS = ("packed", "ragged", "ragged-lse")


def _packed_graph(form, lens_q, lens_kv, max_q, max_kv, *, sink=False, knobs=None, scores=False, **sdpa_kw):
    """A packed decode graph on the GPU: (graph, pack, inputs, device tensors). Every buffer holds the envelopes
    (B x max_q query tokens, B x max_kv keys), so a replay may write any lengths within them; `_set_packed`
    writes the lengths and offsets of `lens_q` / `lens_kv`. `scores`: score_max and score_sum_exp laid out as
    Stats."""
    batch = len(lens_q)
    tq, tkv = batch * max_q, batch * max_kv
    gen = torch.Generator().manual_seed(batch * 7 + max_q + max_kv % 97)
    x = {
        "q": torch.randn(tq, HQ, D, generator=gen).to(BF16),
        "k": torch.randn(tkv, HKV, D, generator=gen).to(BF16),
        "v": torch.randn(tkv, HKV, D, generator=gen).to(BF16),
        "o": torch.full((tq, HQ, D), float("nan"), dtype=BF16),
    }
    if sink:
        x["sink"] = torch.randn(1, HQ, 1, 1, generator=gen) * 2
    g = frost.pygraph(
        io_data_type=frost.data_type.BFLOAT16,
        intermediate_data_type=frost.data_type.FLOAT,
        compute_data_type=frost.data_type.FLOAT,
    )
    kw, t = dict(sdpa_kw), {}
    if form == "packed":
        x["lse"] = torch.full((tq, HQ, 1), float("nan"))
        x["cu_q"], x["cu_kv"] = (torch.zeros(batch + 1, dtype=torch.int32) for _ in range(2))
        t = _inputs(g, x, ())
        kw.update(cu_seq_len_q=t["cu_q"], cu_seq_len_kv=t["cu_kv"], max_seq_len_q=max_q, max_seq_len_kv=max_kv)
    else:  # (B, H, S, D) views of the same token-major buffers, bshd strides, element offsets
        if form == "ragged":
            x["lse"] = torch.full((batch, HQ, max_q, 1), float("nan"))
        else:
            x["lse"] = torch.full((tq, HQ, 1), float("nan"))
            x["off_lse"] = torch.zeros(batch + 1, 1, 1, 1, dtype=torch.int32)
        for n in ("off_q", "off_kv"):
            x[n] = torch.zeros(batch + 1, 1, 1, 1, dtype=torch.int32)
        for n in ("lq", "lk"):
            x[n] = torch.zeros(batch, 1, 1, 1, dtype=torch.int32)
        t = _inputs(g, x, ("q", "k", "v"))
        for n, s in (("q", max_q), ("k", max_kv), ("v", max_kv)):
            h = x[n].shape[1]
            t[n] = g.tensor(name=n, dim=(batch, h, s, D), stride=(s * h * D, D, h * D, 1), data_type=_dtype(x[n]))
            t[n].set_ragged_offset(t["off_q" if n == "q" else "off_kv"])
        kw.update(use_padding_mask=True, seq_len_q=t["lq"], seq_len_kv=t["lk"], max_total_seq_len_q=tq)
        kw.update(max_total_seq_len_kv=tkv)
    if sink:
        kw["sink_token"] = t["sink"]
    for role, n in (("score_max", "smax"), ("score_sum_exp", "ssum")) if scores else ():
        x[n] = torch.full_like(x["lse"], float("nan"))
        if form == "ragged-lse":  # ragged like Stats: (B, H, S, 1) over a token-major (T, H) buffer
            dim, stride = (batch, HQ, max_q, 1), (max_q * HQ, 1, HQ, 1)
            t[n] = g.tensor(name=n, dim=dim, stride=stride, data_type=frost.data_type.FLOAT)
            t[n].set_ragged_offset(t["off_lse"])
        else:
            t[n] = g.tensor(name=n, dim=x[n].shape, stride=x[n].stride(), data_type=frost.data_type.FLOAT)
        kw[role] = t[n]
    o, st = g.sdpa(q=t["q"], k=t["k"], v=t["v"], attn_scale=SCALE, generate_stats=True, **kw)
    o.set_output(True)
    st.set_output(True).set_data_type(frost.data_type.FLOAT)
    if form == "packed":
        o.set_dim(x["o"].shape).set_stride(x["o"].stride())
        st.set_dim(x["lse"].shape).set_stride(x["lse"].stride())
    else:
        o.set_dim((batch, HQ, max_q, D)).set_stride((max_q * HQ * D, D, HQ * D, 1)).set_ragged_offset(t["off_q"])
        if form == "ragged":
            st.set_dim(x["lse"].shape).set_stride(x["lse"].stride())
        else:  # (B, H, S, 1) over the token-major (T, H) buffer: token stride H
            st.set_dim((batch, HQ, max_q, 1)).set_stride((max_q * HQ, 1, HQ, 1)).set_ragged_offset(t["off_lse"])
    t["o"], t["lse"] = o, st
    g.validate()
    g.build_plans(engine=ENGINE, knobs=knobs)
    assert ENGINE not in ENGINES or g.engine_name == ENGINES[ENGINE], g.engine_name
    dev = {n: v.to(DEVICE) for n, v in x.items()}
    bound = {n: dev[n] for n in x}
    if form != "packed":  # the ragged form binds the declared (B, H, S, D) views of the packed buffers
        for n, s in (("q", max_q), ("k", max_kv), ("v", max_kv), ("o", max_q)):
            v_ = dev[n]
            bound[n] = v_.as_strided((batch, v_.shape[1], s, D), (s * v_.shape[1] * D, D, v_.shape[1] * D, 1))
        for n in ("lse", "smax", "ssum") if form == "ragged-lse" else ():
            if n in dev:
                bound[n] = dev[n].as_strided((batch, HQ, max_q, 1), (max_q * HQ, 1, HQ, 1))
    pack = {t[n]: bound[n] for n in x}
    _set_packed(form, dev, lens_q, lens_kv)
    return g, pack, x, dev


def _inputs(g, x, skip):
    """The graph's input tensors declared as `x` holds them (outputs and the names in `skip` left out)."""
    return {
        n: g.tensor(name=n, dim=v.shape, stride=v.stride(), data_type=_dtype(v))
        for n, v in x.items()
        if n not in ("o", "lse", *skip)
    }


def _set_packed(form, dev, lens_q, lens_kv):
    """Write the lengths and offsets of `lens_q` / `lens_kv` into the graph's device tensors (sequences packed
    back to back from token 0)."""
    cu_q, cu_kv = oracle_prefix(lens_q), oracle_prefix(lens_kv)
    as_i32 = lambda vals, shape: torch.tensor(vals, dtype=torch.int32).reshape(shape)  # noqa: E731
    if form == "packed":
        dev["cu_q"].copy_(as_i32(cu_q, -1))
        dev["cu_kv"].copy_(as_i32(cu_kv, -1))
        return
    b = len(lens_q)
    dev["lq"].copy_(as_i32(lens_q, (b, 1, 1, 1)))
    dev["lk"].copy_(as_i32(lens_kv, (b, 1, 1, 1)))
    dev["off_q"].copy_(as_i32([c * HQ * D for c in cu_q], (b + 1, 1, 1, 1)))
    dev["off_kv"].copy_(as_i32([c * HKV * D for c in cu_kv], (b + 1, 1, 1, 1)))
    if "off_lse" in dev:
        dev["off_lse"].copy_(as_i32([c * HQ for c in cu_q], (b + 1, 1, 1, 1)))


def oracle_prefix(lens) -> list[int]:
    out = [0]
    for n in lens:
        out.append(out[-1] + int(n))
    return out


def _packed_check(form, dev, x, lens_q, lens_kv, **mask):
    """O and LSE of every token inside a sequence against the float64 oracle, one (sequence, KV group) at a time;
    O's tokens past the last sequence stay as poisoned (the DSL forwards write nothing outside the sequences)."""
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    cu_q, cu_kv = oracle_prefix(lens_q), oracle_prefix(lens_kv)
    qpk = HQ // HKV
    used = cu_q[-1]
    o = torch.zeros(used, HQ, D, dtype=torch.float64)
    lse = torch.zeros(used, HQ, dtype=torch.float64)
    s_max, s_sum = lse.clone(), lse.clone()
    for b, kh in ((b, kh) for b in range(len(lens_q)) for kh in range(HKV)):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_kv[b], cu_kv[b + 1]
        hs = slice(kh * qpk, (kh + 1) * qpk)
        sink = x["sink"].reshape(-1)[hs] if "sink" in x else None
        ob, lb, mb, zb = oracle.attention(
            x["q"][q0:q1, hs],
            x["k"][k0:k1, kh : kh + 1],
            x["v"][k0:k1, kh : kh + 1],
            scale=SCALE,
            sink=sink,
            cu_seq_len_q=[0, q1 - q0],
            cu_seq_len_kv=[0, k1 - k0],
            row_stats=True,
            **mask,
        )
        o[q0:q1, hs], lse[q0:q1, hs], s_max[q0:q1, hs], s_sum[q0:q1, hs] = ob, lb, mb, zb
    got_o = dev["o"].cpu()
    assert_close_to_oracle(got_o[:used], o, rel=1e-2, name="O", io_dtype=BF16)
    rows = _packed_rows(form, lens_q)
    assert_close_to_oracle(rows(dev["lse"]), lse, rel=1e-4, max_abs=1e-2, name="LSE", io_dtype=BF16)
    if "smax" in dev:
        _check_scores(rows(dev["smax"]), rows(dev["ssum"]), s_max, s_sum)
    if ENGINE in ENGINES:  # (the reference engine zeroes them)
        assert got_o[used:].isnan().all(), "a token outside every sequence was written"


def _packed_rows(form, lens_q):
    """A row output's values of the tokens inside the sequences, (tokens, H): packed rows, or per batch entry
    ((B, H, S, 1), rows local to the sequence: the ragged form's per-batch Stats)."""
    used = sum(lens_q)
    if form == "ragged":
        return lambda t: torch.cat([t[b, :, : lens_q[b], 0].T.cpu() for b in range(len(lens_q))])
    return lambda t: t[:used, :, 0].cpu()


PACKED_CASES = {  # name: (lens_q, lens_kv, max_q, max_kv, graph keywords, oracle mask)
    # one query token a sequence, ragged caches, an empty query sequence and an empty cache
    "4x32k-q1-ragged": ((1, 0, 1, 1), (32768, 20000, 0, 5000), 1, 32768, {}, {}),
    # 1..16 query tokens a sequence (speculative decode), sinks, a bottom-right causal band
    "3x40k-q16-sinks-causal": (
        (16, 1, 7),
        (40000, 9000, 7),
        16,
        40000,
        dict(sink=True, use_causal_mask_bottom_right=True),
        dict(causal_bottom_right=True),
    ),
    "1x128k-q4": ((4,), (131072,), 4, 131072, dict(sink=True), {}),
}


@pytest.mark.parametrize("form", PACKED_FORMS)
@pytest.mark.parametrize("case", list(PACKED_CASES))
def test_packed_split_decode_matches_the_oracle(case, form):
    """A serving batch in packed form (GQA 32:8): the plan splits it, and every token of every sequence matches
    the oracle, Stats in each packed form."""
    lens_q, lens_kv, max_q, max_kv, kw, mask = PACKED_CASES[case]
    g, pack, x, dev = _packed_graph(form, lens_q, lens_kv, max_q, max_kv, **kw)
    assert _split_count(g) > 1, "a packed decode over long caches on an H200 is split"
    g.execute(pack, _workspace(g))
    _packed_check(form, dev, x, lens_q, lens_kv, **mask)


@pytest.mark.parametrize("splits", [3, 128])
def test_packed_requested_split_counts_with_empty_splits(splits):
    """A requested count on a packed batch; 128 splits of at most 1000 keys leave most splits empty."""
    g, pack, x, dev = _packed_graph(
        "packed", (2, 1), (1000, 130), 2, 1000, sink=True, knobs=frost.Knobs(num_splits=splits)
    )
    assert _split_count(g) == splits
    g.execute(pack, _workspace(g))
    _packed_check("packed", dev, x, (2, 1), (1000, 130))


@pytest.mark.parametrize("form", PACKED_FORMS)
def test_packed_capture_replay_follows_new_lengths(form):
    """Captured once; replays after new lengths and offsets are written into the same device tensors (query
    tokens and caches that grow, shrink, empty) cut the new key ranges and write only the new sequences' tokens."""
    lens = [((1, 1, 1), (65536, 77, 3000)), ((3, 0, 8), (12, 65536, 0)), ((8, 8, 8), (65536, 65536, 65536))]
    g, pack, x, dev = _packed_graph(form, *lens[0], 8, 65536, sink=True)
    ws = _workspace(g)  # held while the graph replays into it
    graph = capture_after_clean_execute(g, pack, ws, torch.cuda.Stream())
    for lens_q, lens_kv in lens:
        _set_packed(form, dev, lens_q, lens_kv)
        dev["o"].fill_(float("nan"))
        dev["lse"].fill_(float("nan"))
        graph.replay()
        _packed_check(form, dev, x, lens_q, lens_kv)


@pytest.mark.parametrize("paged", [0, 128])
def test_split_decode_writes_score_statistics(paged):
    """score_max / score_sum_exp beside a split decode: each split's row max from the workspace, the sink once;
    three query rows under a bottom-right causal band, an empty cache (the sink alone) and a padding row."""
    g, pack, x, dev = _graph(
        3, 3, 40000, paged=paged, lens=True, sink=True, scores=True, use_causal_mask_bottom_right=True
    )
    assert _split_count(g) > 1
    lens_q, lens_kv = [3, 2, 1], [40000, 0, 9000]
    _set_lengths(dev, lens_q, lens_kv)
    g.execute(pack, _workspace(g))
    _check(g, dev, x, lens_q, lens_kv, causal_bottom_right=True)


@pytest.mark.parametrize("form", PACKED_FORMS)
def test_packed_split_decode_writes_score_statistics(form):
    """score_max / score_sum_exp of a split packed batch, laid out as its Stats (packed, per batch entry, ragged),
    with sinks, an empty query sequence and an empty cache."""
    lens_q, lens_kv = (2, 0, 5, 1), (30000, 100, 17000, 0)
    g, pack, x, dev = _packed_graph(form, lens_q, lens_kv, 8, 30000, sink=True, scores=True)
    assert _split_count(g) > 1
    g.execute(pack, _workspace(g))
    _packed_check(form, dev, x, lens_q, lens_kv)


@pytest.mark.parametrize("skv", [300, 40000])
@pytest.mark.parametrize("paged", [0, 64])
def test_packed_sliding_window_decodes(paged, skv):
    """GQA packing under a sliding window (bottom-right causal, 700 keys back, or all 300 of a short cache): each
    packed tile walks from its first position's window start to its last position's end, and masks per row by the
    row's own position. Unsplit (a short cache) and split (40k keys; a window of 700 keys leaves most splits
    empty); padding positions and a shorter second sequence."""
    g, pack_, x, dev = _graph(
        2, 5, skv, paged=paged, lens=True, sink=True, use_causal_mask_bottom_right=True, sliding_window_length=700
    )
    assert ENGINE not in ENGINES or (_packed(g) and (_split_count(g) > 1) == (skv > 300))
    lens_q, lens_kv = [5, 3], [skv, skv // 3]
    _set_lengths(dev, lens_q, lens_kv)
    g.execute(pack_, _workspace(g) if _split_count(g) > 1 else None)
    _check(g, dev, x, lens_q, lens_kv, causal_bottom_right=True, sliding_window_length=700)


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("form", PACKED_FORMS)
def test_packed_batches_with_and_without_gqa_packing(form, pack):
    """A short packed batch (no split: 1..16 query tokens over at most 700 keys) with the 4 query heads of each KV
    group in one tile and with a tile per head: every token of every sequence matches the oracle, Stats in each
    packed form; sinks, a bottom-right causal band, an empty query sequence."""
    lens_q, lens_kv = (16, 0, 5, 1), (700, 30, 5, 1)
    knobs = frost.Knobs(pack_gqa=pack) if ENGINE in ENGINES else None  # (a host dry run on the reference: none)
    g, pack_, x, dev = _packed_graph(
        form, lens_q, lens_kv, 16, 700, sink=True, knobs=knobs, use_causal_mask_bottom_right=True
    )
    assert ENGINE not in ENGINES or (_packed(g) == pack and _split_count(g) == 1)
    g.execute(pack_, None)
    _packed_check(form, dev, x, lens_q, lens_kv, causal_bottom_right=True)
