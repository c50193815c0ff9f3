"""benchmarks/gpu_suite_summary.py on a synthetic junit file: per-file counts, skip reasons, failures."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="3" tests="7">
<testcase classname="test.gpu.test_a_gpu" name="test_one[sm90]" time="1.0"/>
<testcase classname="test.gpu.test_a_gpu" name="test_one[sm80]" time="1.0">
  <skipped type="pytest.skip" message="sm80 declines: [('SdpaFwdDslSm80', 'd_v is above 256')]">skip</skipped>
</testcase>
<testcase classname="test.gpu.test_a_gpu" name="test_two[sm80]" time="1.0">
  <skipped type="pytest.skip" message="sm80 declines: [('SdpaFwdDslSm80', 'd_v is above 256')]">skip</skipped>
</testcase>
<testcase classname="test.gpu.test_b_gpu.TestX" name="test_three" time="2.0">
  <failure message="AssertionError: dQ: max abs error 0.5 &gt;= 0.0625 at (0, 1, 17, 3)">trace</failure>
</testcase>
<testcase classname="test.gpu.test_b_gpu.TestX" name="test_four" time="2.0">
  <error message="failed on setup with &quot;RuntimeError: CUDA error&quot;">trace</error>
</testcase>
<testcase classname="test.gpu.test_b_gpu" name="test_five" time="2.0">
  <skipped type="pytest.skip" message="needs an sm_90 GPU">skip</skipped>
</testcase>
<testcase classname="test.gpu.test_b_gpu" name="test_six" time="2.0"/>
</testsuite></testsuites>
"""


def _module():
    spec = importlib.util.spec_from_file_location("gpu_suite_summary", ROOT / "benchmarks" / "gpu_suite_summary.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_summary_counts_reasons_and_failures(tmp_path, capsys):
    mod = _module()
    path = tmp_path / "junit-1.xml"
    path.write_text(JUNIT)
    rc = mod.main([str(path), "--commit", "abc1234", "--gpu", "H200"])
    md = capsys.readouterr().out
    assert rc == 1  # a failure makes the exit status nonzero
    assert "## GPU test suite on H200 at abc1234" in md
    assert "| test/gpu/test_a_gpu.py | 1 | 0 | 0 | 2 |" in md
    assert "| test/gpu/test_b_gpu.py | 1 | 1 | 1 | 1 |" in md
    assert "| **total** | 2 | 1 | 1 | 3 |" in md
    assert "| test/gpu/test_a_gpu.py | 2 | sm80 declines: [('SdpaFwdDslSm80', 'd_v is above 256')] |" in md
    assert "| test/gpu/test_b_gpu.py | 1 | needs an sm_90 GPU |" in md
    assert "- `test/gpu/test_b_gpu.py::test_three` (failed): AssertionError: dQ: max abs error 0.5" in md
    assert "test_four` (error): failed on setup" in md


def test_a_rerun_shard_replaces_the_earlier_outcome(tmp_path, capsys):
    mod = _module()
    first, rerun = tmp_path / "junit-1.xml", tmp_path / "junit-2.xml"
    first.write_text(JUNIT)
    rerun.write_text(
        '<testsuite><testcase classname="test.gpu.test_b_gpu.TestX" name="test_three"/>'
        '<testcase classname="test.gpu.test_b_gpu.TestX" name="test_four"/></testsuite>'
    )
    assert mod.main([str(first), str(rerun)]) == 0
    assert "| test/gpu/test_b_gpu.py | 3 | 0 | 0 | 1 |" in capsys.readouterr().out


def test_tests_cut_by_the_timeout_are_counted_apart_never_as_passes(tmp_path, capsys):
    """xdist writes a test interrupted mid-run as a testcase with neither name nor class."""
    mod = _module()
    path = tmp_path / "junit-1.xml"
    path.write_text(
        '<testsuite><testcase classname="test.gpu.test_b_gpu" name="test_six"/>'
        '<testcase time="0.001" /><testcase time="0.000" /></testsuite>'
    )
    assert mod.main([str(path)]) == 0
    md = capsys.readouterr().out
    assert "| **total** | 1 | 0 | 0 | 0 |" in md
    assert "| .py |" not in md
    assert "2 tests were running when a timeout interrupted pytest" in md
