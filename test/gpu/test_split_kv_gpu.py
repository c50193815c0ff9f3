"""Decode on the mma.sync forward (`engine="sm80"`) and the wgmma forward (`engine="sm90"`, on an H100 / H200; each
test runs once per engine), on a GPU, against the float64 oracle: split-KV over long caches
(1 x 32k and 2 x 128k keys, GQA 32:8, D=128), dense and paged, sinks, a causal band, empty sequences, requested
split counts with empty splits, a CUDA-graph replay after new lengths are written into the same tensors, and GQA
packing (the query heads of a KV group in one tile) with and without splits. The
workspace is poisoned (NaN) before each run, O and Stats too: every element the combine reads or writes must be
written. Run: python3 -m pytest -q -m gpu test/gpu/test_split_kv_gpu.py
"""

from __future__ import annotations

import math

import pytest
import torch

import frost
from test import oracle
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


def _graph(batch, sq, skv, *, paged=0, lens=False, sink=False, knobs=None, **sdpa_kw):
    """A decode graph on the GPU: (graph, pack, inputs). Dense K/V (B, Hkv, Skv, D), or a paged cache of block
    size `paged` whose blocks are a shuffled pool; `lens`: a padding mask (seq_len_q / seq_len_kv tensors)."""
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
    t = {n: g.tensor(name=n, dim=v.shape, stride=v.stride(), data_type=_dtype(v)) for n, v in x.items()}
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
    for b in range(b_n):
        k, v = _keys(x, b, lens_kv[b])
        for kh in range(HKV):
            hs = slice(kh * qpk, (kh + 1) * qpk)
            sink = x["sink"].reshape(-1)[hs] if "sink" in x else None
            ob, lb = oracle.attention(
                x["q"][b : b + 1, hs],
                k[None, kh : kh + 1],
                v[None, kh : kh + 1],
                scale=SCALE,
                sink=sink,
                seq_len_q=[lens_q[b]],
                seq_len_kv=[lens_kv[b]],
                **mask,
            )
            o[b, hs], lse[b, hs] = ob[0], lb.reshape(qpk, sq)
    return o, lse


def _check(g, dev, x, lens_q, lens_kv, **mask):
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    o, lse = _oracle(x, lens_q, lens_kv, **mask)
    assert_close_to_oracle(dev["o"], o, rel=1e-2, name="O", io_dtype=BF16)
    assert_close_to_oracle(dev["lse"][..., 0], lse, rel=1e-4, max_abs=1e-2, name="LSE", io_dtype=BF16)


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
    ws = _workspace(g)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        g.execute(pack, ws)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        g.execute(pack, ws)
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


@pytest.mark.parametrize("skv, splits", [(300, 1), (40000, 0)])
@pytest.mark.parametrize("paged", [0, 64])
def test_packed_sliding_window_decodes(paged, skv, splits):
    """GQA packing under a sliding window (bottom-right causal, 700 keys back, or all 300 of a short cache): each
    packed tile walks from its first position's window start to its last position's end, and masks per row by the
    row's own position. Without splits (a short cache) and split (40k keys; a window of 700 keys leaves most
    splits empty); padding positions and a shorter second sequence."""
    knobs = frost.Knobs(num_splits=1) if splits == 1 else None
    g, pack_, x, dev = _graph(
        2,
        5,
        skv,
        paged=paged,
        lens=True,
        sink=True,
        knobs=knobs,
        use_causal_mask_bottom_right=True,
        sliding_window_length=700,
    )
    assert ENGINE not in ENGINES or _packed(g)
    lens_q, lens_kv = [5, 3], [skv, skv // 3]
    _set_lengths(dev, lens_q, lens_kv)
    g.execute(pack_, _workspace(g) if _split_count(g) > 1 else None)
    _check(g, dev, x, lens_q, lens_kv, causal_bottom_right=True, sliding_window_length=700)
