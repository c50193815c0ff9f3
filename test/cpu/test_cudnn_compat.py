"""cuDNN programs written as NVIDIA's own SDPA tests write them (test_mhas_v2.py and its sdpa/fp16.py), with
`import frost as cudnn`: configs whose boolean fields default to None, `implementation=` from the config, version
gates on `backend_version_string()`, packed (T, H, D) buffers bound to (B, H, S, D) ragged declarations, and
dropout with its mask dump. Each runs on the CPU reference engine (or is lowered for the cuDNN engine) and is
checked against float64 math or against the same graph written with False / AUTO.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import pytest
import torch

import frost as cudnn
from frost.adapters.cudnn_lowering import lower_cudnn_sdpa
from frost.errors import BindingError, GraphError, NotSupportedError
from frost.target import fake_target


def _version(text: str) -> tuple:
    return tuple(int(p) for p in text.split("."))


@dataclass
class Cfg:
    """The shape of test_mhas_v2's config: boolean fields left at None unless a test sets them."""

    b: int = 2
    h: int = 2
    s_q: int = 24
    s_kv: int = 24
    d: int = 32
    is_alibi: Optional[bool] = None
    is_padding: Optional[bool] = None
    is_causal: Optional[bool] = None
    is_causal_br: Optional[bool] = None
    is_determin: Optional[bool] = None
    with_unfuse_fma: Optional[bool] = None
    implementation: object = field(default_factory=lambda: cudnn.attention_implementation.AUTO)


def _fwd_graph(cfg: Cfg):
    g = cudnn.pygraph(
        io_data_type=cudnn.data_type.FLOAT,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )
    dims = (cfg.b, cfg.h, cfg.s_q, cfg.d)
    strides = (cfg.s_q * cfg.h * cfg.d, cfg.d, cfg.h * cfg.d, 1)
    q = g.tensor(uid=1, dim=dims, stride=strides, data_type=cudnn.data_type.FLOAT)
    k = g.tensor(uid=2, dim=dims, stride=strides, data_type=cudnn.data_type.FLOAT)
    v = g.tensor(uid=3, dim=dims, stride=strides, data_type=cudnn.data_type.FLOAT)
    o, stats = g.sdpa(
        name="sdpa_forward",
        q=q,
        k=k,
        v=v,
        generate_stats=True,
        attn_scale=0.125,
        use_alibi_mask=cfg.is_alibi,
        use_padding_mask=cfg.is_padding,
        use_causal_mask=cfg.is_causal,
        use_causal_mask_bottom_right=cfg.is_causal_br,
        implementation=cfg.implementation,
        unfuse_fma=cfg.with_unfuse_fma,
    )
    o.set_uid(4).set_output(True).set_dim(dims).set_stride(strides)
    stats.set_uid(5).set_output(True).set_data_type(cudnn.data_type.FLOAT)
    return g, (q, k, v, o, stats)


def _run(g, tensors, seed=0):
    q, k, v, o, stats = tensors
    gen = torch.Generator().manual_seed(seed)
    pack = {
        t.get_uid(): torch.randn(t.get_dim(), generator=gen).as_strided(t.get_dim(), t.get_stride()) for t in (q, k, v)
    }
    pack[o.get_uid()] = torch.full(o.get_dim(), float("nan")).as_strided(o.get_dim(), o.get_stride())
    pack[stats.get_uid()] = torch.full(stats.get_dim(), float("nan"))
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    g.execute(pack, torch.empty(g.get_workspace_size(), dtype=torch.uint8), cudnn.create_handle())
    return pack


# 1. None for a boolean keyword --------------------------------------------------------------------------------
def test_a_config_of_none_flags_is_the_graph_of_false_flags():
    """cuDNN's binding takes its `bool` keywords through pybind11, which reads None as False."""
    g_none, t_none = _fwd_graph(Cfg())
    g_false, t_false = _fwd_graph(
        Cfg(is_alibi=False, is_padding=False, is_causal=False, is_causal_br=False, with_unfuse_fma=False)
    )
    assert g_none.validate().facts == g_false.validate().facts
    out_none, out_false = _run(g_none, t_none), _run(g_false, t_false)
    for uid in (4, 5):
        assert torch.equal(out_none[uid], out_false[uid])
    assert not out_none[4].isnan().any()


def test_none_flags_in_the_backward_and_true_still_counts():
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT)
    dims = (1, 2, 16, 32)
    q, k, v, o, do = (g.tensor(dim=dims, stride=(1024, 512, 32, 1)) for _ in range(5))
    st = g.tensor(dim=(1, 2, 16, 1), stride=(32, 16, 1, 1), data_type=cudnn.data_type.FLOAT)
    cfg = Cfg(is_causal=True)
    for grad in g.sdpa_backward(
        q=q,
        k=k,
        v=v,
        o=o,
        dO=do,
        stats=st,
        attn_scale=0.125,
        use_alibi_mask=cfg.is_alibi,
        use_padding_mask=cfg.is_padding,
        use_causal_mask=cfg.is_causal,
        use_deterministic_algorithm=cfg.is_determin,
    ):
        grad.set_output(True)
    f = g.validate().facts
    assert f.window_right == 0 and not f.deterministic and not f.has_alibi and not f.has_padding


@pytest.mark.parametrize("value", [0, 1, 0.0, "False", [], (True,)])
@pytest.mark.parametrize(
    "key", ["use_alibi_mask", "use_padding_mask", "use_causal_mask", "use_causal_mask_bottom_right", "unfuse_fma"]
)
def test_what_is_not_true_false_or_none_still_raises(key, value):
    """Numbers usually mean a positional argument in the wrong slot: frost refuses them (pybind11 would take their
    truth value; docs/porting.md says so)."""
    g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF)
    q, k, v = (g.tensor((1, 2, 8, 64)) for _ in range(3))
    with pytest.raises(GraphError, match=f"{key} must be True or False"):
        g.sdpa(q, k, v, generate_stats=False, **{key: value})


def test_deterministic_none_reads_false_and_an_int_raises():
    for value, ok in ((None, True), (1, False)):
        g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF)
        ts = [g.tensor((1, 2, 8, 64)) for _ in range(5)] + [g.tensor((1, 2, 8, 1), data_type=cudnn.data_type.FLOAT)]
        if ok:
            g.sdpa_backward(*ts, use_deterministic_algorithm=value)
            assert g.node.use_deterministic_algorithm is False
        else:
            with pytest.raises(GraphError, match="use_deterministic_algorithm must be True or False"):
                g.sdpa_backward(*ts, use_deterministic_algorithm=value)


def test_numpy_bools_read_as_their_value():
    np = pytest.importorskip("numpy")
    g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF)
    q, k, v = (g.tensor((1, 2, 8, 64)) for _ in range(3))
    g.sdpa(q, k, v, generate_stats=False, use_causal_mask=np.bool_(True))
    assert g.node.attrs.use_causal_mask is True


# 2. the version frost reports, implementation= ---------------------------------------------------------------
def test_version_gates_of_served_features_pass():
    """test_mhas_v2 waives UNIFIED below 9.13.1 and row-output combinations below 9.20.0; sdpa/fp16.py expects
    -inf Stats in padded rows from 9.14.0 (frost writes -inf)."""
    v = _version(cudnn.backend_version_string())
    assert v >= (9, 20, 0) and cudnn.backend_version() == v[0] * 10000 + v[1] * 100 + v[2]
    assert v >= (9, 13, 1) and v >= (9, 14, 0) and v >= (9, 10, 0)


@pytest.mark.parametrize("impl", ["COMPOSITE", "UNIFIED"])
def test_implementation_is_a_hint_that_changes_nothing(impl):
    cfg = Cfg(is_causal=True, implementation=getattr(cudnn.attention_implementation, impl))
    g, ts = _fwd_graph(cfg)
    g_auto, ts_auto = _fwd_graph(Cfg(is_causal=True))
    assert g.validate().facts == g_auto.validate().facts
    out, ref = _run(g, ts), _run(g_auto, ts_auto)
    assert torch.equal(out[4], ref[4]) and torch.equal(out[5], ref[5])


def test_an_unknown_implementation_raises():
    with pytest.raises(GraphError, match="implementation"):
        _fwd_graph(Cfg(implementation="FASTEST"))


def test_padded_rows_of_stats_are_minus_infinity():
    """From 9.14.0 (the version frost reports is later) cuDNN's tests expect Stats = -inf past seq_len_q."""
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT)
    b, h, s, d = 2, 2, 16, 32
    q, k, v = (g.tensor((b, h, s, d)) for _ in range(3))
    lq, lk = (g.tensor((b, 1, 1, 1), (1, 1, 1, 1), cudnn.data_type.INT32) for _ in range(2))
    o, st = g.sdpa(q, k, v, generate_stats=True, attn_scale=0.1, use_padding_mask=True, seq_len_q=lq, seq_len_kv=lk)
    o.set_output(True)
    st.set_output(True)
    g.build_plans()
    out = {o: torch.full(o.dim, float("nan")), st: torch.full(st.dim, float("nan"))}
    lens = torch.tensor([5, 16], dtype=torch.int32).view(2, 1, 1, 1)
    g.execute(
        {q: torch.randn(q.dim), k: torch.randn(k.dim), v: torch.randn(v.dim), lq: lens, lk: lens, **out},
        torch.empty(g.get_workspace_size(), dtype=torch.uint8),
    )
    assert torch.isneginf(out[st][0, :, 5:]).all() and torch.isfinite(out[st][0, :, :5]).all()
    assert torch.isfinite(out[st][1]).all()


# 5. dropout with rng_dump ------------------------------------------------------------------------------------
def _dropout_graph(target=None, dump=True, dump_dims=None):
    """sdpa/fp16.py's dropout declaration: int64 seed and offset (1, 1, 1, 1), an fp32 (B, H, S_q, S_kv) dump."""
    g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, target=target)
    b, h, s, d = 2, 4, 32, 64
    q, k, v = (g.tensor(dim=(b, h, s, d), stride=(s * h * d, d, h * d, 1)) for _ in range(3))
    seed = g.tensor(uid=30, dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=cudnn.data_type.INT64)
    offset = g.tensor(uid=31, dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=cudnn.data_type.INT64)
    dd = dump_dims or (b, h, s, s)
    rng_dump = (
        g.tensor(
            uid=32, dim=dd, stride=(dd[1] * dd[2] * dd[3], dd[2] * dd[3], dd[3], 1), data_type=cudnn.data_type.FLOAT
        )
        if dump
        else None
    )
    o, stats = g.sdpa(
        q=q,
        k=k,
        v=v,
        generate_stats=True,
        attn_scale=0.125,
        dropout=(0.1, seed, offset),
        rng_dump=rng_dump,
        use_causal_mask=None,
        implementation=cudnn.attention_implementation.AUTO,
    )
    o.set_output(True)
    stats.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    return g, rng_dump


def test_rng_dump_is_lowered_for_the_cudnn_engine_as_an_output(cudnn_present):
    g, rng_dump = _dropout_graph(target=fake_target("H200"))
    g.build_operation_graph()
    assert rng_dump.is_output
    assert g.available_engines() == ["SdpaFwdCudnn"]
    call = lower_cudnn_sdpa(g.facts)
    assert ("rng_dump", "rng_dump") in call.tensor_kwargs and "rng_dump" in call.output_kwargs
    assert call.dropout == (pytest.approx(0.1), "dropout_seed", "dropout_offset")
    spec = next(t for t in call.inputs if t.role == "rng_dump")
    assert spec.dim == (2, 4, 32, 32) and spec.dtype == "fp32"


def test_every_other_engine_declines_naming_rng_dump():
    g, _ = _dropout_graph(target=fake_target("H200"))
    g.build_operation_graph()
    reasons = dict(g.declines())
    for engine in ("SdpaFwdDslSm90", "SdpaFwdDslSm80", "SdpaFwdReference"):
        assert "rng_dump" in reasons[engine] and "cuDNN engine" in reasons[engine]
    cpu, _ = _dropout_graph()
    with pytest.raises(NotSupportedError, match="rng_dump"):
        cpu.build_plans()


def test_rng_dump_without_dropout_or_of_the_wrong_shape_raises():
    g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF)
    q, k, v = (g.tensor((2, 4, 32, 64)) for _ in range(3))
    dump = g.tensor((2, 4, 32, 32), data_type=cudnn.data_type.FLOAT)
    o, _ = g.sdpa(q, k, v, generate_stats=False, rng_dump=dump)
    o.set_output(True)
    with pytest.raises(GraphError, match="needs dropout"):
        g.validate()
    g2, _ = _dropout_graph(dump_dims=(2, 4, 32, 16))
    with pytest.raises(GraphError, match="rng_dump"):
        g2.validate()


# 3. packed (T, H, D) buffers bound to (B, H, S, D) ragged declarations ----------------------------------------
def _prefix(lens: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.zeros(1, dtype=lens.dtype), lens.flatten().cumsum(0)]).view(-1, 1, 1, 1)


def _ragged_case(seed=0, lens_q=(5, 0, 11), lens_kv=(7, 3, 13), s_q=40, s_kv=48, h=2, d=16):
    """sdpa/fp16.py's allocation: packed buffers of max(64, sum rounded up to 64) tokens, lengths (B, 1, 1, 1)
    int32, int64 element offsets prefix(len) * H * D per tensor (Stats: * H)."""
    gen = torch.Generator().manual_seed(seed)
    lq = torch.tensor(lens_q, dtype=torch.int32).view(-1, 1, 1, 1)
    lkv = torch.tensor(lens_kv, dtype=torch.int32).view(-1, 1, 1, 1)
    t_q = max(64, (sum(lens_q) + 63) // 64 * 64)
    t_kv = max(64, (sum(lens_kv) + 63) // 64 * 64)
    bufs = {
        "q": torch.randn(t_q, h, d, generator=gen),
        "k": torch.randn(t_kv, h, d, generator=gen),
        "v": torch.randn(t_kv, h, d, generator=gen),
        "o": torch.full((t_q, h, d), float("nan")),
        "stats": torch.full((t_q, h, 1), float("nan")),
        "dO": torch.randn(t_q, h, d, generator=gen),
        "dQ": torch.full((t_q, h, d), float("nan")),
        "dK": torch.full((t_kv, h, d), float("nan")),
        "dV": torch.full((t_kv, h, d), float("nan")),
    }
    offs = {"q": (_prefix(lq) * h * d).long(), "kv": (_prefix(lkv) * h * d).long(), "stats": (_prefix(lq) * h).long()}
    return dict(lq=lq, lkv=lkv, t_q=t_q, t_kv=t_kv, bufs=bufs, offs=offs, b=len(lens_q), h=h, d=d, s_q=s_q, s_kv=s_kv)


def _declare_ragged(g, c, roles):
    """(B, H, S, D) bshd declarations with a ragged offset each, as cuDNN's tests declare them."""
    b, h, d = c["b"], c["h"], c["d"]
    ts = {}
    offsets = {
        key: g.tensor(dim=(b + 1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=cudnn.data_type.INT64)
        for key in ("q", "kv", "stats")
    }
    for r in roles:
        s = c["s_q"] if r in ("q", "o", "dO") else c["s_kv"]
        ts[r] = g.tensor(dim=(b, h, s, d), stride=(s * h * d, d, h * d, 1), data_type=cudnn.data_type.FLOAT)
        ts[r].set_ragged_offset(offsets["q" if r in ("q", "o", "dO") else "kv"])
    lens = {
        n: g.tensor(dim=(b, 1, 1, 1), stride=(1, 1, 1, 1), data_type=cudnn.data_type.INT32)
        for n in ("seq_len_q", "seq_len_kv")
    }
    return ts, offsets, lens


def _oracle(c, causal=True):
    """float64 attention per sequence, (T, H, D) in and out, with each sequence's rows and LSE."""
    q, k, v = (c["bufs"][r].double() for r in "qkv")
    oq, okv = _prefix(c["lq"]).flatten().tolist(), _prefix(c["lkv"]).flatten().tolist()
    rows = []
    for b in range(c["b"]):
        qs, ks, vs = q[oq[b] : oq[b + 1]], k[okv[b] : okv[b + 1]], v[okv[b] : okv[b + 1]]
        s = torch.einsum("qhd,khd->hqk", qs, ks) * 0.125
        if causal:
            s = s.masked_fill(torch.ones(s.shape[1:], dtype=torch.bool).triu(1), float("-inf"))
        lse = torch.logsumexp(s, -1)
        o = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1).nan_to_num(0.0), vs)
        rows.append((oq[b], oq[b + 1], o, lse))
    return rows


def _ragged_fwd_graph(c, max_total=False):
    g = cudnn.pygraph(
        io_data_type=cudnn.data_type.FLOAT,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )
    ts, offs, lens = _declare_ragged(g, c, ("q", "k", "v"))
    extra = dict(max_total_seq_len_q=c["t_q"], max_total_seq_len_kv=c["t_kv"]) if max_total else {}
    o, stats = g.sdpa(
        name="sdpa_forward",
        q=ts["q"],
        k=ts["k"],
        v=ts["v"],
        generate_stats=True,
        attn_scale=0.125,
        use_alibi_mask=None,
        use_padding_mask=True,
        seq_len_q=lens["seq_len_q"],
        seq_len_kv=lens["seq_len_kv"],
        diagonal_band_right_bound=0,
        dropout=None,
        rng_dump=None,
        implementation=cudnn.attention_implementation.UNIFIED,
        **extra,
    )
    b, h, s, d = ts["q"].get_dim()
    o.set_output(True).set_dim((b, h, s, d)).set_stride((s * h * d, d, h * d, 1)).set_ragged_offset(offs["q"])
    stats.set_output(True).set_data_type(cudnn.data_type.FLOAT).set_dim((b, h, s, 1)).set_stride((s * h, 1, h, 1))
    stats.set_ragged_offset(offs["stats"])
    ts.update(o=o, stats=stats)
    return g, ts, offs, lens


def _pack(c, ts, offs, lens):
    pack = {ts[r]: c["bufs"][r] for r in ts}
    pack.update({offs[key]: c["offs"][key] for key in offs})
    pack.update({lens["seq_len_q"]: c["lq"], lens["seq_len_kv"]: c["lkv"]})
    return pack


def test_packed_buffers_bind_to_ragged_declarations_forward():
    c = _ragged_case()
    g, ts, offs, lens = _ragged_fwd_graph(c)
    g.validate()
    g.build_plans()
    bufs = c["bufs"]
    o_ptr = bufs["o"].data_ptr()
    g.execute(_pack(c, ts, offs, lens), torch.empty(g.get_workspace_size(), dtype=torch.uint8), cudnn.create_handle())
    assert bufs["o"].data_ptr() == o_ptr  # written in place: the buffers themselves were bound
    used = sum(c["lq"].flatten().tolist())
    for start, end, o, lse in _oracle(c):
        torch.testing.assert_close(bufs["o"][start:end].double(), o, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(bufs["stats"][start:end, :, 0].double(), lse.t(), atol=1e-5, rtol=1e-5)
    assert bufs["o"][used:].isnan().all()  # tokens past the sequences are left as they were


def test_packed_buffers_bind_to_ragged_declarations_backward():
    """sdpa/fp16.py's backward: max_total_seq_len_q/kv declared, dQ, dK, dV packed like q, k, v."""
    c = _ragged_case(seed=1)
    fwd, ts, offs, lens = _ragged_fwd_graph(c)
    fwd.build_plans()
    fwd.execute(_pack(c, ts, offs, lens), torch.empty(fwd.get_workspace_size(), dtype=torch.uint8))
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT)
    ts, offs, lens = _declare_ragged(g, c, ("q", "k", "v", "o", "dO"))
    b, h, s, d = ts["q"].get_dim()
    stats = g.tensor(dim=(b, h, s, 1), stride=(s * h, 1, h, 1), data_type=cudnn.data_type.FLOAT)
    stats.set_ragged_offset(offs["stats"])
    grads = g.sdpa_backward(
        name="sdpa_backward",
        q=ts["q"],
        k=ts["k"],
        v=ts["v"],
        o=ts["o"],
        dO=ts["dO"],
        stats=stats,
        attn_scale=0.125,
        use_alibi_mask=None,
        use_padding_mask=True,
        seq_len_q=lens["seq_len_q"],
        seq_len_kv=lens["seq_len_kv"],
        max_total_seq_len_q=c["t_q"],
        max_total_seq_len_kv=c["t_kv"],
        diagonal_band_right_bound=0,
        dropout=None,
        use_deterministic_algorithm=None,
    )
    for name, grad, like in zip(("dQ", "dK", "dV"), grads, ("q", "k", "v")):
        grad.set_output(True).set_ragged_offset(offs["q" if like == "q" else "kv"])
        ts[name] = grad
    ts["stats"] = stats
    g.validate()
    g.build_plans()
    g.execute(_pack(c, ts, offs, lens), torch.empty(g.get_workspace_size(), dtype=torch.uint8))
    # float64 autograd per sequence
    q, k, v = (c["bufs"][r].double().requires_grad_() for r in "qkv")
    oq, okv = _prefix(c["lq"]).flatten().tolist(), _prefix(c["lkv"]).flatten().tolist()
    total = 0
    for i in range(b):
        qs, ks, vs = q[oq[i] : oq[i + 1]], k[okv[i] : okv[i + 1]], v[okv[i] : okv[i + 1]]
        sc = torch.einsum("qhd,khd->hqk", qs, ks) * 0.125
        sc = sc.masked_fill(torch.ones(sc.shape[1:], dtype=torch.bool).triu(1), float("-inf"))
        o = torch.einsum("hqk,khd->qhd", torch.softmax(sc, -1).nan_to_num(0.0), vs)
        total = total + (o * c["bufs"]["dO"][oq[i] : oq[i + 1]].double()).sum()
    total.backward()
    for name, ref, end in (("dQ", q.grad, oq[-1]), ("dK", k.grad, okv[-1]), ("dV", v.grad, okv[-1])):
        torch.testing.assert_close(c["bufs"][name][:end].double(), ref[:end], atol=1e-5, rtol=1e-5)


def _bind_fails(c, role, buf, fragment, max_total=True):
    g, ts, offs, lens = _ragged_fwd_graph(c, max_total=max_total)
    g.build_plans()
    pack = _pack(c, ts, offs, lens)
    pack[ts[role]] = buf
    with pytest.raises(BindingError, match=fragment):
        g.execute(pack, torch.empty(g.get_workspace_size(), dtype=torch.uint8))


def test_what_a_packed_buffer_must_be():
    c = _ragged_case(seed=2)
    t_q, h, d = c["t_q"], c["h"], c["d"]
    _bind_fails(c, "q", torch.randn(t_q, h, d, dtype=torch.float64), "declared torch.float32")
    _bind_fails(c, "q", torch.randn(t_q - 1, h, d), "holds 63 tokens")  # max_total_seq_len_q declared 64
    _bind_fails(c, "q", torch.randn(t_q, d, h).transpose(1, 2), "tokens of another layout")  # (T, H, D) strides off
    _bind_fails(c, "q", torch.randn(t_q, h, 2 * d)[..., :d], "tokens of another layout")
    _bind_fails(c, "q", torch.randn(2 * t_q * h * d)[::2], "contiguous buffer")
    # without max_total_seq_len the tokens a buffer needs are the device offsets' business: the kernels clamp to
    # the tokens it holds, the reference reads the offsets and names the sequence that passes them
    _bind_fails(c, "k", torch.randn(10, h, d), "passes the token envelope 10", max_total=False)


def test_any_buffer_holding_the_tokens_binds_without_a_copy():
    """A flat buffer, or a (T, H, D) slice of a larger allocation: the view handed on is its own memory."""
    from frost.runtime.binding import RaggedSpec, bind_ragged

    c = _ragged_case(seed=3)
    g, ts, offs, lens = _ragged_fwd_graph(c)
    spec = RaggedSpec(tuple(ts["q"].get_dim()), tuple(ts["q"].get_stride()), 64)
    flat = torch.randn(64 * c["h"] * c["d"])
    view = bind_ragged("q", ts["q"], flat, spec, device=flat.device, vector_bytes=16)
    assert view.data_ptr() == flat.data_ptr() and view.shape == (3, 2, 64, 16) and view.stride() == (0, 16, 32, 1)
    part = torch.randn(100, c["h"], c["d"])[20:60]
    view = bind_ragged("q", ts["q"], part, RaggedSpec(spec.dims, spec.strides, 1), device=part.device, vector_bytes=16)
    assert view.data_ptr() == part.data_ptr() and view.shape[2] == 40  # the tokens the slice holds
    # the reference engine reads through such views: a flat q and an offset o slice serve the forward
    g.build_plans()
    pack = _pack(c, ts, offs, lens)
    pack[ts["q"]] = c["bufs"]["q"].reshape(-1).clone()
    g.execute(pack, torch.empty(g.get_workspace_size(), dtype=torch.uint8))
    for start, end, o, _ in _oracle(c):
        torch.testing.assert_close(c["bufs"]["o"][start:end].double(), o, atol=1e-5, rtol=1e-5)


def test_declared_shapes_still_bind_as_before():
    """Binding the declared (B, H, S, D) itself (as_strided views over the packed memory) is unchanged."""
    c = _ragged_case(seed=4, s_q=16, s_kv=16, lens_q=(5, 3, 7), lens_kv=(6, 2, 8))
    g, ts, offs, lens = _ragged_fwd_graph(c)
    g.build_plans()
    pack = _pack(c, ts, offs, lens)
    for r in ("q", "k", "v", "o", "stats"):
        buf = c["bufs"][r]
        dims, strides = ts[r].get_dim(), ts[r].get_stride()
        big = torch.full((max(dims[0] * strides[0], buf.numel()),), float("nan"))
        big[: buf.numel()] = buf.reshape(-1)
        pack[ts[r]] = big.as_strided(dims, strides)
    g.execute(pack, torch.empty(g.get_workspace_size(), dtype=torch.uint8))
    o = pack[ts["o"]]
    for start, end, want, _ in _oracle(c):
        got = o.as_strided((end - start, c["h"], c["d"]), (c["h"] * c["d"], c["d"], 1), start * c["h"] * c["d"])
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_kernels_take_the_tokens_a_packed_buffer_holds_as_their_envelope():
    """Without max_total_seq_len the plan's envelope is B * S (120 query tokens here) but the buffers hold 64:
    the DSL kernels' (T, H, D) views (and their TMA boxes) take T = 64, so no load reaches past the memory."""
    from frost.adapters.dsl import ragged_totals
    from frost.runtime.binding import RAGGED_TOKENS

    c = _ragged_case(seed=5)
    g, ts, offs, lens = _ragged_fwd_graph(c)
    g.build_plans()
    pack = _pack(c, ts, offs, lens)
    pack[ts["v"]] = torch.randn(80, c["h"], c["d"])
    bound = g._binder.bind(pack, torch.empty(0, dtype=torch.uint8))
    assert bound[RAGGED_TOKENS] == {"q": 64, "kv": 64}
    assert (g.facts.total_q, g.facts.total_kv) == (120, 144)
    assert ragged_totals(g.facts, bound) == {"total_q": 64, "total_kv": 64}
    assert bound["v"].shape == (3, 2, 80, 16) and bound["v"].data_ptr() == pack[ts["v"]].data_ptr()
    declared = {r: t for r, t in bound.items() if r != RAGGED_TOKENS}
    assert ragged_totals(g.facts, declared) == {"total_q": 120, "total_kv": 144}


def test_unit_dims_do_not_address_memory():
    """cuDNN binds by pointer: sdpa/fp16.py binds its (B + 1,) prefix sums to (B + 1, 1, 1, 1) offsets and a
    (B,) length tensor where (B, 1, 1, 1) is declared; the same elements at the same addresses bind."""
    c = _ragged_case(seed=6)
    g, ts, offs, lens = _ragged_fwd_graph(c)
    g.build_plans()
    pack = _pack(c, ts, offs, lens)
    pack.update({offs[key]: c["offs"][key].flatten() for key in offs})
    pack[lens["seq_len_q"]] = c["lq"].flatten()
    g.execute(pack, torch.empty(g.get_workspace_size(), dtype=torch.uint8))
    for start, end, o, _ in _oracle(c):
        torch.testing.assert_close(c["bufs"]["o"][start:end].double(), o, atol=1e-5, rtol=1e-5)
    pack[offs["q"]] = torch.stack([c["offs"]["q"].flatten()] * 2, 1)  # (B + 1, 2): other elements
    with pytest.raises(BindingError, match="declared dim"):
        g.execute(pack, torch.empty(g.get_workspace_size(), dtype=torch.uint8))


def test_sm_version_of_this_machine_plans_here():
    """cuDNN programs pass the device's own capability as sm_version; on a machine without a GPU that is 0."""
    g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, sm_version=0)
    assert g.target.is_cpu
    for bad in (5, -1):
        with pytest.raises(GraphError, match="sm_version"):
            cudnn.pygraph(sm_version=bad)
