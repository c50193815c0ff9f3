"""The SASS instructions of an ncu report that carry excess shared-memory wavefronts or the most stall samples.

    ncu -i report.ncu-rep --page source --csv --print-source sass > sass.csv
    python3 benchmarks/ncu_sass_hot.py sass.csv [--top 30]

ncu's source page lists every instruction of every profiled kernel with its per-instruction counters;
the whole listing is thousands of lines, so this keeps the lines that explain a profile: those with
excess shared wavefronts (bank conflicts), and the most-sampled stalls. Column names differ between
ncu versions, so columns are found by words in their names.
"""

from __future__ import annotations

import argparse
import csv
import sys


def _num(s: str) -> float:
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0


def _col(header: list[str], *words: str) -> int | None:
    for i, name in enumerate(header):
        low = name.lower()
        if all(w in low for w in words):
            return i
    return None


def _tables(lines: list[str]):
    """Split the CSV text into (kernel label, rows): ncu writes one table per profiled kernel."""
    label, block = "", []
    for ln in lines:
        if ln.startswith('"Kernel Name"'):
            if block:
                yield label, list(csv.reader(block))
                block = []
            label = ln.strip()
        elif ln.startswith('"Address"') or ln.startswith('"#"') or ln.startswith('"Source"'):
            if block:
                yield label, list(csv.reader(block))
            block = [ln]
        elif block and ln.startswith('"'):
            block.append(ln)
        elif ln.strip():
            if block:
                yield label, list(csv.reader(block))
                block = []
            label = ln.strip()
    if block:
        yield label, list(csv.reader(block))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args(argv)
    lines = open(a.csv, errors="replace").read().splitlines()
    found = False
    for label, rows in _tables(lines):
        if len(rows) < 2:
            continue
        header, body = rows[0], rows[1:]
        src = _col(header, "source")
        addr = _col(header, "address")
        exc = _col(header, "shared", "excessive")
        stall = _col(header, "stall", "all")
        execd = _col(header, "instructions executed")
        if src is None:
            continue
        found = True
        print(f"## {label or 'kernel'}  ({len(body)} instructions)")
        print("columns: " + " | ".join(header))

        def show(r):
            parts = [r[addr] if addr is not None else "", r[src].strip()]
            for name, c in (("excess", exc), ("stall", stall), ("exec", execd)):
                if c is not None and c < len(r):
                    parts.append(f"{name}={r[c]}")
            return "  ".join(parts)

        reasons = [(i, h) for i, h in enumerate(header) if h.startswith("stall_") and "Not Issued" not in h]

        def why(r):
            top = sorted(((_num(r[i]), h[6:]) for i, h in reasons if i < len(r)), reverse=True)[:3]
            return " ".join(f"{h}={v:.0f}" for v, h in top if v > 0)

        if exc is not None:
            hot = sorted((r for r in body if len(r) > exc and _num(r[exc]) > 0), key=lambda r: -_num(r[exc]))
            total = sum(_num(r[exc]) for r in body if len(r) > exc)
            print(f"### excess shared wavefronts: {total:.0f} over {len(hot)} instructions")
            for r in hot[: a.top]:
                print(show(r))
        if execd is not None:
            ops: dict[str, float] = {}
            for r in body:
                if len(r) > execd and _num(r[execd]) > 0:
                    words = r[src].split()
                    op = words[1] if words and words[0].startswith("@") and len(words) > 1 else (words or ["?"])[0]
                    ops[op] = ops.get(op, 0.0) + _num(r[execd])
            print("### warp instructions executed by opcode (top 30)")
            for op, n in sorted(ops.items(), key=lambda kv: -kv[1])[:30]:
                print(f"{op:40s} {n:14.0f}")
        if stall is not None:
            order = sorted(range(len(body)), key=lambda i: -_num(body[i][stall]) if len(body[i]) > stall else 0)
            print("### most stall samples (with the top stall reasons)")
            for i in order[: a.top]:
                print(show(body[i]) + "  " + why(body[i]))
            print("### around the five most-stalled instructions")
            for i in order[:5]:
                print("---")
                for j in range(max(0, i - 6), min(len(body), i + 3)):
                    print(("=> " if j == i else "   ") + show(body[j]) + "  " + why(body[j]))
    if not found:
        print("no source table found; the first lines of the file:")
        print("\n".join(lines[:20]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
