"""The GPU tests' plan-or-decline expectations agree with the planner, checked on the CPU on fake targets.

A GPU test that expects a decline the planner no longer makes (or a plan it no longer makes) would fail, or
skip, only on a GPU; planning needs no GPU, so the expectation is checked here against the same graphs.
"""

from __future__ import annotations

import pytest

import frost
from frost.target import fake_target
from test.gpu import test_ragged_cudnn_form_gpu as ragged


@pytest.mark.slow  # planning a DSL engine compiles its kernels (about 20 s a case on two cores)
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("case", ragged.CASES, ids=ragged.CudnnRagged.id)
def test_ragged_cudnn_form_expectations_match_the_planner(direction, case):
    """On the H200 (fake target) that runs the GPU test: each engine plans or declines as the test expects."""
    if direction == "bwd" and case.rows:
        pytest.skip("the GPU test has no backward case with score_max / score_sum_exp")
    for engine in ("sm90", "sm80"):
        g, *_ = ragged.make(case, direction, device="cpu", target=fake_target("H200"))
        g.validate()
        try:
            g.build_plans(engine=engine)
            declined = None
        except frost.NotSupportedError as e:
            declined = e.declines
        want = ragged.expected_decline(engine, case, direction)
        assert (declined is not None) == want, (
            f"{engine} on the H200: the GPU test expects {'a decline' if want else 'a plan'}, the planner "
            f"{'declines: ' + str(declined) if declined else 'plans ' + g.engine_name}"
        )
