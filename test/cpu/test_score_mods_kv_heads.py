"""Score modifiers (bias, dBias, ALiBi) together with K and V head counts apart and the score_max / score_sum_exp
outputs, without a GPU: the mma.sync engines (and on cc 9.0 the wgmma ones) serve the combinations (the bias and
ALiBi are per query head, and the row max is taken over the final logits, bias and ALiBi included, as cuDNN's
score_max is), so the graphs plan there, the params validate and name their kernels apart, and the reference
engine matches the float64 oracle."""

from __future__ import annotations

import pytest
import torch

import frost
from frost.engines.sdpa_args import fwd_arg_names
from frost.engines.sm80.sdpa_bwd_params import Sm80BwdParams, main_args
from frost.engines.sm80.sdpa_bwd_params import validate as validate_bwd
from frost.engines.sm80.sdpa_fwd_params import Sm80FwdParams
from frost.engines.sm80.sdpa_fwd_params import validate as validate_fwd
from frost.target import fake_target
from frost.testing.cases import _mma_bwd, _mma_fwd
from test import oracle
from test.helpers import Case, assert_bwd_matches_oracle, assert_close, assert_fwd_matches_oracle, make_inputs

A100, H200, RTX5090 = (fake_target(n) for n in ("A100", "H200", "RTX5090"))
MMA_SYNC = {"A100": (A100, "Sm80"), "H200": (H200, "Sm80"), "RTX5090": (RTX5090, "Sm120")}
CAUSAL = (("use_causal_mask", True),)


# --- routing and params ---------------------------------------------------------------------------------------


def _graph(target, direction, heads, *, row_stats=False):
    from test.cpu.test_routing import declare

    g = frost.Graph(io_data_type="bf16", target=target)
    hq = heads["hq"]
    extra = {"bias": g.tensor(name="bias", dim=(1, hq, 128, 128))}
    if direction == "bwd":
        extra["dBias"] = g.tensor(name="dbias", dim=(1, hq, 128, 128))
    elif row_stats:
        extra.update(
            {n: g.tensor(name=n, dim=(2, hq, 128, 1), data_type="fp32") for n in ("score_max", "score_sum_exp")}
        )
    return declare(target, direction=direction, graph=g, use_alibi_mask=True, use_causal_mask=True, **heads, **extra)


@pytest.mark.parametrize("tname", list(MMA_SYNC))
@pytest.mark.parametrize("heads", [dict(hq=6, hkv=6, hv=1), dict(hq=8, hkv=2, hv=4)])
def test_bias_alibi_with_split_heads_and_row_stats_plan_on_the_mma_sync_engines(unpended, no_compile, tname, heads):
    target, line = MMA_SYNC[tname]
    fwd = _graph(target, "fwd", heads, row_stats=True)
    assert {"split_kv_heads", "bias", "alibi", "score_max", "score_sum_exp"} <= fwd.facts.features()
    # on cc 9.0 the wgmma forward serves them too, the mma.sync one next
    assert fwd.available_engines()[: 2 if tname == "H200" else 1] == (
        ["SdpaFwdDslSm90", "SdpaFwdDslSm80"] if tname == "H200" else [f"SdpaFwdDsl{line}"]
    )
    bwd = _graph(target, "bwd", heads)
    assert {"split_kv_heads", "bias", "dbias", "alibi"} <= bwd.facts.features()
    # on cc 9.0 the wgmma backward serves them too (it walks whole K and V groups), the mma.sync one next
    assert bwd.available_engines()[: 2 if tname == "H200" else 1] == (
        ["SdpaBwdDslSm90", "SdpaBwdDslSm80"] if tname == "H200" else [f"SdpaBwdDsl{line}"]
    )


def test_combined_params_validate_name_and_order_their_arguments():
    from frost.engines.sm80.sdpa_bwd import kernel_name as bwd_name
    from frost.engines.sm80.sdpa_fwd import kernel_name as fwd_name

    p = Sm80FwdParams(
        **_mma_fwd(
            d=64,
            hq=8,
            hk=2,
            num_heads_v=4,
            has_bias=True,
            bias_per_head=True,
            has_alibi=True,
            has_window_right=True,
            has_lse=True,
            has_score_max=True,
            has_score_sum_exp=True,
        )
    )
    validate_fwd(p)
    assert fwd_name(p, "sm_80") == (
        "frost_sdpa_fwd_sm80_bf16_d64_h8k2v4_wr_biash_alibi_lse_smax_ssum_" + fwd_name(p, "sm_80").rsplit("_", 1)[1]
    )
    names = fwd_arg_names(p)
    assert names[4:7] == ["lse", "score_max", "score_sum_exp"]
    assert names.index("bias") == names.index("softmax_scale") - 1
    b = Sm80BwdParams(
        **_mma_bwd(
            d=64,
            hq=6,
            hk=6,
            num_heads_v=1,
            has_bias=True,
            bias_per_head=True,
            has_dbias=True,
            has_alibi=True,
            has_window_right=True,
        )
    )
    validate_bwd(b)
    assert (b.kv_grid_heads, b.walk_group) == (1, 6)
    assert "_h6k6v1_" in bwd_name(b, "sm_80") and "_biash_alibi_dbias_" in bwd_name(b, "sm_80")
    args = main_args(b)
    assert args.index("bias") + 1 == args.index("dbias") < args.index("dpsum")


# --- the reference engine against the oracle ------------------------------------------------------------------


def _split_inputs(case: Case, hv: int) -> dict:
    """The case's inputs with V (dense, (B, Hv, S, Dv)) of its own head count."""
    t = make_inputs(case)
    gen = torch.Generator().manual_seed(case.seed + 1)
    t["v"] = torch.randn(case.batch, hv, case.skv, case.head_dim_v, generator=gen).to(case.dtype)
    return t


SPLIT_CASES = {
    "k-finer-bias-alibi": (Case(hq=6, hkv=6, bias="h", alibi=True, mask=CAUSAL), 1),
    "v-finer-bias-bcast-padding": (
        Case(hq=8, hkv=2, bias="b", sq=8, skv=9, lens_q=(5, 8), lens_kv=(9, 2), mask=CAUSAL),
        4,
    ),
}


@pytest.mark.parametrize("name", list(SPLIT_CASES))
def test_split_heads_with_score_mods_forward_matches_oracle(name):
    case, hv = SPLIT_CASES[name]
    assert_fwd_matches_oracle(name, case, _split_inputs(case, hv))


@pytest.mark.parametrize("name", list(SPLIT_CASES))
def test_split_heads_with_score_mods_backward_matches_autograd(name):
    case, hv = SPLIT_CASES[name]
    _, got, want = assert_bwd_matches_oracle(name, case, dbias=True, t=_split_inputs(case, hv))
    for g, w, what in zip(got[:3], want[2:5], ("dQ", "dK", "dV")):
        assert g.shape == w.shape, what
    assert_close(got[4], want[6], rtol=1e-5, atol=1e-6, what=f"{name} dBias")


def test_row_stats_take_the_max_of_the_final_logits():
    """score_max / score_sum_exp with a bias and ALiBi (and K and V heads apart): the max of the biased logits,
    so Stats = score_max + log(score_sum_exp) still holds, and a large bias moves the max."""
    b, hq, hk, hv, s, d = 2, 4, 2, 1, 6, 8
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(b, hq, s, d, generator=gen), torch.randn(b, hk, s, d, generator=gen)
    v = torch.randn(b, hv, s, d, generator=gen)
    bias = torch.randn(1, hq, s, s, generator=gen) * 4
    g = frost.pygraph(io_data_type=frost.data_type.FLOAT)
    qh, kh, vh = g.tensor(q.shape), g.tensor(k.shape), g.tensor(v.shape)
    bh = g.tensor(bias.shape)
    mx, se = (g.tensor((b, hq, s, 1), data_type=frost.data_type.FLOAT) for _ in range(2))
    o, st = g.sdpa(
        qh,
        kh,
        vh,
        attn_scale=0.5,
        generate_stats=True,
        use_causal_mask=True,
        bias=bh,
        use_alibi_mask=True,
        score_max=mx,
        score_sum_exp=se,
    )
    o.set_output(True)
    st.set_output(True)
    g.validate()
    g.build_plans()
    outs = {
        o: torch.full((b, hq, s, d), float("nan")),
        st: torch.full((b, hq, s, 1), float("nan")),
        mx: torch.full((b, hq, s, 1), float("nan")),
        se: torch.full((b, hq, s, 1), float("nan")),
    }
    g.execute({qh: q, kh: k, vh: v, bh: bias, **outs}, None)
    ro, rl, rmax, rsum = oracle.attention(q, k, v, scale=0.5, bias=bias, alibi=True, causal=True, row_stats=True)
    for got, want in ((outs[o], ro), (outs[st][..., 0], rl), (outs[mx][..., 0], rmax), (outs[se][..., 0], rsum)):
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    plain = oracle.attention(q, k, v, scale=0.5, causal=True, row_stats=True)[2]
    assert not torch.allclose(rmax, plain)
    torch.testing.assert_close(rmax + rsum.log(), rl)
