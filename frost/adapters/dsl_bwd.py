"""The backward adapter shared by CuTe DSL arch lines: the chain of `frost.engines.sdpa_bwd`, bound by name.

An arch adapter names its params module, which supplies the main kernel's template
(`MAIN_TEMPLATE`) and argument names (`main_args(params)`); the shared skeleton adds
the preprocess and dQ convert and the workspace layout. This adapter compiles every
stage at plan time, sizes the workspace from the envelopes' layout (a plan-time
closed form), carves the scratch views from the caller's workspace and launches the
chain. It imports no arch module.
"""

from __future__ import annotations

import math

from frost.adapters.base import SdpaBwdAdapter
from frost.adapters.dsl import DslKernels, LaunchArgs, dbias_accumulates, ragged_totals, sdpa_feature_flags, viewed_args
from frost.engines.sdpa_bwd.chain import chain_of
from frost.engines.sdpa_bwd.scratch import dbias_accum_shape, scratch_layout
from frost.runtime.context import stream_handle
from frost.runtime.workspace import CarvedViews, ScratchBuffer, carve, layout_bytes


#: the workspace a deterministic dBias may take (a copy per (batch entry, query head), summed in order after)
DETERMINISTIC_DBIAS_BYTES = 4 << 30


def bwd_feature_flags(facts) -> dict:
    return dict(
        sdpa_feature_flags(facts),
        has_dsinks=facts.has_dsink,
        deterministic=facts.deterministic,
        has_dbias=facts.has_dbias,
        dbias_accum=dbias_accumulates(facts),
    )


class DslBwdAdapter(DslKernels, SdpaBwdAdapter):
    feature_flags = staticmethod(bwd_feature_flags)

    def check_support(self) -> None:
        f = self.facts
        if f.has_dbias and f.deterministic and dbias_accumulates(f):
            need = 4 * math.prod(dbias_accum_shape(self.template_params(), f.batch, *f.tensor("bias").dim[2:]))
            if need > DETERMINISTIC_DBIAS_BYTES:
                dbias = f.tensor("dBias")
                raise self.decline(
                    f"does not serve a deterministic dBias {dbias.label} of dim {dbias.dim} this large: "
                    f"it keeps an fp32 copy per (batch entry, query head), {need / 2**30:.1f} GiB of "
                    f"workspace, above {DETERMINISTIC_DBIAS_BYTES / 2**30:.0f} GiB"
                )
        super().check_support()

    def kernel_specs(self) -> list:
        """(template module, params) of every kernel of the chain, in launch order."""
        return [(module, sp) for _, module, _, sp in chain_of(self.validated_params())]

    def compile(self) -> None:
        """Compile the whole chain at plan time; kernels missing from the cache compile in parallel workers."""
        from frost.compiler.workers import compile_many

        params = self.params = self.validated_params()
        f = self.facts
        envelope = self._scratch(f.total_q, f.total_kv)
        self._scratch_bytes = layout_bytes(envelope)
        # dense layouts are fully plan-time, and so are the ragged form's (its bound tensors are as declared)
        self._dense_views = None if f.is_thd and f.ragged is None else CarvedViews(envelope)
        stages = chain_of(params)
        kernels = compile_many([(module, sp) for _, module, _, sp in stages], self.target)
        self.chain = [(kernel, LaunchArgs(names, f)) for (_, _, names, _), kernel in zip(stages, kernels)]
        self._views = viewed_args((n for _, _, names, _ in stages for n in names), f)
        self.compiled = True

    def compiled_kernels(self) -> list:
        return [k for k, _ in self.chain] if self.compiled else []

    def _scratch(self, total_q: int, total_kv: int) -> list[ScratchBuffer]:
        f = self.facts
        bias_rows = tuple(f.tensor("bias").dim[2:]) if f.has_bias else None  # the dBias accumulator's dims
        layout = scratch_layout(self.params, f.batch, f.seq_q, f.seq_kv, total_q, total_kv, bias_rows)
        return [ScratchBuffer(n, dt, tuple(shape)) for n, dt, shape in layout]

    def scratch_workspace_bytes(self) -> int:
        """Closed form from plan-time envelopes, computed once at compile."""
        return self._scratch_bytes

    def _scratch_views(self, workspace, bound: dict) -> dict:
        """Scratch views of the workspace; a dense plan re-carves only when the workspace changes."""
        # the binder has checked the workspace against the plan's size, which covers any bound totals
        if self._dense_views is None:
            return carve(workspace, self._scratch(bound["q"].shape[0], bound["k"].shape[0]), checked=True)
        return self._dense_views(workspace)

    def execute(self, bound: dict, workspace, stream) -> None:
        per_call = {"stream": stream_handle(stream), **self._scratch_views(workspace, bound)}
        if self.facts.ragged is not None:
            per_call.update(ragged_totals(self.facts, bound))
        for n, role, view in self._views:
            per_call[n] = view(bound[role])
        for kernel, args in self.chain:
            kernel(*args(bound, per_call))
