"""The cuDNN lowering: a frost facts record -> a plain record of the cuDNN frontend graph calls that serve it.

Pure Python (no cuDNN import), so it is tested on any machine. `frost/adapters/cudnn.py` replays the
record against `cudnn.pygraph`: one `graph.tensor(...)` per `CudnnTensor` in `inputs`, one call of
`op` with the positional roles, tensor keywords, scalar keywords and dropout, then the returned outputs
get the declared dims, strides and data types of `outputs`.

Every frost tensor keeps its declared dims and strides (K and V their own head counts); the only reshapes are
frost's shorter forms of one-value-per-batch or per-head tensors (`seq_len_q` (B,), `sink_token` (H,), dropout
seeds (1,)), which cuDNN declares as 4-d views of the same memory, and packed graphs, which cuDNN serves in its
ragged form:

- frost's packed form (Q/K/V/O (T, H, D), `cu_seq_len_q/kv` (B+1,)): each packed tensor is declared (B, H, S, D)
  with its own H and D strides, its token stride as the S stride (and S times it as the batch stride, which the
  ragged offset replaces), S the plan-time envelope `max_seq_len_q/kv` and B from the declared (B+1,) of
  cu_seq_len. The lengths (B, 1, 1, 1) int32 and one ragged offset array (B+1, 1, 1, 1) per token stride a group
  uses (`cu[b] * stride`, int32, or int64 when the declared total times the stride passes int32) are derived
  from cu_seq_len on the execute stream (`derived`: frost's ragged-offsets kernel, into workspace scratch).
  Stats (T, H, 1) is cuDNN's packed Stats: (B, H, S, 1) with a ragged offset of its own token stride.
- cuDNN's ragged form declared directly (`facts.ragged`): the declared (B, H, S, D) tensors, offsets and lengths
  are passed through as they are.

cuDNN's block_mask (uint8, as declared) goes to dense graphs' `sdpa` as it is; packed graphs with one decline (its
tiles in cuDNN's ragged form are unverified).

A paged K/V cache (`facts.paged`) goes to cuDNN's paged SDPA as declared: K and V are the containers (num_blocks,
H, block_size, D), the int32 tables (B, 1, max_blocks_per_seq, 1) pass as `paged_attention_k_table` /
`paged_attention_v_table` with their declared strides, `paged_attention_max_seq_len_kv` is the facts' S_kv
envelope, and the padding mask's lengths say how many keys each sequence has.

Packed graphs (either form) with K and V heads apart, or with score_max / score_sum_exp, are declined: neither is
lowered to cuDNN's ragged form (the row outputs would need ragged offsets of their own, and K and V heads apart
are unverified there); dense graphs serve both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from frost.engines.common.ragged_offsets_params import RaggedOffsetsParams, offset_dtype_for, offset_role
from frost.ir.validate import Q_GROUP  # the query token group (its offsets follow cu_seq_len_q; the rest, _kv)


#: the roles of a paged cache's block tables: cuDNN's own keywords
PAGED_TABLES = ("paged_attention_k_table", "paged_attention_v_table")


class CudnnUnsupported(Exception):
    """The facts use something the cuDNN lowering cannot express; `reason` is one sentence."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True)
class CudnnTensor:
    role: str  # the frost role it binds at execute (q, k, bias, seq_len_q, dO, ...)
    dim: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str  # frost short dtype: bf16, fp16, fp32, int32, int64


@dataclass(frozen=True)
class CudnnSdpaCall:
    """What to ask `cudnn.pygraph`: declare `inputs`, call `op`, shape `outputs` as frost declared them."""

    op: str  # "sdpa" | "sdpa_backward"
    io_dtype: str
    inputs: tuple[CudnnTensor, ...]  # graph.tensor() declarations, bound by role at execute
    positional: tuple[str, ...]  # roles passed positionally: q, k, v (, o, dO, stats)
    tensor_kwargs: tuple[tuple[str, str], ...]  # (keyword, role) of declared tensors passed by keyword
    scalar_kwargs: tuple[tuple[str, object], ...]  # (keyword, value); diagonal_alignment as its enum member name
    outputs: tuple[CudnnTensor, ...]  # returned by the op, in its return order ((O, Stats) or (dQ, dK, dV))
    output_kwargs: tuple[str, ...] = ()  # roles passed as keywords that cuDNN writes (dBias, dSink_token)
    dropout: Optional[tuple[float, str, str]] = None  # (probability, seed role, offset role)
    ragged: tuple[tuple[str, str], ...] = ()  # (tensor role, ragged offset role): `set_ragged_offset` of each
    derived: Optional[RaggedOffsetsParams] = None  # packed graphs: the kernel that writes the derived roles
    envelope: tuple[int, ...] = ()  # packed graphs: (total_q, total_kv, max_q, max_kv) that kernel clamps to

    def kwarg(self, name: str, default=None):
        for k, v in self.scalar_kwargs + self.tensor_kwargs:
            if k == name:
                return v
        return default

    @property
    def batch(self) -> int:
        """Packed graphs: B, the derived lengths' extent (the declared cu_seq_len's B+1, less one); 0 otherwise."""
        if self.derived is None:
            return 0
        return next(t.dim[0] for t in self.inputs if t.role == "seq_len_q")

    def roles(self) -> tuple[str, ...]:
        """Every role bound at execute, inputs then outputs (derived roles included: see `derived_roles`)."""
        return tuple(t.role for t in self.inputs) + tuple(t.role for t in self.outputs)

    def derived_roles(self) -> tuple[str, ...]:
        """The roles frost's ragged-offsets kernel writes into scratch (packed graphs), in its rows' order."""
        if self.derived is None:
            return ()
        return ("seq_len_q", "seq_len_kv") + tuple(offset_role(i) for i in range(self.derived.num_offsets))


def _as4(t, batch_or_heads_axis: int) -> CudnnTensor:
    """A one-value-per-batch (axis 0) or per-head (axis 1) tensor as cuDNN's 4-d declaration."""
    if len(t.dim) == 4:
        return CudnnTensor(t.name, t.dim, t.stride, t.dtype)
    n, s = t.dim[0], t.stride[0]
    dim = [1, 1, 1, 1]
    dim[batch_or_heads_axis] = n
    stride = (n * s, s, s, s) if batch_or_heads_axis == 1 else (s, s, s, s)
    return CudnnTensor(t.name, tuple(dim), stride, t.dtype)


def _declared(facts, role: str) -> CudnnTensor:
    t = facts.tensor(role)
    if t is None:  # the facts record is built by validation: a missing role is a bug
        raise KeyError(f"facts have no tensor {role!r}")
    return CudnnTensor(role, t.dim, t.stride, t.dtype)


def band_kwargs(facts) -> dict:
    """frost's resolved band as cuDNN's preferred masking keywords: the diagonal alignment and explicit bounds.

    A causal mask is `diagonal_band_right_bound=0` (what cuDNN's deprecated `use_causal_mask*` flags set), never
    the flag: cuDNN documents mixing its deprecated masking keywords with the preferred ones (a causal sliding
    window needs the left bound) as undefined.
    """
    left, right = facts.window_left, facts.window_right
    if left is None and right is None:
        return {}
    kw = {"diagonal_alignment": "BOTTOM_RIGHT" if facts.bottom_right else "TOP_LEFT"}
    if left is not None:
        kw["diagonal_band_left_bound"] = int(left) + 1  # frost's window_left = L - 1
    if right is not None:
        kw["diagonal_band_right_bound"] = int(right)
    return kw


def _total_dependent_stride(t) -> Optional[str]:
    """Why a packed tensor's layout cannot be a cuDNN declaration, or None.

    The binder lets a stride equal to the declared token total follow a bound tensor's smaller total (head-major
    Stats (H, T)); cuDNN's graph fixes every stride when it is built, so such a layout is declined."""
    total = t.dim[0]
    if any(d > 1 and st == total for d, st in zip(t.dim[1:], t.stride[1:])):
        what = "packed Stats declared head-major (H, T)" if t.name == "stats" else f"packed {t.label or t.name}"
        return (
            f"does not serve {what}, strides {t.stride}: a stride equal to the token total follows the bound "
            f"tensor's total, and cuDNN fixes strides when its graph is built; declare it token-major "
            f"(T, H, {t.dim[2]}) with strides ({t.dim[1] * t.dim[2]}, {t.dim[2]}, 1)"
        )
    return None


class _Packed:
    """frost's packed form in cuDNN's ragged form: the (B, H, S, D) declarations and one offset array per
    (token group, token stride)."""

    def __init__(self, facts):
        self.facts = facts
        self.strides = {"q": [], "kv": []}
        self.pairs = []

    def declare(self, role: str) -> CudnnTensor:
        f = self.facts
        t = f.tensor(role)
        why = _total_dependent_stride(t)
        if why:
            raise CudnnUnsupported(why)
        group = "q" if role in Q_GROUP else "kv"
        seq = f.seq_q if group == "q" else f.seq_kv
        token, head, inner = t.stride
        strides = self.strides[group]
        if token not in strides:
            strides.append(token)
        self.pairs.append((role, group, strides.index(token)))
        return CudnnTensor(role, (f.batch, t.dim[1], seq, t.dim[2]), (seq * token, head, token, inner), t.dtype)

    def finish(self):
        """(derived operand declarations, (tensor role, offset role) pairs, kernel params)."""
        f = self.facts
        sq, skv = tuple(self.strides["q"]), tuple(self.strides["kv"])
        largest = max(max(f.total_q * s for s in sq), max(f.total_kv * s for s in skv))
        params = RaggedOffsetsParams(offset_dtype=offset_dtype_for(largest), strides_q=sq, strides_kv=skv)
        ones = (1, 1, 1, 1)
        tensors = [CudnnTensor(r, (f.batch, 1, 1, 1), ones, "int32") for r in ("seq_len_q", "seq_len_kv")]
        tensors += [
            CudnnTensor(offset_role(i), (f.batch + 1, 1, 1, 1), ones, params.offset_dtype)
            for i in range(params.num_offsets)
        ]
        pairs = tuple((role, offset_role(i if group == "q" else len(sq) + i)) for role, group, i in self.pairs)
        return tensors, pairs, params


def _ragged_declared(facts) -> dict:
    """cuDNN's ragged form as declared: {role: CudnnTensor} of its tensors, their offsets and the lengths."""
    out = {}
    for t in facts.ragged.declared:
        if t.name in ("seq_len_q", "seq_len_kv") or t.name.endswith("_ragged_offset"):
            out[t.name] = _as4(t, 0)
        else:
            out[t.name] = CudnnTensor(t.name, t.dim, t.stride, t.dtype)
    return out


def lower_cudnn_sdpa(facts) -> CudnnSdpaCall:
    """The cuDNN graph calls that compute the SDPA node `facts` describe, or CudnnUnsupported."""
    for flag, what in ((facts.has_attn_mask, "attn_mask"), (facts.has_score_mod, "score_mod")):
        if flag:
            raise CudnnUnsupported(f"does not serve {what}")
    if facts.is_thd:
        for on, what in (
            (facts.split_kv_heads, f"K and V heads apart (K {facts.num_heads_kv}, V {facts.heads_v})"),
            (facts.has_score_max or facts.has_score_sum_exp, "score_max / score_sum_exp"),
            (facts.has_block_mask, "block_mask"),
        ):
            if on:
                raise CudnnUnsupported(f"does not serve {what} in packed graphs (cuDNN's ragged form)")
    fwd = facts.direction == "fwd"
    positional = ("q", "k", "v") if fwd else ("q", "k", "v", "o", "dO", "stats")
    out_roles = (("o", "stats") if facts.has_stats else ("o",)) if fwd else ("dQ", "dK", "dV")
    packed = _Packed(facts) if facts.is_thd and facts.ragged is None else None
    ragged = _ragged_declared(facts) if facts.ragged is not None else None

    def io(role: str) -> CudnnTensor:
        if packed is not None:
            return packed.declare(role)
        if ragged is not None and role in ragged:
            return ragged[role]
        return _declared(facts, role)

    inputs = [io(r) for r in positional]
    outputs = [io(r) for r in out_roles]
    tensor_kwargs, output_kwargs, pairs = [], [], ()
    scalars = {"attn_scale": float(facts.attn_scale)}  # pybind takes a Python float (an int reads as a tensor)
    if fwd:
        scalars["generate_stats"] = bool(facts.has_stats)
    elif facts.deterministic:
        scalars["use_deterministic_algorithm"] = True
    scalars.update(band_kwargs(facts))
    derived = None
    if facts.is_thd:  # lengths and offsets: derived from cu_seq_len (packed), or as declared (ragged)
        scalars.update(
            use_padding_mask=True, max_total_seq_len_q=int(facts.total_q), max_total_seq_len_kv=int(facts.total_kv)
        )
        if packed is not None:
            extra, pairs, derived = packed.finish()
        else:
            pairs = tuple(
                (r, f"{r}_ragged_offset") for r in (*positional, *out_roles) if f"{r}_ragged_offset" in ragged
            )
            extra = [ragged[r] for r in ("seq_len_q", "seq_len_kv")] + [ragged[o] for _, o in pairs]
        inputs += extra
        tensor_kwargs += [("seq_len_q", "seq_len_q"), ("seq_len_kv", "seq_len_kv")]
    if facts.has_padding:
        scalars["use_padding_mask"] = True
        for role in ("seq_len_q", "seq_len_kv"):
            inputs.append(_as4(facts.tensor(role), 0))
            tensor_kwargs.append((role, role))
    if facts.paged is not None:  # K and V stay the declared containers; the tables go as declared
        for role in PAGED_TABLES:
            inputs.append(_declared(facts, role))
            tensor_kwargs.append((role, role))
        scalars["paged_attention_max_seq_len_kv"] = int(facts.seq_kv)
    if facts.has_sinks:
        inputs.append(_as4(facts.tensor("sink_token"), 1))
        tensor_kwargs.append(("sink_token", "sink_token"))
    if facts.has_alibi:
        scalars["use_alibi_mask"] = True
    if facts.has_bias:
        inputs.append(_declared(facts, "bias"))
        tensor_kwargs.append(("bias", "bias"))
    if facts.has_block_mask:  # cuDNN 9.14's unified SDPA node; cuDNN's support check judges older libraries
        inputs.append(_declared(facts, "block_mask"))
        tensor_kwargs.append(("block_mask", "block_mask"))
    dropout = None
    if facts.has_dropout:
        for role in ("dropout_seed", "dropout_offset"):
            t = facts.tensor(role)
            inputs.append(CudnnTensor(role, (1, 1, 1, 1), (1, 1, 1, 1), t.dtype))
        dropout = (facts.dropout_probability, "dropout_seed", "dropout_offset")
        if facts.tensor("rng_dump") is not None:  # the mask cuDNN draws, dumped where declared (an output)
            inputs.append(_declared(facts, "rng_dump"))
            tensor_kwargs.append(("rng_dump", "rng_dump"))
            output_kwargs.append("rng_dump")
    for role, on in (("score_max", facts.has_score_max), ("score_sum_exp", facts.has_score_sum_exp)):
        if on:  # declared as graph tensors the forward writes, as cuDNN's python API takes them
            inputs.append(_declared(facts, role))
            tensor_kwargs.append((role, role))
            output_kwargs.append(role)
    if not fwd:
        if facts.has_dbias:
            inputs.append(_declared(facts, "dBias"))
            tensor_kwargs.append(("dBias", "dBias"))
            output_kwargs.append("dBias")
        if facts.has_dsink:
            inputs.append(_as4(facts.tensor("dSink_token"), 1))
            tensor_kwargs.append(("dSink_token", "dSink_token"))
            output_kwargs.append("dSink_token")
    return CudnnSdpaCall(
        op="sdpa" if fwd else "sdpa_backward",
        io_dtype=facts.io_dtype,
        inputs=tuple(inputs),
        positional=positional,
        tensor_kwargs=tuple(tensor_kwargs),
        scalar_kwargs=tuple(scalars.items()),
        outputs=tuple(outputs),
        output_kwargs=tuple(output_kwargs),
        dropout=dropout,
        ragged=pairs,
        derived=derived,
        envelope=()
        if derived is None
        else (int(facts.total_q), int(facts.total_kv), int(facts.seq_q), int(facts.seq_kv)),
    )
