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
    run = subprocess.run([sys.executable, "-W", "default", "-c", blocked], capture_output=True, text=True,
                         timeout=120)
    if "Failed to initialize NumPy" not in run.stderr:
        pytest.skip("this torch imports without numpy quietly; numpy is then not needed to start it")
    assert "numpy" in _declared(), "pyproject's base dependencies must hold numpy (torch warns without it)"
    quiet = subprocess.run([sys.executable, "-W", "default", "-c", "import torch"], capture_output=True, text=True,
                           timeout=120)
    assert "NumPy" not in quiet.stderr, quiet.stderr
