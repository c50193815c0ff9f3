"""Params and scratch layout of the ragged-offsets kernel (no cutlass import: planning reads this module).

The kernel turns frost's packed prefix sums (`cu_seq_len_q/kv`, (B+1,) int32) into what cuDNN's ragged form
takes: per-batch lengths (`seq_len_q/kv`, (B,) int32) and, for each token stride a packed tensor group uses, the
element offsets of every batch's first token ((B+1,) int32 or int64: `cu[b] * token_stride`).
"""

from __future__ import annotations

from typing import Literal

from frost.engines.params import TemplateParams
from frost.errors import TemplateParamsError
from frost.runtime.workspace import ALIGN, ScratchBuffer, align_up

#: the largest element offset an int32 offset array holds; past it the offsets are int64
INT32_MAX = 2**31 - 1


class RaggedOffsetsParams(TemplateParams):
    offset_dtype: Literal["int32", "int64"] = "int32"
    strides_q: tuple[int, ...] = ()  # token strides of the query group's offset arrays (in elements)
    strides_kv: tuple[int, ...] = ()  # token strides of the key/value group's offset arrays

    @property
    def num_offsets(self) -> int:
        return len(self.strides_q) + len(self.strides_kv)


def validate(p: RaggedOffsetsParams) -> None:
    if not p.strides_q or not p.strides_kv:
        raise TemplateParamsError("ragged offsets: both token groups need at least one stride")
    if any(s < 1 for s in p.strides_q + p.strides_kv):
        raise TemplateParamsError(f"ragged offsets: token strides must be >= 1, got {p.strides_q} / {p.strides_kv}")


def offset_dtype_for(max_offset: int) -> str:
    """int32 while every element offset fits, else int64 (what cuDNN's ragged offsets take)."""
    return "int32" if max_offset <= INT32_MAX else "int64"


def scratch_buffers(p: RaggedOffsetsParams, batch: int) -> list[ScratchBuffer]:
    """The kernel's outputs in the workspace, in carving order: the lengths (2, B) int32 (seq_len_q, then
    seq_len_kv) and the offset arrays (N, B+1) (the q group's strides first). Rows are padded to 256 bytes, so
    each row starts aligned: every row is a cuDNN operand of its own."""
    itemsize = 4 if p.offset_dtype == "int32" else 8
    return [
        ScratchBuffer("ragged_lengths", "int32", (2, row_elems(batch, 4))),
        ScratchBuffer("ragged_offsets", p.offset_dtype, (p.num_offsets, row_elems(batch + 1, itemsize))),
    ]


def row_elems(n: int, itemsize: int) -> int:
    """`n` elements padded to whole 256-byte rows (one row at least)."""
    return max(align_up(n * itemsize), ALIGN) // itemsize


def offset_role(index: int) -> str:
    """The name of the `index`-th derived offset array (the q group's first, then the kv group's)."""
    return f"ragged_offset_{index}"
