"""benchmarks/results stays light: one README.md per run folder (and loose .md summaries), no raw logs, patches,
JSON or PNG files committed (.gitignore keeps them out; a forced add fails here)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_only_readmes_are_committed_under_results():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to list the committed files")
    files = subprocess.run(
        ["git", "ls-files", "benchmarks/results"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert files, "benchmarks/results lists no committed file"
    bulky = [f for f in files if not f.endswith(".md") or (f.count("/") > 2 and not f.endswith("/README.md"))]
    assert not bulky, f"commit one README.md per run, not raw files: {bulky}"
