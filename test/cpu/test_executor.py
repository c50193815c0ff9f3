"""`Graph.executor(ports)`: positional execution gives what `execute` gives and raises its errors (reference engine)."""

from __future__ import annotations

import pytest
import torch

import frost
from test.helpers import error_of


def _rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def _graph(q, stats=True):
    g = frost.Graph(io_data_type=torch.float32, intermediate_data_type=torch.float32, compute_data_type=torch.float32)
    hq, hk, hv = (g.tensor_like(q, name=n) for n in ("q", "k", "v"))
    o, st = g.sdpa(hq, hk, hv, attn_scale=0.25, generate_stats=stats, use_causal_mask=True)
    o.set_output(True)
    if stats:
        st.set_output(True).set_data_type(torch.float32)
    g.validate()
    g.build_plans()
    return g, (hq, hk, hv, o, st) if stats else (hq, hk, hv, o)


def test_executor_matches_execute_by_handle_uid_and_name():
    torch.manual_seed(3)
    q, k, v = (_rand(1, 2, 8, 16) for _ in range(3))
    g, ports = _graph(q)
    want_o, want_l = torch.empty_like(q), torch.empty(1, 2, 8, 1)
    g.execute(dict(zip(ports, (q, k, v, want_o, want_l))))
    for keys in (ports, [p.uid for p in ports], [p.name for p in ports]):
        o, lse = torch.empty_like(q), torch.empty(1, 2, 8, 1)
        ex = g.executor(keys)
        assert ex.roles == ("q", "k", "v", "o", "stats")
        ex((q, k, v, o, lse))
        assert torch.equal(o, want_o) and torch.equal(lse, want_l)
        o2 = torch.empty_like(q)
        ex.launch((q, k, v, o2, lse))
        assert torch.equal(o2, want_o)
    # any order of the ports
    ex = g.executor((ports[4], ports[0], ports[3], ports[1], ports[2]))
    o3 = torch.empty_like(q)
    ex((lse, q, o3, k, v))
    assert torch.equal(o3, want_o)


BAD_BINDINGS = [
    ("dtype", lambda q, k, v, o, lse: (q, k.double(), v, o, lse)),
    ("dims", lambda q, k, v, o, lse: (q, k[:, :, :4], v, o, lse)),
    ("strides", lambda q, k, v, o, lse: (q, k.transpose(2, 3).contiguous().transpose(2, 3), v, o, lse)),
    ("device", lambda q, k, v, o, lse: (q, k, v.to("meta"), o, lse)),
    ("missing", lambda q, k, v, o, lse: (q, k, None, o, lse)),
    ("not a tensor", lambda q, k, v, o, lse: (q, k, v, o, [1.0])),
]


@pytest.mark.parametrize("name,bad", BAD_BINDINGS, ids=[n for n, _ in BAD_BINDINGS])
def test_executor_raises_executes_errors(name, bad):
    q, k, v = (_rand(1, 2, 8, 16) for _ in range(3))
    g, ports = _graph(q)
    tensors = bad(q, k, v, torch.empty_like(q), torch.empty(1, 2, 8, 1))
    want = error_of(lambda: g.execute(dict(zip(ports, tensors))))
    assert want is not None and want[0] is frost.BindingError
    ex = g.executor(ports)
    assert error_of(lambda: ex(tensors)) == want
    if name == "device":  # launch re-checks devices (dims, strides, dtypes are its caller's)
        assert error_of(lambda: ex.launch(tensors)) == want


def test_executor_needs_every_port_once_and_the_right_count():
    q = _rand(1, 2, 8, 16)
    g, ports = _graph(q)
    with pytest.raises(frost.GraphError, match="miss tensor"):
        g.executor(ports[:4])
    with pytest.raises(frost.GraphError, match="once"):
        g.executor((*ports, ports[0]))
    with pytest.raises(frost.BindingError, match="takes 5 tensors"):
        g.executor(ports)((q, q, q))
    g2, ports2 = _graph(q, stats=False)
    assert g2.executor(ports2).roles == ("q", "k", "v", "o")


def test_executor_follows_a_new_plan():
    q, k, v = (_rand(1, 2, 8, 16) for _ in range(3))
    g, ports = _graph(q)
    ex = g.executor(ports)
    g.build_plans(engine="reference")  # a new plan object
    o, lse = torch.empty_like(q), torch.empty(1, 2, 8, 1)
    ex((q, k, v, o, lse))
    want = torch.empty_like(q)
    g.execute(dict(zip(ports, (q, k, v, want, torch.empty(1, 2, 8, 1)))))
    assert torch.equal(o, want)


def test_launch_checks_alignment(monkeypatch):
    """`launch` trusts dims, strides and dtypes to its caller, never addresses: a misaligned tensor gets
    execute's error."""
    from frost.adapters.reference import SdpaFwdReference

    monkeypatch.setattr(SdpaFwdReference, "vector_bytes", 16, raising=False)
    q, k, v = (_rand(1, 2, 8, 16) for _ in range(3))
    g, ports = _graph(q)
    shifted = _rand(1 * 2 * 8 * 16 + 1)[1:].view(1, 2, 8, 16)  # 4 bytes past an aligned address
    tensors = (q, shifted, v, torch.empty_like(q), torch.empty(1, 2, 8, 1))
    want = error_of(lambda: g.execute(dict(zip(ports, tensors))))
    assert want is not None and "aligned" in want[1]
    ex = g.executor(ports)
    assert error_of(lambda: ex(tensors)) == want
    assert error_of(lambda: ex.launch(tensors)) == want
