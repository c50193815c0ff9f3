"""The cuDNN lowering: a frost facts record -> a plain record of the cuDNN frontend graph calls that serve it.

Pure Python (no cuDNN import), so it is tested on any machine. `frost/adapters/cudnn.py` replays the
record against `cudnn.pygraph`: one `graph.tensor(...)` per `CudnnTensor` in `inputs`, one call of
`op` with the positional roles, tensor keywords, scalar keywords and dropout, then the returned outputs
get the declared dims, strides and data types of `outputs`.

Every frost tensor keeps its declared dims and strides (K and V their own head counts); the only reshapes are
frost's shorter forms of one-value-per-batch or per-head tensors (`seq_len_q` (B,), `sink_token` (H,), dropout
seeds (1,)), which cuDNN declares as 4-d views of the same memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

#: why packed THD graphs are declined (see README, engines table)
THD_REASON = ("does not serve packed THD: cuDNN takes per-batch seq_len tensors (and ragged element offsets), "
              "which would have to be derived from cu_seq_len_q/kv by a kernel on the execute path; declare a "
              "padded dense graph with use_padding_mask and seq_len_q/kv instead")


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

    def kwarg(self, name: str, default=None):
        for k, v in self.scalar_kwargs + self.tensor_kwargs:
            if k == name:
                return v
        return default

    def roles(self) -> tuple[str, ...]:
        """Every role bound at execute, inputs then outputs."""
        return tuple(t.role for t in self.inputs) + tuple(t.role for t in self.outputs)


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


def lower_cudnn_sdpa(facts) -> CudnnSdpaCall:
    """The cuDNN graph calls that compute the SDPA node `facts` describe, or CudnnUnsupported."""
    if facts.is_thd:
        raise CudnnUnsupported(THD_REASON)
    for flag, what in ((facts.has_attn_mask, "attn_mask"), (facts.has_score_mod, "score_mod")):
        if flag:
            raise CudnnUnsupported(f"does not serve {what}")
    fwd = facts.direction == "fwd"
    positional = ("q", "k", "v") if fwd else ("q", "k", "v", "o", "dO", "stats")
    inputs = [_declared(facts, r) for r in positional]
    tensor_kwargs, output_kwargs = [], []
    scalars = {"attn_scale": float(facts.attn_scale)}  # pybind takes a Python float (an int reads as a tensor)
    if fwd:
        scalars["generate_stats"] = bool(facts.has_stats)
    elif facts.deterministic:
        scalars["use_deterministic_algorithm"] = True
    scalars.update(band_kwargs(facts))
    if facts.has_padding:
        scalars["use_padding_mask"] = True
        for role in ("seq_len_q", "seq_len_kv"):
            inputs.append(_as4(facts.tensor(role), 0))
            tensor_kwargs.append((role, role))
    if facts.has_sinks:
        inputs.append(_as4(facts.tensor("sink_token"), 1))
        tensor_kwargs.append(("sink_token", "sink_token"))
    if facts.has_alibi:
        scalars["use_alibi_mask"] = True
    if facts.has_bias:
        inputs.append(_declared(facts, "bias"))
        tensor_kwargs.append(("bias", "bias"))
    dropout = None
    if facts.has_dropout:
        for role in ("dropout_seed", "dropout_offset"):
            t = facts.tensor(role)
            inputs.append(CudnnTensor(role, (1, 1, 1, 1), (1, 1, 1, 1), t.dtype))
        dropout = (facts.dropout_probability, "dropout_seed", "dropout_offset")
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
    out_roles = (("o", "stats") if facts.has_stats else ("o",)) if fwd else ("dQ", "dK", "dV")
    return CudnnSdpaCall(op="sdpa" if fwd else "sdpa_backward", io_dtype=facts.io_dtype, inputs=tuple(inputs),
                         positional=positional, tensor_kwargs=tuple(tensor_kwargs),
                         scalar_kwargs=tuple(scalars.items()), outputs=tuple(_declared(facts, r) for r in out_roles),
                         output_kwargs=tuple(output_kwargs), dropout=dropout)
