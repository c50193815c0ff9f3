"""The split-KV combine kernel: each query row's per-split partials (fp32 O_s, LSE_s) into O and Stats.

One warp per query row (b, h, i): every lane reads the row's num_splits LSEs (one plan-time count, unrolled),
takes the max (the sink too, which enters exactly once here), the sum of exp(LSE_s - max), the row's LSE and the
split weights exp(LSE_s - LSE); then each lane combines O for the head-dim columns lane, lane + 32, ...
(coalesced over the warp) and stores them in the io dtype to O as declared; lane 0 writes Stats (and score_max /
score_sum_exp from each split's row max, `max_partial`). Grid
(ceil(S_q / 4), Hq, B). Math, empty rows and the padding convention: `split_combine_params`.

Packed batches (`is_thd`): grid (ceil(max_seqlen_q / 4), Hq, B); each warp finds its sequence's first token and
length on the device (`seqlen.seqlen_info`, clamped and capped at max_seqlen_q as the forwards cap them), reads
the per-batch partials at its sequence-local row and writes O and Stats (packed or per batch) only inside the
sequence.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from frost.engines.common.sdpa_entry import IO_DTYPES, FakeArgs, make_entry
from frost.engines.common import seqlen
from frost.engines.common.seqlen import clamp
from frost.engines.common.softmax import LN_2, LOG2_E
from frost.engines.common.split_combine_params import SplitCombineParams, combine_arg_names, validate

TEMPLATE = __name__
WARPS = 4


def kernel_name(params: SplitCombineParams, arch: str) -> str:
    p = params
    flags = [
        n
        for on, n in (
            (p.has_lse, "lse"),
            (p.has_seqused, "seqused"),
            (p.has_sinks, "sink"),
            (p.has_score_max, "smax"),
            (p.has_score_sum_exp, "ssum"),
        )
        if on
    ]
    return "_".join(
        ["frost_split_combine", p.dtype, f"d{p.head_dim_v}", f"h{p.num_heads_q}", f"sp{p.num_splits}", *flags]
        + packed_tags(p)
    )


def packed_tags(p: SplitCombineParams) -> list[str]:
    """Kernel-name tags of a packed batch: `thd`, and the ragged form's divisors and 64-bit offsets."""
    if not p.is_thd:
        return []
    tags = ["thd"]
    if p.ragged:
        tags.append(f"rg{p.token_div_q}" + "o64" * (p.offset_dtype_q == "int64"))
    if p.token_div_lse:
        tags.append(f"rglse{p.token_div_lse}" + "o64" * (p.offset_dtype_lse == "int64"))
    tags += [f"rg{r}{div}" + "o64" * (kind == "int64") for r, div, kind in p.own_offsets]
    return tags + ["lsepb"] * p.stats_per_batch


def build(params: SplitCombineParams, arch: str):
    """(jit entry taking the `combine_arg_names` arguments, fake arguments)."""
    validate(params)
    names = combine_arg_names(params)
    op = SplitCombine(params)
    if params.is_thd:
        return make_entry(op.launch_packed, names, True, params if params.ragged else None), FakeArgs(params).all(names)
    return make_entry(op.launch, names, False), FakeArgs(params).all(names)


class SplitCombine:
    """Host-side launch (`launch`, arguments by contract name in canonical views) and the device kernel."""

    def __init__(self, p: SplitCombineParams):
        self.p = p
        self.dtype = IO_DTYPES[p.dtype]

    @cute.jit
    def launch(self, a: dict):
        mO = a["o"]  # canonical (B, S, H, Dv)
        num_batch, seqlen_q = mO.shape[0], mO.shape[1]
        grid = ((seqlen_q + WARPS - 1) // WARPS, self.p.num_heads_q, num_batch)
        g = a.get
        scores = (g("score_max"), g("score_sum_exp"), g("max_partial"))
        self.kernel(mO, g("lse"), a["o_partial"], a["lse_partial"], g("seqused_q"), g("sinks"), scores).launch(
            grid=grid, block=(32 * WARPS, 1, 1), stream=a["stream"]
        )

    @cute.jit
    def launch_packed(self, a: dict):
        """Packed batches: O (T, H, Dv), Stats (H, T) or per batch (B, H, S) in canonical views."""
        max_q = a["max_seqlen_q"]
        num_batch = a["cu_seqlens_q"].shape[0] - 1
        grid = (cutlass.max((max_q + WARPS - 1) // WARPS, 1), self.p.num_heads_q, cutlass.max(num_batch, 1))
        g = a.get
        offsets = (g("lse_offsets"), g("o_offsets"), g("score_max_offsets"), g("score_sum_exp_offsets"))
        lengths = (a["cu_seqlens_q"], g("seqused_q"), offsets, max_q, num_batch)
        scores = (g("score_max"), g("score_sum_exp"), g("max_partial"))
        self.kernel_packed(a["o"], g("lse"), a["o_partial"], a["lse_partial"], lengths, g("sinks"), scores).launch(
            grid=grid, block=(32 * WARPS, 1, 1), stream=a["stream"]
        )

    @cute.kernel
    def kernel(self, mO: cute.Tensor, mLSE, mOp: cute.Tensor, mLp: cute.Tensor, mSeqQ, mSinks, scores):
        p = self.p
        tidx, _, _ = cute.arch.thread_idx()
        bx, head, batch = cute.arch.block_idx()
        row = bx * WARPS + tidx // 32
        lane = tidx % 32
        static_sq = mO.shape[1]
        if row < static_sq:
            q_rows = static_sq
            if const_expr(p.has_seqused):  # a device length: clamped to the rows the tensors hold
                q_rows = clamp(mSeqQ[batch], Int32(0), static_sq)
            lse, lses = self.reduce_row(mLp, mSinks, batch, head, row, row < q_rows)
            self.store_o(mO[batch, row, head, None], mOp, lses, (batch, head, row), lane)
            if const_expr(p.has_lse):
                if lane == 0:
                    mLSE[batch, head, row] = lse
            if const_expr(p.has_score_stats):  # rows past the sequence: -inf and 0, as the forwards write them
                if lane == 0:
                    s_max, s_sum = self.score_stats(scores[2], mSinks, (batch, head, row), lse, row < q_rows)
                    for mX, val in zip(scores[:2], (s_max, s_sum)):
                        if const_expr(mX is not None):
                            mX[batch, head, row] = val

    @cute.kernel
    def kernel_packed(self, mO: cute.Tensor, mLSE, mOp: cute.Tensor, mLp: cute.Tensor, lengths, mSinks, scores):
        p = self.p
        mCuQ, mUsedQ, offsets, max_q, num_batch = lengths
        mLseOff, mOOff = offsets[0], offsets[1]
        tidx, _, _ = cute.arch.thread_idx()
        bx, head, batch = cute.arch.block_idx()
        row = bx * WARPS + tidx // 32
        lane = tidx % 32
        if batch < num_batch:
            total = mO.shape[0]
            off_q, _, seqlen_q, _ = seqlen.seqlen_info(
                batch, total, Int32(0), mCuQ, None, mUsedQ, None, p.token_div_q, 0, max_q, None
            )
            if row < seqlen_q:
                off_o = seqlen.own_token_offset(p, "o", mOOff, batch, off_q, seqlen_q, total)
                off_lse = off_q
                if const_expr(mLseOff is not None):
                    off_lse = seqlen.rows_offset(mLseOff, batch, p.token_div_lse, seqlen_q, total)
                lse, weights = self.reduce_row(mLp, mSinks, batch, head, row)
                self.store_o(mO[off_o + row, head, None], mOp, weights, (batch, head, row), lane)
                if const_expr(p.has_lse):
                    if lane == 0:
                        self.store_row(mLSE, lse, (batch, head, row), off_lse)
                if const_expr(p.has_score_stats):
                    if lane == 0:
                        s_max, s_sum = self.score_stats(scores[2], mSinks, (batch, head, row), lse, True)
                        for role, mX, mOff, val in zip(
                            ("score_max", "score_sum_exp"), scores[:2], offsets[2:], (s_max, s_sum)
                        ):
                            if const_expr(mX is not None):
                                off = seqlen.own_token_offset(p, role, mOff, batch, off_q, seqlen_q, total)
                                self.store_row(mX, val, (batch, head, row), off)

    @cute.jit
    def store_o(self, o_row: cute.Tensor, mOp: cute.Tensor, weights, at, lane):
        """One row of O (`o_row`: its D_v columns) as the weighted sum of the splits' partial rows, a warp's 32
        lanes striding over the columns."""
        batch, head, row = at
        for j in cutlass.range_constexpr((self.p.head_dim_v + 31) // 32):
            col = lane + 32 * j
            if col < self.p.head_dim_v:
                acc = Float32(0.0)
                for s in cutlass.range_constexpr(self.p.num_splits):
                    acc += weights[s] * mOp[s, batch, head, row, col]
                o_row[col] = acc.to(self.dtype)

    @cute.jit
    def store_row(self, mX: cute.Tensor, val, at, offset):
        """One packed row's value (LSE, score_max, score_sum_exp) to its (H, T) view from the sequence's first row
        `offset` there, or per batch entry to its (B, H, S) view (the ragged form's per-batch row outputs)."""
        batch, head, row = at
        if const_expr(self.p.stats_per_batch):
            mX[batch, head, row] = val
        else:
            mX[head, offset + row] = val

    @cute.jit
    def score_stats(self, mMp: cute.Tensor, mSinks, at, lse, inside):
        """(score_max, score_sum_exp) of a row: the largest split maximum and the sink, and exp(LSE - score_max)
        (the sum of exp(logit - score_max) over every key and the sink); -inf and 0 for a row with neither, and
        for rows not `inside` the sequence."""
        batch, head, row = at
        mx = -Float32.inf
        for s in cutlass.range_constexpr(self.p.num_splits):
            mx = cute.arch.fmax(mx, mMp[s, batch, head, row])
        if const_expr(self.p.has_sinks):
            mx = cute.arch.fmax(mx, mSinks[head])
        mx = mx if inside else -Float32.inf
        return mx, Float32(0.0) if mx == -Float32.inf else cute.math.exp2((lse - mx) * LOG2_E)

    @cute.jit
    def reduce_row(self, mLp: cute.Tensor, mSinks, batch, head, row, inside=None):
        """(LSE, split weights exp(LSE_s - LSE)) of a row: -inf and zero weights where no split saw a key and there
        is no sink, or where the row is not `inside` its sequence (a dense row past seqused_q; None: it is)."""
        p = self.p
        lses = cute.make_rmem_tensor(p.num_splits, Float32)
        mx = -Float32.inf
        for s in cutlass.range_constexpr(p.num_splits):
            lses[s] = mLp[s, batch, head, row]
            mx = cute.arch.fmax(mx, lses[s])
        sink = Float32(0.0)
        if const_expr(p.has_sinks):
            sink = mSinks[head]
            mx = cute.arch.fmax(mx, sink)
        m = Float32(0.0) if mx == -Float32.inf else mx
        total = Float32(0.0)
        for s in cutlass.range_constexpr(p.num_splits):
            total += cute.math.exp2((lses[s] - m) * LOG2_E)
        if const_expr(p.has_sinks):
            total += cute.math.exp2((sink - m) * LOG2_E)
        lse = -Float32.inf
        if total > 0.0:
            lse = m + cute.math.log2(total) * LN_2
        if const_expr(inside is not None):
            if not inside:
                lse = -Float32.inf
        for s in cutlass.range_constexpr(p.num_splits):
            lses[s] = Float32(0.0) if lse == -Float32.inf else cute.math.exp2((lses[s] - lse) * LOG2_E)
        return lse, lses
