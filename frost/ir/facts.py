"""The facts record: what a validated SDPA graph is, described once, judging nothing.

Capability rows and adapters read facts; they never walk the graph themselves.
"""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict

#: roles of the query/key/value/output tensors and their gradients: kernels move them in 16-byte vectors
IO_TENSOR_ROLES = ("q", "k", "v", "o", "dO", "dQ", "dK", "dV")


class TensorFacts(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str  # the role: q, k, v, o, stats, dO, dQ, ...; bias, dBias, dropout_seed, dropout_offset, ...
    label: str = ""  # how errors name it: the user's name and the role
    dim: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str


class RaggedFacts(BaseModel):
    """cuDNN's ragged-offset form, lowered: how its element offsets map to the packed token facts.

    Each ragged tensor's offset tensor holds element offsets per batch, (B+1, 1, 1, 1) int32/int64; its token
    offsets are those divided by the tensor's token stride (its declared S stride). Sequence lengths come from
    seq_len_q / seq_len_kv (the padding mask's tensors).
    """

    model_config = ConfigDict(frozen=True)

    token_strides: tuple[tuple[str, int], ...]  # (role, element-offset divisor)
    offset_dtypes: tuple[tuple[str, str], ...]  # (role, "int32" | "int64")
    shared_offsets: tuple[tuple[str, ...], ...] = ()  # the roles of each offset tensor (which roles share one)
    stats_per_batch: bool = False  # Stats declared (B, H, S, 1) without a ragged offset
    # the ragged form as declared, for engines that take it as it is (cuDNN): the (B, H, S, D) tensors that have
    # a ragged offset, their offsets (role "<role>_ragged_offset") and the lengths (seq_len_q, seq_len_kv)
    declared: tuple["TensorFacts", ...] = ()


class PagedFacts(BaseModel):
    """cuDNN's paged K/V cache, as declared: K and V are containers (num_blocks, H, block_size, D) read through
    int32 block tables (B, 1, max_blocks_per_seq, 1); key j of sequence b lives in block table[b, j // block_size]
    at row j % block_size. Lengths come from seq_len_kv (the padding mask); seq_kv is the envelope
    paged_attention_max_seq_len_kv."""

    model_config = ConfigDict(frozen=True)

    block_size_k: int
    block_size_v: int
    num_blocks_k: int
    num_blocks_v: int
    table_blocks_k: int  # max_blocks_per_seq of K's table
    table_blocks_v: int

    @property
    def block_sizes(self) -> tuple[int, ...]:
        """The distinct block sizes of the K and V containers."""
        return tuple(sorted({self.block_size_k, self.block_size_v}))


class SdpaFacts(BaseModel):
    """Geometry, dtypes, layouts, the resolved mask band and feature flags of one SDPA node."""

    model_config = ConfigDict(frozen=True)

    direction: str  # "fwd" | "bwd"
    io_dtype: str
    batch: int
    num_heads_q: int
    num_heads_kv: int  # K's heads (and V's unless num_heads_v says otherwise)
    num_heads_v: int = 0  # V's heads; 0 or num_heads_kv: as K's (cuDNN lets each divide the query heads)
    head_dim_qk: int
    head_dim_v: int
    seq_q: int  # dense: declared; THD: max_seq_len_q envelope
    seq_kv: int
    is_thd: bool
    total_q: int = 0  # THD: declared packed-token envelopes
    total_kv: int = 0
    attn_scale: float
    # resolved mask band, in the contract of frost.engines.sdpa_args
    window_left: Optional[int] = None
    window_right: Optional[int] = None
    bottom_right: bool = False
    has_padding: bool = False
    has_sinks: bool = False
    has_stats: bool = False
    has_score_max: bool = False  # the row max of the scaled, masked scores (cuDNN's score_max output)
    has_score_sum_exp: bool = False  # the row sum of exp(score - max) (cuDNN's score_sum_exp output)
    deterministic: bool = False
    has_dsink: bool = False
    has_dbias: bool = False
    dropout_probability: float = 0.0  # with has_dropout: the probability of dropping a weight
    # declared features that engines may not serve
    has_dropout: bool = False
    has_bias: bool = False
    has_attn_mask: bool = False
    has_alibi: bool = False
    has_score_mod: bool = False
    # cuDNN's block_mask: uint8 (B, H_q, ceil(S_q/128), ceil(ceil(S_kv/128)/8)), bit j of byte [b, h, i, k] lets
    # query tile i (128 rows) see key tile 8k + j (128 keys); a cleared bit masks that tile pair
    has_block_mask: bool = False
    other_features: tuple[str, ...] = ()  # further declared cuDNN features (rng_dump, paged_attention, ...)
    ragged: Optional[RaggedFacts] = None  # declared in cuDNN's ragged-offset form (else frost's packed form)
    paged: Optional[PagedFacts] = None  # K and V in cuDNN's paged cache (feature "paged_attention")
    tensors: tuple[TensorFacts, ...] = ()

    @property
    def is_causal(self) -> bool:
        return self.window_right == 0

    @property
    def gqa_group(self) -> int:
        return self.num_heads_q // self.num_heads_kv

    @property
    def heads_v(self) -> int:
        """V's head count (K's unless declared otherwise)."""
        return self.num_heads_v or self.num_heads_kv

    @property
    def split_kv_heads(self) -> bool:
        """K and V declared with different head counts."""
        return self.heads_v != self.num_heads_kv

    def tensor(self, name: str) -> Optional[TensorFacts]:
        for t in self.tensors:
            if t.name == name:
                return t
        return None

    def features(self) -> frozenset[str]:
        """Named features this graph uses (matched against capability rows)."""
        f = set()
        if self.window_right == 0:
            f.add("causal")
        elif self.window_right is not None:
            f.add("window_right")
        if self.window_left is not None:
            f.add("window_left")
        if self.bottom_right and (self.window_left is not None or self.window_right is not None):
            f.add("bottom_right")
        if self.num_heads_q != self.num_heads_kv or self.num_heads_q != self.heads_v:
            f.add("gqa")
        if self.split_kv_heads:
            f.add("split_kv_heads")
            if max(self.num_heads_kv, self.heads_v) % min(self.num_heads_kv, self.heads_v):
                f.add("unnested_kv_heads")  # neither count divides the other
        for flag, name in (
            (self.has_padding, "padding"),
            (self.has_sinks, "sinks"),
            (self.is_thd, "thd"),
            (self.has_stats, "stats"),
            (self.deterministic, "deterministic"),
            (self.has_dropout, "dropout"),
            (self.has_bias, "bias"),
            (self.has_dbias, "dbias"),
            (self.has_attn_mask, "attn_mask"),
            (self.has_alibi, "alibi"),
            (self.has_score_mod, "score_mod"),
            (self.has_score_max, "score_max"),
            (self.has_score_sum_exp, "score_sum_exp"),
            (self.has_block_mask, "block_mask"),
        ):
            if flag:
                f.add(name)
        f.update(self.other_features)
        if self.ragged is not None:
            f.add("ragged_offsets")
            if self.ragged.stats_per_batch:
                f.add("stats_per_batch")
        return frozenset(f)
