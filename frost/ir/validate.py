"""Validation of SDPA nodes, producing the facts record. Every error names the tensor."""

from __future__ import annotations

import math
import operator
from typing import NamedTuple

from frost.errors import GraphError, GraphNotSupportedError
from frost.ir.facts import PagedFacts, RaggedFacts, SdpaFacts, TensorFacts
from frost.ir.nodes import OUTPUT_ATTRS, SdpaAttrs, SdpaBwdNode, SdpaFwdNode, dropout_tensors
from frost.ir.tensor import Tensor, _overlaps
from frost.types import DataType

IO_TYPES = (DataType.HALF, DataType.BFLOAT16, DataType.FLOAT)


def _label(t: Tensor, role: str) -> str:
    """How errors name a tensor: the user's name, and the role when it differs."""
    return f"{t.name!r} ({role})" if t.name != role else f"{t.name!r}"


def _who(t: Tensor, role: str) -> str:
    return f"tensor {_label(t, role)}"


def _expect_dim(t: Tensor, role: str, expected: tuple, what: str) -> None:
    if tuple(t.dim) != tuple(expected):
        raise GraphError(f"{_who(t, role)}: expected dim {tuple(expected)} ({what}), got {tuple(t.dim)}")


def _expect_dtype(t: Tensor, role: str, allowed) -> None:
    if t.data_type not in allowed:
        names = ", ".join(a.short for a in allowed)
        raise GraphError(f"{_who(t, role)}: data_type must be {names}, got {t.data_type.short}")


def _unit_last(t: Tensor, role: str) -> None:
    if t.dim[-1] > 1 and t.stride[-1] != 1:
        raise GraphError(
            f"{_who(t, role)}: the head dimension must have unit stride; strides {t.stride} for dim {t.dim}"
        )


def expect_rank(t: Tensor, role: str, thd: bool) -> None:
    """Dense tensors are (B, H, S, D); packed THD tensors are (tokens, heads, dim)."""
    if thd and len(t.dim) != 3:
        raise GraphError(f"{_who(t, role)}: packed THD tensors are (tokens, heads, dim); got dim {t.dim}")
    if not thd and len(t.dim) != 4:
        raise GraphError(
            f"{_who(t, role)}: expected dim (B, H, S, D), got {t.dim}; packed THD "
            f"tensors need cu_seq_len_q/cu_seq_len_kv"
        )


def _check_attr_types(a: SdpaAttrs) -> None:
    """Numeric keywords must be numbers: a string or a float where an int belongs is a mistake, not a value."""
    for key in (
        "diagonal_band_left_bound",
        "diagonal_band_right_bound",
        "sliding_window_length",
        "max_seq_len_q",
        "max_seq_len_kv",
        "max_total_seq_len_q",
        "max_total_seq_len_kv",
        "paged_attention_max_seq_len_kv",
    ):
        value = getattr(a, key)
        if value is None:
            continue
        try:
            ok = not isinstance(value, bool) and operator.index(value) == value
        except TypeError:
            ok = False
        if not ok:
            raise GraphError(f"sdpa {a.name!r}: {key} must be an int, got {value!r}")
    if a.attn_scale is not None:
        try:
            scale = None if isinstance(a.attn_scale, (str, bytes, bool)) else float(a.attn_scale)
        except (TypeError, ValueError):
            scale = None
        if scale is None:
            raise GraphError(f"sdpa {a.name!r}: attn_scale must be a number, got {a.attn_scale!r}")


def _lengths_tensor(t: Tensor, role: str, batch: int) -> None:
    t.require_declared()
    _expect_dtype(t, role, (DataType.INT32,))
    if tuple(t.dim) not in ((batch,), (batch, 1, 1, 1)):
        raise GraphError(
            f"{_who(t, role)}: expected dim ({batch},) or ({batch}, 1, 1, 1) (one length per batch), got {tuple(t.dim)}"
        )


def resolve_band(a: SdpaAttrs) -> tuple:
    """(window_left, window_right, bottom_right) from the cuDNN-style keywords.

    diagonal_band_left_bound L keeps keys j > i + off - L (so window_left = L - 1);
    diagonal_band_right_bound R keeps keys j <= i + off + R; sliding_window_length W
    is the left bound W. Causal masks set the right bound to 0.
    """
    if a.diagonal_alignment not in ("TOP_LEFT", "BOTTOM_RIGHT"):
        raise GraphError(
            f"sdpa {a.name!r}: diagonal_alignment must be 'TOP_LEFT' or 'BOTTOM_RIGHT', got {a.diagonal_alignment!r}"
        )
    if a.use_causal_mask and a.use_causal_mask_bottom_right:
        raise GraphError(f"sdpa {a.name!r}: use_causal_mask and use_causal_mask_bottom_right are exclusive")
    bottom_right = a.diagonal_alignment == "BOTTOM_RIGHT" or a.use_causal_mask_bottom_right
    if a.use_causal_mask and a.diagonal_alignment == "BOTTOM_RIGHT":
        raise GraphError(
            f"sdpa {a.name!r}: use_causal_mask is top-left; use use_causal_mask_bottom_right "
            f"for a bottom-right diagonal"
        )
    right = None
    if a.use_causal_mask or a.use_causal_mask_bottom_right:
        right = 0
    if a.diagonal_band_right_bound is not None:
        if a.diagonal_band_right_bound < 0:
            raise GraphError(
                f"sdpa {a.name!r}: diagonal_band_right_bound must be >= 0, got {a.diagonal_band_right_bound}"
            )
        if right is not None and a.diagonal_band_right_bound != 0:
            raise GraphError(
                f"sdpa {a.name!r}: a causal mask and diagonal_band_right_bound="
                f"{a.diagonal_band_right_bound} contradict each other"
            )
        right = a.diagonal_band_right_bound
    left = None
    bounds = [b for b in (a.diagonal_band_left_bound, a.sliding_window_length) if b is not None]
    if len(bounds) == 2 and bounds[0] != bounds[1]:
        raise GraphError(
            f"sdpa {a.name!r}: diagonal_band_left_bound={bounds[0]} and sliding_window_length={bounds[1]} disagree"
        )
    if bounds:
        if bounds[0] < 1:
            raise GraphError(
                f"sdpa {a.name!r}: the left band bound / sliding_window_length must be >= 1, got {bounds[0]}"
            )
        left = bounds[0] - 1
    return left, right, bottom_right


def _tensor_facts(role: str, t: Tensor) -> TensorFacts:
    return TensorFacts(
        name=role, label=_label(t, role), dim=tuple(t.dim), stride=tuple(t.stride), dtype=t.data_type.short
    )


def _validate_common(node, io_types, q: Tensor, k: Tensor, v: Tensor):
    """(geometry, mask) facts shared by the forward and the backward: q, k and v, their form (dense, packed,
    ragged, paged), the heads and head dims, then the optional tensors and the band."""
    a: SdpaAttrs = node.attrs
    _check_attr_types(a)
    for role, t in (("q", q), ("k", k), ("v", v)):
        t.require_declared()
        _expect_dtype(t, role, io_types)
        _unit_last(t, role)
    if k.data_type != q.data_type or v.data_type != q.data_type:
        raise GraphError(
            f"sdpa {a.name!r}: q, k and v must share one data type; got q={q.data_type.short}, "
            f"k={k.data_type.short}, v={v.data_type.short}"
        )
    thd = a.cu_seq_len_q is not None or a.cu_seq_len_kv is not None
    ragged = any(t is not None and t.ragged_offset is not None for t in node.io().values())
    if ragged and thd:
        raise GraphError(
            f"sdpa {a.name!r}: declare frost's packed form (cu_seq_len_q/kv) or cuDNN's ragged offsets "
            f"(set_ragged_offset), not both"
        )
    if not ragged and (a.max_total_seq_len_q is not None or a.max_total_seq_len_kv is not None):
        raise GraphError(
            f"sdpa {a.name!r}: max_total_seq_len_q/kv are envelopes of cuDNN's packed (ragged offset) "
            f"form; this graph declares no ragged offsets"
        )
    paged = _check_paged(a, ragged, thd)
    if thd:
        g = _packed_dims(a, q, k, v)
    else:
        g, paged = _dense_dims(a, q, k, v, paged)
    _check_heads(a, g, thd, q, k, v)
    probability = _check_optional_tensors(a, g, q)
    left, right, bottom_right = resolve_band(a)
    if a.use_alibi_mask and right != 0:
        raise GraphNotSupportedError(
            f"sdpa {a.name!r}: use_alibi_mask needs a causal mask "
            f"(diagonal_band_right_bound=0 or use_causal_mask), as in cuDNN; this graph's "
            f"right bound is {right}"
        )
    geom = dict(
        batch=g.batch,
        num_heads_q=g.hq,
        num_heads_kv=g.hkv,
        num_heads_v=g.hv,
        head_dim_qk=g.dqk,
        head_dim_v=g.dv,
        seq_q=g.sq,
        seq_kv=g.skv,
        is_thd=thd,
        total_q=g.tq,
        total_kv=g.tkv,
    )
    mask = dict(
        window_left=left,
        window_right=right,
        bottom_right=bottom_right,
        has_padding=a.use_padding_mask,
        has_sinks=a.sink_token is not None,
        attn_scale=1.0 if a.attn_scale is None else float(a.attn_scale),
        has_dropout=a.dropout is not None,
        dropout_probability=probability,
        has_bias=a.bias is not None,
        has_block_mask=a.block_mask is not None,
        has_attn_mask=a.attn_mask is not None,
        has_alibi=bool(a.use_alibi_mask),
        has_score_mod=a.score_mod is not None or a.score_mod_bprop is not None,
        other_features=_other_features(a),
        paged=paged,
    )
    return geom, mask


class _Dims(NamedTuple):
    """The declared extents of q, k and v: batch, heads (q, k, v), head dims (q, k, v), sequence lengths (q, kv;
    the envelopes when packed) and packed totals (q, k, v; 0 when dense)."""

    batch: int
    hq: int
    hkv: int
    hv: int
    dqk: int
    dk: int
    dv: int
    sq: int
    skv: int
    tq: int
    tkv: int
    tv: int


def _packed_dims(a: SdpaAttrs, q: Tensor, k: Tensor, v: Tensor) -> _Dims:
    """frost's packed form (cu_seq_len_q/kv with (tokens, heads, dim) tensors): its offsets and envelopes."""
    if a.cu_seq_len_q is None or a.cu_seq_len_kv is None:
        raise GraphError(f"sdpa {a.name!r}: packed THD needs both cu_seq_len_q and cu_seq_len_kv")
    for role, t in (("q", q), ("k", k), ("v", v)):
        expect_rank(t, role, thd=True)
    cu_q, cu_kv = a.cu_seq_len_q, a.cu_seq_len_kv
    for role, t in (("cu_seq_len_q", cu_q), ("cu_seq_len_kv", cu_kv)):
        t.require_declared()
        _expect_dtype(t, role, (DataType.INT32,))
        if len(t.dim) != 1 or t.dim[0] < 2:
            raise GraphError(f"{_who(t, role)}: expected dim (B+1,) with B >= 1, got {tuple(t.dim)}")
    if cu_q.dim != cu_kv.dim:
        raise GraphError(f"sdpa {a.name!r}: cu_seq_len_q dim {cu_q.dim} and cu_seq_len_kv dim {cu_kv.dim} differ")
    if a.max_seq_len_q is None or a.max_seq_len_kv is None:
        raise GraphError(
            f"sdpa {a.name!r}: packed THD needs the plan-time envelopes max_seq_len_q and "
            f"max_seq_len_kv (the longest sequence that will ever be executed)"
        )
    if a.max_seq_len_q < 1 or a.max_seq_len_kv < 1:
        raise GraphError(f"sdpa {a.name!r}: max_seq_len_q / max_seq_len_kv must be >= 1")
    if a.use_padding_mask or a.seq_len_q is not None or a.seq_len_kv is not None:
        raise GraphError(
            f"sdpa {a.name!r}: packed THD carries its lengths in cu_seq_len_q/kv; "
            f"padding masks (seq_len_q/kv) do not apply"
        )
    batch = cu_q.dim[0] - 1
    tq, hq, dqk = q.dim
    tkv, hkv, dk = k.dim
    tv, hv, dv = v.dim
    sq, skv = a.max_seq_len_q, a.max_seq_len_kv
    if sq > tq or skv > tkv:
        raise GraphError(
            f"sdpa {a.name!r}: max_seq_len_q={sq} / max_seq_len_kv={skv} exceed the declared "
            f"packed totals q={tq} / k={tkv}"
        )
    return _Dims(batch, hq, hkv, hv, dqk, dk, dv, sq, skv, tq, tkv, tv)


def _dense_dims(a: SdpaAttrs, q: Tensor, k: Tensor, v: Tensor, paged):
    """(dims, paged facts) of (B, H, S, D) tensors; with a paged cache, K and V are its block containers."""
    if a.max_seq_len_q is not None or a.max_seq_len_kv is not None:
        raise GraphError(
            f"sdpa {a.name!r}: max_seq_len_q/max_seq_len_kv are envelopes for packed THD "
            f"graphs; a dense graph takes its lengths from the declared dims"
        )
    for role, t in (("q", q), ("k", k), ("v", v)):
        expect_rank(t, role, thd=False)
    batch, hq, sq, dqk = q.dim
    bk, hkv, skv, dk = k.dim
    bv, hv, sv, dv = v.dim
    if paged is not None:  # K and V are block containers: their first dim counts blocks, not sequences
        paged, skv = _check_paged_tables(a, k, v, batch)
    else:
        if bk != batch or bv != batch:
            raise GraphError(f"sdpa {a.name!r}: batch sizes differ: q {batch}, k {bk}, v {bv}")
        if sv != skv:
            raise GraphError(f"{_who(v, 'v')}: sequence length {sv} differs from k's {skv}")
    return _Dims(batch, hq, hkv, hv, dqk, dk, dv, sq, skv, 0, 0, 0), paged


def _check_heads(a: SdpaAttrs, g: _Dims, thd: bool, q: Tensor, k: Tensor, v: Tensor) -> None:
    """Head dims and head counts: K's head dim is Q's; K and V each divide the query heads (GQA / MQA)."""
    if g.dk != g.dqk:
        raise GraphError(f"{_who(k, 'k')}: head dim {g.dk} differs from q's head dim {g.dqk}")
    if thd and g.tv != g.tkv:
        raise GraphError(f"{_who(v, 'v')}: packed total {g.tv} differs from k's {g.tkv}")
    if g.hq < 1:
        raise GraphError(f"{_who(q, 'q')}: needs at least one head, got {g.hq}")
    for role, t, h in (("k", k, g.hkv), ("v", v, g.hv)):  # K and V each divide the query heads (GQA / MQA)
        if h < 1 or g.hq % h != 0:
            raise GraphError(
                f"{_who(t, role)}: {h} heads do not divide q's {g.hq}; GQA needs H_q to be a multiple "
                f"of H_{role} (K and V may differ)"
            )
    if g.dqk < 1 or g.dv < 1:
        raise GraphError(f"sdpa {a.name!r}: head dims must be >= 1")


def _check_optional_tensors(a: SdpaAttrs, g: _Dims, q: Tensor):
    """The padding lengths, sinks, scale, bias, block mask, dropout and RNG dump against the dims; returns the
    dropout probability."""
    batch, hq, sq, skv = g.batch, g.hq, g.sq, g.skv
    if a.use_padding_mask != (a.seq_len_q is not None or a.seq_len_kv is not None):
        raise GraphError(
            f"sdpa {a.name!r}: use_padding_mask=True needs seq_len_q and seq_len_kv, and they are "
            f"only meaningful with use_padding_mask=True"
        )
    if a.use_padding_mask:
        if a.seq_len_q is None or a.seq_len_kv is None:
            raise GraphError(f"sdpa {a.name!r}: use_padding_mask needs both seq_len_q and seq_len_kv")
        _lengths_tensor(a.seq_len_q, "seq_len_q", batch)
        _lengths_tensor(a.seq_len_kv, "seq_len_kv", batch)
    if a.sink_token is not None:
        s = a.sink_token
        s.require_declared()
        _expect_dtype(s, "sink_token", (DataType.FLOAT,))
        if tuple(s.dim) not in ((hq,), (1, hq, 1, 1)):
            raise GraphError(
                f"{_who(s, 'sink_token')}: expected dim (1, {hq}, 1, 1) or ({hq},) (one value per "
                f"query head), got {tuple(s.dim)}"
            )
    if a.attn_scale is not None and not math.isfinite(float(a.attn_scale)):
        raise GraphError(f"sdpa {a.name!r}: attn_scale must be finite, got {a.attn_scale}")
    if a.bias is not None:
        _check_bias(a.bias, "bias", batch, hq, sq, skv, q)
    if a.block_mask is not None:
        _check_block_mask(a.block_mask, batch, hq, sq, skv)
    probability = _check_dropout(a)
    _check_rng_dump(a, batch, hq, sq, skv)
    return probability


def _check_paged(a: SdpaAttrs, ragged: bool, thd: bool):
    """What cuDNN's validate() reports about paged K/V caches (engines then decide whether to serve them).
    True when the graph declares a paged cache (its tables are checked with the geometry), else None."""
    tables = (a.paged_attention_k_table, a.paged_attention_v_table)
    if all(t is None for t in tables):
        if a.paged_attention_max_seq_len_kv is not None:
            raise GraphError(
                f"sdpa {a.name!r}: paged_attention_max_seq_len_kv is only meaningful with "
                f"paged_attention_k_table / paged_attention_v_table"
            )
        return None
    if any(t is None for t in tables):
        raise GraphError(f"sdpa {a.name!r}: paged caches need both paged_attention_k_table and paged_attention_v_table")
    if not a.use_padding_mask:
        raise GraphError(f"sdpa {a.name!r}: paged caches need use_padding_mask=True with seq_len_q and seq_len_kv")
    if ragged:
        raise GraphError(f"sdpa {a.name!r}: paged caches cannot be combined with ragged offsets")
    if thd:
        raise GraphError(
            f"sdpa {a.name!r}: paged caches take (B, H, S, D) queries with seq_len_q / seq_len_kv, "
            f"not frost's packed form (cu_seq_len_q/kv)"
        )
    return True


def _check_paged_tables(a: SdpaAttrs, k: Tensor, v: Tensor, batch: int):
    """(PagedFacts, S_kv envelope) of a paged cache: containers (num_blocks, H, block_size, D), int32 tables
    (B, 1, max_blocks_per_seq, 1) with any strides, and the envelope paged_attention_max_seq_len_kv (cuDNN infers
    it from the tables when unset: max_blocks_per_seq x block_size, the smaller of K's and V's), which each table
    must cover in exactly ceil(S_kv / block_size) blocks, as cuDNN's paged cache load requires."""
    blocks = {}
    for role, table, container in (
        ("paged_attention_k_table", a.paged_attention_k_table, k),
        ("paged_attention_v_table", a.paged_attention_v_table, v),
    ):
        table.require_declared()
        _expect_dtype(table, role, (DataType.INT32,))
        d = tuple(table.dim)
        if len(d) != 4 or d[0] != batch or d[1] != 1 or d[3] != 1 or d[2] < 1:
            raise GraphError(
                f"{_who(table, role)}: expected dim ({batch}, 1, max_blocks_per_seq, 1) (one row of "
                f"block indices per sequence, B={batch} from q), got {d}"
            )
        if container.dim[0] < 1 or container.dim[2] < 1:
            raise GraphError(
                f"{_who(container, role[16])}: a paged container is (num_blocks, H, block_size, D) "
                f"with at least one block of at least one row, got dim {tuple(container.dim)}"
            )
        blocks[role[16]] = (d[2], container.dim[2])
    (tk, bsk), (tv, bsv) = blocks["k"], blocks["v"]
    skv = a.paged_attention_max_seq_len_kv
    if skv is None:
        skv = min(tk * bsk, tv * bsv)
    elif skv < 1:
        raise GraphError(f"sdpa {a.name!r}: paged_attention_max_seq_len_kv must be >= 1, got {skv}")
    for role, table, (n, bs) in (
        ("paged_attention_k_table", a.paged_attention_k_table, blocks["k"]),
        ("paged_attention_v_table", a.paged_attention_v_table, blocks["v"]),
    ):
        need = -(-skv // bs)
        if n != need:
            raise GraphError(
                f"{_who(table, role)}: {n} blocks per sequence, but paged_attention_max_seq_len_kv="
                f"{skv} in blocks of {bs} rows needs ceil({skv}/{bs}) = {need} (cuDNN's rule)"
            )
    facts = PagedFacts(
        block_size_k=bsk,
        block_size_v=bsv,
        num_blocks_k=k.dim[0],
        num_blocks_v=v.dim[0],
        table_blocks_k=tk,
        table_blocks_v=tv,
    )
    return facts, skv


def _other_features(a: SdpaAttrs) -> tuple:
    """Declared cuDNN features beyond the named flags, as feature names (engines decline what they lack)."""
    f = [
        name
        for name, on in (
            ("rng_dump", a.rng_dump is not None),
            ("paged_attention", a.paged_attention_k_table is not None),
            ("unfuse_fma", a.unfuse_fma),
        )
        if on
    ]
    if a.compute_data_type not in (None, DataType.NOT_SET.short, DataType.FLOAT.short):
        f.append(f"compute_{a.compute_data_type}")
    return tuple(f)


#: per-query-row fp32 outputs of the forward: Stats (the log-sum-exp) and its two halves, the row max of the
#: scaled, masked scores and the sum of exp(score - max) (cuDNN's score_max / score_sum_exp)
ROW_STATS = ("stats",) + OUTPUT_ATTRS
Q_GROUP = ("q", "o", "dO", "dQ") + ROW_STATS


def _lower_ragged(node, geom: dict):
    """cuDNN's ragged-offset form -> (geometry of frost's packed facts, RaggedFacts, lowered TensorFacts by role).

    Declared (B, H, S, D) tensors whose batches start at element offsets become packed (T, H, D) tensors with the
    declared S and H strides; T is max_total_seq_len_q/kv, or B * S when not given.
    """
    a: SdpaAttrs = node.attrs
    io = {r: t for r, t in node.io().items() if t is not None}
    if not any(t.ragged_offset is not None for t in io.values()):
        return None
    if not a.use_padding_mask:
        raise GraphError(
            f"sdpa {a.name!r}: ragged offsets need use_padding_mask=True with seq_len_q and "
            f"seq_len_kv (the sequence lengths), as in cuDNN"
        )
    missing = [r for r in io if r not in ROW_STATS and io[r].ragged_offset is None]
    if missing:
        raise GraphError(
            f"sdpa {a.name!r}: {', '.join(_who(io[r], r) for r in missing)} declared no ragged offset; "
            f"in the ragged form every one of {', '.join(r for r in io if r not in ROW_STATS)} needs "
            f"set_ragged_offset"
        )
    batch = geom["batch"]
    envelopes = {}
    for key, seq in (("max_total_seq_len_q", geom["seq_q"]), ("max_total_seq_len_kv", geom["seq_kv"])):
        value = getattr(a, key)
        if value is not None and value < 1:
            raise GraphError(f"sdpa {a.name!r}: {key}={value} must be at least 1 (the token envelope)")
        envelopes[key] = batch * seq if value is None else value
    tq, tkv = envelopes["max_total_seq_len_q"], envelopes["max_total_seq_len_kv"]
    strides, dtypes, lowered, sharing = [], [], {}, {}
    declared = [_tensor_facts(r, getattr(a, r)) for r in ("seq_len_q", "seq_len_kv")]
    for role, t in io.items():
        off = t.ragged_offset
        if off is None:
            continue
        off.require_declared()
        _expect_dtype(off, f"{role} ragged offset", (DataType.INT32, DataType.INT64))
        if tuple(off.dim) not in ((batch + 1, 1, 1, 1), (batch + 1,)):
            raise GraphError(
                f"{_who(off, f'{role} ragged offset')}: expected dim ({batch + 1}, 1, 1, 1) (B+1 element "
                f"offsets), got {tuple(off.dim)}"
            )
        total = tq if role in Q_GROUP else tkv
        dim = (total, t.dim[1], t.dim[3])
        stride = (t.stride[2], t.stride[1], t.stride[3])
        if _overlaps(dim, stride):
            raise GraphError(
                f"{_who(t, role)}: strides {t.stride} overlap tokens of the packed form (tokens of one "
                f"sequence are S-stride {t.stride[2]} apart)"
            )
        strides.append((role, t.stride[2]))
        dtypes.append((role, off.data_type.short))
        sharing.setdefault(id(off), []).append(role)
        lowered[role] = TensorFacts(name=role, label=_label(t, role), dim=dim, stride=stride, dtype=t.data_type.short)
        declared += [_tensor_facts(role, t), _tensor_facts(f"{role}_ragged_offset", off)]
    packed = dict(is_thd=True, total_q=tq, total_kv=tkv, seq_q=min(geom["seq_q"], tq), seq_kv=min(geom["seq_kv"], tkv))
    info = RaggedFacts(
        token_strides=tuple(strides),
        offset_dtypes=tuple(dtypes),
        shared_offsets=tuple(tuple(roles) for roles in sharing.values()),
        stats_per_batch=any(r in io and io[r].ragged_offset is None for r in ROW_STATS),
        declared=tuple(declared),
    )
    return packed, info, lowered


def _facts(node, direction: str, geom: dict, mask: dict, roles: dict, **extra) -> SdpaFacts:
    lowering = _lower_ragged(node, geom)
    tensors = {r: _tensor_facts(r, t) for r, t in roles.items()}
    if lowering is not None:
        packed, info, lowered = lowering
        for role in ("seq_len_q", "seq_len_kv"):  # the ragged form's lengths, not a padding mask
            tensors.pop(role, None)
        geom = {**geom, **packed}
        mask = {**mask, "has_padding": False, "ragged": info}  # lengths come with the ragged form
        tensors.update({r: tf for r, tf in lowered.items() if r in tensors})
    return SdpaFacts(
        direction=direction, io_dtype=node.q.data_type.short, tensors=tuple(tensors.values()), **geom, **mask, **extra
    )


def _check_bias(t: Tensor, role: str, batch: int, hq: int, sq: int, skv: int, q: Tensor) -> None:
    """An additive bias is (B or 1, H_q or 1, S_q, S_kv) in q's data type, any declared strides (engines that
    cannot address a layout decline it). Packed THD graphs index it with sequence-local positions, S_q and S_kv
    being max_seq_len_q / max_seq_len_kv."""
    t.require_declared()
    want = f"(1 or {batch}, 1 or {hq}, {sq}, {skv})"
    d = tuple(t.dim)
    if len(d) != 4 or d[0] not in (1, batch) or d[1] not in (1, hq) or d[2:] != (sq, skv):
        raise GraphError(
            f"{_who(t, role)}: expected dim {want} (broadcast over batch and heads only, one value "
            f"per query row and key), got {d}"
        )
    if t.data_type != q.data_type:
        raise GraphError(f"{_who(t, role)}: data_type must be q's {q.data_type.short}, got {t.data_type.short}")


#: the query rows and keys of one block_mask tile; each byte holds the bits of this many key tiles (the graph layer
#: imports nothing below it: frost.engines.sdpa_args states the same for the kernels)
BLOCK_MASK_TILE = 128
BLOCK_MASK_BITS = 8


def block_mask_dims(batch: int, hq: int, sq: int, skv: int) -> tuple:
    """cuDNN's block_mask dims: (B, H_q, ceil(S_q / 128), ceil(ceil(S_kv / 128) / 8))."""
    key_tiles = -(-skv // BLOCK_MASK_TILE)
    return batch, hq, -(-sq // BLOCK_MASK_TILE), -(-key_tiles // BLOCK_MASK_BITS)


def _check_block_mask(t: Tensor, batch: int, hq: int, sq: int, skv: int) -> None:
    """cuDNN's block_mask: uint8, one bit per (128-row query tile, 128-key tile), 8 key tiles a byte (LSB first),
    dims (B, H_q, ceil(S_q/128), ceil(ceil(S_kv/128)/8)), any declared strides. Packed THD graphs index it with
    sequence-local tiles, S_q and S_kv being max_seq_len_q / max_seq_len_kv."""
    t.require_declared()
    want = block_mask_dims(batch, hq, sq, skv)
    if tuple(t.dim) != want:
        raise GraphError(
            f"{_who(t, 'block_mask')}: expected dim {want} (B, H_q, ceil(S_q/128), "
            f"ceil(ceil(S_kv/128)/8) with S_q={sq}, S_kv={skv}: one bit per 128x128 tile), "
            f"got {tuple(t.dim)}"
        )
    _expect_dtype(t, "block_mask", (DataType.UINT8,))


def _check_dropout(a: SdpaAttrs) -> float:
    """dropout=(probability, seed, offset): a float in [0, 1) and two one-element int32/int64 tensors."""
    if a.dropout is None:
        return 0.0
    if not isinstance(a.dropout, (tuple, list)) or len(a.dropout) != 3:
        raise GraphError(
            f"sdpa {a.name!r}: dropout must be (probability, seed tensor, offset tensor), got {a.dropout!r}"
        )
    p, seed, offset = a.dropout
    try:
        prob = None if isinstance(p, (str, bytes, bool)) else float(p)
    except (TypeError, ValueError):
        prob = None
    if prob is None or not (0.0 <= prob < 1.0):
        raise GraphError(f"sdpa {a.name!r}: the dropout probability must be a number in [0, 1), got {p!r}")
    for role, t in (("dropout_seed", seed), ("dropout_offset", offset)):
        if not isinstance(t, Tensor):
            raise GraphError(
                f"sdpa {a.name!r}: the dropout {role.split('_')[1]} must be a frost tensor from "
                f"graph.tensor() (one int64 value on the device), got {type(t).__name__}"
            )
        t.require_declared()
        _expect_dtype(t, role, (DataType.INT64, DataType.INT32))
        if tuple(t.dim) not in ((1,), (1, 1, 1, 1)):
            raise GraphError(f"{_who(t, role)}: expected dim (1, 1, 1, 1) or (1,) (one value), got {tuple(t.dim)}")
    return prob


def _check_rng_dump(a: SdpaAttrs, batch: int, hq: int, sq: int, skv: int) -> None:
    """rng_dump: cuDNN's debug output of the dropout mask, fp32 (B, H_q, S_q, S_kv) (S the envelopes in packed
    graphs). cuDNN's binding sets it only beside a (probability, seed, offset) dropout and drops it silently
    otherwise; frost raises there, since the tensor would never be written."""
    t = a.rng_dump
    if t is None:
        return
    if a.dropout is None:
        raise GraphError(
            f"sdpa {a.name!r}: rng_dump dumps the dropout mask and needs dropout=(probability, seed, "
            f"offset); cuDNN ignores it without one, frost refuses to leave it unwritten"
        )
    t.require_declared()
    _expect_dtype(t, "rng_dump", (DataType.FLOAT,))
    want = (batch, hq, sq, skv)
    if tuple(t.dim) != want:
        raise GraphError(
            f"{_who(t, 'rng_dump')}: expected dim {want} (B, H_q, S_q, S_kv: one mask value per "
            f"score), got {tuple(t.dim)}"
        )


def _extra_tensors(node) -> dict:
    """The feature tensors an engine binds besides Q/K/V/O (facts carry their declarations too)."""
    a = node.attrs
    seed, offset = dropout_tensors(a.dropout)
    named = {
        "seq_len_q": a.seq_len_q,
        "seq_len_kv": a.seq_len_kv,
        "sink_token": a.sink_token,
        "bias": a.bias,
        "block_mask": a.block_mask,
        "dropout_seed": seed,
        "dropout_offset": offset,
        "rng_dump": a.rng_dump,
        "paged_attention_k_table": a.paged_attention_k_table,
        "paged_attention_v_table": a.paged_attention_v_table,
    }
    if node.kind == "sdpa_bwd":
        named.update(dSink_token=node.dSink_token, dBias=node.dBias)
    return {r: t for r, t in named.items() if t is not None}


def expected_out_dims(geom: dict, head_dim: int) -> tuple:
    if geom["is_thd"]:
        return (geom["total_q"], geom["num_heads_q"], head_dim)
    return (geom["batch"], geom["num_heads_q"], geom["seq_q"], head_dim)


def expected_stats_dims(geom: dict) -> tuple:
    if geom["is_thd"]:
        return (geom["total_q"], geom["num_heads_q"], 1)
    return (geom["batch"], geom["num_heads_q"], geom["seq_q"], 1)


def _check_like(t: Tensor, role: str, dims: tuple, allowed, what: str) -> None:
    t.require_declared()
    _expect_dim(t, role, dims, what)
    _expect_dtype(t, role, allowed)


def _same_io_type(t: Tensor, role: str, q: Tensor) -> None:
    """Engines read and write one io type: an output or gradient in another type is a declaration error."""
    if t.data_type != q.data_type:
        raise GraphError(f"{_who(t, role)}: data_type must be q's {q.data_type.short}, got {t.data_type.short}")


def validate_fwd(node: SdpaFwdNode, io_types=IO_TYPES) -> SdpaFacts:
    geom, mask = _validate_common(node, io_types, node.q, node.k, node.v)
    _check_like(node.o, "o", expected_out_dims(geom, geom["head_dim_v"]), io_types, "q's geometry with v's head dim")
    _same_io_type(node.o, "o", node.q)
    _unit_last(node.o, "o")
    if node.generate_stats and node.stats is not None:
        _check_like(
            node.stats, "stats", expected_stats_dims(geom), (DataType.FLOAT,), "one fp32 log-sum-exp per query row"
        )
    roles = {"q": node.q, "k": node.k, "v": node.v, "o": node.o}
    if node.generate_stats:
        roles["stats"] = node.stats
    for role in OUTPUT_ATTRS:
        t = getattr(node.attrs, role)
        if t is not None:
            _check_like(
                t, role, expected_stats_dims(geom), (DataType.FLOAT,), "one fp32 value per query row, like Stats"
            )
            roles[role] = t
    roles.update(_extra_tensors(node))
    return _facts(
        node,
        "fwd",
        geom,
        mask,
        roles,
        has_stats=node.generate_stats,
        has_score_max=node.attrs.score_max is not None,
        has_score_sum_exp=node.attrs.score_sum_exp is not None,
    )


def validate_bwd(node: SdpaBwdNode, io_types=IO_TYPES) -> SdpaFacts:
    geom, mask = _validate_common(node, io_types, node.q, node.k, node.v)
    a = node.attrs
    for role in OUTPUT_ATTRS:
        if getattr(a, role) is not None:
            raise GraphError(
                f"sdpa_backward {a.name!r}: {role} is an output of the forward (sdpa), not an input of the backward"
            )
    out_dims = expected_out_dims(geom, geom["head_dim_v"])
    _check_like(node.o, "o", out_dims, io_types, "q's geometry with v's head dim")
    _check_like(node.dO, "dO", out_dims, io_types, "the shape of o")
    _check_like(
        node.stats,
        "stats",
        expected_stats_dims(geom),
        (DataType.FLOAT,),
        "the forward's fp32 log-sum-exp per query row",
    )
    for role, grad, like in (("dQ", node.dQ, node.q), ("dK", node.dK, node.k), ("dV", node.dV, node.v)):
        _check_like(grad, role, tuple(like.dim), io_types, f"the shape of {like.name!r}")
        _unit_last(grad, role)
    for role, t in (("o", node.o), ("dO", node.dO), ("dQ", node.dQ), ("dK", node.dK), ("dV", node.dV)):
        _same_io_type(t, role, node.q)
    for role, t in (("o", node.o), ("dO", node.dO)):
        _unit_last(t, role)
    if node.dSink_token is not None:
        if a.sink_token is None:
            raise GraphError(f"tensor {node.dSink_token.name!r} (dSink_token): a sink gradient needs sink_token")
        _check_like(
            node.dSink_token, "dSink_token", tuple(a.sink_token.dim), (DataType.FLOAT,), "the shape of sink_token"
        )
    if node.dBias is not None:
        if a.bias is None:
            raise GraphError(f"tensor {node.dBias.name!r} (dBias): a bias gradient needs bias")
        _check_like(node.dBias, "dBias", tuple(a.bias.dim), (node.q.data_type,), "the shape of bias")
    roles = {
        "q": node.q,
        "k": node.k,
        "v": node.v,
        "o": node.o,
        "dO": node.dO,
        "stats": node.stats,
        "dQ": node.dQ,
        "dK": node.dK,
        "dV": node.dV,
    }
    roles.update(_extra_tensors(node))
    return _facts(
        node,
        "bwd",
        geom,
        mask,
        roles,
        deterministic=node.use_deterministic_algorithm,
        has_dsink=node.dSink_token is not None,
        has_dbias=node.dBias is not None,
        has_stats=True,
    )
