"""The length clamps (docs/lengths.md) found in the generated code: every covering kernel that reads sequence
lengths or offsets from the device, on sm_80 and sm_90a, clamps each value it loads before any other use
(`frost.testing.length_clamps`: every use of an integer loaded from global memory, or of its quotient by a token
stride, is a min whose only use is a max, or the other way round). The structural check itself is tested on
hand-written MLIR first, so it is known to fail where a length goes unclamped."""

from __future__ import annotations

import pytest

from frost.testing.length_clamps import count_length_loads, unclamped_loads
from test.compile_runner import compile_groups

_HEAD = "  gpu.module @kernels {\n    cuda.kernel @frost_k(%arg0: !memref_gmem_i32, %arg1: !memref_gmem_i64) {\n"
_TAIL = "    }\n  }\n"


def _kernel(body: str) -> str:
    return _HEAD + "".join(f"      {line}\n" for line in body.strip().splitlines()) + _TAIL


CLAMPED = _kernel("""
%0 = cute.memref.load(%arg0, %c) : (!memref_gmem_i32, !cute.coord<"?">) -> i32
%1 = arith.minsi %0, %t : i32
%2 = arith.maxsi %1, %c0_i32 : i32
%3 = cute.memref.load(%arg1, %c) : (!memref_gmem_i64, !cute.coord<"?">) -> i64
%4 = arith.floordivsi %3, %c256_i64 : i64
%5 = arith.minsi %4, %t64 : i64
%6 = arith.maxsi %5, %c0_i64 : i64
%7 = arith.addi %2, %6 : i32
""")
RAW = _kernel("""
%0 = cute.memref.load(%arg0, %c) : (!memref_gmem_i32, !cute.coord<"?">) -> i32
%1 = arith.addi %0, %c1_i32 : i32
""")
# a min and a max that only happen to follow the load (a mask's band) while the raw value is used too
BESIDE = _kernel("""
%0 = cute.memref.load(%arg0, %c) : (!memref_gmem_i32, !cute.coord<"?">) -> i32
%1 = arith.minsi %0, %t : i32
%2 = arith.maxsi %1, %c0_i32 : i32
%3 = arith.subi %t, %0 : i32
""")
# MLIR reuses a name in sibling regions: the clamp of one branch's load says nothing of the other's
SIBLINGS = _kernel("""
scf.if %p {
  %0 = cute.memref.load(%arg0, %c) : (!memref_gmem_i32, !cute.coord<"?">) -> i32
  %1 = arith.minsi %0, %t : i32
  %2 = arith.maxsi %1, %c0_i32 : i32
} else {
  %0 = cute.memref.load(%arg0, %c) : (!memref_gmem_i32, !cute.coord<"?">) -> i32
  %1 = arith.muli %0, %c2_i32 : i32
}
""")


def test_the_structural_check_finds_unclamped_loads():
    assert count_length_loads(CLAMPED) == 2 and unclamped_loads(CLAMPED) == {}
    assert unclamped_loads(RAW) == {"frost_k": ["%0"]}
    assert unclamped_loads(BESIDE) == {"frost_k": ["%0"]}
    assert unclamped_loads(SIBLINGS) == {"frost_k": ["%0"]}
    assert count_length_loads(SIBLINGS) == 2


def test_packed_kernels_cap_each_length_at_the_plans_maximum():
    """A packed length above max_seq_len_q / max_seq_len_kv is capped at it, as a padded one is at S: every
    kernel's `seqlen_info` call passes both maxima, which every packed kernel takes as arguments."""
    import ast
    from pathlib import Path

    from frost.engines.sdpa_args import fwd_arg_names
    from frost.engines.sm80.sdpa_bwd_params import Sm80BwdParams, main_args as sm80_main
    from frost.engines.sm80.sdpa_fwd_params import Sm80FwdParams
    from frost.engines.sm90.sdpa_bwd_params import Sm90BwdParams, main_args as sm90_main
    from frost.testing import cases

    root = Path(__file__).resolve().parents[2] / "frost" / "engines"
    calls, built = [], []  # seqlen_info's calls (11 arguments: ..., max_q, max_k); tiles.sequence's (7)
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            name = getattr(node.func, "id", getattr(node.func, "attr", "")) if isinstance(node, ast.Call) else ""
            if name == "seqlen_info":
                calls.append((path.name, node.lineno, len(node.args) + len(node.keywords)))
            elif name == "sequence" and getattr(node.func, "value", None) is not None:
                built.append((path.name, node.lineno, len(node.args) + len(node.keywords)))
    # the wgmma forward twice (producer, consumer) and tiles.sequence, which the other three kernels call
    assert len(calls) >= 3 and any(f == "tiles.py" for f, _, _ in calls), calls
    assert all(n == 11 for _, _, n in calls), [c for c in calls if c[2] != 11]
    assert {f for f, _, _ in built} >= {"sdpa_fwd.py", "sdpa_bwd.py"} and len(built) >= 3, built
    assert all(n == 7 for _, _, n in built), [c for c in built if c[2] != 7]  # ..., lengths, max_q, max_k
    thd_fwd = Sm80FwdParams(**cases.SM80_FWD_COVER["sm_80"][1])
    assert thd_fwd.is_thd and {"max_seqlen_q", "max_seqlen_kv"} <= set(fwd_arg_names(thd_fwd))
    sm80 = Sm80BwdParams(**cases.SM80_BWD_COVER["sm_90a"][0])
    sm90 = next(Sm90BwdParams(**kw) for group in cases.SM90_BWD_COVER for kw in group if kw.get("is_thd"))
    for args in (sm80_main(sm80), sm90_main(sm90)):
        assert {"max_seqlen_q", "max_seqlen_kv"} <= set(args)


def _covering_with_lengths() -> dict:
    """{(arch, family): [spec]} of the covering kernels (tools/kernel_ir.py's list) that read device lengths."""
    from tools.kernel_ir import covering_specs, has_lengths

    out: dict = {}
    for template, p, arch in covering_specs():
        if arch not in ("sm_80", "sm_90a") or not has_lengths(p):
            continue
        family = template.rsplit(".", 2)[-2] + "_" + template.rsplit(".", 1)[-1]  # e.g. sm80_sdpa_fwd
        cls = type(p)
        spec = (template, f"{cls.__module__}.{cls.__name__}", p.model_dump(mode="json"), None)
        out.setdefault((arch, family), []).append(spec)
    return out


FAMILIES = [
    "sm80_sdpa_fwd",
    "sdpa_bwd_preprocess",
    "sm80_sdpa_bwd",
    "sdpa_bwd_postprocess",
    "sm90_sdpa_fwd",
    "sm90_sdpa_bwd",
]


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_every_covering_kernel_with_device_lengths_clamps_them(arch, family, tmp_path):
    specs = _covering_with_lengths().get((arch, family), [])
    if not specs:
        pytest.skip(f"no covering {family} kernel with device lengths on {arch}")
    chunks = [specs[i::2] for i in range(2)]  # two interpreters
    outs = [o for group in compile_groups([(arch, c) for c in chunks if c], tmp_path) for o in group]
    assert len(outs) == len(specs)
    for out in outs:
        assert out["target"] == [arch], out["name"]
        # preprocess kernels read lengths only for dSink's rows, so some read none at all
        if family not in ("sdpa_bwd_preprocess", "sdpa_bwd_postprocess"):
            assert out["length_loads"] > 0, out["name"]
        assert out["unclamped"] == {}, (out["name"], out["unclamped"])


@pytest.mark.slow
def test_the_length_check_kernel_compiles_and_reads_the_values_as_they_are(tmp_path):
    from frost.engines.common.length_check import kernel_name
    from frost.engines.common.length_check_params import LengthCheckParams

    params = "frost.engines.common.length_check_params.LengthCheckParams"
    cases = [
        dict(form="padded"),
        dict(form="packed"),
        dict(form="ragged", offsets=(("q", 256, "int64"), ("kv", 128, "int32"), ("q", 4, "int32"))),
    ]
    archs = ("sm_80", "sm_90a")
    groups = [(arch, [("frost.engines.common.length_check", params, kw, None) for kw in cases]) for arch in archs]
    for arch, outs in zip(archs, compile_groups(groups, tmp_path)):
        for kw, out in zip(cases, outs):
            assert out["name"] == kernel_name(LengthCheckParams(**kw), arch) and out["target"] == [arch]
            assert out["length_loads"] == {"padded": 2, "packed": 4, "ragged": 5}[kw["form"]], out
            assert out["unclamped"], out  # it compares the raw values: the one exception to the clamp check
