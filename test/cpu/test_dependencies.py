"""The dependencies pyproject.toml declares are the ones a fresh install needs to run quietly."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

ROOT = Path(__file__).resolve().parents[2]


def _declared(group: str | None = None) -> dict[str, str]:
    """{package: its version specifier} of the base dependencies (or of an extra)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] if group is None else project["optional-dependencies"][group]
    out = {}
    for r in reqs:
        m = re.match(r"\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*([^;]*)", r)
        out[m.group(1).lower()] = m.group(3).strip()
    return out


def test_torch_starts_quietly_on_the_base_dependencies():
    """`import torch` without numpy warns on every run (the demo's first line on a fresh machine): torch's wheel
    does not bring numpy, so frost's base dependencies must."""
    blocked = "import sys; sys.modules['numpy'] = None; import torch"
    run = subprocess.run([sys.executable, "-W", "default", "-c", blocked], capture_output=True, text=True, timeout=120)
    if "Failed to initialize NumPy" not in run.stderr:
        pytest.skip("this torch imports without numpy quietly; numpy is then not needed to start it")
    assert "numpy" in _declared(), "pyproject's base dependencies must hold numpy (torch warns without it)"
    quiet = subprocess.run(
        [sys.executable, "-W", "default", "-c", "import torch"], capture_output=True, text=True, timeout=120
    )
    assert "NumPy" not in quiet.stderr, quiet.stderr


def _floor(spec: str) -> tuple:
    """The version a `>=` specifier names, as a tuple of ints (() when there is none)."""
    m = re.search(r">=\s*([0-9][0-9.]*)", spec)
    return tuple(int(x) for x in m.group(1).split(".")) if m else ()


def test_declared_minimums_are_the_versions_the_code_checks():
    """CI installs the newest versions each bound allows, so a floor in pyproject.toml is tested only through
    the checks the code makes itself: the CuTe DSL's (`frost.engines.dsl.MIN_DSL`, a decline below it) and the
    cuDNN frontend's (`MIN_FRONTEND`). Each declared floor must be the one its check enforces."""
    from frost.adapters.cudnn import MIN_FRONTEND
    from frost.engines.dsl import MIN_DSL

    for group in ("kernels", "cu13"):
        assert _floor(_declared(group)["nvidia-cutlass-dsl"]) == MIN_DSL, group
    assert _floor(_declared("cudnn")["nvidia-cudnn-frontend"])[:2] == MIN_FRONTEND


# torch APIs frost calls without a fallback, and the release that brought each (newer ones are looked up and
# declined by name where missing, e.g. the SDPA provider registry of torch 2.10: frost/torch_face/provider.py)
TORCH_APIS = {"torch.library.custom_op": (2, 4), "torch.library.register_fake": (2, 4), "torch.library.opcheck": (2, 4)}


def test_the_torch_floor_covers_the_apis_called_without_a_fallback():
    source = "\n".join(p.read_text() for p in (ROOT / "frost").rglob("*.py"))
    used = {api: since for api, since in TORCH_APIS.items() if api.rsplit(".", 1)[1] in source}
    assert used, "none of the listed torch APIs is called any more: update TORCH_APIS"
    assert _floor(_declared()["torch"]) >= max(used.values())
