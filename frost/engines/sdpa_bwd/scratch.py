"""The backward's workspace: the fp32 dQ accumulator, dpsum, turn semaphores, dSink partials and the fp32
dBias accumulator.

Every function reads a `BwdChainParams` (see `chain.py`), so the helper kernels, the main kernels and
the adapter size and carve the same buffers. No cutlass import: planning reads this module.
"""

from __future__ import annotations

from frost.runtime.workspace import ScratchBuffer, layout_bytes

#: Query rows per CTA of the preprocess / dQ-convert kernels.
ROWS_PER_CTA = 64
#: dSink partial sums per preprocess CTA (one per warp).
PARTIALS_PER_CTA = 4


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def uses_turns(p) -> bool:
    """Whether the deterministic order comes from per-tile turns (semaphores) rather than split copies."""
    return p.deterministic and p.dq_splits == 0


def accumulator_rows(p, seqlen_q: int) -> int:
    """Rows of a dense dQ accumulator: Sq, padded to whole 8-row blocks when blocked, to whole tiles when
    stored in fragment order (`dq_accum_tile`)."""
    if p.dq_accum_tile:
        return cdiv(seqlen_q, p.dq_accum_tile) * p.dq_accum_tile
    return cdiv(seqlen_q, 8) * 8 if p.dq_accum_blocked else seqlen_q


def packed_tiles(total_q: int, batch: int, tile: int) -> int:
    """Query tiles per head when each packed sequence's tiles start where its first token's tile does, shifted by
    one per sequence before it (`accum.packed_acc_tile`), so no two sequences share one: the packed turn counters'
    layout, and a packed fragment-order accumulator's."""
    return total_q // tile + batch + 1


def packed_fragments(p) -> bool:
    """A packed (frost's form) dQ accumulator of fragment-order tiles, laid out as `packed_tiles`: the
    preprocess zeroes all its rows, the dQ convert walks each sequence's tiles from its prefix sums."""
    return p.is_thd and p.dq_accum_tile > 0 and not p.ragged


def packed_acc_rows(p, total_q: int, batch: int) -> int:
    """Rows per head of a packed dQ accumulator: the packed tokens, or, in fragment-order tiles
    (`dq_accum_tile`), whole tiles laid out as `packed_tiles`."""
    if packed_fragments(p):
        return packed_tiles(total_q, batch, p.dq_accum_tile) * p.dq_accum_tile
    return total_q


def scratch_layout(
    p, batch: int, max_seqlen_q: int, max_seqlen_kv: int, total_q: int = 0, total_kv: int = 0, bias_rows=None
) -> list[tuple[str, str, tuple[int, ...]]]:
    """The workspace buffers of the chain, in carving order: (name, torch dtype name, shape).

    Dense: `max_seqlen_q` is the declared Sq. THD: `total_q` is the packed query
    total (the plan-time envelope to size the workspace, the bound tensor's
    extent to carve views). `bias_rows`: the bias's declared (S_q, S_kv), which the
    dBias accumulator takes (default: max_seqlen_q, max_seqlen_kv; cuDNN's ragged
    form may declare a token envelope below S). Every buffer is contiguous, row-major.
    """
    h, d = p.num_heads_q, p.head_dim
    if p.is_thd:
        out = [("dpsum", "float32", (h, total_q)), ("dq_accum", "float32", (h, packed_acc_rows(p, total_q, batch), d))]
        n_part = h * PARTIALS_PER_CTA * max(cdiv(total_q, ROWS_PER_CTA), 1)
        if p.ragged:  # the helpers walk each sequence's row blocks
            n_part = h * PARTIALS_PER_CTA * batch * max(cdiv(max_seqlen_q, ROWS_PER_CTA), 1)
    else:
        acc_rows = accumulator_rows(p, max_seqlen_q)
        copies = max(p.dq_splits, 1)
        out = [
            ("dpsum", "float32", (batch, h, max_seqlen_q)),
            ("dq_accum", "float32", (copies * batch, h, acc_rows, d)),
        ]
        n_part = h * PARTIALS_PER_CTA * batch * max(cdiv(max_seqlen_q, ROWS_PER_CTA), 1)
    if uses_turns(p):  # one per (batch, head, query tile of tile_m rows); THD: per head, the packed total's
        # tiles plus one per sequence (a sequence's tiles start where its first token's tile does)
        # (the ragged-offset form places sequences anywhere: per (batch, head) the tiles of the longest one)
        packed = p.is_thd and not p.ragged
        tiles = packed_tiles(total_q, batch, p.tile_m) if packed else batch * cdiv(max_seqlen_q, p.tile_m)
        out.append(("dq_semaphore", "int32", (h * tiles,)))
    if p.has_dsinks:
        out.append(("dsink_partial", "float32", (n_part,)))
    if p.dbias_accum:
        out.append(
            ("dbias_accum", "float32", dbias_accum_shape(p, batch, *(bias_rows or (max_seqlen_q, max_seqlen_kv))))
        )
    return out


#: the dBias accumulator's rows are padded to a multiple of this many fp32 (16 bytes)
DBIAS_ROW_ALIGN = 4


def dbias_accum_shape(p, batch: int, seq_q: int, seq_kv: int) -> tuple[int, int, int, int]:
    """(B or 1, H_q or 1, S_q, S_kv padded to DBIAS_ROW_ALIGN): dBias's dims (declared S_q / S_kv, or THD's
    max_seq_len_q / kv) in fp32, rows 16-byte aligned."""
    return (
        batch if p.dbias_accum_per_batch else 1,
        p.num_heads_q if p.dbias_accum_per_head else 1,
        seq_q,
        cdiv(seq_kv, DBIAS_ROW_ALIGN) * DBIAS_ROW_ALIGN,
    )


def scratch_bytes(
    p, batch: int, max_seqlen_q: int, max_seqlen_kv: int, total_q: int = 0, total_kv: int = 0, bias_rows=None
) -> int:
    """Workspace bytes of `scratch_layout`, each buffer 256-byte aligned (the adapter's own closed form)."""
    return layout_bytes(
        ScratchBuffer(n, dt, tuple(shape))
        for n, dt, shape in scratch_layout(p, batch, max_seqlen_q, max_seqlen_kv, total_q, total_kv, bias_rows)
    )
