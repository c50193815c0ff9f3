"""Build frost SDPA graphs from torch tensors for the GPU suites (engine-agnostic)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

import frost


@dataclass
class FwdCase:
    d: int = 128
    dv: int | None = None
    hq: int = 4
    hkv: int = 4
    b: int = 2
    sq: int = 256
    skv: int = 256
    causal: bool = False
    bottom_right: bool = False
    left: int | None = None  # sliding_window_length
    sinks: bool = False
    padding: bool = False
    thd_lens: list | None = None  # per-batch (len_q, len_kv) for THD
    layout: str = "bshd"  # or "bhsd", or "wide" (BSHD rows longer than the head dim, the extra columns NaN)
    stats: bool = True
    dtype: torch.dtype = torch.bfloat16
    extra: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        parts = [f"d{self.d}" + (f"x{self.dv}" if self.dv else ""), f"h{self.hq}-{self.hkv}", self.layout]
        for flag, name in (
            (self.causal, "causal"),
            (self.bottom_right, "br"),
            (self.sinks, "sinks"),
            (self.padding, "pad"),
            (self.thd_lens is not None, "thd"),
            (not self.stats, "nostats"),
        ):
            if flag:
                parts.append(name)
        if self.left:
            parts.append(f"win{self.left}")
        if self.sq != self.skv:
            parts.append(f"s{self.sq}x{self.skv}")
        return "-".join(parts)


WIDE = 8  # extra elements per row of the "wide" layout (a 16-byte multiple, as every declared stride must be)


def _dense(b, h, s, d, layout, dtype, dev):
    if layout == "bshd":
        return torch.randn(b, s, h, d, device=dev, dtype=dtype).permute(0, 2, 1, 3)
    if layout == "wide":  # BSHD rows WIDE elements longer than the head dim, the extra columns NaN (never read)
        x = torch.randn(b, s, h, d + WIDE, device=dev, dtype=dtype)
        x[..., d:] = float("nan")
        return x[..., :d].permute(0, 2, 1, 3)
    return torch.randn(b, h, s, d, device=dev, dtype=dtype)


def wide_like(x, values=None):
    """A "wide" (B, H, S, D) view shaped like `x`: BSHD rows WIDE elements longer, holding `values` (NaN if
    None), the extra columns NaN."""
    b, h, s, d = x.shape
    buf = torch.full((b, s, h, d + WIDE), float("nan"), dtype=x.dtype, device=x.device)
    out = buf[..., :d].permute(0, 2, 1, 3)
    if values is not None:
        out.copy_(values)
    return out


def extra_cols(x):
    """The WIDE columns past a "wide" view's head dim."""
    return torch.as_strided(x, x.shape[:-1] + (WIDE,), x.stride(), x.storage_offset() + x.shape[-1])


def make_fwd(case: FwdCase, dev="cuda", seed=0):
    """Returns (graph, tensors dict keyed by frost Tensor, torch tensors by role)."""
    torch.manual_seed(seed)
    dv = case.dv or case.d
    g = frost.Graph(io_data_type=case.dtype, intermediate_data_type=torch.float32, compute_data_type=torch.float32)
    t = {}
    kw = dict(attn_scale=1.0 / math.sqrt(case.d), generate_stats=case.stats)
    if case.causal and case.bottom_right:
        kw["use_causal_mask_bottom_right"] = True
    elif case.causal:
        kw["use_causal_mask"] = True
    elif case.bottom_right:
        kw["diagonal_alignment"] = "BOTTOM_RIGHT"
    if case.left:
        kw["sliding_window_length"] = case.left
    if case.thd_lens is not None:
        lq = [a for a, _ in case.thd_lens]
        lk = [b for _, b in case.thd_lens]
        tq, tk = sum(lq), sum(lk)
        t["q"] = torch.randn(max(tq, 1), case.hq, case.d, device=dev, dtype=case.dtype)[:tq]
        t["k"] = torch.randn(max(tk, 1), case.hkv, case.d, device=dev, dtype=case.dtype)[:tk]
        t["v"] = torch.randn(max(tk, 1), case.hkv, dv, device=dev, dtype=case.dtype)[:tk]
        t["o"] = torch.empty(tq, case.hq, dv, device=dev, dtype=case.dtype)
        t["cu_seq_len_q"] = torch.tensor([0] + list(_cumsum(lq)), device=dev, dtype=torch.int32)
        t["cu_seq_len_kv"] = torch.tensor([0] + list(_cumsum(lk)), device=dev, dtype=torch.int32)
        if case.stats:
            t["stats"] = torch.empty(tq, case.hq, 1, device=dev, dtype=torch.float32)
        kw.update(max_seq_len_q=max(max(lq), 1), max_seq_len_kv=max(max(lk), 1))
    else:
        t["q"] = _dense(case.b, case.hq, case.sq, case.d, case.layout, case.dtype, dev)
        t["k"] = _dense(case.b, case.hkv, case.skv, case.d, case.layout, case.dtype, dev)
        t["v"] = _dense(case.b, case.hkv, case.skv, dv, case.layout, case.dtype, dev)
        t["o"] = _dense(case.b, case.hq, case.sq, dv, case.layout, case.dtype, dev)
        if case.stats:
            t["stats"] = torch.empty(case.b, case.hq, case.sq, 1, device=dev, dtype=torch.float32)
        if case.padding:
            t["seq_len_q"] = torch.randint(1, case.sq + 1, (case.b, 1, 1, 1), device=dev, dtype=torch.int32)
            t["seq_len_kv"] = torch.randint(1, case.skv + 1, (case.b, 1, 1, 1), device=dev, dtype=torch.int32)
    if case.sinks:
        t["sink_token"] = torch.randn(1, case.hq, 1, 1, device=dev, dtype=torch.float32)
    decl = {role: g.tensor_like(x, name=role) for role, x in t.items() if role not in ("o", "stats")}
    if case.thd_lens is not None:
        # envelopes: declare the packed totals as the dims (the bound tensors may hold fewer tokens)
        for role in ("q", "k", "v"):
            decl[role].set_dim(tuple(t[role].shape)).set_stride(tuple(t[role].stride()))
        kw.update(cu_seq_len_q=decl["cu_seq_len_q"], cu_seq_len_kv=decl["cu_seq_len_kv"])
    if case.padding:
        kw.update(use_padding_mask=True, seq_len_q=decl["seq_len_q"], seq_len_kv=decl["seq_len_kv"])
    if case.sinks:
        kw["sink_token"] = decl["sink_token"]
    o, stats = g.sdpa(decl["q"], decl["k"], decl["v"], **kw)
    o.set_output(True).set_dim(tuple(t["o"].shape)).set_stride(tuple(t["o"].stride()))
    decl["o"] = o
    if case.stats:
        stats.set_output(True).set_dim(tuple(t["stats"].shape)).set_stride(tuple(t["stats"].stride()))
        decl["stats"] = stats
    return g, decl, t


def _cumsum(xs):
    acc = 0
    for x in xs:
        acc += x
        yield acc


def plan_or_skip(g, engine):
    """Validate and build `g` for `engine`; skip the test (with the engine's reasons) when it declines."""
    import pytest

    g.validate()
    try:
        g.build_plans(engine=engine)
    except frost.NotSupportedError as e:
        pytest.skip(f"{engine} declines: {e.declines}")
    return g


class BlockedDefaultStream:
    """Hold the default stream on a host-mapped flag (cuStreamWaitValue32): busy, but occupying no SM.

    A kernel that keeps the default stream busy would hold an SM, and a persistent grid's CTA for that SM
    would then wait for it even when launched on another stream; a stream wait on memory avoids that.
    """

    def __enter__(self):
        import pytest

        try:
            import cuda.bindings.driver as drv
        except ImportError as e:  # pragma: no cover - the GPU images have it
            pytest.skip(f"cuda.bindings is needed to block a stream without a kernel: {e}")
        self.flag = torch.zeros(1, dtype=torch.int32).pin_memory()
        geq = int(drv.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)
        (err,) = drv.cuStreamWaitValue32(drv.CUstream(0), drv.CUdeviceptr(self.flag.data_ptr()), drv.cuuint32_t(1), geq)
        if err != drv.CUresult.CUDA_SUCCESS:
            pytest.skip(f"cuStreamWaitValue32 is not available here: {err}")
        self.marker = torch.cuda.Event()
        self.marker.record(torch.cuda.default_stream())
        return self

    def still_blocked(self) -> bool:
        return not self.marker.query()

    def __exit__(self, *exc):
        self.flag[0] = 1
        torch.cuda.synchronize()
        return False


def wait_for(event, seconds: float = 10.0) -> bool:
    """Poll an event (never block on it: a wrong launch stream would deadlock behind a blocked stream)."""
    import time

    end = time.monotonic() + seconds
    while not event.query():
        if time.monotonic() > end:
            return False
        time.sleep(0.001)
    return True


def pack(decl, tensors):
    return {decl[r]: tensors[r] for r in decl}


def rel_err(x, ref, mask=None):
    x, ref = x.double(), ref.double()
    if mask is not None:
        x, ref = x[mask], ref[mask]
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def runs_while_default_blocked(launch, side) -> tuple:
    """Call `launch()` with the default stream held: (whether `side` then finishes, whether the default stream was
    still held when it did). A launch that waited on the default stream never finishes."""
    import torch

    with BlockedDefaultStream() as blocked:
        launch()
        done = torch.cuda.Event()
        done.record(side)
        finished = wait_for(done)
        still_blocked = blocked.still_blocked()
    return finished, still_blocked


def assert_runs_on_side_stream(launch, side) -> None:
    """`launch()` finishes on `side` while the default stream is held (it never waits on the default stream)."""
    finished, still_blocked = runs_while_default_blocked(launch, side)
    assert finished, "execute did not finish while the default stream was held: it waited for the default stream"
    assert still_blocked, "the default stream was not held during the check"


def assert_executes_clean(g, vp, ws, ctx, times: int = 3) -> None:
    """`times` executes neither synchronize (sync debug mode "error") nor allocate."""
    before = torch.cuda.memory_allocated()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(times):
            g.execute(vp, ws, ctx)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before


def capture_after_clean_execute(g, vp, ws, stream):
    """Execute once on `stream` (warm-up outside any capture), check that a second execute neither synchronizes
    (sync debug mode "error") nor allocates, then capture one execute in a CUDA graph on `stream`; returns it."""
    ctx = frost.ExecutionContext(stream=stream)
    g.execute(vp, ws, ctx)
    torch.cuda.synchronize()
    assert_executes_clean(g, vp, ws, ctx, times=1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        g.execute(vp, ws, ctx)
    return graph


def oracle_kwargs(case: FwdCase, t: dict) -> dict:
    """test/oracle.py's keywords for a case made by `make_fwd` (host lengths read from its tensors)."""
    kw = dict(scale=1.0 / math.sqrt(case.d))
    if case.causal and case.bottom_right:
        kw["causal_bottom_right"] = True
    elif case.causal:
        kw["causal"] = True
    elif case.bottom_right:
        kw["alignment"] = "BOTTOM_RIGHT"
    if case.left:
        kw["sliding_window_length"] = case.left
    if case.sinks:
        kw["sink"] = t["sink_token"].cpu()
    if case.thd_lens is not None:
        kw.update(cu_seq_len_q=t["cu_seq_len_q"].tolist(), cu_seq_len_kv=t["cu_seq_len_kv"].tolist())
    elif case.padding:
        kw.update(seq_len_q=t["seq_len_q"].view(-1).tolist(), seq_len_kv=t["seq_len_kv"].view(-1).tolist())
    return kw


def oracle_fwd(case: FwdCase, t: dict) -> dict:
    """float64 {"o", "stats"} of a `make_fwd` case from its (unchanged) inputs, shaped like t's o and stats."""
    from test import oracle

    o, lse = oracle.attention(*(t[r].cpu() for r in ("q", "k", "v")), **oracle_kwargs(case, t))
    return {"o": o, "stats": lse.unsqueeze(-1)}


def oracle_grads(case: FwdCase, t: dict) -> dict:
    """float64 {"dQ", "dK", "dV"(, "dSink_token")} of a `make_bwd` case (torch autograd through test/oracle.py)."""
    from test import oracle

    kw = oracle_kwargs(case, t)
    sink = kw.pop("sink", None)
    _, _, dq, dk, dv, dsink = oracle.attention_grads(*(t[r].cpu() for r in ("q", "k", "v", "dO")), sink=sink, **kw)
    out = {"dQ": dq, "dK": dk, "dV": dv}
    if dsink is not None and "dSink_token" in t:
        out["dSink_token"] = dsink
    return out
