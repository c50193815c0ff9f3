"""Which engines accept which graphs on the fake targets, in which order, and why the others decline."""

from __future__ import annotations

import importlib

import pytest
import torch

import frost
from frost.engines import dsl
from frost.target import CPU, FAKE_TARGETS, fake_target
from frost.errors import EngineDecline, NotSupportedError
from frost.lowering import capabilities
from frost.lowering.lower import REFERENCE_ON_GPU
from test.conftest import patch_dsl_reason

A100, H200, B200, RTX5090 = (fake_target(n) for n in ("A100", "H200", "B200", "RTX5090"))
TARGETS = {"A100": A100, "H200": H200, "B200": B200, "RTX5090": RTX5090, "CPU": CPU}
FWD = ["SdpaFwdDslSm90", "SdpaFwdDslSm120", "SdpaFwdDslSm100", "SdpaFwdDslSm80", "SdpaFwdCudnn", "SdpaFwdReference"]
BWD = [n.replace("Fwd", "Bwd") for n in FWD]


def declare(
    target=H200,
    *,
    dtype="bf16",
    b=2,
    hq=4,
    hkv=4,
    hv=None,
    s=128,
    skv=None,
    d=64,
    dv=None,
    strides=None,
    thd=False,
    direction="fwd",
    graph=None,
    **kw,
) -> frost.Graph:
    """A validated graph declared from dims and strides only (no storage); `graph` may hold tensors `kw` names."""
    skv = skv or s
    dv = dv or d
    g = graph if graph is not None else frost.Graph(io_data_type=dtype, target=target)
    strides = strides or {}
    if thd:
        dims = {"q": (b * s, hq, d), "k": (b * skv, hkv, d), "v": (b * skv, hv or hkv, dv)}
    else:
        dims = {"q": (b, hq, s, d), "k": (b, hkv, skv, d), "v": (b, hv or hkv, skv, dv)}
    q, k, v = (g.tensor(name=r, dim=dims[r], stride=strides.get(r)) for r in ("q", "k", "v"))
    if thd:
        kw.update(
            cu_seq_len_q=g.tensor(name="cu_q", dim=(b + 1,), data_type="int32"),
            cu_seq_len_kv=g.tensor(name="cu_kv", dim=(b + 1,), data_type="int32"),
            max_seq_len_q=s,
            max_seq_len_kv=skv,
        )
    if direction == "fwd":
        gen_stats = kw.pop("generate_stats", True)
        o, stats = g.sdpa(q, k, v, attn_scale=0.125, generate_stats=gen_stats, **kw)
        o.set_output(True)
        if stats is not None:
            stats.set_output(True)
    else:
        o = g.tensor(name="o", dim=dims["q"][:-1] + (dv,))
        do = g.tensor(name="dO", dim=dims["q"][:-1] + (dv,))
        sdim = dims["q"][:-1] + (1,)
        stats = g.tensor(name="stats", dim=sdim, data_type="fp32")
        for t in g.sdpa_backward(q, k, v, o, do, stats, attn_scale=0.125, **kw):
            t.set_output(True)
    return g.build_operation_graph()


def reasons(g: frost.Graph) -> dict:
    return dict(g.declines())


# --- the real rows ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tname", list(TARGETS))
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_real_rows_decline_or_accept_for_their_stated_reason(tname, direction):
    """Every real row either accepts, or declines with its cc range, its pending reason or the DSL reason."""
    target = TARGETS[tname]
    g = declare(target, direction=direction)
    accepted, declined = g.available_engines(), reasons(g)
    rows = capabilities.rows_for(direction)
    assert sorted(accepted + list(declined)) == sorted(r.name for r in rows)
    for row in rows:
        in_range = row.cc_min <= target.cc <= row.cc_max
        if target.is_cpu:
            if row.serves_cpu:
                assert row.name in accepted
            else:
                assert declined[row.name] == "needs a CUDA GPU; this machine has none"
        elif not in_range:
            assert declined[row.name].startswith("serves compute capability ")
            assert f"is {target.cc_major}.{target.cc_minor}" in declined[row.name]
            assert target.name in declined[row.name]
        elif row.explicit_only_on_gpu:
            assert declined[row.name] == REFERENCE_ON_GPU
        elif row.pending:
            assert declined[row.name] == row.pending
            assert "not available yet" in row.pending or "not written yet" in row.pending
        else:  # a kernel that has landed: accepted, or declined by its adapter with a reason
            assert row.name in accepted or declined[row.name]


def test_real_pending_rows_say_so_on_h200(no_compile):
    g = declare(H200)
    declined = reasons(g)
    pending = [r for r in capabilities.rows_for("fwd") if r.pending and r.cc_min <= H200.cc <= r.cc_max]
    for row in pending:
        assert declined[row.name] == row.pending
    if not g.available_engines():
        with pytest.raises(NotSupportedError) as ei:
            g.build_plans()
        for row in pending:
            assert f"  - {row.name}: {row.pending}" in str(ei.value)


def test_reference_serves_the_cpu_with_real_rows():
    g = declare(CPU, dtype="fp32", d=80)
    assert g.available_engines() == ["SdpaFwdReference"]
    g.build_plans()
    assert g.engine_name == "SdpaFwdReference"
    assert g.get_workspace_size() == 0


# --- ranking with every kernel available -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tname, want",
    [
        ("H200", ["SdpaFwdDslSm90", "SdpaFwdDslSm80"]),
        ("A100", ["SdpaFwdDslSm80"]),
        ("RTX5090", ["SdpaFwdDslSm120"]),
        ("B200", []),
        ("CPU", ["SdpaFwdReference"]),
    ],
)
def test_order_per_target(unpended, no_compile, tname, want):
    g = declare(TARGETS[tname], dtype="fp32" if tname == "CPU" else "bf16", d=128)
    assert g.available_engines() == want
    declined = reasons(g)
    assert set(declined) == set(FWD) - set(want)


def test_h200_declines_in_detail(unpended):
    declined = reasons(declare(H200))
    assert declined["SdpaFwdDslSm120"] == (
        "serves compute capability 12.0-12.9; this device (NVIDIA H200 (fake)) is 9.0"
    )
    assert declined["SdpaFwdDslSm100"].startswith("serves compute capability 10.0-10.9;")
    assert declined["SdpaFwdReference"] == REFERENCE_ON_GPU
    assert "engine='reference'" in REFERENCE_ON_GPU


def test_a100_declines_sm90_by_cc(unpended):
    declined = reasons(declare(A100))
    assert declined["SdpaFwdDslSm90"] == (
        "serves compute capability 9.0; this device (NVIDIA A100-SXM4-80GB (fake)) is 8.0"
    )


def test_rtx5090_declines_sm80_by_cc(unpended):
    declined = reasons(declare(RTX5090))
    assert declined["SdpaFwdDslSm80"].startswith("serves compute capability 8.0-9.0;")
    assert "is 12.0" in declined["SdpaFwdDslSm80"]


def test_b200_sm100_adapter_declines_and_the_error_lists_everyone(unpended, no_compile):
    g = declare(B200)
    declined = reasons(g)
    assert declined["SdpaFwdDslSm100"] == "the SM100 (tcgen05 + TMEM) forward kernel is not written yet"
    with pytest.raises(NotSupportedError) as ei:
        g.build_plans()
    err = ei.value
    assert [name for name, _ in err.declines] == [n for n in FWD]  # ranked by priority, each with a reason
    msg = str(err)
    assert "NVIDIA B200 (fake)" in msg and "sdpa fwd (bf16, d=64x64" in msg
    for name, reason in err.declines:
        assert f"  - {name}: {reason}" in msg


def test_backward_lines_accept_or_say_their_kernels_are_missing(unpended, no_compile):
    for tname, line in (("H200", "Sm90"), ("A100", "Sm80"), ("RTX5090", "Sm120"), ("B200", "Sm100")):
        g = declare(TARGETS[tname], direction="bwd")
        name = f"SdpaBwdDsl{line}"
        if name in g.available_engines():
            continue
        reason = reasons(g)[name]
        assert "not available yet" in reason or "not written yet" in reason, reason
    declined = reasons(declare(B200, direction="bwd"))
    assert declined["SdpaBwdDslSm100"] == "the SM100 (tcgen05 + TMEM) backward kernel is not written yet"
    g = declare(H200, direction="bwd")
    assert g.available_engines() in (["SdpaBwdDslSm90", "SdpaBwdDslSm80"], ["SdpaBwdDslSm80"], ["SdpaBwdDslSm90"], [])
    assert reasons(g)["SdpaBwdReference"] == REFERENCE_ON_GPU


def test_backward_on_cpu_is_the_reference(unpended):
    g = declare(CPU, dtype="fp32", direction="bwd", use_deterministic_algorithm=True)
    assert g.available_engines() == ["SdpaBwdReference"]
    assert set(reasons(g)) == set(BWD) - {"SdpaBwdReference"}


def test_reference_is_never_silent_on_a_gpu_but_available_by_name(unpended, no_compile):
    for target in (A100, H200, B200, RTX5090):
        g = declare(target, dtype="fp32", d=80)
        assert g.available_engines() == []
        assert reasons(g)["SdpaFwdReference"] == REFERENCE_ON_GPU
        g.create_execution_plans(engine="reference")
        assert g.available_engines() == ["SdpaFwdReference"]
        assert g.declines() == []
        g.build_plans(engine="reference")
        assert g.engine_name == "SdpaFwdReference"


@pytest.mark.parametrize(
    "alias, full",
    [
        ("sm80", "SdpaFwdDslSm80"),
        ("SM90", "SdpaFwdDslSm90"),
        ("ref", "SdpaFwdReference"),
        ("SdpaFwdDslSm80", "SdpaFwdDslSm80"),
    ],
)
def test_engine_by_name_restricts_the_ranking(unpended, alias, full):
    g = declare(H200).create_execution_plans(engine=alias)
    assert g.available_engines() == [full]


def test_engine_by_name_on_the_wrong_target_names_why(unpended, no_compile):
    g = declare(A100)
    with pytest.raises(NotSupportedError) as ei:
        g.build_plans(engine="sm90")
    assert ei.value.declines == [
        ("SdpaFwdDslSm90", "serves compute capability 9.0; this device (NVIDIA A100-SXM4-80GB (fake)) is 8.0")
    ]


# --- what the rows judge -----------------------------------------------------------------------------------------


def test_dtype(unpended):
    declined = reasons(declare(H200, dtype="fp32"))
    assert declined["SdpaFwdDslSm90"] == "serves bf16/fp16, not fp32"
    assert declined["SdpaFwdDslSm80"] == "serves bf16/fp16, not fp32"
    assert declare(H200, dtype=torch.float16).available_engines() == ["SdpaFwdDslSm90", "SdpaFwdDslSm80"]


BOTH = ["SdpaFwdDslSm90", "SdpaFwdDslSm80"]


@pytest.mark.parametrize(
    "d, dv, engines",
    [
        (64, None, BOTH),
        (96, None, BOTH),
        (128, None, BOTH),
        (192, 128, BOTH),
        (256, None, BOTH),
        (192, None, BOTH),
        # every multiple of 8 up to 256, d_qk and d_v independently: both lines (the wgmma one on padded tiles)
        (80, None, BOTH),
        (128, 64, BOTH),
        (32, None, BOTH),
        (8, None, BOTH),
        (72, None, BOTH),
        (192, 64, BOTH),
        (40, 200, BOTH),
        (112, None, BOTH),
        # either above 256 (up to 1024; d_v above 256 in column slices of O): the wgmma forward alone
        (320, 128, ["SdpaFwdDslSm90"]),
        (512, 256, ["SdpaFwdDslSm90"]),
        (264, 8, ["SdpaFwdDslSm90"]),
        (520, 128, ["SdpaFwdDslSm90"]),
        (264, None, ["SdpaFwdDslSm90"]),
        (64, 520, ["SdpaFwdDslSm90"]),
        (1024, None, ["SdpaFwdDslSm90"]),
        (100, None, []),
        (128, 12, []),
        (1032, 128, []),
        (128, 1040, []),
    ],
)
def test_head_dims(unpended, d, dv, engines):
    g = declare(H200, d=d, dv=dv)
    assert g.available_engines() == engines
    mma_sync = "serves head dims every multiple of 8 up to 256 (d_qk and d_v independently)"
    wgmma = "serves head dims every multiple of 8 up to 1024 (d_qk and d_v independently)"
    graph = f"this graph has d_qk={d}, d_v={dv or d}"
    if "SdpaFwdDslSm80" not in engines:
        why = {100: "d_qk is not a multiple of 8", 12: "d_v is not a multiple of 8"}.get(dv or d)
        why = why or ("d_qk is above 256" if d > 256 else "d_v is above 256")
        assert reasons(g)["SdpaFwdDslSm80"] == f"{mma_sync}; {graph} ({why})"
    if "SdpaFwdDslSm90" not in engines:
        why = {
            (100, None): "d_qk is not a multiple of 8",
            (128, 12): "d_v is not a multiple of 8",
            (1032, 128): "d_qk is above 1024",
            (128, 1040): "d_v is above 1024",
        }[d, dv]
        assert reasons(g)["SdpaFwdDslSm90"] == f"{wgmma}; {graph} ({why})"


@pytest.mark.parametrize("tname", ["A100", "H200", "RTX5090"])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize(
    "d, dv",
    [
        (32, 32),
        (48, 48),
        (72, 72),
        (80, 80),
        (112, 112),
        (160, 160),
        (192, 64),
        (40, 40),
        (8, 8),
        (256, 64),
        (64, 256),
        (136, 128),
    ],
)
def test_every_multiple_of_8_head_dim_plans_on_the_dsl_lines(unpended, no_compile, tname, direction, d, dv):
    """cuDNN's head dims (multiples of 8 up to 256) plan on the mma.sync engine of each target, with valid
    params, dense and packed, and on H200 on the wgmma forward and backward first (their tiles padded to
    16-element steps)."""
    from frost.knobs import Knobs

    target = TARGETS[tname]
    for thd in (False, True):
        g = declare(target, d=d, dv=dv, direction=direction, thd=thd, use_causal_mask=True)
        line = "Sm120" if tname == "RTX5090" else "Sm80"
        name = f"Sdpa{direction.capitalize()}Dsl{line}"
        names = [name]
        if tname == "H200":  # the wgmma engines serve them too, ranked first
            names = [f"Sdpa{direction.capitalize()}DslSm90", name]
        assert g.available_engines() == names, reasons(g)
        for engine in names:
            row = next(r for r in capabilities.rows_for(direction) if r.name == engine)
            adapter = importlib.import_module(row.adapter.split(":")[0])
            adapter_cls = getattr(adapter, row.adapter.split(":")[1])
            params = adapter_cls(g.facts, target, Knobs()).validated_params()
            assert (params.head_dim, params.head_dim_v) == (d, dv)
            if engine.endswith("Sm90"):  # the wgmma tiles pad to 16-element steps (32 where warpgroups split them)
                assert params.tile_head_dim >= d and params.tile_head_dim_v >= dv
                assert params.tile_head_dim % 16 == 0 and params.tile_head_dim_v % 16 == 0
            else:
                assert params.tile_head_dim == -(-d // 32) * 32 and params.tile_head_dim_v == -(-dv // 32) * 32


@pytest.mark.parametrize("d, dv", [(80, 80), (112, 112), (72, 40), (320, 128), (512, 256)])
def test_h200_forward_plans_the_wgmma_engine_at_padded_and_wide_head_dims(unpended, no_compile, d, dv):
    """On a cc 9.0 target the wgmma forward ranks first at these dims and plans with its default knobs."""
    from frost.adapters.sm90 import SdpaFwdDslSm90
    from frost.engines.sm90.sdpa_fwd_params import default_knobs
    from frost.knobs import Knobs

    g = declare(H200, d=d, dv=dv, use_causal_mask=True)
    assert g.available_engines()[0] == "SdpaFwdDslSm90"
    params = SdpaFwdDslSm90(g.facts, H200, Knobs()).validated_params()
    knobs = default_knobs(d, dv, sm_count=H200.sm_count)
    assert {k: getattr(params, k) for k in knobs} == knobs


def test_sm90_forward_row_and_validator_agree_on_every_head_dim():
    """The wgmma forward's row states its template's span: every pair it accepts has default knobs that
    validate; every pair it declines the validator rejects, naming the dim."""
    from frost.engines.sm90 import sdpa_fwd_params as fwd
    from frost.errors import TemplateParamsError

    span = capabilities.SM90_FWD_HEAD_DIMS
    assert span == fwd.HEAD_DIMS
    for d in range(4, 530, 4):
        for dv in (8, 12, 40, 64, 72, 200, 256, 264):
            if span.outside(d, dv) is None:
                fwd.validate(fwd.Sm90FwdParams(head_dim=d, head_dim_v=dv, **fwd.default_knobs(d, dv)))
            else:
                with pytest.raises(TemplateParamsError):
                    fwd.default_knobs(d, dv)
                with pytest.raises(TemplateParamsError, match=r"d_(qk|v)=\d+ is (not a multiple of 8|above)"):
                    fwd.validate(fwd.Sm90FwdParams(head_dim=d, head_dim_v=dv))


def test_mma_sync_rows_and_validators_agree_on_every_head_dim():
    """The capability rows' head-dim span is the templates' own: every pair a row accepts has default knobs
    that validate, forward and backward, in both families; every pair it declines the validators reject."""
    from frost.engines.sm80 import sdpa_bwd_knobs, sdpa_bwd_params as bwd
    from frost.engines.sm80 import sdpa_fwd_params as fwd
    from frost.errors import TemplateParamsError

    span = capabilities.MMA_SYNC_HEAD_DIMS
    for d in range(4, 272, 4):
        for dv in (8, 12, 64, 72, 160, 256, 264):
            served = d % span.multiple == 0 and dv % span.multiple == 0 and max(d, dv) <= span.maximum
            for family in ("sm80", "sm120"):
                for mod, knobs, cls in ((fwd, fwd, fwd.Sm80FwdParams), (bwd, sdpa_bwd_knobs, bwd.Sm80BwdParams)):
                    if served:
                        mod.validate(
                            cls(family=family, head_dim=d, head_dim_v=dv, **knobs.default_knobs(family, d, dv))
                        )
                    else:
                        with pytest.raises(TemplateParamsError):
                            knobs.default_knobs(family, d, dv)
                        with pytest.raises(TemplateParamsError):
                            mod.validate(cls(family=family, head_dim=d, head_dim_v=dv))


@pytest.mark.parametrize(
    "kw, feature",
    [
        (dict(score_mod=lambda s: s), "score_mod"),
    ],
)
def test_undeclared_features_decline_everywhere(unpended, kw, feature):
    for target in (H200, A100, RTX5090, B200):
        g = declare(target, **kw)
        assert g.available_engines() == []
        for name, reason in g.declines():
            assert reason == f"does not serve {feature}" or reason.startswith("serves compute capability"), (
                name,
                reason,
            )
        assert reasons(g)["SdpaFwdReference"] == f"does not serve {feature}"
    g = declare(CPU, dtype="fp32", **kw)
    with pytest.raises(NotSupportedError) as ei:
        g.check_support()
    assert dict(ei.value.declines)["SdpaFwdReference"] == f"does not serve {feature}"


def test_bias_and_attn_mask_decline_listing_both(unpended):
    g = frost.Graph(io_data_type="bf16", target=H200)
    q, k, v = (g.tensor(name=n, dim=(1, 2, 64, 64)) for n in "qkv")
    bias = g.tensor(name="bias", dim=(1, 2, 64, 64))
    amask = g.tensor(name="mask", dim=(1, 1, 64, 64), data_type="bool")
    o, _ = g.sdpa(q, k, v, bias=bias, attn_mask=amask)
    o.set_output(True)
    declined = reasons(g.build_operation_graph())
    assert declined["SdpaFwdDslSm90"] == "does not serve attn_mask"  # the wgmma forward reads the bias too
    assert declined["SdpaFwdDslSm80"] == "does not serve attn_mask"  # the mma.sync kernels read the bias


@pytest.mark.parametrize(
    "kw",
    [
        dict(use_causal_mask=True),
        dict(use_causal_mask_bottom_right=True, skv=256),
        dict(sliding_window_length=32),
        dict(diagonal_band_right_bound=4),
        dict(hkv=1),
        dict(hkv=2),
        dict(generate_stats=False),
        dict(thd=True),
        dict(thd=True, use_causal_mask=True, hkv=2),
    ],
)
def test_kernel_features_are_accepted(unpended, kw):
    assert declare(H200, **kw).available_engines() == ["SdpaFwdDslSm90", "SdpaFwdDslSm80"]


def test_sinks_and_padding_are_accepted(unpended):
    g = frost.Graph(io_data_type="bf16", target=H200)
    q, k, v = (g.tensor(name=n, dim=(2, 4, 64, 64)) for n in "qkv")
    sink = g.tensor(name="sink", dim=(4,), data_type="fp32")
    lq, lk = (g.tensor(name=n, dim=(2, 1, 1, 1), data_type="int32") for n in ("lq", "lk"))
    o, _ = g.sdpa(q, k, v, sink_token=sink, use_padding_mask=True, seq_len_q=lq, seq_len_kv=lk)
    o.set_output(True)
    g.validate()
    assert {"sinks", "padding"} <= g.facts.features()
    assert g.available_engines() == ["SdpaFwdDslSm90", "SdpaFwdDslSm80"]


# --- layouts --------------------------------------------------------------------------------------------------


def test_strides_not_16_byte_multiples_decline_naming_the_tensor(unpended):
    # q's token stride 68 elements (136 bytes) is not a multiple of 8 bf16 elements
    strides = {"q": (4 * 128 * 68, 128 * 68, 68, 1)}
    g = declare(H200, strides=strides, s=128, d=64)
    declined = reasons(g)
    assert g.available_engines() == []
    reason = declined["SdpaFwdDslSm90"]
    assert reason.startswith("tensor 'q' has strides (34816, 8704, 68, 1) (dim (2, 4, 128, 64))")
    assert "multiple of 8 elements (16-byte vector loads), and 68 is not" in reason
    assert declined["SdpaFwdDslSm80"] == reason


def test_fp16_v_stride_named(unpended):
    strides = {"v": (4 * 128 * 72 + 4, 128 * 72, 72, 1)}  # batch stride not a multiple of 8
    g = declare(H200, dtype="fp16", strides=strides)
    reason = reasons(g)["SdpaFwdDslSm90"]
    assert reason.startswith("tensor 'v' has strides") and "36868 is not" in reason


def test_padded_but_aligned_and_bshd_strides_are_accepted(unpended):
    h, s, d = 4, 128, 64
    bshd = (s * h * d, d, h * d, 1)
    padded = (h * s * 72, s * 72, 72, 1)
    g = declare(H200, strides={"q": bshd, "k": padded, "v": bshd})
    assert g.available_engines() == ["SdpaFwdDslSm90", "SdpaFwdDslSm80"]


def test_size_one_dims_may_have_any_stride(unpended):
    g = declare(H200, b=1, s=1, hq=1, hkv=1, strides={"q": (7, 64, 5, 1), "k": (3, 3, 3, 1)})
    assert g.available_engines() == ["SdpaFwdDslSm90", "SdpaFwdDslSm80"]


def test_the_reference_takes_any_layout_on_cpu(unpended):
    strides = {"q": (4 * 16 * 13, 16 * 13, 13, 1)}
    g = declare(CPU, dtype="fp32", s=16, d=8, strides=strides)
    assert g.available_engines() == ["SdpaFwdReference"]


# --- knobs ---------------------------------------------------------------------------------------------------


def test_knob_outside_every_choice_makes_every_line_ineligible(unpended):
    g = declare(H200).create_execution_plans(knobs=frost.Knobs(tile_m=96))
    declined = reasons(g)
    assert g.available_engines() == []
    assert declined["SdpaFwdDslSm90"] == "knob tile_m=96 is not one of (64, 128, 192)"
    assert declined["SdpaFwdDslSm80"] == "knob tile_m=96 is not one of (64, 128)"


def test_knob_honored_by_one_line_only(unpended):
    g = declare(H200).create_execution_plans(knobs=frost.Knobs(tile_m=192))
    assert g.available_engines() == ["SdpaFwdDslSm90"]
    g = declare(H200).create_execution_plans(knobs={"num_warps": 8})
    assert g.available_engines() == ["SdpaFwdDslSm80"]
    assert reasons(g)["SdpaFwdDslSm90"] == "has no knob 'num_warps' (requested 8)"


def test_knobs_and_the_reference(unpended):
    g = declare(CPU, dtype="fp32").create_execution_plans(knobs={"tile_n": 64})
    assert g.available_engines() == []
    assert reasons(g)["SdpaFwdReference"] == "has no knob 'tile_n' (requested 64)"


def test_unknown_knob_is_a_frost_error(unpended):
    g = declare(H200)
    with pytest.raises(frost.GraphError, match="tile_k"):
        g.create_execution_plans(knobs={"tile_k": 64})


# --- the DSL itself ------------------------------------------------------------------------------------------


def test_missing_dsl_declines_the_dsl_lines_naming_the_version(unpended, monkeypatch):
    patch_dsl_reason(monkeypatch, "needs nvidia-cutlass-dsl >= 4.8.1; found 4.7.0")
    g = declare(H200)
    assert g.available_engines() == []
    declined = reasons(g)
    assert declined["SdpaFwdDslSm90"] == "needs nvidia-cutlass-dsl >= 4.8.1; found 4.7.0"
    assert declined["SdpaFwdDslSm80"] == "needs nvidia-cutlass-dsl >= 4.8.1; found 4.7.0"


@pytest.mark.parametrize(
    "versions, fragment",
    [
        ({}, "needs nvidia-cutlass-dsl >= 4.8.1, which is not installed"),
        ({"nvidia-cutlass-dsl": "4.7.2"}, "needs nvidia-cutlass-dsl >= 4.8.1; found 4.7.2"),
        ({"nvidia-cutlass-dsl": "4.8.0.dev1"}, "found 4.8.0.dev1"),
        ({"nvidia-cutlass-dsl": "4.8.1"}, "needs apache-tvm-ffi, which is not installed"),
        ({"nvidia-cutlass-dsl": "4.8.1", "apache-tvm-ffi": "0.1.15"}, None),
        ({"nvidia-cutlass-dsl": "4.10.0", "apache-tvm-ffi": "0.1.15"}, None),
    ],
)
def test_dsl_decline_reason_from_metadata(monkeypatch, versions, fragment):
    from importlib import metadata

    def version(name):
        if name in versions:
            return versions[name]
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(dsl.metadata, "version", version)
    dsl.dsl_decline_reason.cache_clear()
    try:
        reason = dsl.dsl_decline_reason()
    finally:
        dsl.dsl_decline_reason.cache_clear()
    if fragment is None:
        assert reason is None
    else:
        assert fragment in reason


# --- errors and contracts ------------------------------------------------------------------------------------


def test_error_types():
    assert issubclass(EngineDecline, NotImplementedError) and issubclass(EngineDecline, frost.FrostError)
    assert issubclass(NotSupportedError, NotImplementedError) and issubclass(NotSupportedError, frost.FrostError)
    e = EngineDecline("SdpaFwdDslSm100", "why not")
    assert (e.engine, e.reason, str(e)) == ("SdpaFwdDslSm100", "why not", "SdpaFwdDslSm100: why not")
    n = NotSupportedError("thing", [("a", "x"), ("b", "y")])
    assert n.declines == [("a", "x"), ("b", "y")]
    assert str(n) == "no engine can serve thing:\n  - a: x\n  - b: y"


def test_ranking_never_compiles(unpended, no_compile):
    for target in FAKE_TARGETS.values():
        g = declare(target)
        g.available_engines()
        g.check_support() if g.available_engines() else None


def test_priorities_put_the_native_line_first():
    rows = {r.name: r for r in capabilities.ROWS}
    assert rows["SdpaFwdDslSm90"].priority < rows["SdpaFwdDslSm80"].priority < rows["SdpaFwdReference"].priority
    assert rows["SdpaFwdDslSm80"].cc_max == (9, 0)  # SM80 is the fallback below SM90 on Hopper
    for r in capabilities.ROWS:
        assert r.direction in r.name.lower()


def test_facts_features_and_band():
    g = declare(CPU, dtype="fp32", use_causal_mask_bottom_right=True, sliding_window_length=5, hkv=2)
    f = g.facts
    assert (f.window_left, f.window_right, f.bottom_right, f.is_causal) == (4, 0, True, True)
    assert f.features() == {"causal", "window_left", "bottom_right", "gqa", "stats"}
    g = declare(CPU, dtype="fp32", diagonal_band_right_bound=3, diagonal_alignment="BOTTOM_RIGHT")
    assert (g.facts.window_left, g.facts.window_right, g.facts.is_causal) == (None, 3, False)
    assert g.facts.features() == {"window_right", "bottom_right", "stats"}
    g = declare(CPU, dtype="fp32", diagonal_alignment="BOTTOM_RIGHT")
    assert "bottom_right" not in g.facts.features()  # an alignment without a band changes nothing


def test_h200_backward_ranks_the_wgmma_chain_first_and_the_mma_sync_chain_serves_the_rest(unpended, no_compile):
    g = declare(H200, direction="bwd", hq=8, hkv=2, d=128, use_causal_mask=True)
    assert g.available_engines()[:2] == ["SdpaBwdDslSm90", "SdpaBwdDslSm80"]
    g = declare(H200, direction="bwd", use_deterministic_algorithm=True, use_causal_mask=True)
    assert g.available_engines()[:2] == ["SdpaBwdDslSm90", "SdpaBwdDslSm80"]
    g = declare(H200, direction="bwd", thd=True, use_causal_mask=True)
    assert g.available_engines()[:2] == ["SdpaBwdDslSm90", "SdpaBwdDslSm80"]
    g = declare(H200, direction="bwd", d=256)
    assert g.available_engines()[:2] == ["SdpaBwdDslSm90", "SdpaBwdDslSm80"]  # shared keys above d=128
    g = declare(H200, direction="bwd", d=160)
    assert g.available_engines()[:2] == ["SdpaBwdDslSm90", "SdpaBwdDslSm80"]  # every multiple of 8 up to 256
    g = declare(H200, direction="bwd", d=100)
    assert "head dims" in reasons(g)["SdpaBwdDslSm90"]
    g = declare(H200, direction="bwd").create_execution_plans(engine="sm80")
    assert g.available_engines() == ["SdpaBwdDslSm80"]  # the mma.sync chain stays available by name


def test_a_requested_rotated_order_plans_with_the_targets_sm_count(unpended, no_compile):
    """det_order is a knob of the wgmma backward: honored where it applies (deterministic, no band), with the
    target's SM count; a band declines the engine (requested knobs are honored or the engine is ineligible)."""
    from frost.adapters.sm90 import SdpaBwdDslSm90
    from frost.knobs import Knobs

    g = declare(H200, direction="bwd", d=128, use_deterministic_algorithm=True)
    p = SdpaBwdDslSm90(g.facts, H200, Knobs(det_order="rotated")).validated_params()
    assert p.det_order == "rotated" and p.sm_count == H200.sm_count
    g = declare(H200, direction="bwd", use_deterministic_algorithm=True, use_causal_mask=True)
    g.create_execution_plans(knobs=Knobs(det_order="rotated"))
    assert "SdpaBwdDslSm90" not in g.available_engines() and "window" in reasons(g)["SdpaBwdDslSm90"]


# --- cuDNN's ragged-offset form --------------------------------------------------------------------------------
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("target, lines", [("H200", ["Sm90", "Sm80"]), ("A100", ["Sm80"]), ("RTX5090", ["Sm120"])])
def test_ragged_graphs_plan_on_the_dsl_engines(direction, target, lines):
    from test.cpu.test_cudnn_vocabulary import B, D, H, HKV, SQ, _ragged

    g = _ragged(frost.Graph(target=TARGETS[target]), direction)
    kind = "Fwd" if direction == "fwd" else "Bwd"
    assert g.available_engines() == [f"Sdpa{kind}Dsl{line}" for line in lines]
    adapter = g._ranking.accepted[0][1]
    p = adapter.template_params()  # what the winner compiles: the ragged fields from the facts
    assert p.is_thd and p.has_seqused and p.ragged
    assert (p.token_div_q, p.token_div_kv, p.token_div_lse) == (H * D, HKV * D, H)
    assert (p.offset_dtype_q, p.offset_dtype_kv, p.offset_dtype_lse) == ("int64", "int32", "int32")
    assert not p.stats_per_batch
    # per-batch Stats (B, H, S, 1): no Stats offsets, read and written per batch
    g = _ragged(frost.Graph(target=TARGETS[target]), direction, stats_ragged=False)
    assert g.available_engines()[0] == f"Sdpa{kind}Dsl{lines[0]}"
    p = g._ranking.accepted[0][1].template_params()
    assert p.stats_per_batch and p.token_div_lse == 0
    assert adapter.facts.total_q == B * SQ  # the packed envelope the (B, H, S, D) tensors are viewed with


def test_ragged_tensors_with_offsets_of_their_own_plan_on_the_dsl_engines():
    """cuDNN's tests give every tensor its own offset tensor: the DSL kernels read each one's own (`own_offsets`)
    where it is not its group leader's (q's, k's) tensor over the same token stride."""
    from test.cpu.test_cudnn_vocabulary import B, D, H, _ragged

    g = _ragged(frost.Graph(target=H200))
    other = g.tensor((B + 1, 1, 1, 1), (1, 1, 1, 1), frost.data_type.INT64, name="off_o")
    g.node.o.set_ragged_offset(other)
    assert g.available_engines() == ["SdpaFwdDslSm90", "SdpaFwdDslSm80"]
    p = g._ranking.accepted[0][1].template_params()
    assert p.own_offsets == (("o", H * D, "int64"),)
    g = _ragged(frost.Graph(target=H200), "bwd")
    other = g.tensor((B + 1, 1, 1, 1), (1, 1, 1, 1), frost.data_type.INT64, name="off_o")
    for role in ("o", "dO"):
        getattr(g.node, role).set_ragged_offset(other)
    assert g.available_engines() == ["SdpaBwdDslSm90", "SdpaBwdDslSm80"]
    p = g._ranking.accepted[0][1].template_params()
    assert p.own_offsets == (("o", H * D, "int64"), ("do", H * D, "int64"))  # the preprocess reads both


def test_ragged_backward_with_dsink_plans_on_the_dsl_lines():
    from test.cpu.test_cudnn_vocabulary import H, _ragged

    g = frost.Graph(target=H200)
    sink = g.tensor((1, H, 1, 1), None, "fp32", name="sink")
    dsink = g.tensor((1, H, 1, 1), None, "fp32", name="dsink")
    _ragged(g, "bwd", sink_token=sink, dSink_token=dsink)
    assert g.available_engines() == ["SdpaBwdDslSm90", "SdpaBwdDslSm80"]
    p = g._ranking.accepted[0][1].template_params()
    assert p.has_dsinks and p.ragged


# --- K and V with their own head counts; score_max / score_sum_exp ------------------------------------------------


def _row_stats(target=H200, *, thd=False, b=2, hq=4, s=128, **kw) -> frost.Graph:
    """A forward declaring score_max and score_sum_exp (fp32, Stats' dims) beside Stats."""
    g = frost.Graph(io_data_type="bf16", target=target)
    dim = (b * s, hq, 1) if thd else (b, hq, s, 1)
    m, e = (g.tensor(name=n, dim=dim, data_type="fp32") for n in ("score_max", "score_sum_exp"))
    return declare(target, graph=g, thd=thd, b=b, hq=hq, s=s, score_max=m, score_sum_exp=e, **kw)


@pytest.mark.parametrize("heads", [dict(hq=6, hkv=6, hv=1), dict(hq=8, hkv=2, hv=4), dict(hq=8, hkv=8, hv=2)])
def test_split_kv_heads_run_on_the_dsl_forwards_and_both_backwards(unpended, no_compile, heads):
    g = declare(H200, **heads)
    assert g.facts.num_heads_kv == heads["hkv"] and g.facts.heads_v == heads["hv"]
    assert {"split_kv_heads", "gqa"} <= g.facts.features() and "unnested_kv_heads" not in g.facts.features()
    assert g.available_engines() == ["SdpaFwdDslSm90", "SdpaFwdDslSm80"]
    assert declare(A100, **heads).available_engines() == ["SdpaFwdDslSm80"]
    assert declare(RTX5090, **heads).available_engines() == ["SdpaFwdDslSm120"]
    assert declare(H200, thd=True, use_causal_mask=True, **heads).available_engines() == [
        "SdpaFwdDslSm90",
        "SdpaFwdDslSm80",
    ]
    for thd in (False, True):
        g = declare(H200, direction="bwd", thd=thd, use_causal_mask=True, **heads)
        assert g.available_engines() == ["SdpaBwdDslSm90", "SdpaBwdDslSm80"]  # the wgmma backward first on cc 9.0
        assert declare(A100, direction="bwd", thd=thd, **heads).available_engines() == ["SdpaBwdDslSm80"]
        assert declare(RTX5090, direction="bwd", thd=thd, **heads).available_engines() == ["SdpaBwdDslSm120"]


@pytest.mark.parametrize("heads", [dict(hq=12, hkv=4, hv=6), dict(hq=6, hkv=2, hv=3)])
def test_unnested_kv_heads_run_on_the_dsl_forwards_and_both_backwards(unpended, no_compile, heads):
    """K groups of 3 query heads and V groups of 2: neither count divides the other. Both backwards walk both
    groups whole (6 query heads per CTA)."""
    g = declare(H200, **heads)
    assert {"split_kv_heads", "unnested_kv_heads"} <= g.facts.features()
    assert g.available_engines() == ["SdpaFwdDslSm90", "SdpaFwdDslSm80"]
    for thd in (False, True):
        g = declare(H200, direction="bwd", thd=thd, use_causal_mask=True, **heads)
        assert g.available_engines() == ["SdpaBwdDslSm90", "SdpaBwdDslSm80"]
        assert declare(A100, direction="bwd", thd=thd, **heads).available_engines() == ["SdpaBwdDslSm80"]
        assert declare(RTX5090, direction="bwd", thd=thd, **heads).available_engines() == ["SdpaBwdDslSm120"]
    assert declare(CPU, dtype="fp32", direction="bwd", **heads).available_engines() == ["SdpaBwdReference"]


def test_split_kv_heads_on_the_cpu_and_cudnn_rows(unpended):
    for direction in ("fwd", "bwd"):
        g = declare(CPU, dtype="fp32", direction=direction, hq=6, hkv=6, hv=1)
        assert g.available_engines() == [f"Sdpa{direction.capitalize()}Reference"]
    assert "split_kv_heads" in capabilities.CUDNN_FEATURES  # cuDNN takes K's and V's dims as declared


def test_equal_head_counts_keep_the_facts_and_params_of_before():
    from frost.adapters.dsl import fwd_feature_flags

    f = declare(CPU, dtype="fp32", hq=8, hkv=2).facts
    assert (f.num_heads_kv, f.heads_v, f.split_kv_heads) == (2, 2, False)
    assert "split_kv_heads" not in f.features()
    assert fwd_feature_flags(f)["num_heads_v"] == 0  # one kernel, one key: the split compiles in only when declared
    f = declare(CPU, dtype="fp32", hq=8, hkv=2, hv=4).facts
    assert fwd_feature_flags(f)["num_heads_v"] == 4


@pytest.mark.parametrize("thd", [False, True])
def test_score_max_and_sum_exp_are_served_by_the_forwards(unpended, no_compile, thd):
    g = _row_stats(H200, thd=thd, use_causal_mask=True)
    assert {"score_max", "score_sum_exp"} <= g.facts.features()
    assert g.facts.has_score_max and g.facts.has_score_sum_exp
    assert g.available_engines() == ["SdpaFwdDslSm90", "SdpaFwdDslSm80"]
    assert _row_stats(A100, thd=thd).available_engines() == ["SdpaFwdDslSm80"]
    assert _row_stats(RTX5090, thd=thd).available_engines() == ["SdpaFwdDslSm120"]
    assert _row_stats(CPU, thd=thd).available_engines() == ["SdpaFwdReference"]
    assert _row_stats(H200, thd=thd, hq=8, hkv=2, hv=4, generate_stats=False).available_engines() == [
        "SdpaFwdDslSm90",
        "SdpaFwdDslSm80",
    ]


def test_score_outputs_are_outputs_bound_like_stats(unpended):
    g = _row_stats(H200)
    roles = g._roles()
    assert roles["score_max"].is_output and roles["score_sum_exp"].is_output
    assert "score_max" in g.node.outputs() and "score_max" not in g.node.inputs()
    assert g.facts.tensor("score_sum_exp").dim == (2, 4, 128, 1)


# --- split K/V heads and score_max / score_sum_exp beside cuDNN's ragged-offset form and the wgmma backward -------


def _ragged_split(direction="fwd", hv=4, dv=64):
    """cuDNN's ragged form (B=3, H=4, K heads 2, d=64) with V's own head count (its own offset array's token
    stride too; the split heads are what the DSL engines name first)."""
    from test.cpu.test_cudnn_vocabulary import B, D, H, HKV, SKV, SQ

    g = frost.Graph(target=H200)
    bf16 = frost.DataType.BFLOAT16
    off_q = g.tensor((B + 1, 1, 1, 1), (1, 1, 1, 1), frost.data_type.INT32, name="off_q")
    off_kv = g.tensor((B + 1, 1, 1, 1), (1, 1, 1, 1), frost.data_type.INT32, name="off_kv")
    off_v = g.tensor((B + 1, 1, 1, 1), (1, 1, 1, 1), frost.data_type.INT32, name="off_v")
    lq, lk = (g.tensor((B, 1, 1, 1), (1, 1, 1, 1), frost.data_type.INT32, name=n) for n in ("lq", "lk"))
    st_q = (SQ * H * D, D, H * D, 1)
    q = g.tensor((B, H, SQ, D), st_q, bf16, name="q", ragged_offset=off_q)
    k = g.tensor((B, HKV, SKV, D), (SKV * HKV * D, D, HKV * D, 1), bf16, name="k", ragged_offset=off_kv)
    v = g.tensor((B, hv, SKV, dv), (SKV * hv * dv, dv, hv * dv, 1), bf16, name="v", ragged_offset=off_v)
    common = dict(attn_scale=0.125, use_padding_mask=True, seq_len_q=lq, seq_len_kv=lk)
    st_o = (SQ * H * dv, dv, H * dv, 1)
    if direction == "fwd":
        o, _ = g.sdpa(q, k, v, generate_stats=False, name="sdpa", **common)
        o.set_output(True).set_dim((B, H, SQ, dv)).set_stride(st_o).set_ragged_offset(off_q)
        return g
    o = g.tensor((B, H, SQ, dv), st_o, bf16, name="o", ragged_offset=off_q)
    do = g.tensor((B, H, SQ, dv), st_o, bf16, name="dO", ragged_offset=off_q)
    stats = g.tensor((B, H, SQ, 1), (SQ * H, 1, H, 1), frost.DataType.FLOAT, name="stats")
    for grad, src in zip(g.sdpa_backward(q, k, v, o, do, stats, name="sdpa_backward", **common), (q, k, v)):
        grad.set_output(True).set_stride(src.stride).set_ragged_offset(src.ragged_offset)
    return g


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_split_kv_heads_in_the_ragged_form_plan_on_the_dsl_engines(unpended, direction):
    g = _ragged_split(direction).validate()
    assert g.facts.split_kv_heads and g.facts.ragged is not None
    kind = "Fwd" if direction == "fwd" else "Bwd"
    assert g.available_engines() == [f"Sdpa{kind}Dsl{line}" for line in ("Sm90", "Sm80")]
    p = g._ranking.accepted[0][1].template_params()
    assert p.num_heads_v == 4 and p.ragged
    assert dict((r, div) for r, div, _ in p.own_offsets)["v"] == 4 * p.head_dim_v  # V's own token stride


def test_score_outputs_in_the_ragged_form_plan_on_the_dsl_engines(unpended):
    """score_max / score_sum_exp in cuDNN's ragged form: all per batch with Stats, or all ragged (each reads its
    own offsets, as Stats reads lse_offsets); mixing the two is declined, naming them."""
    from test.cpu.test_cudnn_vocabulary import B, H, SQ, _ragged

    def graph(ragged_scores: bool, stats_ragged: bool):
        g = frost.Graph(target=H200)
        mx, se = (
            g.tensor((B, H, SQ, 1), (H * SQ, 1, H, 1), frost.DataType.FLOAT, name=n)
            for n in ("score_max", "score_sum_exp")
        )
        if ragged_scores:
            for t in (mx, se):
                t.set_ragged_offset(
                    g.tensor((B + 1, 1, 1, 1), (1, 1, 1, 1), frost.data_type.INT64, name=f"off_{t.name}")
                )
        return _ragged(g, score_max=mx, score_sum_exp=se, stats_ragged=stats_ragged).build_operation_graph()

    g = graph(False, False)
    assert g.available_engines() == ["SdpaFwdDslSm90", "SdpaFwdDslSm80"]
    p = g._ranking.accepted[0][1].template_params()
    assert p.stats_per_batch and p.has_score_max and not any(r.startswith("score") for r, _, _ in p.own_offsets)
    g = graph(True, True)
    assert g.available_engines() == ["SdpaFwdDslSm90", "SdpaFwdDslSm80"]
    p = g._ranking.accepted[0][1].template_params()
    assert p.token_div_lse == H and dict((r, d) for r, d, _ in p.own_offsets)["score_sum_exp"] == H
    g = graph(False, True)  # Stats ragged, the two halves per batch
    declined = reasons(g)
    for line in ("Sm90", "Sm80"):
        assert (
            "all ragged or all per batch; stats ragged, score_max, score_sum_exp per batch"
            in declined[f"SdpaFwdDsl{line}"]
        )
    assert g.build_plans(engine="reference").engine_name == "SdpaFwdReference"


def test_ragged_params_refuse_score_outputs_and_stray_own_offsets():
    from frost.engines.sm80.sdpa_fwd_params import Sm80FwdParams, validate
    from frost.errors import TemplateParamsError

    ragged = dict(
        num_heads_q=8,
        num_heads_kv=2,
        is_thd=True,
        has_seqused=True,
        token_div_q=8 * 128,
        token_div_kv=2 * 128,
        head_dim=128,
        head_dim_v=128,
    )
    validate(Sm80FwdParams(**ragged))
    validate(Sm80FwdParams(**ragged, num_heads_v=4, own_offsets=(("v", 4 * 128, "int32"),)))
    with pytest.raises(TemplateParamsError, match="belong to the ragged-offset form"):
        validate(
            Sm80FwdParams(**{**ragged, "token_div_q": 0, "has_seqused": False}, own_offsets=(("v", 512, "int32"),))
        )
    with pytest.raises(TemplateParamsError, match="in that order"):
        validate(Sm80FwdParams(**ragged, own_offsets=(("v", 512, "int32"), ("o", 1024, "int32"))))
    with pytest.raises(TemplateParamsError, match="divisor"):
        validate(Sm80FwdParams(**ragged, own_offsets=(("o", 0, "int32"),)))
    with pytest.raises(TemplateParamsError, match="a ragged score_max reads its own offsets"):
        validate(Sm80FwdParams(**ragged, has_score_max=True))
    validate(Sm80FwdParams(**ragged, has_score_max=True, own_offsets=(("score_max", 8, "int32"),)))


@pytest.mark.parametrize(
    "d, dv", [(80, 80), (112, 112), (72, 40), (128, 64), (64, 128), (192, 64), (160, 160), (8, 8), (256, 64)]
)
@pytest.mark.parametrize("thd", [False, True])
def test_h200_backward_plans_the_wgmma_chain_at_every_head_dim(unpended, no_compile, d, dv, thd):
    """cc 9.0: the wgmma backward takes every multiple of 8 up to 256, with valid params whose tiles span the
    head dims rounded up to its wgmma granule (16, 32 where two warpgroups split the columns)."""
    from frost.adapters.sm90 import SdpaBwdDslSm90
    from frost.knobs import Knobs

    g = declare(H200, direction="bwd", d=d, dv=dv, thd=thd, use_causal_mask=True)
    assert g.available_engines()[0] == "SdpaBwdDslSm90", reasons(g)
    params = SdpaBwdDslSm90(g.facts, H200, Knobs()).validated_params()
    assert (params.head_dim, params.head_dim_v) == (d, dv)
    assert params.tile_head_dim >= d and params.tile_head_dim % 16 == 0
    assert params.tile_head_dim_v >= dv and params.tile_head_dim_v % 16 == 0
    assert params.dq_fragments == (not thd and not params.padded)


def test_sm90_backward_row_and_validator_agree_on_every_head_dim():
    """The wgmma backward's row states its template's span: every pair it accepts has default knobs that validate
    (dense and packed, with and without a right bound); every pair it declines the validator rejects."""
    from frost.engines.sm90 import sdpa_bwd_params as bwd
    from frost.engines.sm90.sdpa_bwd_knobs import default_knobs
    from frost.errors import TemplateParamsError

    span = capabilities.SM90_BWD_HEAD_DIMS
    assert span == bwd.HEAD_DIMS
    for d in range(4, 272, 4):
        for dv in range(4, 272, 4):
            served = span.outside(d, dv) is None
            for banded, packed in ((False, False), (True, False), (True, True)):
                p = bwd.Sm90BwdParams(
                    head_dim=d,
                    head_dim_v=dv,
                    has_window_right=banded,
                    is_thd=packed,
                    **default_knobs(d, dv, banded=banded, packed=packed),
                )
                if served:
                    bwd.validate(p)
                else:
                    with pytest.raises(TemplateParamsError, match="head dims"):
                        bwd.validate(p)


@pytest.mark.parametrize("d, dv", [(192, 128), (256, 256)])
def test_split_kv_heads_at_the_wgmma_backwards_wide_head_dims_plan_on_it(unpended, no_compile, d, dv):
    """Above d=128 (the warpgroups share 64 keys) the wgmma backward walks split heads too."""
    g = declare(H200, direction="bwd", d=d, dv=dv, hq=8, hkv=2, hv=4, use_causal_mask=True)
    assert g.available_engines() == ["SdpaBwdDslSm90", "SdpaBwdDslSm80"]
    assert g._ranking.accepted[0][1].template_params().walk_group == 4


def test_validate_reports_a_graph_no_engine_serves_as_cudnn_does():
    """cuDNN's validate() refuses graphs it cannot serve (cudnnGraphNotSupportedError), and cuDNN programs skip on
    it: frost's validate() ranks its engines and raises NotSupportedError (the same class) listing their reasons;
    a declaration error stays a GraphError, and cuDNN's own validate-time refusals are both."""
    g = frost.Graph(io_data_type="bf16", target=H200)
    q, k, v = (g.tensor(name=n, dim=(1, 2, 64, 1032)) for n in "qkv")
    o, _ = g.sdpa(q, k, v, generate_stats=False)
    o.set_output(True)
    with pytest.raises(frost.cudnnGraphNotSupportedError) as ei:
        g.validate()
    assert "d_qk is above 1024" in str(ei.value) and ei.value.declines
    assert g.build_plans(engine="reference").engine_name == "SdpaFwdReference"  # by name, after the refusal
    g = frost.Graph(io_data_type="bf16", target=H200)
    q, k, v = (g.tensor(name=n, dim=(1, 2, 64, 64)) for n in "qkv")
    o, _ = g.sdpa(q, k, v, generate_stats=False, use_alibi_mask=True, diagonal_band_right_bound=4)
    o.set_output(True)
    with pytest.raises(frost.cudnnGraphNotSupportedError, match="use_alibi_mask needs a causal mask") as ei:
        g.validate()
    assert isinstance(ei.value, frost.GraphError)


def test_deterministic_wgmma_backward_takes_the_rotated_order_without_a_band(unpended):
    """Measured on the H200: the rotated turn order costs 1-6% over the free order where the stair costs 3-16%;
    under a band (causal, windows) the stair stays."""
    g = declare(H200, direction="bwd", d=128, use_deterministic_algorithm=True)
    g.create_execution_plans()
    p = g._ranking.accepted[0][1].template_params()
    assert type(p).__name__ == "Sm90BwdParams" and p.det_order == "rotated" and p.sm_count == H200.sm_count
    g = declare(H200, direction="bwd", d=128, use_deterministic_algorithm=True, use_causal_mask=True)
    g.create_execution_plans()
    assert g._ranking.accepted[0][1].template_params().det_order == "stair"
    g = declare(H200, direction="bwd", d=128)
    g.create_execution_plans()
    assert g._ranking.accepted[0][1].template_params().det_order == "stair"  # no turns at all


def test_cudnns_call_sequence_ranks_the_engines_once(unpended, monkeypatch):
    """validate() ranks (as cuDNN's reports unsupported graphs there); create_execution_plans and check_support
    after it reuse that ranking unless an engine or knobs are asked for."""
    import frost.lowering.lower as lower

    calls = []
    real = lower.rank
    monkeypatch.setattr(lower, "rank", lambda *a, **k: calls.append(1) or real(*a, **k))
    g = declare(H200)
    g.validate().build_operation_graph().create_execution_plans([frost.heur_mode.A]).check_support()
    assert len(calls) == 1
    g.create_execution_plans(engine="sm80")
    assert len(calls) == 2 and g.available_engines() == ["SdpaFwdDslSm80"]
