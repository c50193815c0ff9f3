"""Bad device lengths and offsets on the reference engine (docs/lengths.md): an error that names the tensor, the
batch entry and the rule, raised before any output is written (sentinel-filled outputs stay as they were), and
no work sized by the bad value (a length of 2^31 - 1 fails at once)."""

from __future__ import annotations

import time

import pytest
import torch

import frost
from frost.errors import BindingError
from test.helpers import Case, empty_like_decl, make_inputs, planned_fwd, sdpa_keywords

SENTINEL = 1234.5
BIG = 2**31 - 1


def _sentinel(t: torch.Tensor) -> torch.Tensor:
    return t.fill_(SENTINEL)


def _untouched(*ts) -> bool:
    return all(bool((t == SENTINEL).all()) for t in ts)


def _fwd(case: Case):
    """A planned reference forward whose outputs hold the sentinel: (graph, pack, inputs, outputs)."""
    t = make_inputs(case)
    g, pack, o, stats = planned_fwd(case, t, engine="reference")
    outs = [_sentinel(pack[o])] + ([_sentinel(pack[stats])] if stats is not None else [])
    return g, pack, t, outs


def _bwd(case: Case):
    """A planned reference backward whose gradients hold the sentinel: (graph, pack, inputs, gradients)."""
    t = make_inputs(case)
    g = frost.Graph(io_data_type=case.dtype, intermediate_data_type=torch.float32, compute_data_type=torch.float32)
    q, k, v = (g.tensor_like(t[r], name=r) for r in ("q", "k", "v"))
    o_t = torch.randn_like(t["do"])
    lse_t = torch.zeros((*t["do"].shape[:-1], 1))
    o, do, stats = g.tensor_like(o_t, name="o"), g.tensor_like(t["do"], name="dO"), g.tensor_like(lse_t, name="st")
    kw, pack = sdpa_keywords(case, g, t)
    grads = g.sdpa_backward(q, k, v, o, do, stats, **kw)
    for h in grads:
        h.set_output(True)
    g.build_operation_graph().build_plans(engine="reference")
    outs = [_sentinel(empty_like_decl(h)) for h in grads]
    pack.update({q: t["q"], k: t["k"], v: t["v"], o: o_t, do: t["do"], stats: lse_t})
    pack.update(dict(zip(grads, outs)))
    return g, pack, t, outs


PADDED = Case(batch=3, sq=8, skv=8, lens_q=(5, 8, 3), lens_kv=(8, 2, 7))
PACKED = Case(thd=True, batch=3, lens_q=(3, 5, 2), lens_kv=(4, 5, 6), extra_q=2, extra_kv=1)

# (case, tensor, values, the words the error must hold)
BAD = {
    "seq_len_q above S": (PADDED, "seq_len_q", [5, 9, 3], ["seq_len_q[1] = 9", "[0, 8]"]),
    "seq_len_kv negative": (PADDED, "seq_len_kv", [8, -1, 7], ["seq_len_kv[1] = -1", "[0, 8]"]),
    "seq_len_q 2^31-1": (PADDED, "seq_len_q", [5, 8, BIG], [f"seq_len_q[2] = {BIG}"]),
    "cu_seq_len_q decreasing": (PACKED, "cu_seq_len_q", [0, 3, 2, 10], ["cu_seq_len_q[2] = 2", "never decrease"]),
    "cu_seq_len_kv past the tokens": (PACKED, "cu_seq_len_kv", [0, 4, 9, 17], ["cu_seq_len_kv[3] = 17", "[0, 16]"]),
    "cu_seq_len_q negative": (PACKED, "cu_seq_len_q", [-3, 3, 8, 10], ["cu_seq_len_q[0] = -3", "[0, 12]"]),
    "cu_seq_len_q 2^31-1": (PACKED, "cu_seq_len_q", [0, 3, 8, BIG], [f"cu_seq_len_q[3] = {BIG}"]),
    "cu_seq_len_kv above max_seq_len": (
        PACKED,
        "cu_seq_len_kv",
        [0, 7, 9, 15],
        ["cu_seq_len_kv[1] = 7", "max_seq_len_kv = 6"],
    ),
}


def _poke(t: dict, role: str, values) -> None:
    t[role].view(-1).copy_(torch.tensor(values, dtype=torch.int32))


@pytest.mark.parametrize("name", list(BAD))
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_bad_lengths_raise_naming_the_tensor_and_write_nothing(name, direction):
    case, role, values, words = BAD[name]
    g, pack, t, outs = (_fwd if direction == "fwd" else _bwd)(case)
    _poke(t, role, values)
    start = time.perf_counter()
    with pytest.raises(BindingError) as e:
        g.execute(pack, None)
    assert time.perf_counter() - start < 5.0  # refused up front, not after sizing work by the bad value
    for w in words + ["docs/lengths.md"]:
        assert w in str(e.value), (w, str(e.value))
    assert _untouched(*outs)


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_good_lengths_still_run(direction):
    """The same graphs with their own lengths execute and overwrite every sentinel of a sequence's rows."""
    g, pack, t, outs = (_fwd if direction == "fwd" else _bwd)(PACKED)
    g.execute(pack, None)
    assert not (outs[0][:3] == SENTINEL).any()


# cuDNN's ragged-offset form: (B, H, S, D) tensors with element offsets per batch entry
B, H, S, D = 3, 2, 8, 16
STRIDE = (S * H * D, D, H * D, 1)


def _ragged(direction: str):
    """A planned reference graph in cuDNN's ragged form with sentinel outputs: (graph, pack, length and offset
    tensors by name, outputs)."""
    g = frost.pygraph(io_data_type=frost.data_type.FLOAT)
    q, k, v = (g.tensor((B, H, S, D), STRIDE) for _ in range(3))
    lq, lk = (g.tensor((B, 1, 1, 1), (1, 1, 1, 1), frost.data_type.INT32) for _ in range(2))
    off_q, off_kv = (g.tensor((B + 1, 1, 1, 1), (1, 1, 1, 1), frost.data_type.INT64) for _ in range(2))
    for t_, off in ((q, off_q), (k, off_kv), (v, off_kv)):
        t_.set_ragged_offset(off)
    x = {n: torch.randn(B * S * H * D).as_strided((B, H, S, D), STRIDE) for n in ("q", "k", "v", "o", "do")}
    lens = {
        "seq_len_q": torch.tensor([5, 2, 8], dtype=torch.int32).view(-1, 1, 1, 1),
        "seq_len_kv": torch.tensor([7, 3, 8], dtype=torch.int32).view(-1, 1, 1, 1),
        "off_q": torch.tensor([0, 5, 7, 15]).view(-1, 1, 1, 1) * H * D,
        "off_kv": torch.tensor([0, 7, 10, 16]).view(-1, 1, 1, 1) * H * D,
    }
    pack = {
        q: x["q"],
        k: x["k"],
        v: x["v"],
        lq: lens["seq_len_q"],
        lk: lens["seq_len_kv"],
        off_q: lens["off_q"],
        off_kv: lens["off_kv"],
    }
    kw = dict(attn_scale=0.25, use_padding_mask=True, seq_len_q=lq, seq_len_kv=lk)
    if direction == "fwd":
        o, _ = g.sdpa(q, k, v, **kw)
        o.set_output(True).set_ragged_offset(off_q)
        outs = {o: _sentinel(torch.empty(B * S * H * D).as_strided((B, H, S, D), STRIDE))}
    else:
        o, do = (g.tensor((B, H, S, D), STRIDE) for _ in range(2))
        stats = g.tensor((B, H, S, 1), (H * S, S, 1, 1), frost.data_type.FLOAT)
        for t_ in (o, do):
            t_.set_ragged_offset(off_q)
        grads = g.sdpa_backward(q, k, v, o, do, stats, **kw)
        for h, off in zip(grads, (off_q, off_kv, off_kv)):
            h.set_output(True).set_ragged_offset(off)
        outs = {h: _sentinel(torch.empty(B * S * H * D).as_strided((B, H, S, D), STRIDE)) for h in grads}
        pack.update({o: x["o"], do: x["do"], stats: torch.zeros(B, H, S, 1)})
    g.validate()
    g.build_plans(engine="reference")
    pack.update(outs)
    return g, pack, lens, list(outs.values())


RAGGED_BAD = {
    # batch 0 is fine and comes first: the reference once wrote its rows before raising on batch 1
    "seq_len_q above S": ("seq_len_q", [5, 9, 8], ["seq_len_q[1] = 9", "[0, 8]"]),
    "seq_len_kv negative": ("seq_len_kv", [7, -2, 8], ["seq_len_kv[1] = -2"]),
    "seq_len_q 2^31-1": ("seq_len_q", [5, BIG, 8], [f"seq_len_q[1] = {BIG}"]),
    "offset past the token envelope": ("off_q", [0, 5, 25, 30], ["q_ragged_offset[2]", "token 25", "[0, 24]"]),
    "offset plus length past the envelope": (
        "off_kv",
        [0, 7, 20, 24],
        ["k_ragged_offset[2]", "token 20", "plus seq_len_kv[2] = 8"],
    ),
    "negative offset": ("off_q", [0, -1, 7, 15], ["q_ragged_offset[1]", "token -1"]),
    "offset not a whole token": ("off_kv", [0, 7, 10, 16], ["k_ragged_offset[1]", "whole number of tokens"]),
}


@pytest.mark.parametrize("name", list(RAGGED_BAD))
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_ragged_bad_values_raise_before_any_batch_is_written(name, direction):
    role, values, words = RAGGED_BAD[name]
    g, pack, lens, outs = _ragged(direction)
    if role.startswith("off"):
        scale = 1 if name == "offset not a whole token" else H * D
        new = torch.tensor(values).view(-1, 1, 1, 1) * scale
        if name == "offset not a whole token":
            new = new * H * D + torch.tensor([0, 1, 0, 0]).view(-1, 1, 1, 1)
        lens[role].copy_(new)
    else:
        lens[role].view(-1).copy_(torch.tensor(values, dtype=torch.int32))
    with pytest.raises(BindingError) as e:
        g.execute(pack, None)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    assert _untouched(*outs)


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_ragged_good_values_run(direction):
    g, pack, _, outs = _ragged(direction)
    g.execute(pack, None)
    assert not (outs[0][0, :, :5] == SENTINEL).any()


# the opt-in check (docs/lengths.md): on the CPU the same rules on the host, the same flag
from frost.engines.common import length_check_params as lc  # noqa: E402

FLAG_OF = {
    "seq_len_q above S": lc.LENGTH_ABOVE_MAX,
    "seq_len_kv negative": lc.LENGTH_NEGATIVE,
    "seq_len_q 2^31-1": lc.LENGTH_ABOVE_MAX,
    # (entry 2 then spans 2..10: above max_seq_len_q = 5 too; the check reports every rule, the reference the first)
    "cu_seq_len_q decreasing": lc.PREFIX_SUMS_DECREASE | lc.LENGTH_ABOVE_MAX,
    "cu_seq_len_kv past the tokens": lc.OFFSET_OUTSIDE,
    "cu_seq_len_q negative": lc.OFFSET_OUTSIDE,
    "cu_seq_len_q 2^31-1": lc.OFFSET_OUTSIDE,
    "cu_seq_len_kv above max_seq_len": lc.LENGTH_ABOVE_MAX,
}
RAGGED_FLAG_OF = {
    "seq_len_q above S": lc.LENGTH_ABOVE_MAX,
    "seq_len_kv negative": lc.LENGTH_NEGATIVE,
    "seq_len_q 2^31-1": lc.LENGTH_ABOVE_MAX | lc.OFFSET_PLUS_LENGTH_OUTSIDE,
    "offset past the token envelope": lc.OFFSET_OUTSIDE,
    "offset plus length past the envelope": lc.OFFSET_PLUS_LENGTH_OUTSIDE,
    "negative offset": lc.OFFSET_OUTSIDE,
    "offset not a whole token": lc.OFFSET_NOT_WHOLE_TOKEN,
}


def _flag(value: int = 0x7FFF) -> torch.Tensor:
    return torch.full((1,), value, dtype=torch.int32)  # a stale value: the check writes, never accumulates


@pytest.mark.parametrize("name", list(BAD))
def test_length_check_flags_the_rule_the_reference_raises_for(name):
    case, role, values, _ = BAD[name]
    g, pack, t, outs = _fwd(case)
    check, flag = g.length_check(), _flag()
    check(pack, flag)
    assert flag.item() == 0  # the graph's own lengths break no rule
    _poke(t, role, values)
    check(pack, flag)
    assert flag.item() == FLAG_OF[name], (flag.item(), lc.length_check_errors(flag.item()))
    assert _untouched(*outs)  # the check writes its flag only


@pytest.mark.parametrize("name", list(RAGGED_BAD))
def test_ragged_length_check_flags(name):
    role, values, _ = RAGGED_BAD[name]
    g, pack, lens, outs = _ragged("fwd")
    check, flag = g.length_check(), _flag()
    check(pack, flag)
    assert flag.item() == 0
    if role.startswith("off"):
        new = torch.tensor(values).view(-1, 1, 1, 1) * H * D
        if name == "offset not a whole token":
            new = new + torch.tensor([0, 1, 0, 0]).view(-1, 1, 1, 1)
        lens[role].copy_(new)
    else:
        lens[role].view(-1).copy_(torch.tensor(values, dtype=torch.int32))
    check(pack, flag)
    assert flag.item() == RAGGED_FLAG_OF[name], lc.length_check_errors(flag.item())


def test_length_check_reports_every_rule_broken_and_names_them():
    g, pack, t, _ = _fwd(PACKED)
    _poke(t, "cu_seq_len_q", [0, 4, 3, 12])  # entry 1 decreases
    _poke(t, "cu_seq_len_kv", [0, 7, 9, 15])  # entry 0 is above max_seq_len_kv = 6
    flag = _flag()
    g.length_check()(pack, flag)
    assert flag.item() == lc.PREFIX_SUMS_DECREASE | lc.LENGTH_ABOVE_MAX
    assert frost.length_check_errors(flag.item()) == [lc.RULES[lc.LENGTH_ABOVE_MAX], lc.RULES[lc.PREFIX_SUMS_DECREASE]]


def test_length_check_needs_device_lengths_and_one_int32():
    g, pack, _, _ = _fwd(Case())
    with pytest.raises(frost.GraphError, match="no lengths"):
        g.length_check()
    g, pack, _, _ = _fwd(PADDED)
    with pytest.raises(BindingError, match="one int32"):
        g.length_check()(pack, torch.zeros(2, dtype=torch.int32))
