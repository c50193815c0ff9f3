"""The opt-in device check of sequence lengths and offsets (docs/lengths.md): its rules, flag bits and params.

No cutlass import: planning, the reference engine and the host read this module. The kernel
(`frost/engines/common/length_check.py`) writes the OR of the bits of every rule any batch entry breaks into
an int32 flag the caller owns; `host_flag` computes the same flag from host values (the reference engine).
"""

from __future__ import annotations

from typing import Literal

from frost.engines.params import TemplateParams
from frost.errors import TemplateParamsError

LENGTH_NEGATIVE = 1
LENGTH_ABOVE_MAX = 2
PREFIX_SUMS_DECREASE = 4
OFFSET_OUTSIDE = 8
OFFSET_PLUS_LENGTH_OUTSIDE = 16
OFFSET_NOT_WHOLE_TOKEN = 32

RULES = {
    LENGTH_NEGATIVE: "a length is negative",
    LENGTH_ABOVE_MAX: "a length is above its maximum (S, max_seq_len or the tokens after its start)",
    PREFIX_SUMS_DECREASE: "cu_seq_len decreases",
    OFFSET_OUTSIDE: "a first token (cu_seq_len or a ragged offset) lies outside [0, T]",
    OFFSET_PLUS_LENGTH_OUTSIDE: "a ragged offset plus its length passes the token envelope T",
    OFFSET_NOT_WHOLE_TOKEN: "a ragged offset is not a whole number of tokens",
}


def length_check_errors(flag: int) -> list[str]:
    """The rules a length-check flag reports, in bit order (empty for 0)."""
    return [text for bit, text in RULES.items() if flag & bit]


class LengthCheckParams(TemplateParams):
    form: Literal["padded", "packed", "ragged"] = "padded"
    # ragged: one (side "q" | "kv", token stride, "int32" | "int64") per offset tensor, in argument order
    offsets: tuple[tuple[str, int, str], ...] = ()


def validate(p: LengthCheckParams) -> None:
    if (p.form == "ragged") != bool(p.offsets):
        raise TemplateParamsError("length check: offsets are the ragged form's, and it has at least one")
    for side, div, dtype in p.offsets:
        if side not in ("q", "kv") or div < 1 or dtype not in ("int32", "int64"):
            raise TemplateParamsError(f"length check: bad offset entry {(side, div, dtype)}")


def _length_bits(n: int, hi: int) -> int:
    return LENGTH_NEGATIVE if n < 0 else LENGTH_ABOVE_MAX if n > hi else 0


def host_flag(p: LengthCheckParams, lengths: dict, offsets: list, envelope: tuple) -> int:
    """The flag the kernel writes, from host lists: `lengths` {"q", "kv"} (padded and ragged: per-entry lengths;
    packed: prefix sums), `offsets` per `p.offsets`, `envelope` (env_q, env_kv, max_q, max_kv): padded S and
    unused maxima; packed T and max_seq_len; ragged T and min(S, max_seq_len)."""
    env = {"q": envelope[0], "kv": envelope[1]}
    most = {"q": envelope[2], "kv": envelope[3]}
    bits = 0
    for side in ("q", "kv"):
        vals = lengths[side]
        if p.form == "padded":
            for n in vals:
                bits |= _length_bits(n, env[side])
        elif p.form == "ragged":
            for n in vals:
                bits |= _length_bits(n, most[side])
        else:
            for b in range(len(vals) - 1):
                s, e = vals[b], vals[b + 1]
                if not (0 <= s <= env[side] and 0 <= e <= env[side]):
                    bits |= OFFSET_OUTSIDE
                elif e < s:
                    bits |= PREFIX_SUMS_DECREASE
                elif e - s > most[side]:
                    bits |= LENGTH_ABOVE_MAX
    for (side, div, _), offs in zip(p.offsets, offsets):
        for b, n in enumerate(lengths[side]):
            off = offs[b]
            if off % div:
                bits |= OFFSET_NOT_WHOLE_TOKEN
            elif not 0 <= off // div <= env[side]:
                bits |= OFFSET_OUTSIDE
            elif n >= 0 and off // div + n > env[side]:
                bits |= OFFSET_PLUS_LENGTH_OUTSIDE
    return bits
