"""A catalog of wrong declarations and bindings: each raises frost's own error naming what is wrong."""

from __future__ import annotations

import pytest
import torch

import frost
from frost.target import CPU, fake_target
from test.helpers import Case, planned_fwd

B, H, S, D = 2, 4, 8, 16


def graph(io="fp32", target=CPU) -> frost.Graph:
    return frost.Graph(io_data_type=io, target=target)


def qkv(
    g,
    *,
    hq=H,
    hkv=H,
    sq=S,
    skv=S,
    d=D,
    dk=None,
    dv=None,
    b=B,
    bk=None,
    skv_v=None,
    hv=None,
    q_stride=None,
    k_stride=None,
    dtypes=(None, None, None),
):
    q = g.tensor(name="q", dim=(b, hq, sq, d), stride=q_stride, data_type=dtypes[0])
    k = g.tensor(name="k", dim=(bk or b, hkv, skv, dk or d), stride=k_stride, data_type=dtypes[1])
    v = g.tensor(name="v", dim=(bk or b, hv or hkv, skv_v or skv, dv or d), data_type=dtypes[2])
    return q, k, v


def thd(g, *, tq=20, tkv=24, hq=H, hkv=H, d=D, batch=B, cu=True, cu_kv=True, cu_dtype="int32", q_rank=3):
    q = g.tensor(name="q", dim=(tq, hq, d) if q_rank == 3 else (1, tq, hq, d))
    k = g.tensor(name="k", dim=(tkv, hkv, d))
    v = g.tensor(name="v", dim=(tkv, hkv, d))
    kw = {}
    if cu:
        kw["cu_seq_len_q"] = g.tensor(name="cu_q", dim=(batch + 1,), data_type=cu_dtype)
    if cu_kv:
        kw["cu_seq_len_kv"] = g.tensor(name="cu_kv", dim=(batch + 1,), data_type=cu_dtype)
    return q, k, v, kw


def fwd(g, q, k, v, stats=True, mark=True, **kw):
    o, st = g.sdpa(q, k, v, attn_scale=0.25, generate_stats=stats, **kw)
    if mark:
        o.set_output(True)
    if st is not None:
        st.set_output(True)
    return g, o, st


def bwd(g, q, k, v, *, o_dim=None, do_dim=None, stats_dim=None, stats_dtype="fp32", o_dtype=None, **kw):
    o = g.tensor(name="o", dim=o_dim or q.dim, data_type=o_dtype)
    do = g.tensor(name="dO", dim=do_dim or q.dim)
    stats = g.tensor(name="stats", dim=stats_dim or (q.dim[:-1] + (1,)), data_type=stats_dtype)
    grads = g.sdpa_backward(q, k, v, o, do, stats, attn_scale=0.25, **kw)
    for t in grads:
        t.set_output(True)
    return g


def validate(g_o_st):
    g = g_o_st[0] if isinstance(g_o_st, tuple) else g_o_st
    g.validate()


def thd_fwd(**kw):
    g = graph()
    q, k, v, cu = thd(
        g, **{a: kw.pop(a) for a in list(kw) if a in ("tq", "tkv", "cu", "cu_kv", "cu_dtype", "q_rank", "batch")}
    )
    return validate(fwd(g, q, k, v, **{**cu, **kw}))


def dense_fwd(qkv_kw=None, **kw):
    g = graph()
    return validate(fwd(g, *qkv(g, **(qkv_kw or {})), **kw))


def with_tensor(make, **kw):
    """dense_fwd with sdpa keywords whose values are tensors made on the same graph."""
    g = graph()
    q, k, v = qkv(g)
    extra = {name: f(g) if callable(f) else f for name, f in make.items()}
    return validate(fwd(g, q, k, v, **extra, **kw))


def stats_tweak(tweak):
    g = graph()
    g, o, st = fwd(g, *qkv(g))
    tweak(st)
    g.validate()


def o_tweak(tweak):
    g = graph()
    g, o, st = fwd(g, *qkv(g))
    tweak(o)
    g.validate()


def two_nodes():
    g = graph()
    q, k, v = qkv(g)
    fwd(g, q, k, v)
    g.sdpa(q, k, v)


def foreign_tensor():
    g1, g2 = graph(), graph()
    q, _, _ = qkv(g1)
    _, k, v = qkv(g2)
    g2.sdpa(q, k, v)


def foreign_sink():
    g1, g2 = graph(), graph()
    sink = g1.tensor(name="sink", dim=(H,), data_type="fp32")
    q, k, v = qkv(g2)
    g2.sdpa(q, k, v, sink_token=sink)


def lengths(dtype="int32", n=B, name="seq_lens"):
    return lambda g: g.tensor(name=name, dim=(n, 1, 1, 1), data_type=dtype)


def dsink_without_sink():
    g = graph()
    q, k, v = qkv(g)
    bwd(g, q, k, v, dSink_token=g.tensor(name="dSink", dim=(H,), data_type="fp32")).validate()


def dsink_wrong_shape():
    g = graph()
    q, k, v = qkv(g)
    bwd(
        g,
        q,
        k,
        v,
        sink_token=g.tensor(name="sink", dim=(H,), data_type="fp32"),
        dSink_token=g.tensor(name="dSink", dim=(1, H, 1, 1), data_type="fp32"),
    ).validate()


def no_node():
    g = graph()
    qkv(g)
    g.validate()


def undeclared():
    g = graph()
    q = g.tensor(name="q")
    k, v = (g.tensor(name=n, dim=(B, H, S, D)) for n in ("k", "v"))
    g.sdpa(q, k, v)


def _dense_rank3():
    g = graph()
    q, k, v, _ = thd(g)
    validate(fwd(g, q, k, v))


def _rank2():
    g = graph()
    _, k, v = qkv(g)
    q = g.tensor(name="q2", dim=(S, D))
    validate(fwd(g, q, k, v))


def _bwd(**kw):
    g = graph()
    bwd(g, *qkv(g), **kw).validate()


def _bwd_qkv(qkv_kw):
    g = graph()
    bwd(g, *qkv(g, **qkv_kw)).validate()


def _bwd_missing_stats():
    g = graph()
    q, k, v = qkv(g)
    g.sdpa_backward(q, k, v, g.tensor(name="o", dim=q.dim), g.tensor(name="dO", dim=q.dim), None)


def _unmarked():
    g = graph()
    validate(fwd(g, *qkv(g), mark=False))


def _scale(value):
    g = graph()
    q, k, v = qkv(g)
    o, _ = g.sdpa(q, k, v, attn_scale=value)
    o.set_output(True)
    g.validate()


def _row_out(name, dim, dtype="fp32"):
    """A score_max / score_sum_exp declaration on the graph `with_tensor` makes."""
    return lambda g: g.tensor(name=name, dim=dim, data_type=dtype)


def _bwd_score_max():
    g = graph()
    q, k, v = qkv(g)
    return bwd(g, q, k, v, score_max=g.tensor(name="m", dim=(B, H, S, 1), data_type="fp32")).validate()


def _planless():
    g = graph()
    fwd(g, *qkv(g))
    return g.validate()


CATALOG = [
    # geometry
    ("head-dims-differ", lambda: dense_fwd(dict(dk=32)), ["tensor 'k'", "head dim 32", "q's head dim 16"]),
    (
        "gqa-heads-do-not-divide",
        lambda: dense_fwd(dict(hq=4, hkv=3, hv=4)),
        ["tensor 'k'", "3 heads do not divide", "q's 4", "multiple of H_k"],
    ),
    (
        "v-heads-do-not-divide",
        lambda: dense_fwd(dict(hq=6, hkv=6, hv=4)),
        ["tensor 'v'", "4 heads do not divide", "q's 6", "multiple of H_v"],
    ),
    ("no-query-heads", lambda: dense_fwd(dict(hq=0, hkv=2)), ["tensor 'q'", "at least one head, got 0"]),
    ("v-heads-above-q", lambda: dense_fwd(dict(hv=8)), ["tensor 'v'", "8 heads do not divide", "q's 4"]),
    ("bwd-v-heads-do-not-divide", lambda: _bwd_qkv(dict(hv=3)), ["tensor 'v'", "3 heads do not divide"]),
    (
        "score-max-wrong-dims",
        lambda: with_tensor({"score_max": _row_out("score_max", (B, H, S))}),
        ["tensor 'score_max'", "expected dim (2, 4, 8, 1)", "got (2, 4, 8)"],
    ),
    (
        "score-sum-exp-wrong-dtype",
        lambda: with_tensor({"score_sum_exp": _row_out("score_sum_exp", (B, H, S, 1), "bf16")}),
        ["tensor 'score_sum_exp'", "data_type must be fp32, got bf16"],
    ),
    (
        "score-max-wrong-heads",
        lambda: with_tensor({"score_max": _row_out("score_max", (B, 1, S, 1))}),
        ["tensor 'score_max'", "expected dim (2, 4, 8, 1)", "got (2, 1, 8, 1)"],
    ),
    ("score-max-on-the-backward", _bwd_score_max, ["score_max is an output of the forward"]),
    ("v-seq-differs-from-k", lambda: dense_fwd(dict(skv_v=7)), ["tensor 'v'", "sequence length 7", "k's 8"]),
    ("batch-differs", lambda: dense_fwd(dict(bk=3)), ["batch sizes differ: q 2, k 3, v 3"]),
    ("dense-rank-3", _dense_rank3, ["tensor 'q'", "expected dim (B, H, S, D), got (20, 4, 16)", "cu_seq_len_q"]),
    ("rank-2-q", _rank2, ["tensor 'q2'", "(8, 16)"]),
    ("undeclared-dims", undeclared, ["tensor 'q'", "dim and stride must be declared"]),
    ("dim-stride-ranks", lambda: dense_fwd(dict(q_stride=(1, 2, 3))), ["tensor 'q'", "different ranks"]),
    # strides
    (
        "overlapping-strides",
        lambda: dense_fwd(dict(q_stride=(512, 128, 8, 1))),
        ["tensor 'q'", "strides (512, 128, 8, 1)", "overlap"],
    ),
    ("zero-stride", lambda: dense_fwd(dict(k_stride=(512, 128, 0, 1))), ["tensor 'k'", "overlap"]),
    (
        "negative-stride",
        lambda: dense_fwd(dict(q_stride=(512, 128, -16, 1))),
        ["tensor 'q'", "negative stride", "(512, 128, -16, 1)"],
    ),
    (
        "non-unit-head-dim-stride",
        lambda: dense_fwd(dict(q_stride=(H * S * D, S * D, 1, S))),
        ["tensor 'q'", "head dimension must have unit stride", "(512, 128, 1, 8)"],
    ),
    (
        "o-non-unit-head-dim-stride",
        lambda: o_tweak(lambda o: o.set_stride((H * S * D, S * D, 1, S))),
        ["sdpa::O", "unit stride"],
    ),
    # dtypes
    (
        "dtype-mismatch-q-k",
        lambda: dense_fwd(dict(dtypes=(None, "fp16", None))),
        ["q, k and v must share one data type", "q=fp32", "k=fp16"],
    ),
    ("unknown-dtype", lambda: graph().tensor(name="q", dim=(1,), data_type="int7"), ["unknown data type 'int7'"]),
    ("unknown-graph-dtype", lambda: frost.Graph(io_data_type="fp8"), ["unknown data type 'fp8'"]),
    (
        "o-dtype-differs-from-q",
        lambda: o_tweak(lambda o: o.set_data_type("fp16")),
        ["sdpa::O' (o)", "data_type must be q's fp32, got fp16"],
    ),
    ("bwd-o-dtype-differs-from-q", lambda: _bwd(o_dtype="bf16"), ["tensor 'o'", "must be q's fp32, got bf16"]),
    (
        "dim-not-ints",
        lambda: graph().tensor(name="q", dim=(2, 4.5, 8, 16)),
        ["tensor 'q'", "dim must be a sequence of ints", "4.5"],
    ),
    (
        "stride-not-ints",
        lambda: graph().tensor(name="q", dim=(2, 4)).set_stride(("4", 1)),
        ["tensor 'q'", "stride must be a sequence of ints", "('4', 1)"],
    ),
    (
        "int-io",
        lambda: dense_fwd(dict(dtypes=("int32", "int32", "int32"))),
        ["tensor 'q'", "data_type must be fp16, bf16, fp32, got int32"],
    ),
    # Stats and O
    (
        "stats-wrong-shape",
        lambda: stats_tweak(lambda s: s.set_dim((B, H, S, 2)).set_stride((H * S * 2, S * 2, 2, 1))),
        ["sdpa::Stats' (stats)", "expected dim (2, 4, 8, 1)", "got (2, 4, 8, 2)"],
    ),
    (
        "stats-wrong-rank",
        lambda: stats_tweak(lambda s: s.set_dim((B, H, S)).set_stride((H * S, S, 1))),
        ["sdpa::Stats' (stats)", "expected dim (2, 4, 8, 1)", "got (2, 4, 8)"],
    ),
    (
        "stats-wrong-dtype",
        lambda: stats_tweak(lambda s: s.set_data_type("bf16")),
        ["(stats)", "data_type must be fp32, got bf16"],
    ),
    (
        "bwd-stats-wrong-shape",
        lambda: _bwd(stats_dim=(B, H, S)),
        ["tensor 'stats'", "expected dim (2, 4, 8, 1)", "got (2, 4, 8)"],
    ),
    ("bwd-stats-wrong-dtype", lambda: _bwd(stats_dtype="bf16"), ["tensor 'stats'", "must be fp32, got bf16"]),
    (
        "bwd-dO-shape",
        lambda: _bwd(do_dim=(B, H, S + 1, D)),
        ["tensor 'dO'", "expected dim (2, 4, 8, 16)", "got (2, 4, 9, 16)"],
    ),
    (
        "o-wrong-head-dim",
        lambda: o_tweak(lambda o: o.set_dim((B, H, S, 8)).set_stride((H * S * 8, S * 8, 8, 1))),
        ["sdpa::O' (o)", "expected dim (2, 4, 8, 16)", "got (2, 4, 8, 8)"],
    ),
    ("output-not-marked", _unmarked, ["sdpa::O' (o)", "not marked", "set_output(True)"]),
    # THD
    (
        "thd-without-lengths",
        lambda: thd_fwd(cu=False, cu_kv=False),
        ["tensor 'q'", "expected dim (B, H, S, D), got (20, 4, 16)", "cu_seq_len_q/cu_seq_len_kv"],
    ),
    (
        "thd-one-length-tensor",
        lambda: thd_fwd(cu_kv=False, max_seq_len_q=4, max_seq_len_kv=4),
        ["needs both cu_seq_len_q and cu_seq_len_kv"],
    ),
    ("thd-without-envelopes", lambda: thd_fwd(), ["max_seq_len_q", "max_seq_len_kv", "envelopes"]),
    (
        "thd-envelope-exceeds-total",
        lambda: thd_fwd(max_seq_len_q=21, max_seq_len_kv=4),
        ["max_seq_len_q=21", "exceed the declared packed totals q=20"],
    ),
    ("thd-envelope-zero", lambda: thd_fwd(max_seq_len_q=0, max_seq_len_kv=4), ["must be >= 1"]),
    (
        "thd-lengths-int64",
        lambda: thd_fwd(cu_dtype="int64", max_seq_len_q=4, max_seq_len_kv=4),
        ["tensor 'cu_q' (cu_seq_len_q)", "data_type must be int32, got int64"],
    ),
    (
        "thd-no-batch",
        lambda: thd_fwd(batch=0, max_seq_len_q=4, max_seq_len_kv=4),
        ["tensor 'cu_q' (cu_seq_len_q)", "expected dim (B+1,) with B >= 1, got (1,)"],
    ),
    (
        "thd-rank-4-q",
        lambda: thd_fwd(q_rank=4, max_seq_len_q=4, max_seq_len_kv=4),
        ["tensor 'q'", "(tokens, heads, dim)", "(1, 20, 4, 16)"],
    ),
    (
        "thd-with-padding-mask",
        lambda: thd_fwd(max_seq_len_q=4, max_seq_len_kv=4, use_padding_mask=True),
        ["padding masks (seq_len_q/kv) do not apply"],
    ),
    (
        "envelopes-on-dense",
        lambda: dense_fwd(max_seq_len_q=8, max_seq_len_kv=8),
        ["envelopes for packed THD graphs", "dense graph"],
    ),
    # lengths / padding
    (
        "padding-without-lengths",
        lambda: dense_fwd(use_padding_mask=True),
        ["use_padding_mask=True needs seq_len_q and seq_len_kv"],
    ),
    (
        "lengths-without-padding",
        lambda: with_tensor({"seq_len_q": lengths(), "seq_len_kv": lengths(name="seq_lens_kv")}),
        ["use_padding_mask=True needs seq_len_q and seq_len_kv"],
    ),
    (
        "padding-lengths-int64",
        lambda: with_tensor(
            {"seq_len_q": lengths("int64"), "seq_len_kv": lengths(name="seq_lens_kv")}, use_padding_mask=True
        ),
        ["tensor 'seq_lens' (seq_len_q)", "data_type must be int32, got int64"],
    ),
    (
        "padding-lengths-wrong-batch",
        lambda: with_tensor(
            {"seq_len_q": lengths(n=3), "seq_len_kv": lengths(name="seq_lens_kv")}, use_padding_mask=True
        ),
        ["(seq_len_q)", "expected dim (2,) or (2, 1, 1, 1)", "got (3, 1, 1, 1)"],
    ),
    (
        "torch-tensor-as-length",
        lambda: with_tensor({"seq_len_q": torch.ones(2, dtype=torch.int32)}, use_padding_mask=True),
        ["seq_len_q", "expected a frost tensor", "got Tensor"],
    ),
    # masks
    (
        "causal-and-right-bound",
        lambda: dense_fwd(use_causal_mask=True, diagonal_band_right_bound=2),
        ["a causal mask and diagonal_band_right_bound=2 contradict each other"],
    ),
    (
        "both-causal-flags",
        lambda: dense_fwd(use_causal_mask=True, use_causal_mask_bottom_right=True),
        ["use_causal_mask and use_causal_mask_bottom_right are exclusive"],
    ),
    (
        "causal-top-left-with-br-alignment",
        lambda: dense_fwd(use_causal_mask=True, diagonal_alignment="BOTTOM_RIGHT"),
        ["use_causal_mask is top-left", "use_causal_mask_bottom_right"],
    ),
    (
        "bad-diagonal-alignment",
        lambda: dense_fwd(diagonal_alignment="CENTER"),
        ["diagonal_alignment must be one of ['TOP_LEFT', 'BOTTOM_RIGHT']", "got 'CENTER'"],
    ),
    ("sliding-window-zero", lambda: dense_fwd(sliding_window_length=0), ["sliding_window_length must be >= 1, got 0"]),
    ("left-bound-negative", lambda: dense_fwd(diagonal_band_left_bound=-3), ["must be >= 1, got -3"]),
    (
        "left-bound-and-window-disagree",
        lambda: dense_fwd(diagonal_band_left_bound=3, sliding_window_length=4),
        ["diagonal_band_left_bound=3 and sliding_window_length=4 disagree"],
    ),
    (
        "right-bound-negative",
        lambda: dense_fwd(diagonal_band_right_bound=-1),
        ["diagonal_band_right_bound must be >= 0, got -1"],
    ),
    ("attn-scale-nan", lambda: _scale(float("nan")), ["attn_scale must be finite, got nan"]),
    ("attn-scale-string", lambda: _scale("0.5"), ["attn_scale", "'0.5'"]),
    ("window-as-float", lambda: dense_fwd(sliding_window_length=2.5), ["sliding_window_length", "2.5"]),
    # sinks
    (
        "sink-wrong-shape",
        lambda: with_tensor({"sink_token": lambda g: g.tensor(name="sink", dim=(3,), data_type="fp32")}),
        ["tensor 'sink' (sink_token)", "expected dim (1, 4, 1, 1) or (4,)", "got (3,)"],
    ),
    (
        "sink-wrong-dtype",
        lambda: with_tensor({"sink_token": lambda g: g.tensor(name="sink", dim=(H,), data_type="bf16")}),
        ["tensor 'sink' (sink_token)", "data_type must be fp32, got bf16"],
    ),
    ("dsink-without-sink", dsink_without_sink, ["tensor 'dSink' (dSink_token)", "needs sink_token"]),
    ("dsink-wrong-shape", dsink_wrong_shape, ["tensor 'dSink' (dSink_token)", "expected dim (4,)", "got (1, 4, 1, 1)"]),
    # graph structure
    ("unknown-keyword", lambda: dense_fwd(use_causal=True), ["unknown keyword(s) ['use_causal']"]),
    ("second-node", two_nodes, ["already holds sdpa_fwd 'sdpa'", "one SDPA node per graph"]),
    ("tensor-from-another-graph", foreign_tensor, ["q: tensor 'q' belongs to another graph"]),
    ("sink-from-another-graph", foreign_sink, ["sink_token: tensor 'sink' belongs to another graph"]),
    ("no-node", no_node, ["has no SDPA node"]),
    ("bwd-missing-stats", _bwd_missing_stats, ["stats is required"]),
    ("workspace-before-plan", lambda: _planless().get_workspace_size(), ["has no plan", "build_plans()"]),
    ("execute-before-plan", lambda: _planless().execute({}), ["has no plan"]),
    ("unknown-engine", lambda: _planless().build_plans(engine="sm70"), ["unknown engine 'sm70'", "known:"]),
]


def test_catalog_is_large_and_distinct():
    names = [c[0] for c in CATALOG]
    assert len(names) == len(set(names)) and len(names) >= 25


@pytest.mark.parametrize("name, build, fragments", CATALOG, ids=[c[0] for c in CATALOG])
def test_bad_declaration(name, build, fragments):
    with pytest.raises(frost.GraphError) as ei:
        build()
    msg = str(ei.value)
    for fragment in fragments:
        assert fragment in msg, f"{name}: {fragment!r} not in {msg!r}"


def test_graph_errors_are_value_errors():
    assert issubclass(frost.GraphError, ValueError) and issubclass(frost.BindingError, ValueError)


# --- binding errors at execute --------------------------------------------------------------------------------


def _planned(case=Case(batch=2, hq=4, hkv=2, sq=6, skv=7, d=8), target=CPU, engine=None):
    g, pack, _, _ = planned_fwd(case, target=target, engine=engine)
    handles = {h.name: h for h in pack}
    return g, pack, handles


def _replace(pack, handles, name, value):
    out = dict(pack)
    if value is None:
        del out[handles[name]]
    else:
        out[handles[name]] = value
    return out


def test_valid_pack_executes_and_keys_may_be_handles_uids_or_names():
    g, pack, handles = _planned()
    g.execute(pack)
    by_uid = {h.uid: t for h, t in pack.items()}
    g.execute(by_uid)
    by_name = {h.name: t for h, t in pack.items()}
    g.execute(by_name)


BINDINGS = [
    ("wrong-dtype", "q", lambda t: t.double(), ["tensor 'q'", "declared torch.float32, bound torch.float64"]),
    ("wrong-shape", "k", lambda t: t[:, :, :-1], ["tensor 'k'", "declared dim (2, 2, 7, 8), bound (2, 2, 6, 8)"]),
    (
        "wrong-strides",
        "v",
        lambda t: t.transpose(1, 2).contiguous().transpose(1, 2),
        ["tensor 'v'", "declared strides (112, 56, 8, 1), bound (112, 8, 16, 1)", "never copies"],
    ),
    (
        "wrong-output-strides",
        "sdpa::O",
        lambda t: torch.empty(2, 6, 4, 8).permute(0, 2, 1, 3),
        ["tensor 'sdpa::O' (o)", "declared strides (192, 48, 8, 1)"],
    ),
    ("missing", "v", lambda t: None, ["tensor 'v' is missing from the variant pack", "uid"]),
    ("missing-stats", "sdpa::Stats", lambda t: None, ["tensor 'sdpa::Stats' (stats) is missing"]),
    ("not-a-tensor", "q", lambda t: t.numpy(), ["tensor 'q'", "expected a torch.Tensor, got ndarray"]),
    (
        "wrong-device",
        "k",
        lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta"),
        ["tensor 'k'", "on meta, expected cpu"],
    ),
]


@pytest.mark.parametrize("name, role, change, fragments", BINDINGS, ids=[b[0] for b in BINDINGS])
def test_binding_errors(name, role, change, fragments):
    g, pack, handles = _planned()
    bad = _replace(pack, handles, role, change(pack[handles[role]]))
    with pytest.raises(frost.BindingError) as ei:
        g.execute(bad)
    for fragment in fragments:
        assert fragment in str(ei.value), (fragment, str(ei.value))


def test_gpu_plan_with_cpu_tensors_is_a_binding_error():
    g, pack, _ = _planned(Case(batch=1, hq=2, hkv=2, sq=4, skv=4, d=8), target=fake_target("H200"), engine="reference")
    with pytest.raises(frost.BindingError, match="runs on the GPU; tensors are on cpu"):
        g.execute(pack)


THD = Case(thd=True, batch=2, hq=2, hkv=1, d=8, lens_q=(3, 4), lens_kv=(5, 2))


def test_thd_totals_must_agree():
    g, pack, handles = _planned(THD)
    q = pack[handles["q"]]
    bad = _replace(pack, handles, "q", q[:-1])  # O keeps 7 tokens, q has 6
    with pytest.raises(frost.BindingError, match=r"packed token counts disagree: \{'q': 6, 'o': 7, 'stats': 7\}"):
        g.execute(bad)
    k = pack[handles["k"]]
    bad = _replace(pack, handles, "k", k[:-2])
    with pytest.raises(frost.BindingError, match="packed token counts disagree"):
        g.execute(bad)


def test_thd_stats_total_must_agree():
    g, pack, handles = _planned(THD)
    stats = pack[handles["sdpa::Stats"]]
    bad = _replace(pack, handles, "sdpa::Stats", stats[:-1])
    with pytest.raises(frost.BindingError, match="packed token counts disagree"):
        g.execute(bad)


def test_thd_more_tokens_than_declared():
    g, pack, handles = _planned(THD)
    q = pack[handles["q"]]
    bigger = torch.cat([q, q[:1]])
    with pytest.raises(frost.BindingError, match=r"packed tokens up to 7\), bound \(8, 2, 8\)"):
        g.execute(_replace(pack, handles, "q", bigger))


def test_thd_lengths_dtype_at_execute():
    g, pack, handles = _planned(THD)
    cu = pack[handles["cu_seq_len_q"]]
    with pytest.raises(frost.BindingError, match="cu_seq_len_q"):
        g.execute(_replace(pack, handles, "cu_seq_len_q", cu.long()))


def test_backward_gradients_must_be_marked_as_outputs():
    g = frost.Graph(io_data_type=torch.float32)
    q, k, v, o, do = (g.tensor(name=n, dim=(1, 2, 4, 8)) for n in ("q", "k", "v", "o", "dO"))
    stats = g.tensor(name="stats", dim=(1, 2, 4, 1), data_type="fp32")
    dq, dk, dv = g.sdpa_backward(q, k, v, o, do, stats)
    dq.set_output(True)
    dv.set_output(True)
    with pytest.raises(frost.GraphError, match=r"tensor 'sdpa_backward::dK' \(dK\): the output is not marked"):
        g.validate()
