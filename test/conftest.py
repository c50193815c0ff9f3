"""Fixtures shared by the test suites."""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import sys
import tempfile

import pytest


def _private_cache_dir() -> None:
    """Tests never write to ~/.cache/frost: unless FROST_CACHE_DIR is set, the session (and every
    subprocess it starts) caches kernels in a temporary directory removed at exit."""
    if os.environ.get("FROST_CACHE_DIR"):
        return
    d = tempfile.mkdtemp(prefix="frost-test-cache-")
    os.environ["FROST_CACHE_DIR"] = d
    atexit.register(shutil.rmtree, d, ignore_errors=True)


_private_cache_dir()

import frost.engines.dsl  # noqa: E402
from frost.lowering import capabilities  # noqa: E402


def patch_dsl_reason(monkeypatch, reason):
    """Make `frost.engines.dsl.dsl_decline_reason` answer `reason`, wherever it was imported by name.

    Every adapter module is imported first, so none binds the fake after the patch is undone.
    """
    for row in capabilities.ROWS:
        importlib.import_module(row.adapter.split(":")[0])
    original = frost.engines.dsl.dsl_decline_reason
    fake = lambda: reason  # noqa: E731
    monkeypatch.setattr(frost.engines.dsl, "dsl_decline_reason", fake)
    for name, mod in list(sys.modules.items()):
        if name.startswith("frost.") and getattr(mod, "dsl_decline_reason", None) is original:
            monkeypatch.setattr(mod, "dsl_decline_reason", fake)


@pytest.fixture
def unpended(monkeypatch):
    """Capability rows as if every kernel were available, and a usable DSL (no kernel is compiled)."""
    rows = tuple(r.model_copy(update={"pending": None}) for r in capabilities.ROWS)
    monkeypatch.setattr(capabilities, "ROWS", rows)
    patch_dsl_reason(monkeypatch, None)
    return rows


@pytest.fixture
def no_compile(monkeypatch):
    """Fail loudly if anything tries to compile a kernel."""
    import frost.compiler.compile as compile_mod

    def refuse(*a, **k):
        raise AssertionError("a kernel compile was attempted in a CPU test")

    monkeypatch.setattr(compile_mod, "compile_kernel", refuse)
