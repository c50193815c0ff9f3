"""The one compile boundary every frost kernel goes through.

A kernel template is a module (imported lazily by dotted path) that exposes

    kernel_name(params, arch) -> str            # frost_-prefixed, self-describing
    build(params, arch) -> (jit_fn, fake_args)  # a @cute.jit function and its
                                                # fake tensors / sym ints / fake stream

`compile_kernel` validates that no real tensor reaches the compile, compiles
with TVM-FFI for the target's arch and memoizes per (template, params, arch).
"""
from __future__ import annotations

import importlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from frost.engines.params import TemplateParams
from frost.engines.target import Target


@dataclass
class CompiledKernel:
    name: str
    template: str
    params: TemplateParams
    arch: str
    fn: Any
    compile_seconds: float = 0.0
    source: str = "compile"  # "compile" | "memo" | "disk"

    def __call__(self, *args):
        return self.fn(*args)


@dataclass
class _Stats:
    compiles: int = 0
    memo_hits: int = 0
    compile_seconds: float = 0.0
    keys: list = field(default_factory=list)


_memo: dict[tuple, CompiledKernel] = {}
_lock = threading.Lock()
stats = _Stats()


def load_template(template: str):
    return importlib.import_module(template)


def _reject_real_tensors(args) -> None:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return
    for a in args:
        if isinstance(a, torch.Tensor):
            raise TypeError("a real tensor reached a compile key; kernels compile from fake tensors only")


def compile_key(template: str, params: TemplateParams, arch: str) -> tuple:
    return (template, type(params).__name__, params.key(), arch)


def compile_kernel(template: str, params: TemplateParams, target: Target | str) -> CompiledKernel:
    arch = target if isinstance(target, str) else target.arch
    key = compile_key(template, params, arch)
    with _lock:
        hit = _memo.get(key)
        if hit is not None:
            stats.memo_hits += 1
            return hit
    mod = load_template(template)
    jit_fn, fake_args = mod.build(params, arch)
    _reject_real_tensors(fake_args)
    import cutlass.cute as cute

    t0 = time.perf_counter()
    fn = cute.compile(jit_fn, *fake_args, options=f"--enable-tvm-ffi --gpu-arch {arch}")
    dt = time.perf_counter() - t0
    ck = CompiledKernel(name=mod.kernel_name(params, arch), template=template, params=params,
                        arch=arch, fn=fn, compile_seconds=dt)
    with _lock:
        stats.compiles += 1
        stats.compile_seconds += dt
        stats.keys.append(key)
        _memo.setdefault(key, ck)
        return _memo[key]
