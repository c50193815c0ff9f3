"""The backward adapter shared by CuTe DSL arch lines: a chain of kernels bound by argument name.

The params module of a backward template supplies `bwd_chain(params)` (stage,
template module, argument names, in launch order) and `scratch_layout(...)`;
this adapter compiles every stage at plan time, sizes the workspace from the
envelopes' layout (fixed at plan time for dense graphs), carves the scratch
views from the caller's workspace and launches the chain.
"""
from __future__ import annotations

import importlib
import weakref

from frost.adapters.base import SdpaBwdDsl
from frost.adapters.views import lengths_view, sink_view
from frost.adapters.dsl_fwd import check_dsl_and_knobs, kernel_window, sdpa_feature_flags
from frost.errors import TemplateParamsError
from frost.runtime.context import stream_handle
from frost.runtime.workspace import ScratchBuffer, carve, layout_bytes


def bwd_feature_flags(facts) -> dict:
    return dict(sdpa_feature_flags(facts), has_dsinks=facts.has_dsink, deterministic=facts.deterministic)


class DslBwdAdapter(SdpaBwdDsl):
    params_module: str = ""
    vector_bytes = 16
    _carved = None  # (weakref to the workspace, its address, scratch views) of a dense plan

    def check_support(self) -> None:
        check_dsl_and_knobs(self)

    def template_params(self):  # pragma: no cover - per arch
        raise NotImplementedError

    @property
    def _pm(self):
        return importlib.import_module(self.params_module)

    def kernel_specs(self) -> list:
        """(template module, params) of every kernel of the chain, in launch order."""
        params = self.template_params()
        return [(module, params) for _, module, _ in self._pm.bwd_chain(params)]

    def compile(self) -> None:
        """Compile the whole chain at plan time; kernels missing from the cache compile in parallel workers."""
        from frost.engines.workers import compile_many

        params = self.template_params()
        try:
            self._pm.validate(params)
        except TemplateParamsError as e:
            raise TemplateParamsError(f"{self.engine_name}: its capability row accepted a graph its template "
                                      f"rejects (a bug): {e}") from e
        self.params = params
        f = self.facts
        envelope = self._scratch(f.total_q, f.total_kv)
        self._scratch_bytes = layout_bytes(envelope)
        self._dense_scratch = None if f.is_thd else envelope  # dense layouts are fully plan-time
        stages = self._pm.bwd_chain(params)
        kernels = compile_many([(module, params) for _, module, _ in stages], self.target)
        self.chain = [(stage, kernel, names) for (stage, _, names), kernel in zip(stages, kernels)]
        self._static = self._static_values()
        self.compiled = True

    def compiled_kernels(self) -> list:
        return [k for _, k, _ in self.chain] if self.compiled else []

    def _scratch(self, total_q: int, total_kv: int) -> list[ScratchBuffer]:
        f = self.facts
        layout = self._pm.scratch_layout(self.params, f.batch, f.seq_q, f.seq_kv, total_q, total_kv)
        return [ScratchBuffer(n, dt, tuple(shape)) for n, dt, shape in layout]

    def scratch_workspace_bytes(self) -> int:
        """Closed form from plan-time envelopes, computed once at compile."""
        return self._scratch_bytes

    def _static_values(self) -> dict:
        f = self.facts
        window_left, window_right = kernel_window(f)
        return {"softmax_scale": f.attn_scale, "window_left": window_left, "window_right": window_right,
                "max_seqlen_q": f.seq_q, "max_seqlen_kv": f.seq_kv}

    def _scratch_views(self, workspace, bound: dict) -> dict:
        """Scratch views of the workspace; a dense plan re-carves only when the workspace changes.

        The cache drops its views when the caller's workspace tensor dies, so it
        never keeps workspace memory alive.
        """
        # the binder has checked the workspace against the plan's size, which covers any bound totals
        if self._dense_scratch is None:
            return carve(workspace, self._scratch(bound["q"].shape[0], bound["k"].shape[0]), checked=True)
        cached = self._carved
        if cached is not None and cached[0]() is workspace and cached[1] == workspace.data_ptr():
            return cached[2]
        views = carve(workspace, self._dense_scratch, checked=True)
        me = weakref.ref(self)

        def forget(ref, me=me):
            adapter = me()
            if adapter is not None and (adapter._carved or (None,))[0] is ref:
                adapter._carved = None
        self._carved = (weakref.ref(workspace, forget), workspace.data_ptr(), views)
        return views

    def execute(self, bound: dict, workspace, stream) -> None:
        f = self.facts
        vals = dict(self._static, q=bound["q"], k=bound["k"], v=bound["v"], o=bound["o"], do=bound["dO"],
                    lse=bound["stats"], dq=bound["dQ"], dk=bound["dK"], dv=bound["dV"], stream=stream_handle(stream))
        if f.is_thd:
            vals["cu_seqlens_q"], vals["cu_seqlens_kv"] = bound["cu_seq_len_q"], bound["cu_seq_len_kv"]
        if f.has_padding:
            vals["seqused_q"] = lengths_view(bound["seq_len_q"])
            vals["seqused_kv"] = lengths_view(bound["seq_len_kv"])
        if f.has_sinks:
            vals["sinks"] = sink_view(bound["sink_token"])
        if f.has_dsink:
            vals["dsinks"] = sink_view(bound["dSink_token"])
        vals.update(self._scratch_views(workspace, bound))
        for _, kernel, names in self.chain:
            kernel(*[vals[n] for n in names])


class MmaSyncBwdAdapter(DslBwdAdapter):
    """The mma.sync backward chain; `family` selects the smem budget and tile table."""

    family = "sm80"
    params_module = "frost.engines.sm80.sdpa_bwd_params"

    def template_params(self):
        from frost.engines.sm80.sdpa_bwd_params import Sm80BwdParams, default_knobs

        f = self.facts
        knobs = default_knobs(self.family, f.head_dim_qk, f.head_dim_v, f.io_dtype,
                              smem_budget=self.target.smem_per_block_optin or None, **self.knobs.requested())
        return Sm80BwdParams(family=self.family, **bwd_feature_flags(f), **knobs)
