"""Whose files frost may load native code from: the kernel cache's directories and saved plan files.

A compiled kernel is native code that frost loads into the process, so a directory (or plan file)
someone else can write to is a way to run their code. The rule, as pip applies it to its cache: a
path frost loads native code from must be owned by the effective user (root's are fine for root) and
not writable by group or others; a symlink counts with its target. When a cache directory fails it,
frost warns once (logger ``frost``) and runs without the disk layer; a plan file that fails it loads
as data only (its kernels compile).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Optional

log = logging.getLogger("frost")
_warned: set = set()


def warn_once(key: str, msg: str) -> None:
    """Log `msg` as a warning the first time `key` is seen in this process."""
    if key not in _warned:
        _warned.add(key)
        log.warning(msg)


def untrusted_reason(path, *, kind: str = "directory", fd: Optional[int] = None) -> Optional[str]:
    """Why native code must not be loaded from `path` (None when it may): owner and mode, see above.

    `fd`: the file as opened (its own status is judged, whatever the path names by now)."""
    path = Path(path)
    euid = os.geteuid()
    try:
        lst = os.lstat(path)
        st = os.fstat(fd) if fd is not None else os.stat(path)
    except OSError as e:
        return f"{kind} {path} cannot be checked ({type(e).__name__}: {e.strerror or e})"
    want = stat.S_ISDIR if kind == "directory" else stat.S_ISREG
    if not want(st.st_mode):
        return f"{path} is not a {kind}"
    for s, what in ((lst, "it"), (st, "its link target")):
        if s.st_uid != euid:
            return f"{kind} {path}: {what} is owned by uid {s.st_uid}, not by this user (uid {euid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{kind} {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def private_dir(path) -> None:
    """Create `path` (and missing parents) as 0700 directories; an existing one is left as it is."""
    path = Path(path)
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            continue
        os.chmod(d, 0o700)  # whatever the umask


def not_group_writable(path) -> None:
    """Clear the group and other write bits of a file frost wrote (whatever the umask)."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.chmod(path, mode & ~(stat.S_IWGRP | stat.S_IWOTH))
