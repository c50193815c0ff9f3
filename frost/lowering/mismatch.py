"""`mismatch(row, facts, knobs, target)`: the first human-readable reason a row cannot serve, or None."""

from __future__ import annotations

from typing import Optional

from frost.ir.facts import IO_TENSOR_ROLES, SdpaFacts
from frost.knobs import Knobs
from frost.lowering.capabilities import CapabilityRow, HeadDimSpan
from frost.target import Target

_ITEMSIZE = {"fp16": 2, "bf16": 2, "fp32": 4, "fp64": 8}


#: why a declared cuDNN feature is missing, appended to the decline reason
FEATURE_DETAILS = {
    "ragged_offsets": "cuDNN's ragged-offset form; the DSL engines serve it",
    "stats_per_batch": "Stats (B, H, S, 1) per batch in a packed graph",
    "block_mask": "cuDNN's block-sparse mask (forward only, as in cuDNN)",
    "rng_dump": "dropout's mask dump: cuDNN's Philox mask, written by the cuDNN engine only",
    "paged_attention": "paged K/V caches: the mma.sync and wgmma forwards read K and V through the block tables "
    "(block sizes 16, 32, 64, 128, 256); the cuDNN engine and the reference serve every block size",
    "score_max": "the row maximum of the scores",
    "score_sum_exp": "the row sum of exponentials",
    "split_kv_heads": "K and V with different head counts: the forwards and both backwards serve them",
    "unnested_kv_heads": "K and V head counts where neither divides the other: the forwards and both backwards "
    "serve them",
    "unfuse_fma": "an SM100 softmax rounding option of cuDNN's kernels",
    "bias": "an additive score bias: the mma.sync engines and the wgmma forward and backward read it",
    "dbias": "the bias gradient: the mma.sync and wgmma backwards write it",
    "alibi": "ALiBi: the mma.sync engines and the wgmma forward and backward compute it",
}


def _cc(c: tuple[int, int]) -> str:
    return f"{c[0]}.{c[1]}"


def mismatch(row: CapabilityRow, facts: SdpaFacts, knobs: Knobs, target: Target) -> Optional[str]:
    if row.direction != facts.direction:
        return f"serves sdpa {row.direction}, not {facts.direction}"
    if target.is_cpu:
        if not row.serves_cpu:
            return "needs a CUDA GPU; this machine has none"
    elif not (row.cc_min <= target.cc <= row.cc_max):
        span = _cc(row.cc_min) if row.cc_min == row.cc_max else f"{_cc(row.cc_min)}-{_cc(row.cc_max)}"
        return f"serves compute capability {span}; this device ({target.name}) is {_cc(target.cc)}"
    if row.pending:
        return row.pending
    if facts.io_dtype not in row.dtypes:
        return f"serves {'/'.join(row.dtypes)}, not {facts.io_dtype}"
    reason = _head_dims_mismatch(row, facts) or _extent_mismatch(row, facts)
    if reason:
        return reason
    missing = sorted(facts.features() - row.features)
    if missing:
        details = [
            FEATURE_DETAILS.get(f) or ("frost computes in fp32" if f.startswith("compute_") else "") for f in missing
        ]
        details = [d for d in details if d]
        return f"does not serve {', '.join(missing)}" + "".join(f" ({d})" for d in details)
    reason = _paged_mismatch(row, facts) or _layout_mismatch(row, facts)
    if reason:
        return reason
    for knob, value in knobs.requested().items():
        choices = row.knob_choices.get(knob)
        if choices is None:
            return f"has no knob {knob!r} (requested {value})"
        if value not in choices:
            return f"knob {knob}={value} is not one of {choices}"
    return None


INT32_LIMIT = 2**31


def _extents(facts: SdpaFacts) -> list[tuple[str, int]]:
    """The extents a kernel takes as ints, by the names the graph declared them with."""
    thd = facts.is_thd
    out = [
        ("max_seq_len_q" if thd else "S_q (q's dim 2)", facts.seq_q),
        ("max_seq_len_kv" if thd else "S_kv (k's dim 2)", facts.seq_kv),
        ("the batch B", facts.batch),
        ("the query heads H_q", facts.num_heads_q),
        ("the K/V heads H_kv", max(facts.num_heads_kv, facts.num_heads_v)),
    ]
    if thd:
        out += [
            ("the packed token total of q (its dim 0)", facts.total_q),
            ("the packed token total of k and v (their dim 0)", facts.total_kv),
        ]
    return out


def _extent_mismatch(row: CapabilityRow, facts: SdpaFacts) -> Optional[str]:
    """Kernels that take extents as 32-bit ints decline 2^31 and above (their 64-bit strides are fine)."""
    if not row.int32_extents:
        return None
    for name, value in _extents(facts):
        if value >= INT32_LIMIT:
            return f"takes {name} as a 32-bit int; this graph declares {value} (2^31 and above do not fit)"
    return None


def _head_dims_mismatch(row: CapabilityRow, facts: SdpaFacts) -> Optional[str]:
    dims, d, dv = row.head_dims, facts.head_dim_qk, facts.head_dim_v
    graph = f"this graph has d_qk={d}, d_v={dv}"
    if dims is None:
        return None
    if isinstance(dims, HeadDimSpan):
        outside = dims.outside(d, dv)
        return outside and f"serves head dims {dims.describe()}; {graph} ({outside[0]} {outside[2]})"
    if (d, dv) not in dims:
        listed = ", ".join(f"{a}" if a == b else f"{a}x{b}" for a, b in dims)
        return f"serves head dims {listed}; {graph}"
    return None


def _paged_mismatch(row: CapabilityRow, facts: SdpaFacts) -> Optional[str]:
    """A paged cache whose container block size the row does not serve, naming the sizes it does."""
    if facts.paged is None or row.paged_block_sizes is None:
        return None
    bad = [bs for bs in facts.paged.block_sizes if bs not in row.paged_block_sizes]
    if not bad:
        return None
    served = ", ".join(str(b) for b in row.paged_block_sizes)
    return (
        f"serves paged K/V block sizes {served}; this graph's K/V containers have block size "
        f"{'/'.join(str(b) for b in facts.paged.block_sizes)}"
    )


def _layout_mismatch(row: CapabilityRow, facts: SdpaFacts) -> Optional[str]:
    if row.vector_bytes <= 1:
        return None
    for t in facts.tensors:
        if t.name not in IO_TENSOR_ROLES:
            continue
        elems = max(row.vector_bytes // _ITEMSIZE.get(t.dtype, 2), 1)
        bad = [s for d, s in zip(t.dim[:-1], t.stride[:-1]) if d > 1 and s % elems != 0]
        if bad:
            return (
                f"tensor {t.label or repr(t.name)} has strides {t.stride} (dim {t.dim}); every non-unit stride "
                f"must be a multiple of {elems} elements ({row.vector_bytes}-byte vector loads), and {bad[0]} "
                "is not"
            )
    return None
