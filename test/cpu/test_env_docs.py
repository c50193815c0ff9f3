"""Every FROST_* environment variable that frost, its tests or its benchmarks read is documented in
docs/troubleshooting.md (a new one without a line there fails here)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# reads of the environment: os.environ.get("X"), os.environ["X"], os.getenv("X"), env.get("X"), setenv("X", ...)
_READ = re.compile(r"""(?:environ(?:\.get)?|getenv|setenv|delenv)\s*[\(\[]\s*["'](FROST_[A-Z0-9_]+)["']""")


def env_vars_read() -> set[str]:
    names = set()
    for folder in ("frost", "test", "benchmarks", "tools", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            names |= set(_READ.findall(path.read_text()))
    return names


def test_every_frost_env_var_is_documented():
    names = env_vars_read()
    assert {"FROST_CACHE_DIR", "FROST_CACHE_DISABLE", "FROST_TORCH_PLAN_CACHE_SIZE"} <= names  # the scan works
    doc = (ROOT / "docs" / "troubleshooting.md").read_text()
    missing = sorted(n for n in names if f"`{n}`" not in doc)
    assert not missing, f"FROST_* variables read but not documented in docs/troubleshooting.md: {missing}"
