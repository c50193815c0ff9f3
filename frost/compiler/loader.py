"""Loading exported artifacts: the DSL runtime libraries, the object loader and the linked fast loader.

The libraries opened with RTLD_GLOBAL come from frost's own list (`allowed_runtime_libraries`: the
runtime the installed CuTe DSL ships or `$CUTE_DSL_LIBS` names, libtvm_ffi, and what the DSL itself
reports once imported); a path recorded next to an artifact only chooses among them and is never
opened on its own say.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Optional

DSL_RUNTIME = "libcute_dsl_runtime.so"

_global_libs: set = set()
_runtime_lock = threading.Lock()


def _open_global(libs) -> bool:
    """dlopen the DSL runtime libraries with RTLD_GLOBAL (once each); False if one is missing."""
    with _runtime_lock:
        for lib in libs:
            if lib in _global_libs:
                continue
            if not os.path.exists(lib):
                return False
            ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
            _global_libs.add(lib)
    return True


def runtime_libraries() -> list[str]:
    """libcute_dsl_runtime.so and libtvm_ffi.so, as the DSL finds them (imports cutlass)."""
    import cutlass.cute as cute

    return [str(p) for p in cute.runtime.find_runtime_libraries(enable_tvm_ffi=True)]


def loader_choice() -> str:
    """FROST_CACHE_LOADER: 'auto' (the linked .so through TVM-FFI when present, else the
    object through cute.runtime.load_module) or 'o' (always the latter)."""
    v = os.environ.get("FROST_CACHE_LOADER", "auto").strip().lower()
    return v if v in ("auto", "o") else "auto"


def load_object(path: Path, symbol: str):
    """(module, tvm_ffi.Function) from an exported object, through cute.runtime.load_module."""
    _open_global(runtime_libraries())
    import cutlass.cute as cute

    mod = cute.runtime.load_module(str(path), enable_tvm_ffi=True)
    return mod, getattr(mod, symbol)


@functools.lru_cache(maxsize=None)
def _libtvm_ffi() -> str:
    """libtvm_ffi.so's path, searched once per process."""
    import tvm_ffi

    return str(tvm_ffi.libinfo.find_libtvm_ffi())


@functools.lru_cache(maxsize=None)
def _shipped_runtimes() -> tuple:
    """The DSL runtime libraries inside the installed CuTe DSL distribution (found without importing it)."""
    spec = importlib.util.find_spec("nvidia_cutlass_dsl")
    out = []
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        out += sorted(str(p.resolve()) for p in Path(root).glob(f"*/lib/{DSL_RUNTIME}"))
    return tuple(out)


def allowed_runtime_libraries() -> frozenset:
    """frost's own list of libraries a linked artifact may need opened (real paths)."""
    libs = set(_shipped_runtimes())
    for p in os.environ.get("CUTE_DSL_LIBS", "").split(os.pathsep):  # the user's own choice, as the DSL reads it
        if os.path.basename(p) == DSL_RUNTIME and os.path.isfile(p):
            libs.add(os.path.realpath(p))
    with_ffi = importlib.util.find_spec("tvm_ffi") is not None
    if with_ffi:
        libs.add(os.path.realpath(_libtvm_ffi()))
    if "cutlass.cute" in sys.modules:  # the DSL already imported: what it reports (CUTE_DSL_LIBS included)
        libs.update(os.path.realpath(p) for p in runtime_libraries())
    return frozenset(libs)


def runtime_libs_for(recorded) -> Optional[list]:
    """The libraries to open for an artifact linked against `recorded`: a DSL runtime from frost's own
    list (the recorded one when it is on that list) and libtvm_ffi; None when none qualifies."""
    allowed = allowed_runtime_libraries()
    picks = [os.path.realpath(p) for p in recorded if isinstance(p, str)]
    runtime = [p for p in picks if p in allowed and os.path.basename(p) == DSL_RUNTIME]
    if not runtime:
        return None
    return [runtime[0], os.path.realpath(_libtvm_ffi())]


def load_shared(path: Path, symbol: str, recorded) -> Optional[tuple]:
    """(module, tvm_ffi.Function) from the linked .so, without importing cutlass; None if the runtime
    libraries it was linked for are not on frost's own list (`runtime_libs_for`) or not on this machine."""
    import tvm_ffi

    libs = runtime_libs_for(recorded)
    if libs is None or not _open_global(libs):
        return None
    mod = tvm_ffi.load_module(str(path))
    return mod, mod[symbol]


def link_shared(obj: Path, out: Path) -> bool:
    """Link the exported object into a shared library with the system C compiler, if any.

    Its undefined symbols resolve at load time against the runtime libraries,
    which the loader opens with RTLD_GLOBAL first.
    """
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return False
    r = subprocess.run([cc, "-shared", "-Wl,-Bsymbolic", "-o", str(out), str(obj)], capture_output=True, text=True)
    return r.returncode == 0 and out.exists()
