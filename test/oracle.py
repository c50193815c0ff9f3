"""An independent float64 attention oracle for the tests.

Written from the public contract (the cuDNN-style keywords and the mask
semantics in frost.engines.sdpa_args), not from frost's reference code: it
resolves the mask keywords itself, builds the allowed set by explicit
comparison, gathers GQA heads by index and normalizes the softmax by hand, so
a shared mistake between frost and this file is unlikely. Everything is plain
differentiable torch, so torch.autograd gives the gradients.

Inputs use frost's logical dims: dense (B, H, S, D), packed THD (T, H, D); K and
V may have different head counts, each dividing Q's.
Outputs: o in the same form with v's head dim; lse dense (B, H, S), THD (T, H).
With `row_stats=True` also cuDNN's score_max (the row max of the final logits:
scaled, modified and masked, the sink included) and score_sum_exp (the row sum
of exp(logit - max), the sink's term included), shaped like lse.
Rows past a sequence's length get O = 0, LSE = -inf, max = -inf, sum = 0; a row
with no allowed key gets O = 0 and LSE = max = the sink logit, sum = 1 (or -inf,
-inf, 0 without a sink).

Score modifiers follow cuDNN's reference (test_mhas.py compute_ref): logits are
scale * q.k + bias + ALiBi, masks after. `bias` is (B or 1, H or 1, S_q, S_kv),
indexed with sequence-local positions (packed sequences too) and broadcast over
its unit dims; ALiBi adds slope(h) * (j - i) with cuDNN's slopes (`alibi_slopes`).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

NEG_INF = float("-inf")


def band(
    len_q: int,
    len_kv: int,
    *,
    causal: bool = False,
    causal_bottom_right: bool = False,
    alignment: str = "TOP_LEFT",
    left_bound: Optional[int] = None,
    right_bound: Optional[int] = None,
    sliding_window_length: Optional[int] = None,
) -> torch.Tensor:
    """Allowed (len_q, len_kv) key set of one sequence, from the cuDNN-style keywords.

    left bound L (or sliding window L): keep keys j > i + off - L;
    right bound R (causal: R = 0): keep keys j <= i + off + R;
    off = len_kv - len_q for a bottom-right diagonal, else 0.
    """
    bottom = causal_bottom_right or alignment == "BOTTOM_RIGHT"
    off = len_kv - len_q if bottom else 0
    right = 0 if (causal or causal_bottom_right) else right_bound
    left = left_bound if left_bound is not None else sliding_window_length
    rows = torch.arange(len_q).view(-1, 1).expand(len_q, len_kv)
    cols = torch.arange(len_kv).view(1, -1).expand(len_q, len_kv)
    ok = torch.ones(len_q, len_kv, dtype=torch.bool)
    if left is not None:
        ok = ok & (cols > rows + off - left)
    if right is not None:
        ok = ok & (cols <= rows + off + right)
    return ok


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """cuDNN's ALiBi slopes, float64 (num_heads,): with n the largest power of two <= H, heads h < n take
    2^(-8 (h + 1) / n); the others take the odd powers 1, 3, 5, ... of 2^(-4 / n), in order."""
    n = 1
    while n * 2 <= num_heads:
        n *= 2
    slopes = [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]
    slopes += [2.0 ** (-4.0 * (2 * e + 1) / n) for e in range(num_heads - n)]
    return torch.tensor(slopes, dtype=torch.float64)


def _one_sequence(q, k, v, *, scale: float, sink, allowed, bias=None, alibi: bool = False):
    """q (H, n, D), k (Hk, m, D), v (Hv, m, Dv) -> o (H, n, Dv), lse, max, sum_exp (each (H, n));
    bias (H or 1, n, m)."""
    hq = q.shape[0]
    heads = torch.arange(hq, device=q.device)
    allowed = allowed.to(q.device)
    k = k.index_select(0, heads // (hq // k.shape[0]))  # query head h reads K head h // (Hq / Hk)
    v = v.index_select(0, heads // (hq // v.shape[0]))  # and V head h // (Hq / Hv)
    logits = torch.matmul(q, k.transpose(1, 2)) * scale  # (H, n, m)
    if bias is not None:
        logits = logits + bias
    if alibi:
        n, m = logits.shape[1], logits.shape[2]
        dist = (torch.arange(m, device=q.device).view(1, m) - torch.arange(n, device=q.device).view(n, 1)).double()
        logits = logits + alibi_slopes(hq).to(q.device).view(hq, 1, 1) * dist
    logits = torch.where(allowed.unsqueeze(0), logits, torch.full_like(logits, NEG_INF))
    if logits.shape[-1] > 0:
        top = logits.max(dim=-1).values
    else:
        top = torch.full(logits.shape[:2], NEG_INF, dtype=logits.dtype, device=logits.device)
    if sink is not None:
        top = torch.maximum(top, sink.view(hq, 1).expand_as(top))
    row_max = top.detach()
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top)).detach()
    weights = torch.exp(logits - top.unsqueeze(-1))
    denom = weights.sum(dim=-1)
    if sink is not None:
        denom = denom + torch.exp(sink.view(hq, 1) - top)
    empty = denom <= 0
    safe = torch.where(empty, torch.ones_like(denom), denom)
    o = torch.matmul(weights, v) / safe.unsqueeze(-1)
    lse = torch.where(empty, torch.full_like(denom, NEG_INF), top + torch.log(safe))
    return o, lse, row_max, denom.detach()


#: what a row outside every sequence holds in lse, max and sum_exp
_PAD_ROW = (NEG_INF, NEG_INF, 0.0)


def _bias_of(bias, i: int, n: int, m: int):
    """Sequence i's (H or 1, n, m) block of a (B or 1, H or 1, S_q, S_kv) bias (sequence-local positions)."""
    if bias is None:
        return None
    return bias[i if bias.shape[0] > 1 else 0, :, :n, :m]


def attention(
    q,
    k,
    v,
    *,
    scale: float,
    sink=None,
    bias=None,
    alibi: bool = False,
    seq_len_q: Optional[Sequence[int]] = None,
    seq_len_kv: Optional[Sequence[int]] = None,
    cu_seq_len_q: Optional[Sequence[int]] = None,
    cu_seq_len_kv: Optional[Sequence[int]] = None,
    row_stats: bool = False,
    **mask,
):
    """float64 attention -> (o, lse), or (o, lse, max, sum_exp) with `row_stats`. `mask` takes `band`'s
    keywords; lengths are host sequences."""
    q, k, v = q.double(), k.double(), v.double()
    sink = sink.double().reshape(-1) if sink is not None else None
    bias = bias.double() if bias is not None else None
    if cu_seq_len_q is not None:
        out = _packed(
            q,
            k,
            v,
            scale=scale,
            sink=sink,
            bias=bias,
            alibi=alibi,
            cu_q=list(cu_seq_len_q),
            cu_kv=list(cu_seq_len_kv),
            **mask,
        )
        return out if row_stats else out[:2]
    b, hq, sq, _ = q.shape
    skv, dv = k.shape[2], v.shape[3]
    parts = [[], [], [], []]
    for i in range(b):
        n = int(seq_len_q[i]) if seq_len_q is not None else sq
        m = int(seq_len_kv[i]) if seq_len_kv is not None else skv
        o_b, *rows = _one_sequence(
            q[i, :, :n],
            k[i, :, :m],
            v[i, :, :m],
            scale=scale,
            sink=sink,
            allowed=band(n, m, **mask),
            bias=_bias_of(bias, i, n, m),
            alibi=alibi,
        )
        parts[0].append(torch.cat([o_b, q.new_zeros(hq, sq - n, dv)], dim=1))
        for out, r, pad in zip(parts[1:], rows, _PAD_ROW):
            out.append(torch.cat([r, q.new_full((hq, sq - n), pad)], dim=1))
    out = tuple(torch.stack(p) for p in parts)
    return out if row_stats else out[:2]


def _packed(q, k, v, *, scale, sink, bias, alibi, cu_q, cu_kv, **mask):
    tq, hq, _ = q.shape
    dv = v.shape[2]
    parts = [[], [], [], []]
    for i in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[i], cu_q[i + 1], cu_kv[i], cu_kv[i + 1]
        res = _one_sequence(
            q[q0:q1].transpose(0, 1),
            k[k0:k1].transpose(0, 1),
            v[k0:k1].transpose(0, 1),
            scale=scale,
            sink=sink,
            allowed=band(q1 - q0, k1 - k0, **mask),
            bias=_bias_of(bias, i, q1 - q0, k1 - k0),
            alibi=alibi,
        )
        for out, r in zip(parts, res):
            out.append(r.transpose(0, 1))
    tail = tq - cu_q[-1]
    parts[0].append(q.new_zeros(tail, hq, dv))
    for out, pad in zip(parts[1:], _PAD_ROW):
        out.append(q.new_full((tail, hq), pad))
    return tuple(torch.cat(p) for p in parts)


def attention_grads(q, k, v, do, *, scale: float, sink=None, bias=None, with_dbias: bool = False, **kw):
    """(o, lse, dq, dk, dv, dsink or None) in float64 by autograd through `attention`; with `with_dbias`, a
    seventh entry: the bias gradient in the bias's own (broadcast) shape (autograd sums the broadcast dims)."""
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    sink_leaf = sink.detach().double().requires_grad_(True) if sink is not None else None
    bias_leaf = bias.detach().double().requires_grad_(with_dbias) if bias is not None else None
    o, lse = attention(*leaves, scale=scale, sink=sink_leaf, bias=bias_leaf, **kw)
    wrt = leaves + ([sink_leaf] if sink_leaf is not None else []) + ([bias_leaf] if with_dbias else [])
    grads = torch.autograd.grad(o, wrt, grad_outputs=do.double(), allow_unused=True)
    grads = [g if g is not None else torch.zeros_like(t) for g, t in zip(grads, wrt)]
    dsink = grads[3] if sink_leaf is not None else None
    out = (o.detach(), lse.detach(), grads[0], grads[1], grads[2], dsink)
    return out + (grads[-1],) if with_dbias else out


#: unit roundoff (half an ulp at 1.0) of each io data type
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}

#: per-element bound in unit roundoffs of the io type, times max(1, max |reference|): (forward, gradient)
MAX_ABS_ULPS = {"fwd": 8.0, "grad": 16.0}


def max_abs_bound(dtype: torch.dtype, ref64: torch.Tensor, kind: str = "fwd") -> float:
    """The per-element bound `assert_close_to_oracle` uses by default, from the io type.

    Why these: a flash kernel rounds P to the io type before P @ V (relative error u per weight) and rounds O
    once more on the way out, so |O - O64| <= u * max|V| + u * |O|; with unit-variance V (|V| < ~4 over the test
    sizes) that is about 5u, and 8u leaves room. A gradient passes two more rounded products (dP, dS), so twice
    that. The bound scales with max(1, max |reference|), so a test's scale does not change its meaning. In bf16
    that is 0.031 (O) and 0.062 (gradients) per unit of scale; fp16 0.0039 and 0.0078. A row left unwritten,
    zeroed, or taken from the wrong sequence or head is off by the size of the values themselves (about 0.3-1 for
    O), far above either bound, so a few wrong rows fail even where the norm-relative error stays small.
    """
    u = UNIT_ROUNDOFF.get(dtype, 2.0**-8)
    finite = ref64[torch.isfinite(ref64)]
    scale = max(1.0, finite.abs().max().item()) if finite.numel() else 1.0
    return MAX_ABS_ULPS[kind] * u * scale


def assert_close_to_oracle(
    out: torch.Tensor,
    ref64: torch.Tensor,
    *,
    rel: float,
    max_abs: Optional[float] = None,
    name: str = "",
    kind: str = "fwd",
    io_dtype: Optional[torch.dtype] = None,
) -> None:
    """Compare an engine's output with the float64 oracle: norm-relative error below `rel` AND every element
    within `max_abs` (default: `max_abs_bound` of `io_dtype`, else out's dtype, and `kind`, "fwd" or "grad";
    pass the graph's io type for a float32 output such as dSink).

    The norm check bounds the error on average; alone it lets a few wrong rows pass (they hold a small share of
    the norm). The per-element bound fails them. `ref64` must be float64 (the independent oracle, not an engine
    run in fp32); infinities must match exactly; a NaN left in `out` (poison) fails.
    """
    assert ref64.dtype == torch.float64, f"{name}: the reference must be the float64 oracle, got {ref64.dtype}"
    if max_abs is None:
        max_abs = max_abs_bound(io_dtype or out.dtype, ref64, kind)
    got = out.detach().double().cpu()
    want = ref64.detach().cpu().reshape(got.shape)
    assert not torch.isnan(got).any(), f"{name}: {int(torch.isnan(got).sum())} NaN (unwritten) elements"
    fin = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), fin), f"{name}: infinities differ from the oracle's"
    assert torch.equal(got[~fin], want[~fin]), f"{name}: infinities of the wrong sign"
    g, w = got[fin], want[fin]
    if not w.numel():
        return
    err = (g - w).abs()
    norm_rel = ((g - w).norm() / w.norm().clamp_min(1e-30)).item()
    worst = err.max().item()
    assert norm_rel < rel, f"{name}: norm-relative error {norm_rel:.3g} >= {rel:.3g} (max abs error {worst:.3g})"
    if worst >= max_abs:
        full = torch.zeros_like(got)
        full[fin] = got[fin] - want[fin]
        bad = full.abs() >= max_abs
        rows = bad.reshape(-1, got.shape[-1]).any(-1).nonzero().flatten() if got.dim() else bad.nonzero()
        where = tuple(int(i) for i in torch.nonzero(full.abs() == worst)[0]) if got.dim() else ()
        raise AssertionError(
            f"{name}: max abs error {worst:.3g} >= {max_abs:.3g} at {where}; {int(bad.sum())} "
            f"elements in {rows.numel()} rows over the bound (norm-relative {norm_rel:.3g})"
        )


def rel_err_norm(out: torch.Tensor, ref64: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (finite entries of ref only)."""
    got, want = out.double().cpu(), ref64.double().cpu().reshape(out.shape)
    fin = torch.isfinite(want)
    return ((got[fin] - want[fin]).norm() / want[fin].norm().clamp_min(1e-30)).item()
