"""Ahead-of-time compile: `frost.precompile(...)` and the `frost precompile` command.

Fills the persistent cache (and this process's memo) for many kernels at once,
compiled in parallel worker processes, so that later plans are cache hits.
Accepts kernel specs ((template, params) pairs, KernelSpec, or their JSON form)
and graphs: for a graph, the engine that `build_plans` would pick on the target
supplies its specs (its adapter's `kernel_specs()` if it has one, else its
`template` and `template_params()`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
import time
from typing import Iterable, Optional

from frost.compiler import cache
from frost.compiler.compile import CompiledKernel, KernelSpec
from frost.compiler.workers import as_spec, compile_many
from frost.target import FAKE_TARGETS, Target, discover_target, fake_target

PROBE = "frost.engines.common.probe_copy"
_log = logging.getLogger(__name__)


def _graph_specs(graph, target: Target) -> list[KernelSpec]:
    from frost.errors import NotSupportedError
    from frost.lowering.lower import describe, rank

    if getattr(graph, "facts", None) is None:
        graph.validate()
    ranking = rank(graph.facts, target, getattr(graph, "_knobs", None))
    if not ranking.accepted:
        raise NotSupportedError(describe(graph.facts) + f" on {target.name}", ranking.declines)
    return [as_spec(s) for s in ranking.accepted[0][1].kernel_specs()]  # none for the reference engines


def specs_of(items: Iterable, target: Target) -> list[KernelSpec]:
    out: list[KernelSpec] = []
    for item in items:
        if hasattr(item, "node") and hasattr(item, "validate"):
            out += _graph_specs(item, target)
        else:
            out.append(as_spec(item))
    return out


def missing_kernels_extra() -> Optional[str]:
    """Why kernels cannot be compiled here (the CuTe DSL is missing or too old, with the extra to install), or None."""
    from frost.engines.dsl import dsl_decline_reason

    reason = dsl_decline_reason()
    return None if reason is None else f"compiling kernels {reason}"


def precompile(
    specs_or_graphs, target: Optional[Target | str] = None, *, max_workers: Optional[int] = None, progress=None
) -> list[CompiledKernel]:
    """Compile (or load from the cache) every kernel the specs or graphs need, in parallel.

    `target` defaults to this machine's GPU; pass a fake target (frost.target.fake_target)
    to fill a cache for another machine. Returns the kernels in spec order. `progress(name)`,
    if given, is called as each kernel is ready. Without the `kernels` extra this raises
    ImportError naming it (before any kernel is looked at).
    """
    if not isinstance(specs_or_graphs, (list, tuple)):
        specs_or_graphs = [specs_or_graphs]
    if target is None:
        target = discover_target()
        if target.is_cpu:
            raise ValueError("no GPU here: pass a target, e.g. frost.target.fake_target('H200')")
    rec = _record_of(target)
    if rec is None and any(not isinstance(x, (KernelSpec, tuple, list, dict)) for x in specs_or_graphs):
        raise ValueError(f"graphs need a Target record, not just an arch ({target!r})")
    specs = specs_of(specs_or_graphs, rec) if rec is not None else [as_spec(x) for x in specs_or_graphs]
    if specs and missing_kernels_extra():
        raise ImportError(missing_kernels_extra())
    kw = {"progress": progress} if progress is not None else {}
    return compile_many(specs, target, max_workers=max_workers, **kw)


def _progress_bar(total: int):
    """(callback, close) showing each kernel as it finishes: a tqdm bar on stderr, or a log line per kernel."""
    try:
        from tqdm.auto import tqdm
    except ImportError:

        def log(name: str) -> None:
            _log.info("compiled %s", name)

        return log, lambda: None
    bar = tqdm(total=total, unit="kernel", desc="frost precompile", file=sys.stderr)

    def step(name: str) -> None:
        bar.set_postfix_str(name, refresh=False)
        bar.update(1)

    return step, bar.close


def _load_spec_file(path: str) -> list:
    text = open(path).read().strip()
    if text.startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _record_of(target: Target | str) -> Optional[Target]:
    """The Target record of a record or an arch string (a fake target's), or None."""
    if isinstance(target, Target):
        return target
    return next((t for t in FAKE_TARGETS.values() if t.arch == target), None)


def _load_from(ref: str, target: Target) -> list:
    """The specs or graphs MODULE:ATTR names: a callable(target) or a value; a lone spec or graph counts as one."""
    mod, _, attr = ref.partition(":")
    obj = getattr(importlib.import_module(mod), attr or "kernel_specs")
    got = obj(target) if callable(obj) else obj
    lone = isinstance(got, (KernelSpec, dict)) or (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], str))
    return [got] if lone or not hasattr(got, "__iter__") else list(got)


def _target_of(args) -> Target | str:
    if args.target == "auto":
        t = discover_target()
        if t.is_cpu and not args.arch:
            raise SystemExit(f"frost precompile: no GPU here; pass --target {'|'.join(FAKE_TARGETS)} or --arch sm_XX")
    else:
        t = fake_target(args.target)
    return args.arch or t


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="frost precompile", description="Compile kernels into the persistent cache, in parallel workers."
    )
    p.add_argument(
        "--spec-file", action="append", default=[], help="JSON list (or JSON lines) of {template, params_type, params}"
    )
    p.add_argument(
        "--from",
        dest="sources",
        action="append",
        default=[],
        metavar="MODULE:ATTR",
        help="a callable(target) or iterable giving specs or graphs",
    )
    p.add_argument("--probe", action="store_true", help="compile the probe copy kernels (smoke check)")
    p.add_argument("--target", default="auto", help=f"auto (this GPU) or a fake target: {', '.join(FAKE_TARGETS)}")
    p.add_argument("--arch", default=None, help="compile for this arch string instead (e.g. sm_90a)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: one per CPU)")
    p.add_argument("--info", action="store_true", help="print where the cache is and what it holds")
    p.add_argument("--prune", action="store_true", help="apply the size cap now")
    p.add_argument("--clear", action="store_true", help="delete every cached artifact")
    p.add_argument("--json", action="store_true", help="print results as JSON")
    p.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="no progress bar (by default one on stderr, a kernel at a time as each finishes)",
    )
    args = p.parse_args(argv)

    if args.clear:
        cache.clear()
    if args.prune:
        print(f"evicted {cache.prune()} entries")
    work = args.probe or args.spec_file or args.sources
    if work and missing_kernels_extra():
        _log.error("frost precompile: %s", missing_kernels_extra())
        return 2
    if work:
        target = _target_of(args)
        rec = _record_of(target)
        items: list = []
        if args.probe:
            from frost.engines.common.probe_copy_params import ProbeCopyParams

            items += [KernelSpec(PROBE, ProbeCopyParams(dtype=d)) for d in ("f16", "bf16", "f32")]
        for f in args.spec_file:
            items += _load_spec_file(f)
        for ref in args.sources:
            items += _load_from(ref, rec)
        t0 = time.perf_counter()
        if rec is not None:
            items = specs_of(items, rec)  # graphs become their engine's specs, so the bar knows the total
        distinct = len({json.dumps(as_spec(x).to_json(), sort_keys=True) for x in items})
        step, close = _progress_bar(distinct) if args.progress else (None, lambda: None)
        try:
            kernels = precompile(items, target, max_workers=args.workers, progress=step)
        finally:
            close()
        wall = time.perf_counter() - t0
        rows = [
            {
                "name": k.name,
                "arch": k.arch,
                "source": k.source,
                "compile_s": round(k.compile_seconds, 3),
                "load_s": round(k.load_seconds, 4),
                "digest": k.digest,
            }
            for k in kernels
        ]
        if args.json:
            print(json.dumps({"kernels": rows, "wall_s": wall, "stats": cache.stats()}, indent=1))
        else:
            for r in rows:
                print(
                    f"{r['name']:<56} {r['arch']:<8} {r['source']:<8} compile {r['compile_s']:>7.3f}s "
                    f"load {r['load_s']:>7.4f}s"
                )
            s = cache.stats()
            print(
                f"{len(rows)} kernels in {wall:.2f}s: {s['compiles']} compiled here, {s['worker_compiles']} "
                f"by workers, {s['hits']} loaded from {cache.cache_dir()}"
            )
    if args.info or not (work or args.clear or args.prune):
        print(json.dumps(cache.describe(), indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
