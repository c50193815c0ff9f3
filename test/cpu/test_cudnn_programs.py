"""cuDNN frontend SDPA programs, run against frost with only the import changed.

Each program below is written as a cuDNN frontend user writes it (the call sequence and keywords of cuDNN's
samples and tests: `pygraph`, positional `tensor(dim, stride, data_type)`, `tensor_like`, every SDPA keyword
at its "off" value, `set_ragged_offset`, handles with streams, `heur_mode`, `build_plan_policy`). The test
swaps `import cudnn` for `import frost as cudnn`, runs the text, and checks the outputs against torch math.
On a CPU-only machine frost plans the reference engine.
"""

from __future__ import annotations

import math

import pytest
import torch

import frost

PROLOGUE = """
import math
import torch
import cudnn

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(1)
handle = cudnn.create_handle()
stream = torch.cuda.current_stream().cuda_stream if device == "cuda" else 0x5EED
cudnn.set_stream(handle=handle, stream=stream)
"""

DENSE_FWD = (
    PROLOGUE
    + """
b, h_q, h_kv, s_q, s_kv, d = 2, 4, 2, 24, 32, 64
attn_scale = 1.0 / math.sqrt(d)
q_gpu = torch.randn(b, s_q, h_q, d, dtype=torch.float16, device=device).transpose(1, 2)  # bshd in memory
k_gpu = torch.randn(b, h_kv, s_kv, d, dtype=torch.float16, device=device)
v_gpu = torch.randn(b, h_kv, s_kv, d, dtype=torch.float16, device=device)
o_gpu = torch.empty(b, s_q, h_q, d, dtype=torch.float16, device=device).transpose(1, 2)
stats_gpu = torch.empty(b, h_q, s_q, 1, dtype=torch.float32, device=device)

graph = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)
q = graph.tensor(q_gpu.size(), q_gpu.stride(), cudnn.data_type.HALF)
k = graph.tensor(name="k", dim=k_gpu.size(), stride=k_gpu.stride(), data_type=cudnn.data_type.HALF, uid=7)
v = graph.tensor_like(v_gpu)
o, stats = graph.sdpa(name="sdpa", q=q, k=k, v=v, is_inference=False, attn_scale=attn_scale, bias=None,
                      block_mask=None, use_alibi_mask=False, use_padding_mask=False, seq_len_q=None,
                      seq_len_kv=None, use_causal_mask=False, use_causal_mask_bottom_right=False,
                      sliding_window_length=None, diagonal_alignment=cudnn.diagonal_alignment.BOTTOM_RIGHT,
                      diagonal_band_left_bound=None, diagonal_band_right_bound=0, dropout=None, rng_dump=None,
                      paged_attention_k_table=None, paged_attention_v_table=None,
                      paged_attention_max_seq_len_kv=None, compute_data_type=cudnn.data_type.FLOAT,
                      score_mod=None, implementation=cudnn.attention_implementation.AUTO, score_max=None,
                      score_sum_exp=None, sink_token=None, unfuse_fma=False)
o.set_output(True).set_dim(o_gpu.size()).set_stride(o_gpu.stride())
stats.set_output(True).set_data_type(cudnn.data_type.FLOAT)

try:
    graph.validate()
except cudnn.cudnnGraphNotSupportedError as e:
    raise SystemExit(f"unsupported: {e}")
graph.build_operation_graph()
graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
graph.check_support()
graph.build_plans(cudnn.build_plan_policy.HEURISTICS_CHOICE)

variant_pack = {q: q_gpu, k: k_gpu, v: v_gpu, o: o_gpu, stats: stats_gpu, None: None}
workspace = torch.empty(graph.get_workspace_size(), device=device, dtype=torch.uint8)
graph.execute(variant_pack, workspace, handle=handle)
"""
)

DENSE_BWD = (
    DENSE_FWD
    + """
dO_gpu = torch.randn_like(o_gpu)
dQ_gpu, dK_gpu, dV_gpu = torch.empty_like(q_gpu), torch.empty_like(k_gpu), torch.empty_like(v_gpu)

bwd = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, intermediate_data_type=cudnn.data_type.FLOAT,
                    compute_data_type=cudnn.data_type.FLOAT, handle=handle)
bq, bk, bv = bwd.tensor_like(q_gpu), bwd.tensor_like(k_gpu), bwd.tensor_like(v_gpu)
bo, bdO, bstats = bwd.tensor_like(o_gpu), bwd.tensor_like(dO_gpu), bwd.tensor_like(stats_gpu)
dQ, dK, dV = bwd.sdpa_backward(q=bq, k=bk, v=bv, o=bo, dO=bdO, stats=bstats, attn_scale=attn_scale, bias=None,
                               dBias=None, use_alibi_mask=False, use_padding_mask=False, seq_len_q=None,
                               seq_len_kv=None, max_total_seq_len_q=None, max_total_seq_len_kv=None,
                               use_causal_mask=False, use_causal_mask_bottom_right=False,
                               sliding_window_length=None, diagonal_alignment=cudnn.diagonal_alignment.BOTTOM_RIGHT,
                               diagonal_band_left_bound=None, diagonal_band_right_bound=0, dropout=None,
                               rng_dump=None, use_deterministic_algorithm=True,
                               compute_data_type=cudnn.data_type.FLOAT, name="sdpa_backward", score_mod=None,
                               score_mod_bprop=None, sink_token=None, dSink_token=None)
dQ.set_output(True).set_dim(dQ_gpu.size()).set_stride(dQ_gpu.stride())
dK.set_output(True).set_dim(dK_gpu.size()).set_stride(dK_gpu.stride())
dV.set_output(True).set_dim(dV_gpu.size()).set_stride(dV_gpu.stride())
bwd.build([cudnn.heur_mode.A])
workspace = torch.empty(bwd.get_workspace_size(), device=device, dtype=torch.uint8)
bwd.execute({bq: q_gpu, bk: k_gpu, bv: v_gpu, bo: o_gpu, bdO: dO_gpu, bstats: stats_gpu, dQ: dQ_gpu, dK: dK_gpu,
             dV: dV_gpu}, workspace, handle)
cudnn.destroy_handle(handle)
"""
)

# cuDNN's packed (THD) form, as in its tests: (B, H, S, D) tensors over packed tokens, element offsets per batch
RAGGED_FWD = (
    PROLOGUE
    + """
b, h, s_q, s_kv, d = 3, 2, 16, 20, 64
attn_scale = 0.125
seq_len_q_gpu = torch.tensor([5, 16, 0], dtype=torch.int32, device=device).view(b, 1, 1, 1)
seq_len_kv_gpu = torch.tensor([7, 20, 3], dtype=torch.int32, device=device).view(b, 1, 1, 1)


def compute_exclusive_prefix_sum(tensor):
    return torch.cat((torch.zeros(1, 1, 1, 1, dtype=tensor.dtype, device=tensor.device), torch.cumsum(tensor, dim=0)))


q_ragged_offset_gpu = (compute_exclusive_prefix_sum(seq_len_q_gpu) * h * d).to(torch.int64)
kv_ragged_offset_gpu = (compute_exclusive_prefix_sum(seq_len_kv_gpu) * h * d).to(torch.int32)
stats_ragged_offset_gpu = (compute_exclusive_prefix_sum(seq_len_q_gpu) * h).to(torch.int32)
max_t_q, max_t_kv = int(seq_len_q_gpu.sum()), int(seq_len_kv_gpu.sum())

stride_q = (s_q * h * d, d, h * d, 1)
stride_kv = (s_kv * h * d, d, h * d, 1)
q_gpu = torch.randn(b * s_q * h * d, dtype=torch.bfloat16, device=device).as_strided((b, h, s_q, d), stride_q)
k_gpu = torch.randn(b * s_kv * h * d, dtype=torch.bfloat16, device=device).as_strided((b, h, s_kv, d), stride_kv)
v_gpu = torch.randn(b * s_kv * h * d, dtype=torch.bfloat16, device=device).as_strided((b, h, s_kv, d), stride_kv)
o_gpu = torch.full((b * s_q * h * d,), float("nan"), dtype=torch.bfloat16, device=device).as_strided(
    (b, h, s_q, d), stride_q)
stats_gpu = torch.full((b * s_q * h,), float("nan"), device=device).as_strided((b, h, s_q, 1), (s_q * h, 1, h, 1))

graph = cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)
q = graph.tensor_like(q_gpu)
k = graph.tensor_like(k_gpu)
v = graph.tensor_like(v_gpu)
seq_len_q = graph.tensor_like(seq_len_q_gpu)
seq_len_kv = graph.tensor_like(seq_len_kv_gpu)
q_ragged_offset = graph.tensor_like(q_ragged_offset_gpu)
kv_ragged_offset = graph.tensor_like(kv_ragged_offset_gpu)
stats_ragged_offset = graph.tensor_like(stats_ragged_offset_gpu)
q.set_ragged_offset(q_ragged_offset)
k.set_ragged_offset(kv_ragged_offset)
v.set_ragged_offset(kv_ragged_offset)
o, stats = graph.sdpa(name="sdpa", q=q, k=k, v=v, generate_stats=True, attn_scale=attn_scale,
                      use_padding_mask=True, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv,
                      diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT, diagonal_band_right_bound=0,
                      bias=None, dropout=None, rng_dump=None)
o.set_output(True).set_dim((b, h, s_q, d)).set_stride(stride_q).set_ragged_offset(q_ragged_offset)
stats.set_output(True).set_data_type(cudnn.data_type.FLOAT).set_stride((s_q * h, 1, h, 1))
stats.set_ragged_offset(stats_ragged_offset)

try:
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
except cudnn.cudnnGraphNotSupportedError as e:
    raise SystemExit(f"unsupported: {e}")
graph.build_plans()
variant_pack = {q: q_gpu, k: k_gpu, v: v_gpu, o: o_gpu, stats: stats_gpu, seq_len_q: seq_len_q_gpu,
                seq_len_kv: seq_len_kv_gpu, q_ragged_offset: q_ragged_offset_gpu,
                kv_ragged_offset: kv_ragged_offset_gpu, stats_ragged_offset: stats_ragged_offset_gpu}
workspace = torch.empty(graph.get_workspace_size(), device=device, dtype=torch.uint8)
graph.execute(variant_pack, workspace, handle=handle)
"""
)

RAGGED_BWD = (
    RAGGED_FWD
    + """
dO_gpu = torch.randn(b * s_q * h * d, dtype=torch.bfloat16, device=device).as_strided((b, h, s_q, d), stride_q)
dQ_gpu = torch.zeros_like(dO_gpu).as_strided((b, h, s_q, d), stride_q)
dK_gpu = torch.zeros(b * s_kv * h * d, dtype=torch.bfloat16, device=device).as_strided((b, h, s_kv, d), stride_kv)
dV_gpu = torch.zeros(b * s_kv * h * d, dtype=torch.bfloat16, device=device).as_strided((b, h, s_kv, d), stride_kv)

bwd = cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16, intermediate_data_type=cudnn.data_type.FLOAT,
                    compute_data_type=cudnn.data_type.FLOAT, handle=handle)
tensors = {name: bwd.tensor_like(t) for name, t in (("q", q_gpu), ("k", k_gpu), ("v", v_gpu), ("o", o_gpu),
                                                    ("dO", dO_gpu), ("stats", stats_gpu))}
offsets = {name: bwd.tensor_like(t) for name, t in (("q", q_ragged_offset_gpu), ("kv", kv_ragged_offset_gpu),
                                                    ("stats", stats_ragged_offset_gpu))}
lens = {name: bwd.tensor_like(t) for name, t in (("q", seq_len_q_gpu), ("kv", seq_len_kv_gpu))}
for name in ("q", "o", "dO"):
    tensors[name].set_ragged_offset(offsets["q"])
for name in ("k", "v"):
    tensors[name].set_ragged_offset(offsets["kv"])
tensors["stats"].set_ragged_offset(offsets["stats"])
dQ, dK, dV = bwd.sdpa_backward(q=tensors["q"], k=tensors["k"], v=tensors["v"], o=tensors["o"], dO=tensors["dO"],
                               stats=tensors["stats"], attn_scale=attn_scale, use_padding_mask=True,
                               seq_len_q=lens["q"], seq_len_kv=lens["kv"], max_total_seq_len_q=max_t_q,
                               max_total_seq_len_kv=max_t_kv, use_causal_mask=True, dBias=None, bias=None,
                               dropout=None, rng_dump=None, use_deterministic_algorithm=False)
dQ.set_output(True).set_dim(dQ_gpu.size()).set_stride(dQ_gpu.stride()).set_ragged_offset(offsets["q"])
dK.set_output(True).set_dim(dK_gpu.size()).set_stride(dK_gpu.stride()).set_ragged_offset(offsets["kv"])
dV.set_output(True).set_dim(dV_gpu.size()).set_stride(dV_gpu.stride()).set_ragged_offset(offsets["kv"])
try:
    bwd.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
except cudnn.cudnnGraphNotSupportedError as e:
    raise SystemExit(f"unsupported: {e}")
pack = {tensors[n]: t for n, t in (("q", q_gpu), ("k", k_gpu), ("v", v_gpu), ("o", o_gpu), ("dO", dO_gpu),
                                   ("stats", stats_gpu))}
pack.update({offsets["q"]: q_ragged_offset_gpu, offsets["kv"]: kv_ragged_offset_gpu,
             offsets["stats"]: stats_ragged_offset_gpu, lens["q"]: seq_len_q_gpu, lens["kv"]: seq_len_kv_gpu,
             dQ: dQ_gpu, dK: dK_gpu, dV: dV_gpu})
workspace = torch.empty(bwd.get_workspace_size(), device=device, dtype=torch.uint8)
bwd.execute(pack, workspace, handle)
"""
)


# cuDNN's paged K/V cache, as its own tests build it (test/python/sdpa/helpers.py create_container_and_page_table
# and sdpa/fp16.py): K/V containers declared from the container tensors, page tables (B, 1, blocks, 1) with a
# transposed tensor's strides, tensors keyed by uid, the padding mask's lengths
PAGED_FWD = (
    PROLOGUE
    + """
b, h_q, h_k, s_q, s_kv, d, block_size = 3, 4, 2, 8, 40, 64, 16


def create_container_and_page_table(tensor, block_size):
    B, H, S, D = tensor.shape
    blocks_per_batch = math.ceil(S / block_size)
    padding_seq = (blocks_per_batch * block_size) - S
    if padding_seq > 0:
        zeros = torch.zeros(B, H, padding_seq, D, device=device, dtype=tensor.dtype)
        cat_tensor = torch.cat((tensor, zeros), axis=2)
    else:
        cat_tensor = tensor
    reshaped = torch.cat((cat_tensor.clone()).chunk(blocks_per_batch, dim=2), dim=0)
    table_size = math.ceil(S / block_size)
    page_table = torch.linspace(0, B * table_size - 1, B * table_size, device=device,
                                dtype=torch.int32).reshape(table_size, 1, B, 1)
    page_table = torch.transpose(page_table, 0, 2)
    return (reshaped, page_table)


q_gpu = torch.randn(b, h_q, s_q, d, dtype=torch.half, device=device)
k_gpu = torch.randn(b, h_k, s_kv, d, dtype=torch.half, device=device)
v_gpu = torch.randn(b, h_k, s_kv, d, dtype=torch.half, device=device)
o_gpu = torch.full((b, h_q, s_q, d), float("nan"), dtype=torch.half, device=device)
seq_len_q_gpu = torch.tensor([8, 3, 5], dtype=torch.int32, device=device).view(b, 1, 1, 1)
seq_len_kv_gpu = torch.tensor([40, 0, 21], dtype=torch.int32, device=device).view(b, 1, 1, 1)
container_k_gpu, page_table_k_gpu = create_container_and_page_table(k_gpu, block_size)
container_v_gpu, page_table_v_gpu = create_container_and_page_table(v_gpu, block_size)

graph = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)
q = graph.tensor(uid=1, dim=q_gpu.size(), stride=q_gpu.stride(), data_type=cudnn.data_type.HALF)
k = graph.tensor(uid=20, dim=container_k_gpu.size(), stride=container_k_gpu.stride(), data_type=cudnn.data_type.HALF)
v = graph.tensor(uid=21, dim=container_v_gpu.size(), stride=container_v_gpu.stride(), data_type=cudnn.data_type.HALF)
page_table_k = graph.tensor(uid=24, dim=page_table_k_gpu.size(), stride=page_table_k_gpu.stride(),
                            data_type=cudnn.data_type.INT32)
page_table_v = graph.tensor(uid=25, dim=page_table_v_gpu.size(), stride=page_table_v_gpu.stride(),
                            data_type=cudnn.data_type.INT32)
seq_len_q = graph.tensor(uid=8, dim=(b, 1, 1, 1), stride=(1, 1, 1, 1), data_type=cudnn.data_type.INT32)
seq_len_kv = graph.tensor(uid=9, dim=(b, 1, 1, 1), stride=(1, 1, 1, 1), data_type=cudnn.data_type.INT32)
o, stats = graph.sdpa(name="sdpa_forward", q=q, k=k, v=v, generate_stats=False, attn_scale=0.125, bias=None,
                      block_mask=None, use_padding_mask=True, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv,
                      diagonal_band_left_bound=None, diagonal_band_right_bound=0,
                      diagonal_alignment=cudnn.diagonal_alignment.BOTTOM_RIGHT, dropout=None, rng_dump=None,
                      paged_attention_k_table=page_table_k, paged_attention_v_table=page_table_v,
                      paged_attention_max_seq_len_kv=s_kv, implementation=cudnn.attention_implementation.AUTO,
                      score_max=None, score_sum_exp=None, sink_token=None, unfuse_fma=False)
o.set_uid(5).set_output(True).set_dim(o_gpu.size()).set_stride(o_gpu.stride())
try:
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
except cudnn.cudnnGraphNotSupportedError as e:
    raise SystemExit(f"unsupported: {e}")
variant_pack = {1: q_gpu, 20: container_k_gpu, 21: container_v_gpu, 24: page_table_k_gpu, 25: page_table_v_gpu,
                8: seq_len_q_gpu, 9: seq_len_kv_gpu, 5: o_gpu}
workspace = torch.empty(graph.get_workspace_size(), device=device, dtype=torch.uint8)
graph.execute(variant_pack, workspace, handle=handle)
"""
)


def run_as_frost(program: str) -> dict:
    """Run a cuDNN program text with only its import changed; returns its globals."""
    assert program.count("import cudnn\n") == 1
    scope: dict = {"__name__": "cudnn_program"}
    try:
        exec(compile(program.replace("import cudnn\n", "import frost as cudnn\n"), "<cudnn program>", "exec"), scope)
    except SystemExit as e:  # the program's own "unsupported graph" exit, as cuDNN's tests skip
        pytest.skip(str(e))
    return scope


@pytest.fixture(autouse=True)
def _cpu_only():
    if torch.cuda.is_available():
        pytest.skip("runs the programs on the CPU reference engine; GPU runs live under test/gpu")


def _attend(q, k, v, scale, causal_offset):
    """float64 attention: q (..., H, Sq, D), k/v (..., H_kv, Skv, D); causal with the diagonal at offset."""
    g = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(g, -3).double(), v.repeat_interleave(g, -3).double()
    s = torch.einsum("...hqd,...hkd->...hqk", q.double(), k) * scale
    i = torch.arange(q.shape[-2]).unsqueeze(1)
    j = torch.arange(k.shape[-2]).unsqueeze(0)
    s = s.masked_fill(j > i + causal_offset, float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def test_dense_forward_program_matches_torch():
    p = run_as_frost(DENSE_FWD)
    o, lse = _attend(p["q_gpu"], p["k_gpu"], p["v_gpu"], p["attn_scale"], p["s_kv"] - p["s_q"])
    torch.testing.assert_close(p["o_gpu"].double(), o, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(p["stats_gpu"][..., 0].double(), lse, atol=1e-4, rtol=1e-4)
    assert p["graph"].engine_name == "SdpaFwdReference"
    assert p["k"].get_uid() == 7


def test_dense_backward_program_matches_torch_autograd():
    p = run_as_frost(DENSE_BWD)
    q, k, v = (p[n].double().requires_grad_() for n in ("q_gpu", "k_gpu", "v_gpu"))
    o, _ = _attend(q, k, v, p["attn_scale"], p["s_kv"] - p["s_q"])
    o.backward(p["dO_gpu"].double())
    for name, ref in (("dQ_gpu", q.grad), ("dK_gpu", k.grad), ("dV_gpu", v.grad)):
        torch.testing.assert_close(p[name].double(), ref, atol=5e-3, rtol=5e-3, msg=name)


def _ragged_rows(t, offsets, stride, b, length):
    start = int(offsets.reshape(-1)[b])
    return t.as_strided(
        (t.shape[1], length, t.shape[3]), (t.stride(1), stride, t.stride(3)), t.storage_offset() + start
    )


def _sequences(p):
    """Per non-empty batch entry of a ragged program: (b, its query length, its q rows, its kv rows)."""
    hd = p["h"] * p["d"]
    for b in range(p["b"]):
        lq, lk = int(p["seq_len_q_gpu"][b]), int(p["seq_len_kv_gpu"][b])
        if lq == 0:
            continue
        yield (
            b,
            lq,
            lambda t, b=b, n=lq: _ragged_rows(t, p["q_ragged_offset_gpu"], hd, b, n),
            lambda t, b=b, n=lk: _ragged_rows(t, p["kv_ragged_offset_gpu"], hd, b, n),
        )


def test_ragged_forward_program_matches_torch():
    p = run_as_frost(RAGGED_FWD)
    h = p["h"]
    for b, lq, rows_q, rows_kv in _sequences(p):
        o, lse = _attend(rows_q(p["q_gpu"]), rows_kv(p["k_gpu"]), rows_kv(p["v_gpu"]), p["attn_scale"], 0)
        torch.testing.assert_close(rows_q(p["o_gpu"]).double(), o, atol=2e-2, rtol=2e-2)
        stats = _ragged_rows(p["stats_gpu"], p["stats_ragged_offset_gpu"], h, b, lq)[..., 0]
        torch.testing.assert_close(stats.double(), lse, atol=1e-4, rtol=1e-4)
    facts = p["graph"].facts
    assert facts.is_thd and facts.ragged is not None and facts.total_q == p["b"] * p["s_q"]


def test_ragged_backward_program_matches_torch_autograd():
    p = run_as_frost(RAGGED_BWD)
    for _, _, rows_q, rows_kv in _sequences(p):
        q, k, v = (x.double().requires_grad_() for x in (rows_q(p["q_gpu"]), rows_kv(p["k_gpu"]), rows_kv(p["v_gpu"])))
        o, _ = _attend(q, k, v, p["attn_scale"], 0)
        o.backward(rows_q(p["dO_gpu"]).double())
        torch.testing.assert_close(rows_q(p["dQ_gpu"]).double(), q.grad, atol=3e-2, rtol=3e-2)
        torch.testing.assert_close(rows_kv(p["dK_gpu"]).double(), k.grad, atol=3e-2, rtol=3e-2)
        torch.testing.assert_close(rows_kv(p["dV_gpu"]).double(), v.grad, atol=3e-2, rtol=3e-2)
    facts = p["bwd"].facts
    assert (facts.total_q, facts.total_kv) == (p["max_t_q"], p["max_t_kv"])


def test_the_handles_stream_is_the_launch_stream():
    """execute(pack, workspace, handle): the adapter launches on the stream set_stream gave the handle."""
    program = DENSE_FWD.replace("graph.execute(variant_pack, workspace, handle=handle)\n", "")
    p = run_as_frost(program)
    graph, pack, ws = p["graph"], p["variant_pack"], p["workspace"]
    seen = []
    real = graph.plan.adapter.execute
    graph.plan.adapter.execute = lambda bound, workspace, stream: (seen.append(stream), real(bound, workspace, stream))
    cudnn = frost
    h = p["handle"]
    graph.execute(pack, ws, h)  # positional, as cuDNN's samples
    graph.execute(pack, ws, handle=h)
    graph.execute(pack, ws, int(h))  # the integer a cuDNN program may keep
    cudnn.set_stream(h, 0xABC0)
    graph.execute(pack, ws, h)
    graph.execute(pack, ws)  # the graph's own handle (pygraph(handle=...))
    graph.execute(pack, ws, frost.ExecutionContext(stream=0xDEF0))
    graph.execute(pack, ws, context=frost.ExecutionContext(handle=h))
    assert seen == [0x5EED, 0x5EED, 0x5EED, 0xABC0, 0xABC0, 0xDEF0, 0xABC0]
    assert cudnn.get_stream(h) == 0xABC0
    fresh = cudnn.create_handle()
    graph.execute(pack, ws, fresh)
    assert seen[-1] == 0  # a new handle launches on the default stream, as a new cuDNN handle does
    cudnn.set_stream(fresh, 1)
    assert cudnn.get_stream(fresh) == 0  # raw 1 (the legacy default stream) is the default stream
    cudnn.destroy_handle(fresh)
    with pytest.raises(ValueError, match="destroyed"):
        graph.execute(pack, ws, fresh)
    for bad in (3.5, "stream", object(), 987654321):
        with pytest.raises(TypeError, match="handle"):
            graph.execute(pack, ws, bad)
    with pytest.raises(TypeError, match="not both"):
        graph.execute(pack, ws, h, context=frost.ExecutionContext())


def test_cudnn_names_are_frost_names():
    assert frost.pygraph.__mro__[1] is frost.Graph
    assert frost.cudnnGraphNotSupportedError is frost.NotSupportedError
    assert frost.data_type is frost.DataType and frost.tensor is frost.Tensor
    assert frost.backend_version() == 92000 and frost.backend_version_string() == "9.20.0"
    assert [m.name for m in frost.heur_mode] == ["A", "B", "FALLBACK", "OPENSOURCE"]
    assert [m.name for m in frost.build_plan_policy] == ["HEURISTICS_CHOICE", "ALL"]
    assert [m.name for m in frost.diagonal_alignment] == ["TOP_LEFT", "BOTTOM_RIGHT"]
    g = frost.pygraph("named", frost.data_type.HALF)  # cuDNN's positional order: name first
    assert g.name == "named" and g.io_data_type is frost.DataType.HALF
    assert math.isclose(1.0, 1.0)


def test_paged_forward_program_as_cudnns_tests_write_it():
    """A paged container's first dim counts blocks (9 here, batch 3): declared, planned and executed; each sequence
    attends over its own keys, bottom-right causal, an empty sequence's rows zero."""
    p = run_as_frost(PAGED_FWD)
    assert p["graph"].engine_name == "SdpaFwdReference" and p["k"].get_dim() == [9, 2, 16, 64]
    for i in range(p["b"]):
        lq, lk = int(p["seq_len_q_gpu"][i]), int(p["seq_len_kv_gpu"][i])
        got = p["o_gpu"][i, :, :lq].double()
        if lk == 0:
            assert torch.equal(got, torch.zeros_like(got))
            continue
        o, _ = _attend(p["q_gpu"][i, :, :lq], p["k_gpu"][i, :, :lk], p["v_gpu"][i, :, :lk], 0.125, lk - lq)
        torch.testing.assert_close(got, o, atol=2e-3, rtol=2e-3)
