"""cuDNN's ragged-offset form on the DSL engines (mma.sync and SM90), forward and backward, against the float64 oracle.

Q/K/V/O (and dO, dQ, dK, dV) are declared (B, H, S, D) with bshd strides over packed tokens, each batch starting at
an element offset ((B+1, 1, 1, 1) int32 or int64) with its length in seq_len_q / seq_len_kv; Stats are ragged too
(offsets of tokens * H) or per batch (B, H, S, 1). Sequences may be empty, leave gaps, or lie in any order. The
kernels write only the rows of the sequences (outputs are poisoned with NaN and checked elsewhere). Captured
executes replayed with new lengths and offsets in the same device tensors follow them.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import frost
from test.oracle import assert_close_to_oracle
from test import oracle
from test.gpu.graph_cases import capture_after_clean_execute, plan_or_skip

pytestmark = pytest.mark.gpu
ENGINES = ["sm90", "sm80"]


@dataclass(frozen=True)
class RaggedCase:
    lens: tuple = ((100, 130), (0, 17), (257, 257), (1, 0), (64, 200))  # (len_q, len_kv) per batch entry
    hq: int = 4
    hkv: int = 4
    d: int = 128
    causal: bool = False
    int64: bool = True  # q-group (and Stats) offsets int64; the kv group's are int32
    stats: str = "ragged"  # "ragged" | "batch"
    placement: str = "packed"  # "packed": prefix sums; "spread": batch b at token b * S; "reversed": last first
    totals: bool = False  # declare max_total_seq_len_q/kv (the packed totals)
    sinks: bool = False  # a sink logit per query head (the backward also writes dSink)
    dtype: torch.dtype = torch.bfloat16

    @property
    def s(self):
        return max(max(a, b) for a, b in self.lens) + 3  # the declared S of both groups

    def id(self) -> str:
        return (
            f"h{self.hq}x{self.hkv}-d{self.d}-{self.placement}-{self.stats}"
            + "-causal" * self.causal
            + "-i64" * self.int64
            + "-tot" * self.totals
            + "-sink" * self.sinks
        )


def _starts(lens, placement, s):
    """Token offsets (B+1 entries, the last one past every sequence) of one group."""
    b = len(lens)
    if placement == "spread":
        return [i * s for i in range(b + 1)]
    order = list(range(b))[::-1] if placement == "reversed" else list(range(b))
    starts, t = [0] * b, 0
    for i in order:
        starts[i] = t
        t += lens[i]
    return starts + [t]


def _store(n_tokens, h, d, dtype, gen, fill=None):
    dev = gen.device
    if fill is None:
        return torch.randn(n_tokens * h * d, generator=gen, device=dev, dtype=torch.float32).to(dtype)
    return torch.full((n_tokens * h * d,), fill, device=dev, dtype=dtype)


def _bshd(store, b, h, s, d):
    return store.as_strided((b, h, s, d), (s * h * d, d, h * d, 1))


def make(case: RaggedCase, direction="fwd", seed=0, deterministic=False, dev="cuda"):
    """(graph, variant pack, tensors) of a ragged graph; tensors hold the storages and host token offsets."""
    gen = torch.Generator(device=dev).manual_seed(seed)
    b, s, hq, hkv, d = len(case.lens), case.s, case.hq, case.hkv, case.d
    lq, lk = [a for a, _ in case.lens], [c for _, c in case.lens]
    tok_q, tok_kv = _starts(lq, case.placement, s), _starts(lk, case.placement, s)
    odt = torch.int64 if case.int64 else torch.int32
    t = dict(tok_q=tok_q, tok_kv=tok_kv, lq=lq, lk=lk)
    t["off_q"] = (torch.tensor(tok_q, device=dev) * hq * d).to(odt).view(-1, 1, 1, 1)
    t["off_kv"] = (torch.tensor(tok_kv, device=dev) * hkv * d).to(torch.int32).view(-1, 1, 1, 1)
    t["off_st"] = (torch.tensor(tok_q, device=dev) * hq).to(odt).view(-1, 1, 1, 1)
    t["len_q"] = torch.tensor(lq, dtype=torch.int32, device=dev).view(b, 1, 1, 1)
    t["len_kv"] = torch.tensor(lk, dtype=torch.int32, device=dev).view(b, 1, 1, 1)
    for name, h in (("q", hq), ("k", hkv), ("v", hkv)):
        t[name] = _bshd(_store(b * s, h, d, case.dtype, gen), b, h, s, d)
    nan = float("nan")
    if case.stats == "ragged":
        t["stats"] = torch.full((b * s * hq,), nan, device=dev).as_strided((b, hq, s, 1), (s * hq, 1, hq, 1))
    else:
        t["stats"] = torch.full((b, hq, s, 1), nan, device=dev)
    if direction == "fwd":
        t["o"] = _bshd(_store(b * s, hq, d, case.dtype, gen, nan), b, hq, s, d)
    else:
        t["o"] = _bshd(_store(b * s, hq, d, case.dtype, gen, 0.0), b, hq, s, d)
        t["dO"] = _bshd(_store(b * s, hq, d, case.dtype, gen), b, hq, s, d)
        t["dQ"] = _bshd(_store(b * s, hq, d, case.dtype, gen, nan), b, hq, s, d)
        t["dK"] = _bshd(_store(b * s, hkv, d, case.dtype, gen, nan), b, hkv, s, d)
        t["dV"] = _bshd(_store(b * s, hkv, d, case.dtype, gen, nan), b, hkv, s, d)

    # tokens outside every sequence (gaps, the tail) hold NaN: no kernel may let them reach a result
    for name, tok, lens in (
        ("q", tok_q, lq),
        ("k", tok_kv, lk),
        ("v", tok_kv, lk),
        ("o", tok_q, lq),
        ("dO", tok_q, lq),
    ):
        if name in t:
            _flat(t[name])[~_inside(t[name], tok, lens)] = float("nan")
    g = frost.Graph(io_data_type=case.dtype, intermediate_data_type=torch.float32, compute_data_type=torch.float32)
    offsets = ("off_q", "off_kv", "len_q", "len_kv") + (("off_st",) if case.stats == "ragged" else ())
    decl = {n: g.tensor_like(t[n], name=n) for n in offsets}
    for n, off in (("q", "off_q"), ("k", "off_kv"), ("v", "off_kv")):
        decl[n] = g.tensor_like(t[n], name=n).set_ragged_offset(decl[off])
    kw = dict(
        attn_scale=d**-0.5,
        use_padding_mask=True,
        seq_len_q=decl["len_q"],
        seq_len_kv=decl["len_kv"],
        use_causal_mask=case.causal,
    )
    if case.sinks:
        t["sink"] = torch.randn(1, hq, 1, 1, generator=gen, device=dev)
        decl["sink"] = kw["sink_token"] = g.tensor_like(t["sink"], name="sink")
        if direction == "bwd":
            t["dsink"] = torch.full((1, hq, 1, 1), float("nan"), device=dev)
            decl["dsink"] = kw["dSink_token"] = g.tensor_like(t["dsink"], name="dsink")
    if case.totals:
        kw.update(max_total_seq_len_q=max(tok_q), max_total_seq_len_kv=max(tok_kv))
    if direction == "fwd":
        o, stats = g.sdpa(decl["q"], decl["k"], decl["v"], generate_stats=True, **kw)
        o.set_output(True).set_stride(t["o"].stride()).set_ragged_offset(decl["off_q"])
        stats.set_output(True).set_stride(t["stats"].stride())
        decl.update(o=o, stats=stats)
    else:
        for n in ("o", "dO"):
            decl[n] = g.tensor_like(t[n], name=n).set_ragged_offset(decl["off_q"])
        decl["stats"] = g.tensor_like(t["stats"], name="stats")
        grads = g.sdpa_backward(
            decl["q"],
            decl["k"],
            decl["v"],
            decl["o"],
            decl["dO"],
            decl["stats"],
            use_deterministic_algorithm=deterministic,
            **kw,
        )
        for n, grad, like in zip(("dQ", "dK", "dV"), grads, ("q", "k", "v")):
            grad.set_output(True).set_stride(t[like].stride()).set_ragged_offset(decl[like].ragged_offset)
            decl[n] = grad
        stats = decl["stats"]
    if case.stats == "ragged":
        stats.set_ragged_offset(decl["off_st"])
    pack = {decl[n]: t[n] for n in decl}
    return g, pack, t


def rows(x, tok, n):
    """(n, H, D) rows of a bshd-packed (B, H, S, D) tensor from token `tok` (a view)."""
    h, d = x.shape[1], x.shape[3]
    return x.as_strided((n, h, d), (h * d, d, 1), x.storage_offset() + tok * h * d)


def stats_rows(case, t, b):
    """(H, len_q) Stats of batch entry b, wherever its layout puts them."""
    n = t["lq"][b]
    st = t["stats"]
    if case.stats == "batch":
        return st[b, :, :n, 0]
    h = st.shape[1]
    return st.as_strided((h, n), (1, h), st.storage_offset() + t["tok_q"][b] * h)


def _oracle(case, t, b, grads=False):
    n, m = t["lq"][b], t["lk"][b]
    q = rows(t["q"], t["tok_q"][b], n).transpose(0, 1)[None]
    k = rows(t["k"], t["tok_kv"][b], m).transpose(0, 1)[None]
    v = rows(t["v"], t["tok_kv"][b], m).transpose(0, 1)[None]
    sink = t.get("sink")
    if not grads:
        return oracle.attention(q, k, v, scale=case.d**-0.5, causal=case.causal, sink=sink)
    do = rows(t["dO"], t["tok_q"][b], n).transpose(0, 1)[None]
    return oracle.attention_grads(q, k, v, do, scale=case.d**-0.5, causal=case.causal, sink=sink)


def check_fwd(case, t):
    got_o, want_o = [], []
    for b, n in enumerate(t["lq"]):
        if n == 0:
            continue
        o, lse = _oracle(case, t, b)
        got_o.append(rows(t["o"], t["tok_q"][b], n).transpose(0, 1))
        want_o.append(o[0])
        lse_got = stats_rows(case, t, b).double()
        finite = torch.isfinite(lse[0])
        assert torch.equal(torch.isfinite(lse_got), finite), f"batch {b}: LSE -inf rows differ"
        if finite.any():
            assert (lse_got[finite] - lse[0][finite]).abs().max().item() < 2e-3, f"batch {b}: LSE"
    got, want = torch.cat([x.reshape(-1) for x in got_o]), torch.cat([x.reshape(-1) for x in want_o])
    assert not torch.isnan(got).any()
    assert_close_to_oracle(got, want, rel=1e-2, name="O")


def _flat(x):
    """Every token of a bshd-packed (B, H, S, D) tensor: (B * S, H, D)."""
    h, d = x.shape[1], x.shape[3]
    return x.as_strided((x.shape[0] * x.shape[2], h, d), (h * d, d, 1), x.storage_offset())


def _inside(x, tok, lens):
    inside = torch.zeros(x.shape[0] * x.shape[2], dtype=torch.bool, device=x.device)
    for start, n in zip(tok, lens):
        inside[start : start + n] = True
    return inside


def written_outside_sequences(t, name, tok, lens):
    """Whether any element of `name` outside every sequence lost its NaN poison."""
    return not torch.isnan(_flat(t[name])[~_inside(t[name], tok, lens)]).all()


FWD_CASES = [
    RaggedCase(),
    RaggedCase(hq=8, hkv=2, causal=True, int64=False),
    RaggedCase(hq=8, hkv=2, causal=True, stats="batch", placement="spread"),
    RaggedCase(d=64, causal=True, placement="reversed", totals=True),
    RaggedCase(d=96, hq=6, hkv=3, stats="batch", placement="reversed", dtype=torch.float16),
    RaggedCase(hq=8, hkv=2, sinks=True, stats="batch"),
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", FWD_CASES, ids=RaggedCase.id)
def test_ragged_forward_matches_the_oracle(engine, case):
    g, pack, t = make(case)
    plan_or_skip(g, engine)
    assert "Dsl" in g.engine_name
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
    g.execute(pack, ws, frost.ExecutionContext(stream=torch.cuda.current_stream()))
    torch.cuda.synchronize()
    check_fwd(case, t)
    assert not written_outside_sequences(t, "o", t["tok_q"], t["lq"]), "O written outside the sequences"


def _bwd_inputs(case, t):
    """O and Stats of the oracle forward written where the graph declares them (the backward's inputs)."""
    for b, n in enumerate(t["lq"]):
        if n == 0:
            continue
        o, lse = _oracle(case, t, b)
        rows(t["o"], t["tok_q"][b], n).copy_(o[0].transpose(0, 1).to(case.dtype))
        stats_rows(case, t, b).copy_(lse[0].float())


def check_bwd(case, t):
    got, want = {"dQ": [], "dK": [], "dV": []}, {"dQ": [], "dK": [], "dV": []}
    dsink = 0.0
    for b, (n, m) in enumerate(zip(t["lq"], t["lk"])):
        _, _, dq, dk, dv, ds = _oracle(case, t, b, grads=True)
        if ds is not None:
            dsink = dsink + ds.reshape(-1)
        for name, ref, tok, length in (
            ("dQ", dq, t["tok_q"][b], n),
            ("dK", dk, t["tok_kv"][b], m),
            ("dV", dv, t["tok_kv"][b], m),
        ):
            if length:
                got[name].append(rows(t[name], tok, length).transpose(0, 1).reshape(-1))
                want[name].append(ref[0].reshape(-1))
    for name in got:
        x, ref = torch.cat(got[name]), torch.cat(want[name])
        assert not torch.isnan(x).any(), name
        assert_close_to_oracle(x, ref, rel=2e-2, kind="grad", name=name)
    if case.sinks:
        assert_close_to_oracle(
            t["dsink"].reshape(-1), dsink, rel=1e-2, kind="grad", io_dtype=t["q"].dtype, name="dSink"
        )


BWD_CASES = [
    RaggedCase(),
    RaggedCase(hq=8, hkv=2, causal=True, int64=False, totals=True),
    RaggedCase(hq=8, hkv=2, causal=True, stats="batch", placement="spread"),
    RaggedCase(d=64, causal=True, placement="reversed"),
    RaggedCase(d=96, hq=6, hkv=3, stats="batch", placement="reversed", dtype=torch.float16),
    RaggedCase(hq=8, hkv=2, causal=True, sinks=True, placement="spread"),
    RaggedCase(d=64, sinks=True, stats="batch", placement="reversed", totals=True),
]


@pytest.mark.parametrize("deterministic", [False, True], ids=["", "det"])
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", BWD_CASES, ids=RaggedCase.id)
def test_ragged_backward_matches_the_oracle(engine, case, deterministic):
    g, pack, t = make(case, "bwd", deterministic=deterministic)
    plan_or_skip(g, engine)
    assert "Dsl" in g.engine_name
    _bwd_inputs(case, t)
    ws = torch.full((g.get_workspace_size(),), 0xFF, dtype=torch.uint8, device="cuda")  # poisoned scratch
    g.execute(pack, ws, frost.ExecutionContext(stream=torch.cuda.current_stream()))
    torch.cuda.synchronize()
    check_bwd(case, t)
    for name, tok, lens in (("dK", t["tok_kv"], t["lk"]), ("dV", t["tok_kv"], t["lk"])):
        assert not written_outside_sequences(t, name, tok, lens), f"{name} written outside the sequences"
    if deterministic:
        first = {n: t[n].clone() for n in ("dQ", "dK", "dV")}
        g.execute(pack, ws, frost.ExecutionContext(stream=torch.cuda.current_stream()))
        torch.cuda.synchronize()
        for n in first:
            assert torch.equal(first[n].nan_to_num(), t[n].nan_to_num()), f"{n} differs between runs"


def _new_lengths(t, case, lens):
    """Write new lengths and packed offsets (same totals or fewer) into the graph's own device tensors."""
    lq, lk = [a for a, _ in lens], [c for _, c in lens]
    tok_q, tok_kv = _starts(lq, "packed", case.s), _starts(lk, "packed", case.s)
    t["len_q"].copy_(torch.tensor(lq, dtype=torch.int32).view(-1, 1, 1, 1))
    t["len_kv"].copy_(torch.tensor(lk, dtype=torch.int32).view(-1, 1, 1, 1))
    t["off_q"].copy_((torch.tensor(tok_q) * case.hq * case.d).view(-1, 1, 1, 1))
    t["off_kv"].copy_((torch.tensor(tok_kv) * case.hkv * case.d).view(-1, 1, 1, 1))
    t["off_st"].copy_((torch.tensor(tok_q) * case.hq).view(-1, 1, 1, 1))
    t.update(tok_q=tok_q, tok_kv=tok_kv, lq=lq, lk=lk)
    gen = torch.Generator(device=t["q"].device).manual_seed(1)
    for name, tok, lens in (("q", tok_q, lq), ("k", tok_kv, lk), ("v", tok_kv, lk), ("dO", tok_q, lq)):
        if name in t:  # fresh inputs where the new sequences lie, NaN elsewhere
            x = _flat(t[name])
            x.copy_(torch.randn(x.shape, generator=gen, device=x.device))
            x[~_inside(t[name], tok, lens)] = float("nan")


NEW_LENS = ((7, 250), (250, 250), (0, 5), (33, 1), (199, 64))  # every length within S, a new placement


@pytest.mark.parametrize("engine", ENGINES)
def test_ragged_forward_capture_replay_follows_new_lengths_without_sync_or_allocation(engine):
    case = RaggedCase(hq=8, hkv=2, causal=True)
    g, pack, t = make(case)
    plan_or_skip(g, engine)
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
    s = torch.cuda.Stream()
    ctx = frost.ExecutionContext(stream=s)
    graph = capture_after_clean_execute(g, pack, ws, s)
    _new_lengths(t, case, NEW_LENS)
    t["o"].fill_(float("nan"))
    t["stats"].fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check_fwd(case, t)
    replayed = t["o"].clone()
    t["o"].fill_(float("nan"))
    g.execute(pack, ws, ctx)
    torch.cuda.synchronize()
    assert torch.equal(replayed.nan_to_num(), t["o"].nan_to_num()), "replay and eager differ"


@pytest.mark.parametrize("engine", ENGINES)
def test_ragged_backward_capture_replay_follows_new_lengths(engine):
    case = RaggedCase(hq=8, hkv=2, causal=True, stats="batch")
    g, pack, t = make(case, "bwd")
    plan_or_skip(g, engine)
    _bwd_inputs(case, t)
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
    s = torch.cuda.Stream()
    ctx = frost.ExecutionContext(stream=s)
    g.execute(pack, ws, ctx)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        g.execute(pack, ws, ctx)
    _new_lengths(t, case, NEW_LENS)
    _bwd_inputs(case, t)
    for n in ("dQ", "dK", "dV"):
        t[n].fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check_bwd(case, t)
