"""The reference adapter: torch math in float32 (float64 for fp32 graphs), every declared feature.

It is the numerics oracle for the GPU engines and the engine of CPU-only
machines. On a GPU it runs only when requested by name (engine="reference"):
it reads sequence lengths to the host and allocates, so it is never a silent
fallback and never CUDA-graph capturable.
"""
from __future__ import annotations

import torch

from frost.adapters.base import SdpaBwdDsl, SdpaFwdDsl
from frost.adapters.reference_math import sdpa_bwd_reference, sdpa_fwd_reference
from frost.adapters.views import io_view, lengths_view, sink_view, stats_view
from frost.runtime.context import on_stream


def _compute_dtype(facts):
    return torch.float64 if facts.io_dtype == "fp32" else torch.float32


def _mask_kwargs(facts, bound) -> dict:
    kw = dict(window_left=facts.window_left, window_right=facts.window_right, bottom_right=facts.bottom_right)
    if facts.is_thd:
        kw.update(cu_seqlens_q=bound["cu_seq_len_q"], cu_seqlens_kv=bound["cu_seq_len_kv"])
    if facts.has_padding:
        kw.update(seqused_q=lengths_view(bound["seq_len_q"]), seqused_kv=lengths_view(bound["seq_len_kv"]))
    if facts.has_sinks:
        kw.update(sinks=sink_view(bound["sink_token"]))
    return kw


class SdpaFwdReference(SdpaFwdDsl):
    engine_name = "SdpaFwdReference"

    def execute(self, bound: dict, workspace, stream) -> None:
        f = self.facts
        thd = f.is_thd
        with on_stream(stream, bound["q"].device):
            o, lse = sdpa_fwd_reference(io_view(bound["q"], thd), io_view(bound["k"], thd), io_view(bound["v"], thd),
                                        softmax_scale=f.attn_scale, compute_dtype=_compute_dtype(f),
                                        **_mask_kwargs(f, bound))
            io_view(bound["o"], thd).copy_(o)
            if f.has_stats:
                stats_view(bound["stats"], thd).copy_(lse)


class SdpaBwdReference(SdpaBwdDsl):
    engine_name = "SdpaBwdReference"

    def execute(self, bound: dict, workspace, stream) -> None:
        f = self.facts
        thd = f.is_thd
        with on_stream(stream, bound["q"].device):
            kw = _mask_kwargs(f, bound)
            dq, dk, dv, dsink = sdpa_bwd_reference(
                io_view(bound["q"], thd), io_view(bound["k"], thd), io_view(bound["v"], thd),
                io_view(bound["dO"], thd), softmax_scale=f.attn_scale, compute_dtype=_compute_dtype(f), **kw)
            io_view(bound["dQ"], thd).copy_(dq)
            io_view(bound["dK"], thd).copy_(dk)
            io_view(bound["dV"], thd).copy_(dv)
            if f.has_dsink:
                sink_view(bound["dSink_token"]).copy_(dsink)
