"""The cuDNN engine without cuDNN: its lowering record, its routing on the fake targets, its declines, and the
declarations of bias, dBias and dropout it brings."""

from __future__ import annotations

import builtins
import itertools
import os
import subprocess
import sys

from pathlib import Path

import pytest

import frost
import frost.adapters.cudnn as cudnn_adapter
from frost.adapters.cudnn_lowering import CudnnUnsupported, band_kwargs, lower_cudnn_sdpa
from frost.errors import GraphError, NotSupportedError
from frost.lowering import capabilities
from frost.target import fake_target
from test.cpu.test_routing import declare

H200, B200, A100, RTX5090 = (fake_target(n) for n in ("H200", "B200", "A100", "RTX5090"))


def bias_graph(target=H200, *, direction="fwd", bias_dim=(1, 4, 128, 128), bias_dtype=None, dbias=True, **kw):
    """A dense graph (b=2, h=4, s=128, d=64) with an additive bias (and its gradient in the backward)."""
    g = frost.Graph(io_data_type="bf16", target=target)
    q, k, v = (g.tensor(name=n, dim=(2, 4, 128, 64)) for n in "qkv")
    bias = g.tensor(name="bias", dim=bias_dim, data_type=bias_dtype)
    if direction == "fwd":
        o, stats = g.sdpa(q, k, v, attn_scale=0.125, generate_stats=True, bias=bias, **kw)
        o.set_output(True)
        stats.set_output(True)
    else:
        o, do = (g.tensor(name=n, dim=(2, 4, 128, 64)) for n in ("o", "dO"))
        stats = g.tensor(name="stats", dim=(2, 4, 128, 1), data_type="fp32")
        db = g.tensor(name="dbias", dim=bias_dim, data_type=bias_dtype) if dbias else None
        for t in g.sdpa_backward(q, k, v, o, do, stats, attn_scale=0.125, bias=bias, dBias=db, **kw):
            t.set_output(True)
    return g


def dropout_graph(target=H200, *, p=0.1, seed_dtype="int64", seed_dim=(1, 1, 1, 1), direction="fwd"):
    g = frost.Graph(io_data_type="bf16", target=target)
    seed = g.tensor(name="seed", dim=seed_dim, data_type=seed_dtype)
    offset = g.tensor(name="offset", dim=(1, 1, 1, 1), data_type="int64")
    return declare(target, direction=direction, dropout=(p, seed, offset), graph=g)


# --- the lowering record ---------------------------------------------------------------------------------------


def test_dense_forward_lowering_keeps_declared_layouts():
    bshd = {r: (128 * 4 * 64, 64, 4 * 64, 1) for r in "qkv"}
    f = declare(H200, hq=4, hkv=4, s=128, d=64, strides=bshd).facts
    call = lower_cudnn_sdpa(f)
    assert call.op == "sdpa" and call.io_dtype == "bf16" and call.positional == ("q", "k", "v")
    assert {t.role: t.stride for t in call.inputs} == bshd
    assert [t.role for t in call.outputs] == ["o", "stats"]
    assert call.outputs[0].dim == (2, 4, 128, 64) and call.outputs[0].stride == f.tensor("o").stride
    assert call.outputs[1].dtype == "fp32" and call.outputs[1].dim == (2, 4, 128, 1)
    assert call.kwarg("attn_scale") == 0.125 and call.kwarg("generate_stats") is True
    assert call.kwarg("use_causal_mask") is None and call.dropout is None
    assert call.roles() == ("q", "k", "v", "o", "stats")


def test_stats_off_lowering_returns_o_only():
    call = lower_cudnn_sdpa(declare(H200, generate_stats=False).facts)
    assert call.kwarg("generate_stats") is False and [t.role for t in call.outputs] == ["o"]


def test_gqa_lowering_declares_kv_heads_as_they_are():
    call = lower_cudnn_sdpa(declare(H200, hq=8, hkv=2).facts)
    dims = {t.role: t.dim for t in call.inputs}
    assert dims["q"][1] == 8 and dims["k"][1] == 2 and dims["v"][1] == 2


def test_split_kv_heads_and_row_stats_lowering():
    """K and V keep their own head counts; score_max / score_sum_exp are declared tensors cuDNN writes."""
    from test.cpu.test_routing import _row_stats

    call = lower_cudnn_sdpa(_row_stats(H200, hq=6, hkv=6, hv=1).facts)
    dims = {t.role: t.dim for t in call.inputs}
    assert dims["k"][1] == 6 and dims["v"][1] == 1
    assert dims["score_max"] == dims["score_sum_exp"] == (2, 6, 128, 1)
    assert ("score_max", "score_max") in call.tensor_kwargs and ("score_sum_exp", "score_sum_exp") in call.tensor_kwargs
    assert set(call.output_kwargs) == {"score_max", "score_sum_exp"}
    cb = lower_cudnn_sdpa(declare(H200, direction="bwd", hq=8, hkv=2, hv=4).facts)
    dims = {t.role: t.dim for t in cb.inputs}
    assert (dims["k"][1], dims["v"][1]) == (2, 4)
    assert {t.role: t.dim for t in cb.outputs}["dV"][1] == 4


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_packed_split_kv_heads_are_declined_by_the_lowering(direction):
    """cuDNN's ragged form is not lowered with K and V heads apart: packed graphs decline, dense ones serve."""
    with pytest.raises(CudnnUnsupported, match=r"K and V heads apart \(K 2, V 4\) in packed graphs"):
        lower_cudnn_sdpa(declare(H200, direction=direction, thd=True, hq=8, hkv=2, hv=4).facts)
    lower_cudnn_sdpa(declare(H200, direction=direction, hq=8, hkv=2, hv=4).facts)
    lower_cudnn_sdpa(declare(H200, direction=direction, thd=True, hq=8, hkv=2).facts)


def test_packed_score_outputs_are_declined_by_the_lowering():
    from test.cpu.test_routing import _row_stats

    with pytest.raises(CudnnUnsupported, match="score_max / score_sum_exp in packed graphs"):
        lower_cudnn_sdpa(_row_stats(H200, thd=True).facts)
    lower_cudnn_sdpa(_row_stats(H200).facts)


@pytest.mark.parametrize(
    "kw, want",
    [
        (dict(use_causal_mask=True), dict(diagonal_alignment="TOP_LEFT", diagonal_band_right_bound=0)),
        (
            dict(use_causal_mask_bottom_right=True, skv=256),
            dict(diagonal_alignment="BOTTOM_RIGHT", diagonal_band_right_bound=0),
        ),
        (
            dict(use_causal_mask=True, sliding_window_length=32),
            dict(diagonal_alignment="TOP_LEFT", diagonal_band_left_bound=32, diagonal_band_right_bound=0),
        ),
        (
            dict(diagonal_band_left_bound=16, diagonal_band_right_bound=4),
            dict(diagonal_alignment="TOP_LEFT", diagonal_band_left_bound=16, diagonal_band_right_bound=4),
        ),
        (
            dict(diagonal_alignment="BOTTOM_RIGHT", diagonal_band_right_bound=3, skv=256),
            dict(diagonal_alignment="BOTTOM_RIGHT", diagonal_band_right_bound=3),
        ),
        (dict(sliding_window_length=8), dict(diagonal_alignment="TOP_LEFT", diagonal_band_left_bound=8)),
        (dict(), dict()),
    ],
)
def test_band_lowering(kw, want):
    """cuDNN's preferred masking keywords only: its deprecated causal flags mixed with a bound are undefined."""
    f = declare(H200, **kw).facts
    assert band_kwargs(f) == want
    call = lower_cudnn_sdpa(f)
    for key, value in want.items():
        assert call.kwarg(key) == value
    assert call.kwarg("use_causal_mask") is None and call.kwarg("use_causal_mask_bottom_right") is None
    assert all(type(v) is int for k, v in want.items() if k.startswith("diagonal_band"))


def test_padding_lowering_declares_lengths_as_4d_views():
    g = frost.Graph(io_data_type="bf16", target=H200)
    sq = g.tensor(name="lq", dim=(2,), data_type="int32")
    skv = g.tensor(name="lkv", dim=(2, 1, 1, 1), data_type="int32")
    f = declare(H200, use_padding_mask=True, seq_len_q=sq, seq_len_kv=skv, graph=g).facts
    call = lower_cudnn_sdpa(f)
    ins = {t.role: t for t in call.inputs}
    assert call.kwarg("use_padding_mask") is True
    assert ins["seq_len_q"].dim == (2, 1, 1, 1) and ins["seq_len_q"].dtype == "int32"
    assert ins["seq_len_kv"].dim == (2, 1, 1, 1)
    assert dict(call.tensor_kwargs) == {"seq_len_q": "seq_len_q", "seq_len_kv": "seq_len_kv"}


def test_sinks_lowering_declares_one_value_per_head():
    g = frost.Graph(io_data_type="bf16", target=H200)
    sink = g.tensor(name="sink", dim=(4,), data_type="fp32")
    call = lower_cudnn_sdpa(declare(H200, sink_token=sink, graph=g).facts)
    t = {t.role: t for t in call.inputs}["sink_token"]
    assert t.dim == (1, 4, 1, 1) and t.dtype == "fp32"


@pytest.mark.parametrize("bias_dim", [(1, 4, 128, 128), (2, 1, 128, 128), (2, 4, 128, 128), (1, 1, 128, 128)])
def test_bias_lowering_forward_and_backward(bias_dim):
    f = bias_graph(bias_dim=bias_dim).validate().facts
    assert f.has_bias and "bias" in f.features()
    call = lower_cudnn_sdpa(f)
    assert {t.role: t.dim for t in call.inputs}["bias"] == bias_dim
    assert dict(call.tensor_kwargs)["bias"] == "bias"
    fb = bias_graph(bias_dim=bias_dim, direction="bwd").validate().facts
    assert fb.has_dbias and {"bias", "dbias"} <= fb.features()
    cb = lower_cudnn_sdpa(fb)
    assert cb.op == "sdpa_backward" and cb.positional == ("q", "k", "v", "o", "dO", "stats")
    assert cb.output_kwargs == ("dBias",) and dict(cb.tensor_kwargs)["dBias"] == "dBias"
    assert [t.role for t in cb.outputs] == ["dQ", "dK", "dV"]
    assert "dBias" in cb.roles() and "bias" in cb.roles()


def test_dropout_lowering():
    f = dropout_graph(p=0.25).facts
    assert f.has_dropout and f.dropout_probability == 0.25
    call = lower_cudnn_sdpa(f)
    assert call.dropout == (0.25, "dropout_seed", "dropout_offset")
    ins = {t.role: t for t in call.inputs}
    assert ins["dropout_seed"].dim == (1, 1, 1, 1) and ins["dropout_seed"].dtype == "int64"
    cb = lower_cudnn_sdpa(dropout_graph(p=0.25, direction="bwd").facts)
    assert cb.dropout == call.dropout


def test_deterministic_backward_lowering():
    call = lower_cudnn_sdpa(declare(H200, direction="bwd", use_deterministic_algorithm=True).facts)
    assert call.kwarg("use_deterministic_algorithm") is True


def test_packed_forward_lowering_is_cudnns_ragged_form():
    """(T, H, D) tensors become (B, H, S, D) with the token stride as S's; lengths and offsets are derived operands."""
    f = declare(B200, thd=True, hq=4, hkv=2, s=128, skv=96, d=64).facts  # B=2, T_q=256, T_kv=192
    call = lower_cudnn_sdpa(f)
    decl = {t.role: t for t in call.inputs + call.outputs}
    assert decl["q"].dim == (2, 4, 128, 64) and decl["q"].stride == (128 * 256, 64, 256, 1)
    assert decl["k"].dim == (2, 2, 96, 64) and decl["k"].stride == (96 * 128, 64, 128, 1)
    assert decl["o"].dim == (2, 4, 128, 64) and decl["o"].stride == (128 * 256, 64, 256, 1)
    # cuDNN's packed Stats: (B, H, S, 1), token-major, its own offsets (token stride H)
    assert decl["stats"].dim == (2, 4, 128, 1) and decl["stats"].stride == (128 * 4, 1, 4, 1)
    assert call.derived.strides_q == (256, 4) and call.derived.strides_kv == (128,)
    assert call.derived.offset_dtype == "int32" and call.batch == 2
    assert call.derived_roles() == ("seq_len_q", "seq_len_kv", "ragged_offset_0", "ragged_offset_1", "ragged_offset_2")
    assert dict(call.ragged) == {
        "q": "ragged_offset_0",
        "o": "ragged_offset_0",
        "stats": "ragged_offset_1",
        "k": "ragged_offset_2",
        "v": "ragged_offset_2",
    }
    assert decl["seq_len_q"].dim == (2, 1, 1, 1) and decl["seq_len_q"].dtype == "int32"
    assert decl["ragged_offset_2"].dim == (3, 1, 1, 1) and decl["ragged_offset_2"].dtype == "int32"
    assert call.kwarg("use_padding_mask") is True and call.kwarg("seq_len_q") == "seq_len_q"
    assert call.kwarg("max_total_seq_len_q") == 256 and call.kwarg("max_total_seq_len_kv") == 192
    assert set(call.derived_roles()) <= set(call.roles())
    assert "cu_seq_len_q" not in call.roles()  # the kernel reads it; cuDNN never does


def test_packed_backward_lowering_shares_offsets_by_token_stride():
    call = lower_cudnn_sdpa(declare(B200, thd=True, direction="bwd", hq=4, hkv=4).facts)
    pairs = dict(call.ragged)
    assert {r for r in pairs} == {"q", "k", "v", "o", "dO", "stats", "dQ", "dK", "dV"}
    assert pairs["q"] == pairs["o"] == pairs["dO"] == pairs["dQ"] != pairs["stats"]
    assert pairs["k"] == pairs["v"] == pairs["dK"] == pairs["dV"] != pairs["q"]
    assert call.positional == ("q", "k", "v", "o", "dO", "stats") and call.kwarg("use_padding_mask") is True


def test_packed_offsets_are_int64_once_an_element_offset_passes_int32():
    small = declare(B200, thd=True, b=2, s=4096, hq=8, d=128).facts  # 8192 tokens * 1024 elements
    assert lower_cudnn_sdpa(small).derived.offset_dtype == "int32"
    big = declare(B200, thd=True, b=2, s=4096 * 256, hq=8, d=128).facts  # 2M tokens * 1024 elements > 2^31
    assert lower_cudnn_sdpa(big).derived.offset_dtype == "int64"


def head_major_stats_graph():
    """A packed forward (B=2, T=256, H=4, d=64) whose Stats is declared head-major (H, T): strides (1, 256, 1)."""
    g = frost.Graph(io_data_type="bf16", target=B200)
    cq, ck = (g.tensor(name=n, dim=(3,), data_type="int32") for n in ("cu_q", "cu_kv"))
    q, k, v = (g.tensor(name=n, dim=(256, 4, 64)) for n in "qkv")
    o, stats = g.sdpa(
        q,
        k,
        v,
        attn_scale=0.125,
        generate_stats=True,
        cu_seq_len_q=cq,
        cu_seq_len_kv=ck,
        max_seq_len_q=128,
        max_seq_len_kv=128,
    )
    o.set_output(True)
    stats.set_output(True).set_stride((1, 256, 1))
    return g.build_operation_graph()


def test_head_major_packed_stats_declines_naming_the_strides():
    """A stride equal to the token total follows the bound total (the binder derives it); cuDNN fixes strides."""
    with pytest.raises(CudnnUnsupported) as ei:
        lower_cudnn_sdpa(head_major_stats_graph().facts)
    assert "head-major" in ei.value.reason and "(1, 256, 1)" in ei.value.reason and "(4, 1, 1)" in ei.value.reason


def test_ragged_form_lowering_passes_its_declarations_through():
    from test.cpu.test_cudnn_vocabulary import B, _ragged

    for direction in ("fwd", "bwd"):
        for stats_ragged in (True, False):
            g = _ragged(frost.Graph(io_data_type="bf16", target=B200), direction, stats_ragged=stats_ragged)
            call = lower_cudnn_sdpa(g.build_operation_graph().facts)
            decl = {t.role: t for t in call.inputs + call.outputs}
            assert call.derived is None and call.kwarg("use_padding_mask") is True
            assert decl["q"].dim == tuple(g.node.q.dim) and decl["q"].stride == tuple(g.node.q.stride)
            assert decl["stats"].dim == tuple(g.node.stats.dim)
            pairs = dict(call.ragged)
            assert pairs["q"] == "q_ragged_offset" and pairs["k"] == "k_ragged_offset"
            assert ("stats" in pairs) == stats_ragged
            assert decl["q_ragged_offset"].dtype == "int64" and decl["k_ragged_offset"].dtype == "int32"
            assert decl["q_ragged_offset"].dim == (B + 1, 1, 1, 1)
            assert decl["seq_len_q"].dim == (B, 1, 1, 1)
            # every role the lowering binds is one the graph binds at execute
            assert set(call.roles()) <= set(g._roles())


# --- routing on the fake targets -------------------------------------------------------------------------------


def test_b200_routes_every_graph_to_cudnn(unpended, cudnn_present, no_compile):
    for direction in ("fwd", "bwd"):
        name = "SdpaFwdCudnn" if direction == "fwd" else "SdpaBwdCudnn"
        for kw in (
            dict(),
            dict(hq=8, hkv=2),
            dict(use_causal_mask=True),
            dict(use_causal_mask_bottom_right=True),
            dict(sliding_window_length=16),
            dict(diagonal_band_left_bound=8, diagonal_band_right_bound=2),
        ):
            assert declare(B200, direction=direction, **kw).available_engines() == [name], kw
        assert bias_graph(B200, direction=direction).validate().available_engines() == [name]
        assert dropout_graph(B200, direction=direction).available_engines() == [name]


def test_h200_prefers_the_dsl_engines_and_uses_cudnn_for_dropout(unpended, cudnn_present):
    assert declare(H200).available_engines() == ["SdpaFwdDslSm90", "SdpaFwdDslSm80", "SdpaFwdCudnn"]
    assert declare(A100, direction="bwd").available_engines() == ["SdpaBwdDslSm80", "SdpaBwdCudnn"]
    assert declare(RTX5090).available_engines() == ["SdpaFwdDslSm120", "SdpaFwdCudnn"]
    g = dropout_graph(H200)
    assert g.available_engines() == ["SdpaFwdCudnn"]
    declined = dict(g.declines())
    assert declined["SdpaFwdDslSm90"] == "does not serve dropout"
    assert declined["SdpaFwdDslSm80"] == "does not serve dropout"
    # a bias runs on the wgmma forward, the mma.sync one next, cuDNN last; its gradient likewise
    g = bias_graph(H200, direction="fwd").validate()
    assert g.available_engines() == ["SdpaFwdDslSm90", "SdpaFwdDslSm80", "SdpaFwdCudnn"]
    g = bias_graph(H200, direction="bwd").validate()
    assert g.available_engines() == ["SdpaBwdDslSm90", "SdpaBwdDslSm80", "SdpaBwdCudnn"]


def test_cudnn_is_ranked_below_every_dsl_row():
    cudnn_rows = [r for r in capabilities.ROWS if "Cudnn" in r.name]
    assert {r.direction for r in cudnn_rows} == {"fwd", "bwd"}
    for row in cudnn_rows:
        assert (row.cc_min, row.cc_max) == ((8, 0), (12, 9))
        for other in capabilities.rows_for(row.direction):
            if "Dsl" in other.name:
                assert other.priority < row.priority
            if "Reference" in other.name:
                assert other.priority > row.priority


def test_cudnn_by_name(unpended, cudnn_present):
    g = declare(H200)
    g.create_execution_plans(engine="cudnn")
    assert g.available_engines() == ["SdpaFwdCudnn"]
    g = declare(H200, direction="bwd")
    g.create_execution_plans(engine="cudnn")
    assert g.available_engines() == ["SdpaBwdCudnn"]


def test_a_fake_target_routes_to_cudnn_but_cannot_build_its_plan(unpended, cudnn_present):
    g = declare(B200)
    with pytest.raises(NotImplementedError) as ei:
        g.build_plans()
    assert cudnn_adapter.FAKE_TARGET in str(ei.value)


def test_packed_and_ragged_graphs_route_to_cudnn_on_b200(unpended, cudnn_present, no_compile):
    from test.cpu.test_cudnn_vocabulary import _ragged

    for direction in ("fwd", "bwd"):
        name = "SdpaFwdCudnn" if direction == "fwd" else "SdpaBwdCudnn"
        assert declare(B200, thd=True, direction=direction, use_causal_mask=True).available_engines() == [name]
        g = _ragged(frost.Graph(io_data_type="bf16", target=B200), direction).validate()
        assert g.available_engines() == [name]


def test_packed_graph_with_head_major_stats_declines_on_b200(unpended, cudnn_present):
    g = head_major_stats_graph()
    assert g.available_engines() == []
    assert "head-major" in dict(g.declines())["SdpaFwdCudnn"]


def test_missing_binding_declines_naming_the_package(unpended, monkeypatch):
    monkeypatch.undo()  # the real check, with the import made to fail
    real_import = builtins.__import__

    def no_cudnn(name, *a, **k):
        if name == "cudnn" or name.startswith("cudnn."):
            raise ModuleNotFoundError("No module named 'cudnn'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_cudnn)
    assert cudnn_adapter.cudnn_missing_reason() == cudnn_adapter.CUDNN_MISSING
    g = bias_graph(B200).build_operation_graph()
    with pytest.raises(NotSupportedError) as ei:
        g.build_plans()
    assert (
        dict(ei.value.declines)["SdpaFwdCudnn"] == "nvidia-cudnn-frontend is not installed (pip install 'frost[cudnn]')"
    )


def test_broken_binding_declines_with_the_error(monkeypatch):
    monkeypatch.undo()
    real_import = builtins.__import__

    def broken(name, *a, **k):
        if name == "cudnn":
            raise OSError("libcudnn.so.9: cannot open shared object file")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", broken)
    reason = cudnn_adapter.cudnn_missing_reason()
    assert reason.startswith("nvidia-cudnn-frontend is installed but does not import") and "libcudnn" in reason


def test_an_older_binding_declines_naming_its_version(monkeypatch):
    monkeypatch.undo()
    from types import SimpleNamespace

    monkeypatch.setitem(sys.modules, "cudnn", SimpleNamespace(__version__="1.23.0"))
    reason = cudnn_adapter.cudnn_missing_reason()
    assert (
        reason == "nvidia-cudnn-frontend 1.23.0 is installed; the cuDNN engine needs 1.32 or later (pip install "
        "'frost[cudnn]')"
    )
    monkeypatch.setitem(sys.modules, "cudnn", SimpleNamespace())
    assert "(no version) is installed" in cudnn_adapter.cudnn_missing_reason()
    for ok in ("1.32.0", "1.32.1.dev0", "1.40.0", "2.0.0rc1"):
        monkeypatch.setitem(sys.modules, "cudnn", SimpleNamespace(__version__=ok))
        assert cudnn_adapter.cudnn_missing_reason() is None, ok


def test_import_frost_does_not_import_cudnn():
    code = (
        "import sys, frost, frost.adapters.cudnn, frost.lowering.lower\n"
        "assert 'cudnn' not in sys.modules, 'importing frost imported cudnn'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr


# --- declarations of bias, dBias and dropout --------------------------------------------------------------------


@pytest.mark.parametrize(
    "bias_dim, match",
    [
        ((3, 4, 128, 128), r"'bias'.*expected dim \(1 or 2, 1 or 4, 128, 128\).*got \(3, 4, 128, 128\)"),
        ((1, 2, 128, 128), r"'bias'.*1 or 4"),
        ((1, 4, 128, 64), r"'bias'.*got \(1, 4, 128, 64\)"),
        ((4, 128, 128), r"'bias'.*expected dim"),
    ],
)
def test_bias_with_a_wrong_broadcast_is_a_graph_error(bias_dim, match):
    with pytest.raises(GraphError, match=match):
        bias_graph(bias_dim=bias_dim).validate()


def test_bias_with_a_wrong_dtype_is_a_graph_error():
    with pytest.raises(GraphError, match=r"'bias'.*data_type must be q's bf16, got fp32"):
        bias_graph(bias_dtype="fp32").validate()


def test_bias_from_another_graph_or_not_a_tensor_is_a_graph_error():
    other = frost.Graph(io_data_type="bf16").tensor(name="b", dim=(1, 4, 128, 128))
    g = frost.Graph(io_data_type="bf16")
    q, k, v = (g.tensor(name=n, dim=(2, 4, 128, 64)) for n in "qkv")
    with pytest.raises(GraphError, match="belongs to another graph"):
        g.sdpa(q, k, v, bias=other)
    with pytest.raises(GraphError, match="bias: expected a frost tensor"):
        g.sdpa(q, k, v, bias=0.5)


def test_dbias_needs_bias_and_its_shape():
    g = frost.Graph(io_data_type="bf16")
    q, k, v, o, do = (g.tensor(name=n, dim=(2, 4, 128, 64)) for n in ("q", "k", "v", "o", "dO"))
    stats = g.tensor(name="stats", dim=(2, 4, 128, 1), data_type="fp32")
    db = g.tensor(name="db", dim=(1, 4, 128, 128))
    for t in g.sdpa_backward(q, k, v, o, do, stats, dBias=db):
        t.set_output(True)
    with pytest.raises(GraphError, match=r"'db' \(dBias\): a bias gradient needs bias"):
        g.validate()
    g = bias_graph(direction="bwd", dbias=False)
    g.node.dBias = g.tensor(name="db", dim=(2, 4, 128, 128)).set_output(True)
    with pytest.raises(GraphError, match=r"'db' \(dBias\): expected dim \(1, 4, 128, 128\)"):
        g.validate()


@pytest.mark.parametrize(
    "dropout, match",
    [
        ((1.0, "seed", "offset"), r"dropout probability must be a number in \[0, 1\), got 1.0"),
        ((-0.1, "seed", "offset"), r"got -0.1"),
        (("x", "seed", "offset"), r"got 'x'"),
        ((0.1, None, "offset"), r"dropout seed must be a frost tensor.*got NoneType"),
        ((0.1, "seed", 7), r"dropout offset must be a frost tensor.*got int"),
        ((0.1,), r"dropout must be \(probability, seed tensor, offset tensor\)"),
    ],
)
def test_bad_dropout_is_a_graph_error(dropout, match):
    g = frost.Graph(io_data_type="bf16", target=H200)
    tensors = {
        "seed": g.tensor(name="seed", dim=(1, 1, 1, 1), data_type="int64"),
        "offset": g.tensor(name="offset", dim=(1, 1, 1, 1), data_type="int64"),
    }
    dropout = tuple(tensors.get(x, x) if isinstance(x, str) and x in tensors else x for x in dropout)
    with pytest.raises(GraphError, match=match):
        declare(H200, dropout=dropout, graph=g)


def test_dropout_seed_dtype_and_dim_are_checked():
    with pytest.raises(GraphError, match=r"'seed' \(dropout_seed\): data_type must be int64, int32, got fp32"):
        dropout_graph(seed_dtype="fp32")
    with pytest.raises(GraphError, match=r"'seed' \(dropout_seed\): expected dim \(1, 1, 1, 1\) or \(1,\)"):
        dropout_graph(seed_dim=(2,))
    assert dropout_graph(seed_dim=(1,), seed_dtype="int32").facts.has_dropout


def test_dropout_tensors_are_bound_at_execute():
    g = dropout_graph()
    roles = g._roles()
    assert roles["dropout_seed"].name == "seed" and roles["dropout_offset"].name == "offset"
    gb = bias_graph(direction="bwd").validate()
    assert gb._roles()["dBias"].name == "dbias" and gb._roles()["bias"].name == "bias"


# --- the adapter against a stand-in of the cuDNN binding ----------------------------------------------------------


class _FakeTensor:
    uids = itertools.count(1)

    def __init__(self, **kw):
        self.kw, self.output, self.uid = dict(kw), False, next(_FakeTensor.uids)

    def get_uid(self):
        return self.uid

    def set_output(self, value):
        self.output = value
        return self

    def set_dim(self, dim):
        self.kw["dim"] = dim
        return self

    def set_stride(self, stride):
        self.kw["stride"] = stride
        return self

    def set_data_type(self, dt):
        self.kw["data_type"] = dt
        return self

    def set_ragged_offset(self, offset):
        self.ragged = offset
        return self


class _Plan:
    def __init__(self, engine_id, name):
        self.engine_id, self.name = engine_id, name


class _FakeGraph:
    """Records what frost asks of `cudnn.pygraph` (1.32's: a ranked plan list, `execute(..., tensor_uids=)`).

    `refuse` makes check_support raise like cuDNN does; `ranked` is the plan list create_execution_plans leaves
    (library engines below id 20000, the frontend's own Python engines above); `ordered_error` makes the ordered
    execute raise it.
    """

    refuse = None
    made = []
    ranked = [(7, "eng7_k2=3")]
    ordered_error = None

    def __init__(self, **kw):
        self.kw, self.calls, self.steps, self.executed, self.plans, self.deselected = kw, [], [], [], [], []
        _FakeGraph.made.append(self)

    def create_execution_plans(self, modes):
        self.steps.append("create_execution_plans")
        self.plans = [_Plan(i, n) for i, n in _FakeGraph.ranked]

    def get_plan_name_at_index(self, i):
        return self.plans[i].name

    def deselect_engines(self, names):
        self.steps.append("deselect_engines")
        self.deselected += list(names)

    def tensor(self, **kw):
        return _FakeTensor(**kw)

    def _op(self, op, n, args, kw):
        self.calls.append((op, args, kw))
        return [_FakeTensor(name=f"out{i}") for i in range(n)]

    def sdpa(self, *args, **kw):
        return self._op("sdpa", 2, args, kw)

    def sdpa_backward(self, *args, **kw):
        return self._op("sdpa_backward", 3, args, kw)

    def __getattr__(self, step):  # validate, build_operation_graph, build_plans
        if step.startswith("_"):
            raise AttributeError(step)
        return lambda *a: self.steps.append(step)

    def check_support(self):
        self.steps.append("check_support")
        if _FakeGraph.refuse:
            raise RuntimeError(_FakeGraph.refuse)

    def get_workspace_size(self):
        return 1000

    def execute(self, pack, workspace, handle=None, tensor_uids=None):
        if tensor_uids is not None and _FakeGraph.ordered_error is not None:
            raise _FakeGraph.ordered_error
        self.executed.append((pack, workspace, handle, tensor_uids))


@pytest.fixture
def fake_cudnn(monkeypatch, cudnn_present):
    """A live-device record (cc 9.0, not fake) and a stand-in binding: the adapter's cuDNN path, run on the CPU."""
    from types import SimpleNamespace

    import torch

    ns = SimpleNamespace
    fake = ns(
        pygraph=_FakeGraph,
        heur_mode=ns(A="A", FALLBACK="FALLBACK"),
        data_type=ns(BFLOAT16="BFLOAT16", HALF="HALF", FLOAT="FLOAT", INT32="INT32", INT64="INT64"),
        diagonal_alignment=ns(TOP_LEFT="TOP_LEFT", BOTTOM_RIGHT="BOTTOM_RIGHT"),
    )
    monkeypatch.setattr(cudnn_adapter, "_cudnn", lambda: fake)
    monkeypatch.setattr(cudnn_adapter, "_BUILT", {})
    monkeypatch.setattr(cudnn_adapter, "handle_for", lambda device, stream: ("handle", device, stream))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(_FakeGraph, "made", [])
    monkeypatch.setattr(_FakeGraph, "refuse", None)
    monkeypatch.setattr(_FakeGraph, "ranked", [(7, "eng7_k2=3")])
    monkeypatch.setattr(_FakeGraph, "ordered_error", None)
    return H200.model_copy(update={"is_fake": False, "name": "NVIDIA H200 (record)"})


@pytest.fixture
def bias_only_cudnn(unpended, monkeypatch):
    """The DSL rows as if they read no bias: the tests below use a bias graph as one only the cuDNN engine serves
    (they are about its mechanics; the mma.sync engine serves biases, test/cpu/test_score_mods.py)."""
    rows = tuple(
        r.model_copy(update={"features": r.features - capabilities.SCORE_MOD_FEATURES}) if "Dsl" in r.name else r
        for r in capabilities.ROWS
    )
    monkeypatch.setattr(capabilities, "ROWS", rows)
    return rows


def test_ranking_asks_cudnn_only_when_it_could_win(bias_only_cudnn, fake_cudnn):
    live = fake_cudnn
    g = declare(live)
    assert g.available_engines() == ["SdpaFwdDslSm90", "SdpaFwdDslSm80", "SdpaFwdCudnn"]
    assert _FakeGraph.made == [], "a fallback below an accepting DSL engine must not build a cuDNN plan"
    g = bias_graph(live).validate()
    assert g.available_engines() == ["SdpaFwdCudnn"]
    assert len(_FakeGraph.made) == 1 and _FakeGraph.made[0].steps == [
        "validate",
        "build_operation_graph",
        "create_execution_plans",
        "check_support",
        "build_plans",
    ]
    g = declare(live)
    g.create_execution_plans(engine="cudnn")
    assert g.available_engines() == ["SdpaFwdCudnn"] and len(_FakeGraph.made) == 2


def test_cudnn_refusal_is_a_decline_with_its_message(bias_only_cudnn, fake_cudnn):
    _FakeGraph.refuse = "cudnnGraphNotSupportedError: no engine for head dim 72"
    g = bias_graph(fake_cudnn).build_operation_graph()
    assert g.available_engines() == []
    reason = dict(g.declines())["SdpaFwdCudnn"]
    assert reason == "cuDNN declines this graph: RuntimeError: cudnnGraphNotSupportedError: no engine for head dim 72"


class _Bound:
    def __init__(self, role):
        self.role = role

    def get_device(self):
        return 0


def test_the_record_is_replayed_and_execute_binds_pointers_only(bias_only_cudnn, fake_cudnn):
    g = bias_graph(fake_cudnn, use_causal_mask_bottom_right=True, sliding_window_length=16).validate()
    g.build_plans()
    assert g.engine_name == "SdpaFwdCudnn"
    assert g.get_workspace_size() == 1024  # cuDNN's 1000 bytes, aligned
    (cg,) = _FakeGraph.made
    assert cg.kw["io_data_type"] == "BFLOAT16" and cg.kw["handle"][0] == "handle"
    op, args, kw = cg.calls[0]
    assert op == "sdpa" and [a.kw["name"] for a in args] == ["q", "k", "v"]
    assert kw["bias"].kw["dim"] == [1, 4, 128, 128] and kw["attn_scale"] == 0.125
    assert kw["diagonal_alignment"] == "BOTTOM_RIGHT" and kw["diagonal_band_right_bound"] == 0
    assert kw["diagonal_band_left_bound"] == 16 and "use_causal_mask_bottom_right" not in kw
    assert kw["generate_stats"] is True
    adapter = g.plan.adapter
    bound = {r: _Bound(r) for r in ("q", "k", "v", "bias", "o", "stats")}
    adapter.execute(bound, "workspace", 12345)
    # the ordered form: the bound tensors in the record's role order, with the uids of their cuDNN tensors
    pack, ws, handle, uids = cg.executed[0]
    assert ws == "workspace" and handle == ("handle", 0, 12345)
    roles = ("q", "k", "v", "bias", "o", "stats")
    assert isinstance(pack, tuple) and [b.role for b in pack] == list(roles)
    assert len(set(uids)) == len(roles)
    named = {t.get_uid(): t.kw["name"] for t in [*args, kw["bias"]]}
    assert [named.get(u) for u in uids[:4]] == ["q", "k", "v", "bias"]
    tensors = dict(adapter._pack_roles)
    assert [tensors[r].get_uid() for r in roles] == list(uids)
    assert tensors["o"].output and tensors["o"].kw["dim"] == [2, 4, 128, 64]
    assert tensors["stats"].output and tensors["stats"].kw["data_type"] == "FLOAT"


def test_execute_falls_back_to_the_mapping_form_once(bias_only_cudnn, fake_cudnn):
    _FakeGraph.ordered_error = TypeError("execute() got an unexpected keyword argument 'tensor_uids'")
    g = bias_graph(fake_cudnn).validate()
    g.build_plans()
    adapter = g.plan.adapter
    bound = {r: _Bound(r) for r in ("q", "k", "v", "bias", "o", "stats")}
    with pytest.warns(RuntimeWarning, match="binding by mapping"):
        adapter.execute(bound, "workspace", 0)
    adapter.execute(bound, "workspace", 0)  # no second warning: the plan binds by mapping now
    (cg,) = _FakeGraph.made
    assert len(cg.executed) == 2
    for pack, _, _, uids in cg.executed:
        assert uids is None and sorted(b.role for b in pack.values()) == sorted(bound)
        assert {t.kw["name"]: b.role for t, b in pack.items() if t.kw.get("name") in ("q", "k", "v", "bias")} == {
            "q": "q",
            "k": "k",
            "v": "v",
            "bias": "bias",
        }


def test_the_frontends_own_engines_are_deselected(bias_only_cudnn, fake_cudnn):
    """1.32's pygraph ranks its own CuTe DSL engines beside the library's: the cuDNN engine builds the library's."""
    _FakeGraph.ranked = [
        (20517, "sdpa_fwd_prefill_sm90[TILE_M=128]"),
        (7, "eng7_k2=3"),
        (20511, "sdpa_fwd_prefill_sm100"),
        (3, "eng3"),
    ]
    g = bias_graph(fake_cudnn).validate()
    assert g.available_engines() == ["SdpaFwdCudnn"]
    (cg,) = _FakeGraph.made
    assert cg.deselected == ["sdpa_fwd_prefill_sm100", "sdpa_fwd_prefill_sm90"]
    assert cg.steps == [
        "validate",
        "build_operation_graph",
        "create_execution_plans",
        "deselect_engines",
        "check_support",
        "build_plans",
    ]


def test_a_graph_only_the_frontends_own_engines_serve_is_declined(bias_only_cudnn, fake_cudnn):
    _FakeGraph.ranked = [(20517, "sdpa_fwd_prefill_sm90")]
    g = bias_graph(fake_cudnn).build_operation_graph()
    assert g.available_engines() == []
    reason = dict(g.declines())["SdpaFwdCudnn"]
    assert reason.startswith("cuDNN declines this graph: LibraryHasNoPlan: the cuDNN library has no engine")
    assert "sdpa_fwd_prefill_sm90" in reason


def test_a_binding_mismatch_is_an_error_not_a_decline(bias_only_cudnn, fake_cudnn, monkeypatch):
    """A keyword the binding does not take must fail planning loudly (a decline would hide it as a skip)."""

    def sdpa(self, *args, **kw):
        raise TypeError("sdpa(): incompatible function arguments")

    monkeypatch.setattr(_FakeGraph, "sdpa", sdpa)
    g = bias_graph(fake_cudnn).build_operation_graph()
    with pytest.raises(TypeError, match="incompatible function arguments"):
        g.available_engines()


def test_backward_replay_passes_dbias_dropout_and_determinism(unpended, fake_cudnn):
    g = frost.Graph(io_data_type="bf16", target=fake_cudnn)
    seed = g.tensor(name="seed", dim=(1,), data_type="int64")
    offset = g.tensor(name="offset", dim=(1, 1, 1, 1), data_type="int64")
    q, k, v, o, do = (g.tensor(name=n, dim=(2, 4, 128, 64)) for n in ("q", "k", "v", "o", "dO"))
    stats = g.tensor(name="stats", dim=(2, 4, 128, 1), data_type="fp32")
    bias = g.tensor(name="bias", dim=(1, 4, 128, 128))
    db = g.tensor(name="db", dim=(1, 4, 128, 128))
    for t in g.sdpa_backward(
        q,
        k,
        v,
        o,
        do,
        stats,
        attn_scale=0.5,
        bias=bias,
        dBias=db,
        dropout=(0.2, seed, offset),
        use_deterministic_algorithm=True,
        diagonal_band_right_bound=3,
    ):
        t.set_output(True)
    g.validate().build_plans()
    assert g.engine_name == "SdpaBwdCudnn"
    op, args, kw = _FakeGraph.made[0].calls[0]
    assert op == "sdpa_backward" and [a.kw["name"] for a in args] == ["q", "k", "v", "o", "dO", "stats"]
    assert kw["dBias"].output and kw["dBias"].kw["dim"] == [1, 4, 128, 128]
    p, s, off = kw["dropout"]
    assert (
        p == 0.2 and s.kw["dim"] == [1, 1, 1, 1] and s.kw["data_type"] == "INT64" and off.kw["name"] == "dropout_offset"
    )
    assert kw["use_deterministic_algorithm"] is True and kw["diagonal_alignment"] == "TOP_LEFT"
    assert kw["diagonal_band_right_bound"] == 3


# --- the lean execute: the backend's raw-pointer entry, and packed graphs' derived operands --------------------


class _RawLowered:
    """1.32's lowered C++ graph as far as the raw-pointer execute needs it: the operand uids in ascending order,
    and `_execute_with_raw_ptrs(pointer array address, count, workspace, backend handle, plan index)`."""

    def __init__(self, graph):
        self.graph, self.calls = graph, []

    def _prepare_variant_pack_template(self):
        pass

    def _get_variant_pack_uids_sorted(self):
        return sorted(self.graph.uids)

    def _execute_with_raw_ptrs(self, address, n, workspace, handle, index):
        import ctypes

        self.calls.append((list((ctypes.c_uint64 * n).from_address(address)), workspace, handle, index))


class _RawGraph(_FakeGraph):
    """A pygraph whose backend plan takes raw pointers (1.32's `_lowered_graph`, `_plan_index`, ...)."""

    selected_engine = None
    _data_bindings = {}
    _plan_index = 0

    def __init__(self, **kw):
        super().__init__(**kw)
        self.uids, self._plans = [], ["the plan built"]
        self._lowered_graph = _RawLowered(self)

    def _materialize_backend_plan(self, index):
        from types import SimpleNamespace

        return SimpleNamespace(cpp_index=3)

    def tensor(self, **kw):
        t = super().tensor(**kw)
        self.uids.append(t.uid)
        return t

    def _op(self, op, n, args, kw):
        outs = super()._op(op, n, args, kw)
        self.uids += [t.uid for t in outs]
        return outs


class _Ptr:
    """A bound tensor as the raw path reads it: its device address."""

    def __init__(self, address):
        self.address = address

    def data_ptr(self):
        return self.address

    def get_device(self):
        return 0


def _backend_handles(monkeypatch):
    from types import SimpleNamespace

    monkeypatch.setattr(
        cudnn_adapter, "handle_for", lambda device, stream: SimpleNamespace(backend_handle=7000 + stream)
    )


def test_execute_hands_the_backend_raw_pointers_in_its_order(bias_only_cudnn, fake_cudnn, monkeypatch):
    """One call of the backend's raw-pointer entry: the bound tensors' addresses in ascending-uid order, the
    workspace address, the stream's backend handle and the plan built; no pack, no binding call on the way."""
    monkeypatch.setattr(_FakeGraph, "made", [])
    fake = cudnn_adapter._cudnn()
    monkeypatch.setattr(fake, "pygraph", _RawGraph)
    _backend_handles(monkeypatch)
    g = bias_graph(fake_cudnn).validate()
    g.build_plans()
    adapter = g.plan.adapter
    (cg,) = _FakeGraph.made
    raw = adapter._raw
    assert raw is not None and raw.plan_index == 3
    tensors = dict(adapter._pack_roles)
    assert [tensors[r].uid for r in raw.roles] == sorted(cg.uids)
    roles = ("q", "k", "v", "bias", "o", "stats")
    bound = {r: _Ptr(0x1000 * (i + 1)) for i, r in enumerate(roles)}
    ws = _Ptr(0x90000)
    adapter.execute(bound, ws, 12)
    adapter.execute(bound, ws, 12)
    assert cg.executed == []  # the binding's public execute is not called
    ptrs, workspace, handle, index = cg._lowered_graph.calls[0]
    assert ptrs == [bound[r].address for r in raw.roles] and workspace == 0x90000
    assert handle == 7012 and index == 3 and len(cg._lowered_graph.calls) == 2
    assert list(adapter._handles) == [12]  # the stream's handle is looked up once, then kept by the plan


def test_a_binding_without_the_raw_entry_keeps_the_ordered_form(bias_only_cudnn, fake_cudnn, monkeypatch):
    _backend_handles(monkeypatch)
    g = bias_graph(fake_cudnn).validate()
    g.build_plans()
    assert g.plan.adapter._raw is None
    g.plan.adapter.execute({r: _Bound(r) for r in ("q", "k", "v", "bias", "o", "stats")}, "ws", 0)
    (cg,) = _FakeGraph.made
    assert cg.executed[0][3] is not None  # tensor_uids=


def _packed_plan(target, monkeypatch, direction="fwd"):
    """A packed graph planned on the cuDNN engine; its ragged-offsets kernel is a recorder."""
    import frost.compiler.compile as compile_mod

    launches = []

    class Kernel:
        name = "frost_ragged_offsets_recorded"

        def __call__(self, *args):
            launches.append(args)

    specs = []
    monkeypatch.setattr(compile_mod, "compile_kernel", lambda t, p, target: specs.append((t, p)) or Kernel())
    g = declare(target, thd=True, direction=direction, hq=4, hkv=2, s=128, skv=96)
    g.build_plans(engine="cudnn")
    return g, launches, specs


def test_packed_execute_derives_lengths_and_offsets_then_launches_cudnn(unpended, fake_cudnn, monkeypatch):
    """The ragged-offsets kernel writes into scratch after cuDNN's workspace; cuDNN reads those rows."""
    import torch

    from frost.runtime.workspace import align_up

    fake = cudnn_adapter._cudnn()
    monkeypatch.setattr(fake, "pygraph", _RawGraph)
    _backend_handles(monkeypatch)
    g, launches, specs = _packed_plan(fake_cudnn, monkeypatch)
    adapter = g.plan.adapter
    assert specs == [(cudnn_adapter.RAGGED_TEMPLATE, adapter.call.derived)]
    assert adapter.kernel_specs() == specs and len(adapter.compiled_kernels()) == 1
    start = align_up(1000)  # cuDNN's 1000 bytes first
    assert g.get_workspace_size() == start + 2 * 256 + 3 * 256  # rows of 64 int32: 2 of lengths, 3 of offsets
    ws = torch.zeros(g.get_workspace_size(), dtype=torch.uint8)
    bound = {r: _Ptr(0x1000 * (i + 1)) for i, r in enumerate(("q", "k", "v", "o", "stats"))}
    bound.update(cu_seq_len_q="cu_q", cu_seq_len_kv="cu_kv")
    adapter.execute(bound, ws, 5)
    ((cu_q, cu_kv, lengths, offsets, *envelope, stream),) = launches
    assert (cu_q, cu_kv, stream) == ("cu_q", "cu_kv", 5)
    # the envelope the kernel clamps the prefix sums to (docs/lengths.md): token totals, then longest sequences
    f = g.facts
    assert (
        tuple(envelope)
        == adapter.call.envelope
        == (f.total_q, f.total_kv, f.seq_q, f.seq_kv)
        == (f.total_q, f.total_kv, 128, 96)
    )
    base = ws.data_ptr()
    assert lengths.shape == (2, 64) and lengths.dtype == torch.int32 and lengths.data_ptr() == base + start
    assert offsets.shape == (3, 64) and offsets.data_ptr() == base + start + 2 * 256
    ptrs, workspace, handle, _ = g.plan.adapter._graph._lowered_graph.calls[0]
    at = dict(zip(adapter._raw.roles, ptrs))
    assert at["seq_len_q"] == lengths[0].data_ptr() and at["seq_len_kv"] == lengths[1].data_ptr()
    assert [at[f"ragged_offset_{i}"] for i in range(3)] == [offsets[i].data_ptr() for i in range(3)]
    assert at["q"] == 0x1000 and at["stats"] == 0x5000 and workspace == base and handle == 7005
    adapter.execute(bound, ws, 5)
    assert launches[1][2] is lengths  # the scratch views are carved once per workspace


def test_packed_execute_on_the_ordered_form_binds_the_derived_rows(unpended, fake_cudnn, monkeypatch):
    import torch

    g, launches, _ = _packed_plan(fake_cudnn, monkeypatch, direction="bwd")
    adapter = g.plan.adapter
    assert adapter._raw is None
    ws = torch.zeros(g.get_workspace_size(), dtype=torch.uint8)
    bound = {r: _Bound(r) for r in ("q", "k", "v", "o", "dO", "stats", "dQ", "dK", "dV")}
    bound.update(cu_seq_len_q="cu_q", cu_seq_len_kv="cu_kv")
    adapter.execute(bound, ws, 0)
    (cg,) = _FakeGraph.made
    pack, _, _, uids = cg.executed[0]
    got = dict(zip(adapter._roles, pack))
    lengths, offsets = launches[0][2], launches[0][3]
    assert got["seq_len_q"].shape == (2, 1, 1, 1) and got["seq_len_q"].data_ptr() == lengths[0].data_ptr()
    assert got["ragged_offset_1"].shape == (3, 1, 1, 1) and got["ragged_offset_1"].data_ptr() == offsets[1].data_ptr()
    assert got["dQ"].role == "dQ" and len(uids) == len(pack)
    # the replay attached every packed tensor's ragged offset (q group: rows 0 and 1 (Stats), kv group: row 2)
    tensors = dict(adapter._pack_roles)
    assert tensors["q"].ragged is tensors["ragged_offset_0"] and tensors["dK"].ragged is tensors["ragged_offset_2"]
