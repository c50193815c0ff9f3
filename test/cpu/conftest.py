"""CPU-suite fixtures: the cuDNN engine's binding is absent unless a test asks for it.

Routing on the fake targets must not depend on whether nvidia-cudnn-frontend happens to be installed.
"""

from __future__ import annotations

import pytest

import frost.adapters.cudnn as cudnn_adapter
from frost.compiler import cache
from frost.compiler import compile as boundary


@pytest.fixture(autouse=True)
def _cudnn_binding_absent(monkeypatch):
    monkeypatch.setattr(cudnn_adapter, "cudnn_missing_reason", lambda: cudnn_adapter.CUDNN_MISSING)


@pytest.fixture
def cudnn_present(monkeypatch):
    """The cuDNN engine as if its binding imported (fake targets never reach cuDNN itself)."""
    monkeypatch.setattr(cudnn_adapter, "cudnn_missing_reason", lambda: None)


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty kernel cache directory (returned), an empty memo and zeroed counters."""
    d = tmp_path / "cache"
    monkeypatch.setenv("FROST_CACHE_DIR", str(d))
    monkeypatch.delenv("FROST_CACHE_DISABLE", raising=False)
    monkeypatch.delenv("FROST_CACHE_MAX_BYTES", raising=False)
    boundary.clear_memo()
    cache.reset_stats()
    yield d
    boundary.clear_memo()
