"""Property tests: random valid graphs match the oracle; one perturbed field gives a frost error, never a crash."""

from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import frost
from frost.target import CPU, fake_target
from test.helpers import Case, assert_close, make_inputs, oracle_bwd, oracle_fwd, run_bwd, run_fwd, sdpa_keywords

# FROST_HYPOTHESIS_EXAMPLES raises the example count for a deeper local search
SETTINGS = settings(
    max_examples=int(os.environ.get("FROST_HYPOTHESIS_EXAMPLES", "60")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

MASKS = st.sampled_from(
    [
        (),
        (("use_causal_mask", True),),
        (("use_causal_mask_bottom_right", True),),
        "window",
        "window-causal",
        "window-causal-br",
        "band",
        "right-only",
    ]
)


@st.composite
def mask_keywords(draw):
    kind = draw(MASKS)
    if isinstance(kind, tuple):
        return kind
    w = draw(st.integers(1, 5))
    if kind == "window":
        return (("sliding_window_length", w),)
    if kind == "window-causal":
        return (("sliding_window_length", w), ("use_causal_mask", True))
    if kind == "window-causal-br":
        return (("diagonal_band_left_bound", w), ("use_causal_mask_bottom_right", True))
    align = draw(st.sampled_from(["TOP_LEFT", "BOTTOM_RIGHT"]))
    right = draw(st.integers(0, 4))
    if kind == "band":
        return (("diagonal_band_left_bound", w), ("diagonal_band_right_bound", right), ("diagonal_alignment", align))
    return (("diagonal_band_right_bound", right), ("diagonal_alignment", align))


@st.composite
def cases(draw, allow_bf16=False) -> Case:
    batch = draw(st.integers(1, 3))
    hkv = draw(st.integers(1, 2))
    hq = hkv * draw(st.sampled_from([1, 2, 3]))
    d = draw(st.sampled_from([4, 8]))
    dv = draw(st.sampled_from([None, None, 4, 12]))
    thd = draw(st.booleans())
    kw = dict(
        batch=batch,
        hq=hq,
        hkv=hkv,
        d=d,
        dv=dv,
        thd=thd,
        mask=draw(mask_keywords()),
        sink=draw(st.booleans()),
        sink_4d=draw(st.booleans()),
        stats=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )
    scale = draw(st.sampled_from([None, "omit", 0.3, 1.7]))
    if scale == "omit":
        kw["omit_scale"] = True
    else:
        kw["scale"] = scale
    if allow_bf16 and draw(st.integers(0, 4)) == 0:
        kw["dtype"] = torch.bfloat16
    if thd:
        lens = st.lists(st.integers(0, 6), min_size=batch, max_size=batch).map(tuple)
        kw["lens_q"], kw["lens_kv"] = draw(lens), draw(lens)
        kw["extra_q"] = draw(st.integers(0 if sum(kw["lens_q"]) else 1, 2))
        kw["extra_kv"] = draw(st.integers(0 if sum(kw["lens_kv"]) else 1, 2))
        kw["stats_head_major"] = draw(st.booleans())
    else:
        sq, skv = draw(st.integers(1, 7)), draw(st.integers(1, 7))
        kw.update(sq=sq, skv=skv, layout=draw(st.sampled_from(["bhsd", "bshd"])))
        if draw(st.booleans()):
            kw["lens_q"] = tuple(draw(st.integers(0, sq)) for _ in range(batch))
            kw["lens_kv"] = tuple(draw(st.integers(0, skv)) for _ in range(batch))
    return Case(**kw)


@SETTINGS
@given(case=cases(allow_bf16=True), backward=st.integers(0, 2))
def test_random_valid_graphs_match_the_oracle(case, backward):
    t = make_inputs(case)
    o, stats = run_fwd(case, t)
    want_o, want_lse = oracle_fwd(case, t)
    tol = dict(rtol=2e-2, atol=2e-2) if case.dtype == torch.bfloat16 else dict(rtol=1e-6, atol=1e-6)
    assert_close(o, want_o, what="O", **tol)
    if case.stats:
        assert_close(stats, want_lse, what="Stats", rtol=1e-4, atol=1e-4)
    if backward == 0 and case.dtype == torch.float32:
        dq, dk, dv, dsink = run_bwd(case, t)
        _, _, want_dq, want_dk, want_dv, want_dsink = oracle_bwd(case, t)
        for got, want, what in (
            (dq, want_dq, "dQ"),
            (dk, want_dk, "dK"),
            (dv, want_dv, "dV"),
            (dsink, want_dsink, "dSink"),
        ):
            if want is not None:
                assert_close(got, want, rtol=1e-5, atol=1e-6, what=what)


# --- perturbations -------------------------------------------------------------------------------------------

INPUT_ROLES = ("q", "k", "v", "cu_seq_len_q", "cu_seq_len_kv", "seq_len_q", "seq_len_kv", "sink")
DTYPES = ["fp16", "bf16", "fp32", "fp64", "int32", "int64", "uint8", "bool"]
INT_KEYWORDS = (
    "diagonal_band_left_bound",
    "diagonal_band_right_bound",
    "sliding_window_length",
    "max_seq_len_q",
    "max_seq_len_kv",
)
BOOL_KEYWORDS = ("use_causal_mask", "use_causal_mask_bottom_right", "use_padding_mask", "generate_stats")
ODD_VALUES = [-1, 0, 1, 2, 100, 2.5, "3", None, True, float("nan")]


@st.composite
def perturbations(draw):
    kind = draw(
        st.sampled_from(
            [
                "dim",
                "stride",
                "dtype",
                "int_kw",
                "bool_kw",
                "scale",
                "alignment",
                "drop_kw",
                "unknown_kw",
                "out_dim",
                "out_stride",
                "out_dtype",
                "unmark",
            ]
        )
    )
    if kind in ("dim", "stride"):
        return (
            kind,
            draw(st.sampled_from(INPUT_ROLES)),
            draw(st.integers(0, 3)),
            draw(st.sampled_from(["zero", "neg", "plus1", "minus1", "double", "three", "float"])),
        )
    if kind == "dtype":
        return kind, draw(st.sampled_from(INPUT_ROLES)), draw(st.sampled_from(DTYPES))
    if kind == "int_kw":
        return kind, draw(st.sampled_from(INT_KEYWORDS)), draw(st.sampled_from(ODD_VALUES))
    if kind == "bool_kw":
        return kind, draw(st.sampled_from(BOOL_KEYWORDS))
    if kind == "scale":
        return kind, draw(st.sampled_from([float("nan"), float("inf"), -0.5, 0.0, "x", 2, True, [1.0]]))
    if kind == "alignment":
        return kind, draw(st.sampled_from(["BOTTOM_RIGHT", "TOP_LEFT", "bottom_right", "", None, 3]))
    if kind == "drop_kw":
        return kind, draw(
            st.sampled_from(
                [
                    "cu_seq_len_q",
                    "cu_seq_len_kv",
                    "max_seq_len_q",
                    "max_seq_len_kv",
                    "seq_len_q",
                    "seq_len_kv",
                    "use_padding_mask",
                    "attn_scale",
                ]
            )
        )
    if kind == "unknown_kw":
        return kind, draw(st.sampled_from(["use_causal", "window", "dropout_p", "is_causal"]))
    if kind in ("out_dim", "out_stride"):
        return (
            kind,
            draw(st.sampled_from(["o", "stats"])),
            draw(st.integers(0, 3)),
            draw(st.sampled_from(["zero", "neg", "plus1", "minus1", "double"])),
        )
    if kind == "out_dtype":
        return kind, draw(st.sampled_from(["o", "stats"])), draw(st.sampled_from(DTYPES))
    return (kind,)


def _changed(values: tuple, axis: int, how: str) -> tuple:
    if not values:
        return values
    axis %= len(values)
    old = values[axis]
    new = {
        "zero": 0,
        "neg": -abs(old) - 1,
        "plus1": old + 1,
        "minus1": old - 1,
        "double": 2 * old,
        "three": 3,
        "float": old + 0.5,
    }[how]
    return values[:axis] + (new,) + values[axis + 1 :]


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _must_fail(p, case: Case) -> bool:
    """Perturbations that no valid graph survives (others may still describe a valid graph)."""
    kind = p[0]
    if kind in ("unknown_kw", "unmark", "out_dim"):
        return True
    if kind in ("dim", "stride", "out_stride") and p[-1] in ("neg", "float"):
        return True
    if kind == "dtype":
        role, dtype = p[1], p[2]
        want = "fp32" if role in ("q", "k", "v", "sink") else "int32"
        return dtype != want
    if kind == "out_dtype":
        return p[2] != "fp32"
    if kind == "scale":
        return not (_is_int(p[1]) or isinstance(p[1], float) and math.isfinite(p[1]))
    if kind == "int_kw":
        return p[2] is not None and not _is_int(p[2])
    if kind == "alignment":
        return p[1] not in ("TOP_LEFT", "BOTTOM_RIGHT")
    if kind == "drop_kw":
        return p[1] != "attn_scale"
    if kind == "bool_kw":
        return p[1] == "use_padding_mask"
    return False


def _need(condition: bool) -> None:
    """Discard an example whose perturbation does not apply to its case."""
    if not condition:
        assume(False)


def _perturb(h, kind: str, p) -> None:
    """Change one declared dim, stride or dtype of tensor `h` as perturbation `p` says."""
    _need(h is not None)
    if kind == "dim":
        h.set_dim(_changed(h.dim, p[2], p[3]))
    elif kind == "stride":
        h.set_stride(_changed(h.stride, p[2], p[3]))
    else:
        h.set_data_type(p[2])


def declare_perturbed(case: Case, t: dict, p) -> frost.Graph:
    """Declare the case's forward graph with one field perturbed; returns the validated graph."""
    g = frost.Graph(io_data_type=case.dtype, target=CPU)
    handles = {r: g.tensor_like(t[r], name=r) for r in ("q", "k", "v")}
    kw, pack = sdpa_keywords(case, g, t)
    handles.update({h.name: h for h in pack})
    kw.setdefault("attn_scale", case.attn_scale)
    kw["generate_stats"] = case.stats
    kind = p[0]
    if kind in ("dim", "stride", "dtype"):
        _perturb(handles.get(p[1]), kind, p)
    elif kind == "int_kw":
        kw[p[1]] = p[2]
    elif kind == "bool_kw":
        kw[p[1]] = not kw.get(p[1], False)
    elif kind == "scale":
        kw["attn_scale"] = p[1]
    elif kind == "alignment":
        kw["diagonal_alignment"] = p[1]
    elif kind == "drop_kw":
        _need(p[1] in kw)
        del kw[p[1]]
    elif kind == "unknown_kw":
        kw[p[1]] = True
    o, stats = g.sdpa(handles["q"], handles["k"], handles["v"], **kw)
    o.set_output(True)
    if stats is not None:
        stats.set_output(True)
    outs = {"o": o, "stats": stats}
    if kind in ("out_dim", "out_stride", "out_dtype"):
        _perturb(outs[p[1]], kind[len("out_") :], p)
    elif kind == "unmark":
        o.set_output(False)
    return g.validate()


def bind_from_declaration(g: frost.Graph) -> dict:
    """Torch tensors for every port of a validated graph, laid out as declared, with valid length values."""
    node, facts = g.node, g.facts
    a = node.attrs
    pack = {}
    ports = dict(node.inputs())
    ports.update(node.outputs())
    for role, decl in ports.items():
        dt = decl.data_type.to_torch()
        t = torch.empty_strided(decl.dim, decl.stride, dtype=dt)
        if dt.is_floating_point:
            t.normal_() if role in ("q", "k", "v", "sink_token") else t.fill_(float("nan"))
        else:
            t.zero_()
        pack[decl] = t
    if facts.is_thd:
        for cu, total, longest in (
            (a.cu_seq_len_q, facts.total_q, facts.seq_q),
            (a.cu_seq_len_kv, facts.total_kv, facts.seq_kv),
        ):
            n = facts.batch
            each = min(longest, total // n)
            pack[cu].copy_(torch.arange(n + 1, dtype=torch.int32) * each)
    if facts.has_padding:
        for lens, s in ((a.seq_len_q, facts.seq_q), (a.seq_len_kv, facts.seq_kv)):
            pack[lens].copy_(torch.full(lens.dim, s // 2 + 1, dtype=torch.int32).clamp(max=s))
    return pack


@SETTINGS
@given(case=cases(), p=perturbations())
def test_perturbed_graphs_raise_frost_errors_only(case, p):
    t = make_inputs(case)
    try:
        g = declare_perturbed(case, t, p)
        g.build_plans()
        for name in ("H200", "A100", "B200", "RTX5090"):  # ranking the facts on GPUs never crashes either
            g2 = declare_perturbed(case, t, p)
            g2._target = fake_target(name)
            g2.available_engines()
            g2.declines()
        pack = bind_from_declaration(g)
        g.execute(pack)
    except frost.FrostError:
        return
    assert not _must_fail(p, case), f"perturbation {p} was accepted"
    for decl, tensor in pack.items():
        if decl.is_virtual and decl.data_type.to_torch().is_floating_point and tensor.numel():
            assert not torch.isnan(tensor).any(), f"{decl.name} has unwritten elements after {p}"


def test_perturbation_catalogue_covers_must_fail_kinds():
    """Sanity: a must-fail perturbation of a plain case does fail, with a frost error."""
    case = Case()
    t = make_inputs(case)
    for p in (
        ("unknown_kw", "is_causal"),
        ("unmark",),
        ("dim", "q", 2, "neg"),
        ("dtype", "k", "fp16"),
        ("scale", "x"),
        ("int_kw", "sliding_window_length", 2.5),
    ):
        with pytest.raises(frost.FrostError):
            declare_perturbed(case, t, p)
