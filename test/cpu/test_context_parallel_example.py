"""examples/context_parallel.py with 2 gloo processes (launched as torchrun would: RANK, WORLD_SIZE, MASTER_*
in the environment) trains the same model as the single-process run: every one of 100 losses within 1%."""

from __future__ import annotations

import functools
import importlib.util
import json
import multiprocessing
import os
import socket
from pathlib import Path

import pytest
import torch

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "context_parallel.py"
ARGS = [
    "--device",
    "cpu",
    "--layers",
    "1",
    "--width",
    "32",
    "--heads",
    "2",
    "--context",
    "32",
    "--batch",
    "4",
    "--steps",
    "100",
    "--data-mb",
    "0.25",
    "--log-every",
    "1000",
]


def _example():
    spec = importlib.util.spec_from_file_location("context_parallel_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.stdlib_bytes = functools.lru_cache(maxsize=None)(mod.stdlib_bytes)  # read once, before the fork
    return mod


def _rank(rank, world, port, out, example):
    torch.set_num_threads(1)
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    example.main(ARGS + ["--out", out])


def test_two_ranks_train_as_one(tmp_path):
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("runs the ranks as forked processes")
    import torch.multiprocessing as mp

    example = _example()
    import frost.distributed  # noqa: F401  (imported once, before the fork)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = example.main(ARGS)["losses"]
    finally:
        torch.set_num_threads(threads)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "cp.json"
    mp.start_processes(_rank, args=(2, port, str(out), example), nprocs=2, join=True, start_method="fork")
    cp = json.loads(out.read_text())
    assert cp["world"] == 2 and len(cp["losses"]) == len(single) == 100
    worst = max(abs(a - b) / abs(b) for a, b in zip(cp["losses"], single))
    assert worst <= 0.01, f"context-parallel losses drift from the single process's by up to {worst:.2%}"
    assert single[-1] < single[0] - 0.5  # it trains
