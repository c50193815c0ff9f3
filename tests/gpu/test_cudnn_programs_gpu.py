"""cuDNN programs on a GPU with only the import changed; the handle's stream is the launch stream."""
from __future__ import annotations

import pytest
import torch

import frost
from tests.cpu.test_cudnn_programs import DENSE_BWD, DENSE_FWD, RAGGED_FWD
from tests.gpu.graph_cases import FwdCase, make_fwd, pack, plan_or_skip, runs_while_default_blocked

pytestmark = pytest.mark.gpu


def _run(program: str) -> dict:
    scope: dict = {"__name__": "cudnn_program"}
    exec(compile(program.replace("import cudnn\n", "import frost as cudnn\n"), "<cudnn program>", "exec"), scope)
    return scope


def test_dense_programs_run_on_a_dsl_engine():
    for program, graph in ((DENSE_FWD, "graph"), (DENSE_BWD, "bwd")):
        p = _run(program)
        torch.cuda.synchronize()
        assert "Dsl" in p[graph].engine_name
        assert torch.isfinite(p["o_gpu"]).all()


def test_the_ragged_program_is_declined_by_the_dsl_engines_naming_it():
    with pytest.raises(SystemExit, match="ragged-offset form"):
        _run(RAGGED_FWD)


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
