"""The one compile boundary every frost kernel goes through.

A kernel template is a module (imported lazily by dotted path) that exposes

    kernel_name(params, arch) -> str            # frost_-prefixed, self-describing
    build(params, arch) -> (jit_fn, fake_args)  # a @cute.jit function and its
                                                # fake tensors / sym ints / fake stream
    kernel_symbol(params, arch, index, fn_name) # optional: names of 2nd.. kernels

`compile_kernel(template, params, target)` serves a key from, in order, this
process's memo, the persistent cache (frost.compiler.cache), or a compile. The
compile rejects real tensors, names the host entry and the GPU kernels after
`kernel_name` (frost.compiler.naming), compiles with TVM-FFI for the target's
arch, exports into the cache and loads the artifact back, so a kernel behaves
the same whether it was compiled here or loaded from disk: `fn` is the raw
TVM-FFI function and calls are positional.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
import threading
import time
from dataclasses import dataclass, field, is_dataclass
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, field_validator

from frost.compiler import cache
from frost.compiler.fingerprint import full_key
from frost.compiler.loader import loader_choice
from frost.compiler.naming import check_symbol, kernel_symbols
from frost.engines.params import TemplateParams
from frost.target import Target

_log = logging.getLogger(__name__)


@dataclass(eq=False)
class CompiledKernel:
    name: str
    template: str
    params: TemplateParams
    arch: str
    fn: Any
    compile_seconds: float = 0.0
    load_seconds: float = 0.0
    source: str = "compile"  # "compile" | "disk" (a memo hit returns the first object)
    digest: Optional[str] = None  # sha256 of the exported artifact (None when not persisted)
    path: Optional[str] = None
    kernel_symbols: list = field(default_factory=list)  # known when compiled in this process
    ptx: Optional[str] = None  # with CUTE_DSL_KEEP=ptx, when compiled in this process
    mlir: Optional[str] = None  # with CUTE_DSL_KEEP=ir, when compiled in this process with the disk layer off
    module: Any = field(default=None, repr=False)  # keeps a loaded artifact alive
    loader: Optional[str] = None  # "so" (TVM-FFI, linked library) | "o" (cute.runtime.load_module)
    artifact: Any = field(default=None, repr=False)  # adopted from a saved plan with the disk layer off

    def __call__(self, *args):
        return self.fn(*args)


OWN_MODULES = "frost.engines."  # where every kernel template and params type lives
_TEMPLATE_RE = r"^frost\.engines(\.[A-Za-z_][A-Za-z0-9_]*)+$"
_PARAMS_TYPE_RE = r"^frost\.engines(\.[A-Za-z_][A-Za-z0-9_]*)+:[A-Za-z_][A-Za-z0-9_]*$"


def own_template_name(v: str) -> str:
    """`v` when it names a module under frost.engines (a pydantic validator: raises ValueError otherwise)."""
    if not re.match(_TEMPLATE_RE, v):
        raise ValueError(f"{v!r} is not a frost kernel template module ({OWN_MODULES}<module>)")
    return v


def own_params_type_name(v: str) -> str:
    """`v` when it reads frost.engines.<module>:<Class> (a pydantic validator: raises ValueError otherwise)."""
    if not re.match(_PARAMS_TYPE_RE, v):
        raise ValueError(f"{v!r} is not a frost params type ({OWN_MODULES}<module>:<Class>)")
    return v


class KernelSpecRecord(BaseModel):
    """A kernel spec as JSON (a spec file, a saved plan, a worker's task). Only frost's own template
    modules and params types are named: reading one never imports another module."""

    model_config = ConfigDict(extra="forbid")

    template: str
    params_type: str
    params: dict

    _own_template = field_validator("template")(classmethod(lambda cls, v: own_template_name(v)))
    _own_params_type = field_validator("params_type")(classmethod(lambda cls, v: own_params_type_name(v)))


def own_params_type(params_type: str) -> type:
    """The TemplateParams subclass a validated `params_type` ("frost.engines.<module>:<Class>") names."""
    mod, _, qual = params_type.partition(":")
    obj: Any = getattr(importlib.import_module(mod), qual, None)
    if not (isinstance(obj, type) and issubclass(obj, TemplateParams)):
        raise ValueError(f"params_type {params_type!r} is not a frost TemplateParams class")
    return obj


@dataclass(frozen=True)
class KernelSpec:
    """One (template, params) to compile; serializable for worker processes and spec files."""

    template: str
    params: TemplateParams

    def to_json(self) -> dict:
        t = type(self.params)
        return {
            "template": self.template,
            "params_type": f"{t.__module__}:{t.__qualname__}",
            "params": self.params.model_dump(mode="json"),
        }

    @classmethod
    def from_json(cls, d) -> "KernelSpec":
        """Validate (`KernelSpecRecord`: errors name the field) and build; only frost's own modules load."""
        rec = KernelSpecRecord.model_validate(d)
        return cls(rec.template, own_params_type(rec.params_type).model_validate(rec.params))


_memo: dict[tuple, CompiledKernel] = {}
_names: dict[tuple, tuple] = {}
_lock = threading.RLock()
stats = cache.STATS  # live counters; frost.cache.stats() gives a snapshot


def load_template(template: str):
    return importlib.import_module(template)


def clear_memo() -> None:
    """Forget this process's compiled kernels (tests; the disk cache is untouched)."""
    with _lock:
        _memo.clear()
        _names.clear()


def _is_real_tensor(a) -> bool:
    t = type(a)
    mod = t.__module__ or ""
    if mod.startswith("torch") and t.__name__ in ("Tensor", "Parameter") or hasattr(a, "__dlpack__"):
        return True
    if mod.startswith("numpy") and t.__name__ == "ndarray":
        return True
    # a cute tensor made from real memory (from_dlpack) rather than a fake one
    return mod.startswith("cutlass") and t.__name__ == "_Tensor"


def _reject_real_tensors(args, where: str = "fake args") -> None:
    stack = [(where, args)]
    while stack:
        path, a = stack.pop()
        if _is_real_tensor(a):
            raise TypeError(
                f"a real tensor reached a compile key ({path}: {type(a).__module__}."
                f"{type(a).__qualname__}); kernels compile from fake tensors and symbolic extents only"
            )
        if isinstance(a, (list, tuple)):
            stack += [(f"{path}[{i}]", x) for i, x in enumerate(a)]
        elif isinstance(a, dict):
            stack += [(f"{path}[{k!r}]", x) for k, x in a.items()]


def compile_key(template: str, params: TemplateParams, arch: str) -> tuple:
    """The in-process memo key (the disk key adds the fingerprint and the template's source digest)."""
    return (template, f"{type(params).__module__}:{type(params).__qualname__}", params.key(), arch)


def _arch_of(target: Target | str) -> str:
    return target if isinstance(target, str) else target.arch


def _persistable(jit_fn, fake_args) -> bool:
    """Can the raw TVM-FFI function stand in for the DSL's Python wrapper? (no defaults,
    keyword-only or variadic parameters, no dataclass arguments)"""
    try:
        sig = inspect.signature(jit_fn)
    except (TypeError, ValueError):
        return False
    for p in sig.parameters.values():
        if p.default is not inspect.Parameter.empty or p.kind not in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            return False
    return not any(is_dataclass(a) and not isinstance(a, type) for a in fake_args)


def _raw_function(compiled):
    """The positional TVM-FFI function of a fresh compile (None without a JIT engine)."""
    getter = getattr(compiled, "__tvm_ffi_object__", None)
    raw = getter() if getter is not None else None
    if raw is None and getattr(compiled, "engine", None) is not None:
        raw = compiled
    if raw is not None and getattr(getattr(compiled, "execution_args", None), "has_pointer_address_arg_specs", False):
        return None
    return raw


def _ptx_of(compiled) -> Optional[str]:
    try:
        ptx = compiled.__ptx__
    except Exception:
        return None
    return ptx if isinstance(ptx, str) and ".entry" in ptx else None


def _mlir_of(compiled) -> Optional[str]:
    try:
        mlir = compiled.__mlir__
    except Exception:
        return None
    return mlir if isinstance(mlir, str) and mlir else None


def _build(template: str, params: TemplateParams, arch: str):
    _reject_real_tensors(params.model_dump(), "params")
    mod = load_template(template)
    name = check_symbol(mod.kernel_name(params, arch))
    jit_fn, fake_args = mod.build(params, arch)
    _reject_real_tensors(fake_args)
    hook = getattr(mod, "kernel_symbol", None)
    symbol_for = (lambda i, fn: hook(params, arch, i, fn)) if hook is not None else None
    return name, jit_fn, tuple(fake_args), symbol_for


def _compile(name, jit_fn, fake_args, symbol_for, arch: str, engine: bool):
    import cutlass.cute as cute

    t0 = time.perf_counter()
    with kernel_symbols(jit_fn, name, symbol_for) as symbols:
        compiled = cute.compile(
            jit_fn, *fake_args, options=f"--enable-tvm-ffi --gpu-arch {arch}", no_jit_engine=not engine
        )
    dt = time.perf_counter() - t0
    cache.bump(compiles=1, compile_seconds=dt)
    return compiled, list(symbols), dt


def _from_entry(
    entry: "cache.Entry", template, params, arch, t_compile=0.0, symbols=(), ptx=None, source="disk"
) -> CompiledKernel:
    cache.import_for_load(entry.shared is not None and loader_choice() == "auto")
    t0 = time.perf_counter()
    module, fn, loader = entry.load()
    dt = time.perf_counter() - t0
    cache.bump(load_seconds=dt)
    return CompiledKernel(
        name=entry.symbol,
        template=template,
        params=params,
        arch=arch,
        fn=fn,
        compile_seconds=t_compile,
        load_seconds=dt,
        source=source,
        digest=entry.digest,
        path=str(entry.obj),
        kernel_symbols=list(symbols),
        ptx=ptx,
        module=module,
        loader=loader,
    )


def _try_disk(dc, key, template, params, arch) -> Optional[CompiledKernel]:
    entry, _ = dc.lookup(key)
    if entry is None:
        return None
    try:
        ck = _from_entry(entry, template, params, arch)
    except Exception as e:  # an unloadable entry is a miss
        cache.warn(f"could not load {entry.obj} ({type(e).__name__}: {e}); recompiling")
        cache.bump(corrupt=1)
        dc.discard(entry.id)
        return None
    cache.bump(hits=1)
    return ck


def _unloaded(entry, template, params, arch, source="disk", dt=0.0, symbols=()) -> CompiledKernel:
    return CompiledKernel(
        name=entry.symbol,
        template=template,
        params=params,
        arch=arch,
        fn=None,
        compile_seconds=dt,
        source=source,
        digest=entry.digest,
        path=str(entry.obj),
        kernel_symbols=list(symbols),
    )


def _find(dc, key, template, params, arch, load: bool) -> Optional[CompiledKernel]:
    if load:
        return _try_disk(dc, key, template, params, arch)
    entry, _ = dc.lookup(key)
    return _unloaded(entry, template, params, arch) if entry is not None else None


def publish(template: str, params: TemplateParams, arch: str, load: bool = True) -> Optional[CompiledKernel]:
    """Make sure the key is on disk (compiling under the per-key lock if needed); load it if asked.

    Returns None when the disk layer is off, unusable, or the kernel cannot be
    persisted. With load=False (worker processes) the result has no `fn`.
    """
    dc = cache.disk()
    if dc is None:
        return None
    try:
        key = full_key(template, params, arch)
        found = _find(dc, key, template, params, arch, load)
        if found is not None:
            return found
        with dc.locked(key):
            found = _find(dc, key, template, params, arch, load)  # another process may have published
            if found is not None:
                return found
            if dc.lookup(key)[1]:
                cache.bump(corrupt=1)
            dc.check_room()
            cache.bump(misses=1)
            name, jit_fn, fake_args, symbol_for = _build(template, params, arch)
            if not _persistable(jit_fn, fake_args):
                cache.bump(uncacheable=1)
                return None
            compiled, symbols, dt = _compile(name, jit_fn, fake_args, symbol_for, arch, engine=False)
            t0 = time.perf_counter()
            entry = dc.publish(
                key,
                name,
                lambda p: compiled.export_to_c(str(p), function_name=name, export_only_tvm_ffi_symbols=True),
                extra={"kernel_symbols": symbols, "compile_seconds": dt},
            )
            cache.bump(export_seconds=time.perf_counter() - t0)
        dc.prune(keep=(entry.id,))
        if not load:
            return _unloaded(entry, template, params, arch, "compile", dt, symbols)
        return _from_entry(entry, template, params, arch, dt, symbols, _ptx_of(compiled), source="compile")
    except OSError as e:  # an unwritable or full cache directory never fails a compile
        # nor does it cost a second compile per kernel: the rest of the process runs without the disk layer
        cache.turn_off(
            dc.root,
            f"cannot write to {dc.root} ({type(e).__name__}: {e}); compiling without the "
            f"disk cache for the rest of this process",
        )
        return None


def _compile_in_memory(template: str, params: TemplateParams, arch: str) -> CompiledKernel:
    name, jit_fn, fake_args, symbol_for = _build(template, params, arch)
    compiled, symbols, dt = _compile(name, jit_fn, fake_args, symbol_for, arch, engine=True)
    fn = _raw_function(compiled) or compiled
    return CompiledKernel(
        name=name,
        template=template,
        params=params,
        arch=arch,
        fn=fn,
        compile_seconds=dt,
        source="compile",
        kernel_symbols=symbols,
        ptx=_ptx_of(compiled),
        mlir=_mlir_of(compiled),
        module=compiled,
    )


def _note_name(ck: CompiledKernel, key: tuple) -> None:
    prev = _names.setdefault((ck.name, ck.arch), key)
    if prev != key:
        cache.warn(
            f"kernel name {ck.name} names two different keys ({prev[0]} {prev[2]} and {key[0]} {key[2]});"
            " kernel_name should encode every param"
        )


def compile_kernel(template: str, params: TemplateParams, target: Target | str) -> CompiledKernel:
    arch = _arch_of(target)
    key = compile_key(template, params, arch)
    hit = _memo.get(key)
    if hit is not None:
        cache.bump(memo_hits=1)
        return hit
    with _lock:
        hit = _memo.get(key)
        if hit is not None:
            cache.bump(memo_hits=1)
            return hit
        ck = publish(template, params, arch, load=True)
        if ck is None:
            if cache.disk() is None:
                cache.bump(misses=1)
            ck = _compile_in_memory(template, params, arch)
        _note_name(ck, key)
        _memo[key] = ck
        _log.debug(
            "frost: %s %s for %s (%.2f s)",
            "compiled" if ck.source == "compile" else "loaded",
            ck.name,
            arch,
            ck.compile_seconds if ck.source == "compile" else ck.load_seconds,
        )
        return ck


def remember(ck: CompiledKernel) -> CompiledKernel:
    """Serve `ck` from this process's memo (a kernel obtained outside compile_kernel); the first one stays."""
    key = compile_key(ck.template, ck.params, ck.arch)
    with _lock:
        if key not in _memo:
            _note_name(ck, key)
            _memo[key] = ck
        return _memo[key]


def memo_has(template: str, params: TemplateParams, target: Target | str) -> bool:
    return compile_key(template, params, _arch_of(target)) in _memo
