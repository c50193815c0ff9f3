"""The reference adapter: torch math in float32 (float64 for fp32 graphs), every declared feature.

It is the numerics oracle for the GPU engines and the engine of CPU-only
machines. On a GPU it runs only when requested by name (engine="reference"):
it reads sequence lengths to the host and allocates, so it is never a silent
fallback and never CUDA-graph capturable. A paged K/V cache is gathered through
its block tables into dense K and V, then attended (`_paged_gather`).
"""

from __future__ import annotations

import torch

from frost.adapters.base import SdpaBwdAdapter, SdpaFwdAdapter
from frost.adapters.reference_lengths import check_lengths
from frost.adapters.reference_math import RefArgs, batch_entry, sdpa_bwd_reference, sdpa_fwd_reference
from frost.adapters.views import io_view, lengths_view, sink_view, stats_view
from frost.errors import BindingError
from frost.ir.validate import Q_GROUP, ROW_STATS
from frost.runtime.context import on_stream


def _compute_dtype(facts):
    return torch.float64 if facts.io_dtype == "fp32" else torch.float32


def _ref_args(facts, bound) -> RefArgs:
    """The reference math's `RefArgs` of a graph in frost's dense or packed form: the scale, the lengths, the
    sinks, the band, the score modifiers and the block mask, each as declared."""
    kw = _band(facts)
    if facts.is_thd:
        kw.update(cu_seqlens_q=bound["cu_seq_len_q"], cu_seqlens_kv=bound["cu_seq_len_kv"])
    if facts.has_padding:
        kw.update(seqused_q=lengths_view(bound["seq_len_q"]), seqused_kv=lengths_view(bound["seq_len_kv"]))
    if facts.has_sinks:
        kw.update(sinks=sink_view(bound["sink_token"]))
    kw.update(_score_mod_kwargs(facts, bound))
    if facts.has_block_mask:
        kw.update(block_mask=bound["block_mask"])
    return RefArgs(facts.attn_scale, **kw)


def _score_mod_kwargs(facts, bound) -> dict:
    return dict(bias=bound["bias"] if facts.has_bias else None, alibi=facts.has_alibi)


def _ragged_batches(facts, bound):
    """cuDNN's ragged form, per batch: (b, rows(role) -> that batch's (len, H, D) view of a ragged tensor)."""
    strides = dict(facts.ragged.token_strides)
    declared = {t.name: t for t in facts.ragged.declared}
    offsets = {role: bound[f"{role}_ragged_offset"].reshape(-1).tolist() for role in strides}
    lens_q = lengths_view(bound["seq_len_q"]).tolist()
    lens_kv = lengths_view(bound["seq_len_kv"]).tolist()
    for b in range(len(lens_q)):

        def rows(role, b=b):
            t = bound[role]
            start = int(offsets[role][b])
            length = int(lens_q[b] if role in Q_GROUP else lens_kv[b])
            _, heads, seq, dim = declared[role].dim
            if length > seq:
                raise BindingError(f"batch {b}: sequence length {length} of {role} exceeds its declared S {seq}")
            return _tokens(role, b, t, start, length, (heads, dim), (t.stride(2), t.stride(1), t.stride(3)))

        yield b, int(lens_q[b]), rows


def _tokens(role: str, b: int, t, start: int, length: int, hd: tuple, strides: tuple):
    """Batch b's (length, H, D) tokens of a ragged tensor, from the element offset `start` of its memory (the
    binder's view of a packed buffer has the declared strides); a sequence past the bound memory raises."""
    size = (length, *hd)
    if length:
        last = t.storage_offset() + start + sum((n - 1) * st for n, st in zip(size, strides))
        if last >= t.untyped_storage().nbytes() // t.element_size():
            raise BindingError(
                f"batch {b}: {role}'s {length} tokens from element offset {start} lie past the bound memory"
            )
    return t.as_strided(size, strides, t.storage_offset() + start)


def _band(facts) -> dict:
    return dict(window_left=facts.window_left, window_right=facts.window_right, bottom_right=facts.bottom_right)


#: what a row outside every sequence holds in each row statistic (a row with no key: LSE = max = -inf, sum 0)
_EMPTY_ROW = {"stats": float("-inf"), "score_max": float("-inf"), "score_sum_exp": 0.0}


def _row_outputs(facts, bound) -> list:
    """(role, bound tensor or None) of Stats, score_max and score_sum_exp: the order in which the reference
    returns them after O."""
    wanted = (facts.has_stats, facts.has_score_max, facts.has_score_sum_exp)
    return [(r, bound[r] if on else None) for r, on in zip(ROW_STATS, wanted)]


def _ragged_fwd(facts, bound) -> None:
    sinks = sink_view(bound["sink_token"]) if facts.has_sinks else None
    outs = _row_outputs(facts, bound)
    ragged = dict(facts.ragged.token_strides)
    for b, len_q, rows in _ragged_batches(facts, bound):
        for role, t in outs:
            if t is not None and role not in ragged:  # declared per batch, (B, H, S, 1)
                t[b, :, len_q:, 0] = _EMPTY_ROW[role]
        if len_q == 0:
            continue
        args = RefArgs(
            facts.attn_scale,
            sinks=sinks,
            **_band(facts),
            **_batch_score_mods(facts, bound, b),
            **_batch_block_mask(facts, bound, b),
        )
        o, *stats = sdpa_fwd_reference(
            rows("q")[None], rows("k")[None], rows("v")[None], args, compute_dtype=_compute_dtype(facts), row_stats=True
        )
        rows("o").copy_(o[0])
        for (role, t), value in zip(outs, stats):
            if t is None:
                continue
            if role in ragged:
                rows(role)[..., 0].copy_(value[0].t())
            else:
                t[b, :, :len_q, 0] = value[0]


def _batch_block_mask(facts, bound, b: int) -> dict:
    """The block_mask keyword of ragged batch b: its (1, H, ...) entry (sequence-local tiles), or nothing."""
    return dict(block_mask=bound["block_mask"][b : b + 1]) if facts.has_block_mask else {}


def _batch_score_mods(facts, bound, b: int) -> dict:
    """The score-modifier keywords of ragged batch b: its slice of the bias (batch-broadcast biases whole)."""
    kw = _score_mod_kwargs(facts, bound)
    if kw["bias"] is not None:
        kw["bias"] = batch_entry(kw["bias"], b)
    return kw


def _ragged_bwd(facts, bound) -> None:
    sinks = sink_view(bound["sink_token"]) if facts.has_sinks else None
    total_dsink = None
    dbias = _dbias_accumulator(facts, bound)
    ragged = dict(facts.ragged.token_strides)
    for b, len_q, rows in _ragged_batches(facts, bound):
        if len_q == 0:  # keys no query sees: zero gradients, as the kernels write them
            rows("dK").zero_()
            rows("dV").zero_()
            continue
        args = RefArgs(facts.attn_scale, sinks=sinks, **_band(facts), **_batch_score_mods(facts, bound, b))
        dq, dk, dv, dsink, db = sdpa_bwd_reference(
            rows("q")[None],
            rows("k")[None],
            rows("v")[None],
            rows("dO")[None],
            args,
            compute_dtype=_compute_dtype(facts),
            dbias=dbias is not None,
            o=rows("o")[None],
            lse=_ragged_stats(bound, rows, b, len_q, "stats" in ragged),
        )
        rows("dQ").copy_(dq[0])
        rows("dK").copy_(dk[0])
        rows("dV").copy_(dv[0])
        if dsink is not None:
            total_dsink = dsink if total_dsink is None else total_dsink + dsink
        if dbias is not None:
            batch_entry(dbias, b).add_(db)
    if dbias is not None:
        bound["dBias"].copy_(dbias)
    if facts.has_dsink:
        out = sink_view(bound["dSink_token"])
        if total_dsink is not None:
            out.copy_(total_dsink)
        else:
            out.zero_()


def _ragged_stats(bound, rows, b: int, len_q: int, is_ragged: bool):
    """Batch b's bound Stats as `sdpa_bwd_reference` reads them, (1, H, len_q): from its ragged rows or from the
    per-batch (B, H, S, 1) declaration."""
    if is_ragged:
        return rows("stats")[..., 0].t()[None]
    return bound["stats"][b : b + 1, :, :len_q, 0]


def _dbias_accumulator(facts, bound):
    """A zeroed compute-dtype tensor of dBias's shape, or None without dBias."""
    if not facts.has_dbias:
        return None
    return torch.zeros(tuple(bound["dBias"].shape), dtype=_compute_dtype(facts), device=bound["dBias"].device)


def _paged_gather(facts, bound, role: str):
    """The paged cache of `role` (k or v) gathered through its block table: (B, S_kv, H, D), the canonical dense
    view. Key j of sequence b is row j % block_size of block table[b, 0, j // block_size, 0]; only the blocks a
    sequence's length reaches are read (a serving engine leaves the rest of a table row undefined), and the rows
    past its length are zeros (the padding mask hides them)."""
    container, table = bound[role], bound[f"paged_attention_{role}_table"]
    num_blocks, heads, block_size, dim = container.shape
    lengths = [int(x) for x in lengths_view(bound["seq_len_kv"]).tolist()]
    rows = table[:, 0, :, 0]
    out = container.new_zeros((len(lengths), facts.seq_kv, heads, dim))
    for b, length in enumerate(lengths):
        used = -(-length // block_size)
        blocks = [int(x) for x in rows[b, :used].tolist()]
        bad = [x for x in blocks if not 0 <= x < num_blocks]
        if bad:
            raise BindingError(
                f"paged_attention_{role}_table[{b}] holds block {bad[0]}, outside the {role} "
                f"container's {num_blocks} blocks"
            )
        if used:
            idx = torch.tensor(blocks, dtype=torch.long, device=container.device)
            seq = container.index_select(0, idx).permute(0, 2, 1, 3).reshape(used * block_size, heads, dim)
            out[b, :length] = seq[:length]
    return out


class SdpaFwdReference(SdpaFwdAdapter):
    engine_name = "SdpaFwdReference"

    def execute(self, bound: dict, workspace, stream) -> None:
        f = self.facts
        check_lengths(f, bound)  # every length and offset, before any output is written
        thd = f.is_thd
        if f.ragged is not None:
            with on_stream(stream, bound["q"].device):
                _ragged_fwd(f, bound)
            return
        with on_stream(stream, bound["q"].device):
            if f.paged is not None:
                k, v = _paged_gather(f, bound, "k"), _paged_gather(f, bound, "v")
            else:
                k, v = io_view(bound["k"], thd), io_view(bound["v"], thd)
            o, *stats = sdpa_fwd_reference(
                io_view(bound["q"], thd), k, v, _ref_args(f, bound), compute_dtype=_compute_dtype(f), row_stats=True
            )
            io_view(bound["o"], thd).copy_(o)
            for (_, t), value in zip(_row_outputs(f, bound), stats):
                if t is not None:
                    stats_view(t, thd).copy_(value)


class SdpaBwdReference(SdpaBwdAdapter):
    engine_name = "SdpaBwdReference"

    def execute(self, bound: dict, workspace, stream) -> None:
        f = self.facts
        check_lengths(f, bound)  # every length and offset, before any output is written
        thd = f.is_thd
        if f.ragged is not None:
            with on_stream(stream, bound["q"].device):
                _ragged_bwd(f, bound)
            return
        with on_stream(stream, bound["q"].device):
            dq, dk, dv, dsink, dbias = sdpa_bwd_reference(
                io_view(bound["q"], thd),
                io_view(bound["k"], thd),
                io_view(bound["v"], thd),
                io_view(bound["dO"], thd),
                _ref_args(f, bound),
                compute_dtype=_compute_dtype(f),
                dbias=f.has_dbias,
                o=io_view(bound["o"], thd),
                lse=stats_view(bound["stats"], thd),
            )
            io_view(bound["dQ"], thd).copy_(dq)
            io_view(bound["dK"], thd).copy_(dk)
            io_view(bound["dV"], thd).copy_(dv)
            if f.has_dsink:
                sink_view(bound["dSink_token"]).copy_(dsink)
            if f.has_dbias:
                bound["dBias"].copy_(dbias)
