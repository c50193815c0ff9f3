"""The peer libraries frost is measured against, each behind the Implementation shape.

- cuDNN and FlashAttention-2 through torch's `scaled_dot_product_attention`,
  pinned to one backend with `torch.nn.attention.sdpa_kernel`.
- FlashAttention-4 through `flash_attn.cute` (package flash-attn-4) when installed.

Backward is timed as the library's user sees it: an autograd backward of an
output built once at prepare time (`torch.autograd.grad(..., retain_graph=True)`).
Packed (THD) batches go to torch through nested (jagged) tensors when that path
works, otherwise the row is n/a. Deterministic backward rows: FlashAttention-4
runs with its `deterministic=True` option (n/a when the installed API has none);
torch's SDPA backends promise nothing per call, so those rows are n/a there.
Paged rows: FlashAttention-4 through `flash_attn_varlen_func(page_table=,
seqused_k=)`, and the cuDNN column through cuDNN's paged SDPA itself
(nvidia-cudnn-frontend's `pygraph`, planned once per row): torch's SDPA takes no
block table, so FlashAttention-2 reads n/a.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import logging

from frost.bench.impl import Implementation, Prepared, Unsupported


@contextlib.contextmanager
def _quiet_logger(name: str):
    """Silence a library's per-call warnings while a path is probed."""
    log = logging.getLogger(name)
    old = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(old)


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def _leaves(bufs, w):
    """Fresh autograd leaves over one buffer set (shares storage, no copy)."""
    return tuple(t.detach().requires_grad_(True) for t in (bufs.q, bufs.k, bufs.v))


class _PeerBase(Implementation):
    def prepare(self, inputs) -> Prepared:
        w = inputs.workload
        fwd = self._forward_fn(inputs)  # (set index, q, k, v) -> o in storage shape
        n = len(inputs.sets)
        last: list = [None] * n

        if w.direction == "fwd":
            calls = []
            for i, b in enumerate(inputs.sets):

                def call(i=i, b=b):
                    last[i] = (fwd(i, b.q, b.k, b.v),)

                calls.append(call)
        else:
            import torch

            calls = []
            with self.context():
                for i, b in enumerate(inputs.sets):
                    leaves = _leaves(b, w)
                    out = fwd(i, *leaves)

                    def call(i=i, out=out, leaves=leaves, do=b.do):
                        last[i] = torch.autograd.grad(out, leaves, do, retain_graph=True)

                    calls.append(call)
        return Prepared(calls=calls, outputs=lambda i: last[i], context=self.context)

    def context(self):  # overridden by torch peers
        import contextlib

        return contextlib.nullcontext()

    def _forward_fn(self, inputs):  # pragma: no cover - interface
        raise NotImplementedError


class TorchSdpaPeer(_PeerBase):
    """cuDNN or FlashAttention-2 through torch SDPA with one backend pinned."""

    def __init__(self, key: str, label: str, backend_name: str):
        self.key, self.label, self.backend_name = key, label, backend_name

    def unavailable(self) -> str | None:
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401
        except Exception as e:  # pragma: no cover - old torch
            return f"torch.nn.attention.sdpa_kernel unavailable ({e})"
        if not hasattr(SDPBackend, self.backend_name):
            return f"torch has no SDPBackend.{self.backend_name}"
        return None

    def context(self):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(getattr(SDPBackend, self.backend_name))

    def _forward_fn(self, inputs):
        import torch.nn.functional as F

        w = inputs.workload
        if w.is_paged:
            if self.key != "cudnn":
                raise Unsupported("torch SDPA takes no block table (paged K/V caches)")
            return _cudnn_paged_forward(inputs)
        if w.deterministic:
            raise Unsupported(f"torch SDPA ({self.backend_name}) offers no per-call deterministic backward")
        kw = {"scale": w.scale, "is_causal": w.causal}
        if w.heads_q != w.heads_kv:
            kw["enable_gqa"] = True
        if not w.is_thd:

            def fwd(i, q, k, v):
                o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **kw)
                return o.transpose(1, 2)

            self._probe(inputs, fwd)
            return fwd
        return self._nested_forward_fn(inputs, kw)

    def _probe(self, inputs, fwd) -> None:
        """One forward on set 0: torch's 'no kernel for this' becomes n/a, with torch's own reason."""
        import warnings

        b = inputs.sets[0]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with self.context():
                    fwd(0, b.q, b.k, b.v)
            except RuntimeError as e:
                text = str(e)
                if "No available kernel" not in text and "No viable backend" not in text:
                    raise
                from frost.bench.runner import warning_hints

                hints = warning_hints(caught)
                raise Unsupported(
                    f"torch's {self.backend_name} backend has no kernel for this problem"
                    + (f" ({'; '.join(h[:160] for h in hints[-2:])})" if hints else "")
                ) from None

    def _nested_forward_fn(self, inputs, kw):
        """THD through jagged nested tensors; probed once so a missing path reads as n/a."""
        import torch
        import torch.nn.functional as F

        w = inputs.workload
        if w.causal:
            raise Unsupported("torch nested-tensor SDPA has no causal mask")
        offsets = inputs.cu_seqlens.to(torch.int64)
        lo, hi = min(w.seqlens), max(w.seqlens)

        def nest(t):
            return torch.nested.nested_tensor_from_jagged(t, offsets, min_seqlen=lo, max_seqlen=hi).transpose(1, 2)

        def fwd(i, q, k, v):
            o = F.scaled_dot_product_attention(nest(q), nest(k), nest(v), **kw)
            return o.transpose(1, 2).values()

        b = inputs.sets[0]
        try:
            with self.context(), _quiet_logger("torch.nested._internal.sdpa"):
                o = fwd(0, b.q, b.k, b.v)
            if tuple(o.shape) != tuple(inputs.o_shape):
                raise RuntimeError(f"nested output shape {tuple(o.shape)} != {inputs.o_shape}")
        except Exception as e:
            raise Unsupported(
                f"nested-tensor path failed: {type(e).__name__}: "
                f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            ) from None
        return fwd


class FlashAttn4Peer(_PeerBase):
    """FlashAttention-4's CuTe DSL kernels (`flash_attn.cute`)."""

    key, label = "fa4", "FlashAttention-4 (flash_attn.cute)"

    def unavailable(self) -> str | None:
        try:
            if importlib.util.find_spec("flash_attn") is None:
                return "flash-attn-4 not installed (no module flash_attn)"
            if importlib.util.find_spec("flash_attn.cute") is None:
                return "flash-attn-4 not installed (no module flash_attn.cute)"
        except Exception as e:
            return f"flash_attn.cute not importable: {type(e).__name__}: {e}"
        return None

    def _api(self):
        try:
            from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
        except Exception as e:
            raise ImportError(f"flash_attn.cute import failed: {type(e).__name__}: {e}") from e
        return flash_attn_func, flash_attn_varlen_func

    def _forward_fn(self, inputs):
        dense, varlen = self._api()
        w = inputs.workload
        if w.is_paged:
            return _fa4_paged_forward(varlen, inputs)
        fn = varlen if w.is_thd else dense
        det = _deterministic_kwargs(fn) if w.deterministic else {}
        if not w.is_thd:

            def fwd(i, q, k, v):
                return _first(dense(q, k, v, softmax_scale=w.scale, causal=w.causal, **det))

            return fwd
        cu, m = inputs.cu_seqlens, w.max_seqlen

        def fwd(i, q, k, v):
            return _first(
                varlen(
                    q,
                    k,
                    v,
                    cu_seqlens_q=cu,
                    cu_seqlens_k=cu,
                    max_seqlen_q=m,
                    max_seqlen_k=m,
                    softmax_scale=w.scale,
                    causal=w.causal,
                    **det,
                )
            )

        return fwd


def _fa4_paged_forward(varlen, inputs):
    """FA4 over the paged cache: (num_blocks, block_size, H, D) caches, the table, the keys per sequence."""
    w = inputs.workload
    try:
        params = inspect.signature(varlen).parameters
    except (TypeError, ValueError):
        params = {}
    if "page_table" not in params:
        raise Unsupported("installed flash_attn.cute.flash_attn_varlen_func has no page_table")
    sets, used = inputs.sets, inputs.seqused_k

    def fwd(i, q, k, v):
        return _first(
            varlen(
                q,
                k,
                v,
                seqused_k=used,
                page_table=sets[i].table,
                max_seqlen_q=w.seqlen_q,
                max_seqlen_k=w.seqlen_kv,
                softmax_scale=w.scale,
                causal=w.causal,
            )
        )

    return fwd


def _cudnn_paged_forward(inputs):
    """cuDNN's paged SDPA through nvidia-cudnn-frontend, declared as its own paged tests declare it: containers
    (num_blocks, H, block_size, D) over the caches, tables (B, 1, max_blocks, 1), the padding mask's lengths."""
    try:
        import cudnn
    except Exception as e:
        raise Unsupported(f"nvidia-cudnn-frontend not importable: {type(e).__name__}: {e}") from None
    import torch

    w = inputs.workload
    b0 = inputs.sets[0]
    dt = {torch.bfloat16: cudnn.data_type.BFLOAT16, torch.float16: cudnn.data_type.HALF}[b0.q.dtype]
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    g = cudnn.pygraph(
        io_data_type=dt,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        handle=handle,
    )
    n = w.batch

    def declare(t, data_type=dt):
        return g.tensor(dim=list(t.shape), stride=list(t.stride()), data_type=data_type)

    views = {
        "q": b0.q.transpose(1, 2),
        "k": b0.k.transpose(1, 2),
        "v": b0.v.transpose(1, 2),
        "table": b0.table[:, None, :, None],
        "lens_q": inputs.seqused_q.view(n, 1, 1, 1),
        "lens_k": inputs.seqused_k.view(n, 1, 1, 1),
    }
    q, k, v = declare(views["q"]), declare(views["k"]), declare(views["v"])
    kt, vt = declare(views["table"], cudnn.data_type.INT32), declare(views["table"], cudnn.data_type.INT32)
    lq, lk = declare(views["lens_q"], cudnn.data_type.INT32), declare(views["lens_k"], cudnn.data_type.INT32)
    mask = (
        {"diagonal_alignment": cudnn.diagonal_alignment.BOTTOM_RIGHT, "diagonal_band_right_bound": 0}
        if w.causal
        else {}
    )
    o, _ = g.sdpa(
        q=q,
        k=k,
        v=v,
        generate_stats=False,
        attn_scale=float(w.scale),
        use_padding_mask=True,
        seq_len_q=lq,
        seq_len_kv=lk,
        paged_attention_k_table=kt,
        paged_attention_v_table=vt,
        paged_attention_max_seq_len_kv=w.seqlen_kv,
        name="paged_sdpa",
        **mask,
    )
    o.set_output(True).set_dim([n, w.heads_q, w.seqlen_q, w.d_v]).set_stride(
        [w.seqlen_q * w.heads_q * w.d_v, w.d_v, w.heads_q * w.d_v, 1]
    )
    try:
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
    except Exception as e:
        raise Unsupported(f"cuDNN declines this paged graph: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    ws = torch.empty(int(g.get_workspace_size()), dtype=torch.uint8, device=b0.q.device)
    outs = [torch.empty((n, w.seqlen_q, w.heads_q, w.d_v), dtype=b0.q.dtype, device=b0.q.device) for _ in inputs.sets]
    packs = []
    for i, b in enumerate(inputs.sets):
        t = b.table[:, None, :, None]
        packs.append(
            {
                q: b.q.transpose(1, 2),
                k: b.k.transpose(1, 2),
                v: b.v.transpose(1, 2),
                kt: t,
                vt: t,
                lq: views["lens_q"],
                lk: views["lens_k"],
                o: outs[i].transpose(1, 2),
            }
        )

    def fwd(i, q_, k_, v_):
        g.execute(packs[i], ws, handle=handle)
        return outs[i]

    return fwd


def _deterministic_kwargs(fn) -> dict:
    """{'deterministic': True} when FA4's entry point takes it; otherwise the row is n/a."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    if "deterministic" not in params:
        raise Unsupported(
            f"installed flash_attn.cute.{getattr(fn, '__name__', 'flash_attn')} has no deterministic option"
        )
    return {"deterministic": True}


def all_peers() -> list[Implementation]:
    """Peers in reference-preference order (the first one that runs is the check reference)."""
    return [
        TorchSdpaPeer("cudnn", "cuDNN (torch SDPA)", "CUDNN_ATTENTION"),
        FlashAttn4Peer(),
        TorchSdpaPeer("fa2", "FlashAttention-2 (torch SDPA)", "FLASH_ATTENTION"),
    ]


PEER_KEYS = ("cudnn", "fa2", "fa4")
