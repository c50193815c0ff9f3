"""Compile keys hold plan-time values only: one compiled plan serves every runtime extent.

The kernels compile for real (CPU, no GPU needed); only the launch is replaced by
a recorder, since launching needs a GPU.
"""

from __future__ import annotations

import pytest
import torch

from frost.adapters.base import lower_fwd
from frost.adapters.sm80 import SdpaFwdDslSm80
from frost.adapters.sm120 import SdpaFwdDslSm120
from frost.adapters.sm90 import SdpaFwdDslSm90
from frost.compiler import compile as boundary
from frost.target import CPU, fake_target
from test.plan_graphs import fwd_thd

pytestmark = pytest.mark.slow

ARCH_LINES = [
    (SdpaFwdDslSm80, "A100"),
    (SdpaFwdDslSm80, "H200"),
    (SdpaFwdDslSm120, "RTX5090"),
    (SdpaFwdDslSm90, "H200"),
]


def _thd_facts(total=4096, batch=3):
    return fwd_thd(CPU, total=total, batch=batch).validate().facts


class _Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, *args):
        self.calls.append(args)


@pytest.mark.parametrize("adapter_cls,target", ARCH_LINES, ids=lambda x: getattr(x, "__name__", x))
def test_execute_with_new_totals_never_compiles(adapter_cls, target):
    facts = _thd_facts()
    adapter = lower_fwd(adapter_cls, facts, fake_target(target))
    assert adapter.kernel.name.startswith("frost_sdpa_fwd")
    compiles = boundary.stats.compiles
    rec = _Recorder()
    real, adapter.kernel.fn = adapter.kernel.fn, rec
    try:
        _run_totals(adapter)
    finally:
        adapter.kernel.fn = real
    assert boundary.stats.compiles == compiles, "execute compiled"
    assert [c[0].shape[0] for c in rec.calls] == [4096, 1000, 17]
    # a second plan of the same specialization with another envelope reuses the artifact
    again = lower_fwd(adapter_cls, _thd_facts(total=9999, batch=7), fake_target(target))
    assert boundary.stats.compiles == compiles
    assert again.kernel.name == adapter.kernel.name


def _run_totals(adapter):
    for total in (4096, 1000, 17):
        bound = {
            "q": torch.zeros(total, 8, 128, dtype=torch.bfloat16),
            "k": torch.zeros(total, 2, 128, dtype=torch.bfloat16),
            "v": torch.zeros(total, 2, 128, dtype=torch.bfloat16),
            "o": torch.zeros(total, 8, 128, dtype=torch.bfloat16),
            "stats": torch.zeros(total, 8, 1, dtype=torch.float32),
            "cu_seq_len_q": torch.zeros(4, dtype=torch.int32),
            "cu_seq_len_kv": torch.zeros(4, dtype=torch.int32),
        }
        adapter.execute(bound, None, 0)


def test_kernel_window_bounds_are_clamped_without_changing_the_mask():
    from frost.adapters.dsl import kernel_window

    thd = _thd_facts(total=4096)
    assert kernel_window(thd) == (None, 0)  # causal: nothing to clamp
    huge = thd.model_copy(update={"window_left": 2**40, "window_right": 2**33})
    assert kernel_window(huge) == (2 * 4096, 2 * 4096)  # the packed envelopes, Int32-safe
    dense = huge.model_copy(update={"is_thd": False, "total_q": 0, "total_kv": 0, "seq_q": 300, "seq_kv": 700})
    assert kernel_window(dense) == (1000, 1000)
    small = dense.model_copy(update={"window_left": 5, "window_right": 999})
    assert kernel_window(small) == (5, 999)
    # the reference mask agrees: a bound of Sq + Skv admits what an unbounded window admits
    from frost.adapters.reference_math import allowed_mask

    for br in (False, True):
        wide = allowed_mask(300, 700, window_left=2**40, window_right=2**33, bottom_right=br)
        clamped = allowed_mask(300, 700, window_left=1000, window_right=1000, bottom_right=br)
        assert bool((wide == clamped).all())
