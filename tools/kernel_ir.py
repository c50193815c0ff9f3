"""Dump and compare the MLIR of frost's covering kernels, on the CPU, to check kernel refactors.

    python tools/kernel_ir.py dump /tmp/ir-before            # on the commit before the change
    python tools/kernel_ir.py dump /tmp/ir-after             # on the change
    python tools/kernel_ir.py diff /tmp/ir-before /tmp/ir-after

`dump` compiles every kernel of the covering sets in frost/testing/cases.py (the SM80 and SM120
forwards, the backward chains, the SM90 forward and backward, then the mma.sync head-dim sets, the
SM90 backward above d=128, cuDNN's ragged-offset form, the score modifiers, the SM90 forward's
padded and wide head dims, the SM90 backward's other head dims, the SM90 forward's score modifiers, the
mma.sync forward's block masks, cuDNN's ragged-offset form with an offset tensor per tensor, the
deterministic dBias, the SM90 backward's packed fragment-order dQ, the SM90 forward's column slices of O, the
mma.sync backward's K and V head counts that do not nest, the SM90 forward's block_mask, the SM90
backward's rows warp on named barriers, the SM90 forward's block skipping and the SM90 backward's score
modifiers, the mma.sync and wgmma forwards' paged K/V caches, the wgmma forward's split-KV, both forwards'
split-KV over packed batches)
through frost's compile boundary, with the disk cache off, and writes each one's MLIR (host entry and device code)
with source locations stripped, one file per kernel (`--lengths only` / `without`: the kernels that read sequence
lengths from the device, or the others; `--template`: one template's kernels). `--jobs` spreads the compiles
over processes. `diff` sorts each kernel into: identical; reordered (every value is
defined by the same op on the same operands, only independent ops moved, and the lines
that define nothing, such as stores, barriers and region ends, keep their order); or
different (the change needs a GPU run to be trusted).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's frost, whatever else is installed
_LOC = re.compile(r"\s*loc\((?:[^()]|\([^()]*\))*\)")


def covering_specs() -> list:
    """(template, params, arch) of every kernel the CPU compile tests build."""
    from frost.engines.sdpa_bwd.chain import chain_of
    from frost.engines.sm80.sdpa_bwd_params import Sm80BwdParams
    from frost.engines.sm80.sdpa_fwd_params import Sm80FwdParams
    from frost.engines.sm90.sdpa_bwd_params import Sm90BwdParams
    from frost.engines.sm90.sdpa_fwd_params import Sm90FwdParams
    from frost.testing import cases

    fwd80, bwd80 = (cases.SM80_FWD_TEMPLATE, Sm80FwdParams), (None, Sm80BwdParams)  # None: the whole chain
    fwd90, bwd90 = (cases.SM90_FWD_TEMPLATE, Sm90FwdParams), (cases.SM90_BWD_TEMPLATE, Sm90BwdParams)
    # (template, params class, cover) in file-name order; a cover is {arch: [kwargs]} or, for sm_90a, a list of
    # kwargs or of groups of them. The SM90 backward entries are its main kernel (its helpers are the
    # skeleton's, covered by the chains). Each set added later comes after the earlier ones, so their kernels
    # keep their file names: the mma.sync head-dim sets, the SM90 backward above d=128, cuDNN's ragged-offset
    # form, the score-modifier sets, the SM90 forward's padded and wide head dims, the SM90 backward's other
    # head dims, the SM90 forward's score modifiers, the block masks, cuDNN's ragged form with an offset tensor
    # per tensor, the deterministic dBias, the SM90 backward's packed fragment-order dQ, the SM90 forward's
    # column slices of O (d_v above 256), K and V head counts that do not nest in the mma.sync backward, then the
    # SM90 forward's block_mask, then the SM90 backward's rows warp on named barriers, then the SM90 forward's
    # block skipping and the SM90 backward's score modifiers, then the mma.sync and wgmma forwards' paged K/V caches,
    # then the wgmma forward's split-KV, then both forwards' split-KV over packed batches.
    entries = [
        (*fwd80, cases.SM80_FWD_COVER),
        (*bwd80, cases.SM80_BWD_COVER),
        (*fwd90, cases.SM90_FWD_COVER),
        (*bwd90, cases.SM90_BWD_COVER),
        (*fwd80, cases.SM80_FWD_HEAD_DIM_COVER),
        (*bwd80, cases.SM80_BWD_HEAD_DIM_COVER),
        (*bwd90, cases.SM90_BWD_WIDE_COVER),
        (*fwd80, cases.RAGGED_MMA_FWD_COVER),
        (*bwd80, cases.RAGGED_MMA_BWD_COVER),
        (*fwd90, cases.RAGGED_SM90_FWD_COVER),
        (*bwd90, cases.RAGGED_SM90_BWD_COVER),
        (*fwd80, cases.SM80_FWD_SCORE_MOD_COVER),
        (*bwd80, cases.SM80_BWD_SCORE_MOD_COVER),
        (*fwd90, cases.SM90_FWD_HEAD_DIM_COVER),
        (*bwd90, cases.SM90_BWD_HEAD_DIM_COVER),
        (*fwd90, cases.SM90_FWD_SCORE_MOD_COVER),
        (*fwd80, cases.SM80_FWD_BLOCK_MASK_COVER),
        (*fwd80, cases.RAGGED_OWN_MMA_FWD_COVER),
        (*bwd80, cases.RAGGED_OWN_MMA_BWD_COVER),
        (*fwd90, cases.RAGGED_OWN_SM90_FWD_COVER),
        (*bwd90, cases.RAGGED_OWN_SM90_BWD_COVER),
        (*bwd80, cases.DET_DBIAS_MMA_BWD_COVER),
        (*bwd90, cases.SM90_BWD_PACKED_FRAGMENT_COVER),
        (*fwd90, cases.SM90_FWD_WIDE_V_COVER),
        (*bwd80, cases.SM80_BWD_UNNESTED_COVER),
        (*fwd90, cases.SM90_FWD_BLOCK_MASK_COVER),
        (*bwd90, cases.SM90_BWD_ROWS_BARRIER_COVER),
        (*fwd90, cases.SM90_FWD_BLOCK_SKIP_COVER),
        (*bwd90, cases.SM90_BWD_SCORE_MOD_COVER),
        (*fwd80, cases.SM80_FWD_PAGED_COVER),
        (*fwd90, cases.SM90_FWD_PAGED_COVER),
        (*fwd90, cases.SM90_FWD_SPLIT_COVER),
        (*fwd80, cases.SM80_FWD_SPLIT_THD_COVER),
        (*fwd90, cases.SM90_FWD_SPLIT_THD_COVER),
    ]
    specs = []
    for template, params_cls, cover in entries:
        for arch, kw in _cover_items(cover):
            p = params_cls(**kw)
            if template is None:
                specs += [(t, sp, arch) for _, t, _, sp in chain_of(p)]
            else:
                specs.append((template, p, arch))
    return specs


def _cover_items(cover) -> list:
    """(arch, kwargs) of a covering set: {arch: [kwargs]}, or sm_90a's kwargs, flat or in groups."""
    if isinstance(cover, dict):
        return [(arch, kw) for arch, kws in cover.items() for kw in kws]
    return [("sm_90a", kw) for item in cover for kw in ([item] if isinstance(item, dict) else item)]


def strip_locations(mlir: str) -> str:
    text = _LOC.sub("", mlir)
    return "\n".join(line for line in text.splitlines() if not line.startswith("#loc"))


def has_lengths(params) -> bool:
    """Whether a kernel reads sequence lengths or offsets from the device (docs/lengths.md)."""
    return bool(getattr(params, "is_thd", False) or getattr(params, "has_seqused", False))


def dump_part(out: Path, part: int, parts: int, lengths: str = "all", template: str = "") -> int:
    import tempfile

    os.environ["FROST_CACHE_DISABLE"] = "1"
    os.environ["CUTE_DSL_KEEP"] = "ir"
    os.environ["CUTE_DSL_DUMP_DIR"] = tempfile.mkdtemp(prefix="frost-kernel-ir-")  # the DSL's own copies
    from frost.compiler import compile as boundary

    if not Path(boundary.__file__).resolve().is_relative_to(ROOT):
        raise SystemExit(f"imported frost from {boundary.__file__}, not from {ROOT}")
    out.mkdir(parents=True, exist_ok=True)
    specs = covering_specs()
    keep = {"all": lambda p: True, "only": has_lengths, "without": lambda p: not has_lengths(p)}[lengths]
    chosen = [i for i, (t, params, _) in enumerate(specs) if keep(params) and (not template or t == template)]
    for i, (template, params, arch) in enumerate(specs):
        if i not in chosen or chosen.index(i) % parts != part:
            continue
        name, jit_fn, fake_args, symbol_for = boundary._build(template, params, arch)
        compiled, _, _ = boundary._compile(name, jit_fn, fake_args, symbol_for, arch, engine=True)
        if not compiled.__mlir__:  # the DSL keeps it only under CUTE_DSL_KEEP=ir: an empty dump proves nothing
            raise SystemExit(f"{name}: the compile kept no MLIR")
        (out / f"{i:02d}_{name}.mlir").write_text(strip_locations(compiled.__mlir__))
    return len(specs)


def dump(out: Path, jobs: int, lengths: str = "all", template: str = "") -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "_part", str(out), str(j), str(jobs), lengths, template], cwd=str(ROOT)
        )
        for j in range(jobs)
    ]
    if any(p.wait() != 0 for p in procs):
        raise SystemExit("a dump worker failed")
    print(f"{len(list(out.glob('*.mlir')))} kernels in {out}")


_REF = re.compile(r"%[\w#.-]+")
_DEF = re.compile(r"^\s*((?:%[\w#.-]+(?::\d+)?\s*,\s*)*%[\w#.-]+(?::\d+)?)\s*=\s*(.*)$")


def _dataflow(text: str):
    """(bag of value-defining ops, sequence of the other lines), names replaced by value numbers.

    A value's number is its defining op with its operands' numbers (and the op's occurrence), so
    which value feeds which op is kept while SSA names and the order of independent ops are not.
    Lines that define nothing (stores, barriers, yields, region braces) keep their order.
    """
    numbers: dict[str, str] = {}
    seen: dict[str, int] = {}
    defs: dict[str, int] = {}
    effects: list[str] = []
    for line in text.splitlines():
        m = _DEF.match(line)
        lhs, rhs = (m.group(1), m.group(2)) if m else (None, line)
        body = _REF.sub(lambda r: numbers.get(r.group(0), r.group(0)), rhs.strip())
        if lhs is None:
            effects.append(body)
            continue
        seen[body] = seen.get(body, 0) + 1
        defs[body] = defs.get(body, 0) + 1
        tag = f"{hash(body) & 0xFFFFFFFFFFFF:x}.{seen[body]}"
        for i, name in enumerate(n.strip().split(":")[0] for n in lhs.split(",")):
            numbers[name] = f"%v{tag}.{i}"
    return defs, effects


def classify(before: str, after: str) -> str:
    """'identical', 'reordered' (the same ops feeding the same ops, independent ones moved, the
    ordered lines in the same order) or 'different'."""
    if before == after:
        return "identical"
    return "reordered" if _dataflow(before) == _dataflow(after) else "different"


def by_kernel(d: Path) -> dict:
    """A dump's files by kernel name: the covering-set index in front (`NN_`) dropped, so a kernel added or removed
    before another does not make every later one look new; a name dumped more than once (one kernel name for two
    archs) is numbered by its occurrence in covering-set order (`name#2`)."""
    index = re.compile(r"^(\d+)_")
    files = sorted(d.glob("*.mlir"), key=lambda f: (int(index.match(f.name)[1]) if index.match(f.name) else -1, f.name))
    out, seen = {}, {}
    for f in files:
        n = index.sub("", f.name)
        seen[n] = seen.get(n, 0) + 1
        out[n if seen[n] == 1 else f"{n}#{seen[n]}"] = f
    return out


def diff(a: Path, b: Path) -> int:
    fa, fb = by_kernel(a), by_kernel(b)
    worst = 0
    for name in sorted(fa.keys() | fb.keys()):
        pa, pb = fa.get(name, a / name), fb.get(name, b / name)
        if not (pa.exists() and pb.exists()):
            verdict = "only in " + (str(a) if pa.exists() else str(b))
        elif not (pa.stat().st_size and pb.stat().st_size):  # two empty dumps are not evidence of anything
            verdict = "empty"
        else:
            verdict = classify(pa.read_text(), pb.read_text())
        worst = max(worst, {"identical": 0, "reordered": 1}.get(verdict, 2))
        print(f"{verdict:>10}  {name}")
    print({0: "all identical", 1: "same operations (some reordered)", 2: "some kernels differ"}[worst])
    return worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump", help="compile the covering kernels and write their MLIR")
    d.add_argument("out", type=Path)
    d.add_argument("--jobs", type=int, default=max(1, min(8, os.cpu_count() or 1)))
    d.add_argument(
        "--lengths",
        choices=("all", "only", "without"),
        default="all",
        help="only the kernels that read lengths from the device, or only the others",
    )
    d.add_argument("--template", default="", help="only one template's kernels (a dotted module path)")
    c = sub.add_parser("diff", help="compare two dumps")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    w = sub.add_parser("_part")  # internal: one dump worker
    w.add_argument("out", type=Path)
    w.add_argument("part", type=int)
    w.add_argument("parts", type=int)
    w.add_argument("lengths", nargs="?", default="all")
    w.add_argument("template", nargs="?", default="")
    a = ap.parse_args(argv)
    if a.cmd == "dump":
        dump(a.out, a.jobs, a.lengths, a.template)
        return 0
    if a.cmd == "diff":
        return 0 if diff(a.a, a.b) < 2 else 1
    dump_part(a.out, a.part, a.parts, a.lengths, a.template)
    return 0


if __name__ == "__main__":
    sys.exit(main())
