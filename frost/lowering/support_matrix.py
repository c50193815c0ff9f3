"""The README's support matrix, written from the capability rows so that the two cannot drift apart.

`python -m frost.lowering.support_matrix` rewrites the block between the README's markers;
`--check` exits 1 when the README's block differs (test/cpu/test_support_matrix.py runs the same comparison).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from frost.engines.params import HeadDimSpan
from frost.lowering.capabilities import ROWS, CapabilityRow

BEGIN = "<!-- support-matrix:begin (python -m frost.lowering.support_matrix rewrites this block) -->"
END = "<!-- support-matrix:end -->"

#: (matrix row, the capability-row features it needs: all of them for a tick)
FEATURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "causal masks, sliding windows (top-left, bottom-right)",
        ("causal", "window_left", "window_right", "bottom_right"),
    ),
    ("GQA / MQA", ("gqa",)),
    ("K and V head counts apart", ("split_kv_heads", "unnested_kv_heads")),
    ("padding mask (`seq_len_q/kv`)", ("padding",)),
    ("packed THD (`cu_seq_len_q/kv`)", ("thd",)),
    ("cuDNN's ragged offsets", ("ragged_offsets",)),
    ("sinks (`sink_token`, `dSink_token`)", ("sinks",)),
    ("`bias`", ("bias",)),
    ("`dBias`", ("dbias",)),
    ("ALiBi", ("alibi",)),
    ("`block_mask`", ("block_mask",)),
    ("dropout", ("dropout",)),
    ("dropout mask dump (`rng_dump`)", ("rng_dump",)),
    ("paged K/V cache (`paged_attention_*`)", ("paged_attention",)),
    ("deterministic backward", ("deterministic",)),
    ("`score_max` / `score_sum_exp`", ("score_max", "score_sum_exp")),
)


#: row features the matrix does not show, and why (every other feature of a row must have a matrix row: the test
#: checks it, so a feature added to the rows reaches the README)
NOT_SHOWN = {
    "stats": "every engine serves Stats on or off (said above the matrix)",
    "stats_per_batch": "a layout of Stats in cuDNN's ragged form, part of the ragged-offsets row",
}
#: features one direction has: the other direction's row may list them (rows share feature sets), never serves them
ONE_DIRECTION = {
    "dbias": "bwd",
    "deterministic": "bwd",
    "block_mask": "fwd",
    "score_max": "fwd",
    "paged_attention": "fwd",
}


def _line(row: CapabilityRow) -> str:
    """The arch line a row belongs to: its name without the direction."""
    return row.name.replace("SdpaFwd", "").replace("SdpaBwd", "")


def _cc(row: CapabilityRow) -> str:
    if row.serves_cpu:
        return "any (CPU; GPU by name)"
    lo, hi = row.cc_min, row.cc_max
    if lo == hi:
        return f"{lo[0]}.{lo[1]}"
    if lo[0] == hi[0]:
        return f"{lo[0]}.x"
    return f"{lo[0]}.{lo[1]}-{hi[0]}.{hi[1]}"


def _head_dims(row: CapabilityRow) -> str:
    hd = row.head_dims
    if hd is None:
        return "any" if row.serves_cpu else "cuDNN's rules"
    if isinstance(hd, HeadDimSpan):
        return f"multiples of {hd.multiple} to {hd.maximum}"
    return ", ".join(str(a) if a == b else f"{a}x{b}" for a, b in hd)


def _both(fwd: CapabilityRow | None, bwd: CapabilityRow | None, what) -> str:
    """One cell for a line's two rows: the value once where both agree, else each with its direction."""
    vals = [(d, what(r)) for d, r in (("fwd", fwd), ("bwd", bwd)) if r is not None]
    if len({v for _, v in vals}) == 1:
        return vals[0][1]
    return "; ".join(f"{d}: {v}" for d, v in vals)


def _served(fwd: CapabilityRow | None, bwd: CapabilityRow | None, needs: tuple[str, ...]) -> str:
    only = ONE_DIRECTION.get(needs[0])
    dirs = [
        d
        for d, r in (("fwd", fwd), ("bwd", bwd))
        if r is not None and not r.pending and set(needs) <= r.features and only in (None, d)
    ]
    sizes = [
        r.paged_block_sizes for r in (fwd, bwd) if r is not None and "paged_attention" in needs and r.paged_block_sizes
    ]
    if dirs and sizes:  # a paged cache's block sizes, where the row serves only some
        return " + ".join(dirs) + f" (block sizes {', '.join(map(str, sizes[0]))})"
    return " + ".join(dirs) if dirs else "-"


def render(rows=ROWS) -> str:
    """The markdown block (markers included): one column per arch line (its forward and backward rows), in
    ranking order, one row per fact and feature."""
    lines_: dict[str, dict[str, CapabilityRow]] = {}
    for row in sorted(rows, key=lambda r: (r.priority, r.cc_min, r.name)):
        lines_.setdefault(_line(row), {})[row.direction] = row
    cols = list(lines_.values())
    head = [""] + [" / ".join(f"`{r.name}`" for r in (c.get("fwd"), c.get("bwd")) if r) for c in cols]
    out = [BEGIN, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def add(label, cell):
        out.append("| " + " | ".join([label] + [cell(c.get("fwd"), c.get("bwd")) for c in cols]) + " |")

    add("compute capability", lambda f, b: _both(f, b, _cc))
    add("state", lambda f, b: _both(f, b, lambda r: "not written yet" if r.pending else "serves"))
    add("dtypes", lambda f, b: _both(f, b, lambda r: ", ".join(r.dtypes)))
    add("head dims (d_qk, d_v each)", lambda f, b: _both(f, b, _head_dims))
    for label, needs in FEATURES:
        add(label, lambda f, b, needs=needs: _served(f, b, needs))
    out += [
        "",
        "Generated from `frost/lowering/capabilities.py` by `python -m frost.lowering.support_matrix`.",
        "",
        END,
    ]
    return "\n".join(out)


def readme_block(text: str) -> str:
    """The README's current block, markers included ('' when the markers are missing)."""
    i, j = text.find(BEGIN), text.find(END)
    return text[i : j + len(END)] if 0 <= i < j else ""


def rewrite(text: str, rows=ROWS) -> str:
    old = readme_block(text)
    if not old:
        raise ValueError(f"the README has no {BEGIN!r} ... {END!r} block")
    return text.replace(old, render(rows))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m frost.lowering.support_matrix", description=__doc__)
    ap.add_argument("--readme", default=str(Path(__file__).resolve().parents[2] / "README.md"))
    ap.add_argument("--check", action="store_true", help="exit 1 if the README's block is out of date")
    a = ap.parse_args(argv)
    path = Path(a.readme)
    text = path.read_text()
    new = rewrite(text)
    if a.check:
        if new != text:
            print(f"{path}: the support matrix is out of date; run python -m frost.lowering.support_matrix")
            return 1
        return 0
    if new != text:
        path.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
