"""Shared test helpers: describe an SDPA problem once, build its frost graphs, run them, ask the oracle.

A `Case` holds the geometry and the cuDNN-style mask keywords. `make_inputs`
draws torch tensors laid out as the case says; `run_fwd` / `run_bwd` declare a
graph with `Graph.tensor_like`, plan it (on the CPU target by default) and
execute it; `oracle_fwd` / `oracle_bwd` answer from test/oracle.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

import torch

import frost
from frost.target import CPU
from test import oracle


@dataclass(frozen=True)
class Case:
    batch: int = 2
    hq: int = 4
    hkv: int = 2
    sq: int = 8
    skv: int = 8
    d: int = 16
    dv: Optional[int] = None
    dtype: torch.dtype = torch.float32
    layout: str = "bhsd"  # dense physical layout: "bhsd" or "bshd"
    lens_q: Optional[tuple] = None  # THD: per-sequence lengths; dense: seq_len_q of a padding mask
    lens_kv: Optional[tuple] = None
    thd: bool = False
    extra_q: int = 0  # THD: packed tokens declared (and bound) past the last sequence
    extra_kv: int = 0
    stats: bool = True
    stats_head_major: bool = False  # THD stats (T, H, 1) with strides (1, T, 1)
    sink: bool = False
    sink_4d: bool = False  # declare the sink (1, H, 1, 1) instead of (H,)
    scale: Optional[float] = None
    omit_scale: bool = False  # leave attn_scale out of sdpa() (cuDNN's default: 1.0)
    mask: tuple = ()  # sdpa keywords as (name, value) pairs, e.g. (("use_causal_mask", True),)
    bias: Optional[str] = None  # an additive bias full along these of "b" (batch) and "h" (heads): "bh", "h", ""
    bias_layout: str = "compact"  # or "transposed": the bias's key dim strided, its query dim unit-strided
    alibi: bool = False
    seed: int = 0

    @property
    def head_dim_v(self) -> int:
        return self.dv or self.d

    @property
    def padding(self) -> bool:
        return not self.thd and self.lens_q is not None

    @property
    def attn_scale(self) -> float:
        if self.omit_scale:
            return 1.0
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.d)

    @property
    def bias_dim(self) -> tuple:
        """(B or 1, H or 1, S_q, S_kv); packed batches: the longest sequences."""
        sq = max(self.lens_q) if self.thd else self.sq
        skv = max(self.lens_kv) if self.thd else self.skv
        return (self.batch if "b" in self.bias else 1, self.hq if "h" in self.bias else 1, max(sq, 1), max(skv, 1))

    @property
    def total_q(self) -> int:
        return sum(self.lens_q) + self.extra_q

    @property
    def total_kv(self) -> int:
        return sum(self.lens_kv) + self.extra_kv

    def with_(self, **kw) -> "Case":
        return replace(self, **kw)


def prefix(lens) -> list[int]:
    out = [0]
    for n in lens:
        out.append(out[-1] + int(n))
    return out


def _dense(case: Case, h: int, s: int, d: int, gen) -> torch.Tensor:
    if case.layout == "bshd":
        return torch.randn(case.batch, s, h, d, generator=gen).to(case.dtype).permute(0, 2, 1, 3)
    return torch.randn(case.batch, h, s, d, generator=gen).to(case.dtype)


def make_inputs(case: Case) -> dict:
    """Torch tensors by role: q k v do (+ sink, lengths, cu_seq_lens)."""
    gen = torch.Generator().manual_seed(case.seed)
    t = {}
    if case.thd:
        for role, n, h, d in (
            ("q", case.total_q, case.hq, case.d),
            ("k", case.total_kv, case.hkv, case.d),
            ("v", case.total_kv, case.hkv, case.head_dim_v),
            ("do", case.total_q, case.hq, case.head_dim_v),
        ):
            t[role] = torch.randn(n, h, d, generator=gen).to(case.dtype)
        t["cu_seq_len_q"] = torch.tensor(prefix(case.lens_q), dtype=torch.int32)
        t["cu_seq_len_kv"] = torch.tensor(prefix(case.lens_kv), dtype=torch.int32)
    else:
        t["q"] = _dense(case, case.hq, case.sq, case.d, gen)
        t["k"] = _dense(case, case.hkv, case.skv, case.d, gen)
        t["v"] = _dense(case, case.hkv, case.skv, case.head_dim_v, gen)
        t["do"] = _dense(case, case.hq, case.sq, case.head_dim_v, gen)
        if case.padding:
            t["seq_len_q"] = torch.tensor(case.lens_q, dtype=torch.int32).view(-1, 1, 1, 1)
            t["seq_len_kv"] = torch.tensor(case.lens_kv, dtype=torch.int32).view(-1, 1, 1, 1)
    if case.sink:
        s = torch.randn(case.hq, generator=gen, dtype=torch.float32) * 2
        t["sink"] = s.view(1, case.hq, 1, 1) if case.sink_4d else s
    if case.bias is not None:
        b = torch.randn(case.bias_dim, generator=gen).to(case.dtype)
        if case.bias_layout == "transposed":
            b = b.transpose(2, 3).contiguous().transpose(2, 3)
        t["bias"] = b
    return t


def empty_like_decl(decl: frost.Tensor, fill: float = float("nan")) -> torch.Tensor:
    """A poisoned torch tensor with exactly the declared dims, strides and dtype."""
    dt = decl.data_type.to_torch()
    out = torch.empty_strided(decl.dim, decl.stride, dtype=dt)
    return out.fill_(fill)


def sdpa_keywords(case: Case, g: frost.Graph, t: dict) -> tuple[dict, dict]:
    """(sdpa keywords, {frost tensor: torch tensor}) for the optional inputs of a case."""
    kw = dict(case.mask) if case.omit_scale else dict(attn_scale=case.attn_scale, **dict(case.mask))
    pack = {}
    if case.thd:
        for role in ("cu_seq_len_q", "cu_seq_len_kv"):
            h = g.tensor_like(t[role], name=role)
            kw[role] = h
            pack[h] = t[role]
        kw["max_seq_len_q"] = max(1, max(case.lens_q))
        kw["max_seq_len_kv"] = max(1, max(case.lens_kv))
    if case.padding:
        kw["use_padding_mask"] = True
        for role in ("seq_len_q", "seq_len_kv"):
            h = g.tensor_like(t[role], name=role)
            kw[role] = h
            pack[h] = t[role]
    if case.sink:
        h = g.tensor_like(t["sink"], name="sink")
        kw["sink_token"] = h
        pack[h] = t["sink"]
    if case.bias is not None:
        h = g.tensor_like(t["bias"], name="bias")
        kw["bias"] = h
        pack[h] = t["bias"]
    if case.alibi:
        kw["use_alibi_mask"] = True
    return kw, pack


def fwd_graph(case: Case, t: dict, target=CPU):
    """A validated forward graph for the case: (graph, pack of inputs, o handle, stats handle)."""
    g = frost.Graph(
        io_data_type=case.dtype, intermediate_data_type=torch.float32, compute_data_type=torch.float32, target=target
    )
    q, k, v = (g.tensor_like(t[r], name=r) for r in ("q", "k", "v"))
    kw, pack = sdpa_keywords(case, g, t)
    o, stats = g.sdpa(q, k, v, generate_stats=case.stats, **kw)
    o.set_output(True)
    if stats is not None:
        stats.set_output(True)
        if case.thd and case.stats_head_major:
            stats.set_stride((1, case.total_q, 1))
    pack.update({q: t["q"], k: t["k"], v: t["v"]})
    return g, pack, o, stats


def planned_fwd(case: Case, t: Optional[dict] = None, target=CPU, engine=None):
    """The forward planned, with outputs allocated in its variant pack: (graph, pack, o handle, stats handle)."""
    t = make_inputs(case) if t is None else t
    g, pack, o, stats = fwd_graph(case, t, target)
    g.build_operation_graph().build_plans(engine=engine)
    pack[o] = empty_like_decl(o)
    if stats is not None:
        pack[stats] = empty_like_decl(stats)
    return g, pack, o, stats


def run_fwd(case: Case, t: Optional[dict] = None, target=CPU, engine=None):
    """Plan and execute the forward; returns (o, stats or None) as torch tensors."""
    g, pack, o, stats = planned_fwd(case, t, target, engine)
    g.execute(pack, None)
    return pack[o], pack[stats] if stats is not None else None


def oracle_kwargs(case: Case, t: dict) -> dict:
    kw = dict(scale=case.attn_scale, sink=t.get("sink"), bias=t.get("bias"), alibi=case.alibi)
    mask = dict(case.mask)
    names = {
        "use_causal_mask": "causal",
        "use_causal_mask_bottom_right": "causal_bottom_right",
        "diagonal_alignment": "alignment",
        "diagonal_band_left_bound": "left_bound",
        "diagonal_band_right_bound": "right_bound",
        "sliding_window_length": "sliding_window_length",
    }
    for key, value in mask.items():
        kw[names[key]] = value
    if case.thd:
        kw.update(cu_seq_len_q=prefix(case.lens_q), cu_seq_len_kv=prefix(case.lens_kv))
    elif case.padding:
        kw.update(seq_len_q=list(case.lens_q), seq_len_kv=list(case.lens_kv))
    return kw


def oracle_fwd(case: Case, t: dict):
    """float64 (o, lse) with o in the logical dims of q and lse without its trailing 1."""
    return oracle.attention(t["q"], t["k"], t["v"], **oracle_kwargs(case, t))


def oracle_bwd(case: Case, t: dict, dbias: bool = False):
    """float64 (o, lse, dq, dk, dv, dsink or None[, dbias with `dbias`])."""
    return oracle.attention_grads(t["q"], t["k"], t["v"], t["do"], with_dbias=dbias, **oracle_kwargs(case, t))


def run_bwd(
    case: Case,
    t: Optional[dict] = None,
    target=CPU,
    deterministic: bool = False,
    dsink: bool = True,
    dbias: bool = False,
    engine=None,
):
    """Plan and execute the backward; returns (dq, dk, dv, dsink or None), and dbias with `dbias` (a case with
    a bias; dBias declared like it).

    O and Stats come from the oracle (the reference backward recomputes them).
    """
    t = make_inputs(case) if t is None else t
    o_ref, lse_ref = oracle_fwd(case, t)
    o_in = o_ref.to(case.dtype)
    lse_in = lse_ref.float().unsqueeze(-1)
    g = frost.Graph(
        io_data_type=case.dtype, intermediate_data_type=torch.float32, compute_data_type=torch.float32, target=target
    )
    q, k, v = (g.tensor_like(t[r], name=r) for r in ("q", "k", "v"))
    o = g.tensor_like(o_in, name="o")
    do = g.tensor_like(t["do"], name="dO")
    stats = g.tensor_like(lse_in, name="stats")
    kw, pack = sdpa_keywords(case, g, t)
    dsink_h = None
    dsink_t = None
    if case.sink and dsink:
        dsink_t = torch.full_like(t["sink"], float("nan"))
        dsink_h = g.tensor_like(dsink_t, name="dSink")
        kw["dSink_token"] = dsink_h
    dbias_h = dbias_t = None
    if dbias:
        dbias_t = torch.full_like(t["bias"], float("nan"))
        dbias_h = g.tensor_like(dbias_t, name="dBias")
        kw["dBias"] = dbias_h
        pack[dbias_h] = dbias_t
    dq, dk, dv = g.sdpa_backward(q, k, v, o, do, stats, use_deterministic_algorithm=deterministic, **kw)
    for h in (dq, dk, dv):
        h.set_output(True)
    g.build_operation_graph().build_plans(engine=engine)
    outs = [empty_like_decl(h) for h in (dq, dk, dv)]
    pack.update(
        {q: t["q"], k: t["k"], v: t["v"], o: o_in, do: t["do"], stats: lse_in, dq: outs[0], dk: outs[1], dv: outs[2]}
    )
    if dsink_h is not None:
        pack[dsink_h] = dsink_t
    g.execute(pack, None)
    out = (outs[0], outs[1], outs[2], dsink_t)
    return out + (dbias_t,) if dbias else out


def assert_fwd_matches_oracle(name: str, case: Case, t: Optional[dict] = None):
    """Run the case's forward (on `make_inputs(case)` unless given `t`) and compare O and Stats (absent when the
    case declares none) with the oracle."""
    t = make_inputs(case) if t is None else t
    o, stats = run_fwd(case, t)
    want_o, want_lse = oracle_fwd(case, t)
    assert_close(o, want_o, rtol=1e-6, atol=1e-6, what=f"{name} O")
    if case.stats:
        assert_close(stats, want_lse, rtol=1e-6, atol=1e-6, what=f"{name} Stats")
    else:
        assert stats is None


def assert_bwd_matches_oracle(name: str, case: Case, dbias: bool = False, t: Optional[dict] = None):
    """Run the case's backward (on `make_inputs(case)` unless given `t`) and compare dQ, dK and dV with the
    oracle's; returns (inputs, `run_bwd`'s outputs, `oracle_bwd`'s) for the checks of the optional gradients."""
    t = make_inputs(case) if t is None else t
    got = run_bwd(case, t, dbias=dbias)
    want = oracle_bwd(case, t, dbias=dbias)
    for g, w, what in zip(got[:3], want[2:5], ("dQ", "dK", "dV")):
        assert_close(g, w, rtol=1e-5, atol=1e-6, what=f"{name} {what}")
    return t, got, want


def assert_close(got, want, *, rtol=1e-5, atol=1e-5, what=""):
    """Compare in float64; infinities must match exactly, and no NaN (poison) may remain."""
    got64 = got.double()
    assert not torch.isnan(got64).any(), f"{what}: unwritten (NaN) elements remain"
    torch.testing.assert_close(
        got64, want.double().reshape(got64.shape), rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}"
    )


def rel_err(got, want) -> float:
    want = want.double().reshape(got.shape)
    return ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()


def error_of(fn):
    """(exception type, message) that fn() raises, or None: for comparing two paths' errors."""
    try:
        fn()
    except Exception as e:  # the error is what is compared
        return type(e), str(e)
    return None


def sdpa_fwd_reference64(*args, **kw):
    """frost's canonical-view reference math (`frost.adapters.reference_math.sdpa_fwd_reference`, which takes the
    kernels' own arguments in a `RefArgs`: windows, seqused, canonical layouts) computed in float64 on the same
    inputs, for the kernel-level tests; the graph-level tests use the independent oracle (test/oracle.py), and the
    CPU tests check the reference math against it."""
    from frost.adapters.reference_math import sdpa_fwd_reference

    return sdpa_fwd_reference(*args, compute_dtype=torch.float64, **kw)
