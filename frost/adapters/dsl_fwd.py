"""The forward adapter shared by every CuTe DSL arch line; arch modules only supply TemplateParams."""

from __future__ import annotations

from frost.adapters.base import SdpaFwdAdapter
from frost.adapters.dsl import DslKernels, LaunchArgs, fwd_feature_flags, ragged_totals, viewed_args
from frost.engines.sdpa_args import fwd_arg_names
from frost.runtime.context import stream_handle


class DslFwdAdapter(DslKernels, SdpaFwdAdapter):
    """Compiles one forward template at plan time; execute passes the bound tensors as declared and launches."""

    template: str = ""  # dotted module path of the kernel template
    feature_flags = staticmethod(fwd_feature_flags)

    def kernel_specs(self) -> list:
        return [(self.template, self.validated_params())]

    def compile(self) -> None:
        from frost.compiler.compile import compile_kernel

        self.params = self.validated_params()
        self.kernel = compile_kernel(self.template, self.params, self.target)
        names = fwd_arg_names(self.params)  # tensors in their declared order: the kernel's entry views them
        self._args = LaunchArgs(names, self.facts)
        self._views = viewed_args(names, self.facts)
        self.compiled = True

    def compiled_kernels(self) -> list:
        return [self.kernel] if self.compiled else []

    def execute(self, bound: dict, workspace, stream) -> None:
        self.kernel(*self._args(bound, self.per_call(bound, stream)))

    def per_call(self, bound: dict, stream) -> dict:
        """The launch's values that change per call: the stream, the ragged form's totals, the viewed tensors."""
        per_call = {"stream": stream_handle(stream)}
        if self.facts.ragged is not None:
            per_call.update(ragged_totals(self.facts, bound))
        for n, role, view in self._views:
            per_call[n] = view(bound[role])
        return per_call
