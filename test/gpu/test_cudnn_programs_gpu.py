"""cuDNN programs on a GPU with only the import changed; the handle's stream is the launch stream; a program with an
additive bias gives what the real cuDNN frontend gives for the same text, on frost's mma.sync engine (to bf16
rounding) and on its cuDNN engine (the same library: equal in practice)."""

from __future__ import annotations

import pytest
import torch

import frost
from test.cpu.test_cudnn_programs import DENSE_BWD, DENSE_FWD, PAGED_FWD, PROLOGUE, RAGGED_BWD, _attend
from test.gpu.graph_cases import FwdCase, make_fwd, pack, plan_or_skip, runs_while_default_blocked

pytestmark = pytest.mark.gpu


def _run(program: str, real_cudnn: bool = False) -> dict:
    """Run a cuDNN program text as frost (its import changed), or unchanged against the real binding."""
    scope: dict = {"__name__": "cudnn_program"}
    text = program if real_cudnn else program.replace("import cudnn\n", "import frost as cudnn\n")
    exec(compile(text, "<cudnn program>", "exec"), scope)
    return scope


# a causal forward with a per-head additive bias: on an H200 frost's mma.sync engine serves it first
BIAS_FWD = (
    PROLOGUE
    + """
b, h, s, d = 2, 4, 256, 128
q_gpu = torch.randn(b, s, h, d, dtype=torch.bfloat16, device=device).transpose(1, 2)
k_gpu = torch.randn(b, s, h, d, dtype=torch.bfloat16, device=device).transpose(1, 2)
v_gpu = torch.randn(b, s, h, d, dtype=torch.bfloat16, device=device).transpose(1, 2)
bias_gpu = torch.randn(1, h, s, s, dtype=torch.bfloat16, device=device)
o_gpu = torch.empty(b, s, h, d, dtype=torch.bfloat16, device=device).transpose(1, 2)
stats_gpu = torch.empty(b, h, s, 1, dtype=torch.float32, device=device)

graph = cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)
q, k, v, bias = (graph.tensor_like(t) for t in (q_gpu, k_gpu, v_gpu, bias_gpu))
o, stats = graph.sdpa(name="sdpa", q=q, k=k, v=v, generate_stats=True, attn_scale=d ** -0.5, bias=bias,
                      diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT, diagonal_band_right_bound=0)
o.set_output(True).set_dim(o_gpu.size()).set_stride(o_gpu.stride())
stats.set_output(True).set_data_type(cudnn.data_type.FLOAT)
graph.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
workspace = torch.empty(graph.get_workspace_size(), device=device, dtype=torch.uint8)
graph.execute({q: q_gpu, k: k_gpu, v: v_gpu, bias: bias_gpu, o: o_gpu, stats: stats_gpu}, workspace, handle=handle)
torch.cuda.synchronize()
"""
)


def test_dense_programs_run_on_a_dsl_engine():
    for program, graph in ((DENSE_FWD, "graph"), (DENSE_BWD, "bwd")):
        p = _run(program)
        torch.cuda.synchronize()
        assert "Dsl" in p[graph].engine_name
        assert torch.isfinite(p["o_gpu"]).all()


def _ragged_rows_cpu(t, offsets, stride, b, length):
    """(H, length, D) rows of batch entry b of a ragged program's tensor, on the host, in float64."""
    start = int(offsets.reshape(-1)[b])
    return (
        t.as_strided((t.shape[1], length, t.shape[3]), (t.stride(1), stride, t.stride(3)), t.storage_offset() + start)
        .double()
        .cpu()
    )


def test_the_ragged_programs_run_on_a_dsl_engine():
    """cuDNN's packed (ragged-offset) programs, forward and backward, with only the import changed: planned on a
    DSL engine of this GPU and checked per sequence against float64 torch math (causal, an empty sequence,
    int64 and int32 offsets, ragged Stats, max_total_seq_len in the backward)."""
    p = _run(RAGGED_BWD)
    torch.cuda.synchronize()
    assert "Dsl" in p["graph"].engine_name and "Dsl" in p["bwd"].engine_name
    h, d, scale = p["h"], p["d"], p["attn_scale"]
    for b in range(p["b"]):
        lq, lk = int(p["seq_len_q_gpu"][b]), int(p["seq_len_kv_gpu"][b])
        if lq == 0:
            continue
        rq = lambda t, n=lq, b=b: _ragged_rows_cpu(t, p["q_ragged_offset_gpu"], h * d, b, n)  # noqa: E731
        rk = lambda t, n=lk, b=b: _ragged_rows_cpu(t, p["kv_ragged_offset_gpu"], h * d, b, n)  # noqa: E731
        q, k, v = (x.requires_grad_() for x in (rq(p["q_gpu"]), rk(p["k_gpu"]), rk(p["v_gpu"])))
        o, lse = _attend(q, k, v, scale, 0)
        assert torch.allclose(rq(p["o_gpu"]), o, atol=2e-2, rtol=2e-2), f"batch {b}: O"
        stats = _ragged_rows_cpu(p["stats_gpu"], p["stats_ragged_offset_gpu"], h, b, lq)[..., 0]
        assert torch.allclose(stats, lse, atol=1e-3, rtol=1e-3), f"batch {b}: Stats"
        o.backward(rq(p["dO_gpu"]))
        for name, ref, rows in (("dQ_gpu", q.grad, rq), ("dK_gpu", k.grad, rk), ("dV_gpu", v.grad, rk)):
            assert torch.allclose(rows(p[name]), ref, atol=3e-2, rtol=3e-2), f"batch {b}: {name}"


@pytest.mark.parametrize("engine", ["sm90", "sm80"])
def test_the_handles_stream_is_honored(engine):
    g, decl, t = make_fwd(FwdCase(d=128, b=4, sq=1024, skv=1024, causal=True))
    plan_or_skip(g, engine)
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
    side = torch.cuda.Stream()
    handle = frost.create_handle()
    frost.set_stream(handle, side.cuda_stream)
    g.execute(pack(decl, t), ws, handle)  # first launch loads the module
    torch.cuda.synchronize()
    t["o"].fill_(float("nan"))
    torch.cuda.synchronize()
    finished, still_blocked = runs_while_default_blocked(lambda: g.execute(pack(decl, t), ws, handle), side)
    assert finished, "execute did not finish while the default stream was held: it ignored the handle's stream"
    assert still_blocked
    assert not torch.isnan(t["o"]).any()


def test_a_bias_program_matches_the_real_cudnn_frontend(monkeypatch):
    """The same program text through frost and through nvidia-cudnn-frontend itself: frost's wgmma forward (first
    for a bias on cc 9.0) agrees to bf16 rounding; its cuDNN engine, with the DSL rows made blind to biases, runs
    the same library: one answer."""
    from frost.adapters.cudnn import cudnn_missing_reason
    from frost.lowering import capabilities

    if cudnn_missing_reason():
        pytest.skip(cudnn_missing_reason())
    theirs = _run(BIAS_FWD, real_cudnn=True)

    def agree(mine, tol):
        assert torch.equal(mine["q_gpu"], theirs["q_gpu"]) and torch.equal(mine["bias_gpu"], theirs["bias_gpu"])
        for name in ("o_gpu", "stats_gpu"):
            a, b = mine[name].double(), theirs[name].double()
            assert torch.isfinite(a).all(), name
            assert ((a - b).norm() / b.norm()).item() < tol, name

    mine = _run(BIAS_FWD)
    assert mine["graph"].engine_name == "SdpaFwdDslSm90"
    agree(mine, 2e-2)
    rows = tuple(
        r.model_copy(update={"features": r.features - capabilities.SCORE_MOD_FEATURES}) if "Dsl" in r.name else r
        for r in capabilities.ROWS
    )
    monkeypatch.setattr(capabilities, "ROWS", rows)
    mine = _run(BIAS_FWD)
    assert mine["graph"].engine_name == "SdpaFwdCudnn"
    agree(mine, 1e-3)  # the same engine and plan: equal in practice


def test_paged_program_runs_on_the_cudnn_engine_and_matches_the_real_frontend():
    """cuDNN's paged test program: frost plans its cuDNN engine (its DSL kernels decline paged caches) and gives
    what the real frontend gives for the same text; each sequence against float64 attention over its own keys."""
    try:
        p = _run(PAGED_FWD)
    except NotImplementedError as e:
        pytest.skip(f"no engine serves paged caches on this machine: {e}")
    torch.cuda.synchronize()
    assert p["graph"].engine_name == "SdpaFwdCudnn"
    for i in range(p["b"]):
        lq, lk = int(p["seq_len_q_gpu"][i]), int(p["seq_len_kv_gpu"][i])
        got = p["o_gpu"][i, :, :lq].double().cpu()
        if lk == 0:
            continue
        o, _ = _attend(
            p["q_gpu"][i, :, :lq].cpu(), p["k_gpu"][i, :, :lk].cpu(), p["v_gpu"][i, :, :lk].cpu(), 0.125, lk - lq
        )
        torch.testing.assert_close(got, o, atol=2e-3, rtol=2e-3)
    real = _run(PAGED_FWD, real_cudnn=True)
    torch.cuda.synchronize()
    for i in range(p["b"]):
        lq = int(p["seq_len_q_gpu"][i])
        torch.testing.assert_close(
            p["o_gpu"][i, :, :lq].cpu(), real["o_gpu"][i, :, :lq].cpu(), atol=2e-3, rtol=2e-3, equal_nan=True
        )
