"""The `frost` command: `--version`, `info`, `demo`, `bench`, `precompile`.

`frost info` answers a newcomer's first questions about this machine: versions, the GPU, which engines serve a
representative graph here and why the others do not, and the kernel cache. Messages go through the `frost`
logger (console_logging() shows them on stderr); results go to stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
from importlib import metadata

USAGE = "usage: frost [--version] {info,demo,bench,precompile} [options]   (frost <command> --help for each)"
_log = logging.getLogger(__name__)


class _Stderr(logging.StreamHandler):
    """A handler on whatever sys.stderr is when a message is written (not when the handler was made)."""

    _frost_console = True

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _):
        pass


def console_logging(level: int = logging.INFO) -> None:
    """Show the `frost` logger's messages on stderr, bare, once per process (the commands call it; a program
    using frost as a library configures logging itself)."""
    log = logging.getLogger("frost")
    if not any(getattr(h, "_frost_console", False) for h in log.handlers):
        log.addHandler(_Stderr())
    log.setLevel(level)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _driver_version() -> str:
    """The CUDA driver's version through cuda-bindings (no context is created), or why it is unknown."""
    try:
        import cuda.bindings.driver as drv
    except ImportError:
        return "unknown (cuda-bindings is not installed)"
    try:
        err, v = drv.cuDriverGetVersion()
    except Exception as e:  # no libcuda at all
        return f"none (no NVIDIA driver library: {type(e).__name__})"
    if getattr(err, "value", err) != 0 or not v:
        return "none"
    return f"CUDA {v // 1000}.{(v % 1000) // 10}"


def _representative_graphs(target):
    """A bf16 causal forward and backward (B=1, 8 heads, 512 tokens, d=128): the graph most engines serve."""
    import torch

    import frost

    b, h, s, d = 1, 8, 512, 128
    dims, strides = (b, h, s, d), (s * h * d, d, h * d, 1)
    out = {}
    for direction in ("fwd", "bwd"):
        g = frost.Graph(
            io_data_type=torch.bfloat16,
            intermediate_data_type=torch.float32,
            compute_data_type=torch.float32,
            target=target,
            name=f"info_{direction}",
        )
        q, k, v = (g.tensor(name=n, dim=dims, stride=strides) for n in ("q", "k", "v"))
        if direction == "fwd":
            o, _ = g.sdpa(q, k, v, attn_scale=d**-0.5, generate_stats=False, use_causal_mask=True)
            o.set_output(True)
        else:
            o, do = (g.tensor(name=n, dim=dims, stride=strides) for n in ("o", "dO"))
            stats = g.tensor(name="stats", dim=(b, h, s, 1), stride=(h * s, s, 1, 1), data_type=torch.float32)
            for t in g.sdpa_backward(q, k, v, o, do, stats, attn_scale=d**-0.5, use_causal_mask=True):
                t.set_output(True)
        out[direction] = g
    return out


def engines_here(target) -> dict:
    """{direction: {"serve": [engine, ...] best first, "decline": {engine: reason}}} for the representative graph."""
    report = {}
    for direction, g in _representative_graphs(target).items():
        report[direction] = {
            "graph": "bf16, causal, d=128, 8 heads, 512 tokens",
            "serve": g.available_engines(),
            "decline": dict(g.declines()),
        }
    return report


def info_dict(target=None) -> dict:
    """What `frost info` prints, as data. `target` defaults to this machine's device (or the CPU)."""
    import torch

    from frost.cache import describe
    from frost.engines.dsl import dsl_decline_reason
    from frost.target import discover_target
    from frost.version import __version__

    t = target if target is not None else discover_target()
    cuda = torch.cuda.is_available()
    gpu = (
        {"name": t.name, "compute_capability": f"{t.cc_major}.{t.cc_minor}", "arch": t.arch, "sm_count": t.sm_count}
        if not t.is_cpu
        else None
    )
    cache = describe()
    return {
        "frost": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": cuda,
        "driver": _driver_version(),
        "target": t.name + (" (fake)" if t.is_fake and "(fake)" not in t.name else ""),
        "gpu": gpu,
        "cute_dsl": _version("nvidia-cutlass-dsl"),
        "cute_dsl_usable": dsl_decline_reason() or "yes",
        "tvm_ffi": _version("apache-tvm-ffi"),
        "cudnn_frontend": _version("nvidia-cudnn-frontend"),
        "torch_cudnn": torch.backends.cudnn.version() if cuda else None,
        "engines": engines_here(t),
        "cache": {
            "dir": cache["dir"],
            "enabled": cache["enabled"],
            "bytes": cache["bytes"],
            "max_bytes": cache["max_bytes"],
        },
    }


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def render_info(d: dict) -> str:
    gpu = d["gpu"]
    lines = [
        f"frost {d['frost']} (python {d['python']}, {d['platform']})",
        f"torch {d['torch']}  CUDA build {d['torch_cuda'] or 'none (CPU build)'}  driver {d['driver']}",
        (
            "GPU " + f"{gpu['name']}, compute capability {gpu['compute_capability']} ({gpu['arch']}), "
            f"{gpu['sm_count']} SMs"
        )
        if gpu
        else "GPU none: the reference engine (CPU) serves every graph here",
        f"CuTe DSL (nvidia-cutlass-dsl) {d['cute_dsl']}"
        + ("" if d["cute_dsl_usable"] == "yes" else f": {d['cute_dsl_usable']}"),
        f"apache-tvm-ffi {d['tvm_ffi']}  nvidia-cudnn-frontend {d['cudnn_frontend']}"
        + (f"  cuDNN (torch's) {d['torch_cudnn']}" if d["torch_cudnn"] else ""),
        "",
        f"engines on {d['target']}:",
    ]
    for direction, e in d["engines"].items():
        lines.append(f"  {direction} ({e['graph']}): " + (", ".join(e["serve"]) or "no engine serves it"))
        for name, why in e["decline"].items():
            lines.append(f"    - {name}: {why}")
    c = d["cache"]
    lines += [
        "",
        f"kernel cache: {c['dir']} ({_mib(c['bytes'])} of {_mib(c['max_bytes'])}"
        + ("" if c["enabled"] else "; disabled by FROST_CACHE_DISABLE")
        + ")",
    ]
    return "\n".join(lines)


def _target_arg(name: str):
    if name in (None, "auto"):
        return None
    from frost.target import fake_target

    return fake_target(name)


def info_main(argv=None) -> int:
    from frost.target import FAKE_TARGETS

    ap = argparse.ArgumentParser(prog="frost info", description="What frost sees on this machine.")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument(
        "--target", default="auto", help=f"auto (this machine) or a fake target to ask about: {', '.join(FAKE_TARGETS)}"
    )
    a = ap.parse_args(argv)
    try:
        target = _target_arg(a.target)
    except ValueError as e:
        ap.error(str(e))
    d = info_dict(target)
    print(json.dumps(d, indent=1) if a.json else render_info(d))
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    console_logging()
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if argv[0] in ("-V", "--version"):
        from frost.version import __version__

        print(f"frost {__version__}")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "info":
        run = info_main
    elif cmd == "demo":
        from frost.demo import main as run
    elif cmd == "bench":
        from frost.bench.cli import main as run
    elif cmd == "precompile":
        from frost.plans.precompile import main as run
    else:
        _log.error("frost: unknown command %r\n%s", cmd, USAGE)
        return 2
    return int(run(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
