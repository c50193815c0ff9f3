"""Execute-time aliasing check: no output may share a byte with another bound tensor or the workspace.

A kernel that stores O tiles while other CTAs still load Q, K or V tiles from the same bytes computes
garbage and destroys its input, so an output that overlaps anything else bound to the same execute is
a `BindingError` naming both ports. Inputs may share memory with each other (``k`` and ``v`` one
tensor is fine: nothing writes them). The workspace's used bytes count as written.

A tensor's byte span is ``[data_ptr, data_ptr + (1 + sum((size - 1) * stride)) * itemsize)`` (empty when
it has no elements), from the bound tensor's own storage offset, sizes and strides. Spans that only
touch (one ends where the next begins) are disjoint. Spans that intersect are aliased unless
`never_touch` proves the two tensors interleave without sharing a byte (dQ, dK and dV as the three
slices of one packed (B, S, 3, H, D) buffer): each tensor's bytes are contiguous blocks (its dims merged
from the unit stride outwards while they stay contiguous) at multiples of the gcd of its other
strides, so modulo the gcd G of both tensors' they occupy one window each; windows that do not meet
modulo G mean no shared byte. What that cannot prove is rejected (conservative: a false alarm names
both tensors, a missed overlap would corrupt them).

Cost (`benchmarks/bind_host_cpu.py`). A tensor that matched its declaration spans a length known at
plan time, so the fast path needs only the addresses, which the binder's per-tensor test reads anyway.
`disjoint` sorts the starts and the ends apart and compares them (half-open spans are pairwise disjoint
iff the i-th smallest end is at most the (i+1)-th smallest start: never two spans cover a point), and
the last set of addresses found clear is remembered, so rebinding the same buffers costs one list
comparison. The last `REMEMBERED` sets found clear are kept too (one tuple lookup, about 0.15 us, instead of
the sorts, about 1.2 us for nine tensors): outputs that move among a few recurring buffers (a caching
allocator's steady state, double buffering) cost no more than outputs that stay. Only when the test fails
does `check_aliasing` look at pairs, to tell an aliased output from inputs that merely share memory.
"""

from __future__ import annotations

import math
from operator import add, le

from frost.errors import BindingError

#: how many address sets found clear one plan's check remembers (forgotten all at once when full)
REMEMBERED = 64


def span_length(dims: tuple, strides: tuple, itemsize: int) -> int:
    """Bytes a tensor of these dims and strides spans from its first element (0 without elements)."""
    if any(d == 0 for d in dims):
        return 0
    return (1 + sum((d - 1) * s for d, s in zip(dims, strides))) * itemsize


def byte_span(t) -> tuple[int, int]:
    """[start, end) of the bytes `t` addresses, from its own storage offset, sizes and strides."""
    start = t.data_ptr()
    return start, start + span_length(tuple(t.shape), t.stride(), t.element_size())


def disjoint(starts: list, lengths) -> bool:
    """True when the spans [starts[i], starts[i] + lengths[i]) are pairwise disjoint (`starts` is consumed).

    A uniform shift of every start changes nothing (the binder passes address + 1)."""
    ends = sorted(map(add, starts, lengths))
    starts.sort()
    del starts[0]
    return all(map(le, ends, starts))


def _blocks(t) -> tuple[int, int]:
    """(bytes of each contiguous block of `t`, gcd in bytes of the strides between blocks; 0: one block)."""
    isz = t.element_size()
    dims = sorted((s, d) for d, s in zip(t.shape, t.stride()) if d > 1)
    block, k = 1, 0
    if dims and dims[0][0] == 1:
        while k < len(dims) and dims[k][0] == block:
            block *= dims[k][1]
            k += 1
    g = 0
    for s, _ in dims[k:]:
        g = math.gcd(g, s * isz)
    return block * isz, g


def never_touch(a, b) -> bool:
    """True when tensors `a` and `b` provably share no byte although their spans intersect (see above)."""
    if a is None or b is None:
        return False
    (la, ga), (lb, gb) = _blocks(a), _blocks(b)
    g = math.gcd(ga, gb)
    if g == 0 or la + lb > g:
        return False
    d = (b.data_ptr() - a.data_ptr()) % g  # b's window starts d bytes after a's, modulo g
    return la <= d <= g - lb


def check_aliasing(labels, spans: list, outputs, tensors=()) -> None:
    """Raise a BindingError naming both ports when an output's span intersects any other bound span.

    `labels[i]` names `spans[i]` ((start, end) pairs) and `tensors[i]` (if given, for `never_touch`);
    `outputs[i]` says whether it is written (the workspace is). Empty spans and null pointers (no
    storage: meta tensors) never alias.
    """
    tensors = list(tensors) + [None] * (len(spans) - len(tensors))
    for i, (a0, a1) in enumerate(spans):
        if not outputs[i] or a0 == a1 or a0 == 0:
            continue
        for j, (b0, b1) in enumerate(spans):
            if j == i or b0 == b1 or b0 == 0 or (outputs[j] and j < i):
                continue
            if a0 < b1 and b0 < a1 and not never_touch(tensors[i], tensors[j]):
                lo, hi = max(a0, b0), min(a1, b1)
                raise BindingError(
                    f"output {labels[i]} shares memory with {labels[j]} (bytes {lo:#x}..{hi:#x}); "
                    f"an output must not overlap any other bound tensor or the workspace "
                    f"(frost never copies to separate them)"
                )


class AliasGuard:
    """One plan's aliasing check for tensors in a fixed order (the binder's specs, an executor's ports).

    `labels`, `outputs` and `lengths` (each tensor's span length from its declaration, or None for a
    packed tensor, whose length follows its token count) are plan-time values; `workspace_size` the
    plan's. Not a lock: a race on `clear` can only remember addresses that were found clear.
    """

    __slots__ = ("labels", "outputs", "lengths", "workspace_size", "clear", "exact", "seen")

    def __init__(self, labels, outputs, lengths, workspace_size: int):
        ws = (("workspace",), (True,), (workspace_size,)) if workspace_size else ((), (), ())
        self.labels = tuple(labels) + ws[0]
        self.outputs = tuple(outputs) + ws[1]
        self.lengths = tuple(lengths) + ws[2]
        self.workspace_size = workspace_size
        self.exact = any(n is None for n in lengths)  # packed: spans from the tensors themselves
        self.clear = None
        self.seen = set()  # tuples of address sets found clear, at most REMEMBERED

    def fast(self, ptrs: list, tensors, workspace) -> None:
        """`ptrs`: each tensor's address + 1 (what `matches_spec` returns), every tensor as declared."""
        if self.exact:
            return self.full(tensors, workspace)
        if self.workspace_size:
            ptrs.append(workspace.data_ptr() + 1)
        if ptrs == self.clear:
            return None
        key = tuple(ptrs)
        seen = self.seen
        if key not in seen:  # every span's length is fixed: the addresses decide alone
            starts = sorted(ptrs)  # `disjoint`, inline
            del starts[0]
            ends = list(map(add, ptrs, self.lengths))
            ends.sort()
            if not all(map(le, ends, starts)):
                self.full(tensors, workspace)  # raises unless the overlapping spans provably interleave
            if len(seen) >= REMEMBERED:
                seen.clear()
            seen.add(key)
        self.clear = ptrs

    def full(self, tensors, workspace) -> None:
        """Every span from the bound tensor itself (any legal binding)."""
        tensors = list(tensors)
        spans = [byte_span(t) for t in tensors]
        if self.workspace_size and workspace is not None:
            p = workspace.data_ptr()
            spans.append((p, p + self.workspace_size))
        if not disjoint([s for s, _ in spans], [e - s for s, e in spans]):
            check_aliasing(self.labels, spans, self.outputs, tensors)
