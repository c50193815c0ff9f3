"""The cache fingerprint and compile keys: what must match for a stored artifact to be reused.

The fingerprint covers everything that changes generated code without changing
a compile key: frost's kernel sources (`SOURCES`: the templates, the compile
boundary, and what they import from other layers that shapes a kernel), the
CuTe DSL and TVM-FFI versions, the Python ABI and code-generation environment
variables. Computed once per process; never imports cutlass.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

FORMAT = 1
# CUTE_DSL_* variables that never change generated code (diagnostics, dump and
# cache locations, library lookup). ARCH is left out because frost always
# passes --gpu-arch explicitly and the arch is part of every key.
_NON_CODEGEN_ENV = {
    "KEEP",
    "DUMP_DIR",
    "CACHE_DIR",
    "NO_CACHE",
    "JIT_CACHE_MAX_ELEMS",
    "PRINT_IR",
    "PRINT_AFTER_PREPROCESSOR",
    "SHOW_STACKTRACE",
    "FILTER_STACKTRACE",
    "WARNINGS_IGNORE",
    "DISABLE_FILE_CACHING",
    "LOG_LEVEL",
    "LOG_TO_CONSOLE",
    "LOG_TO_FILE",
    "LIBS",
    "ARCH",
    "KEEP_PTX",
    "KEEP_CUBIN",
    "KEEP_SASS",
    "KEEP_IR",
    "JIT_TIME_PROFILING",
}
_DISTS = ("nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl-libs-core", "apache-tvm-ffi")
FROST_ROOT = Path(__file__).resolve().parents[1]
# Paths under FROST_ROOT whose .py files are hashed: a folder means every .py below it.
SOURCES = ("engines", "compiler", "runtime/workspace.py")
# Modules the SOURCES import that never change generated code: error messages, and
# the target record (its arch string is part of every compile key).
NOT_CODEGEN = ("errors.py", "target.py")


_file_digests: dict[str, str] = {}
_sources: dict[str, str] = {}


def file_digest(path: Path) -> str:
    """sha256 of a source file as first seen by this process (the code it imported)."""
    k = str(path)
    d = _file_digests.get(k)
    if d is None:
        d = _file_digests[k] = hashlib.sha256(path.read_bytes()).hexdigest()
    return d


def source_files(root: Path = FROST_ROOT, parts: tuple = SOURCES) -> list[Path]:
    """The .py files the fingerprint hashes, sorted."""
    out = set()
    for part in parts:
        p = root / part
        out.update([p] if p.is_file() else (f for f in p.rglob("*.py") if "__pycache__" not in f.parts))
    return sorted(out)


def sources_digest(root: Path = FROST_ROOT, parts: tuple = SOURCES) -> str:
    """Digest of the `parts` of the tree at `root`, computed once per process."""
    k = f"{root}:{','.join(parts)}"
    d = _sources.get(k)
    if d is None:
        h = hashlib.sha256()
        for p in source_files(root, parts):
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + file_digest(p).encode() + b"\n")
        d = _sources[k] = h.hexdigest()
    return d


def forget_sources() -> None:
    """Re-read sources on next use (tests that edit a template in-process)."""
    _file_digests.clear()
    _sources.clear()


_versions: dict[str, str] = {}


def _dist_version(name: str) -> str:
    """An installed distribution's version, read once per process (parsing its metadata costs ~1 ms)."""
    v = _versions.get(name)
    if v is None:
        try:
            v = metadata.version(name)
        except metadata.PackageNotFoundError:
            v = "absent"
        _versions[name] = v
    return v


def codegen_env() -> dict:
    out = {}
    for k, v in os.environ.items():
        if k.startswith("CUTE_DSL_") and k[len("CUTE_DSL_") :] not in _NON_CODEGEN_ENV:
            out[k] = v
    return dict(sorted(out.items()))


def fingerprint_inputs(root: Path = FROST_ROOT) -> dict:
    return {
        "format": FORMAT,
        "sources": sources_digest(root),
        "versions": {d: _dist_version(d) for d in _DISTS},
        "python": [
            sys.implementation.name,
            sys.implementation.cache_tag,
            sysconfig.get_config_var("SOABI") or "",
            platform.machine(),
            sys.platform,
        ],
        "env": codegen_env(),
    }


def fingerprint(root: Path = FROST_ROOT) -> str:
    blob = json.dumps(fingerprint_inputs(root), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def template_digest(template: str) -> str:
    """sha256 of the template module's source file, found without importing it."""
    spec = importlib.util.find_spec(template)
    if spec is None or not spec.origin or not os.path.exists(spec.origin):
        raise ImportError(f"kernel template {template!r} has no source file")
    return file_digest(Path(spec.origin))


def full_key(template: str, params, arch: str) -> dict:
    """The whole compile key, as stored in the sidecar. Plan-time values only."""
    t = type(params)
    return {
        "template": template,
        "template_sha256": template_digest(template),
        "params_type": f"{t.__module__}:{t.__qualname__}",
        "params": params.key(),
        "arch": arch,
    }


def entry_id(fp: str, key: dict) -> str:
    return hashlib.sha256(json.dumps({"fp": fp, "key": key}, sort_keys=True).encode()).hexdigest()[:40]
