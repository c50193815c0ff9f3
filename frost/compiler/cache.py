"""The persistent, cross-process artifact cache behind the compile boundary.

The fingerprint and keys live in `fingerprint.py`, artifact loading in `loader.py`.

A compiled kernel is exported (`export_to_c`, a relocatable object with the
cubin inside) and stored under

    $FROST_CACHE_DIR (default: the user's cache dir, $XDG_CACHE_HOME/frost or ~/.cache/frost)
        / v1 / <fingerprint[:16]> / <entry>.{o,so,json,lock}

Trust (`trust.py`): frost creates these directories 0700 and its files without
group or other write bits, whatever the umask. When the root, `v1` or this
process's fingerprint directory is not owned by the effective user or is
writable by group or others, frost warns once (logger `frost`) and runs without
the disk layer, as pip does. The libraries a linked `.so` needs are opened from
frost's own list (`loader.allowed_runtime_libraries`), never from a sidecar.

The entry id hashes the fingerprint and the full key (template, its source
digest, params type and JSON, target arch). The .json sidecar repeats the key
and holds the artifact's sha256: a missing, truncated, corrupt or foreign entry
is a miss (and is replaced), never an error.

Writers publish atomically (temp file in the same directory, fsync, rename;
object first, sidecar last) under a per-key fcntl lock and re-check after
locking, so racing processes compile a key once. The directory is held under
`FROST_CACHE_MAX_BYTES` (default 2 GiB): entries of stale fingerprints go
first, then the least recently used (`prune`: another frost build's directory
is stale only once nobody has opened it for `FROST_CACHE_STALE_DAYS`, default
7). `FROST_CACHE_DISABLE=1` turns the disk layer off; so does a write that fails
(a full disk: the rest of the process compiles in memory, once per kernel).
Importing this module does not import cutlass.
"""

from __future__ import annotations

import contextlib
import errno
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

from pydantic import BaseModel, ConfigDict, ValidationError

from frost.compiler.fingerprint import FORMAT, entry_id, fingerprint, fingerprint_inputs
from frost.compiler.loader import (
    link_shared,
    load_object,
    load_shared,
    loader_choice,
    runtime_libraries,
    runtime_libs_for,
)
from frost.compiler.trust import not_group_writable, private_dir, untrusted_reason, warn_once

_LAYOUT = "v1"
DEFAULT_MAX_BYTES = 2 * 2**30
LOCK_TIMEOUT_S = float(os.environ.get("FROST_CACHE_LOCK_TIMEOUT", "900"))
_TMP_MAX_AGE_S = 3600.0
DEFAULT_STALE_DAYS = 7.0
MIN_FREE_BYTES = 64 * 2**20  # below this much free space a compile is not exported (it would fail)


# -- configuration ---------------------------------------------------------------------------
def user_cache_dir() -> Path:
    """The platform's per-user cache directory ($XDG_CACHE_HOME, ~/.cache, ~/Library/Caches on macOS)."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches"
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"


def cache_dir() -> Path:
    return Path(os.environ.get("FROST_CACHE_DIR") or user_cache_dir() / "frost")


def stale_seconds() -> float:
    """How long another frost build's fingerprint directory must go unopened before pruning prefers it."""
    try:
        return float(os.environ.get("FROST_CACHE_STALE_DAYS", "") or DEFAULT_STALE_DAYS) * 86400.0
    except ValueError:
        return DEFAULT_STALE_DAYS * 86400.0


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
    hits: int = 0  # artifacts loaded from disk
    memo_hits: int = 0  # served from this process's memo
    misses: int = 0  # requests that neither the memo nor the disk could serve
    compiles: int = 0  # compiles run in this process
    worker_compiles: int = 0  # compiles run by worker processes for this process
    corrupt: int = 0  # disk entries found unusable (and replaced)
    evictions: int = 0  # entries removed by the size cap
    uncacheable: int = 0  # compiles that could not be persisted
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


class Sidecar(BaseModel):
    """An entry's .json sidecar: the key it was compiled under and the digests of its files.

    `runtime_libs` records what a linked .so was linked against; it is information only (the
    libraries opened come from frost's own list)."""

    model_config = ConfigDict(extra="allow")

    format: int
    fingerprint: str
    key: dict
    symbol: str
    sha256: str
    size: int
    created: float = 0.0
    so_sha256: Optional[str] = None
    runtime_libs: list[str] = []
    kernel_symbols: list[str] = []
    compile_seconds: float = 0.0
    origin: Optional[str] = None


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
            got = load_shared(so, self.symbol, self.meta.get("runtime_libs", []))  # a hint among frost's own
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
        not_group_writable(tmp)  # whatever the umask
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
        """Create this fingerprint's directory (0700, with what is missing above it) before writing to it;
        OSError when a directory on the way fails the trust rule (planted since `disk()` looked)."""
        if not self.dir.is_dir():
            private_dir(self.dir)
            reason = self.untrusted()
            if reason is not None:
                raise OSError(errno.EPERM, reason)
            info = self.dir / "FINGERPRINT.json"
            if not info.exists():
                data = json.dumps({"fingerprint": self.fp, **fingerprint_inputs()}, indent=1, sort_keys=True)
                with contextlib.suppress(OSError):
                    write_atomic(info, lambda p: p.write_text(data), ".json")

    def untrusted(self) -> Optional[str]:
        """Why the disk layer must not be used (see `trust.py`): the first of the root, `v1` and this
        fingerprint's directory that exists and fails the rule; None if it may (what is missing is
        created private when the first entry is written)."""
        for d in (self.root, self.base, self.dir):
            if os.path.lexists(d):
                reason = untrusted_reason(d)
                if reason is not None:
                    return reason
        return None

    def check_room(self) -> None:
        """Raise OSError(ENOSPC) when the cache's file system is nearly full (checked before a compile, so
        that a kernel is not compiled once for the disk and again in memory)."""
        if shutil.disk_usage(self.base).free < MIN_FREE_BYTES:
            raise OSError(errno.ENOSPC, f"less than {MIN_FREE_BYTES >> 20} MiB free under {self.base}")

    def touch(self) -> None:
        """Mark this fingerprint's directory as in use (pruning by other builds keeps it for a while)."""
        with contextlib.suppress(OSError):
            os.utime(self.dir / "FINGERPRINT.json")

    # lookup --------------------------------------------------------------------------------
    def lookup(self, key: dict) -> tuple[Optional[Entry], bool]:
        """(verified entry or None, whether something unusable was found)."""
        eid = entry_id(self.fp, key)
        obj, side, _ = self.paths(eid)
        try:
            meta = Sidecar.model_validate_json(side.read_bytes()).model_dump()
        except FileNotFoundError:
            return None, obj.exists()
        except (OSError, ValidationError):  # unreadable, not JSON, or a field missing or of the wrong type
            return None, True
        if meta["format"] != FORMAT or meta["fingerprint"] != self.fp or meta["key"] != key:
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
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
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

    def publish(
        self, key: dict, symbol: str, export, extra: Optional[dict] = None, shared: Optional[tuple[bytes, list]] = None
    ) -> Entry:
        """Write an artifact with `export(tmp_path)` and its sidecar, atomically.

        `shared` = (linked library bytes, runtime libraries it was linked for) stands in
        for linking here when those libraries exist on this machine (a plan file's kernels).
        """
        self.ensure()
        eid = entry_id(self.fp, key)
        obj, side, _ = self.paths(eid)
        write_atomic(obj, export, ".o")
        data = obj.read_bytes()
        meta = {
            "format": FORMAT,
            "fingerprint": self.fp,
            "key": key,
            "symbol": symbol,
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
            "created": time.time(),
            **(extra or {}),
        }
        so = obj.with_suffix(".so")
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if shared is not None and runtime_libs_for(shared[1]) is not None:  # frost's own libraries
                write_atomic(so, lambda p: p.write_bytes(shared[0]), ".so")
                meta["so_sha256"] = hashlib.sha256(shared[0]).hexdigest()
                meta["runtime_libs"] = list(shared[1])
            else:
                linked = []
                write_atomic(so, lambda p: linked.append(link_shared(obj, p)), ".so")
                if linked and linked[0]:
                    meta["so_sha256"] = hashlib.sha256(so.read_bytes()).hexdigest()
                    meta["runtime_libs"] = runtime_libraries()
        meta = Sidecar.model_validate(meta).model_dump()
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
        gate = os.open(self.base / ".prune.lock", os.O_RDWR | os.O_CREAT, 0o600)
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

    def _stale(self, d: Path, now: float) -> bool:
        """Another build's directory that nobody opened (FINGERPRINT.json) or hit (a sidecar) lately.

        Two frost versions sharing one cache each touch their own FINGERPRINT.json when they open it,
        and every hit touches its sidecar, so a directory in use is never preferred for eviction: its
        entries compete with this build's by last use instead."""
        if d == self.dir:
            return False
        limit = now - stale_seconds()
        try:
            return all(p.stat().st_mtime < limit for p in d.iterdir() if p.suffix == ".json")
        except OSError:
            return True

    def _prune(self, limit: int, keep: set) -> int:
        now = time.time()
        groups: dict[tuple, list] = {}
        total = 0
        for d in self.base.iterdir():
            if not d.is_dir():
                continue
            stale = self._stale(d, now)
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
            if d == self.dir and stem in keep:
                continue
            for p in sorted(files, key=lambda q: q.suffix != ".json"):  # sidecar first
                with contextlib.suppress(OSError):
                    p.unlink()
            with contextlib.suppress(OSError):
                (d / f"{stem}.lock").unlink()
            total -= size
            evicted += 1
        for d in self.base.iterdir():
            if (
                d.is_dir()
                and d != self.dir
                and self._stale(d, now)
                and not any(p.suffix in (".o", ".so", ".json") and p.name != "FINGERPRINT.json" for p in d.iterdir())
            ):
                shutil.rmtree(d, ignore_errors=True)
        return evicted

    def clear(self) -> None:
        """Delete every entry of every fingerprint."""
        shutil.rmtree(self.base, ignore_errors=True)

    def size_bytes(self) -> int:
        if not self.base.is_dir():
            return 0
        return sum(p.stat().st_size for p in self.base.rglob("*") if p.is_file())


_disk: dict[tuple, Optional[DiskCache]] = {}
_off: dict[str, str] = {}  # cache dir -> why this process runs without its disk layer


def disk() -> Optional[DiskCache]:
    """This process's view of the cache directory, or None when the disk layer is off (disabled, a
    directory frost must not trust, or a write that failed)."""
    if not disk_enabled():
        return None
    fp = fingerprint()
    root = cache_dir()
    k = (str(root), fp)
    try:
        return _disk[k]
    except KeyError:
        pass
    if str(root) in _off:
        return None
    dc = DiskCache(root, fp)
    reason = dc.untrusted()
    if reason is not None:
        turn_off(
            root,
            f"{reason}; compiling without the disk cache (fix the owner and mode, e.g. "
            f"chmod 700, or set FROST_CACHE_DIR to a directory of your own)",
        )
        return None
    dc.touch()
    _disk[k] = dc
    return dc


def turn_off(root, why: str) -> None:
    """Run the rest of this process without the disk layer of `root`, warning once (logger `frost`)."""
    _off[str(root)] = why
    for k in [k for k in _disk if k[0] == str(root)]:
        del _disk[k]
    warn_once(f"cache:{root}", f"frost cache: {why}")


def off_reason() -> Optional[str]:
    """Why this process runs without the disk layer of the current cache directory (None if it does not)."""
    return _off.get(str(cache_dir()))


def warn(msg: str) -> None:
    """A cache event the user should see (a corrupt entry replaced, a worker that failed): the logger of this module."""
    logging.getLogger(__name__).warning("frost cache: %s", msg)


def describe() -> dict[str, Any]:
    """Where the cache is and what it holds (for `frost precompile --info`)."""
    dc = disk()
    return {
        "dir": str(cache_dir()),
        "enabled": dc is not None,
        "off_reason": off_reason(),
        "max_bytes": max_bytes(),
        "fingerprint": dc.fp if dc else None,
        "bytes": dc.size_bytes() if dc else 0,
        "stats": stats(),
    }


def prune(limit: Optional[int] = None) -> int:
    """Apply the size cap now (stale fingerprints first, then least recently used); returns evictions."""
    dc = disk()
    return dc.prune(limit) if dc is not None else 0


def clear() -> None:
    """Delete every cached artifact (all fingerprints) under the cache directory."""
    dc = disk()
    if dc is not None:
        dc.clear()
