"""The mma.sync forward (`engine="sm80"`) and, on cc 9.0, the wgmma forward (`engine="sm90"`) reading cuDNN's
paged K/V cache through its block tables, on a GPU: against the float64 gather-then-attend oracle of
test/cpu/test_paged_kv.py (block sizes 16 to 256, the blocks of 16 and 32 rows spanned by a key tile; GQA,
bottom-right causal, decode, chunked prefill, windows, sinks, empty sequences, K and V in blocks of different
sizes), and a CUDA-graph replay after a new table and new lengths are written into the same tensors.
Run: python3 -m pytest -q -m gpu test/gpu/test_paged_kernel_gpu.py
"""

from __future__ import annotations

import pytest
import torch

from test import oracle
from test.cpu.test_paged_kv import _close, _oracle, _paged

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16


def _on_gpu(g, pack, x, engine="sm80"):
    """The variant pack on the GPU, and the graph built on the mma.sync (`sm80`) or wgmma (`sm90`) forward."""
    dev = {t: v.cuda() for t, v in pack.items()}
    g.validate()
    g.build_plans(engine=engine)
    assert g.engine_name == {"sm80": "SdpaFwdDslSm80", "sm90": "SdpaFwdDslSm90"}[engine], g.engine_name
    return dev


def _needs_sm90():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma forward runs on cc 9.0 only")


def _close_to_oracle(x, ref, name):
    """O (every row: those past seq_len_q are zeros in both) and the LSE of the rows inside each sequence, against
    the float64 oracle (`oracle.assert_close_to_oracle`: norm-relative and per-element bounds)."""
    o, lse = ref
    valid = torch.zeros(lse.shape, dtype=torch.bool)
    for i, n in enumerate(x["lens_q"]):
        valid[i, :, :n] = True
    oracle.assert_close_to_oracle(x["out"], o, rel=2e-2, name=f"{name} O", io_dtype=BF16)
    oracle.assert_close_to_oracle(x["lse"][..., 0][valid], lse[valid], rel=1e-3, max_abs=2e-2, name=f"{name} LSE")


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
    "window": (
        dict(use_causal_mask_bottom_right=True, sliding_window_length=70),
        dict(causal_bottom_right=True, sliding_window_length=70),
        False,
    ),
    "sinks": (dict(use_causal_mask_bottom_right=True), dict(causal_bottom_right=True), True),
    "no mask": ({}, {}, False),
}


@pytest.mark.parametrize("block_size", [16, 32, 64, 128, 256])  # 16, 32: a key tile spans several blocks
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("case", list(CASES))
def test_paged_forward_matches_gather_then_attend(block_size, d, case):
    kw, mask, sink = CASES[case]
    lens_q, lens_kv = [7, 1, 0, 5], [700, 33, 0, block_size]  # prefill, decode, empty, one whole block
    g, pack, x = _paged(
        (4, 8, 7, d), 2, d, block_size, 700, lens_q, lens_kv, dtype=BF16, sink=sink, seed=block_size + d, **kw
    )
    dev = _on_gpu(g, pack, x)
    g.execute(dev, _workspace(g))
    _close(_outputs(pack, dev, x), _oracle(x, **mask), 2e-2)


def test_decode_replays_in_a_cuda_graph_with_a_new_table_and_new_lengths():
    """Captured once; a replay after a new table and new lengths are copied into the same device tensors gives
    the oracle's answer for those values (nothing about either is read on the host)."""
    lens_q, lens_kv = [1, 1, 1], [300, 64, 5]
    g, pack, x = _paged(
        (3, 8, 1, 128), 2, 128, 64, 320, lens_q, lens_kv, dtype=BF16, spare_blocks=20, use_causal_mask_bottom_right=True
    )
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
        fresh = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(7))[: x[name].numel()]
        x[name] = fresh.to(torch.int32).reshape(x[name].shape)
        dev[key[name]].copy_(x[name])
    dev[lk].copy_(torch.tensor(new_lens, dtype=torch.int32).reshape(3, 1, 1, 1))
    x["lens_kv"] = new_lens
    graph.replay()
    _close(_outputs(pack, dev, x), _oracle(x, causal_bottom_right=True), 2e-2)


SHAPES = {
    # (q dims (B, Hq, S_q, d), S_kv envelope, lens_q, lens_kv): prefill, decode, empty, one whole block
    "prefill": ((4, 8, 7, None), 700, [7, 1, 0, 5], [700, 33, 0, None]),
    # chunked prefill: several query tiles per sequence against a longer cache (bottom-right aligned)
    "chunked": ((3, 8, 300, None), 1100, [300, 129, 1], [1100, 600, 1]),
}


def _matches(engine, block_size, d, case, shape):
    """One forward of SHAPES' `shape` with CASES' `case` on `engine` against the oracle."""
    kw, mask, sink = CASES[case]
    dims, max_kv, lens_q, lens_kv = SHAPES[shape]
    lens_kv = [block_size if n is None else n for n in lens_kv]
    g, pack, x = _paged(
        (*dims[:3], d), 2, d, block_size, max_kv, lens_q, lens_kv, dtype=BF16, sink=sink, seed=block_size + d, **kw
    )
    dev = _on_gpu(g, pack, x, engine)
    g.execute(dev, _workspace(g))
    _close_to_oracle(_outputs(pack, dev, x), _oracle(x, **mask), f"{engine} {shape} {case} bs{block_size} d{d}")


def _decode(engine, block_size, hq, hkv):
    """Decode (one query row per sequence, GQA `hq`:`hkv`) on `engine` against the oracle."""
    lens_kv = [1000, 1, 0, 257, block_size]
    g, pack, x = _paged(
        (5, hq, 1, 128),
        hkv,
        128,
        block_size,
        1000,
        [1] * 5,
        lens_kv,
        dtype=BF16,
        seed=block_size + hq,
        use_causal_mask_bottom_right=True,
    )
    dev = _on_gpu(g, pack, x, engine)
    g.execute(dev, _workspace(g))
    _close_to_oracle(_outputs(pack, dev, x), _oracle(x, causal_bottom_right=True), f"{engine} decode bs{block_size}")


def _replay(engine, sq, block_size):
    """Captured once on `engine`; a replay after a new table and new lengths (keys and query rows) are copied into
    the same device tensors gives the oracle's answer for those values (nothing about them is read on the host)."""
    lens_q, lens_kv = [sq, sq, 1], [300, 64, 5]
    g, pack, x = _paged(
        (3, 8, sq, 128),
        2,
        128,
        block_size,
        320,
        lens_q,
        lens_kv,
        dtype=BF16,
        spare_blocks=20,
        use_causal_mask_bottom_right=True,
    )
    dev = _on_gpu(g, pack, x, engine)
    ws = _workspace(g)  # a split plan's partials live there; allocated before the capture
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        g.execute(dev, ws)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        g.execute(dev, ws)
    key = {name: next(t for t, v in pack.items() if v is x[name]) for name in ("kt", "vt")}
    lq, lk = (
        next(t for t, v in pack.items() if v.dtype == torch.int32 and v.numel() == 3 and v.flatten().tolist() == lens)
        for lens in (lens_q, lens_kv)
    )
    new_q, new_kv = [max(1, sq // 2), sq, 0], [17, 320, 0]
    num_blocks = x["kc"].shape[0]
    for name in ("kt", "vt"):  # other blocks of the pool, in another order
        fresh = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(7))[: x[name].numel()]
        x[name] = fresh.to(torch.int32).reshape(x[name].shape)
        dev[key[name]].copy_(x[name])
    dev[lk].copy_(torch.tensor(new_kv, dtype=torch.int32).reshape(3, 1, 1, 1))
    dev[lq].copy_(torch.tensor(new_q, dtype=torch.int32).reshape(3, 1, 1, 1))
    x["lens_q"], x["lens_kv"] = new_q, new_kv
    dev[next(t for t, v in pack.items() if v is x["out"])].fill_(float("nan"))  # poison: every row is written
    graph.replay()
    name = f"{engine} replay sq{sq} bs{block_size}"
    _close_to_oracle(_outputs(pack, dev, x), _oracle(x, causal_bottom_right=True), name)


# the mma.sync forward beside the wgmma forward's cases: chunked prefill, packed decode, replay -------------------
@pytest.mark.parametrize("block_size", [16, 32, 64])
@pytest.mark.parametrize("d", [64, 80, 128])
@pytest.mark.parametrize("case", list(CASES))
def test_sm80_paged_chunked_prefill_matches_the_oracle(block_size, d, case):
    """Several query tiles per sequence against a longer cache; d=80 pads its tiles to 96 columns (with 16-row
    blocks each copy pass of 32 rows spans two blocks)."""
    _matches("sm80", block_size, d, case, "chunked")


@pytest.mark.parametrize("block_size", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("hq,hkv", [(8, 2), (32, 8), (8, 1)])
def test_sm80_paged_decode_matches_the_oracle(block_size, hq, hkv):
    """Decode: the query heads of a K/V head packed into one M tile (the plan may split a long cache's keys)."""
    _decode("sm80", block_size, hq, hkv)


@pytest.mark.parametrize("block_size", [16, 32, 64])
@pytest.mark.parametrize("sq", [1, 40])
def test_sm80_replays_in_a_cuda_graph_with_a_new_table_and_new_lengths(sq, block_size):
    _replay("sm80", sq, block_size)


# the wgmma forward (cc 9.0) ------------------------------------------------------------------------------------
@pytest.mark.parametrize("block_size", [16, 32, 64, 128, 256])  # 16, 32: a key tile spans several blocks
@pytest.mark.parametrize("d", [64, 80, 128])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_sm90_paged_forward_matches_the_oracle(block_size, d, case, shape):
    """GQA 8:2 (packed into the M tile) with every band of CASES, sinks, ragged and empty sequences; d=80 pads its
    tiles to 96 columns."""
    _needs_sm90()
    _matches("sm90", block_size, d, case, shape)


@pytest.mark.parametrize("block_size", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("hq,hkv", [(8, 2), (32, 8), (8, 1)])
def test_sm90_paged_decode_matches_the_oracle(block_size, hq, hkv):
    """Decode (one query row per sequence): the query heads of a K/V head packed into one M tile."""
    _needs_sm90()
    _decode("sm90", block_size, hq, hkv)


@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("sq", [1, 40])
def test_sm90_replays_in_a_cuda_graph_with_a_new_table_and_new_lengths(sq, block_size):
    _needs_sm90()
    _replay("sm90", sq, block_size)


# both forwards ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["sm80", "sm90"])
@pytest.mark.parametrize("blocks", [(16, 128), (64, 32), (256, 64)])
def test_k_and_v_in_blocks_of_different_sizes(engine, blocks):
    """K's container in blocks of one size and V's in another, each read through its own table (a key tile inside
    one block on one side, spanning several on the other): prefill, decode and empty rows, causal, sinks."""
    if engine == "sm90":
        _needs_sm90()
    g, pack, x = _paged(
        (4, 8, 7, 128),
        2,
        128,
        blocks,
        700,
        [7, 1, 0, 5],
        [700, 33, 0, 256],
        dtype=BF16,
        sink=True,
        seed=sum(blocks),
        use_causal_mask_bottom_right=True,
    )
    dev = _on_gpu(g, pack, x, engine)
    g.execute(dev, _workspace(g))
    _close_to_oracle(_outputs(pack, dev, x), _oracle(x, causal_bottom_right=True), f"{engine} K/V blocks {blocks}")
