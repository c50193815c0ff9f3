"""The operation graph: tensors, one SDPA node, and validation into the facts record.

Declarations only, in the cuDNN frontend pygraph vocabulary. Planning and execution
live in the public `frost.Graph` (frost/graph.py), which extends this class.
"""
from __future__ import annotations

from typing import Optional

from frost.errors import GraphError
from frost.ir.nodes import SdpaAttrs, SdpaBwdNode, SdpaFwdNode, dropout_tensors
from frost.ir.tensor import Tensor, _ints, compact_strides
from frost.ir.validate import expect_rank, expected_out_dims, expected_stats_dims, validate_bwd, validate_fwd
from frost.types import as_data_type


def _stride_order(t: Tensor) -> list[int]:
    """Axes from slowest to fastest, as declared by t's strides."""
    return sorted(range(len(t.dim)), key=lambda a: (-t.stride[a], a))


def _like_layout(src: Tensor, dim: tuple) -> tuple:
    return compact_strides(dim, _stride_order(src))


class OpGraph:
    """Declare tensors and one SDPA node; `validate()` turns them into facts."""

    def __init__(self, io_data_type=None, intermediate_data_type=None, compute_data_type=None,
                 name: str = "frost_graph"):
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

    def tensor(self, name: Optional[str] = None, dim=None, stride=None, data_type=None, is_virtual: bool = False,
               **unknown) -> Tensor:
        if unknown:
            raise GraphError(f"tensor {name!r}: unknown keyword(s) {sorted(unknown)}")
        if is_virtual:
            raise GraphError(f"tensor {name!r}: virtual tensors are produced by nodes, not declared")
        if dim is not None and stride is None:
            stride = compact_strides(_ints(dim, "dim", name))
        dt = data_type if data_type is not None else self.io_data_type
        t = Tensor(self, name or f"tensor_{len(self.tensors)}", dim, stride, dt)
        self.tensors.append(t)
        self._invalidate()
        return t

    def tensor_like(self, like, name: Optional[str] = None) -> Tensor:
        """Declare a tensor with the dims, strides and dtype of a torch tensor."""
        return self.tensor(name=name, dim=tuple(like.shape), stride=tuple(like.stride()), data_type=like.dtype)

    def _virtual(self, name: str, dim, stride, data_type) -> Tensor:
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
            raise GraphError(f"graph {self.name!r} already holds {self.node.kind} {self.node.attrs.name!r}; "
                             f"frost plans one SDPA node per graph")

    def _attrs(self, name, kw) -> SdpaAttrs:
        allowed = set(SdpaAttrs.__dataclass_fields__) - {"name"}
        unknown = sorted(set(kw) - allowed)
        if unknown:
            raise GraphError(f"sdpa {name!r}: unknown keyword(s) {unknown}")
        self._check_owned(**{k: v for k, v in kw.items() if isinstance(v, Tensor) or k in (
            "seq_len_q", "seq_len_kv", "cu_seq_len_q", "cu_seq_len_kv", "sink_token", "attn_mask", "bias")})
        seed, offset = dropout_tensors(kw.get("dropout"))
        self._check_owned(dropout_seed=seed, dropout_offset=offset)
        return SdpaAttrs(name=name, **kw)

    def sdpa(self, q: Tensor, k: Tensor, v: Tensor, attn_scale=None, generate_stats=None, is_inference=None,
             name: str = "sdpa", **kw):
        """Scaled dot-product attention forward -> (O, Stats); Stats is None without generate_stats."""
        self._one_node()
        self._check_owned(q=q, k=k, v=v)
        if generate_stats is None:
            generate_stats = (not is_inference) if is_inference is not None else False
        attrs = self._attrs(name, dict(attn_scale=attn_scale, **kw))
        thd = attrs.cu_seq_len_q is not None or attrs.cu_seq_len_kv is not None
        for role, t in (("q", q), ("k", k), ("v", v)):
            t.require_declared()
            expect_rank(t, role, thd)
        geom = {"is_thd": thd, "total_q": q.dim[0], "batch": q.dim[0], "num_heads_q": q.dim[1],
                "seq_q": q.dim[2] if not thd else 0}
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

    def sdpa_backward(self, q: Tensor, k: Tensor, v: Tensor, o: Tensor, dO: Tensor, stats: Tensor,
                      attn_scale=None, use_deterministic_algorithm: bool = False, dSink_token: Optional[Tensor] = None,
                      dBias: Optional[Tensor] = None, name: str = "sdpa_backward", **kw):
        """Scaled dot-product attention backward -> (dQ, dK, dV), each shaped and laid out like its input.

        `dBias` (declared like `bias`, which it needs) receives the gradient of the additive bias.
        """
        self._one_node()
        self._check_owned(q=q, k=k, v=v, o=o, dO=dO, stats=stats, dSink_token=dSink_token, dBias=dBias)
        for role, t in (("q", q), ("k", k), ("v", v), ("o", o), ("dO", dO), ("stats", stats)):
            if t is None:
                raise GraphError(f"sdpa_backward {name!r}: {role} is required")
            t.require_declared()
        attrs = self._attrs(name, dict(attn_scale=attn_scale, **kw))
        grads = [self._virtual(f"{name}::{g}", src.dim, _like_layout(src, src.dim), src.data_type)
                 for g, src in (("dQ", q), ("dK", k), ("dV", v))]
        for out in (dSink_token, dBias):
            if out is not None:
                out.set_output(True)
        self.node = SdpaBwdNode(q=q, k=k, v=v, o=o, dO=dO, stats=stats, dQ=grads[0], dK=grads[1], dV=grads[2],
                                attrs=attrs, use_deterministic_algorithm=bool(use_deterministic_algorithm),
                                dSink_token=dSink_token, dBias=dBias)
        self._invalidate()
        return tuple(grads)

    # validation ---------------------------------------------------------------------------
    def validate(self) -> "OpGraph":
        if self.node is None:
            raise GraphError(f"graph {self.name!r} has no SDPA node; call sdpa() or sdpa_backward() first")
        required = {"o": self.node.o} if self.node.kind == "sdpa_fwd" else {
            "dQ": self.node.dQ, "dK": self.node.dK, "dV": self.node.dV}
        for role, t in required.items():
            if not t.is_output:
                raise GraphError(f"tensor {t.name!r} ({role}): the output is not marked; call set_output(True)")
        self.facts = validate_fwd(self.node) if self.node.kind == "sdpa_fwd" else validate_bwd(self.node)
        return self

    def build_operation_graph(self) -> "OpGraph":
        if self.facts is None:
            self.validate()
        return self

    def _roles(self) -> dict:
        """The node's bound tensors by role: what an execute binds."""
        n = self.node
        roles = dict(n.inputs())
        roles.update(n.outputs())
        if n.kind == "sdpa_fwd" and not n.generate_stats:
            roles.pop("stats", None)
        return roles
