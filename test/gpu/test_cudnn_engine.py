"""The cuDNN engine through the public graph API on a GPU (engine="cudnn"): forward and backward against the
float64 oracle, bias and dBias, dropout (statistics and forward/backward consistency under one seed), packed (THD)
graphs (frost's packed form, empty sequences, capture and replay with new lengths; cuDNN's ragged form declared
directly), the launch stream and the execute's host time. Skips cleanly without CUDA or without a usable
nvidia-cudnn-frontend (1.32 or later).

A graph is skipped only when cuDNN itself says it does not support it (cudnnGraphNotSupportedError); any other
decline fails the test, so a call the binding refuses cannot pass as a skip."""

from __future__ import annotations

import math

import pytest
import torch

import frost
from test import oracle
from test.gpu.graph_cases import FwdCase, assert_runs_on_side_stream, capture_after_clean_execute, make_fwd, pack
from test.oracle import assert_close_to_oracle

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)
from frost.adapters.cudnn import cudnn_missing_reason  # noqa: E402

if cudnn_missing_reason():  # not installed, too old, or its library does not load
    pytest.skip(cudnn_missing_reason(), allow_module_level=True)

from test.gpu.test_sdpa_bwd_gpu import _run, make_bwd  # noqa: E402

ENGINE = "cudnn"


def plan_or_skip(g, engine=ENGINE, *, any_cudnn_refusal=False):
    """Validate and build `g` on the cuDNN engine. Skip when cuDNN's own support check refuses the graph
    (`any_cudnn_refusal`: any error cuDNN raised while planning); fail on every other decline."""
    g.validate()
    try:
        g.build_plans(engine=engine)
    except frost.NotSupportedError as e:
        reasons = [r for name, r in e.declines if "Cudnn" in name]
        refused = (
            reasons
            and reasons[0].startswith("cuDNN declines this graph: ")
            and (any_cudnn_refusal or "cudnnGraphNotSupportedError" in reasons[0])
        )
        if refused:
            pytest.skip(f"cuDNN does not support this graph here: {reasons[0]}")
        pytest.fail(f"the cuDNN engine declined: {e.declines}")
    adapter = g.plan.adapter
    assert getattr(adapter._graph, "selected_engine", None) is None, "not a cuDNN library plan"
    return g


FWD_CASES = [
    FwdCase(d=128),
    FwdCase(d=64, layout="bhsd"),
    FwdCase(d=128, causal=True),
    FwdCase(d=128, causal=True, bottom_right=True, sq=100, skv=300),
    FwdCase(d=128, hq=8, hkv=2, causal=True),
    FwdCase(d=128, hq=8, hkv=1),
    FwdCase(d=128, causal=True, left=64),
    FwdCase(d=64, bottom_right=True, left=33, sq=130, skv=260),
    FwdCase(d=128, padding=True, causal=True, sq=200, skv=200),
    FwdCase(d=128, stats=False),
    FwdCase(d=128, dtype=torch.float16, causal=True),
    FwdCase(d=128, sinks=True, causal=True),
]

BWD_CASES = [
    FwdCase(d=128),
    FwdCase(d=128, causal=True, layout="bhsd"),
    FwdCase(d=64, hq=8, hkv=2, causal=True),
    FwdCase(d=128, causal=True, bottom_right=True, sq=150, skv=300),
    FwdCase(d=128, left=64, causal=True),
    FwdCase(d=128, dtype=torch.float16, causal=True),
    FwdCase(d=128, sinks=True, causal=True),  # with dSink_token
]


def _band_kw(case: FwdCase) -> dict:
    """The oracle's mask keywords for a case."""
    kw = {}
    if case.causal:
        kw["causal_bottom_right" if case.bottom_right else "causal"] = True
    elif case.bottom_right:
        kw["alignment"] = "BOTTOM_RIGHT"
    if case.left:
        kw["sliding_window_length"] = case.left
    return kw


@pytest.mark.parametrize("case", FWD_CASES, ids=lambda c: c.id)
def test_fwd_matches_the_float64_oracle(case):
    g, decl, t = make_fwd(case)
    plan_or_skip(g, ENGINE)
    assert g.engine_name == "SdpaFwdCudnn"
    t["o"].fill_(float("nan"))
    if "stats" in t:
        t["stats"].fill_(float("nan"))
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
    g.execute(pack(decl, t), ws, frost.ExecutionContext())
    torch.cuda.synchronize()
    lens = {}
    if case.padding:
        lens = dict(seq_len_q=t["seq_len_q"].view(-1).tolist(), seq_len_kv=t["seq_len_kv"].view(-1).tolist())
    ro, rlse = oracle.attention(
        t["q"], t["k"], t["v"], scale=1 / math.sqrt(case.d), sink=t.get("sink_token"), **lens, **_band_kw(case)
    )
    o, lse = t["o"], t.get("stats")
    if case.padding:  # rows past a sequence's length are engine-defined: compare the valid ones
        rows = torch.arange(case.sq, device="cuda").view(1, -1) < t["seq_len_q"].view(-1, 1)
        o, ro = o.permute(0, 2, 1, 3)[rows], ro.permute(0, 2, 1, 3)[rows]
        if lse is not None:
            lse, rlse = lse[..., 0].permute(0, 2, 1)[rows], rlse.permute(0, 2, 1)[rows]
    elif lse is not None:
        lse = lse[..., 0]
    assert not torch.isnan(o).any(), "some output elements were not written"
    assert_close_to_oracle(o, ro, rel=1e-2, name="O")
    if lse is not None:
        fin = torch.isfinite(rlse)
        assert (lse[fin].double() - rlse[fin]).abs().max().item() < 2e-2


@pytest.mark.parametrize("case", BWD_CASES, ids=lambda c: c.id)
def test_bwd_matches_the_float64_oracle(case):
    g, d, t = make_bwd(case)
    plan_or_skip(g, ENGINE)
    assert g.engine_name == "SdpaBwdCudnn"
    got = _run(g, d, t)
    _, _, dq, dk, dv, dsink = oracle.attention_grads(
        t["q"], t["k"], t["v"], t["dO"], scale=1 / math.sqrt(case.d), sink=t.get("sink_token"), **_band_kw(case)
    )
    refs = [("dQ", dq), ("dK", dk), ("dV", dv)] + ([("dSink_token", dsink)] if "dSink_token" in got else [])
    for name, ref in refs:
        assert not torch.isnan(got[name]).any(), f"{name}: some elements were not written"
        assert_close_to_oracle(got[name], ref, rel=2e-2, kind="grad", io_dtype=case.dtype, name=name)


# --- bias and dBias ----------------------------------------------------------------------------------------------


def _biased_reference(q, k, v, bias, do, *, scale, causal):
    """float64 softmax(scale * q k^T + bias) v with autograd: (o, dq, dk, dv, dbias summed to bias's shape)."""
    leaves = [x.detach().double().requires_grad_(True) for x in (q, k, v, bias)]
    qd, kd, vd, bd = leaves
    s = torch.einsum("bhqd,bhkd->bhqk", qd, kd) * scale + bd
    if causal:
        s = s.masked_fill(~oracle.band(s.shape[-2], s.shape[-1], causal=True).to(s.device), float("-inf"))
    o = torch.softmax(s, dim=-1) @ vd
    grads = torch.autograd.grad(o, leaves, grad_outputs=do.double())
    return (o.detach(),) + tuple(grads)


@pytest.mark.parametrize("bias_shape", ["1h", "b1", "bh"])
@pytest.mark.parametrize("causal", [False, True])
def test_bias_forward_and_dbias_backward(bias_shape, causal):
    b, h, s, dh = 2, 4, 256, 128
    scale = 1 / math.sqrt(dh)
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(b, s, h, dh, device="cuda", dtype=torch.bfloat16).permute(0, 2, 1, 3) for _ in range(4))
    bdim = {"1h": (1, h, s, s), "b1": (b, 1, s, s), "bh": (b, h, s, s)}[bias_shape]
    bias = torch.randn(bdim, device="cuda", dtype=torch.bfloat16)
    mask = dict(use_causal_mask=True) if causal else {}

    g = frost.Graph(io_data_type=torch.bfloat16, intermediate_data_type=torch.float32, compute_data_type=torch.float32)
    dq_, dk_, dv_, db_ = (g.tensor_like(x, name=n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (bias, "bias")))
    o_t = torch.empty_like(q)
    stats_t = torch.empty(b, h, s, 1, device="cuda", dtype=torch.float32)
    o, stats = g.sdpa(dq_, dk_, dv_, attn_scale=scale, generate_stats=True, bias=db_, **mask)
    o.set_output(True).set_dim(tuple(o_t.shape)).set_stride(tuple(o_t.stride()))
    stats.set_output(True)
    plan_or_skip(g, ENGINE)
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
    o_t.fill_(float("nan"))
    g.execute({dq_: q, dk_: k, dv_: v, db_: bias, o: o_t, stats: stats_t}, ws, frost.ExecutionContext())
    torch.cuda.synchronize()
    ro, rdq, rdk, rdv, rdb = _biased_reference(q, k, v, bias, do, scale=scale, causal=causal)
    assert_close_to_oracle(o_t, ro, rel=1e-2, name="O")

    gb = frost.Graph(io_data_type=torch.bfloat16, intermediate_data_type=torch.float32, compute_data_type=torch.float32)
    t = {"q": q, "k": k, "v": v, "o": o_t, "dO": do, "stats": stats_t, "bias": bias}
    d = {n: gb.tensor_like(x, name=n) for n, x in t.items()}
    out = {
        "dQ": torch.empty_like(q),
        "dK": torch.empty_like(k),
        "dV": torch.empty_like(v),
        "dBias": torch.empty_like(bias),
    }
    d["dBias"] = gb.tensor_like(out["dBias"], name="dBias")
    grads = gb.sdpa_backward(
        d["q"], d["k"], d["v"], d["o"], d["dO"], d["stats"], attn_scale=scale, bias=d["bias"], dBias=d["dBias"], **mask
    )
    for n, decl in zip(("dQ", "dK", "dV"), grads):
        decl.set_output(True).set_dim(tuple(out[n].shape)).set_stride(tuple(out[n].stride()))
        d[n] = decl
    plan_or_skip(gb, ENGINE, any_cudnn_refusal=bias_shape != "1h")  # cuDNN's own tests take dBias as (1, H, S, S)
    assert gb.engine_name == "SdpaBwdCudnn"
    for x in out.values():
        x.fill_(float("nan"))
    ws = torch.empty(gb.get_workspace_size(), dtype=torch.uint8, device="cuda")
    gb.execute({d[n]: x for n, x in {**t, **out}.items()}, ws, frost.ExecutionContext())
    torch.cuda.synchronize()
    for name, ref in (("dQ", rdq), ("dK", rdk), ("dV", rdv), ("dBias", rdb)):
        assert not torch.isnan(out[name]).any(), f"{name}: some elements were not written"
        assert_close_to_oracle(out[name], ref, rel=2e-2, kind="grad", io_dtype=torch.bfloat16, name=name)


# --- dropout -----------------------------------------------------------------------------------------------------


def _dropout_graphs(p, *, b=2, h=4, s=512, dh=64, q_zero=False, seed=0):
    """A forward and a backward graph with dropout (p, seed, offset) over the same tensors."""
    torch.manual_seed(seed)
    q = torch.zeros if q_zero else torch.randn
    t = {
        "q": q(b, h, s, dh, device="cuda", dtype=torch.bfloat16),
        "k": torch.randn(b, h, s, dh, device="cuda", dtype=torch.bfloat16),
        "v": torch.randn(b, h, s, dh, device="cuda", dtype=torch.bfloat16),
        "seed": torch.full((1, 1, 1, 1), 123456, device="cuda", dtype=torch.int64),
        "offset": torch.full((1, 1, 1, 1), 789, device="cuda", dtype=torch.int64),
    }
    t["o"] = torch.empty_like(t["q"])
    t["stats"] = torch.empty(b, h, s, 1, device="cuda", dtype=torch.float32)
    t["dO"] = torch.randn_like(t["o"])
    for n in ("dQ", "dK", "dV"):
        t[n] = torch.empty_like(t[n[1].lower()])
    scale = 1 / math.sqrt(dh)

    fg = frost.Graph(io_data_type=torch.bfloat16, intermediate_data_type=torch.float32, compute_data_type=torch.float32)
    fd = {n: fg.tensor_like(t[n], name=n) for n in ("q", "k", "v", "seed", "offset")}
    o, stats = fg.sdpa(
        fd["q"], fd["k"], fd["v"], attn_scale=scale, generate_stats=True, dropout=(p, fd["seed"], fd["offset"])
    )
    o.set_output(True)
    stats.set_output(True)
    fd.update(o=o, stats=stats)

    bg = frost.Graph(io_data_type=torch.bfloat16, intermediate_data_type=torch.float32, compute_data_type=torch.float32)
    bd = {n: bg.tensor_like(t[n], name=n) for n in ("q", "k", "v", "o", "dO", "stats", "seed", "offset")}
    grads = bg.sdpa_backward(
        bd["q"],
        bd["k"],
        bd["v"],
        bd["o"],
        bd["dO"],
        bd["stats"],
        attn_scale=scale,
        dropout=(p, bd["seed"], bd["offset"]),
    )
    for n, decl in zip(("dQ", "dK", "dV"), grads):
        decl.set_output(True)
        bd[n] = decl
    plan_or_skip(fg, ENGINE)
    plan_or_skip(bg, ENGINE)
    return fg, fd, bg, bd, t


def _execute(g, decl, t):
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
    g.execute({decl[n]: t[n] for n in decl}, ws, frost.ExecutionContext())
    torch.cuda.synchronize()


def test_dropout_keeps_the_expected_fraction_with_inverse_scaling():
    """Uniform attention (q = 0) over v = 1: each output is (kept keys / S) / (1 - p), so its mean is 1 and its
    spread is the binomial one; the same seed repeats bit for bit, another seed does not."""
    p, s = 0.2, 512
    fg, fd, _, _, t = _dropout_graphs(p, s=s, q_zero=True)
    t["v"].fill_(1.0)
    _execute(fg, fd, t)
    o = t["o"][..., 0].double()  # every column of a row is the same kept fraction
    assert abs(o.mean().item() - 1.0) < 0.02
    want_std = math.sqrt(p * (1 - p) / s) / (1 - p)
    assert 0.7 * want_std < o.std().item() < 1.3 * want_std
    first = t["o"].clone()
    _execute(fg, fd, t)
    assert torch.equal(first, t["o"]), "one seed and offset must give one dropout mask"
    t["seed"].fill_(42)
    _execute(fg, fd, t)
    assert not torch.equal(first, t["o"]), "a new seed (read on the device at execute) must change the mask"


def test_dropout_forward_and_backward_share_one_mask():
    """With O = D V (D the dropped, rescaled probabilities) the backward's dV = D^T dO, so <O, dO> = <V, dV> per
    head: only a backward that drops the forward's weights satisfies it."""
    fg, fd, bg, bd, t = _dropout_graphs(0.3)
    _execute(fg, fd, t)
    _execute(bg, bd, t)
    lhs = (t["o"].double() * t["dO"].double()).sum(dim=(2, 3))
    rhs = (t["v"].double() * t["dV"].double()).sum(dim=(2, 3))
    assert ((lhs - rhs).abs() / lhs.abs().clamp_min(1.0)).max().item() < 3e-2
    t["seed"].fill_(7)  # a backward with another mask breaks the identity
    _execute(bg, bd, t)
    other = (t["v"].double() * t["dV"].double()).sum(dim=(2, 3))
    assert ((lhs - other).abs() / lhs.abs().clamp_min(1.0)).max().item() > 0.1


# --- the launch stream -------------------------------------------------------------------------------------------


def test_execute_allocates_nothing_and_never_syncs():
    case = FwdCase(d=128, causal=True)
    g, decl, t = make_fwd(case)
    plan_or_skip(g, ENGINE)
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
    vp = pack(decl, t)
    g.execute(vp, ws, frost.ExecutionContext())  # the handle of this stream exists after planning
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            g.execute(vp, ws, frost.ExecutionContext())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before


# --- packed (THD) graphs: cuDNN's ragged form, lengths and offsets derived on the device ------------------------

THD_CASES = [
    FwdCase(d=128, hq=4, hkv=4, thd_lens=[(0, 0), (1, 1), (77, 77), (300, 300), (5, 130)], causal=True),
    FwdCase(d=128, hq=8, hkv=2, thd_lens=[(100, 100), (0, 0), (257, 300)]),
    FwdCase(d=64, hq=4, hkv=4, thd_lens=[(64, 200), (0, 0), (129, 129)], causal=True, bottom_right=True),
    FwdCase(d=128, hq=4, hkv=4, thd_lens=[(33, 33), (200, 200), (0, 0)], causal=True, left=64),
    FwdCase(d=128, hq=4, hkv=4, thd_lens=[(33, 33), (200, 200)], causal=True, sinks=True),
]


def _packed_lengths(t) -> dict:
    return dict(cu_seq_len_q=t["cu_seq_len_q"].tolist(), cu_seq_len_kv=t["cu_seq_len_kv"].tolist())


def _check_thd_fwd(case, t):
    ro, rlse = oracle.attention(
        t["q"],
        t["k"],
        t["v"],
        scale=1 / math.sqrt(case.d),
        sink=t.get("sink_token"),
        **_packed_lengths(t),
        **_band_kw(case),
    )
    n = int(t["cu_seq_len_q"][-1])  # tokens past the last sequence are not the engine's
    o, lse = t["o"][:n], t["stats"][:n, :, 0]
    assert not torch.isnan(o).any(), "some output rows were not written"
    assert_close_to_oracle(o, ro[:n], rel=1e-2, name="O")
    fin = torch.isfinite(rlse[:n])
    assert (lse[fin].double() - rlse[:n][fin]).abs().max().item() < 2e-2


def _check_thd_bwd(case, t, got):
    _, _, dq, dk, dv, dsink = oracle.attention_grads(
        t["q"],
        t["k"],
        t["v"],
        t["dO"],
        scale=1 / math.sqrt(case.d),
        sink=t.get("sink_token"),
        **_packed_lengths(t),
        **_band_kw(case),
    )
    nq, nk = int(t["cu_seq_len_q"][-1]), int(t["cu_seq_len_kv"][-1])
    refs = [("dQ", dq, nq), ("dK", dk, nk), ("dV", dv, nk)]
    refs += [("dSink_token", dsink, None)] if "dSink_token" in got else []
    for name, ref, n in refs:
        x, r = (got[name][:n], ref[:n]) if n is not None else (got[name], ref)
        assert not torch.isnan(x).any(), f"{name}: some elements were not written"
        assert_close_to_oracle(x, r, rel=2e-2, kind="grad", io_dtype=case.dtype, name=name)


@pytest.mark.parametrize("case", THD_CASES, ids=lambda c: c.id)
def test_thd_fwd_matches_the_float64_oracle(case):
    """Empty sequences included: the derived lengths are 0 and the offsets repeat."""
    g, decl, t = make_fwd(case)
    plan_or_skip(g, ENGINE)
    assert g.engine_name == "SdpaFwdCudnn" and g.plan.adapter.call.derived is not None
    t["o"].fill_(float("nan"))
    t["stats"].fill_(float("nan"))
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
    ws.fill_(255)  # poisoned scratch: the derived lengths and offsets are written on every execute
    g.execute(pack(decl, t), ws, frost.ExecutionContext())
    torch.cuda.synchronize()
    _check_thd_fwd(case, t)


@pytest.mark.parametrize("case", THD_CASES, ids=lambda c: c.id)
def test_thd_bwd_matches_the_float64_oracle(case):
    g, d, t = make_bwd(case)
    plan_or_skip(g, ENGINE)
    assert g.engine_name == "SdpaBwdCudnn"
    _check_thd_bwd(case, t, _run(g, d, t))


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_thd_capture_replay_follows_new_lengths_without_sync_or_allocation(direction):
    """An execute reads the lengths on the device only: no sync (debug mode "error"), no allocation, and a CUDA
    graph captured once replays with new lengths written into the same cu_seq_len tensors."""
    case = FwdCase(d=128, hq=4, hkv=2, thd_lens=[(100, 100), (300, 300), (17, 17), (0, 0)], causal=True)
    g, d, t = make_fwd(case) if direction == "fwd" else make_bwd(case)
    plan_or_skip(g, ENGINE)
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
    vp = pack(d, t)
    # the stream's cuDNN handle is made before the capture
    graph = capture_after_clean_execute(g, vp, ws, torch.cuda.Stream())
    cu = torch.tensor([0, 250, 251, 417, 417], dtype=torch.int32, device="cuda")
    t["cu_seq_len_q"].copy_(cu)
    t["cu_seq_len_kv"].copy_(cu)
    outs = ("o", "stats") if direction == "fwd" else ("dQ", "dK", "dV")
    if direction == "bwd":
        fg, fdecl = t["_forward"]
        fg.execute(pack(fdecl, t), None)  # O and Stats for the new lengths (reference, outside the graph)
    for name in outs:
        t[name].fill_(float("nan"))
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    if direction == "fwd":
        _check_thd_fwd(case, t)
    else:
        _check_thd_bwd(case, t, {n: t[n] for n in outs})


def test_thd_non_default_stream_is_honored():
    """The ragged-offsets kernel and cuDNN both launch on the context's stream: execute finishes while the
    default stream is held."""
    case = FwdCase(d=128, hq=4, hkv=4, thd_lens=[(500, 500), (0, 0), (300, 700)], causal=True)
    g, decl, t = make_fwd(case)
    plan_or_skip(g, ENGINE)
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
    side = torch.cuda.Stream()
    g.execute(pack(decl, t), ws, frost.ExecutionContext(stream=side))  # makes the stream's handle
    torch.cuda.synchronize()
    t["o"].fill_(float("nan"))
    torch.cuda.synchronize()
    assert_runs_on_side_stream(lambda: g.execute(pack(decl, t), ws, frost.ExecutionContext(stream=side)), side)
    _check_thd_fwd(case, t)


def _ragged_form(lens, *, h=4, d=128, s=320, seed=0):
    """cuDNN's ragged form declared directly on a GPU: (B, H, S, D) views with bshd strides over packed tokens
    (storage for B*S tokens, the data in the first ones), int64 offsets for the tensors, int32 for Stats."""
    torch.manual_seed(seed)
    b = len(lens)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    dev, bf16 = "cuda", torch.bfloat16

    def storage():
        return torch.randn(b * s, h, d, device=dev, dtype=bf16)

    def as4(x):
        return x.as_strided((b, h, s, d), (s * h * d, d, h * d, 1))

    t = {
        "q": storage(),
        "k": storage(),
        "v": storage(),
        "o": torch.full((b * s, h, d), float("nan"), device=dev, dtype=bf16),
        "dO": storage(),
        "stats": torch.full((b * s, h), float("nan"), device=dev),
    }
    cu_t = torch.tensor(cu, device=dev, dtype=torch.int64)
    t["off"] = (cu_t * h * d).view(b + 1, 1, 1, 1)
    t["off_stats"] = (cu_t * h).to(torch.int32).view(b + 1, 1, 1, 1)
    t["lens"] = torch.tensor(lens, device=dev, dtype=torch.int32).view(b, 1, 1, 1)
    views = {r: as4(t[r]) for r in ("q", "k", "v", "o", "dO")}
    views["stats"] = t["stats"].as_strided((b, h, s, 1), (s * h, 1, h, 1))
    return t, views, cu


def test_ragged_form_fwd_and_bwd_match_the_float64_oracle():
    """A graph declared in cuDNN's ragged form runs with its declared offsets and lengths as they are."""
    lens = [77, 0, 300, 5]
    h, d = 4, 128
    t, x, cu = _ragged_form(lens, h=h, d=d)
    scale = 1 / math.sqrt(d)
    g = frost.Graph(io_data_type=torch.bfloat16, intermediate_data_type=torch.float32, compute_data_type=torch.float32)
    off, off_st = g.tensor_like(t["off"], name="off"), g.tensor_like(t["off_stats"], name="off_stats")
    lq, lk = g.tensor_like(t["lens"], name="lq"), g.tensor_like(t["lens"], name="lk")
    q, k, v = (g.tensor_like(x[r], name=r).set_ragged_offset(off) for r in ("q", "k", "v"))
    common = dict(attn_scale=scale, use_causal_mask=True, use_padding_mask=True, seq_len_q=lq, seq_len_kv=lk)
    o, stats = g.sdpa(q, k, v, generate_stats=True, **common)
    o.set_output(True).set_dim(tuple(x["o"].shape)).set_stride(tuple(x["o"].stride())).set_ragged_offset(off)
    stats.set_output(True).set_dim(tuple(x["stats"].shape)).set_stride(tuple(x["stats"].stride()))
    stats.set_ragged_offset(off_st)
    plan_or_skip(g, ENGINE)
    assert g.engine_name == "SdpaFwdCudnn" and g.plan.adapter.call.derived is None
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
    vp = {
        q: x["q"],
        k: x["k"],
        v: x["v"],
        o: x["o"],
        stats: x["stats"],
        off: t["off"],
        off_st: t["off_stats"],
        lq: t["lens"],
        lk: t["lens"],
    }
    g.execute(vp, ws, frost.ExecutionContext())
    torch.cuda.synchronize()
    n = cu[-1]
    packed = {r: t[r][:n] for r in ("q", "k", "v", "dO")}
    ro, rlse, dq, dk, dv, _ = oracle.attention_grads(
        packed["q"], packed["k"], packed["v"], packed["dO"], scale=scale, cu_seq_len_q=cu, cu_seq_len_kv=cu, causal=True
    )
    assert_close_to_oracle(t["o"][:n], ro, rel=1e-2, name="O")
    assert (t["stats"][:n].double() - rlse).abs().max().item() < 2e-2

    bg = frost.Graph(io_data_type=torch.bfloat16, intermediate_data_type=torch.float32, compute_data_type=torch.float32)
    boff, boff_st = bg.tensor_like(t["off"], name="off"), bg.tensor_like(t["off_stats"], name="off_stats")
    blq, blk = bg.tensor_like(t["lens"], name="lq"), bg.tensor_like(t["lens"], name="lk")
    bt = {r: bg.tensor_like(x[r], name=r).set_ragged_offset(boff) for r in ("q", "k", "v", "o", "dO")}
    bt["stats"] = bg.tensor_like(x["stats"], name="stats").set_ragged_offset(boff_st)
    grads = bg.sdpa_backward(
        bt["q"],
        bt["k"],
        bt["v"],
        bt["o"],
        bt["dO"],
        bt["stats"],
        attn_scale=scale,
        use_causal_mask=True,
        use_padding_mask=True,
        seq_len_q=blq,
        seq_len_kv=blk,
    )
    out = {r: torch.full_like(t["q"], float("nan")) for r in ("dQ", "dK", "dV")}
    for grad, r in zip(grads, ("dQ", "dK", "dV")):
        x[r] = out[r].as_strided(x["q"].shape, x["q"].stride())
        grad.set_output(True).set_dim(tuple(x[r].shape)).set_stride(tuple(x[r].stride())).set_ragged_offset(boff)
    plan_or_skip(bg, ENGINE)
    assert bg.engine_name == "SdpaBwdCudnn"
    bws = torch.empty(bg.get_workspace_size(), dtype=torch.uint8, device="cuda")
    bvp = {bt[r]: x[r] for r in bt}
    bvp.update(
        {
            grads[0]: x["dQ"],
            grads[1]: x["dK"],
            grads[2]: x["dV"],
            boff: t["off"],
            boff_st: t["off_stats"],
            blq: t["lens"],
            blk: t["lens"],
        }
    )
    bg.execute(bvp, bws, frost.ExecutionContext())
    torch.cuda.synchronize()
    for name, ref in (("dQ", dq), ("dK", dk), ("dV", dv)):
        got = out[name][:n]
        assert not torch.isnan(got).any(), name
        assert_close_to_oracle(got, ref, rel=2e-2, kind="grad", io_dtype=torch.bfloat16, name=name)


def test_cuda_graph_capture_and_replay_with_new_inputs():
    """An execute on a stream that has run once is capturable; a replay reads the new contents of the tensors."""
    case = FwdCase(d=128, causal=True, stats=False)
    g, decl, t = make_fwd(case)
    plan_or_skip(g, ENGINE)
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
    vp = pack(decl, t)
    s = torch.cuda.Stream()
    g.execute(vp, ws, frost.ExecutionContext(stream=s))  # makes this stream's handle outside the capture
    torch.cuda.synchronize()
    cg = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cg, stream=s):
        g.execute(vp, ws, frost.ExecutionContext(stream=s))
    for seed in (1, 2):
        torch.manual_seed(seed)
        for r in ("q", "k", "v"):
            t[r].copy_(torch.randn_like(t[r]))
        t["o"].fill_(float("nan"))
        cg.replay()
        torch.cuda.synchronize()
        ro, _ = oracle.attention(t["q"], t["k"], t["v"], scale=1 / math.sqrt(case.d), causal=True)
        assert_close_to_oracle(t["o"], ro, rel=1e-2, name="O")


# --- the lean execute ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        FwdCase(d=128, causal=True),
        FwdCase(d=64, hq=8, hkv=2, layout="bhsd"),
        FwdCase(d=128, thd_lens=[(100, 100), (0, 0), (257, 300)], causal=True),
    ],
    ids=lambda c: c.id,
)
def test_the_raw_pointer_execute_matches_the_bindings_own_execute(case):
    """Execute takes the backend's raw-pointer entry with this binding, and it writes what the binding's public
    execute (`tensor_uids=`) writes, bit for bit."""
    g, decl, t = make_fwd(case)
    plan_or_skip(g, ENGINE)
    adapter = g.plan.adapter
    assert adapter._raw is not None, "the binding's raw-pointer execute was not found (execute takes its public path)"
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
    outs = ("o", "stats")
    got = {}
    for raw in (adapter._raw, None):
        adapter._raw = raw
        for name in outs:
            t[name].fill_(float("nan"))
        g.execute(pack(decl, t), ws, frost.ExecutionContext())
        torch.cuda.synchronize()
        got[raw is not None] = [t[name].clone() for name in outs]
    for a, b in zip(got[True], got[False]):
        assert torch.equal(a.nan_to_num(123.0), b.nan_to_num(123.0))
    assert not torch.isnan(got[True][0][: int(t["cu_seq_len_q"][-1])] if case.thd_lens else got[True][0]).any()
