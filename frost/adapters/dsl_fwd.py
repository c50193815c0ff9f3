"""The forward adapter shared by every CuTe DSL arch line; arch modules only supply TemplateParams."""
from __future__ import annotations

import importlib
import operator

from frost.adapters.base import SdpaFwdDsl, SdpaBwdDsl
from frost.adapters.views import lengths_view, sink_view
from frost.engines.dsl import dsl_decline_reason
from frost.errors import TemplateParamsError
from frost.runtime.context import stream_handle


def kernel_window(facts) -> tuple:
    """(window_left, window_right) as the kernels take them (Int32): each bound clamped to Sq + Skv.

    A bound that large already admits every key, so the mask is unchanged, and the kernels' index
    arithmetic (i + offset + bound) stays far from Int32 overflow for any bound a user declares.
    Packed batches clamp to the token envelopes, which no sequence can exceed.
    """
    cap = facts.total_q + facts.total_kv if facts.is_thd else facts.seq_q + facts.seq_kv
    return tuple(None if w is None else min(w, cap) for w in (facts.window_left, facts.window_right))


def sdpa_feature_flags(facts) -> dict:
    """The SdpaFeatureParams fields of every SDPA template, from the facts (sdpa_args.py)."""
    banded = facts.window_left is not None or facts.window_right is not None
    return dict(dtype=facts.io_dtype, head_dim=facts.head_dim_qk, head_dim_v=facts.head_dim_v,
                num_heads_q=facts.num_heads_q, num_heads_kv=facts.num_heads_kv, is_thd=facts.is_thd,
                has_seqused=facts.has_padding, has_sinks=facts.has_sinks,
                has_window_left=facts.window_left is not None, has_window_right=facts.window_right is not None,
                bottom_right=facts.bottom_right and banded)


def fwd_feature_flags(facts) -> dict:
    return dict(sdpa_feature_flags(facts), has_lse=facts.has_stats)


def check_dsl_and_knobs(adapter) -> None:
    """Decline when the DSL is missing, or when requested knobs make the template's params invalid.

    Requested knobs are honored or the engine is ineligible; without requests the
    defaults must validate, and a failure there is a bug, raised at compile.
    """
    reason = dsl_decline_reason()
    if reason:
        raise adapter.decline(reason)
    if adapter.knobs.requested():
        try:
            params = adapter.template_params()
            importlib.import_module(adapter.params_module).validate(params)
        except TemplateParamsError as e:
            raise adapter.decline(f"requested knobs {adapter.knobs.requested()} do not fit: {e}") from None


class DslFwdAdapter(SdpaFwdDsl):
    """Compiles one forward template at plan time; execute passes the bound tensors as declared and launches."""

    template: str = ""  # dotted module path of the kernel template
    params_module: str = ""  # dotted module path with the params class, validate() and default_knobs()
    vector_bytes = 16

    def check_support(self) -> None:
        check_dsl_and_knobs(self)

    def template_params(self):  # pragma: no cover - per arch
        raise NotImplementedError

    def compile(self) -> None:
        from frost.engines.compile import compile_kernel

        params = self.template_params()
        try:
            importlib.import_module(self.params_module).validate(params)
        except TemplateParamsError as e:
            raise TemplateParamsError(f"{self.engine_name}: its capability row accepted a graph its template "
                                      f"rejects (a bug): {e}") from e
        self.params = params
        self.kernel = compile_kernel(self.template, params, self.target)
        self._recipe = self._launch_recipe()
        self.compiled = True

    def compiled_kernels(self) -> list:
        return [self.kernel] if self.compiled else []

    def _launch_recipe(self):
        """Plan-time launch recipe: (a gather of the tensor arguments from the bound dict, the scalars).

        Tensors go in their declared order (the kernel's entry views them); lengths and sinks get a
        reshaping view. Without views the gather is one C-level getter.
        """
        f = self.facts
        roles = [("q", None), ("k", None), ("v", None), ("o", None)]
        if f.has_stats:
            roles.append(("stats", None))
        if f.is_thd:
            roles += [("cu_seq_len_q", None), ("cu_seq_len_kv", None)]
        if f.has_padding:
            roles += [("seq_len_q", lengths_view), ("seq_len_kv", lengths_view)]
        if f.has_sinks:
            roles.append(("sink_token", sink_view))
        scalars = [f.attn_scale] + [w for w in kernel_window(f) if w is not None]
        if f.is_thd:
            scalars.append(f.seq_q)
        if all(view is None for _, view in roles):
            gather = operator.itemgetter(*(r for r, _ in roles))
        else:
            def gather(bound, roles=tuple(roles)):
                return [bound[r] if view is None else view(bound[r]) for r, view in roles]
        return gather, tuple(scalars)

    def execute(self, bound: dict, workspace, stream) -> None:
        gather, scalars = self._recipe
        self.kernel(*gather(bound), *scalars, stream_handle(stream))


class PendingBwdAdapter(SdpaBwdDsl):
    """A backward arch line whose kernels are not available; its capability row declines first."""

    def check_support(self) -> None:
        raise self.decline("the backward kernels of this arch line are not available yet")
