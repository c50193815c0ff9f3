"""Compiled kernels as portable bytes: take a plan's artifacts out of the cache, and adopt saved ones back in.

A saved plan carries each kernel's exported object (and the library linked from
it, when there is one) with the kernel's full cache key. Adopting republishes
them under this process's fingerprint with the cache's own checks (the key must
be the one this frost computes, the bytes must match their size and sha256), so
the compile boundary then serves them as ordinary disk hits. With the disk layer
off they are loaded straight into this process's memo instead. Importing this
module does not import cutlass.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from frost.compiler import cache, fingerprint
from frost.compiler import compile as boundary
from frost.compiler.compile import CompiledKernel, KernelSpec


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Artifact:
    """One kernel: what compiled it (spec, arch, full key), its entry symbol and its bytes."""

    spec: KernelSpec
    arch: str
    key: dict
    symbol: str
    obj: bytes
    so: Optional[bytes] = None
    runtime_libs: list = field(default_factory=list)
    kernel_symbols: list = field(default_factory=list)

    @property
    def digest(self) -> str:
        return sha256(self.obj)


def _from_disk(ck: CompiledKernel, key: dict) -> Optional[Artifact]:
    dc = cache.disk()
    entry = dc.lookup(key)[0] if dc is not None else None
    if entry is None:
        return None
    obj = entry.obj.read_bytes()
    if sha256(obj) != entry.digest:  # replaced since the lookup
        return None
    so_path = entry.shared
    so = so_path.read_bytes() if so_path is not None else None
    if so is not None and sha256(so) != entry.meta.get("so_sha256"):
        so = None
    return Artifact(
        KernelSpec(ck.template, ck.params),
        ck.arch,
        key,
        entry.symbol,
        obj,
        so,
        list(entry.meta.get("runtime_libs", [])) if so is not None else [],
        list(entry.meta.get("kernel_symbols") or ck.kernel_symbols),
    )


def _from_memory(ck: CompiledKernel, key: dict) -> Optional[Artifact]:
    """Export a kernel compiled in this process with the disk layer off."""
    export = getattr(ck.module, "export_to_c", None)
    if export is None:
        return None
    with tempfile.TemporaryDirectory(prefix="frost-export-") as d:
        path = Path(d) / "kernel.o"
        export(str(path), function_name=ck.name, export_only_tvm_ffi_symbols=True)
        obj = path.read_bytes()
    return Artifact(
        KernelSpec(ck.template, ck.params), ck.arch, key, ck.name, obj, kernel_symbols=list(ck.kernel_symbols)
    )


def export_kernel(ck: CompiledKernel) -> Artifact:
    """The artifact behind a compiled kernel: its cache entry, else its own file, else a fresh export."""
    key = fingerprint.full_key(ck.template, ck.params, ck.arch)
    art = _from_disk(ck, key) or ck.artifact
    if art is None and ck.path and ck.digest and Path(ck.path).is_file():
        obj = Path(ck.path).read_bytes()
        if sha256(obj) == ck.digest:
            art = Artifact(
                KernelSpec(ck.template, ck.params), ck.arch, key, ck.name, obj, kernel_symbols=list(ck.kernel_symbols)
            )
    if art is None:
        art = _from_memory(ck, key)
    if art is None:
        raise FileNotFoundError(
            f"the artifact of kernel {ck.name} is gone (evicted from {cache.cache_dir()}); "
            "build the plan again before saving it"
        )
    return art


def _sidecar_extra(art: Artifact) -> dict:
    return {"kernel_symbols": list(art.kernel_symbols), "compile_seconds": 0.0, "origin": "plan file"}


def stale_reason(art: Artifact) -> Optional[str]:
    """Why this frost would not file the artifact under its saved key (None when it would)."""
    want = fingerprint.full_key(art.spec.template, art.spec.params, art.arch)
    if want == art.key:
        return None
    diff = sorted(k for k in set(want) | set(art.key) if want.get(k) != art.key.get(k))
    return f"kernel {art.symbol}: its key differs here in {', '.join(diff)}"


def adopt(art: Artifact) -> str:
    """Publish a verified artifact into the cache if absent; returns the entry id ('' if held in memory only).

    The caller has checked the bytes against the saved digests and `stale_reason`.
    """
    shared = (art.so, art.runtime_libs) if art.so is not None and art.runtime_libs else None
    dc = cache.disk()
    if dc is None:
        _adopt_into_memo(art, shared)
        return ""
    entry, _ = dc.lookup(art.key)
    if entry is not None:
        return entry.id
    with dc.locked(art.key):
        entry, _ = dc.lookup(art.key)  # another process may have published it meanwhile
        if entry is None:
            entry = dc.publish(
                art.key, art.symbol, lambda p: p.write_bytes(art.obj), extra=_sidecar_extra(art), shared=shared
            )
    return entry.id


def _adopt_into_memo(art: Artifact, shared) -> None:
    """Disk layer off: load the artifact from a scratch directory and serve it from the memo."""
    template, params = art.spec.template, art.spec.params
    if boundary.memo_has(template, params, art.arch):
        return
    with tempfile.TemporaryDirectory(prefix="frost-adopt-") as d:
        entry = cache.DiskCache(Path(d), fingerprint.fingerprint()).publish(
            art.key, art.symbol, lambda p: p.write_bytes(art.obj), extra=_sidecar_extra(art), shared=shared
        )
        ck = boundary._from_entry(entry, template, params, art.arch, symbols=art.kernel_symbols)
    ck.path = None  # the scratch copy is gone; the loaded module stays alive
    kept = boundary.remember(ck)
    if kept.artifact is None:  # so that a plan built from it (or from this process's own kernel) saves again
        kept.artifact = art


def prune_keeping(ids) -> None:
    """Apply the size cap, never evicting the entries just adopted."""
    dc = cache.disk()
    ids = tuple(i for i in ids if i)
    if dc is not None and ids:
        dc.prune(keep=ids)
