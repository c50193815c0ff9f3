"""GQA packing in the SM90 forward: the adapter's default, the knob both ways, and why a graph cannot pack.

No kernel is compiled here (the compile test covers packed flavors); these check
which TemplateParams the adapter would compile from and the decline reasons.
"""

from __future__ import annotations

import pytest

import frost
from frost.adapters.sm90 import SdpaFwdDslSm90
from frost.engines.sm90.sdpa_fwd_params import Sm90FwdParams, pack_gqa_reason, validate
from frost.errors import TemplateParamsError
from frost.knobs import Knobs
from test.cpu.test_routing import H200, declare, reasons


def _params(knobs=None, **kw):
    g = declare(H200, d=128, **kw)
    return SdpaFwdDslSm90(g.facts, H200, Knobs(**(knobs or {}))).template_params()


@pytest.mark.parametrize(
    "hq,hkv,packs", [(32, 8, True), (8, 1, True), (64, 1, True), (4, 4, False), (6, 2, False), (128, 1, False)]
)
def test_default_packs_where_the_template_can(hq, hkv, packs):
    p = _params(hq=hq, hkv=hkv, use_causal_mask=True)
    assert p.pack_gqa is packs
    validate(p)


def test_default_packs_thd_sinks_and_padding():
    assert _params(hq=16, hkv=4, thd=True, use_causal_mask=True).pack_gqa
    g = frost.Graph(io_data_type="bf16", target=H200)
    q = g.tensor(name="q", dim=(2, 16, 64, 128))
    k, v = (g.tensor(name=n, dim=(2, 4, 64, 128)) for n in "kv")
    sink = g.tensor(name="sink", dim=(16,), data_type="fp32")
    lq, lk = (g.tensor(name=n, dim=(2, 1, 1, 1), data_type="int32") for n in ("lq", "lk"))
    o, _ = g.sdpa(q, k, v, sink_token=sink, use_padding_mask=True, seq_len_q=lq, seq_len_kv=lk)
    o.set_output(True)
    g.validate()
    p = SdpaFwdDslSm90(g.facts, H200, Knobs()).template_params()
    assert p.pack_gqa and p.has_sinks and p.has_seqused


def test_knob_forces_packing_off_and_on():
    assert not _params(knobs=dict(pack_gqa=False), hq=32, hkv=8).pack_gqa
    assert _params(knobs=dict(pack_gqa=True), hq=32, hkv=8).pack_gqa


@pytest.mark.parametrize(
    "hq,hkv,why", [(4, 4, "num_heads_q > num_heads_kv"), (6, 2, "divide 64"), (128, 1, "divide 64")]
)
def test_forced_packing_declines_with_the_reason(unpended, hq, hkv, why):
    g = declare(H200, d=128, hq=hq, hkv=hkv).create_execution_plans(knobs=frost.Knobs(pack_gqa=True))
    reason = reasons(g)["SdpaFwdDslSm90"]
    assert "pack_gqa" in reason and why in reason, reason
    # the mma.sync forward packs too (decodes, frost.adapters.split_kv): it judges the request by its own tiles
    sm80 = reasons(g).get("SdpaFwdDslSm80")
    assert sm80 is None or "pack_gqa" in sm80, sm80


def test_forced_off_still_plans_on_sm90(unpended):
    g = declare(H200, d=128, hq=32, hkv=8).create_execution_plans(knobs=frost.Knobs(pack_gqa=False))
    assert g.available_engines()[0] == "SdpaFwdDslSm90"


@pytest.mark.parametrize(
    "bad",
    [dict(num_heads_q=4, num_heads_kv=4), dict(num_heads_q=6, num_heads_kv=2), dict(num_heads_q=128, num_heads_kv=1)],
)
def test_validator_rejects_unpackable(bad):
    p = Sm90FwdParams(pack_gqa=True, **bad)
    assert pack_gqa_reason(p)
    with pytest.raises(TemplateParamsError, match="pack_gqa"):
        validate(p)


def test_rows_per_query():
    assert Sm90FwdParams(num_heads_q=32, num_heads_kv=8).rows_per_query == 1
    assert Sm90FwdParams(num_heads_q=32, num_heads_kv=8, pack_gqa=True).rows_per_query == 4


def test_decode_shapes_get_64_row_tiles():
    """Fewer packed tiles than SMs (few queries per kv head): 64-row tiles; otherwise the head dim's default."""
    assert _params(hq=32, hkv=4, b=8, s=1, skv=8192, use_causal_mask_bottom_right=True).tile_m == 64
    assert _params(hq=32, hkv=4, b=8, s=16, skv=32768).tile_m == 64
    assert _params(hq=32, hkv=4, b=8, s=128, skv=8192).tile_m == 128  # 256 tiles
    assert _params(hq=32, hkv=8, b=4, s=4096).tile_m == 128
    assert _params(hq=32, hkv=4, b=8, s=1, knobs=dict(tile_m=128)).tile_m == 128  # a request wins
    assert _params(hq=32, hkv=4, b=8, s=1, knobs=dict(pack_gqa=False)).tile_m == 128  # unpacked: untouched
    assert _params(hq=8, hkv=2, s=1, thd=True).tile_m == 64
