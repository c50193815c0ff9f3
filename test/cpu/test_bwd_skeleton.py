"""The backward skeleton is arch-neutral, and every arch adapter states its planning policy the same way.

The shared preprocess and dQ convert compile from a `BwdHelperParams` record alone: a row-layout accumulator
with turn semaphores (the layout a wgmma backward hands them) builds for sm_90a with plain loads and stores.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from frost.engines.sdpa_bwd.chain import BwdHelperParams, bwd_chain, stage_params
from frost.engines.sdpa_bwd.scratch import scratch_layout, uses_turns

ROOT = Path(__file__).resolve().parents[2]
ARCH_MODULES = (
    "frost.engines.sm80",
    "frost.engines.sm90",
    "frost.adapters.sm80",
    "frost.adapters.sm90",
    "frost.adapters.sm120",
    "frost.adapters.sm100",
)


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_skeleton_and_shared_adapters_import_no_arch_module():
    paths = [ROOT / "frost/adapters/dsl_bwd.py", ROOT / "frost/adapters/dsl.py", ROOT / "frost/adapters/base.py"]
    paths += sorted((ROOT / "frost/engines/sdpa_bwd").glob("*.py"))
    for path in paths:
        bad = [m for m in _imports(path) if m.startswith(ARCH_MODULES)]
        assert not bad, (path.name, bad)


def test_helper_records_carry_the_accumulator_contract():
    """A backward without 8x8 blocks or copies (a wgmma one) gets row-layout helpers and one accumulator."""
    main = BwdHelperParams(family="sm90", head_dim=128, head_dim_v=128, num_heads_q=4, deterministic=True)
    for stage in ("preprocess", "postprocess"):
        hp = stage_params(main, stage)
        assert not hp.dq_accum_blocked and hp.dq_splits == 0 and hp.family == "sm90"
    chain = bwd_chain(main, "some.wgmma.template", ["q", "dq_accum", "dq_semaphore", "stream"])
    assert [(stage, t) for stage, t, _, _ in chain] == [
        ("preprocess", "frost.engines.sdpa_bwd.preprocess"),
        ("main", "some.wgmma.template"),
        ("postprocess", "frost.engines.sdpa_bwd.postprocess"),
    ]
    assert "dq_semaphore" in chain[0][2] and uses_turns(main)


def test_scratch_of_a_row_layout_backward_with_turns():
    p = BwdHelperParams(head_dim=64, head_dim_v=64, num_heads_q=2, deterministic=True)
    with pytest.raises(AttributeError):  # turns need the main kernel's tile_m: the params must carry it
        scratch_layout(p, batch=3, max_seqlen_q=200, max_seqlen_kv=200)

    class Main(BwdHelperParams):
        tile_m: int = 128

    lay = dict(
        (n, s)
        for n, _, s in scratch_layout(Main(head_dim=64, head_dim_v=64, num_heads_q=2, deterministic=True), 3, 200, 200)
    )
    assert lay == {"dpsum": (3, 2, 200), "dq_accum": (3, 2, 200, 64), "dq_semaphore": (3 * 2 * 2,)}


@pytest.mark.parametrize(
    "name", ["SdpaFwdDslSm80", "SdpaBwdDslSm80", "SdpaFwdDslSm120", "SdpaBwdDslSm120", "SdpaFwdDslSm90"]
)
def test_every_arch_adapter_plans_its_knobs_through_one_hook(name):
    import importlib

    from frost.knobs import Knobs
    from test.cpu.test_routing import H200, declare

    module = {"Sm80": "frost.adapters.sm80", "Sm120": "frost.adapters.sm120", "Sm90": "frost.adapters.sm90"}
    cls = getattr(importlib.import_module(module[name[len("SdpaFwdDsl") :]]), name)
    assert list(inspect.signature(cls.plan_knobs).parameters) == ["facts", "target", "requested"]
    extra = {} if "Fwd" in name else dict(direction="bwd", use_deterministic_algorithm=True)
    g = declare(H200, hq=8, hkv=2, s=1024, d=128, **extra)
    knobs = cls.plan_knobs(g.facts, H200, {"tile_n": 64})
    assert knobs["tile_n"] == 64  # a requested knob is honored
    params = cls(g.facts, H200, Knobs(tile_n=64)).template_params()
    assert all(getattr(params, k) == v for k, v in knobs.items())


@pytest.mark.slow
def test_row_layout_helpers_compile_for_sm90(tmp_path):
    from test.compile_runner import compile_groups

    main = BwdHelperParams(
        family="sm90", head_dim=128, head_dim_v=128, num_heads_q=4, deterministic=True, has_sinks=True, has_dsinks=True
    )
    specs = [
        (t, "frost.engines.sdpa_bwd.chain.BwdHelperParams", sp.model_dump(), stage)
        for stage, t, _, sp in bwd_chain(main, "unused", [])
        if stage != "main"
    ]
    outs = compile_groups([("sm_90a", specs)], tmp_path)[0]
    assert [o["name"] for o in outs] == [
        "frost_sdpa_bwd_pre_sm90_bf16_d128_h4_dsink_det",
        "frost_sdpa_bwd_post_sm90_bf16_d128_h4_dsink",
    ]
    for o in outs:
        assert o["target"] == ["sm_90a"] and o["mma_sync"] == 0 and o["wgmma"] == 0 and o["sem"] == 0, o


@pytest.mark.parametrize("stage", ["preprocess", "postprocess"])
def test_every_boolean_field_a_helper_keeps_shows_in_its_name(stage):
    """A helper's name is its profiler and symbol name: two keys under one name (sinks on and off, say) would
    read as one kernel. Each boolean field its key keeps changes the name on its own."""
    from frost.engines.sdpa_bwd import chain, postprocess, preprocess

    name = (preprocess if stage == "preprocess" else postprocess).kernel_name
    base = BwdHelperParams(family="sm90", head_dim=128, head_dim_v=128, num_heads_q=4)
    flags = [
        f
        for f in chain.HELPER_FIELDS[stage]
        if isinstance(getattr(base, f), bool)
        and f not in chain._RAGGED_FIELDS  # named by ragged_tags
        and f not in ("has_dsinks", "dbias_sum_batch", "dbias_sum_heads")
    ]  # named together with another
    for f in flags:
        kw = {f: True}
        if f.startswith("dbias_accum_per"):
            kw["dbias_accum"] = True
        on = BwdHelperParams(**{**base.model_dump(), **kw})
        off = BwdHelperParams(**{**base.model_dump(), **{k: v for k, v in kw.items() if k != f}})
        assert name(stage_params(on, stage), "sm_90a") != name(stage_params(off, stage), "sm_90a"), f
