"""Importing frost, its arch adapters, declaring and ranking never import cutlass (checked in a fresh interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent("""
    import json, sys

    def heavy():
        return sorted(m for m in sys.modules if m.split(".")[0] in ("cutlass", "tvm_ffi"))

    seen = {}
    import frost
    seen["import frost"] = heavy()
    import frost.adapters.sm80, frost.adapters.sm90, frost.adapters.sm120, frost.adapters.sm100
    import frost.adapters.reference, frost.compiler.compile
    seen["import adapters"] = heavy()

    from frost.target import fake_target

    def ranked(target):
        g = frost.Graph(io_data_type=frost.DataType.BFLOAT16, target=target)
        q, k, v = (g.tensor(name=n, dim=(2, 8, 256, 128)) for n in "qkv")
        o, stats = g.sdpa(q, k, v, attn_scale=0.088, generate_stats=True, use_causal_mask=True)
        o.set_output(True)
        stats.set_output(True)
        g.validate()
        g.create_execution_plans()
        return g.available_engines(), g.declines()

    ranked(fake_target("H200"))
    seen["rank on H200"] = heavy()

    # as if every kernel had landed: ranking constructs adapters and checks support, and still compiles nothing
    from frost.lowering import capabilities
    capabilities.ROWS = tuple(r.model_copy(update={"pending": None}) for r in capabilities.ROWS)
    accepted, _ = ranked(fake_target("H200"))
    for name in ("A100", "B200", "RTX5090"):
        ranked(fake_target(name))
    seen["rank with every row available"] = heavy()
    print(json.dumps({"seen": seen, "accepted": accepted}))
""")


def test_frost_import_and_ranking_do_not_import_cutlass():
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("CUTE_DSL_ARCH", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for stage, modules in result["seen"].items():
        assert modules == [], f"after {stage!r}: {modules} were imported"
    assert set(result["seen"]) == {"import frost", "import adapters", "rank on H200", "rank with every row available"}
    # the subprocess really ranked: with every row available, Hopper ranks SM90 over SM80 (when the DSL is here),
    # and the cuDNN engine last where nvidia-cudnn-frontend is installed (its binding imports no cutlass either)
    accepted = [n for n in result["accepted"] if n != "SdpaFwdCudnn"]
    assert accepted in (["SdpaFwdDslSm90", "SdpaFwdDslSm80"], [])
    assert result["accepted"][len(accepted) :] in ([], ["SdpaFwdCudnn"])
