"""The SM90 forward template called directly on canonical views, against the reference math.

Outputs are poisoned with NaN before each launch: every element the contract
defines must be written. Run on an H100/H200 (cc 9.0); skipped elsewhere.
"""

from __future__ import annotations

import math

import pytest
import torch

from frost.adapters.reference_math import RefArgs
from frost.engines.sdpa_args import CanonicalCall
from frost.testing.cases import SM90_FWD_CASES, SM90_FWD_HEAD_DIM_CASES
from frost.testing.cases import SM90_FWD_TEMPLATE as TEMPLATE
from frost.testing.cases import Sm90Case as K
from frost.testing.cases import sm90_params
from test.oracle import assert_close_to_oracle

pytestmark = pytest.mark.gpu

CASES = SM90_FWD_CASES + SM90_FWD_HEAD_DIM_CASES


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def params_of(c: K):
    return sm90_params(c, torch.cuda.get_device_properties(0).multi_processor_count)


def _strided(shape, dtype, dev, perm):
    """A view of `shape` whose memory order is `perm` (outermost first), plus slack: no copy needed."""
    phys = [shape[i] for i in perm]
    phys[-1] += 8  # a padded last physical dim: no stride is a plain product
    buf = torch.randn(*phys, dtype=dtype, device=dev)
    buf = buf[..., : phys[-1] - 8]
    inv = [perm.index(i) for i in range(len(shape))]
    return buf.permute(*inv)


def make_args(c: K, seed=0):
    """(kernel args, inputs for the reference, o, lse) on the canonical views."""
    torch.manual_seed(seed)
    dev = "cuda"
    dt = torch.bfloat16 if c.dtype == "bf16" else torch.float16
    dv = c.dv or c.d
    scale = 1.0 / math.sqrt(c.d)
    ref_kw = dict(softmax_scale=scale)
    if c.thd is not None:
        lq = [a for a, _ in c.thd]
        lk = [b for _, b in c.thd]
        cu_q = torch.tensor([0] + list(torch.tensor(lq).cumsum(0)), dtype=torch.int32, device=dev)
        cu_k = torch.tensor([0] + list(torch.tensor(lk).cumsum(0)), dtype=torch.int32, device=dev)
        tq, tk = sum(lq), sum(lk)
        q = torch.randn(tq, c.hq, c.d, dtype=dt, device=dev)
        k = torch.randn(tk, c.hkv, c.d, dtype=dt, device=dev)
        v = torch.randn(tk, c.hkv, dv, dtype=dt, device=dev)
        o = torch.full((tq, c.hq, dv), float("nan"), dtype=dt, device=dev)
        lse = torch.full((c.hq, tq), float("nan"), dtype=torch.float32, device=dev)
        ref_kw.update(cu_seqlens_q=cu_q, cu_seqlens_kv=cu_k)
    else:
        if c.strided:
            q = _strided((c.b, c.sq, c.hq, c.d), dt, dev, (0, 2, 1, 3))  # physically BHSD
            k = _strided((c.b, c.skv, c.hkv, c.d), dt, dev, (2, 0, 1, 3))  # physically HBSD
            v = _strided((c.b, c.skv, c.hkv, dv), dt, dev, (0, 2, 1, 3))
            o = _strided((c.b, c.sq, c.hq, dv), dt, dev, (1, 0, 2, 3)).fill_(float("nan"))
            lse = _strided((c.b, c.hq, c.sq), torch.float32, dev, (2, 0, 1)).fill_(float("nan"))
        else:
            q = torch.randn(c.b, c.sq, c.hq, c.d, dtype=dt, device=dev)
            k = torch.randn(c.b, c.skv, c.hkv, c.d, dtype=dt, device=dev)
            v = torch.randn(c.b, c.skv, c.hkv, dv, dtype=dt, device=dev)
            o = torch.full((c.b, c.sq, c.hq, dv), float("nan"), dtype=dt, device=dev)
            lse = torch.full((c.b, c.hq, c.sq), float("nan"), dtype=torch.float32, device=dev)
        if c.seqused is not None:
            ref_kw.update(
                seqused_q=torch.tensor(c.seqused[0], dtype=torch.int32, device=dev),
                seqused_kv=torch.tensor(c.seqused[1], dtype=torch.int32, device=dev),
            )
    sinks = torch.randn(c.hq, dtype=torch.float32, device=dev) + c.sink_shift if c.sinks else None
    args = [q, k, v, o]
    if c.lse:
        args.append(lse)
    if c.thd is not None:
        args += [ref_kw["cu_seqlens_q"], ref_kw["cu_seqlens_kv"]]
    if c.seqused is not None:
        args += [ref_kw["seqused_q"], ref_kw["seqused_kv"]]
    if c.sinks:
        args.append(sinks)
        ref_kw["sinks"] = sinks
    args.append(scale)
    if c.wl is not None:
        args.append(c.wl)
        ref_kw["window_left"] = c.wl
    if c.wr is not None:
        args.append(c.wr)
        ref_kw["window_right"] = c.wr
    if c.thd is not None:
        args += [max(a for a, _ in c.thd), max(b for _, b in c.thd)]
    args.append(torch.cuda.current_stream().cuda_stream)
    ref_kw["bottom_right"] = c.br
    return args, (q, k, v), ref_kw, o, lse


@pytest.fixture(scope="module")
def kernels():
    """Every case's kernel, compiled up front in parallel worker processes."""
    if not _hopper():
        pytest.skip("needs an sm_90 GPU")
    from frost.compiler.workers import compile_many

    specs = [(TEMPLATE, params_of(c)) for c in CASES]
    cks = compile_many(specs, "sm_90a")
    return {c.id: CanonicalCall(ck, params_of(c)) for c, ck in zip(CASES, cks)}


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-6)).item()


def check_against_reference(case: K, o, lse, ref_o, ref_lse) -> None:
    """Every O / LSE element written (outputs start as NaN) and close to the reference."""
    assert not torch.isnan(o).any(), f"{int(torch.isnan(o).sum())} O elements not written"
    if ref_o.numel():
        assert_close_to_oracle(o, ref_o, rel=1e-2, name="O")
    if case.lse:
        assert not torch.isnan(lse).any(), "some LSE element was not written"
        fin = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), fin), "LSE -inf pattern differs"
        if fin.any():
            err = (lse[fin] - ref_lse[fin]).abs().max().item()
            assert err < 2e-3, f"LSE max abs err {err:.3e}"


def run_and_check(ck, case: K) -> None:
    """One launch of `ck` on the case's inputs (outputs poisoned) against the reference."""
    from test.helpers import sdpa_fwd_reference64 as sdpa_fwd_reference

    args, (q, k, v), ref_kw, o, lse = make_args(case)
    ck(*args)
    torch.cuda.synchronize()
    ref_o, ref_lse = sdpa_fwd_reference(q, k, v, RefArgs(**ref_kw))
    check_against_reference(case, o, lse, ref_o, ref_lse)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_matches_reference(kernels, case):
    run_and_check(kernels[case.id], case)


def test_one_artifact_serves_many_extents(kernels):
    """A compiled kernel takes new batch/sequence extents and totals without recompiling."""
    from test.helpers import sdpa_fwd_reference64 as sdpa_fwd_reference

    for c in (K(b=1, sq=77, skv=1500, wr=0), K(b=3, sq=1025, skv=64, wr=0)):
        ck = kernels[K(wr=0).id]
        args, (q, k, v), ref_kw, o, _ = make_args(c, seed=1)
        ck(*args)
        torch.cuda.synchronize()
        ref_o, _ = sdpa_fwd_reference(q, k, v, RefArgs(**ref_kw))
        assert_close_to_oracle(o, ref_o, rel=1e-2, name="O")


def check_replay_with_new_lengths(ck, c: K, new_q: list, new_k: list) -> None:
    """Capture one THD launch, write new prefix sums into the same buffers, replay, compare."""
    from test.helpers import sdpa_fwd_reference64 as sdpa_fwd_reference

    args, (q, k, v), ref_kw, o, lse = make_args(c)
    s = torch.cuda.Stream()
    args[-1] = s.cuda_stream
    with torch.cuda.stream(s):
        ck(*args)  # warm
    s.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        ck(*args)
    ref_kw["cu_seqlens_q"].copy_(torch.tensor(new_q, dtype=torch.int32, device="cuda"))
    ref_kw["cu_seqlens_kv"].copy_(torch.tensor(new_k, dtype=torch.int32, device="cuda"))
    o.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    ref_o, _ = sdpa_fwd_reference(q, k, v, RefArgs(**ref_kw))
    assert not torch.isnan(o).any()
    assert_close_to_oracle(o, ref_o, rel=1e-2, name="O")


def test_graph_replay_honors_new_lengths(kernels):
    """THD lengths rewritten in place after capture are honored by a replay (no host reads)."""
    c = K(hq=8, hkv=2, thd=((0, 0), (1, 1), (129, 129), (500, 500), (77, 300), (1, 5)), wr=0)
    check_replay_with_new_lengths(
        kernels[c.id], c, [0, 300, 301, 400, 600, 708, 708], [0, 400, 401, 600, 800, 930, 935]
    )


# ---------------------------------------------------------------- NaN in padding
# Padding rows (past seqused, or tokens after the last packed sequence) are often left
# uninitialized; NaN there must not reach a valid row (P = 0 does not stop 0 * NaN in P.V).
# These reuse kernels of CASES: seqused values and THD lengths are runtime values.
NAN_DENSE = [
    K(b=3, seqused=((300, 131, 7), (200, 257, 1)), sq=300, skv=300, wr=0),  # compiled as the seqused case
]
NAN_THD = [
    K(thd=((513, 513), (1, 7), (0, 3), (64, 64)), sinks=True),
    K(d=64, thd=((300, 300), (1, 1), (190, 190))),
    K(hq=8, hkv=2, thd=((129, 129), (77, 300), (1, 5)), wr=0),
    K(d=104, thd=((200, 200), (1, 1), (77, 300))),  # a padded tile's row-predicated, column-limited O store
]


def check_nan_in_seqused_padding(ck, case: K) -> None:
    """Dense rows past seqused hold NaN / Inf: valid rows match clean inputs, padding rows write O = 0."""
    from test.helpers import sdpa_fwd_reference64 as sdpa_fwd_reference

    args, (q, k, v), ref_kw, o, lse = make_args(case, seed=3)
    clean = [x.clone() for x in (q, k, v)]
    for b, (lq, lk) in enumerate(zip(*case.seqused)):
        q[b, lq:] = float("nan")
        k[b, lk:] = float("inf")
        v[b, lk:] = float("nan")
    ck(*args)
    torch.cuda.synchronize()
    ref_o, ref_lse = sdpa_fwd_reference(*clean, RefArgs(**ref_kw))
    assert torch.isfinite(o).all(), f"{int((~torch.isfinite(o)).sum())} O elements not finite"
    assert_close_to_oracle(o, ref_o, rel=1e-2, name="O")
    for b, lq in enumerate(case.seqused[0]):
        assert (o[b, lq:] == 0).all(), "padding rows must write O = 0"
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin), "LSE -inf pattern differs"
    assert (lse[fin] - ref_lse[fin]).abs().max().item() < 2e-3


def check_nan_after_last_packed_sequence(ck, case: K, tail: int = 200) -> None:
    """Tokens after the last sequence hold NaN (more than a key tile: TMA loads them as they are);
    they must not leak into valid rows, and no store may reach them."""
    from test.helpers import sdpa_fwd_reference64 as sdpa_fwd_reference

    args, (q, k, v), ref_kw, o, lse = make_args(case, seed=4)

    def grow(x, dim=0):
        shape = list(x.shape)
        shape[dim] = tail
        return torch.cat([x, torch.full(shape, float("nan"), dtype=x.dtype, device=x.device)], dim=dim)

    tq = q.shape[0]
    args[:4] = [grow(q), grow(k), grow(v), grow(o)]
    if case.lse:
        args[4] = grow(lse, 1)
    ck(*args)
    torch.cuda.synchronize()
    ref_o, ref_lse = sdpa_fwd_reference(q, k, v, RefArgs(**ref_kw))
    got_o = args[3][:tq]
    assert torch.isfinite(got_o).all(), f"{int((~torch.isfinite(got_o)).sum())} O elements not finite"
    assert_close_to_oracle(got_o, ref_o, rel=1e-2, name="O")
    assert torch.isnan(args[3][tq:]).all(), "a store reached a token outside every sequence"
    if case.lse:
        got_lse = args[4][:, :tq]
        fin = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(got_lse), fin), "LSE -inf pattern differs"
        assert torch.isnan(args[4][:, tq:]).all(), "an LSE store reached a token outside every sequence"
        if fin.any():
            assert (got_lse[fin] - ref_lse[fin]).abs().max().item() < 2e-3


@pytest.mark.parametrize("case", NAN_DENSE, ids=lambda c: c.id)
def test_nan_in_seqused_padding_does_not_leak(kernels, case):
    check_nan_in_seqused_padding(kernels[case.id], case)


@pytest.mark.parametrize("case", NAN_THD, ids=lambda c: c.id)
def test_nan_after_last_packed_sequence_does_not_leak(kernels, case):
    check_nan_after_last_packed_sequence(kernels[case.id], case)


# ---------------------------------------------------------------- padded head dims
# Tiles are padded past a head dim that is not a multiple of 16: every column past d_v of an O row (here slack
# memory before the next row, head or token) must stay as it was.
PADDED_O = [c for c in SM90_FWD_HEAD_DIM_CASES if (c.dv or c.d) % 16 != 0]


@pytest.mark.parametrize("case", PADDED_O, ids=lambda c: c.id)
def test_padded_head_dims_never_write_past_d_v(kernels, case):
    from test.helpers import sdpa_fwd_reference64 as sdpa_fwd_reference

    args, (q, k, v), ref_kw, o, lse = make_args(case, seed=5)
    dv = o.shape[-1]
    wide = torch.full((*o.shape[:-1], dv + 8), float("nan"), dtype=o.dtype, device=o.device)
    args[3] = wide[..., :dv]
    kernels[case.id](*args)
    torch.cuda.synchronize()
    ref_o, _ = sdpa_fwd_reference(q, k, v, RefArgs(**ref_kw))
    assert torch.isfinite(args[3]).all(), f"{int((~torch.isfinite(args[3])).sum())} O elements not finite"
    assert_close_to_oracle(args[3], ref_o, rel=1e-2, name="O")
    assert torch.isnan(wide[..., dv:]).all(), "a store reached a column past d_v"
