"""CPU-suite fixtures: the cuDNN engine's binding is absent unless a test asks for it.

Routing on the fake targets must not depend on whether nvidia-cudnn-frontend happens to be installed.
"""
from __future__ import annotations

import pytest

import frost.adapters.cudnn as cudnn_adapter


@pytest.fixture(autouse=True)
def _cudnn_binding_absent(monkeypatch):
    monkeypatch.setattr(cudnn_adapter, "cudnn_missing_reason", lambda: cudnn_adapter.CUDNN_MISSING)


@pytest.fixture
def cudnn_present(monkeypatch):
    """The cuDNN engine as if its binding imported (fake targets never reach cuDNN itself)."""
    monkeypatch.setattr(cudnn_adapter, "cudnn_missing_reason", lambda: None)
