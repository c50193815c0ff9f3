"""Extents the DSL kernels take as 32-bit ints (S, max_seq_len, packed token totals) decline at plan time from
2^31 on, naming the extent; one below still plans."""

from __future__ import annotations

import pytest

import frost
from frost.target import fake_target

BIG = 2**31
WHY = "as a 32-bit int; this graph declares {v} (2^31 and above do not fit)"


def _dense(sq, skv, target="H200", direction="fwd"):
    g = frost.Graph(
        io_data_type="bf16", intermediate_data_type="fp32", compute_data_type="fp32", target=fake_target(target)
    )
    q = g.tensor(name="q", dim=(1, 1, sq, 64))
    k, v = (g.tensor(name=n, dim=(1, 1, skv, 64)) for n in ("k", "v"))
    if direction == "fwd":
        o, _ = g.sdpa(q, k, v, attn_scale=0.125)
        o.set_output(True)
    else:
        o, do = g.tensor(name="o", dim=(1, 1, sq, 64)), g.tensor(name="dO", dim=(1, 1, sq, 64))
        st = g.tensor(name="stats", dim=(1, 1, sq, 1), data_type="fp32")
        for t in g.sdpa_backward(q, k, v, o, do, st, attn_scale=0.125):
            t.set_output(True)
    return g


def _thd(tq, tkv, max_q, max_kv):
    g = frost.Graph(
        io_data_type="bf16", intermediate_data_type="fp32", compute_data_type="fp32", target=fake_target("H200")
    )
    q = g.tensor(name="q", dim=(tq, 2, 64))
    k, v = (g.tensor(name=n, dim=(tkv, 2, 64)) for n in ("k", "v"))
    cu_q, cu_kv = (g.tensor(name=n, dim=(3,), data_type="int32") for n in ("cu_q", "cu_kv"))
    o, _ = g.sdpa(
        q, k, v, attn_scale=0.125, cu_seq_len_q=cu_q, cu_seq_len_kv=cu_kv, max_seq_len_q=max_q, max_seq_len_kv=max_kv
    )
    o.set_output(True)
    return g


def _dsl_reasons(g):
    """The DSL engines' reasons (validate raises: nothing else serves these graphs here)."""
    with pytest.raises(frost.NotSupportedError) as ei:
        g.validate()
    return {e: r for e, r in ei.value.declines if "Dsl" in e and "compute capability" not in r}


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("target", ["H200", "A100"])
def test_sequence_lengths_of_2_31_decline_naming_them(target, direction):
    reasons = _dsl_reasons(_dense(BIG, 128, target, direction))
    assert reasons and all(r == f"takes S_q (q's dim 2) {WHY.format(v=BIG)}" for r in reasons.values()), reasons
    reasons = _dsl_reasons(_dense(128, BIG + 5, target, direction))
    assert reasons and all(r == f"takes S_kv (k's dim 2) {WHY.format(v=BIG + 5)}" for r in reasons.values())


def test_every_kernel_row_takes_32_bit_extents():
    from frost.lowering.capabilities import ROWS

    kernel_rows = [r for r in ROWS if "Dsl" in r.name]
    assert kernel_rows and all(r.int32_extents for r in kernel_rows)


def test_one_below_2_31_still_plans_on_the_kernels():
    g = _dense(BIG - 1, BIG - 1).validate()
    assert g.available_engines()[0].startswith("SdpaFwdDsl")


def test_packed_totals_and_max_seq_len_decline_naming_them():
    r = _dsl_reasons(_thd(BIG, 64, 32, 32))
    assert r and all(v == f"takes the packed token total of q (its dim 0) {WHY.format(v=BIG)}" for v in r.values())
    r = _dsl_reasons(_thd(64, BIG, 32, 32))
    assert r and all(
        v == f"takes the packed token total of k and v (their dim 0) {WHY.format(v=BIG)}" for v in r.values()
    )
    r = _dsl_reasons(_thd(64, BIG, 32, BIG))
    assert r and all(v == f"takes max_seq_len_kv {WHY.format(v=BIG)}" for v in r.values()), r
