"""Parallel compile in worker processes that never touch CUDA.

`compile_many` sends the keys that neither this process's memo nor the disk
cache holds to a spawn-context process pool. Each worker gets the parent's
Target record (it never discovers one), hides every GPU
(CUDA_VISIBLE_DEVICES=""), pins the DSL's notion of the arch (CUTE_DSL_ARCH,
so the DSL does not probe a device), compiles and exports into the shared
cache. The parent then loads every artifact from the cache, so what it gets is
exactly what a later process will get. Anything a worker could not do (a
template error, an uncacheable kernel, a crashed pool) is redone in the parent,
where its error surfaces normally.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Callable, Iterable, Optional

from frost.compiler import cache
from frost.compiler.compile import CompiledKernel, KernelSpec, _arch_of, compile_kernel, compile_key, memo_has, publish
from frost.compiler.fingerprint import full_key
from frost.engines.params import TemplateParams
from frost.target import Target

_target: Optional[Target] = None  # in a worker: the parent's Target record (worker_facts reports it)


def as_spec(item) -> KernelSpec:
    if isinstance(item, KernelSpec):
        return item
    if isinstance(item, dict):
        return KernelSpec.from_json(item)
    if (
        isinstance(item, (tuple, list))
        and len(item) == 2
        and isinstance(item[0], str)
        and isinstance(item[1], TemplateParams)
    ):
        return KernelSpec(item[0], item[1])
    raise TypeError(f"not a kernel spec: {item!r}; expected KernelSpec, (template, params) or its JSON form")


def _init_worker(target_json: Optional[dict], arch: str, cache_root: str) -> None:
    global _target
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["CUTE_DSL_ARCH"] = arch
    os.environ["FROST_CACHE_DIR"] = cache_root
    _target = Target.model_validate(target_json) if target_json else None


def _compile_in_worker(spec_json: dict, arch: str) -> dict:
    spec = KernelSpec.from_json(spec_json)
    ck = publish(spec.template, spec.params, arch, load=False)
    return {
        "ok": ck is not None,
        "name": ck.name if ck else None,
        "source": ck.source if ck else None,
        "digest": ck.digest if ck else None,
    }


@contextlib.contextmanager
def _main_hidden():
    """Keep spawned workers from re-running the caller's main script.

    A spawn child re-imports `__main__` from its `__spec__` or `__file__`: in a user's
    training script without an `if __name__ == "__main__"` guard that would run the
    script again. Workers only need frost, so both are hidden while workers start.
    """
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__spec__", "__file__") if main is not None and k in main.__dict__}
    try:
        if main is not None:
            main.__dict__.pop("__file__", None)
            main.__dict__["__spec__"] = None
        yield
    finally:
        if main is not None:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


def _pool(n: int, target: Target | str):
    """A spawn-context pool (imported here: a warm plan never starts one)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    target_json = target.model_dump() if isinstance(target, Target) else None
    return ProcessPoolExecutor(
        max_workers=n,
        mp_context=mp.get_context("spawn"),
        initializer=_init_worker,
        initargs=(target_json, _arch_of(target), str(cache.cache_dir())),
    )


def default_workers() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        cpus = os.cpu_count() or 1
    return max(1, cpus)


def compile_many(
    specs: Iterable,
    target: Target | str,
    max_workers: Optional[int] = None,
    progress: Optional[Callable[[str], None]] = None,
) -> list[CompiledKernel]:
    """Compile every spec (KernelSpec or (template, params)); results in input order.

    Keys already in memory or on disk are not recompiled. Workers compile when two or
    more keys need it; with the disk layer off (FROST_CACHE_DISABLE=1) everything
    compiles here, one after another. `progress(name)` is called once per distinct
    kernel as it becomes ready (a worker's as that worker finishes it).
    """
    specs = [as_spec(s) for s in specs]
    arch = _arch_of(target)
    dc = cache.disk()
    todo: dict[tuple, KernelSpec] = {}
    for s in specs:
        k = compile_key(s.template, s.params, arch)
        if k in todo or memo_has(s.template, s.params, arch):
            continue
        if dc is not None and dc.lookup(full_key(s.template, s.params, arch))[0] is not None:
            continue
        todo[k] = s
    n = min(len(todo), max_workers or default_workers())
    reported: set = set()
    if dc is not None and len(todo) >= 2 and n >= 2:
        keys = list(todo)

        def done(i: int, name: str) -> None:
            reported.add(keys[i])
            if progress is not None:
                progress(name)

        run_in_workers(list(todo.values()), target, n, on_done=done)
    out = []
    for s in specs:
        out.append(compile_kernel(s.template, s.params, target))
        k = compile_key(s.template, s.params, arch)
        if k not in reported:
            reported.add(k)
            if progress is not None:
                progress(out[-1].name)
    return out


def run_in_workers(
    specs: list[KernelSpec], target: Target | str, n: int, on_done: Optional[Callable[[int, str], None]] = None
) -> None:
    """Compile and export `specs` in `n` workers; what failed there the caller redoes in this process.
    `on_done(index, kernel name)` is called as each worker finishes a spec, in the order they finish."""
    from concurrent.futures import as_completed
    from concurrent.futures.process import BrokenProcessPool

    arch = _arch_of(target)
    out: list[Optional[dict]] = [None] * len(specs)
    try:
        with _pool(n, target) as pool:
            with _main_hidden():  # processes start at the first submits
                futures = {pool.submit(_compile_in_worker, s.to_json(), arch): i for i, s in enumerate(specs)}
            for f in as_completed(futures):
                i = futures[f]
                try:
                    out[i] = f.result()
                except BrokenProcessPool:
                    raise
                except Exception as e:  # the parent redoes it and raises it properly
                    cache.warn(f"worker could not compile {specs[i].template} ({type(e).__name__}: {e})")
                    continue
                if on_done is not None and out[i]["ok"]:
                    on_done(i, out[i]["name"])
    except BrokenProcessPool as e:
        cache.warn(f"compile worker pool broke ({e}); compiling the rest in this process")
    done = sum(1 for r in out if r and r["ok"] and r["source"] == "compile")
    cache.bump(worker_compiles=done)


def _worker_facts(spec_json: Optional[dict], arch: str) -> dict:
    """What a worker sees of CUDA, after compiling `spec_json` if given."""
    compiled = _compile_in_worker(spec_json, arch) if spec_json else None
    facts = {
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "compiled": compiled,
        "target": _target.model_dump() if _target else None,
        "pid": os.getpid(),
    }
    torch = sys.modules.get("torch")
    facts["torch_cuda_initialized_after_compile"] = bool(torch and torch.cuda.is_initialized())
    try:
        import cuda.bindings.driver as drv

        err = drv.cuInit(0)[0]
        facts["cuInit"] = getattr(err, "name", str(err))
    except Exception as e:  # no driver library at all
        facts["cuInit"] = f"{type(e).__name__}: {e}"
    try:
        import torch as _torch

        facts["torch_cuda_device_count"] = _torch.cuda.device_count()
    except Exception as e:  # pragma: no cover
        facts["torch_cuda_device_count"] = f"{type(e).__name__}: {e}"
    return facts


def worker_facts(target: Target | str, spec: Optional[KernelSpec] = None) -> dict:
    """Run one worker like compile_many's and report its CUDA view (diagnostics, tests)."""
    with _pool(1, target) as pool, _main_hidden():
        return pool.submit(_worker_facts, spec.to_json() if spec else None, _arch_of(target)).result()
