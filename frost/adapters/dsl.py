"""What every CuTe DSL adapter shares: feature flags and mask bounds from the facts, the DSL and knob
checks at ranking, and one validated TemplateParams per plan (`DslKernels`)."""

from __future__ import annotations

import importlib
import operator

from frost.adapters.views import lengths_view, sink_view
from frost.engines.dsl import dsl_decline_reason
from frost.engines.sdpa_args import OWN_OFFSET_ROLES, Q_ROLES, STATS_ROLES
from frost.errors import TemplateParamsError
from frost.runtime.binding import ragged_totals  # noqa: F401  (the launch path's T, re-exported)


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
    bias = facts.tensor("bias") if facts.has_bias else None
    flags = dict(
        dtype=facts.io_dtype,
        head_dim=facts.head_dim_qk,
        head_dim_v=facts.head_dim_v,
        num_heads_q=facts.num_heads_q,
        num_heads_kv=facts.num_heads_kv,
        num_heads_v=facts.heads_v if facts.split_kv_heads else 0,
        is_thd=facts.is_thd,
        has_seqused=facts.has_padding,
        has_sinks=facts.has_sinks,
        has_window_left=facts.window_left is not None,
        has_window_right=facts.window_right is not None,
        bottom_right=facts.bottom_right and banded,
        has_bias=bias is not None,
        bias_per_batch=bias is not None and bias.dim[0] > 1,
        bias_per_head=bias is not None and bias.dim[1] > 1,
        bias_key_strided=bias is not None and bias.stride[3] != 1,  # as declared, also for S_kv = 1
        has_alibi=facts.has_alibi,
    )
    return {**flags, **ragged_flags(facts)}


def dbias_accumulates(facts) -> bool:
    """Whether dBias goes through the chain's fp32 accumulator: several (batch, head) pairs add into one of its
    elements (it broadcasts over batch entries or heads the graph has more than one of), or it belongs to a
    packed batch (whose elements outside every sequence no step writes). Otherwise the main kernel writes it."""
    if not facts.has_dbias:
        return False
    b, h = facts.tensor("dBias").dim[:2]
    return facts.is_thd or b < facts.batch or h < facts.num_heads_q


def ragged_flags(facts) -> dict:
    """cuDNN's ragged-offset form: lengths from seq_len_q/kv (seqused), each group's token stride (the divisor
    of its element offsets) and offset dtype, the io tensors whose offsets are their own (`own_offsets`), and
    how Stats are laid out (ragged, or per batch)."""
    r = facts.ragged
    if r is None:
        return {}
    strides, dtypes = dict(r.token_strides), dict(r.offset_dtypes)
    flags = dict(
        has_seqused=True,
        token_div_q=max(strides["q"], 1),
        token_div_kv=max(strides["k"], 1),
        offset_dtype_q=dtypes["q"],
        offset_dtype_kv=dtypes["k"],
        own_offsets=own_offsets(r),
    )
    if facts.has_stats and "stats" in strides:
        flags.update(token_div_lse=max(strides["stats"], 1), offset_dtype_lse=dtypes["stats"])
    elif r.stats_per_batch and (facts.has_stats or facts.has_score_max or facts.has_score_sum_exp):
        flags.update(stats_per_batch=True)
    return flags


def own_offset_leader(role: str):
    """The graph role whose offsets contract role `role` takes unless it has its own: its token group's leader
    (q's, k's); None for the row outputs, whose ragged offsets are always their own."""
    if role in STATS_ROLES:
        return None
    return "q" if role in Q_ROLES else "k"


def own_offsets(r) -> tuple:
    """(role, token divisor, dtype) of each io tensor whose offsets are not its group leader's (another offset
    tensor, or the same one over another token stride), in `OWN_OFFSET_ROLES` order."""
    strides, dtypes = dict(r.token_strides), dict(r.offset_dtypes)
    tensor_of = {role: i for i, roles in enumerate(r.shared_offsets) for role in roles}
    out = []
    for role in OWN_OFFSET_ROLES:
        graph_role, leader = TENSOR_ARGS[role][0], own_offset_leader(role)
        if graph_role not in strides:
            continue
        if leader is None or tensor_of[graph_role] != tensor_of[leader] or strides[graph_role] != strides[leader]:
            out.append((role, max(strides[graph_role], 1), dtypes[graph_role]))
    return tuple(out)


def ragged_decline_reason(facts):
    """Why the DSL kernels cannot serve this ragged-offset graph, or None (also None for other graphs)."""
    r = facts.ragged
    if r is None:
        return None
    strides = dict(r.token_strides)
    rows = [
        n
        for n, on in (
            ("stats", facts.has_stats),
            ("score_max", facts.has_score_max),
            ("score_sum_exp", facts.has_score_sum_exp),
        )
        if on
    ]
    ragged_rows = [n for n in rows if n in strides]
    if ragged_rows and len(ragged_rows) < len(rows):
        per_batch = [n for n in rows if n not in strides]
        return (
            f"the DSL kernels take the ragged form's row outputs all ragged or all per batch; "
            f"{', '.join(ragged_rows)} ragged, {', '.join(per_batch)} per batch"
        )
    return None


def fwd_feature_flags(facts) -> dict:
    flags = dict(
        sdpa_feature_flags(facts),
        has_lse=facts.has_stats,
        has_score_max=facts.has_score_max,
        has_score_sum_exp=facts.has_score_sum_exp,
    )
    if facts.has_block_mask:  # only the forwards whose rows serve block_mask have the flag
        flags["has_block_mask"] = True
    if facts.paged is not None:  # only those whose rows serve paged caches: the containers' block sizes
        flags.update(paged_block_k=facts.paged.block_size_k, paged_block_v=facts.paged.block_size_v)
    return flags


def check_dsl_and_knobs(adapter) -> None:
    """Decline when the DSL is missing, or when requested knobs make the template's params invalid.

    Requested knobs are honored or the engine is ineligible; without requests the
    defaults must validate, and a failure there is a bug, raised at compile.
    """
    reason = dsl_decline_reason() or ragged_decline_reason(adapter.facts)
    if reason:
        raise adapter.decline(reason)
    if adapter.knobs.requested():
        try:
            params = adapter.template_params()
            importlib.import_module(adapter.params_module).validate(params)
        except TemplateParamsError as e:
            raise adapter.decline(f"requested knobs {adapter.knobs.requested()} do not fit: {e}") from None


class DslKernels:
    """Mixin of the DSL adapters: the template params, validated once, and the kernels they make.

    Subclasses set `params_module` (a module with the params class and `validate()`) and `params_class` (that
    class's name), supply `plan_knobs()` and list their kernels in `kernel_specs()`; the direction supplies
    `feature_flags(facts)`.
    """

    params_module: str = ""
    params_class: str = ""
    vector_bytes = 16  # kernels take 16-byte aligned io tensors

    def check_support(self) -> None:
        check_dsl_and_knobs(self)

    @classmethod
    def plan_knobs(cls, facts, target, requested: dict) -> dict:  # pragma: no cover - per arch
        """The knobs a plan compiles with (the arch's planning policy, forward and backward alike): the
        defaults for these facts on this target, the `requested` ones honored, then the choices made per
        problem and GPU. Plan-time values only; raises TemplateParamsError when a request cannot be met."""
        raise NotImplementedError

    def fixed_params(self) -> dict:
        """Fields the arch line fixes whatever the graph (e.g. the mma.sync `family`)."""
        return {}

    def template_params(self):
        """The arch's params: its fixed fields, the feature flags of the facts and `plan_knobs()`."""
        cls = getattr(importlib.import_module(self.params_module), self.params_class)
        f = self.facts
        return cls(
            **self.fixed_params(), **self.feature_flags(f), **self.plan_knobs(f, self.target, self.knobs.requested())
        )

    def validated_params(self):
        """template_params(), validated: the capability row accepted the graph, so a failure is a bug."""
        params = self.template_params()
        try:
            importlib.import_module(self.params_module).validate(params)
        except TemplateParamsError as e:
            raise TemplateParamsError(
                f"{self.engine_name}: its capability row accepted a graph its template rejects (a bug): {e}"
            ) from e
        return params


# contract argument name (frost.engines.sdpa_args) -> (graph role, view the kernel wants or None)
TENSOR_ARGS = {
    "q": ("q", None),
    "k": ("k", None),
    "v": ("v", None),
    "o": ("o", None),
    "lse": ("stats", None),
    "score_max": ("score_max", None),
    "score_sum_exp": ("score_sum_exp", None),
    "do": ("dO", None),
    "dq": ("dQ", None),
    "dk": ("dK", None),
    "dv": ("dV", None),
    "cu_seqlens_q": ("cu_seq_len_q", None),
    "cu_seqlens_kv": ("cu_seq_len_kv", None),
    "seqused_q": ("seq_len_q", lengths_view),
    "seqused_kv": ("seq_len_kv", lengths_view),
    "sinks": ("sink_token", sink_view),
    "dsinks": ("dSink_token", sink_view),
    "bias": ("bias", None),
    "dbias": ("dBias", None),
    "block_mask": ("block_mask", None),
    "k_table": ("paged_attention_k_table", None),
    "v_table": ("paged_attention_v_table", None),
}
#: cuDNN's ragged-offset form: the offsets tensors of the groups and of Stats take the cu_seqlens slots, 1-D
RAGGED_TENSOR_ARGS = {
    **TENSOR_ARGS,
    "cu_seqlens_q": ("q_ragged_offset", lengths_view),
    "cu_seqlens_kv": ("k_ragged_offset", lengths_view),
    "lse_offsets": ("stats_ragged_offset", lengths_view),
    **{f"{role}_offsets": (f"{TENSOR_ARGS[role][0]}_ragged_offset", lengths_view) for role in OWN_OFFSET_ROLES},
}


def tensor_args(facts) -> dict:
    """The contract's tensor names -> (graph role, view) for these facts."""
    return TENSOR_ARGS if facts.ragged is None else RAGGED_TENSOR_ARGS


def static_values(facts) -> dict:
    """The contract's scalar arguments that are plan-time values (the ragged form's token envelopes are per call:
    `ragged_totals`)."""
    window_left, window_right = kernel_window(facts)
    out = {
        "softmax_scale": facts.attn_scale,
        "window_left": window_left,
        "window_right": window_right,
        "max_seqlen_q": facts.seq_q,
        "max_seqlen_kv": facts.seq_kv,
    }
    if facts.ragged is None:
        out.update(total_q=facts.total_q, total_kv=facts.total_kv)
    return out


def _tuple_getter(keys: tuple):
    """A C-level getter of `keys` from a dict that always returns a tuple."""
    if len(keys) > 1:
        return operator.itemgetter(*keys)
    if keys:
        return lambda d, key=keys[0]: (d[key],)
    return lambda d: ()


def viewed_args(names, facts) -> tuple:
    """(name, role, view) of the contract names whose tensor the kernel takes through a view.

    The adapter makes these views once per execute and passes them with the per-call values.
    """
    table = tensor_args(facts)
    return tuple((n, *table[n]) for n in dict.fromkeys(names) if n in table and table[n][1])


class LaunchArgs:
    """One kernel's argument list, resolved at plan time from its contract names.

    View-free tensors come from the bound dict by graph role and scalars are plan-time
    constants; every other name (the stream, scratch buffers, viewed tensors: see
    `viewed_args`) is supplied per call. The usual layout (tensors, then scalars, then
    per-call names) gathers through one C-level getter.
    """

    def __init__(self, names, facts):
        static = static_values(facts)
        table = tensor_args(facts)
        self.items = tuple(
            (0, table[n][0]) if n in table and table[n][1] is None else (1, static[n]) if n in static else (2, n)
            for n in names
        )
        kinds = [k for k, _ in self.items]
        self._fast = None
        if kinds == sorted(kinds) and kinds.count(0) >= 2:
            self._fast = (
                operator.itemgetter(*(a for k, a in self.items if k == 0)),
                tuple(a for k, a in self.items if k == 1),
                _tuple_getter(tuple(a for k, a in self.items if k == 2)),
            )

    def __call__(self, bound: dict, per_call: dict) -> list:
        if self._fast is not None:
            tensors, scalars, supplied = self._fast
            return [*tensors(bound), *scalars, *supplied(per_call)]
        return [bound[a] if k == 0 else a if k == 1 else per_call[a] for k, a in self.items]
