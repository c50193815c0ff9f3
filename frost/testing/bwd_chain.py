"""A backward chain called directly (any arch's params): its three compiled kernels and the workspace views.

For the GPU kernel tests and the benchmark scripts that time the chain without
a graph; the adapter (frost/adapters/dsl_bwd.py) does the same work on the
execute path.
"""

from __future__ import annotations

import torch

from frost.compiler.workers import compile_many
from frost.engines.sdpa_args import declared_values
from frost.engines.sdpa_bwd.chain import chain_args, chain_of
from frost.engines.sdpa_bwd.scratch import scratch_layout
from frost.runtime.workspace import ScratchBuffer, carve, layout_bytes
from frost.target import discover_target


def workspace_views(p, t, poison=True):
    """The chain's scratch views, carved as the adapter carves them, from a workspace of 0xFF bytes (NaN in
    every fp32 view) when `poison`: what the kernels rely on being zeroed must be zeroed by the preprocess."""
    if p.is_thd:
        batch = t["cu_seqlens_q"].shape[0] - 1
        dims = dict(batch=batch, max_seqlen_q=0, max_seqlen_kv=0, total_q=t["q"].shape[0], total_kv=t["k"].shape[0])
    else:
        dims = dict(batch=t["q"].shape[0], max_seqlen_q=t["q"].shape[1], max_seqlen_kv=t["k"].shape[1])
    buffers = [ScratchBuffer(n, dt, tuple(shape)) for n, dt, shape in scratch_layout(p, **dims)]
    ws = torch.full((max(layout_bytes(buffers), 256),), 0xFF if poison else 0, dtype=torch.uint8, device=t["q"].device)
    return carve(ws, buffers, checked=True)  # sized from the same layout just above


class Chain:
    """The three compiled kernels of one params record."""

    def __init__(self, p, kernels):
        self.p = p
        self.kernels = kernels  # template -> CompiledKernel

    def __call__(self, t, scalars, views, stream=None):
        s = stream if stream is not None else torch.cuda.current_stream()
        values = declared_values({**t, **views, **scalars, "stream": int(s.cuda_stream)}, self.p.is_thd)
        for template, args in chain_args(chain_of(self.p), values):
            self.kernels[template](*args)


def compile_chains(params_list, target=None):
    """One Chain per params record, compiled together in worker processes for `target` (this GPU's by default)."""
    target = target or discover_target()
    specs = []
    for p in params_list:
        specs += [(tmpl, sp) for _, tmpl, _, sp in chain_of(p)]
    cks = compile_many(specs, target)
    out, i = [], 0
    for p in params_list:
        kern = {}
        for _, tmpl, _, _ in chain_of(p):
            kern[tmpl] = cks[i]
            i += 1
        out.append(Chain(p, kern))
    return out
