"""Run a kernel-compiling script in a fresh interpreter (PTX kept, no cache, no GPU) and read its RESULT line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_compile_script(script: str, args: list, cwd, timeout: int = 600) -> list:
    env = dict(os.environ, CUTE_DSL_KEEP="ptx", FROST_CACHE_DISABLE="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", script, *args], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr[-4000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])
