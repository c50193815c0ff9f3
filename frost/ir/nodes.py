"""SDPA forward and backward nodes: the op attributes exactly as the user declared them.

Attribute names follow the cuDNN frontend's pygraph `sdpa` / `sdpa_backward`
keywords. Anything that changes numerics lives here, never in knobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from frost.ir.tensor import Tensor


@dataclass
class SdpaAttrs:
    """Attributes shared by the forward and backward node."""

    name: str = "sdpa"
    attn_scale: Optional[float] = None  # None means 1.0, as in cuDNN
    use_causal_mask: bool = False
    use_causal_mask_bottom_right: bool = False
    diagonal_alignment: str = "TOP_LEFT"  # or "BOTTOM_RIGHT"
    diagonal_band_left_bound: Optional[int] = None
    diagonal_band_right_bound: Optional[int] = None
    sliding_window_length: Optional[int] = None
    use_padding_mask: bool = False
    seq_len_q: Optional[Tensor] = None
    seq_len_kv: Optional[Tensor] = None
    cu_seq_len_q: Optional[Tensor] = None  # frost: packed THD prefix sums (B+1,) int32
    cu_seq_len_kv: Optional[Tensor] = None
    max_seq_len_q: Optional[int] = None  # frost: plan-time envelopes for THD
    max_seq_len_kv: Optional[int] = None
    max_total_seq_len_q: Optional[int] = None  # cuDNN's ragged form: token envelopes (default B * S)
    max_total_seq_len_kv: Optional[int] = None
    sink_token: Optional[Tensor] = None
    # (probability, seed tensor, offset tensor), as cuDNN declares it; served by the cuDNN engine
    dropout: Optional[tuple] = None
    bias: Optional[Tensor] = None  # additive, (1|B, 1|H_q, S_q, S_kv); the mma.sync, cuDNN and reference engines
    # declared for completeness; engines decline what they cannot serve
    attn_mask: Optional[Tensor] = None
    use_alibi_mask: bool = False
    score_mod: Optional[object] = None
    score_mod_bprop: Optional[object] = None
    block_mask: Optional[Tensor] = None
    rng_dump: Optional[Tensor] = None
    paged_attention_k_table: Optional[Tensor] = None
    paged_attention_v_table: Optional[Tensor] = None
    paged_attention_max_seq_len_kv: Optional[int] = None
    score_max: Optional[Tensor] = None
    score_sum_exp: Optional[Tensor] = None
    implementation: str = "AUTO"  # cuDNN's attention_implementation, by name: a hint (every engine computes the same)
    compute_data_type: Optional[str] = None  # short name of a DataType; None = not set
    unfuse_fma: bool = False


#: attributes that hold graph tensors (checked to belong to the graph)
TENSOR_ATTRS = (
    "seq_len_q",
    "seq_len_kv",
    "cu_seq_len_q",
    "cu_seq_len_kv",
    "sink_token",
    "attn_mask",
    "bias",
    "block_mask",
    "rng_dump",
    "paged_attention_k_table",
    "paged_attention_v_table",
    "score_max",
    "score_sum_exp",
)
#: tensor attributes the forward writes (cuDNN's row statistics beside Stats): outputs, not inputs
OUTPUT_ATTRS = ("score_max", "score_sum_exp")
#: attributes that must be True or False
BOOL_ATTRS = ("use_alibi_mask", "use_padding_mask", "use_causal_mask", "use_causal_mask_bottom_right", "unfuse_fma")


@dataclass
class SdpaFwdNode:
    q: Tensor
    k: Tensor
    v: Tensor
    o: Tensor
    stats: Optional[Tensor]
    attrs: SdpaAttrs
    generate_stats: bool = False
    kind: str = field(default="sdpa_fwd", init=False)

    def io(self) -> dict:
        """The attention tensors by role (those cuDNN's ragged form may give a ragged offset)."""
        d = {"q": self.q, "k": self.k, "v": self.v, "o": self.o}
        if self.stats is not None:
            d["stats"] = self.stats
        d.update(_output_attrs(self.attrs))
        return d

    def inputs(self) -> dict:
        d = {"q": self.q, "k": self.k, "v": self.v}
        d.update(_attr_tensors(self.attrs))
        d.update(ragged_offsets(self.io()))
        return d

    def outputs(self) -> dict:
        d = {"o": self.o}
        if self.stats is not None:
            d["stats"] = self.stats
        d.update(_output_attrs(self.attrs))
        return d


@dataclass
class SdpaBwdNode:
    q: Tensor
    k: Tensor
    v: Tensor
    o: Tensor
    dO: Tensor
    stats: Tensor
    dQ: Tensor
    dK: Tensor
    dV: Tensor
    attrs: SdpaAttrs
    use_deterministic_algorithm: bool = False
    dSink_token: Optional[Tensor] = None
    dBias: Optional[Tensor] = None
    kind: str = field(default="sdpa_bwd", init=False)

    def io(self) -> dict:
        return {
            "q": self.q,
            "k": self.k,
            "v": self.v,
            "o": self.o,
            "dO": self.dO,
            "stats": self.stats,
            "dQ": self.dQ,
            "dK": self.dK,
            "dV": self.dV,
        }

    def inputs(self) -> dict:
        d = {"q": self.q, "k": self.k, "v": self.v, "o": self.o, "dO": self.dO, "stats": self.stats}
        d.update(_attr_tensors(self.attrs))
        d.update(ragged_offsets(self.io()))
        return d

    def outputs(self) -> dict:
        d = {"dQ": self.dQ, "dK": self.dK, "dV": self.dV}
        if self.dSink_token is not None:
            d["dSink_token"] = self.dSink_token
        if self.dBias is not None:
            d["dBias"] = self.dBias
        return d


def _output_attrs(a: SdpaAttrs) -> dict:
    return {k: getattr(a, k) for k in OUTPUT_ATTRS if getattr(a, k) is not None}


def _attr_tensors(a: SdpaAttrs) -> dict:
    named = {k: getattr(a, k) for k in TENSOR_ATTRS if k not in OUTPUT_ATTRS}
    seed, offset = dropout_tensors(a.dropout)
    named.update(dropout_seed=seed, dropout_offset=offset)
    return {k: t for k, t in named.items() if t is not None}


def dropout_tensors(dropout) -> tuple:
    """(seed, offset) frost tensors of a declared `dropout=(p, seed, offset)`, None where absent or not tensors."""
    if not isinstance(dropout, (tuple, list)) or len(dropout) != 3:
        return None, None
    return tuple(t if isinstance(t, Tensor) else None for t in dropout[1:])


def ragged_offsets(io: dict) -> dict:
    """The ragged offset tensors of cuDNN's packed form, by role ("q_ragged_offset", ...)."""
    return {
        f"{role}_ragged_offset": t.ragged_offset
        for role, t in io.items()
        if t is not None and t.ragged_offset is not None
    }
