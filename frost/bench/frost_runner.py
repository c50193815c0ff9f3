"""frost's engines as benchmark implementations, through frost's public graph API only.

Everything the harness knows about frost's API lives in this module, so an API
change is a one-file fix. Graphs declare BSHD physical strides for dense rows
(logical dims (B, H, S, D)) and packed (T, H, D) tensors with `cu_seq_len_*`
prefix sums for THD rows. Backward rows get O and the softmax stats from one
frost forward per buffer set (the reference math when no frost forward runs);
deterministic rows declare `use_deterministic_algorithm=True` on the backward.
Paged rows declare cuDNN's paged cache: K and V containers (num_blocks, H_kv,
block_size, D) over the (num_blocks, block_size, H_kv, D) caches, the block table
as (B, 1, max_blocks, 1), the padding mask's lengths and the envelope.
"""

from __future__ import annotations

import time

from frost.bench.impl import Implementation, Prepared, Unsupported, short_reason
from frost.bench.inputs import torch_dtype
from frost.bench.workloads import Workload


def cudnn_engine_unavailable() -> str | None:
    """Why frost's cuDNN engine cannot run here (its binding is missing or too old), None when it can; never
    touches the GPU. Graphs it declines still read n/a per row."""
    try:
        from frost.adapters.cudnn import cudnn_missing_reason
    except Exception as e:
        return f"frost has no cuDNN engine: {short_reason(e)}"
    return cudnn_missing_reason()


def frost_unavailable() -> str | None:
    """Why frost's graph API cannot be used here (None when it can)."""
    try:
        import frost
    except Exception as e:
        return f"import frost failed: {short_reason(e)}"
    missing = [n for n in ("Graph", "ExecutionContext") if not hasattr(frost, n)]
    if missing:
        return f"frost has no {', '.join(missing)} (graph API not available)"
    return None


# ---- declarations -------------------------------------------------------------
def _bshd(b: int, h: int, s: int, d: int) -> tuple[tuple, tuple]:
    """Logical (B, H, S, D) dims with token-major (BSHD) physical strides."""
    return (b, h, s, d), (s * h * d, d, h * d, 1)


def _thd(t: int, h: int, d: int) -> tuple[tuple, tuple]:
    return (t, h, d), (h * d, d, 1)


def _geom(w: Workload, which: str) -> tuple[tuple, tuple]:
    heads = w.heads_q if which in ("q", "o") else w.heads_kv
    d = w.d_v if which in ("o", "v") else w.d_qk
    if w.is_thd:
        return _thd(w.total_q if which in ("q", "o") else w.total_kv, heads, d)
    if w.is_paged and which in ("k", "v"):  # the containers: blocks for batch, a block's rows for S
        return _bshd(w.num_blocks, heads, w.block_size, d)
    return _bshd(w.batch, heads, w.seqlen_q if which in ("q", "o") else w.seqlen_kv, d)


def _default_stats_geom(w: Workload) -> tuple[tuple, tuple]:
    """Stats layout when the graph does not report one: compact (B, H, S, 1), or (T, H, 1) for THD."""
    if w.is_thd:
        return (w.total_q, w.heads_q, 1), (w.heads_q, 1, 1)
    return (w.batch, w.heads_q, w.seqlen_q, 1), (w.heads_q * w.seqlen_q, w.seqlen_q, 1, 1)


def _stats_geom(w: Workload) -> tuple[tuple, tuple]:
    """The stats layout a frost forward of this workload declares (what its backward consumes)."""
    try:
        return _FwdGraph(w, generate_stats=True).stats_geom()
    except Exception:
        return _default_stats_geom(w)


def _declared_geom(t) -> tuple[tuple, tuple] | None:
    for dim_name, stride_name in (("get_dim", "get_stride"), ("dim", "stride")):
        d, s = getattr(t, dim_name, None), getattr(t, stride_name, None)
        try:
            d = d() if callable(d) else d
            s = s() if callable(s) else s
        except Exception:
            continue
        if d and s and len(d) == len(s):
            return tuple(int(x) for x in d), tuple(int(x) for x in s)
    return None


def _new_graph(w: Workload):
    import frost
    import torch

    dt = torch_dtype(w.dtype)
    return frost.Graph(io_data_type=dt, intermediate_data_type=torch.float32, compute_data_type=torch.float32)


def _tensor(g, w: Workload, name: str, which: str):
    dim, stride = _geom(w, which)
    return g.tensor(name=name, dim=dim, stride=stride, data_type=torch_dtype(w.dtype))


def _thd_kwargs(g, w: Workload) -> dict:
    import torch

    if not w.is_thd:
        return {}
    n = w.num_seqs + 1
    cu_q = g.tensor(name="cu_seq_len_q", dim=(n,), stride=(1,), data_type=torch.int32)
    cu_kv = g.tensor(name="cu_seq_len_kv", dim=(n,), stride=(1,), data_type=torch.int32)
    return {"cu_seq_len_q": cu_q, "cu_seq_len_kv": cu_kv, "max_seq_len_q": w.max_seqlen, "max_seq_len_kv": w.max_seqlen}


def _paged_kwargs(g, w: Workload) -> dict:
    """The paged cache's keywords (tables, lengths, envelope); a causal paged row is bottom-right aligned."""
    import torch

    if not w.is_paged:
        return {}
    one = (1, 1, 1, 1)
    m = w.blocks_per_seq
    kw = {
        f"paged_attention_{r}_table": g.tensor(
            name=f"block_table_{r}", dim=(w.batch, 1, m, 1), stride=(m, m, 1, 1), data_type=torch.int32
        )
        for r in ("k", "v")
    }
    kw.update(
        {
            r: g.tensor(name=r, dim=(w.batch, 1, 1, 1), stride=one, data_type=torch.int32)
            for r in ("seq_len_q", "seq_len_kv")
        }
    )
    kw.update(use_padding_mask=True, paged_attention_max_seq_len_kv=w.seqlen_kv)
    return kw


def _mask_kwargs(w: Workload) -> dict:
    if w.is_paged:
        return {"use_causal_mask_bottom_right": w.causal}
    return {"use_causal_mask": w.causal}


def _set_out(t, w: Workload, which: str):
    dim, stride = _geom(w, which)
    t.set_output(True)
    t.set_dim(dim)
    t.set_stride(stride)


class _FwdGraph:
    def __init__(self, w: Workload, generate_stats: bool):
        self.w = w
        self.g = g = _new_graph(w)
        self.q, self.k, self.v = _tensor(g, w, "q", "q"), _tensor(g, w, "k", "k"), _tensor(g, w, "v", "v")
        self.thd = _thd_kwargs(g, w)
        self.paged = _paged_kwargs(g, w)
        self.o, self.stats = g.sdpa(
            self.q,
            self.k,
            self.v,
            attn_scale=w.scale,
            generate_stats=generate_stats,
            name="sdpa",
            **_mask_kwargs(w),
            **self.thd,
            **self.paged,
        )
        _set_out(self.o, w, "o")
        if generate_stats:
            self.stats.set_output(True)
        g.validate()

    def stats_geom(self) -> tuple[tuple, tuple]:
        return _declared_geom(self.stats) or _default_stats_geom(self.w)


class _BwdGraph:
    def __init__(self, w: Workload, stats_geom: tuple[tuple, tuple]):
        import torch

        self.w = w
        self.g = g = _new_graph(w)
        self.q, self.k, self.v = _tensor(g, w, "q", "q"), _tensor(g, w, "k", "k"), _tensor(g, w, "v", "v")
        self.o, self.do = _tensor(g, w, "o", "o"), _tensor(g, w, "dO", "o")
        self.stats = g.tensor(name="stats", dim=stats_geom[0], stride=stats_geom[1], data_type=torch.float32)
        self.thd = _thd_kwargs(g, w)
        self.dq, self.dk, self.dv = g.sdpa_backward(
            self.q,
            self.k,
            self.v,
            self.o,
            self.do,
            self.stats,
            attn_scale=w.scale,
            use_causal_mask=w.causal,
            use_deterministic_algorithm=w.deterministic,
            name="sdpa_backward",
            **self.thd,
        )
        _set_out(self.dq, w, "q")
        _set_out(self.dk, w, "k")
        _set_out(self.dv, w, "v")
        g.validate()


def _graph_for_listing(w: Workload):
    if w.direction == "fwd":
        return _FwdGraph(w, generate_stats=False).g
    return _BwdGraph(w, _stats_geom(w)).g


def engine_short(name: str) -> str:
    """Column name of an engine: 'SdpaFwdDslSm90' and 'SdpaBwdDslSm90' are both 'sm90'."""
    for prefix in ("SdpaFwd", "SdpaBwd"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    if name.startswith("Dsl"):
        name = name[3:]
    return name.lower() or "engine"


def list_engines(w: Workload) -> list[str]:
    """Full names of frost engines that accept this workload's graph on this machine, best first.

    Raises Unsupported (carrying frost's per-engine reasons) when none does.
    """
    try:
        g = _graph_for_listing(w)
        names = list(g.available_engines())
    except NotImplementedError as e:  # frost's declines are NotImplementedError subclasses
        raise Unsupported(" ".join(str(e).split())) from None
    if not names:
        declines = getattr(g, "declines", lambda: [])()
        detail = "; ".join(f"{engine_short(n)}: {r}" for n, r in declines)
        raise Unsupported("no frost engine accepts this graph" + (f" ({detail})" if detail else ""))
    return names


# ---- binding --------------------------------------------------------------------
def _view(w: Workload, t):
    """The logical (B, H, S, D) view of token-major storage; packed tensors bind as they are."""
    return t if w.is_thd else t.transpose(1, 2)


def _ctx(stream):
    import frost

    return frost.ExecutionContext(stream=stream)


def _current_stream(device):
    """torch's current stream on a CUDA device; None (frost's default) elsewhere."""
    import torch

    return torch.cuda.current_stream(device) if getattr(device, "type", "") == "cuda" else None


def _workspace(g, device):
    import torch

    return torch.empty(int(g.get_workspace_size()), dtype=torch.uint8, device=device)


def _empty_stats(geom, device):
    import torch

    return torch.empty_strided(geom[0], geom[1], dtype=torch.float32, device=device)


def _fill_stats(stats_t, lse, w: Workload) -> None:
    """Copy the reference LSE ((B, H, S) dense, (H, T) packed) into frost's stats tensor."""
    if w.is_thd:
        src = lse.t() if stats_t.shape[:2] == (w.total_q, w.heads_q) else lse
    else:
        src = lse
    stats_t.copy_(src.reshape(stats_t.shape))


def _forward_state(inputs):
    """(o, stats) per buffer set for backward rows, from one frost forward (cached on `inputs`)."""
    cached = getattr(inputs, "_frost_fwd_state", None)
    if cached is not None:
        return cached
    import torch

    w = inputs.workload
    outs = []
    try:
        fg = _FwdGraph(w, generate_stats=True)
        fg.g.build_plans(engine=None)
        geom = fg.stats_geom()
        dev = inputs.sets[0].q.device
        ws, ctx = _workspace(fg.g, dev), _ctx(_current_stream(dev))
        for b in inputs.sets:
            o = torch.empty(inputs.o_shape, dtype=b.q.dtype, device=dev)
            st = _empty_stats(geom, dev)
            binds = {fg.q: _view(w, b.q), fg.k: _view(w, b.k), fg.v: _view(w, b.v), fg.o: _view(w, o), fg.stats: st}
            binds.update(_thd_binds(fg, inputs, b))
            fg.g.execute(binds, ws, ctx)
            outs.append((o, st))
        source = f"frost forward ({getattr(fg.g, 'engine_name', '?')})"
    except Exception as e:
        from frost.bench.reference import reference_forward

        geom = _stats_geom(w)
        outs = []
        for b in inputs.sets:
            o, lse = reference_forward(w, b.q, b.k, b.v, table=b.table)
            st = _empty_stats(geom, b.q.device)
            _fill_stats(st, lse, w)
            outs.append((o, st))
        source = f"fp32 reference (frost forward failed: {short_reason(e, 120)})"
    state = (geom, outs, source)
    inputs._frost_fwd_state = state
    return state


def _thd_binds(graph, inputs, b=None) -> dict:
    """The packed form's prefix sums, or a paged row's tables (of buffer set `b`) and lengths."""
    paged = getattr(graph, "paged", None)
    if paged:
        table = b.table[:, None, :, None]
        n = inputs.workload.batch
        return {
            paged["paged_attention_k_table"]: table,
            paged["paged_attention_v_table"]: table,
            paged["seq_len_q"]: inputs.seqused_q.view(n, 1, 1, 1),
            paged["seq_len_kv"]: inputs.seqused_k.view(n, 1, 1, 1),
        }
    if not graph.thd:
        return {}
    return {graph.thd["cu_seq_len_q"]: inputs.cu_seqlens, graph.thd["cu_seq_len_kv"]: inputs.cu_seqlens}


class FrostEngine(Implementation):
    """One frost engine, planned explicitly by name."""

    is_frost = True

    def __init__(self, engine: str):
        self.engine = engine
        self.key = f"frost:{engine_short(engine)}"
        self.label = f"frost {engine}"

    def unavailable(self) -> str | None:
        return frost_unavailable()

    def prepare(self, inputs) -> Prepared:
        import torch

        w = inputs.workload
        t0 = time.perf_counter()
        if w.direction == "fwd":
            gr = _FwdGraph(w, generate_stats=False)
        else:
            geom, fwd_outs, source = _forward_state(inputs)
            gr = _BwdGraph(w, geom)
        try:
            gr.g.build_plans(engine=self.engine)
        except NotImplementedError as e:  # the engine declined when asked to build (cuDNN's own verdict): n/a
            raise Unsupported(" ".join(str(e).split())) from None
        plan_s = time.perf_counter() - t0
        dev = inputs.sets[0].q.device
        ws = _workspace(gr.g, dev)
        ctx = [_ctx(_current_stream(dev))]

        binds, outs = [], []
        for i, b in enumerate(inputs.sets):
            d = {gr.q: _view(w, b.q), gr.k: _view(w, b.k), gr.v: _view(w, b.v)}
            d.update(_thd_binds(gr, inputs, b))
            if w.direction == "fwd":
                o = torch.empty(inputs.o_shape, dtype=b.q.dtype, device=dev)
                d[gr.o] = _view(w, o)
                outs.append((o,))
            else:
                o, st = fwd_outs[i]
                dq, dk, dv = torch.empty_like(b.q), torch.empty_like(b.k), torch.empty_like(b.v)
                d.update(
                    {
                        gr.o: _view(w, o),
                        gr.do: _view(w, b.do),
                        gr.stats: st,
                        gr.dq: _view(w, dq),
                        gr.dk: _view(w, dk),
                        gr.dv: _view(w, dv),
                    }
                )
                outs.append((dq, dk, dv))
            binds.append(d)

        g = gr.g
        calls = [lambda d=d: g.execute(d, ws, ctx[0]) for d in binds]

        def poison(i):
            for t in outs[i]:
                t.fill_(float("nan"))

        def bind_stream(stream):
            ctx[0] = _ctx(stream)

        info = {
            "engine_name": str(getattr(g, "engine_name", self.engine)),
            "plan_s": round(plan_s, 3),
            "workspace_bytes": int(ws.numel()),
        }
        if w.direction == "bwd":
            info["o_and_stats_from"] = source
            info["deterministic"] = g.facts.deterministic
        return Prepared(calls=calls, outputs=lambda i: outs[i], poison=poison, bind_stream=bind_stream, info=info)
