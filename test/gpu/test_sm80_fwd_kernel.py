"""The mma.sync SDPA forward template, called directly with canonical views, against the reference math.

Outputs are poisoned with NaN before every launch; every element that the
contract says is written is checked (THD tokens all belong to a sequence,
dense padding rows are written as O = 0, LSE = -inf).
"""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from test.helpers import sdpa_fwd_reference64 as sdpa_fwd_reference  # noqa: E402
from test.oracle import assert_close_to_oracle  # noqa: E402
from frost.adapters.reference_math import RefArgs  # noqa: E402
from frost.engines.sm80.sdpa_fwd_params import Sm80FwdParams, default_knobs  # noqa: E402
from frost.testing.cases import params_kwargs  # noqa: E402
from frost.engines.sdpa_args import CanonicalCall  # noqa: E402

TEMPLATE = "frost.engines.sm80.sdpa_fwd"
DT = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _p(**kw):
    return Sm80FwdParams(**params_kwargs(default_knobs, **kw))


FLAVORS = {
    "d128_lse": _p(has_lse=True),
    "d128_causal_br_gqa": _p(hq=8, hk=2, has_window_right=True, bottom_right=True, has_lse=True),
    "d128_causal_s1": _p(has_window_right=True, knobs=dict(num_stages=1)),
    "d128_s2_window": _p(has_window_left=True, has_window_right=True, has_lse=True, knobs=dict(num_stages=2)),
    "d64_fp16_window_br": _p(
        dtype="fp16", d=64, hq=6, hk=3, has_window_left=True, has_window_right=True, bottom_right=True, has_lse=True
    ),
    "d64_fp16_plain": _p(dtype="fp16", d=64),
    "d96_thd_causal_gqa": _p(d=96, hq=4, hk=2, is_thd=True, has_window_right=True, has_lse=True),
    "d256_sinks_seqused": _p(d=256, hq=2, hk=2, has_sinks=True, has_seqused=True, has_lse=True),
    "d192_thd_sinks_wl_br": _p(
        d=192, dv=128, hq=4, hk=1, is_thd=True, has_sinks=True, has_window_left=True, bottom_right=True, has_lse=True
    ),
    "sm120_d128_thd_causal": _p(family="sm120", is_thd=True, has_window_right=True, has_lse=True),
    "sm120_d256_causal_br": _p(
        family="sm120", d=256, hq=2, hk=2, has_window_right=True, bottom_right=True, has_lse=True
    ),
    "sm120_d64_thd": _p(family="sm120", d=64, is_thd=True, has_lse=True, has_sinks=True),
}

# head dims outside the tuned set: tiles padded past the head dim (72 on 96 columns, 40 on 64, 8 on 32), tile
# widths off the tuned ones (160), d_qk != d_v both ways
HEAD_DIM_FLAVORS = {
    "hd_d72_causal_br": _p(d=72, has_window_right=True, bottom_right=True, has_lse=True),
    "hd_d40_thd_sinks_gqa": _p(d=40, hq=4, hk=2, is_thd=True, has_sinks=True, has_lse=True),
    "hd_d192v64_mqa": _p(d=192, dv=64, hq=4, hk=1, has_lse=True),
    "hd_d80_fp16_window": _p(dtype="fp16", d=80, has_window_left=True, has_window_right=True, has_lse=True),
    "hd_d112_seqused_sinks": _p(d=112, has_seqused=True, has_sinks=True, has_lse=True),
    "hd_d32": _p(d=32, has_lse=True),
    "hd_d48_causal_gqa": _p(d=48, hq=8, hk=2, has_window_right=True, has_lse=True),
    "hd_d160_causal": _p(d=160, has_window_right=True, has_lse=True),
    "hd_d8v24": _p(d=8, dv=24, has_lse=True),
    "hd_d64v256_causal": _p(d=64, dv=256, has_window_right=True, has_lse=True),
    "hd_sm120_d136v128_causal": _p(family="sm120", d=136, dv=128, has_window_right=True, has_lse=True),
    "hd_sm120_d72_thd": _p(family="sm120", d=72, is_thd=True, has_lse=True),
}
FLAVORS.update(HEAD_DIM_FLAVORS)


@pytest.fixture(scope="module")
def kernels():
    from frost.target import discover_target
    from frost.compiler.workers import compile_many

    target = discover_target()
    names = list(FLAVORS)
    cks = compile_many([(TEMPLATE, FLAVORS[n]) for n in names], target)
    return {n: CanonicalCall(ck, FLAVORS[n]) for n, ck in zip(names, cks)}


# ---------------------------------------------------------------- inputs
WIDE = 8  # extra elements per row of the "wide" layouts (a 16-byte multiple, as every declared stride must be)


def _randn(shape, dt, scale=1.0):
    return (torch.randn(shape, device="cuda", dtype=torch.float32) * scale).to(dt)


def _wide(shape, dt, scale=1.0):
    """Random values of `shape` in rows WIDE elements longer, the extra columns NaN: a kernel that read past
    the head dim would spread NaN."""
    x = _randn(tuple(shape[:-1]) + (shape[-1] + WIDE,), dt, scale)
    x[..., shape[-1] :] = float("nan")
    return x[..., : shape[-1]]


def extra_cols(x):
    """The WIDE columns past a wide view's head dim."""
    return torch.as_strided(x, x.shape[:-1] + (WIDE,), x.stride(), x.storage_offset() + x.shape[-1])


def _dense_qkv(p, B, Sq, Skv, layout, qscale):
    dt, hq, hk, d, dv = DT[p.dtype], p.num_heads_q, p.num_heads_kv, p.head_dim, p.head_dim_v
    if layout == "bshd":
        return _randn((B, Sq, hq, d), dt, qscale), _randn((B, Skv, hk, d), dt), _randn((B, Skv, hk, dv), dt)
    if layout == "bhsd":
        return (
            _randn((B, hq, Sq, d), dt, qscale).permute(0, 2, 1, 3),
            _randn((B, hk, Skv, d), dt).permute(0, 2, 1, 3),
            _randn((B, hk, Skv, dv), dt).permute(0, 2, 1, 3),
        )
    if layout == "wide":
        return _wide((B, Sq, hq, d), dt, qscale), _wide((B, Skv, hk, d), dt), _wide((B, Skv, hk, dv), dt)
    assert layout == "interleaved" and Sq == Skv and d == dv
    x = _randn((B, Sq, hq + 2 * hk, d), dt)
    q = x[:, :, :hq]
    q.mul_(qscale)
    return q, x[:, :, hq : hq + hk], x[:, :, hq + hk :]


def _thd_qkv(p, Tq, Tk, layout, qscale):
    dt, hq, hk, d, dv = DT[p.dtype], p.num_heads_q, p.num_heads_kv, p.head_dim, p.head_dim_v
    if layout == "interleaved":
        assert Tq == Tk and d == dv
        x = _randn((Tq, hq + 2 * hk, d), dt)
        q = x[:, :hq]
        q.mul_(qscale)
        return q, x[:, hq : hq + hk], x[:, hq + hk :]
    if layout == "wide":
        return _wide((Tq, hq, d), dt, qscale), _wide((Tk, hk, d), dt), _wide((Tk, hk, dv), dt)
    if layout == "hsd":  # head-major storage
        return (
            _randn((hq, Tq, d), dt, qscale).transpose(0, 1),
            _randn((hk, Tk, d), dt).transpose(0, 1),
            _randn((hk, Tk, dv), dt).transpose(0, 1),
        )
    return _randn((Tq, hq, d), dt, qscale), _randn((Tk, hk, d), dt), _randn((Tk, hk, dv), dt)


def _cu(lens):
    c = [0]
    for n in lens:
        c.append(c[-1] + n)
    return torch.tensor(c, dtype=torch.int32, device="cuda")


def run_case(
    ck,
    p,
    *,
    B=1,
    Sq=128,
    Skv=128,
    lens_q=None,
    lens_kv=None,
    seqused_q=None,
    seqused_kv=None,
    layout="bshd",
    o_layout="bshd",
    lse_layout="contig",
    wl=None,
    wr=None,
    qscale=1.0,
    scale=None,
    sink_scale=1.0,
    stream=None,
):
    """One launch with poisoned outputs; checks every written element against the reference."""
    dt = DT[p.dtype]
    hq, dv = p.num_heads_q, p.head_dim_v
    scale = scale if scale is not None else 1.0 / math.sqrt(p.head_dim)
    if p.is_thd:
        Tq, Tk = sum(lens_q), sum(lens_kv)
        q, k, v = _thd_qkv(p, Tq, Tk, layout, qscale)
        o_store = torch.empty(
            (hq, Tq, dv) if o_layout == "hsd" else (Tq, hq, dv + WIDE * (o_layout == "wide")), device="cuda", dtype=dt
        )
        o = o_store.transpose(0, 1) if o_layout == "hsd" else o_store[..., :dv]
        lse_store = torch.empty((Tq, hq) if lse_layout == "strided" else (hq, Tq), device="cuda")
        lse = lse_store.t() if lse_layout == "strided" else lse_store
        cu_q, cu_k = _cu(lens_q), _cu(lens_kv)
    else:
        q, k, v = _dense_qkv(p, B, Sq, Skv, layout, qscale)
        o_store = torch.empty(
            (B, hq, Sq, dv) if o_layout == "bhsd" else (B, Sq, hq, dv + WIDE * (o_layout == "wide")),
            device="cuda",
            dtype=dt,
        )
        o = o_store.permute(0, 2, 1, 3) if o_layout == "bhsd" else o_store[..., :dv]
        lse_store = torch.empty((B, Sq, hq) if lse_layout == "strided" else (B, hq, Sq), device="cuda")
        lse = lse_store.permute(0, 2, 1) if lse_layout == "strided" else lse_store
    o_store.fill_(float("nan"))
    lse_store.fill_(float("nan"))
    sinks = (torch.randn(hq, device="cuda") * sink_scale + 1.0) if p.has_sinks else None
    su_q = torch.tensor(seqused_q, dtype=torch.int32, device="cuda") if p.has_seqused else None
    su_k = torch.tensor(seqused_kv, dtype=torch.int32, device="cuda") if p.has_seqused else None

    args = [q, k, v, o]
    if p.has_lse:
        args.append(lse)
    if p.is_thd:
        args += [cu_q, cu_k]
    if p.has_seqused:
        args += [su_q, su_k]
    if p.has_sinks:
        args.append(sinks)
    args.append(scale)
    if p.has_window_left:
        args.append(wl)
    if p.has_window_right:
        args.append(wr)
    if p.is_thd:
        args += [max(lens_q) if lens_q else 0, max(lens_kv) if lens_kv else 0]
    args.append(stream if stream is not None else torch.cuda.current_stream().cuda_stream)
    ck(*args)
    torch.cuda.synchronize()

    ref_o, ref_lse = sdpa_fwd_reference(
        q,
        k,
        v,
        RefArgs(
            scale,
            cu_seqlens_q=cu_q if p.is_thd else None,
            cu_seqlens_kv=cu_k if p.is_thd else None,
            seqused_q=su_q,
            seqused_kv=su_k,
            sinks=sinks,
            window_left=wl if p.has_window_left else None,
            window_right=wr if p.has_window_right else None,
            bottom_right=p.bottom_right,
        ),
    )
    of = o.float()
    assert not torch.isnan(of).any(), f"{int(torch.isnan(of).sum())} O elements not written"
    if o_layout == "wide":
        assert torch.isnan(extra_cols(o)).all(), "O written past its head dim"
    den = ref_o.norm().item()
    rel = ((of - ref_o).norm().item() / den) if den > 0 else (of - ref_o).norm().item()
    assert_close_to_oracle(o, ref_o, rel=1e-2, name="O")
    empty = torch.isinf(ref_lse) & (ref_lse < 0)
    if p.has_lse:
        assert not torch.isnan(lse).any(), f"{int(torch.isnan(lse).sum())} LSE elements not written"
        assert torch.equal(torch.isinf(lse) & (lse < 0), empty), "LSE -inf pattern differs"
        fin = ~empty
        if fin.any():
            torch.testing.assert_close(lse[fin].double(), ref_lse[fin], atol=2e-3, rtol=1e-3)
    # rows with no allowed key and no sink: O exactly 0
    if empty.any():
        if p.is_thd:
            rows = empty.t()  # (Tq, Hq)
        else:
            rows = empty.permute(0, 2, 1)  # (B, Sq, Hq)
        assert (of[rows] == 0).all(), "fully masked rows must write O = 0"
    return rel


# ---------------------------------------------------------------- cases
def test_dense_plain_layouts(kernels):
    ck, p = kernels["d128_lse"], FLAVORS["d128_lse"]
    run_case(ck, p, B=2, Sq=256, Skv=256)
    run_case(ck, p, B=1, Sq=200, Skv=333, layout="bhsd", o_layout="bhsd", lse_layout="strided")
    run_case(ck, p, B=3, Sq=1, Skv=1)
    run_case(ck, p, B=2, Sq=130, Skv=130, layout="interleaved")
    run_case(ck, p, B=1, Sq=300, Skv=77, qscale=20.0)  # large logits


def test_causal_bottom_right_gqa(kernels):
    ck, p = kernels["d128_causal_br_gqa"], FLAVORS["d128_causal_br_gqa"]
    run_case(ck, p, B=2, Sq=300, Skv=300, wr=0)
    run_case(ck, p, B=1, Sq=100, Skv=333, wr=0, layout="bhsd")
    run_case(ck, p, B=1, Sq=333, Skv=100, wr=0, lse_layout="strided")  # leading rows fully masked
    run_case(ck, p, B=1, Sq=257, Skv=257, wr=3)


def test_causal_top_left_no_lse(kernels):
    ck, p = kernels["d128_causal_s1"], FLAVORS["d128_causal_s1"]
    run_case(ck, p, B=2, Sq=512, Skv=512, wr=0)
    run_case(ck, p, B=1, Sq=257, Skv=400, wr=0, o_layout="bhsd")
    run_case(ck, p, B=1, Sq=400, Skv=150, wr=0)


def test_window_two_stage(kernels):
    ck, p = kernels["d128_s2_window"], FLAVORS["d128_s2_window"]
    run_case(ck, p, B=2, Sq=1000, Skv=1000, wl=100, wr=0)
    run_case(ck, p, B=1, Sq=300, Skv=700, wl=0, wr=0)
    run_case(ck, p, B=1, Sq=700, Skv=300, wl=250, wr=70, layout="bhsd")


def test_window_fp16_gqa_bottom_right(kernels):
    ck, p = kernels["d64_fp16_window_br"], FLAVORS["d64_fp16_window_br"]
    run_case(ck, p, B=2, Sq=400, Skv=400, wl=37, wr=5)
    run_case(ck, p, B=1, Sq=150, Skv=500, wl=0, wr=0)
    run_case(ck, p, B=1, Sq=500, Skv=150, wl=100, wr=300, layout="bhsd", lse_layout="strided")


def test_fp16_plain_and_stream_objects(kernels):
    ck, p = kernels["d64_fp16_plain"], FLAVORS["d64_fp16_plain"]
    run_case(ck, p, B=2, Sq=333, Skv=129)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        run_case(ck, p, B=1, Sq=64, Skv=190, stream=s)  # a torch stream object
    run_case(ck, p, B=1, Sq=70, Skv=70, layout="interleaved", stream=0)  # raw handle 0


def test_thd_causal_random_lengths(kernels):
    ck, p = kernels["d96_thd_causal_gqa"], FLAVORS["d96_thd_causal_gqa"]
    run_case(ck, p, lens_q=[0, 1, 17, 128, 300, 1], lens_kv=[0, 1, 17, 128, 300, 1], wr=0)
    run_case(ck, p, lens_q=[5, 0, 250], lens_kv=[9, 3, 260], wr=0, layout="hsd", o_layout="hsd", lse_layout="strided")
    g = torch.Generator().manual_seed(0)
    lens = torch.randint(0, 200, (7,), generator=g).tolist()
    run_case(ck, p, lens_q=lens, lens_kv=lens, wr=0)


def test_dense_sinks_seqused(kernels):
    ck, p = kernels["d256_sinks_seqused"], FLAVORS["d256_sinks_seqused"]
    run_case(ck, p, B=3, Sq=200, Skv=200, seqused_q=[200, 0, 77], seqused_kv=[150, 10, 0])
    run_case(ck, p, B=2, Sq=65, Skv=300, seqused_q=[65, 1], seqused_kv=[300, 299], sink_scale=10.0, layout="bhsd")


def test_thd_sinks_window_left_d192(kernels):
    ck, p = kernels["d192_thd_sinks_wl_br"], FLAVORS["d192_thd_sinks_wl_br"]
    run_case(ck, p, lens_q=[5, 64, 200, 1], lens_kv=[100, 64, 250, 0], wl=64)
    run_case(ck, p, lens_q=[130, 3], lens_kv=[7, 400], wl=0, lse_layout="strided")


def test_sm120_family(kernels):
    ck, p = kernels["sm120_d128_thd_causal"], FLAVORS["sm120_d128_thd_causal"]
    run_case(ck, p, lens_q=[1, 200, 64, 333], lens_kv=[1, 200, 64, 333], wr=0, layout="interleaved")
    ck, p = kernels["sm120_d256_causal_br"], FLAVORS["sm120_d256_causal_br"]
    run_case(ck, p, B=2, Sq=190, Skv=260, wr=0)
    run_case(ck, p, B=1, Sq=260, Skv=190, wr=0, layout="bhsd")
    ck, p = kernels["sm120_d64_thd"], FLAVORS["sm120_d64_thd"]
    run_case(ck, p, lens_q=[3, 0, 129], lens_kv=[50, 7, 0])


def test_thd_cuda_graph_replay_new_lengths(kernels):
    """Lengths are read in-kernel: a captured launch honours lengths written into the same buffers."""
    ck, p = kernels["d96_thd_causal_gqa"], FLAVORS["d96_thd_causal_gqa"]
    dt = DT[p.dtype]
    T = 600
    q, k, v = _thd_qkv(p, T, T, "thd", 1.0)
    o = torch.empty(T, p.num_heads_q, p.head_dim_v, device="cuda", dtype=dt)
    lse = torch.empty(p.num_heads_q, T, device="cuda")
    cu_q = _cu([100, 200, 300])
    cu_k = cu_q.clone()
    scale = 1.0 / math.sqrt(p.head_dim)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        ck(q, k, v, o, lse, cu_q, cu_k, scale, 0, T, T, s.cuda_stream)  # warm
        with torch.cuda.graph(g, stream=s):
            ck(q, k, v, o, lse, cu_q, cu_k, scale, 0, T, T, s.cuda_stream)
    torch.cuda.synchronize()
    for lens in ([600, 0, 0], [1, 598, 1], [250, 0, 350]):  # same batch, new lengths
        new = _cu(lens)
        cu_q.copy_(new)
        cu_k.copy_(new)
        o.fill_(float("nan"))
        lse.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ref_o, ref_lse = sdpa_fwd_reference(
            q, k, v, RefArgs(scale, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_k, window_right=0)
        )
        assert not torch.isnan(o).any()
        rel = ((o.float() - ref_o).norm() / ref_o.norm()).item()
        assert rel < 1e-2, f"replay with lengths {lens}: O relative error {rel:.3e}"
        torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("name", list(HEAD_DIM_FLAVORS))
def test_head_dims_padded_and_unequal(kernels, name):
    """Every layout a head dim's strides allow: BSHD, BHSD, interleaved heads (the next head's values right
    past the head dim), and rows wider than the head dim holding NaN (read nowhere, O's never written)."""
    ck, p = kernels[name], FLAVORS[name]
    wr = 0 if p.has_window_right else None
    wl = 64 if p.has_window_left else None
    if p.is_thd:
        run_case(ck, p, lens_q=[0, 1, 17, 128, 300, 1], lens_kv=[0, 1, 17, 128, 300, 1], wl=wl, wr=wr)
        run_case(
            ck,
            p,
            lens_q=[5, 0, 250],
            lens_kv=[9, 3, 260],
            wl=wl,
            wr=wr,
            layout="hsd",
            o_layout="hsd",
            lse_layout="strided",
        )
        run_case(ck, p, lens_q=[77, 1, 200], lens_kv=[77, 1, 150], wl=wl, wr=wr, layout="wide", o_layout="wide")
        return
    su = dict(seqused_q=[200, 0, 77], seqused_kv=[150, 10, 0]) if p.has_seqused else {}
    su2 = dict(seqused_q=[65, 1, 0], seqused_kv=[300, 299, 1]) if p.has_seqused else {}
    run_case(ck, p, B=3, Sq=200, Skv=200 if p.has_seqused else 333, wl=wl, wr=wr, **su)
    run_case(
        ck,
        p,
        B=3,
        Sq=65 if p.has_seqused else 300,
        Skv=300 if p.has_seqused else 77,
        wl=wl,
        wr=wr,
        layout="bhsd",
        o_layout="bhsd",
        lse_layout="strided",
        **su2,
    )
    run_case(ck, p, B=3, Sq=200, Skv=200, wl=wl, wr=wr, layout="wide", o_layout="wide", qscale=4.0, **su)
    if p.head_dim == p.head_dim_v and not p.has_seqused:
        run_case(ck, p, B=2, Sq=130, Skv=130, wl=wl, wr=wr, layout="interleaved")


# ---------------------------------------------------------------- NaN in padding
def run_nan_padding_case(
    ck,
    p,
    *,
    B=1,
    Sq=128,
    Skv=128,
    lens_q=None,
    lens_kv=None,
    seqused_q=None,
    seqused_kv=None,
    wl=None,
    wr=None,
    tail=150,
):
    """Padding rows of Q / K / V (dense: past seqused; THD: `tail` tokens after the last sequence) hold
    NaN / Inf, as uninitialized user buffers do; valid rows must match the reference on clean inputs."""
    dt = DT[p.dtype]
    hq, dv = p.num_heads_q, p.head_dim_v
    scale = 1.0 / math.sqrt(p.head_dim)
    nan = float("nan")
    if p.is_thd:
        Tq, Tk = sum(lens_q), sum(lens_kv)
        q, k, v = _thd_qkv(p, Tq + tail, Tk + tail, "thd", 1.0)
        q[Tq:], k[Tk:], v[Tk:] = nan, float("inf"), nan
        cu_q, cu_k = _cu(lens_q), _cu(lens_kv)
        o = torch.full((Tq + tail, hq, dv), nan, device="cuda", dtype=dt)
        lse = torch.full((hq, Tq + tail), nan, device="cuda")
        clean = (q[:Tq], k[:Tk], v[:Tk])
    else:
        q, k, v = _dense_qkv(p, B, Sq, Skv, "bshd", 1.0)
        clean = tuple(x.clone() for x in (q, k, v))
        for b in range(B):
            q[b, seqused_q[b] :], k[b, seqused_kv[b] :], v[b, seqused_kv[b] :] = nan, float("inf"), nan
        o = torch.full((B, Sq, hq, dv), nan, device="cuda", dtype=dt)
        lse = torch.full((B, hq, Sq), nan, device="cuda")
    sinks = torch.randn(hq, device="cuda") + 1.0 if p.has_sinks else None
    su_q = torch.tensor(seqused_q, dtype=torch.int32, device="cuda") if p.has_seqused else None
    su_k = torch.tensor(seqused_kv, dtype=torch.int32, device="cuda") if p.has_seqused else None
    args = (
        [q, k, v, o] + [lse] * p.has_lse + ([cu_q, cu_k] if p.is_thd else []) + ([su_q, su_k] if p.has_seqused else [])
    )
    args += [sinks] * p.has_sinks + [scale] + [wl] * p.has_window_left + [wr] * p.has_window_right
    args += [max(lens_q), max(lens_kv)] if p.is_thd else []
    ck(*args, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()

    ref_o, ref_lse = sdpa_fwd_reference(
        *clean,
        RefArgs(
            scale,
            cu_seqlens_q=cu_q if p.is_thd else None,
            cu_seqlens_kv=cu_k if p.is_thd else None,
            seqused_q=su_q,
            seqused_kv=su_k,
            sinks=sinks,
            window_left=wl,
            window_right=wr,
            bottom_right=p.bottom_right,
        ),
    )
    if p.is_thd:  # tokens after the last sequence are not written
        o, lse = o[:Tq], lse[:, :Tq]
    of = o.float()
    assert torch.isfinite(of).all(), f"{int((~torch.isfinite(of)).sum())} O elements not finite"
    assert_close_to_oracle(of, ref_o, rel=1e-2, io_dtype=o.dtype, name="O")
    if not p.is_thd:
        for b in range(B):
            assert (of[b, seqused_q[b] :] == 0).all(), "padding rows must write O = 0"
    if p.has_lse:
        fin = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), fin), "LSE -inf pattern differs"
        if fin.any():
            torch.testing.assert_close(lse[fin].double(), ref_lse[fin], atol=2e-3, rtol=1e-3)


def test_nan_in_seqused_padding_does_not_leak(kernels):
    ck, p = kernels["d256_sinks_seqused"], FLAVORS["d256_sinks_seqused"]
    run_nan_padding_case(ck, p, B=3, Sq=200, Skv=200, seqused_q=[200, 131, 7], seqused_kv=[150, 77, 1])


def test_nan_after_last_packed_sequence_does_not_leak(kernels):
    ck, p = kernels["d96_thd_causal_gqa"], FLAVORS["d96_thd_causal_gqa"]
    run_nan_padding_case(ck, p, lens_q=[129, 77, 5], lens_kv=[129, 300, 9], wr=0)
    ck, p = kernels["d192_thd_sinks_wl_br"], FLAVORS["d192_thd_sinks_wl_br"]
    run_nan_padding_case(ck, p, lens_q=[5, 64, 200], lens_kv=[100, 7, 250], wl=64)
