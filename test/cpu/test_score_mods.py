"""Score modifiers (the additive bias, its gradient dBias, ALiBi) without a GPU: the reference engine against the
float64 oracle, their declarations, the routing that puts them on the mma.sync engine (and, forward on cc 9.0, on
the wgmma engine), and the template records (params, argument lists, workspace) the planner builds for them."""

from __future__ import annotations

import math

import pytest
import torch

import frost
from frost.adapters.dsl import dbias_accumulates
from frost.engines.params import score_mod_tags
from frost.engines.sdpa_args import alibi_slopes, fwd_arg_names
from frost.engines.sdpa_bwd.chain import chain_of, stage_params
from frost.engines.sdpa_bwd.scratch import scratch_layout
from frost.engines.sm80.sdpa_bwd_params import Sm80BwdParams, main_args
from frost.engines.sm80.sdpa_bwd_params import validate as validate_bwd
from frost.engines.sm80.sdpa_fwd_params import Sm80FwdParams
from frost.engines.sm90.sdpa_bwd_params import Sm90BwdParams
from frost.engines.sm90.sdpa_bwd_params import validate as validate_sm90_bwd
from frost.engines.sm90.sdpa_fwd_params import Sm90FwdParams
from frost.engines.sm90.sdpa_fwd_params import validate as validate_sm90_fwd
from frost.errors import GraphError, TemplateParamsError
from frost.target import fake_target
from test import oracle
from test.helpers import (
    Case,
    assert_bwd_matches_oracle,
    assert_close,
    assert_fwd_matches_oracle,
    make_inputs,
    oracle_fwd,
    run_bwd,
)

A100, H200, RTX5090 = (fake_target(n) for n in ("A100", "H200", "RTX5090"))
CAUSAL = (("use_causal_mask", True),)
CAUSAL_BR = (("use_causal_mask_bottom_right", True),)

# --- the reference engine against the oracle ------------------------------------------------------------------

CASES = {
    "bias-full": Case(bias="bh"),
    "bias-bcast-batch": Case(bias="h", layout="bshd"),
    "bias-bcast-heads": Case(bias="b"),
    "bias-bcast-both": Case(bias="", mask=CAUSAL),
    "bias-transposed-layout": Case(bias="bh", bias_layout="transposed", mask=CAUSAL),
    "bias-causal-br-sq<skv": Case(bias="h", sq=5, skv=9, mask=CAUSAL_BR),
    "bias-padding": Case(bias="bh", sq=8, skv=9, lens_q=(5, 8), lens_kv=(9, 2), mask=CAUSAL),
    "bias-padding-bcast": Case(bias="h", batch=3, sq=6, skv=7, lens_q=(0, 6, 3), lens_kv=(4, 0, 7)),
    "bias-thd": Case(bias="bh", thd=True, batch=3, lens_q=(3, 5, 2), lens_kv=(4, 5, 6)),
    "bias-thd-bcast-causal": Case(bias="h", thd=True, batch=3, lens_q=(3, 5, 2), lens_kv=(4, 5, 6), mask=CAUSAL),
    "bias-sinks-window": Case(bias="b", sink=True, sq=10, skv=10, mask=(("sliding_window_length", 3),) + CAUSAL),
    "alibi-causal": Case(alibi=True, mask=CAUSAL),
    "alibi-causal-6-heads": Case(alibi=True, hq=6, hkv=2, mask=CAUSAL),
    "alibi-window-sq<skv": Case(alibi=True, sq=6, skv=10, mask=(("sliding_window_length", 3),) + CAUSAL),
    "alibi-bias-padding": Case(alibi=True, bias="h", lens_q=(5, 8), lens_kv=(8, 3), mask=CAUSAL),
    "alibi-thd": Case(alibi=True, hq=3, hkv=1, thd=True, batch=2, lens_q=(4, 6), lens_kv=(4, 7), mask=CAUSAL),
}


@pytest.mark.parametrize("name", list(CASES))
def test_forward_matches_oracle(name):
    assert_fwd_matches_oracle(name, CASES[name])


@pytest.mark.parametrize("name", list(CASES))
def test_backward_matches_autograd_with_dbias(name):
    case = CASES[name]
    dbias = case.bias is not None
    t, got, want = assert_bwd_matches_oracle(name, case, dbias=dbias)
    if dbias:
        assert got[4].shape == t["bias"].shape and got[4].stride() == t["bias"].stride()
        assert_close(got[4], want[6], rtol=1e-5, atol=1e-6, what=f"{name} dBias")


def test_dbias_is_zero_where_masked_and_sums_broadcast_dims():
    case = Case(bias="h", batch=3, sq=6, skv=6, lens_q=(6, 4, 6), lens_kv=(6, 6, 2), mask=CAUSAL)
    t = make_inputs(case)
    _, _, _, _, db = run_bwd(case, t, dbias=True)
    assert db.shape == (1, 4, 6, 6)
    assert torch.all(db[..., torch.triu(torch.ones(6, 6, dtype=torch.bool), 1)] == 0)
    full = run_bwd(case.with_(bias="bh"), dict(t, bias=t["bias"].expand(3, 4, 6, 6).contiguous()), dbias=True)[4]
    assert torch.all(full[1, :, 4:] == 0) and torch.all(full[2, :, :, 2:] == 0)  # padding rows and keys
    torch.testing.assert_close(full.sum(0, keepdim=True), db)


def test_alibi_slopes_follow_cudnn():
    """cuDNN's slopes (test_mhas.py compute_ref), written out for a power of two and for 6 heads."""
    assert alibi_slopes(8) == [2.0 ** (-i) for i in range(1, 9)]
    assert alibi_slopes(1) == [2.0**-8]
    want6 = [2.0 ** (-2 * (i + 1)) for i in range(4)] + [2.0 ** (-1), 2.0 ** (-3)]  # n = 4: m0 = 1/4, m_hat0 = 1/2
    assert alibi_slopes(6) == pytest.approx(want6, rel=1e-15)
    for h in (1, 2, 3, 5, 6, 8, 12, 16, 24, 40, 64):
        assert alibi_slopes(h) == pytest.approx(oracle.alibi_slopes(h).tolist(), rel=1e-15)


def test_alibi_adds_slope_times_key_minus_query():
    """One head, one query row: the logits grow by slope * (j - i), non-positive under the causal mask."""
    case = Case(batch=1, hq=1, hkv=1, sq=4, skv=4, d=8, alibi=True, mask=CAUSAL, scale=0.5)
    t = make_inputs(case)
    o, lse = oracle_fwd(case, t)
    q, k = t["q"][0, 0].double(), t["k"][0, 0].double()
    row = 3
    logits = q[row] @ k.T * 0.5 + 2.0**-8 * (torch.arange(4.0, dtype=torch.float64) - row)
    assert lse[0, 0, row].item() == pytest.approx(torch.logsumexp(logits, 0).item(), rel=1e-12)


# --- declarations ---------------------------------------------------------------------------------------------


def _alibi_graph(**kw):
    g = frost.Graph(io_data_type="bf16", target=H200)
    q, k, v = (g.tensor(name=n, dim=(2, 4, 64, 64)) for n in "qkv")
    o, _ = g.sdpa(q, k, v, attn_scale=0.125, use_alibi_mask=True, **kw)
    o.set_output(True)
    return g


@pytest.mark.parametrize(
    "kw, right", [(dict(), None), (dict(diagonal_band_right_bound=3), 3), (dict(sliding_window_length=8), None)]
)
def test_alibi_without_a_causal_mask_is_a_graph_error(kw, right):
    with pytest.raises(GraphError, match=rf"use_alibi_mask needs a causal mask .* right bound is {right}"):
        _alibi_graph(**kw).validate()


@pytest.mark.parametrize(
    "kw",
    [
        dict(use_causal_mask=True),
        dict(diagonal_band_right_bound=0),
        dict(use_causal_mask_bottom_right=True),
        dict(use_causal_mask=True, sliding_window_length=16),
    ],
)
def test_alibi_with_a_causal_mask_is_accepted(kw):
    g = _alibi_graph(**kw).validate()
    assert g.facts.has_alibi and "alibi" in g.facts.features()


def test_bias_and_dbias_take_any_strides():
    """The DSL kernels read the bias element by element: a strided key dim is a layout, not an error."""
    g = frost.Graph(io_data_type="bf16", target=H200)
    q, k, v, o, do = (g.tensor(name=n, dim=(2, 4, 64, 64)) for n in ("q", "k", "v", "o", "dO"))
    stats = g.tensor(name="stats", dim=(2, 4, 64, 1), data_type="fp32")
    bias = g.tensor(name="bias", dim=(1, 4, 64, 64), stride=(4 * 64 * 64, 1, 4, 4 * 64))
    db = g.tensor(name="db", dim=(1, 4, 64, 64), stride=(4 * 64 * 64, 64 * 64, 1, 64))
    for t in g.sdpa_backward(q, k, v, o, do, stats, attn_scale=0.125, bias=bias, dBias=db):
        t.set_output(True)
    g.validate()
    assert g.available_engines()[:2] == ["SdpaBwdDslSm90", "SdpaBwdDslSm80"]


def test_dbias_strides_may_not_overlap():
    g = frost.Graph(io_data_type="bf16")
    with pytest.raises(GraphError, match=r"'db'.*overlap"):
        g.tensor(name="db", dim=(1, 4, 64, 64), stride=(0, 0, 1, 1)).require_declared()


# --- routing --------------------------------------------------------------------------------------------------


def _bias_graph(target, *, direction="fwd", bias_dim=(1, 4, 128, 128), dbias=True, thd=False, **kw):
    from test.cpu.test_routing import declare

    g = frost.Graph(io_data_type="bf16", target=target)
    extra = {}
    if bias_dim is not None:
        extra["bias"] = g.tensor(name="bias", dim=bias_dim)
        if direction == "bwd" and dbias:
            extra["dBias"] = g.tensor(name="dbias", dim=bias_dim)
    return declare(target, direction=direction, graph=g, thd=thd, **extra, **kw)


MMA_SYNC = {"A100": (A100, "Sm80"), "H200": (H200, "Sm80"), "RTX5090": (RTX5090, "Sm120")}


def _line(tname: str) -> str:
    """The engine line a score-modified graph plans on: the mma.sync one, but the wgmma engines on cc 9.0."""
    return "Sm90" if tname == "H200" else MMA_SYNC[tname][1]


@pytest.mark.parametrize("tname", list(MMA_SYNC))
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("bias_dim", [(1, 4, 128, 128), (2, 4, 128, 128), (2, 1, 128, 128), (1, 1, 128, 128)])
def test_bias_graphs_plan_on_the_mma_sync_engine(unpended, no_compile, tname, direction, bias_dim):
    target = MMA_SYNC[tname][0]
    g = _bias_graph(target, direction=direction, bias_dim=bias_dim, use_causal_mask=True)
    d = "Fwd" if direction == "fwd" else "Bwd"
    assert g.available_engines()[0] == f"Sdpa{d}Dsl{_line(tname)}"
    if direction == "fwd" and tname == "H200":
        assert "SdpaFwdDslSm80" in g.available_engines()  # the mma.sync forward serves it on cc 9.0 too


@pytest.mark.parametrize("tname", list(MMA_SYNC))
def test_alibi_graphs_plan_on_the_dsl_engines(unpended, no_compile, tname):
    target = MMA_SYNC[tname][0]
    for direction in ("fwd", "bwd"):
        g = _bias_graph(
            target, direction=direction, bias_dim=None, use_alibi_mask=True, use_causal_mask=True, hq=8, hkv=2
        )
        d = "Fwd" if direction == "fwd" else "Bwd"
        assert g.available_engines()[0] == f"Sdpa{d}Dsl{_line(tname)}"


def test_the_wgmma_backward_serves_bias_dbias_and_alibi(unpended, no_compile):
    from test.cpu.test_routing import declare

    g = _bias_graph(H200, direction="bwd").validate()
    assert g.available_engines()[0] == "SdpaBwdDslSm90"
    g = _bias_graph(H200, direction="bwd", dbias=False).validate()
    assert g.available_engines()[0] == "SdpaBwdDslSm90"
    g = declare(H200, direction="bwd", use_alibi_mask=True, use_causal_mask=True).validate()
    assert g.available_engines()[0] == "SdpaBwdDslSm90"
    assert "SdpaFwdDslSm90" not in dict(_bias_graph(H200).declines())


def _sm90_fwd_params(g, knobs=None):
    from frost.adapters.sm90 import SdpaFwdDslSm90
    from frost.knobs import Knobs

    return SdpaFwdDslSm90(g.facts, H200, Knobs(**(knobs or {}))).validated_params()


@pytest.mark.parametrize(
    "bias_dim, flags",
    [
        ((2, 8, 128, 128), dict(bias_per_batch=True, bias_per_head=True, bias_key_strided=False)),
        ((1, 1, 128, 128), dict(bias_per_batch=False, bias_per_head=False, bias_key_strided=False)),
        ((1, 8, 128, 128), dict(bias_per_batch=False, bias_per_head=True, bias_key_strided=False)),
    ],
)
def test_the_wgmma_forward_plans_bias_graphs_unpacked(unpended, no_compile, bias_dim, flags):
    """cc 9.0 plans the wgmma forward for a bias (GQA included: its tiles read one query head's bias, so the planner
    does not pack the heads of a kv head)."""
    g = _bias_graph(H200, bias_dim=bias_dim, hq=8, hkv=2, use_causal_mask=True)
    assert g.available_engines()[0] == "SdpaFwdDslSm90"
    p = _sm90_fwd_params(g)
    assert p.has_bias and not p.has_alibi and not p.pack_gqa
    assert {n: getattr(p, n) for n in flags} == flags
    assert "bias" in fwd_arg_names(p)


def test_the_wgmma_forward_plans_a_strided_broadcast_bias(unpended, no_compile):
    """A (1, 1, S_q, S_kv) bias whose key dim is strided (stored transposed) is read as declared."""
    from test.cpu.test_routing import declare

    g = frost.Graph(io_data_type="bf16", target=H200)
    bias = g.tensor(name="bias", dim=(1, 1, 128, 128), stride=(128 * 128, 128 * 128, 1, 128))
    g = declare(H200, graph=g, bias=bias)
    assert g.available_engines()[0] == "SdpaFwdDslSm90"
    p = _sm90_fwd_params(g)
    assert p.has_bias and p.bias_key_strided and not (p.bias_per_batch or p.bias_per_head)


def test_the_wgmma_forward_plans_alibi_graphs(unpended, no_compile):
    g = _bias_graph(H200, bias_dim=None, use_alibi_mask=True, use_causal_mask=True, hq=8, hkv=2)
    assert g.available_engines()[0] == "SdpaFwdDslSm90"
    p = _sm90_fwd_params(g)
    assert p.has_alibi and not p.has_bias and not p.pack_gqa and p.has_window_right


def test_score_mods_plan_two_consumer_warpgroups_on_the_wgmma_forward(unpended, no_compile):
    """d=64's default 192-row tile (three consumer warpgroups of 160 registers) would spill with the modifiers'
    loads: the planner takes 128 rows unless asked."""
    from test.cpu.test_routing import declare

    assert _sm90_fwd_params(declare(H200, d=64)).tile_m == 192
    assert _sm90_fwd_params(_bias_graph(H200, d=64, bias_dim=(1, 4, 128, 128))).tile_m == 128
    alibi = _bias_graph(H200, d=64, bias_dim=None, use_alibi_mask=True, use_causal_mask=True)
    assert _sm90_fwd_params(alibi).tile_m == 128
    assert _sm90_fwd_params(alibi, knobs=dict(tile_m=192)).tile_m == 192
    # d=80's 192 x 112 default too: the modifiers take the 128 x 128 tiles
    mods80 = _sm90_fwd_params(_bias_graph(H200, d=80, bias_dim=(1, 4, 128, 128)))
    assert (mods80.tile_m, mods80.tile_n) == (128, 128)
    assert _sm90_fwd_params(declare(H200, d=80)).tile_m == 192


def test_forced_gqa_packing_with_score_mods_declines_with_the_reason(unpended, no_compile):
    g = _bias_graph(H200, hq=8, hkv=2, bias_dim=(1, 8, 128, 128)).create_execution_plans(
        knobs=frost.Knobs(pack_gqa=True)
    )
    reason = dict(g.declines())["SdpaFwdDslSm90"]
    assert "pack_gqa is not served with score modifiers (bias, ALiBi)" in reason, reason


def test_packed_thd_bias_plans_on_the_wgmma_engines(unpended, no_compile):
    for direction in ("fwd", "bwd"):
        g = _bias_graph(H200, direction=direction, thd=True, use_causal_mask=True)
        assert g.available_engines()[0] == f"Sdpa{'Fwd' if direction == 'fwd' else 'Bwd'}DslSm90"
        if direction == "bwd":  # packed: dBias through the accumulator
            assert g._ranking.accepted[0][1].template_params().dbias_accum
    p = _sm90_fwd_params(_bias_graph(H200, thd=True, use_causal_mask=True))
    assert p.is_thd and p.has_bias and p.bias_per_head


def test_deterministic_dbias_summed_over_broadcast_dims_keeps_a_copy_per_batch_and_head(unpended, no_compile):
    """A deterministic dBias that several (batch, head) pairs add into: an fp32 copy per pair, each element stored
    once, summed by the dQ convert in a fixed order; declined, naming the size, above the workspace cap."""
    from frost.adapters.dsl_bwd import DETERMINISTIC_DBIAS_BYTES
    from frost.engines.sdpa_bwd.chain import chain_of
    from frost.engines.sdpa_bwd.scratch import scratch_layout

    g = _bias_graph(H200, direction="bwd", use_deterministic_algorithm=True)
    assert g.available_engines()[:2] == ["SdpaBwdDslSm90", "SdpaBwdDslSm80"]
    p = g._ranking.accepted[0][1].template_params()
    assert p.dbias_accum and p.deterministic and (p.dbias_sum_batch, p.dbias_sum_heads) == (True, False)
    layout = dict((n, shape) for n, _, shape in scratch_layout(p, 2, 128, 128))
    assert layout["dbias_accum"] == (2, 4, 128, 128)  # full along batch: the dBias (1, 4, S, S) sums 2 copies
    post = {stage: sp for stage, _, _, sp in chain_of(p)}["postprocess"]
    assert post.dbias_sum_batch and "dbiasaccbhsumb" in __import__(
        "frost.engines.sdpa_bwd.chain", fromlist=["helper_suffix"]
    ).helper_suffix(post)
    full = _bias_graph(H200, direction="bwd", bias_dim=(2, 4, 128, 128), use_deterministic_algorithm=True)
    assert full.available_engines()[0] == "SdpaBwdDslSm90"
    assert not full._ranking.accepted[0][1].template_params().dbias_accum  # full: written directly, once
    no_grad = _bias_graph(H200, direction="bwd", dbias=False, use_deterministic_algorithm=True)
    assert no_grad.available_engines()[0] == "SdpaBwdDslSm90"
    assert DETERMINISTIC_DBIAS_BYTES == 4 << 30
    big = _bias_graph(
        H200, direction="bwd", b=300, s=1024, bias_dim=(1, 4, 1024, 1024), use_deterministic_algorithm=True
    )
    for engine in ("SdpaBwdDslSm90", "SdpaBwdDslSm80"):  # both DSL backwards keep the copies
        why = dict(big.declines())[engine]
        assert "deterministic dBias" in why and "GiB of workspace" in why


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("mods", ["bias", "alibi"])
def test_ragged_graphs_with_score_mods_plan_on_the_dsl_engines(direction, mods):
    """cuDNN's ragged-offset form with a bias (dBias) or ALiBi: the mma.sync lines serve it on every arch (first
    on cc 8.x and 12.x; on cc 9.0 the wgmma engines rank above them)."""
    from test.cpu.test_cudnn_vocabulary import BF16, H, SKV, SQ, _ragged
    from test.cpu.test_routing import reasons

    kind = "Fwd" if direction == "fwd" else "Bwd"
    for target, line in MMA_SYNC.values():
        g = frost.Graph(target=target)
        kw = dict(use_alibi_mask=True)
        if mods == "bias":
            dim, stride = (1, H, SQ, SKV), (H * SQ * SKV, SQ * SKV, SKV, 1)
            kw = dict(bias=g.tensor(dim, stride, BF16, name="bias"))
            if direction == "bwd":
                kw["dBias"] = g.tensor(dim, stride, BF16, name="dbias")
        g = _ragged(g, direction, **kw).validate()
        engines = g.available_engines()
        assert f"Sdpa{kind}Dsl{line}" in engines, reasons(g)
        p = next(a for row, a in g._ranking.accepted if row.name == f"Sdpa{kind}Dsl{line}").template_params()
        assert p.ragged and (p.has_bias if mods == "bias" else p.has_alibi)
        if line == "Sm80" and target.cc == (9, 0):
            assert engines[0] == f"Sdpa{kind}DslSm90"


# --- the records planning builds ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bias_dim, b, hq, thd, accum",
    [
        ((2, 4, 128, 128), 2, 4, False, False),
        ((1, 4, 128, 128), 2, 4, False, True),
        ((2, 1, 128, 128), 2, 4, False, True),
        ((1, 4, 128, 128), 1, 4, False, False),
        ((1, 1, 128, 128), 1, 1, False, False),
        ((2, 4, 128, 128), 2, 4, True, True),
    ],
)
def test_dbias_goes_through_the_accumulator_only_where_elements_are_shared(unpended, bias_dim, b, hq, thd, accum):
    g = _bias_graph(H200, direction="bwd", bias_dim=bias_dim, b=b, hq=hq, hkv=hq, thd=thd)
    assert dbias_accumulates(g.facts) is accum


def test_bwd_params_args_and_workspace_of_a_broadcast_dbias(unpended):
    from frost.adapters.sm80 import SdpaBwdDslSm80
    from frost.knobs import Knobs

    g = _bias_graph(H200, direction="bwd", bias_dim=(1, 4, 128, 100), skv=100, use_causal_mask=True)
    a = SdpaBwdDslSm80(g.facts, H200, Knobs())
    p = a.validated_params()
    assert (p.has_bias, p.bias_per_batch, p.bias_per_head, p.has_dbias, p.dbias_accum) == (
        True,
        False,
        True,
        True,
        True,
    )
    assert not p.bias_key_strided  # a compact bias: its unit key stride compiles in
    assert "bias" in main_args(p) and "dbias_accum" in main_args(p) and "dbias" not in main_args(p)
    stages = {stage: names for stage, _, names, _ in chain_of(p)}
    assert "dbias_accum" in stages["preprocess"] and {"dbias", "dbias_accum"} <= set(stages["postprocess"])
    layout = {n: shape for n, _, shape in scratch_layout(p, 2, 128, 100)}
    assert layout["dbias_accum"] == (1, 4, 128, 100)  # rows padded to 16 bytes: 100 already is
    assert {n: s for n, _, s in scratch_layout(p, 2, 128, 99)}["dbias_accum"] == (1, 4, 128, 100)
    # the helpers key on the accumulator, not on the main kernel's bias flags
    pre = stage_params(p, "preprocess")
    assert pre.dbias_accum and pre.dbias_accum_per_head and not pre.dbias_accum_per_batch
    plain = stage_params(p.model_copy(update=dict(has_dbias=False, dbias_accum=False)), "preprocess")
    assert plain == stage_params(
        Sm80BwdParams(
            **{**p.model_dump(), "has_bias": False, "bias_per_head": False, "has_dbias": False, "dbias_accum": False}
        ),
        "preprocess",
    )


def test_a_strided_key_dim_compiles_a_runtime_stride(unpended):
    from frost.adapters.sm80 import SdpaFwdDslSm80
    from frost.knobs import Knobs

    g = frost.Graph(io_data_type="bf16", target=H200)
    bias = g.tensor(name="bias", dim=(1, 4, 128, 128), stride=(4 * 128 * 128, 1, 4, 4 * 128))
    from test.cpu.test_routing import declare

    f = declare(H200, graph=g, bias=bias).facts
    p = SdpaFwdDslSm80(f, H200, Knobs()).validated_params()
    assert p.bias_key_strided and [t for on, t in score_mod_tags(p) if on] == ["biashs"]


def test_a_full_dbias_is_written_by_the_main_kernel(unpended):
    from frost.adapters.sm80 import SdpaBwdDslSm80
    from frost.knobs import Knobs

    g = _bias_graph(H200, direction="bwd", bias_dim=(2, 4, 128, 128))
    p = SdpaBwdDslSm80(g.facts, H200, Knobs()).validated_params()
    assert not p.dbias_accum and "dbias" in main_args(p) and "dbias_accum" not in main_args(p)
    assert all(n != "dbias_accum" for n, _, _ in scratch_layout(p, 2, 128, 128))
    assert all("dbias" not in names for stage, _, names, _ in chain_of(p) if stage != "main")


def test_fwd_args_and_kernel_names():
    from frost.engines.sm80.sdpa_fwd import kernel_name
    from frost.testing.cases import _mma_fwd

    p = Sm80FwdParams(
        **_mma_fwd(d=128, has_bias=True, bias_per_head=True, has_alibi=True, has_window_right=True, has_lse=True)
    )
    names = fwd_arg_names(p)
    assert names.index("bias") == names.index("softmax_scale") - 1
    assert kernel_name(p, "sm_90a") == "frost_sdpa_fwd_sm80_bf16_d128_h4k4_wr_biash_alibi_lse_m128n64s1w4"
    assert [t for on, t in score_mod_tags(p) if on] == ["biash", "alibi"]


def test_validators_reject_inconsistent_score_mods():
    from frost.testing.cases import _mma_bwd

    base = _mma_bwd(d=64)
    with pytest.raises(TemplateParamsError, match="dbias needs a bias"):
        validate_bwd(Sm80BwdParams(**base, has_dbias=True))
    with pytest.raises(TemplateParamsError, match="describe a bias"):
        validate_bwd(Sm80BwdParams(**base, bias_per_head=True))
    with pytest.raises(TemplateParamsError, match="ALiBi needs a causal mask"):
        validate_bwd(Sm80BwdParams(**base, has_alibi=True))
    det = Sm80BwdParams(**base, has_bias=True, has_dbias=True, dbias_accum=True, deterministic=True)
    validate_bwd(det)  # a copy per (batch entry, head), summed in order by the dQ convert
    assert det.dbias_accum_per_batch and det.dbias_accum_per_head and det.dbias_sum_batch and det.dbias_sum_heads
    with pytest.raises(TemplateParamsError, match="packed batch's dbias goes through the accumulator"):
        validate_bwd(Sm80BwdParams(**base, is_thd=True, has_bias=True, has_dbias=True))
    validate_bwd(
        Sm80BwdParams(
            **base, has_bias=True, bias_per_batch=True, bias_per_head=True, has_dbias=True, deterministic=True
        )
    )


def test_sm90_validators_take_or_decline_score_mods_with_reasons():
    validate_sm90_fwd(
        Sm90FwdParams(has_bias=True, bias_per_batch=True, bias_per_head=True, num_heads_q=8, num_heads_kv=2)
    )
    validate_sm90_fwd(Sm90FwdParams(has_alibi=True, has_window_right=True, is_thd=True, has_bias=True))
    with pytest.raises(TemplateParamsError, match="pack_gqa is not served with score modifiers"):
        validate_sm90_fwd(Sm90FwdParams(has_bias=True, num_heads_q=8, num_heads_kv=2, pack_gqa=True))
    with pytest.raises(TemplateParamsError, match="pack_gqa is not served with score modifiers"):
        validate_sm90_fwd(
            Sm90FwdParams(has_alibi=True, has_window_right=True, num_heads_q=8, num_heads_kv=2, pack_gqa=True)
        )
    with pytest.raises(TemplateParamsError, match="Sm90FwdParams: ALiBi needs a causal mask"):
        validate_sm90_fwd(Sm90FwdParams(has_alibi=True))
    validate_sm90_fwd(Sm90FwdParams(has_bias=True, is_thd=True, has_seqused=True, token_div_q=512, token_div_kv=512))
    with pytest.raises(TemplateParamsError, match="Sm90FwdParams: bias_per_batch / bias_per_head"):
        validate_sm90_fwd(Sm90FwdParams(bias_per_head=True))
    validate_sm90_bwd(
        Sm90BwdParams(
            head_dim=128,
            head_dim_v=128,
            has_bias=True,
            bias_per_head=True,
            has_alibi=True,
            has_window_right=True,
            is_thd=True,
            has_dbias=True,
            dbias_accum=True,
        )
    )
    with pytest.raises(TemplateParamsError, match="packed batch's dbias goes through the accumulator"):
        validate_sm90_bwd(Sm90BwdParams(head_dim=128, head_dim_v=128, has_bias=True, has_dbias=True, is_thd=True))


def test_oracle_bias_is_cudnns_order():
    """scale * q.k + bias, then the softmax: a constant bias row shifts LSE and leaves O alone."""
    case = Case(batch=1, hq=2, hkv=2, sq=5, skv=7, bias="")
    t = make_inputs(case)
    base_o, base_lse = oracle_fwd(case.with_(bias=None), {r: x for r, x in t.items() if r != "bias"})
    shifted = dict(t, bias=torch.full((1, 1, 5, 7), 3.0))
    o, lse = oracle_fwd(case, shifted)
    torch.testing.assert_close(o, base_o)
    torch.testing.assert_close(lse, base_lse + 3.0)
    assert math.isfinite(lse.max().item())


def test_score_mod_covering_sets_cover_every_flag_family_and_arch():
    from frost.testing.cases import SM80_BWD_SCORE_MOD_COVER, SM80_FWD_SCORE_MOD_COVER

    for cover in (SM80_FWD_SCORE_MOD_COVER, SM80_BWD_SCORE_MOD_COVER):
        assert set(cover) == {"sm_80", "sm_90a", "sm_120a"}
        kws = [kw for arch in cover for kw in cover[arch]]
        for flag in (
            "has_bias",
            "bias_per_batch",
            "bias_per_head",
            "bias_key_strided",
            "has_alibi",
            "is_thd",
            "has_seqused",
        ):
            assert any(k.get(flag) for k in kws), flag
        assert any(k.get("has_bias") and not (k.get("bias_per_batch") or k.get("bias_per_head")) for k in kws)
        assert {k["family"] for k in kws} == {"sm80", "sm120"} and {k["dtype"] for k in kws} == {"bf16", "fp16"}
        assert any(k.get("has_alibi") and k["num_heads_q"] & (k["num_heads_q"] - 1) for k in kws)  # not a power of 2
    bwd = [kw for arch in SM80_BWD_SCORE_MOD_COVER for kw in SM80_BWD_SCORE_MOD_COVER[arch]]
    assert any(k.get("has_dbias") and k.get("dbias_accum") for k in bwd)
    assert any(k.get("has_dbias") and not k.get("dbias_accum") and k.get("deterministic") for k in bwd)
    assert any(k.get("has_bias") and not k.get("has_dbias") for k in bwd)


def test_dbias_in_another_dtype_is_a_graph_error():
    g = frost.Graph(io_data_type="bf16", target=H200)
    q, k, v, o, do = (g.tensor(name=n, dim=(2, 4, 64, 64)) for n in ("q", "k", "v", "o", "dO"))
    stats = g.tensor(name="stats", dim=(2, 4, 64, 1), data_type="fp32")
    bias = g.tensor(name="bias", dim=(1, 4, 64, 64))
    db = g.tensor(name="db", dim=(1, 4, 64, 64), data_type="fp32")
    for t in g.sdpa_backward(q, k, v, o, do, stats, attn_scale=0.125, bias=bias, dBias=db):
        t.set_output(True)
    with pytest.raises(GraphError, match=r"'db' \(dBias\): data_type must be bf16, got fp32"):
        g.validate()


def test_a_bias_plans_64_key_tiles_unless_asked_otherwise(unpended):
    from frost.adapters.sm80 import SdpaFwdDslSm80
    from frost.knobs import Knobs

    for bias_dim, want in ((None, 128), ((1, 4, 128, 128), 64)):
        f = _bias_graph(H200, bias_dim=bias_dim, use_causal_mask=True).facts
        assert SdpaFwdDslSm80.plan_knobs(f, H200, {})["tile_n"] == want
    f = _bias_graph(H200, use_causal_mask=True).facts
    assert SdpaFwdDslSm80.plan_knobs(f, H200, {"tile_n": 128})["tile_n"] == 128
    SdpaFwdDslSm80(f, H200, Knobs()).validated_params()


@pytest.mark.parametrize("params", [Sm90BwdParams, Sm80BwdParams])
@pytest.mark.parametrize(
    "per_batch,deterministic,want", [(False, False, True), (True, False, False), (False, True, False)]
)
def test_a_dbias_shared_by_the_batch_runs_its_batch_entries_side_by_side(params, per_batch, deterministic, want):
    """Both backward main kernels put batch on the grid's fastest axis exactly where the batch entries add into one
    fp32 dBias copy (so their adds meet in L2); a per-batch dBias, or a deterministic one (a stored copy per batch
    entry), keeps the key-tile-fastest grid."""
    p = params(
        head_dim=128,
        head_dim_v=128,
        num_heads_q=4,
        num_heads_kv=4,
        has_bias=True,
        bias_per_batch=per_batch,
        bias_per_head=True,
        has_dbias=True,
        dbias_accum=not per_batch,
        deterministic=deterministic,
    )
    assert p.batch_fastest is want
    assert p.grid_order == ("batch" if want else "key")
    assert params(head_dim=128, head_dim_v=128, num_heads_q=4, num_heads_kv=4).grid_order == "key"
