"""The reference engine's check of device lengths and offsets, before it writes anything (docs/lengths.md).

The GPU kernels clamp a bad length or offset to the plan's envelope (`frost/engines/common/seqlen.py`); the
reference, which reads them to the host anyway, refuses them instead, naming the tensor, the batch entry and the
rule, and it checks every entry before the first output is written: a call either writes all its outputs or
none. The rules are the clamps' envelope:

- `seq_len_q` / `seq_len_kv` (padding mask, dense): each in [0, S] (the bound tensor's S).
- `cu_seq_len_q` / `cu_seq_len_kv` (frost's packed form): each in [0, T] (the bound tokens), non-decreasing,
  each difference at most `max_seq_len`.
- cuDNN's ragged form: lengths in [0, min(S, max_seq_len)]; each ragged offset a whole number of tokens, its
  token in [0, T] (the token envelope `max_total_seq_len`, or the tokens a packed buffer bound by pointer holds
  if fewer) and that token plus the entry's length at most T.
"""

from __future__ import annotations

from frost.adapters.views import lengths_view
from frost.errors import BindingError
from frost.ir.validate import Q_GROUP
from frost.runtime.binding import ragged_totals


def _host(t) -> list[int]:
    return [int(x) for x in lengths_view(t).reshape(-1).tolist()]


def _bad(name: str, b: int, value: int, rule: str) -> BindingError:
    return BindingError(f"{name}[{b}] = {value}: {rule} (docs/lengths.md); no output was written")


def _check_range(name: str, values: list[int], hi: int, what: str) -> None:
    for b, v in enumerate(values):
        if not 0 <= v <= hi:
            raise _bad(name, b, v, f"must lie in [0, {hi}] ({what})")


def _check_prefix_sums(name: str, cu: list[int], total: int, longest: int, side: str) -> None:
    _check_range(name, cu, total, f"the {total} tokens bound")
    for b in range(len(cu) - 1):
        if cu[b + 1] < cu[b]:
            raise _bad(name, b + 1, cu[b + 1], f"must not be below {name}[{b}] = {cu[b]} (prefix sums never decrease)")
        if longest and cu[b + 1] - cu[b] > longest:
            raise _bad(
                name,
                b + 1,
                cu[b + 1],
                f"makes sequence {b} {cu[b + 1] - cu[b]} tokens long, above max_seq_len_{side} = {longest}",
            )


def _check_ragged(facts, bound) -> None:
    lens = {}
    declared = {t.name: t for t in facts.ragged.declared}
    totals = ragged_totals(facts, bound)  # the envelope, or the tokens a packed buffer bound by pointer holds
    for side, role, longest in (("q", "q", facts.seq_q), ("kv", "k", facts.seq_kv)):
        s = declared[role].dim[2]
        hi = min(s, longest) if longest else s
        lens[side] = _host(bound[f"seq_len_{side}"])
        _check_range(
            f"seq_len_{side}",
            lens[side],
            hi,
            f"the declared S = {s}" + (f" and max_seq_len_{side} = {longest}" if longest else ""),
        )
    for role, stride in facts.ragged.token_strides:
        side = "q" if role in Q_GROUP else "kv"
        total = totals["total_q"] if side == "q" else totals["total_kv"]
        name = f"{role}_ragged_offset"
        for b, off in enumerate(_host(bound[name])[: len(lens[side])]):
            if off % stride:
                raise _bad(
                    name,
                    b,
                    off,
                    f"must be a whole number of tokens (it is not a multiple of the token stride {stride})",
                )
            token = off // stride
            if not 0 <= token <= total:
                raise _bad(name, b, off, f"its token {token} must lie in [0, {total}] (the token envelope)")
            if token + lens[side][b] > total:
                raise _bad(
                    name,
                    b,
                    off,
                    f"its token {token} plus seq_len_{side}[{b}] = {lens[side][b]} passes the token envelope {total}",
                )


def check_lengths(facts, bound: dict) -> None:
    """Raise BindingError for the first length or offset outside the envelope; read every one before any
    output is written."""
    if facts.ragged is not None:
        _check_ragged(facts, bound)
        return
    if facts.is_thd:
        for side, role, longest in (("q", "q", facts.seq_q), ("kv", "k", facts.seq_kv)):
            _check_prefix_sums(
                f"cu_seq_len_{side}", _host(bound[f"cu_seq_len_{side}"]), bound[role].shape[0], longest, side
            )
        return
    if facts.has_padding:
        for side, role in (("q", "q"), ("kv", "k")):
            if side == "kv" and facts.paged is not None:  # K is a block container: the envelope is the plan's
                s, what = facts.seq_kv, f"paged_attention_max_seq_len_kv = {facts.seq_kv}"
            else:
                s = bound[role].shape[2]
                what = f"the declared S = {s}"
            _check_range(f"seq_len_{side}", _host(bound[f"seq_len_{side}"]), s, what)
