"""The persistent, cross-process artifact cache behind the compile boundary.

The fingerprint and keys live in `fingerprint.py`, artifact loading in `loader.py`.

A compiled kernel is exported (`export_to_c`, a relocatable object with the
cubin inside) and stored under

    $FROST_CACHE_DIR (default ~/.cache/frost) / v1 / <fingerprint[:16]> / <entry>.{o,json,lock}

The entry id hashes the fingerprint and the full key (template, its source
digest, params type and JSON, target arch). The .json sidecar repeats the key
and holds the artifact's sha256: a missing, truncated, corrupt or foreign entry
is a miss (and is replaced), never an error.

Writers publish atomically (temp file in the same directory, fsync, rename;
object first, sidecar last) under a per-key fcntl lock and re-check after
locking, so racing processes compile a key once. The directory is held under
`FROST_CACHE_MAX_BYTES` (default 2 GiB): entries of stale fingerprints go
first, then the least recently used. `FROST_CACHE_DISABLE=1` turns the disk
layer off. Importing this module does not import cutlass.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

from frost.compiler.fingerprint import FORMAT, entry_id, fingerprint, fingerprint_inputs
from frost.compiler.loader import link_shared, load_object, load_shared, loader_choice, runtime_libraries

_LAYOUT = "v1"
DEFAULT_MAX_BYTES = 2 * 2**30
LOCK_TIMEOUT_S = float(os.environ.get("FROST_CACHE_LOCK_TIMEOUT", "900"))
_TMP_MAX_AGE_S = 3600.0



# -- configuration ---------------------------------------------------------------------------
def cache_dir() -> Path:
    return Path(os.environ.get("FROST_CACHE_DIR") or Path.home() / ".cache" / "frost")


def disk_enabled() -> bool:
    return os.environ.get("FROST_CACHE_DISABLE", "").strip().lower() not in ("1", "true", "yes", "on")


def max_bytes() -> int:
    raw = os.environ.get("FROST_CACHE_MAX_BYTES", "")
    try:
        return int(raw) if raw.strip() else DEFAULT_MAX_BYTES
    except ValueError:
        return DEFAULT_MAX_BYTES


# -- statistics ------------------------------------------------------------------------------
@dataclass
class Stats:
    hits: int = 0            # artifacts loaded from disk
    memo_hits: int = 0       # served from this process's memo
    misses: int = 0          # requests that neither the memo nor the disk could serve
    compiles: int = 0        # compiles run in this process
    worker_compiles: int = 0  # compiles run by worker processes for this process
    corrupt: int = 0         # disk entries found unusable (and replaced)
    evictions: int = 0       # entries removed by the size cap
    uncacheable: int = 0     # compiles that could not be persisted
    load_seconds: float = 0.0
    import_seconds: float = 0.0  # one-time imports a load needed (tvm_ffi and torch, or cutlass)
    compile_seconds: float = 0.0
    export_seconds: float = 0.0


STATS = Stats()
_stats_lock = threading.Lock()


def bump(**deltas) -> None:
    with _stats_lock:
        for k, v in deltas.items():
            setattr(STATS, k, getattr(STATS, k) + v)


def stats() -> dict:
    """A snapshot of this process's cache counters."""
    with _stats_lock:
        return asdict(STATS)


def reset_stats() -> None:
    with _stats_lock:
        for k, v in asdict(Stats()).items():
            setattr(STATS, k, v)


# -- loading ---------------------------------------------------------------------------------
def import_for_load(so: bool) -> None:
    """Import what a load needs before timing it (tvm_ffi pulls in torch; the object loader, cutlass)."""
    mod = "tvm_ffi" if so else "cutlass.cute"
    if mod not in sys.modules:
        t0 = time.perf_counter()
        importlib.import_module(mod)
        bump(import_seconds=time.perf_counter() - t0)


@dataclass
class Entry:
    """A verified entry on disk."""

    id: str
    obj: Path
    meta: dict

    @property
    def symbol(self) -> str:
        return self.meta["symbol"]

    @property
    def digest(self) -> str:
        return self.meta["sha256"]

    @functools.cached_property
    def shared(self) -> Optional[Path]:
        """The linked .so when it exists and matches its recorded digest."""
        so = self.obj.with_suffix(".so")
        want = self.meta.get("so_sha256")
        if not want:
            return None
        try:
            ok = hashlib.sha256(so.read_bytes()).hexdigest() == want
        except OSError:
            return None
        return so if ok else None

    def load(self):
        """(module, fn, loader): the .so through TVM-FFI when allowed and usable, else the object.

        The caller has run `import_for_load` first (compile._from_entry does, so the one-time
        dependency import is not counted as load time).
        """
        so = self.shared if loader_choice() == "auto" else None
        if so is not None:
            got = load_shared(so, self.symbol, self.meta.get("runtime_libs", []))
            if got is not None:
                return (*got, "so")
        return (*load_object(self.obj, self.symbol), "o")


def _fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomic(final: Path, write, suffix: str) -> None:
    """`write(tmp)` a sibling temp file, fsync it and rename it over `final` (readers never see half a file)."""
    tmp = final.parent / f".{final.name}.{os.getpid()}.{threading.get_ident()}.{time.monotonic_ns()}.tmp{suffix}"
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


class DiskCache:
    """One cache directory seen with one fingerprint (this process's)."""

    def __init__(self, root: Optional[Path] = None, fp: Optional[str] = None):
        self.root = Path(root) if root is not None else cache_dir()
        self.fp = fp or fingerprint()
        self.base = self.root / _LAYOUT
        self.dir = self.base / self.fp[:16]

    def paths(self, eid: str) -> tuple[Path, Path, Path]:
        """(object, sidecar, lock); the optional linked library is the object's .so sibling."""
        return self.dir / f"{eid}.o", self.dir / f"{eid}.json", self.dir / f"{eid}.lock"

    def ensure(self) -> None:
        if not self.dir.is_dir():
            self.dir.mkdir(parents=True, exist_ok=True)
            info = self.dir / "FINGERPRINT.json"
            if not info.exists():
                data = json.dumps({"fingerprint": self.fp, **fingerprint_inputs()}, indent=1, sort_keys=True)
                with contextlib.suppress(OSError):
                    write_atomic(info, lambda p: p.write_text(data), ".json")

    # lookup --------------------------------------------------------------------------------
    def lookup(self, key: dict) -> tuple[Optional[Entry], bool]:
        """(verified entry or None, whether something unusable was found)."""
        eid = entry_id(self.fp, key)
        obj, side, _ = self.paths(eid)
        try:
            meta = json.loads(side.read_text())
        except FileNotFoundError:
            return None, obj.exists()
        except (OSError, ValueError):
            return None, True
        if (not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("fingerprint") != self.fp
                or meta.get("key") != key or not isinstance(meta.get("symbol"), str)):
            return None, True
        try:
            data = obj.read_bytes()
        except OSError:
            return None, True
        if len(data) != meta.get("size") or hashlib.sha256(data).hexdigest() != meta.get("sha256"):
            return None, True
        with contextlib.suppress(OSError):
            os.utime(side)  # recency for the LRU
        return Entry(eid, obj, meta), False

    def discard(self, eid: str) -> None:
        obj, side, _ = self.paths(eid)
        for p in (side, obj, obj.with_suffix(".so")):
            with contextlib.suppress(OSError):
                p.unlink()

    # publish -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self, key: dict, timeout: float = LOCK_TIMEOUT_S):
        """Hold the per-key cross-process lock (yields False if it timed out: proceed unlocked)."""
        self.ensure()
        lock = self.paths(entry_id(self.fp, key))[2]
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        held = False
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held = True
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.02)
            yield held
        finally:
            if held:
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def publish(self, key: dict, symbol: str, export, extra: Optional[dict] = None,
                shared: Optional[tuple[bytes, list]] = None) -> Entry:
        """Write an artifact with `export(tmp_path)` and its sidecar, atomically.

        `shared` = (linked library bytes, runtime libraries it was linked for) stands in
        for linking here when those libraries exist on this machine (a plan file's kernels).
        """
        self.ensure()
        eid = entry_id(self.fp, key)
        obj, side, _ = self.paths(eid)
        write_atomic(obj, export, ".o")
        data = obj.read_bytes()
        meta = {"format": FORMAT, "fingerprint": self.fp, "key": key, "symbol": symbol,
                "sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "created": time.time(),
                **(extra or {})}
        so = obj.with_suffix(".so")
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if shared is not None and shared[1] and all(os.path.exists(lib) for lib in shared[1]):
                write_atomic(so, lambda p: p.write_bytes(shared[0]), ".so")
                meta["so_sha256"] = hashlib.sha256(shared[0]).hexdigest()
                meta["runtime_libs"] = list(shared[1])
            else:
                linked = []
                write_atomic(so, lambda p: linked.append(link_shared(obj, p)), ".so")
                if linked and linked[0]:
                    meta["so_sha256"] = hashlib.sha256(so.read_bytes()).hexdigest()
                    meta["runtime_libs"] = runtime_libraries()
        text = json.dumps(meta, indent=1, sort_keys=True)
        write_atomic(side, lambda p: p.write_text(text), ".json")
        _fsync_dir(self.dir)
        return Entry(eid, obj, meta)

    # size cap ------------------------------------------------------------------------------
    def prune(self, limit: Optional[int] = None, keep: tuple = ()) -> int:
        """Hold the cache under `limit` bytes; stale fingerprints go first, then LRU. Returns evictions."""
        limit = max_bytes() if limit is None else limit
        if not self.base.is_dir():
            return 0
        gate = os.open(self.base / ".prune.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(gate, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0  # another process is pruning
            n = self._prune(limit, set(keep))
            bump(evictions=n)
            return n
        finally:
            os.close(gate)

    def _prune(self, limit: int, keep: set) -> int:
        now = time.time()
        groups: dict[tuple, list] = {}
        total = 0
        for d in self.base.iterdir():
            if not d.is_dir():
                continue
            stale = d != self.dir
            for p in d.iterdir():
                try:
                    st = p.stat()
                except OSError:
                    continue
                if ".tmp" in p.name:
                    if now - st.st_mtime > _TMP_MAX_AGE_S:
                        with contextlib.suppress(OSError):
                            p.unlink()
                    continue
                if p.suffix not in (".o", ".so", ".json") or p.name == "FINGERPRINT.json":
                    continue
                g = groups.setdefault((d, p.stem), [stale, 0.0, 0, []])
                g[2] += st.st_size
                g[3].append(p)
                if p.suffix == ".json":
                    g[1] = st.st_mtime
                total += st.st_size
        evicted = 0
        order = sorted(groups.items(), key=lambda kv: (not kv[1][0], kv[1][1]))
        for (d, stem), (stale, _, size, files) in order:
            if total <= limit:
                break
            if not stale and stem in keep:
                continue
            for p in sorted(files, key=lambda q: q.suffix != ".json"):  # sidecar first
                with contextlib.suppress(OSError):
                    p.unlink()
            with contextlib.suppress(OSError):
                (d / f"{stem}.lock").unlink()
            total -= size
            evicted += 1
        for d in self.base.iterdir():
            if d.is_dir() and d != self.dir and not any(p.suffix in (".o", ".so", ".json")
                                                         and p.name != "FINGERPRINT.json"
                                                         for p in d.iterdir()):
                shutil.rmtree(d, ignore_errors=True)
        return evicted

    def clear(self) -> None:
        """Delete every entry of every fingerprint."""
        shutil.rmtree(self.base, ignore_errors=True)

    def size_bytes(self) -> int:
        if not self.base.is_dir():
            return 0
        return sum(p.stat().st_size for p in self.base.rglob("*") if p.is_file())


_disk: dict[tuple, DiskCache] = {}


def disk() -> Optional[DiskCache]:
    """This process's view of the cache directory, or None when the disk layer is off."""
    if not disk_enabled():
        return None
    fp = fingerprint()
    k = (str(cache_dir()), fp)
    dc = _disk.get(k)
    if dc is None:
        dc = _disk[k] = DiskCache(cache_dir(), fp)
    return dc


def warn(msg: str) -> None:
    """A cache event the user should see (a corrupt entry replaced, a worker that failed): the logger of this module."""
    logging.getLogger(__name__).warning("frost cache: %s", msg)


def describe() -> dict[str, Any]:
    """Where the cache is and what it holds (for `frost precompile --info`)."""
    dc = disk()
    return {"dir": str(cache_dir()), "enabled": dc is not None, "max_bytes": max_bytes(),
            "fingerprint": dc.fp if dc else None, "bytes": dc.size_bytes() if dc else 0, "stats": stats()}


def prune(limit: Optional[int] = None) -> int:
    """Apply the size cap now (stale fingerprints first, then least recently used); returns evictions."""
    dc = disk()
    return dc.prune(limit) if dc is not None else 0


def clear() -> None:
    """Delete every cached artifact (all fingerprints) under the cache directory."""
    dc = disk()
    if dc is not None:
        dc.clear()
