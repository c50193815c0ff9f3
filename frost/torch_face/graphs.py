"""Declare, plan and launch the frost graphs behind the torch ops, through the public graph API only.

Every port is declared from the tensors of the call that first needs the plan (their dims and
strides), so later calls of the same key bind without a check failing. Packed graphs declare token
envelopes (`envelope()`) so that one plan serves every total up to it. A built graph is kept as a
`Planned`: the graph, its ports in the order the ops bind tensors, and `Graph.executor`, the one way a
plan launches (`Planned.run`).
"""

from __future__ import annotations

import contextlib

from dataclasses import dataclass
from typing import Optional

import torch

import frost
from frost.torch_face.spec import Band, default_scale, specialization


@dataclass(eq=False)
class Planned:
    """A built graph and the handles of its ports, in the order `run` takes tensors."""

    graph: object
    handles: tuple
    workspace_size: int
    spec: object  # spec.Specialization
    plan_seconds: float = 0.0
    used: int = 0  # the tick of its last use (the plan cache's recency)
    live: bool = True  # False once evicted or cleared (a memoized launch then plans again)
    executor: object = None  # graph.executor(handles): positional binding, no variant pack per call

    def __post_init__(self):
        if self.executor is None:
            self.executor = self.graph.executor(self.handles)

    def run(self, tensors, device, pinned: bool = False) -> None:
        """Bind `tensors` (in handle order) and execute on `device`'s current stream, with a workspace
        allocated there.

        Every check of execute applies, unless `pinned`: the caller's cache key holds each tensor's dtype,
        dims and strides, as when the plan was declared from tensors with that key (the executor's
        `launch` then checks devices and alignment)."""
        if device.type == "cuda" and device.index != current_device():
            with torch.cuda.device(device):
                self._run(tensors, device, pinned)
        else:
            self._run(tensors, device, pinned)

    def _run(self, tensors, device, pinned):
        ws = torch.empty(self.workspace_size, dtype=torch.uint8, device=device) if self.workspace_size else None
        if pinned:
            self.executor.launch(tensors, ws)
        else:
            self.executor(tensors, ws)

    @property
    def engine_name(self) -> str:
        return self.graph.engine_name


# the current CUDA device's index, through torch's C getter (called only where a tensor lives on a GPU)
current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def device_guard(device):
    """`device` made current for a block when it is a GPU other than the current one, else nothing: plans and
    launches are for the tensors' device (frost/runtime/device.py). Hot launch paths inline the test instead."""
    if device.type == "cuda" and device.index is not None and device.index != current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def target_of(device) -> Optional[object]:
    """frost's Target for a torch device: the CPU record for CPU tensors, the device's record otherwise."""
    from frost.target import CPU, discover_target

    if device.type == "cpu":
        return CPU
    return discover_target(device.index if device.index is not None else None)


def envelope(n: int) -> int:
    """A token envelope at least `n`: n rounded up to an eighth of its power of two (at most 25% over)."""
    n = max(int(n), 1)
    step = max((1 << (n - 1).bit_length()) // 8, 1)
    return -(-n // step) * step


def _graph(dtype, device, name):
    return frost.Graph(
        io_data_type=dtype,
        intermediate_data_type=torch.float32,
        compute_data_type=torch.float32,
        name=name,
        target=target_of(device),
    )


def _packed_like(g, t, name, total):
    """A packed (T, H, D) port declared with the token envelope `total` as its first dim."""
    return g.tensor(name=name, dim=(total, *t.shape[1:]), stride=tuple(t.stride()), data_type=t.dtype)


def _declare_io(g, named, packed):
    """Ports for the (name, tensor) pairs; packed ones get their group's token envelope (q- or kv-side)."""
    return [(_packed_like(g, t, n, packed[n]) if packed else g.tensor_like(t, name=n)) for n, t in named]


def _sdpa_keywords(g, q, band: Band, scale, sinks, cu, max_seqlens):
    kw = dict(attn_scale=default_scale(q.shape[-1], scale), **band.graph_keywords())
    extra = []
    if sinks is not None:
        kw["sink_token"] = g.tensor_like(sinks, name="sinks")
        extra.append(kw["sink_token"])
    if cu is not None:
        kw["cu_seq_len_q"] = g.tensor_like(cu[0], name="cu_seqlens_q")
        kw["cu_seq_len_kv"] = g.tensor_like(cu[1], name="cu_seqlens_k")
        kw["max_seq_len_q"], kw["max_seq_len_kv"] = max_seqlens
        extra += [kw["cu_seq_len_q"], kw["cu_seq_len_kv"]]
    return kw, extra


def _stats_layout(lse_view, packed_total):
    """(dims, strides) of the Stats port; packed: the head-major (H, T) lse seen as (T, H, 1), declared at
    the envelope and bound at any total (frost derives the head stride from the bound total)."""
    if packed_total:
        return (packed_total, lse_view.shape[1], 1), (1, packed_total, 1)
    return tuple(lse_view.shape), tuple(lse_view.stride())


def _set_output(port, t, total=None):
    dims = (total, *t.shape[1:]) if total else tuple(t.shape)
    port.set_output(True).set_dim(dims).set_stride(tuple(t.stride()))


def _finish(g, handles, spec, device=None) -> Planned:
    g.validate()
    with device_guard(device) if device is not None else contextlib.nullcontext():
        g.build_plans()
    return Planned(graph=g, handles=tuple(handles), workspace_size=g.get_workspace_size(), spec=spec)


def build_forward(q, k, v, out, lse_view, sinks, scale, band: Band, cu=None, max_seqlens=None, totals=None) -> Planned:
    """Plan `out, lse = sdpa(q, k, v)`; handles: q, k, v, o, [stats], [sinks], [cu_q, cu_k].

    Dense tensors are (B, H, S, D) and `lse_view` (B, H, S, 1); packed ones are (T, H, D) with
    `lse_view` (T, H, 1) head-major, `cu` the prefix sums and `totals` the (q, kv) token envelopes.
    `lse_view` None plans without Stats (generate_stats=False: no lse is written).
    """
    packed = cu is not None
    stats_on = lse_view is not None
    g = _graph(q.dtype, q.device, "frost_torch_fwd")
    env = {"q": totals[0], "k": totals[1], "v": totals[1]} if packed else None
    hq, hk, hv = _declare_io(g, (("q", q), ("k", k), ("v", v)), env)
    kw, extra = _sdpa_keywords(g, q, band, scale, sinks, cu, max_seqlens)
    o, stats = g.sdpa(hq, hk, hv, generate_stats=stats_on, **kw)
    _set_output(o, out, totals[0] if packed else None)
    if stats_on:
        dims, strides = _stats_layout(lse_view, totals[0] if packed else None)
        stats.set_output(True).set_dim(dims).set_stride(strides)
    spec = specialization(
        "fwd", q, k, v, band=band, sinks=sinks, packed=packed, arch=g.target.arch, scale=scale, has_stats=stats_on
    )
    return _finish(g, (hq, hk, hv, o, *((stats,) if stats_on else ()), *extra), spec, q.device)


def build_backward(
    dout,
    q,
    k,
    v,
    out,
    lse_view,
    grads,
    sinks,
    dsinks,
    scale,
    band: Band,
    deterministic: bool,
    cu=None,
    max_seqlens=None,
    totals=None,
) -> Planned:
    """Plan the gradients; handles: q, k, v, o, dO, stats, dQ, dK, dV, [sinks, dSink], [cu_q, cu_k]."""
    packed = cu is not None
    g = _graph(q.dtype, q.device, "frost_torch_bwd")
    env = {"q": totals[0], "o": totals[0], "dO": totals[0], "k": totals[1], "v": totals[1]} if packed else None
    hq, hk, hv, ho, hdo = _declare_io(g, (("q", q), ("k", k), ("v", v), ("o", out), ("dO", dout)), env)
    dims, strides = _stats_layout(lse_view, totals[0] if packed else None)
    hstats = g.tensor(name="stats", dim=dims, stride=strides, data_type=torch.float32)
    kw, extra = _sdpa_keywords(g, q, band, scale, sinks, cu, max_seqlens)
    hds = None
    if sinks is not None:
        hds = g.tensor_like(dsinks, name="dsinks")
    dq, dk, dv = g.sdpa_backward(
        hq, hk, hv, ho, hdo, hstats, use_deterministic_algorithm=deterministic, dSink_token=hds, **kw
    )
    for port, t, total in (
        (dq, grads[0], totals and totals[0]),
        (dk, grads[1], totals and totals[1]),
        (dv, grads[2], totals and totals[1]),
    ):
        _set_output(port, t, total if packed else None)
    spec = specialization(
        "bwd",
        q,
        k,
        v,
        band=band,
        sinks=sinks,
        packed=packed,
        arch=g.target.arch,
        scale=scale,
        deterministic=deterministic,
        extra=(out, dout),
    )
    sink_ports = (extra[0], hds) if sinks is not None else ()
    cu_ports = tuple(extra[-2:]) if packed else ()
    return _finish(g, (hq, hk, hv, ho, hdo, hstats, dq, dk, dv, *sink_ports, *cu_ports), spec, q.device)


build_forward.what = "the attention forward"  # named in the plan cache's errors
build_backward.what = "the attention backward"
