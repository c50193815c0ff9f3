"""Where a result came from: GPU, driver, library versions and the frost commit measured."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from importlib import metadata


def dist_version(*names: str) -> str | None:
    """The installed version of the first distribution found among `names`."""
    for n in names:
        try:
            return metadata.version(n)
        except metadata.PackageNotFoundError:
            continue
        except Exception:
            continue
    return None


def _run(cmd: list[str], cwd: str | None = None) -> str | None:
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10)
    except Exception:
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def frost_commit() -> str:
    """$FROST_COMMIT when set (a copied tree's git metadata may be stale), else `git rev-parse HEAD`
    of the checkout frost is imported from (+ '-dirty'), else 'unknown'."""
    if os.environ.get("FROST_COMMIT"):
        return os.environ["FROST_COMMIT"]
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sha = _run(["git", "rev-parse", "HEAD"], cwd=here)
    if sha:
        dirty = _run(["git", "status", "--porcelain", "--untracked-files=no", "--", "frost"], cwd=here)
        return sha + ("-dirty" if dirty else "")
    return "unknown"


def driver_version() -> str | None:
    out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if out:
        return out.splitlines()[0].strip()
    try:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
            return f"CUDA driver API {v.value // 1000}.{(v.value % 1000) // 10}"
    except Exception:
        pass
    return None


def static_env() -> dict:
    """Everything that needs no GPU."""
    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join([os.path.basename(sys.executable), "-m", "frost.bench"] + sys.argv[1:]),
        "frost_commit": frost_commit(),
        "cutlass_dsl": dist_version("nvidia-cutlass-dsl"),
        "tvm_ffi": dist_version("apache-tvm-ffi"),
        "flash_attn_4": dist_version("flash-attn-4", "flash_attn_4", "fa4"),
    }
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda"] = torch.version.cuda
    except Exception:
        pass
    return env


def gpu_env() -> dict:
    """GPU facts; call only when a device is present."""
    import torch

    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    env = {
        "gpu": p.name,
        "cc": f"{p.major}.{p.minor}",
        "sm_count": p.multi_processor_count,
        "l2_bytes": int(getattr(p, "L2_cache_size", 0) or 0),
        "memory_bytes": int(p.total_memory),
        "driver": driver_version(),
    }
    try:
        v = torch.backends.cudnn.version()
        env["cudnn"] = f"{v // 10000}.{(v % 10000) // 100}.{v % 100}" if v and v >= 10000 else str(v)
    except Exception:
        env["cudnn"] = None
    return env


def slug(text: str) -> str:
    out = "".join(c.lower() if c.isalnum() else "-" for c in text)
    while "--" in out:
        out = out.replace("--", "-")
    return out.strip("-") or "gpu"
