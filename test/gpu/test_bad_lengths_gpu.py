"""Bad device lengths on the DSL engines (docs/lengths.md): whatever `seq_len_*`, `cu_seq_len_*` and the ragged
offsets hold, no kernel writes outside the bound outputs and the workspace. Every output and the workspace are
carved from the middle of a larger buffer whose guard bytes before and after hold a poison pattern; after the
executes with bad values the guards must hold it still. The opt-in check's flag is compared with the host rules.
"""

from __future__ import annotations

import pytest
import torch

import frost
from frost.engines.common import length_check_params as lc
from test.gpu.graph_cases import plan_or_skip
from test.helpers import Case, make_inputs, sdpa_keywords

pytestmark = pytest.mark.gpu
ENGINES = ["sm90", "sm80"]
GUARD = 1 << 16  # guard bytes on each side
POISON = 0x5A
BIG = 2**31 - 1


class Guarded:
    """Views carved from the middle of poisoned buffers; `intact()` checks every guard."""

    def __init__(self):
        self.buffers = []

    def _carve(self, nbytes: int) -> torch.Tensor:
        buf = torch.full((GUARD + nbytes + GUARD,), POISON, dtype=torch.uint8, device="cuda")
        self.buffers.append(buf)
        return buf[GUARD : GUARD + nbytes]

    def like(self, decl: frost.Tensor) -> torch.Tensor:
        dt = decl.data_type.to_torch()
        span = 1 + sum((d - 1) * s for d, s in zip(decl.dim, decl.stride))
        raw = self._carve(span * torch.tensor([], dtype=dt).element_size())
        return raw.view(dt).as_strided(decl.dim, decl.stride)

    def workspace(self, nbytes: int):
        return self._carve(max(nbytes, 256)) if nbytes else None

    def intact(self) -> bool:
        torch.cuda.synchronize()
        return all(bool((b[:GUARD] == POISON).all() and (b[-GUARD:] == POISON).all()) for b in self.buffers)


def _to_cuda(t: dict) -> dict:
    return {k: v.cuda() for k, v in t.items()}


def _graph(case: Case, direction: str, engine: str):
    t = _to_cuda(make_inputs(case))
    g = frost.Graph(io_data_type=case.dtype, intermediate_data_type=torch.float32, compute_data_type=torch.float32)
    q, k, v = (g.tensor_like(t[r], name=r) for r in ("q", "k", "v"))
    kw, pack = sdpa_keywords(case, g, t)
    pack.update({q: t["q"], k: t["k"], v: t["v"]})
    if direction == "fwd":
        outs = [x for x in g.sdpa(q, k, v, generate_stats=True, **kw) if x is not None]
    else:
        o_t = torch.randn_like(t["do"])
        lse = torch.zeros((*t["do"].shape[:-1], 1), device="cuda")
        o, do, st = g.tensor_like(o_t, name="o"), g.tensor_like(t["do"], name="dO"), g.tensor_like(lse, name="st")
        pack.update({o: o_t, do: t["do"], st: lse})
        outs = list(g.sdpa_backward(q, k, v, o, do, st, **kw))
    for h in outs:
        h.set_output(True)
    plan_or_skip(g, engine)
    guarded = Guarded()
    pack.update({h: guarded.like(h) for h in outs})
    return g, pack, t, guarded


PADDED = Case(
    batch=3, sq=200, skv=190, hq=4, hkv=2, d=64, dtype=torch.bfloat16, lens_q=(100, 200, 7), lens_kv=(190, 3, 64)
)
PACKED = Case(
    thd=True,
    batch=3,
    hq=4,
    hkv=2,
    d=64,
    dtype=torch.bfloat16,
    lens_q=(100, 130, 7),
    lens_kv=(90, 3, 164),
    extra_q=5,
    extra_kv=2,
)

BAD = {  # (case, tensor, values)
    "seq_len_q above S": (PADDED, "seq_len_q", [100, 1000, BIG]),
    "seq_len_kv negative": (PADDED, "seq_len_kv", [-1, -BIG - 1, 64]),
    "cu_seq_len_q decreasing": (PACKED, "cu_seq_len_q", [0, 200, 10, 237]),
    "cu_seq_len_q past the tokens": (PACKED, "cu_seq_len_q", [0, 100, 230, BIG]),
    "cu_seq_len_kv negative start": (PACKED, "cu_seq_len_kv", [-BIG - 1, 90, 93, 257]),
    "cu_seq_len_kv above max_seq_len": (PACKED, "cu_seq_len_kv", [0, 250, 252, 259]),
}


@pytest.mark.parametrize("name", list(BAD))
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("engine", ENGINES)
def test_bad_lengths_never_write_outside_the_outputs_and_the_workspace(engine, direction, name):
    case, role, values = BAD[name]
    g, pack, t, guarded = _graph(case, direction, engine)
    ws = guarded.workspace(g.get_workspace_size())
    if ws is not None:
        ws.fill_(0xFF)  # the chain clears what it relies on
    t[role].view(-1).copy_(torch.tensor(values, dtype=torch.int32))
    for _ in range(2):
        g.execute(pack, ws)
    assert guarded.intact(), f"{engine} {direction}: a write left the bound tensors with {role} = {values}"
    flag = torch.full((1,), 0x7FFF, dtype=torch.int32, device="cuda")
    g.length_check()(pack, flag)
    torch.cuda.synchronize()
    assert flag.item() != 0 and set(lc.length_check_errors(flag.item()))


# cuDNN's ragged-offset form: bshd (B, H, S, D) tensors with element offsets per batch entry
B, H, S, D = 3, 4, 160, 64
STRIDE = (S * H * D, D, H * D, 1)

RAGGED_BAD = {  # (tensor, values: lengths, or offsets in tokens)
    "seq_len_q above S": ("seq_len_q", [100, BIG, 160]),
    "seq_len_kv negative": ("seq_len_kv", [-5, 30, -BIG - 1]),
    "offset past the envelope": ("off_q", [0, 100, 10_000_000, 480]),
    "negative offset": ("off_kv", [-7, 100, 200, 480]),
    "offset plus length past the envelope": ("off_q", [0, 100, 470, 480]),
}


def _ragged(direction: str, engine: str):
    g = frost.pygraph(io_data_type=frost.data_type.BFLOAT16)
    q, k, v = (g.tensor((B, H, S, D), STRIDE) for _ in range(3))
    lq, lk = (g.tensor((B, 1, 1, 1), (1, 1, 1, 1), frost.data_type.INT32) for _ in range(2))
    off_q, off_kv = (g.tensor((B + 1, 1, 1, 1), (1, 1, 1, 1), frost.data_type.INT64) for _ in range(2))
    for t_, off in ((q, off_q), (k, off_kv), (v, off_kv)):
        t_.set_ragged_offset(off)
    dev = "cuda"
    x = {
        n: torch.randn(B * S * H * D, device=dev).to(torch.bfloat16).as_strided((B, H, S, D), STRIDE)
        for n in ("q", "k", "v", "o", "do")
    }
    vals = {
        "seq_len_q": torch.tensor([100, 60, 160], dtype=torch.int32, device=dev).view(-1, 1, 1, 1),
        "seq_len_kv": torch.tensor([150, 30, 90], dtype=torch.int32, device=dev).view(-1, 1, 1, 1),
        "off_q": torch.tensor([0, 100, 160, 320], device=dev).view(-1, 1, 1, 1) * H * D,
        "off_kv": torch.tensor([0, 150, 180, 270], device=dev).view(-1, 1, 1, 1) * H * D,
    }
    pack = {
        q: x["q"],
        k: x["k"],
        v: x["v"],
        lq: vals["seq_len_q"],
        lk: vals["seq_len_kv"],
        off_q: vals["off_q"],
        off_kv: vals["off_kv"],
    }
    kw = dict(attn_scale=0.125, use_padding_mask=True, seq_len_q=lq, seq_len_kv=lk)
    if direction == "fwd":
        o, _ = g.sdpa(q, k, v, **kw)
        o.set_output(True).set_ragged_offset(off_q)
        outs = [o]
    else:
        o, do = (g.tensor((B, H, S, D), STRIDE) for _ in range(2))
        stats = g.tensor((B, H, S, 1), (H * S, S, 1, 1), frost.data_type.FLOAT)
        for t_ in (o, do):
            t_.set_ragged_offset(off_q)
        outs = list(g.sdpa_backward(q, k, v, o, do, stats, **kw))
        for h, off in zip(outs, (off_q, off_kv, off_kv)):
            h.set_output(True).set_ragged_offset(off)
        pack.update({o: x["o"], do: x["do"], stats: torch.zeros(B, H, S, 1, device=dev)})
    plan_or_skip(g, engine)
    guarded = Guarded()
    pack.update({h: guarded.like(h) for h in outs})
    return g, pack, vals, guarded


@pytest.mark.parametrize("name", list(RAGGED_BAD))
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("engine", ENGINES)
def test_ragged_bad_values_never_write_outside(engine, direction, name):
    role, values = RAGGED_BAD[name]
    g, pack, vals, guarded = _ragged(direction, engine)
    ws = guarded.workspace(g.get_workspace_size())
    if ws is not None:
        ws.fill_(0xFF)
    new = torch.tensor(values, device="cuda").view(-1, 1, 1, 1)
    vals[role].copy_(new * H * D if role.startswith("off") else new)
    for _ in range(2):
        g.execute(pack, ws)
    assert guarded.intact(), f"{engine} {direction}: a write left the bound tensors with {role} = {values}"


@pytest.mark.parametrize("engine", ENGINES)
def test_device_check_agrees_with_the_host_rules(engine):
    """The same values through the kernel and through `host_flag`: the same flag, every rule's bit reachable."""
    for name, (case, role, values) in BAD.items():
        g, pack, t, _ = _graph(case, "fwd", engine)
        check = g.length_check()
        flag = torch.full((1,), 0x7FFF, dtype=torch.int32, device="cuda")
        check(pack, flag)
        torch.cuda.synchronize()
        assert flag.item() == 0, name
        t[role].view(-1).copy_(torch.tensor(values, dtype=torch.int32))
        check(pack, flag)
        lens = {
            "q": t["cu_seq_len_q" if case.thd else "seq_len_q"].view(-1).tolist(),
            "kv": t["cu_seq_len_kv" if case.thd else "seq_len_kv"].view(-1).tolist(),
        }
        env = check._envelope(t["q"], t["k"])
        assert flag.item() == lc.host_flag(check.p, lens, [], env), name


# a packed length above its declared maximum is capped at it (the padded form's rule: a length is clamped to S):
# entry 1 spans 47 query tokens (max_seq_len_q = 40) and 60 keys (max_seq_len_kv = 50)
CAPPED = Case(
    thd=True,
    batch=3,
    hq=4,
    hkv=2,
    d=64,
    dtype=torch.bfloat16,
    lens_q=(20, 40, 7),
    lens_kv=(30, 10, 50),
    extra_q=5,
    extra_kv=2,
    mask=(("use_causal_mask", True),),
)


@pytest.mark.parametrize("engine", ENGINES)
def test_packed_lengths_above_the_declared_maximum_are_capped_at_it(engine):
    from test import oracle

    g, pack, t, guarded = _graph(CAPPED, "fwd", engine)
    t["cu_seq_len_q"].copy_(torch.tensor([0, 20, 67, 67], dtype=torch.int32))
    t["cu_seq_len_kv"].copy_(torch.tensor([0, 30, 90, 90], dtype=torch.int32))
    g.execute(pack, guarded.workspace(g.get_workspace_size()))
    assert guarded.intact()
    o = next(x for h, x in pack.items() if h.is_output and x.shape[-1] == CAPPED.d)  # O, not Stats
    # what the kernels compute: entry 1 as its first 40 queries against its first 50 keys
    want, _ = oracle.attention(
        t["q"][:60].cpu(),
        t["k"][:80].cpu(),
        t["v"][:80].cpu(),
        scale=CAPPED.attn_scale,
        cu_seq_len_q=[0, 20, 60],
        cu_seq_len_kv=[0, 30, 80],
        causal=True,
    )
    oracle.assert_close_to_oracle(o[:60], want, rel=2e-2, name=f"{engine} capped packed lengths")
