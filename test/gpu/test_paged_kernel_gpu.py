"""The mma.sync forward (`engine="sm80"`) reading cuDNN's paged K/V cache through its block tables, on a GPU:
against the float64 gather-then-attend oracle of test/cpu/test_paged_kv.py (block sizes 64, 128, 256; GQA,
bottom-right causal, decode, windows, sinks, empty sequences), and a CUDA-graph replay after a new table and new
lengths are written into the same tensors. Run: python3 -m pytest -q -m gpu test/gpu/test_paged_kernel_gpu.py
"""
from __future__ import annotations

import pytest
import torch

from test.cpu.test_paged_kv import _close, _oracle, _paged

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16


def _on_gpu(g, pack, x):
    """The variant pack on the GPU, and the graph built on the mma.sync forward."""
    dev = {t: v.cuda() for t, v in pack.items()}
    g.validate()
    g.build_plans(engine="sm80")
    assert g.engine_name == "SdpaFwdDslSm80", g.engine_name
    return dev


def _workspace(g):
    """The plan's workspace (a decode over a long cache may be split: its partials live there)."""
    return torch.empty(max(g.get_workspace_size(), 1), dtype=torch.uint8, device="cuda")


def _outputs(pack, dev, x):
    """x with the GPU's O and Stats in place of the CPU buffers the oracle compares."""
    torch.cuda.synchronize()
    for key in ("out", "lse"):
        t = next(t for t, v in pack.items() if v is x[key])
        x[key] = dev[t].float().cpu() if key == "out" else dev[t].cpu()
    return x


CASES = {
    "gqa causal": (dict(use_causal_mask_bottom_right=True), dict(causal_bottom_right=True), False),
    "window": (dict(use_causal_mask_bottom_right=True, sliding_window_length=70),
               dict(causal_bottom_right=True, sliding_window_length=70), False),
    "sinks": (dict(use_causal_mask_bottom_right=True), dict(causal_bottom_right=True), True),
    "no mask": ({}, {}, False),
}


@pytest.mark.parametrize("block_size", [64, 128, 256])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("case", list(CASES))
def test_paged_forward_matches_gather_then_attend(block_size, d, case):
    kw, mask, sink = CASES[case]
    lens_q, lens_kv = [7, 1, 0, 5], [700, 33, 0, block_size]  # prefill, decode, empty, one whole block
    g, pack, x = _paged((4, 8, 7, d), 2, d, block_size, 700, lens_q, lens_kv, dtype=BF16, sink=sink,
                        seed=block_size + d, **kw)
    dev = _on_gpu(g, pack, x)
    g.execute(dev, _workspace(g))
    _close(_outputs(pack, dev, x), _oracle(x, **mask), 2e-2)


def test_decode_replays_in_a_cuda_graph_with_a_new_table_and_new_lengths():
    """Captured once; a replay after a new table and new lengths are copied into the same device tensors gives
    the oracle's answer for those values (nothing about either is read on the host)."""
    lens_q, lens_kv = [1, 1, 1], [300, 64, 5]
    g, pack, x = _paged((3, 8, 1, 128), 2, 128, 64, 320, lens_q, lens_kv, dtype=BF16, spare_blocks=20,
                        use_causal_mask_bottom_right=True)
    dev = _on_gpu(g, pack, x)
    ws = _workspace(g)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        g.execute(dev, ws)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        g.execute(dev, ws)
    key = {name: next(t for t, v in pack.items() if v is x[name]) for name in ("kt", "vt")}
    lk = next(t for t, v in pack.items() if v.dtype == torch.int32 and v.numel() == 3 and v.flatten()[0] == 300)
    new_lens = [17, 320, 0]
    num_blocks = x["kc"].shape[0]
    for name in ("kt", "vt"):  # other blocks of the pool, in another order
        fresh = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(7))[:x[name].numel()]
        x[name] = fresh.to(torch.int32).reshape(x[name].shape)
        dev[key[name]].copy_(x[name])
    dev[lk].copy_(torch.tensor(new_lens, dtype=torch.int32).reshape(3, 1, 1, 1))
    x["lens_kv"] = new_lens
    graph.replay()
    _close(_outputs(pack, dev, x), _oracle(x, causal_bottom_right=True), 2e-2)
