"""Finds the length clamps (docs/lengths.md) in a kernel's MLIR: the structural check of the compile tests.

A kernel's device code reads integers from global memory only for sequence lengths and offsets
(`cu_seqlens_*`, `seqused_*`, ragged offsets; `frost/engines/common/seqlen.py` decodes them). Each such load
must reach the clamp before anything else uses it: every use of the loaded value (or of its quotient by a
token stride) is an `arith.minsi` whose result only an `arith.maxsi` takes, or the other way round
(`seqlen.clamp`: max(min(x, hi), lo)); a min or max that only happens to follow the load, next to other uses of
the raw value (a mask's band), does not count. `unclamped_loads` names the
loads that do not, so a new read of a length that skips the decoder fails the compile tests.
"""

from __future__ import annotations

import re

_KERNEL = re.compile(r"^(\s*)(?:cuda\.kernel|gpu\.func)\s+@(\w+)")
_LOAD = re.compile(r"^\s*(%[\w.#-]+)\s*=\s*cute\.memref\.load\((%[\w.#-]+),.*:\s*\(!memref_gmem_i(?:32|64)(?:_\d+)?\b")
_DEF = re.compile(r"^\s*(%[\w.#-]+)\s*=\s*([\w.]+)\s*(.*)$")
_REF = re.compile(r"%[\w.#-]+")
#: ops a length passes through on its way to the clamp: a token stride's division (cuDNN's element offsets)
_THROUGH = {"arith.floordivsi", "arith.divsi"}


def kernel_bodies(mlir: str) -> dict[str, list[str]]:
    """{device kernel name: its body's lines} of an MLIR module (the host entry is left out)."""
    out: dict[str, list[str]] = {}
    lines = mlir.splitlines()
    i = 0
    while i < len(lines):
        m = _KERNEL.match(lines[i])
        if not m:
            i += 1
            continue
        indent, name, body = len(m.group(1)), m.group(2), []
        i += 1
        while i < len(lines) and not (lines[i].strip() == "}" and len(lines[i]) - len(lines[i].lstrip()) == indent):
            body.append(lines[i])
            i += 1
        out[name] = body
    return out


def _parse(body: list[str]) -> list[tuple[int, str | None, str, list[str]]]:
    """Per line: (region depth at its start, value it defines or None, op, values it uses)."""
    out, depth = [], 0
    for line in body:
        d = _DEF.match(line)
        if d:
            res, op, refs = d.group(1), d.group(2), _REF.findall(d.group(3))
        else:  # stores, yields, branches, region ends: they use values too
            res, op, refs = None, line.strip().split(" ")[0], _REF.findall(line)
        closes = line.lstrip().startswith("}")  # a region's end ("}" or "} else {") belongs to the one outside
        out.append((depth - closes, res, op, [r.split("#")[0] for r in refs]))
        depth += line.count("{") - line.count("}")
    return out


def _users(lines, at: int) -> list[tuple[int, str]]:
    """(line, op) of every use of the value line `at` defines, within its scope: MLIR reuses a name in sibling
    regions, so the search ends where the region holding the definition does."""
    depth, value = lines[at][0], lines[at][1]
    out = []
    for j in range(at + 1, len(lines)):
        if lines[j][0] < depth:
            break
        if value in lines[j][3]:
            out.append((j, lines[j][2]))
    return out


def _clamped(lines, at: int) -> bool:
    """Whether every use of the value line `at` defines is the clamp: through a token stride's division first,
    then min (max) whose only uses are a max (min)."""
    users = _users(lines, at)
    if users and all(op in _THROUGH for _, op in users):
        return all(_clamped(lines, j) for j, _ in users)
    if not users or any(op not in ("arith.minsi", "arith.maxsi") for _, op in users):
        return False
    other = {"arith.minsi": "arith.maxsi", "arith.maxsi": "arith.minsi"}
    return all((second := _users(lines, j)) and all(o == other[op] for _, o in second) for j, op in users)


def length_loads(body: list[str]) -> list[tuple[str, bool]]:
    """(loaded value, clamped?) of every integer load from global memory in one kernel body."""
    lines = _parse(body)
    return [(lines[i][1], _clamped(lines, i)) for i, line in enumerate(body) if _LOAD.match(line)]


def unclamped_loads(mlir: str) -> dict[str, list[str]]:
    """{kernel: the values it loads from global integer memory without clamping them}, kernels with none left out."""
    out = {}
    for name, body in kernel_bodies(mlir).items():
        bad = [v for v, ok in length_loads(body) if not ok]
        if bad:
            out[name] = bad
    return out


def count_length_loads(mlir: str) -> int:
    """Integer loads from global memory across the module's kernels (0: a kernel without device lengths)."""
    return sum(len(length_loads(body)) for body in kernel_bodies(mlir).values())
