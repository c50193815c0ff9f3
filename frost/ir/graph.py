"""The operation graph: tensors, one SDPA node, and validation into the facts record.

Declarations only, in the cuDNN frontend pygraph vocabulary. Planning and execution
live in the public `frost.Graph` (frost/graph.py), which extends this class.
"""

from __future__ import annotations

import operator
from typing import Optional

from frost.errors import GraphError
from frost.ir.nodes import BOOL_ATTRS, TENSOR_ATTRS, SdpaAttrs, SdpaBwdNode, SdpaFwdNode, dropout_tensors
from frost.ir.tensor import Tensor, _ints, compact_strides, next_uid
from frost.ir.validate import expect_rank, expected_out_dims, expected_stats_dims, validate_bwd, validate_fwd
from frost.types import as_data_type, attention_implementation, diagonal_alignment, enum_name, tensor_reordering


def as_flag(value, what: str) -> bool:
    """A boolean keyword as cuDNN's binding reads it: True, False, or None (pybind11 converts None to False for
    its `bool` parameters); a NumPy bool by its value. Anything else (an int or a float, usually a positional
    argument in the wrong slot) raises, where pybind11 would take its truth value."""
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool"):
        return bool(value)
    raise GraphError(f"{what} must be True or False (None reads as False, as in cuDNN), got {value!r}")


def _stride_order(t: Tensor) -> list[int]:
    """Axes from slowest to fastest, as declared by t's strides."""
    return sorted(range(len(t.dim)), key=lambda a: (-t.stride[a], a))


def _like_layout(src: Tensor, dim: tuple) -> tuple:
    return compact_strides(dim, _stride_order(src))


class OpGraph:
    """Declare tensors and one SDPA node; `validate()` turns them into facts."""

    def __init__(
        self, io_data_type=None, intermediate_data_type=None, compute_data_type=None, name: str = "frost_graph"
    ):
        self.io_data_type = as_data_type(io_data_type)
        self.intermediate_data_type = as_data_type(intermediate_data_type)
        self.compute_data_type = as_data_type(compute_data_type)
        self.name = name
        self.tensors: list[Tensor] = []
        self.node = None
        self.facts = None

    # declarations -------------------------------------------------------------------------
    def _invalidate(self) -> None:
        """A declaration changed: what was derived from the old ones is stale."""
        self.facts = None

    def tensor(
        self,
        dim=None,
        stride=None,
        data_type=None,
        is_virtual: bool = False,
        is_pass_by_value: bool = False,
        ragged_offset: Optional[Tensor] = None,
        reordering_type=None,
        name: Optional[str] = None,
        uid=None,
        **unknown,
    ) -> Tensor:
        """Declare a graph input: cuDNN's `tensor(dim, stride, data_type, ..., name, uid)`, positionally or by keyword.

        Omitted strides are row-major. `uid` (an int >= 0; cuDNN's -1 means "assign one") keys the variant pack
        too. Pass-by-value tensors and reorderings are cuDNN features frost does not have: they raise.
        """
        label = name if isinstance(name, str) and name else self._free_label()
        if unknown:
            raise GraphError(f"tensor {label!r}: unknown keyword(s) {sorted(unknown)}")
        if name is not None and not isinstance(name, str):
            raise GraphError(f"tensor(): name must be a string, got {name!r}")
        if isinstance(dim, (str, bytes)):
            raise GraphError(
                f"tensor(): dim must be a sequence of ints, got {dim!r}; the positional order is "
                f"cuDNN's tensor(dim, stride, data_type, ...) and a name goes in name="
            )
        if is_virtual:
            raise GraphError(f"tensor {label!r}: virtual tensors are produced by nodes, not declared")
        if is_pass_by_value:
            raise GraphError(
                f"tensor {label!r}: frost has no pass-by-value tensors (attn_scale is a Python number "
                f"fixed at plan time)"
            )
        if reordering_type is not None and enum_name(reordering_type, tensor_reordering, "reordering_type") != "NONE":
            raise GraphError(
                f"tensor {label!r}: reordering_type {reordering_type!r} is not served; frost reads "
                f"tensors as their strides say (tensor_reordering.NONE)"
            )
        if uid is not None and (isinstance(uid, bool) or not isinstance(uid, int)):
            raise GraphError(f"tensor {label!r}: uid must be an int, got {uid!r}")
        if dim is not None and stride is None:
            stride = compact_strides(_ints(dim, "dim", label))
        dt = data_type if data_type is not None else self.io_data_type
        self._check_name(None, label)
        t = Tensor(self, label, dim, stride, dt)
        if uid is not None and uid >= 0:
            self._set_uid(t, uid)
        self.tensors.append(t)
        if ragged_offset is not None:
            t.set_ragged_offset(ragged_offset)
        self._invalidate()
        return t

    def _free_label(self) -> str:
        """tensor_<n>, the first n no tensor of this graph is named."""
        taken = {t.name for t in self.tensors}
        n = len(self.tensors)
        while f"tensor_{n}" in taken:
            n += 1
        return f"tensor_{n}"

    def _check_name(self, t: Optional[Tensor], name: str) -> None:
        """A variant pack may be keyed by name: two tensors of one graph never share one."""
        for other in self.tensors:
            if other is not t and other.name == name:
                raise GraphError(
                    f"graph {self.name!r}: tensor name {name!r} is already taken (the tensor of uid "
                    f"{other.uid}); names key the variant pack, so each is used once per graph"
                )

    def _set_uid(self, t: Tensor, uid: int) -> None:
        """A uid the caller chose; a tensor that holds it without having chosen it gets a fresh one."""
        raw = uid
        try:
            uid = -1 if isinstance(raw, bool) else operator.index(raw)
        except TypeError:
            uid = -1
        if uid < 0:
            raise GraphError(f"tensor {t.name!r}: uid must be an int >= 0, got {raw!r}")
        for other in self.tensors:
            if other is not t and other.uid == uid:
                if other.uid_chosen:
                    raise GraphError(
                        f"tensor {t.name!r}: uid {uid} is already tensor {other.name!r}'s; uids key "
                        f"the variant pack, so each is used once per graph"
                    )
                taken = {x.uid for x in self.tensors} | {uid}
                other.uid = next_uid()
                while other.uid in taken:
                    other.uid = next_uid()
        t.uid = uid
        t.uid_chosen = True

    def tensor_like(self, like, name: Optional[str] = None) -> Tensor:
        """Declare a tensor with the dims, strides and dtype of a torch tensor or of another graph tensor."""
        if name is not None and not isinstance(name, str):
            raise GraphError(f"tensor_like(): name must be a string, got {name!r}")
        if isinstance(like, Tensor):
            like.require_declared()
            t = self.tensor(dim=like.dim, stride=like.stride, data_type=like.data_type, name=name or None)
            if like.ragged_offset is not None and like.ragged_offset._graph is self:
                t.set_ragged_offset(like.ragged_offset)
            return t
        shape, stride, dtype = getattr(like, "shape", None), getattr(like, "stride", None), getattr(like, "dtype", None)
        if shape is None or not callable(stride) or dtype is None:
            raise GraphError(f"tensor_like(): expected a torch tensor or a graph tensor, got {type(like).__name__}")
        return self.tensor(dim=tuple(shape), stride=tuple(stride()), data_type=dtype, name=name or None)

    def _virtual(self, name: str, dim, stride, data_type) -> Tensor:
        self._check_name(None, name)
        t = Tensor(self, name, dim, stride, data_type, is_virtual=True)
        self.tensors.append(t)
        return t

    def _check_owned(self, **tensors) -> None:
        for role, t in tensors.items():
            if t is None:
                continue
            if not isinstance(t, Tensor):
                raise GraphError(f"{role}: expected a frost tensor from graph.tensor(), got {type(t).__name__}")
            if t._graph is not self:
                raise GraphError(f"{role}: tensor {t.name!r} belongs to another graph")

    def _one_node(self) -> None:
        if self.node is not None:
            raise GraphError(
                f"graph {self.name!r} already holds {self.node.kind} {self.node.attrs.name!r}; "
                f"frost plans one SDPA node per graph"
            )

    def _attrs(self, name, kw) -> SdpaAttrs:
        allowed = set(SdpaAttrs.__dataclass_fields__) - {"name"}
        unknown = sorted(set(kw) - allowed)
        if unknown:
            raise GraphError(f"sdpa {name!r}: unknown keyword(s) {unknown}")
        self._check_owned(**{k: v for k, v in kw.items() if isinstance(v, Tensor) or k in TENSOR_ATTRS})
        for key in BOOL_ATTRS:
            if key in kw:
                kw[key] = as_flag(kw[key], f"sdpa {name!r}: {key}")
        if isinstance(kw.get("attn_scale"), Tensor):
            raise GraphError(
                f"sdpa {name!r}: attn_scale must be a number; frost fixes it at plan time and has no attn_scale tensor"
            )
        if "diagonal_alignment" in kw:
            kw["diagonal_alignment"] = enum_name(
                kw["diagonal_alignment"], diagonal_alignment, f"sdpa {name!r}: diagonal_alignment"
            )
        impl = kw.get("implementation")
        kw["implementation"] = (
            "AUTO" if impl is None else enum_name(impl, attention_implementation, f"sdpa {name!r}: implementation")
        )
        cdt = kw.get("compute_data_type")
        kw["compute_data_type"] = as_data_type(cdt).short if cdt is not None else None
        seed, offset = dropout_tensors(kw.get("dropout"))
        self._check_owned(dropout_seed=seed, dropout_offset=offset)
        return SdpaAttrs(name=name, **kw)

    def sdpa(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        is_inference=None,
        attn_scale=None,
        bias=None,
        block_mask=None,
        use_alibi_mask: bool = False,
        use_padding_mask: bool = False,
        seq_len_q=None,
        seq_len_kv=None,
        use_causal_mask: bool = False,
        use_causal_mask_bottom_right: bool = False,
        sliding_window_length=None,
        diagonal_alignment="TOP_LEFT",
        diagonal_band_left_bound=None,
        diagonal_band_right_bound=None,
        dropout=None,
        rng_dump=None,
        paged_attention_k_table=None,
        paged_attention_v_table=None,
        paged_attention_max_seq_len_kv=None,
        compute_data_type=None,
        name: str = "",
        score_mod=None,
        generate_stats=None,
        implementation=None,
        score_max=None,
        score_sum_exp=None,
        sink_token=None,
        unfuse_fma: bool = False,
        **frost_kw,
    ):
        """Scaled dot-product attention forward -> (O, Stats); Stats is None without generate_stats.

        The parameters are cuDNN's, in its positional order. frost's additions are keyword-only (`**frost_kw`):
        `cu_seq_len_q`, `cu_seq_len_kv`, `max_seq_len_q`, `max_seq_len_kv`, `max_total_seq_len_q`,
        `max_total_seq_len_kv`, `attn_mask`.
        """
        name = name or "sdpa"
        self._one_node()
        self._check_owned(q=q, k=k, v=v)
        for key, value in (("is_inference", is_inference), ("generate_stats", generate_stats)):
            if value is not None and not isinstance(value, bool):
                raise GraphError(f"sdpa {name!r}: {key} must be True, False or None, got {value!r}")
        if generate_stats is None:
            generate_stats = (not is_inference) if is_inference is not None else False
        elif is_inference is not None and is_inference == generate_stats:
            raise GraphError(
                f"sdpa {name!r}: generate_stats={generate_stats} and is_inference={is_inference} contradict each other"
            )
        kw = dict(
            attn_scale=attn_scale,
            bias=bias,
            block_mask=block_mask,
            use_alibi_mask=use_alibi_mask,
            use_padding_mask=use_padding_mask,
            seq_len_q=seq_len_q,
            seq_len_kv=seq_len_kv,
            use_causal_mask=use_causal_mask,
            use_causal_mask_bottom_right=use_causal_mask_bottom_right,
            sliding_window_length=sliding_window_length,
            diagonal_alignment=diagonal_alignment,
            diagonal_band_left_bound=diagonal_band_left_bound,
            diagonal_band_right_bound=diagonal_band_right_bound,
            dropout=dropout,
            rng_dump=rng_dump,
            paged_attention_k_table=paged_attention_k_table,
            paged_attention_v_table=paged_attention_v_table,
            paged_attention_max_seq_len_kv=paged_attention_max_seq_len_kv,
            compute_data_type=compute_data_type,
            score_mod=score_mod,
            implementation=implementation,
            score_max=score_max,
            score_sum_exp=score_sum_exp,
            sink_token=sink_token,
            unfuse_fma=unfuse_fma,
            **frost_kw,
        )
        attrs = self._attrs(name, kw)
        for out in (attrs.score_max, attrs.score_sum_exp, attrs.rng_dump):  # written by the forward
            if out is not None:
                out.set_output(True)
        thd = attrs.cu_seq_len_q is not None or attrs.cu_seq_len_kv is not None
        if thd and any(t.ragged_offset is not None for t in (q, k, v)):
            raise GraphError(
                f"sdpa {name!r}: declare frost's packed form (cu_seq_len_q/kv) or cuDNN's ragged "
                f"offsets (set_ragged_offset), not both"
            )
        for role, t in (("q", q), ("k", k), ("v", v)):
            t.require_declared()
            expect_rank(t, role, thd)
        geom = {
            "is_thd": thd,
            "total_q": q.dim[0],
            "batch": q.dim[0],
            "num_heads_q": q.dim[1],
            "seq_q": q.dim[2] if not thd else 0,
        }
        o_dim = expected_out_dims(geom, v.dim[-1])
        o = self._virtual(f"{name}::O", o_dim, _like_layout(q, o_dim), q.data_type)
        stats = None
        if generate_stats:
            s_dim = expected_stats_dims(geom)
            stats = self._virtual(f"{name}::Stats", s_dim, compact_strides(s_dim), "fp32")
        self.node = SdpaFwdNode(q=q, k=k, v=v, o=o, stats=stats, attrs=attrs, generate_stats=bool(generate_stats))
        for t in (o, stats):
            if t is not None:
                t.producer = self.node
        self._invalidate()
        return o, stats

    def sdpa_backward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        o: Tensor,
        dO: Tensor,
        stats: Tensor,
        attn_scale=None,
        bias=None,
        dBias=None,
        use_alibi_mask: bool = False,
        use_padding_mask: bool = False,
        seq_len_q=None,
        seq_len_kv=None,
        max_total_seq_len_q=None,
        max_total_seq_len_kv=None,
        use_causal_mask: bool = False,
        use_causal_mask_bottom_right: bool = False,
        sliding_window_length=None,
        diagonal_alignment="TOP_LEFT",
        diagonal_band_left_bound=None,
        diagonal_band_right_bound=None,
        dropout=None,
        rng_dump=None,
        use_deterministic_algorithm: bool = False,
        compute_data_type=None,
        name: str = "",
        score_mod=None,
        score_mod_bprop=None,
        sink_token=None,
        dSink_token: Optional[Tensor] = None,
        **frost_kw,
    ):
        """Scaled dot-product attention backward -> (dQ, dK, dV), each shaped and laid out like its input.

        The parameters are cuDNN's, in its positional order; frost's additions are keyword-only, as for sdpa().
        `dBias` (declared like `bias`, which it needs) receives the gradient of the additive bias.
        """
        name = name or "sdpa_backward"
        if frost_kw.get("block_mask") is not None:
            raise GraphError(
                f"sdpa_backward {name!r}: block_mask is a forward keyword; cuDNN's sdpa_backward has no block mask"
            )
        frost_kw.pop("block_mask", None)
        self._one_node()
        self._check_owned(q=q, k=k, v=v, o=o, dO=dO, stats=stats, dSink_token=dSink_token, dBias=dBias)
        for role, t in (("q", q), ("k", k), ("v", v), ("o", o), ("dO", dO), ("stats", stats)):
            if t is None:
                raise GraphError(f"sdpa_backward {name!r}: {role} is required")
            t.require_declared()
        use_deterministic_algorithm = as_flag(
            use_deterministic_algorithm, f"sdpa_backward {name!r}: use_deterministic_algorithm"
        )
        kw = dict(
            attn_scale=attn_scale,
            bias=bias,
            use_alibi_mask=use_alibi_mask,
            use_padding_mask=use_padding_mask,
            seq_len_q=seq_len_q,
            seq_len_kv=seq_len_kv,
            max_total_seq_len_q=max_total_seq_len_q,
            max_total_seq_len_kv=max_total_seq_len_kv,
            use_causal_mask=use_causal_mask,
            use_causal_mask_bottom_right=use_causal_mask_bottom_right,
            sliding_window_length=sliding_window_length,
            diagonal_alignment=diagonal_alignment,
            diagonal_band_left_bound=diagonal_band_left_bound,
            diagonal_band_right_bound=diagonal_band_right_bound,
            dropout=dropout,
            rng_dump=rng_dump,
            compute_data_type=compute_data_type,
            score_mod=score_mod,
            score_mod_bprop=score_mod_bprop,
            sink_token=sink_token,
            **frost_kw,
        )
        attrs = self._attrs(name, kw)
        grads = [
            self._virtual(f"{name}::{g}", src.dim, _like_layout(src, src.dim), src.data_type)
            for g, src in (("dQ", q), ("dK", k), ("dV", v))
        ]
        for out in (dSink_token, dBias, attrs.rng_dump):
            if out is not None:
                out.set_output(True)
        self.node = SdpaBwdNode(
            q=q,
            k=k,
            v=v,
            o=o,
            dO=dO,
            stats=stats,
            dQ=grads[0],
            dK=grads[1],
            dV=grads[2],
            attrs=attrs,
            use_deterministic_algorithm=use_deterministic_algorithm,
            dSink_token=dSink_token,
            dBias=dBias,
        )
        self._invalidate()
        return tuple(grads)

    # validation ---------------------------------------------------------------------------
    def validate(self) -> "OpGraph":
        if self.node is None:
            raise GraphError(f"graph {self.name!r} has no SDPA node; call sdpa() or sdpa_backward() first")
        required = (
            {"o": self.node.o}
            if self.node.kind == "sdpa_fwd"
            else {"dQ": self.node.dQ, "dK": self.node.dK, "dV": self.node.dV}
        )
        for role, t in required.items():
            if not t.is_output:
                raise GraphError(f"tensor {t.name!r} ({role}): the output is not marked; call set_output(True)")
        self.facts = validate_fwd(self.node) if self.node.kind == "sdpa_fwd" else validate_bwd(self.node)
        return self

    def build_operation_graph(self) -> "OpGraph":
        if self.facts is None:
            OpGraph.validate(self)  # the declaration only: planning ranks the engines itself
        return self

    def _roles(self) -> dict:
        """The node's bound tensors by role: what an execute binds."""
        n = self.node
        roles = dict(n.inputs())
        roles.update(n.outputs())
        if n.kind == "sdpa_fwd" and not n.generate_stats:
            roles.pop("stats", None)
        return roles
