"""The cuDNN frontend's vocabulary on frost graphs: declarations, off values, refusals, and the ragged-offset form.

cuDNN's ragged form declares (B, H, S, D) tensors whose batches start at element offsets; frost lowers it to the
facts of its own packed form (tokens, heads, dim) with cu_seq_len_q/kv, which these tests compare field by field.
"""

from __future__ import annotations

import pytest
import torch

import frost
from frost.errors import GraphError, NotSupportedError
from frost.target import fake_target

B, H, HKV, SQ, SKV, D = 3, 4, 2, 16, 24, 64
BF16 = frost.DataType.BFLOAT16


def _ragged(g, direction="fwd", *, stats_ragged=True, total_q=None, total_kv=None, **kw):
    """cuDNN's ragged form of a packed graph, declared as cuDNN's tests do (bshd strides over packed tokens)."""
    sq, skv = (B, H, SQ, D), (B, HKV, SKV, D)
    st_q, st_kv = (SQ * H * D, D, H * D, 1), (SKV * HKV * D, D, HKV * D, 1)
    off_q = g.tensor((B + 1, 1, 1, 1), (1, 1, 1, 1), frost.data_type.INT64, name="off_q")
    off_kv = g.tensor((B + 1, 1, 1, 1), (1, 1, 1, 1), frost.data_type.INT32, name="off_kv")
    off_st = g.tensor((B + 1, 1, 1, 1), (1, 1, 1, 1), frost.data_type.INT32, name="off_stats")
    lq = g.tensor((B, 1, 1, 1), (1, 1, 1, 1), frost.data_type.INT32, name="lq")
    lk = g.tensor((B, 1, 1, 1), (1, 1, 1, 1), frost.data_type.INT32, name="lk")
    q = g.tensor(sq, st_q, BF16, name="q", ragged_offset=off_q)
    k = g.tensor(skv, st_kv, BF16, name="k").set_ragged_offset(off_kv)
    v = g.tensor(skv, st_kv, BF16, name="v").set_ragged_offset(off_kv)
    env = {"max_total_seq_len_q": total_q, "max_total_seq_len_kv": total_kv}
    common = dict(attn_scale=0.125, use_causal_mask=True, use_padding_mask=True, seq_len_q=lq, seq_len_kv=lk)
    st_stats = (SQ * H, 1, H, 1)
    if direction == "fwd":
        o, stats = g.sdpa(q, k, v, generate_stats=True, name="sdpa", **common, **env, **kw)
        o.set_output(True).set_stride(st_q).set_ragged_offset(off_q)
        stats.set_output(True).set_stride(st_stats)
        if stats_ragged:
            stats.set_ragged_offset(off_st)
        return g
    o = g.tensor(sq, st_q, BF16, name="o", ragged_offset=off_q)
    do = g.tensor(sq, st_q, BF16, name="dO", ragged_offset=off_q)
    stats = g.tensor((B, H, SQ, 1), st_stats, frost.DataType.FLOAT, name="stats")
    if stats_ragged:
        stats.set_ragged_offset(off_st)
    grads = g.sdpa_backward(q, k, v, o, do, stats, name="sdpa_backward", **common, **env, **kw)
    for grad, src in zip(grads, (q, k, v)):
        grad.set_output(True).set_stride(src.stride).set_ragged_offset(src.ragged_offset)
    return g


def _packed(g, direction="fwd", total_q=None, total_kv=None):
    """The same graph in frost's packed form."""
    tq, tkv = total_q or B * SQ, total_kv or B * SKV
    cq = g.tensor(name="cu_q", dim=(B + 1,), data_type="int32")
    ck = g.tensor(name="cu_kv", dim=(B + 1,), data_type="int32")
    q = g.tensor(name="q", dim=(tq, H, D), data_type=BF16)
    k = g.tensor(name="k", dim=(tkv, HKV, D), data_type=BF16)
    v = g.tensor(name="v", dim=(tkv, HKV, D), data_type=BF16)
    common = dict(
        attn_scale=0.125,
        use_causal_mask=True,
        cu_seq_len_q=cq,
        cu_seq_len_kv=ck,
        max_seq_len_q=min(SQ, tq),
        max_seq_len_kv=min(SKV, tkv),
    )
    if direction == "fwd":
        o, stats = g.sdpa(q, k, v, generate_stats=True, name="sdpa", **common)
        o.set_output(True)
        stats.set_output(True)
        return g
    o = g.tensor(name="o", dim=(tq, H, D), data_type=BF16)
    do = g.tensor(name="dO", dim=(tq, H, D), data_type=BF16)
    stats = g.tensor(name="stats", dim=(tq, H, 1), data_type="fp32")
    for grad in g.sdpa_backward(q, k, v, o, do, stats, name="sdpa_backward", **common):
        grad.set_output(True)
    return g


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("totals", [(None, None), (40, 50)])
def test_ragged_form_lowers_to_the_packed_facts(direction, totals):
    tq, tkv = totals
    ragged = _ragged(frost.Graph(), direction, total_q=tq, total_kv=tkv).validate().facts
    packed = _packed(frost.Graph(), direction, tq, tkv).validate().facts
    assert ragged.ragged is not None and packed.ragged is None
    assert ragged.model_dump(exclude={"ragged"}) == packed.model_dump(exclude={"ragged"})
    strides = dict(ragged.ragged.token_strides)
    assert strides["q"] == H * D and strides["k"] == HKV * D and strides["stats"] == H
    assert dict(ragged.ragged.offset_dtypes)["q"] == "int64" and dict(ragged.ragged.offset_dtypes)["k"] == "int32"
    assert not ragged.ragged.stats_per_batch
    # what a saved plan compares: equal for the same declarations in another graph (no tensor identities)
    assert _ragged(frost.Graph(), direction, total_q=tq, total_kv=tkv).validate().facts == ragged
    shared = {roles[0]: set(roles) for roles in ragged.ragged.shared_offsets}
    if direction == "fwd":
        assert shared == {"q": {"q", "o"}, "k": {"k", "v"}, "stats": {"stats"}}
    else:
        assert shared == {"q": {"q", "o", "dO", "dQ"}, "k": {"k", "v", "dK", "dV"}, "stats": {"stats"}}


def test_ragged_stats_per_batch_is_a_fact():
    facts = _ragged(frost.Graph(), stats_ragged=False).validate().facts
    assert facts.ragged.stats_per_batch and facts.tensor("stats").dim == (B, H, SQ, 1)
    assert {"ragged_offsets", "stats_per_batch"} <= facts.features()


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("target", ["H200", "A100", "RTX5090"])
def test_dsl_engines_serve_the_ragged_form(direction, target):
    g = _ragged(frost.Graph(target=fake_target(target)), direction)
    engines = g.available_engines()
    assert engines and all("Dsl" in name for name in engines)
    g.check_support()


# every cuDNN keyword at its off value leaves the graph as it was --------------------------------------------------
FWD_OFF = dict(
    bias=None,
    block_mask=None,
    use_alibi_mask=False,
    use_padding_mask=False,
    seq_len_q=None,
    seq_len_kv=None,
    use_causal_mask=False,
    use_causal_mask_bottom_right=False,
    sliding_window_length=None,
    diagonal_alignment="TOP_LEFT",
    diagonal_band_left_bound=None,
    diagonal_band_right_bound=None,
    dropout=None,
    rng_dump=None,
    paged_attention_k_table=None,
    paged_attention_v_table=None,
    paged_attention_max_seq_len_kv=None,
    compute_data_type=frost.data_type.FLOAT,
    name="",
    score_mod=None,
    generate_stats=None,
    implementation=frost.attention_implementation.AUTO,
    score_max=None,
    score_sum_exp=None,
    sink_token=None,
    unfuse_fma=False,
    is_inference=None,
)
BWD_OFF = dict(
    bias=None,
    dBias=None,
    use_alibi_mask=False,
    use_padding_mask=False,
    seq_len_q=None,
    seq_len_kv=None,
    max_total_seq_len_q=None,
    max_total_seq_len_kv=None,
    use_causal_mask=False,
    use_causal_mask_bottom_right=False,
    sliding_window_length=None,
    diagonal_alignment=frost.diagonal_alignment.TOP_LEFT,
    diagonal_band_left_bound=None,
    diagonal_band_right_bound=None,
    dropout=None,
    rng_dump=None,
    use_deterministic_algorithm=False,
    compute_data_type=frost.data_type.NOT_SET,
    name="",
    score_mod=None,
    score_mod_bprop=None,
    sink_token=None,
    dSink_token=None,
)


def _dense(direction, **kw):
    g = frost.pygraph(io_data_type=frost.data_type.HALF)
    dims, strides = (2, 4, 32, 64), (8192, 64, 256, 1)
    q, k, v = (g.tensor(dims, strides) for _ in range(3))
    if direction == "fwd":
        o, _ = g.sdpa(q, k, v, **kw)
        o.set_output(True)
    else:
        o, do = g.tensor(dims, strides), g.tensor(dims, strides)
        st = g.tensor((2, 4, 32, 1), (128, 32, 1, 1), frost.data_type.FLOAT)
        for t in g.sdpa_backward(q, k, v, o, do, st, **kw):
            t.set_output(True)
    return g


@pytest.mark.parametrize("direction, key", [("fwd", k) for k in FWD_OFF] + [("bwd", k) for k in BWD_OFF])
def test_every_keyword_at_its_off_value_changes_nothing(direction, key):
    off = (FWD_OFF if direction == "fwd" else BWD_OFF)[key]
    assert _dense(direction, **{key: off}).validate().facts == _dense(direction).validate().facts


def test_all_off_values_at_once_on_the_reference():
    for direction, off in (("fwd", FWD_OFF), ("bwd", BWD_OFF)):
        g = _dense(direction, **off)
        g.build_plans()
        assert g.engine_name.endswith("Reference")


# a feature frost lacks, declared: every engine declines naming it -------------------------------------------------
def _side(g, dim=(2, 4, 32, 64), dtype=frost.data_type.INT32):
    return g.tensor(dim, None, dtype)


DECLINED = {
    "compute_data_type": (lambda g: {"compute_data_type": frost.data_type.HALF}, "computes in fp32"),
    "unfuse_fma": (lambda g: {"unfuse_fma": True}, "unfuse_fma"),
    "score_mod": (lambda g: {"score_mod": lambda *a: None}, "score_mod"),
}


@pytest.mark.parametrize("key", sorted(DECLINED))
def test_a_lacking_features_non_off_value_is_declined_with_its_reason(key):
    make, fragment = DECLINED[key]
    for target in (None, fake_target("H200")):
        g = frost.pygraph(io_data_type=frost.data_type.HALF, target=target)
        dims, strides = (2, 4, 32, 64), (8192, 64, 256, 1)
        q, k, v = (g.tensor(dims, strides) for _ in range(3))
        o, _ = g.sdpa(q, k, v, **make(g))
        o.set_output(True)
        g.build_operation_graph()
        with pytest.raises(NotSupportedError) as ei:
            g.build_plans()
        assert fragment in str(ei.value)


def test_score_max_and_sum_exp_as_cudnn_declares_them():
    """cuDNN's program: K and V with their own head counts, score_max / score_sum_exp declared as fp32 graph
    tensors marked as outputs; the two halves of Stats (max + log(sum) = LSE) match the float64 oracle."""
    from test import oracle

    g = frost.pygraph(io_data_type=frost.data_type.FLOAT)
    b, hq, hk, hv, s, d = 2, 6, 6, 1, 16, 32
    q = g.tensor((b, hq, s, d), (hq * s * d, s * d, d, 1))
    k = g.tensor((b, hk, s, d), (hk * s * d, s * d, d, 1))
    v = g.tensor((b, hv, s, d), (hv * s * d, s * d, d, 1))
    mx, se = (g.tensor((b, hq, s, 1), (hq * s, s, 1, 1), frost.data_type.FLOAT) for _ in range(2))
    mx.set_output(True)
    se.set_output(True)
    o, stats = g.sdpa(
        q, k, v, generate_stats=True, attn_scale=0.125, diagonal_band_right_bound=0, score_max=mx, score_sum_exp=se
    )
    o.set_output(True)
    stats.set_output(True).set_data_type(frost.data_type.FLOAT)
    g.validate()
    g.build_plans()
    qt, kt, vt = (torch.randn(t.dim, dtype=torch.float32) for t in (q, k, v))
    out = {t: torch.full(t.dim, float("nan")) for t in (o, stats, mx, se)}
    g.execute({q: qt, k: kt, v: vt, **out}, torch.empty(g.get_workspace_size(), dtype=torch.uint8))
    ref_o, ref_lse, ref_max, ref_sum = oracle.attention(qt, kt, vt, scale=0.125, causal=True, row_stats=True)
    torch.testing.assert_close(out[o].double(), ref_o, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[mx][..., 0].double(), ref_max, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[se][..., 0].double(), ref_sum, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[stats][..., 0].double(), ref_lse, atol=1e-5, rtol=1e-5)


REFUSED = [
    ("positional name first", lambda g: g.tensor("q", (1, 2, 3, 4), (24, 12, 4, 1)), "positional order is cuDNN's"),
    ("strides as a name", lambda g: g.tensor((1, 2, 3, 4), "q"), "stride must be a sequence of ints"),
    ("dtype slot", lambda g: g.tensor((1, 2, 3, 4), (24, 12, 4, 1), "q"), "unknown data type"),
    ("float dims", lambda g: g.tensor((1.0, 2, 3, 4)), "dim must be a sequence of ints"),
    ("name type", lambda g: g.tensor((1, 2), name=3), "name must be a string"),
    ("uid type", lambda g: g.tensor((1, 2), uid="3"), "uid must be an int"),
    ("uid taken", lambda g: (g.tensor((1, 2), uid=5), g.tensor((1, 2), uid=5)), "uid 5 is already"),
    ("pass by value", lambda g: g.tensor((1, 1, 1, 1), is_pass_by_value=True), "pass-by-value"),
    ("reordering", lambda g: g.tensor((1, 2), reordering_type=frost.tensor_reordering.INT8x32), "reordering"),
    ("tensor_like junk", lambda g: g.tensor_like(3), "torch tensor or a graph tensor"),
    ("ragged offset junk", lambda g: g.tensor((1, 2)).set_ragged_offset(torch.zeros(2)), "set_ragged_offset"),
    ("is_inference slot", lambda g: g.sdpa(*(g.tensor((1, 2, 8, 64)) for _ in range(3)), 0.125), "is_inference"),
    (
        "bool keyword",
        lambda g: g.sdpa(*(g.tensor((1, 2, 8, 64)) for _ in range(3)), use_causal_mask=1),
        "use_causal_mask must be True or False",
    ),
    (
        "stats contradiction",
        lambda g: g.sdpa(*(g.tensor((1, 2, 8, 64)) for _ in range(3)), is_inference=True, generate_stats=True),
        "contradict",
    ),
    (
        "scale tensor",
        lambda g: g.sdpa(*(g.tensor((1, 2, 8, 64)) for _ in range(3)), attn_scale=g.tensor((1, 1, 1, 1))),
        "attn_scale must be a number",
    ),
    ("heur mode", lambda g: g.create_execution_plans(["fast"]), "heur_modes"),
    ("policy", lambda g: g.build_plans("quick"), "build_plans(policy)"),
    (
        "alignment",
        lambda g: g.sdpa(*(g.tensor((1, 2, 8, 64)) for _ in range(3)), diagonal_alignment=1),
        "diagonal_alignment",
    ),
]


@pytest.mark.parametrize("name, call, fragment", REFUSED, ids=[r[0] for r in REFUSED])
def test_what_frost_would_misread_is_refused(name, call, fragment):
    g = frost.pygraph(io_data_type=frost.data_type.HALF)
    with pytest.raises(GraphError) as ei:
        call(g)
    assert fragment in str(ei.value)


def test_graph_constructor_keywords():
    g = frost.pygraph(name="g", io_data_type=frost.data_type.HALF, sm_version=90, sm_count=66)
    assert g.target.cc == (9, 0) and g.target.sm_count == 66
    for bad in (
        {"sm_version": "90"},
        {"sm_version": 75},
        {"sm_count": 0},
        {"device_property": object()},
        {"is_dynamic_shape_enabled": True},
        {"is_override_shape_enabled": True},
    ):
        with pytest.raises(GraphError):
            frost.pygraph(**bad)
    with pytest.raises(TypeError, match="not a frost handle"):
        frost.pygraph(handle=12345678)


def test_tensor_like_a_graph_tensor_and_positional_declarations():
    g = frost.pygraph()
    off = g.tensor((4, 1, 1, 1), (1, 1, 1, 1), frost.data_type.INT32)
    q = g.tensor((3, 2, 8, 64), (1024, 64, 128, 1), frost.data_type.BFLOAT16, False, False, off, None, "q", 42)
    assert (q.name, q.dim, q.stride, q.data_type, q.get_uid(), q.get_ragged_offset()) == (
        "q",
        (3, 2, 8, 64),
        (1024, 64, 128, 1),
        BF16,
        42,
        off,
    )
    twin = g.tensor_like(q, "twin")
    assert (twin.dim, twin.stride, twin.data_type, twin.get_ragged_offset()) == (q.dim, q.stride, BF16, off)
    assert twin.get_uid() != q.get_uid()


# what cuDNN reports at validate() ---------------------------------------------------------------------------------
def _validate_error(build):
    g = frost.Graph()
    build(g)
    with pytest.raises(GraphError) as ei:
        g.validate()
    return str(ei.value)


def test_validate_reports_ragged_declaration_errors():
    def wrong_dtype(g):
        _ragged(g)
        g.node.q.ragged_offset.set_data_type("fp32")

    assert "data_type must be int32, int64" in _validate_error(wrong_dtype)

    def wrong_shape(g):
        _ragged(g)
        g.node.k.ragged_offset.set_dim((B, 1, 1, 1)).set_stride((1, 1, 1, 1))

    assert f"expected dim ({B + 1}, 1, 1, 1)" in _validate_error(wrong_shape)

    def no_padding(g):
        _ragged(g)
        g.node.attrs.use_padding_mask = False
        g.node.attrs.seq_len_q = g.node.attrs.seq_len_kv = None

    assert "ragged offsets need use_padding_mask=True" in _validate_error(no_padding)

    def o_not_ragged(g):
        _ragged(g)
        g.node.o.set_ragged_offset(None)

    assert "'sdpa::O' (o) declared no ragged offset" in _validate_error(o_not_ragged)
    assert "must be at least 1" in _validate_error(lambda g: _ragged(g, total_q=0))
    assert _ragged(frost.Graph(), total_q=B * SQ + 64).validate().facts.total_q == B * SQ + 64  # cuDNN's test
    # round the envelope up to 64 tokens, above B * S: taken as given
    g = frost.Graph()
    with pytest.raises(GraphError, match="not both"):
        _ragged(
            g,
            cu_seq_len_q=g.tensor((B + 1,), None, "int32"),
            cu_seq_len_kv=g.tensor((B + 1,), None, "int32"),
            max_seq_len_q=SQ,
            max_seq_len_kv=SKV,
        )


def test_validate_reports_envelopes_and_paged_caches_out_of_place():
    assert "max_total_seq_len_q/kv" in _validate_error(lambda g: _dense_into(g, max_total_seq_len_q=64))
    assert "only meaningful with" in _validate_error(lambda g: _dense_into(g, paged_attention_max_seq_len_kv=32))
    table = lambda g: g.tensor((2, 1, 4, 1), None, "int32")  # noqa: E731
    assert "need use_padding_mask=True" in _validate_error(
        lambda g: _dense_into(g, paged_attention_k_table=table(g), paged_attention_v_table=table(g))
    )
    assert "need both" in _validate_error(lambda g: _dense_into(g, paged_attention_k_table=table(g)))


def _dense_into(g, **kw):
    q, k, v = (g.tensor((2, 4, 32, 64), None, "fp16") for _ in range(3))
    o, _ = g.sdpa(q, k, v, **kw)
    o.set_output(True)


def test_ragged_offsets_that_are_not_whole_tokens_fail_the_reference_binding():
    g = _ragged(frost.Graph())
    g.build_plans()
    n = g.node
    torch.manual_seed(0)
    pack = {t: torch.randn(B * SQ * H * D, dtype=torch.bfloat16).as_strided(t.dim, t.stride) for t in (n.q, n.o)}
    pack.update(
        {t: torch.randn(B * SKV * HKV * D, dtype=torch.bfloat16).as_strided(t.dim, t.stride) for t in (n.k, n.v)}
    )
    pack[n.stats] = torch.empty(B * SQ * H).as_strided(n.stats.dim, n.stats.stride)
    pack[n.attrs.seq_len_q] = torch.tensor([2, 3, 4], dtype=torch.int32).view(B, 1, 1, 1)
    pack[n.attrs.seq_len_kv] = torch.tensor([2, 3, 4], dtype=torch.int32).view(B, 1, 1, 1)
    pack[n.q.ragged_offset] = torch.tensor([0, 2, 5, 9], dtype=torch.int64).view(-1, 1, 1, 1) * H * D + 1
    pack[n.k.ragged_offset] = torch.tensor([0, 2, 5, 9], dtype=torch.int32).view(-1, 1, 1, 1) * HKV * D
    pack[n.stats.ragged_offset] = torch.tensor([0, 2, 5, 9], dtype=torch.int32).view(-1, 1, 1, 1) * H
    with pytest.raises(frost.BindingError, match="not a multiple of the token stride"):
        g.execute(pack, None)
    pack[n.q.ragged_offset] = pack[n.q.ragged_offset].to(torch.int32)
    with pytest.raises(frost.BindingError, match="declared torch.int64"):
        g.execute(pack, None)


def test_a_variant_pack_keyed_by_uid_binds():
    g = frost.pygraph(io_data_type=frost.data_type.FLOAT)
    dims = (1, 2, 8, 16)
    q, k, v = (g.tensor(dims, None, uid=uid) for uid in (101, 102, 103))
    o, _ = g.sdpa(q, k, v, generate_stats=False)
    o.set_output(True).set_uid(104)
    g.build([frost.heur_mode.A])
    t = {uid: torch.randn(dims, dtype=torch.float64).float() for uid in (101, 102, 103)}
    t[104] = torch.full(dims, float("nan"))
    g.execute(t, None)
    ref = torch.nn.functional.scaled_dot_product_attention(t[101].double(), t[102].double(), t[103].double(), scale=1.0)
    torch.testing.assert_close(t[104].double(), ref, atol=1e-5, rtol=1e-5)
