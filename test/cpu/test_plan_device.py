"""Execute binds tensors on the plan's device only and launches with that device current (CPU: the logic, with
stand-ins for CUDA tensors and for the device switch)."""

from __future__ import annotations

import contextlib

import pytest
import torch

import frost
from frost.errors import BindingError
from frost.runtime import device as dev
from frost.target import CPU, fake_target

SENTINEL = 777.0


class _OnCuda:
    """A stand-in for a CUDA tensor: what the binder reads before any other check."""

    def __init__(self, index):
        self.index = index
        self.device = f"cuda:{index}"
        self.dtype = torch.float32

    def get_device(self):
        return self.index


def _ref_graph():
    g = frost.Graph(
        io_data_type=torch.float32, intermediate_data_type=torch.float32, compute_data_type=torch.float32, target=CPU
    )
    q, k, v = (g.tensor(name=n, dim=(1, 2, 8, 16)) for n in ("q", "k", "v"))
    o, _ = g.sdpa(q, k, v, attn_scale=0.25)
    o.set_output(True)
    g.validate().build_plans()
    return g, (q, k, v, o)


WANT = (
    "tensor 'q' is on cuda:1, but this plan was built for cuda:0; build a plan on that device "
    "(torch.cuda.set_device(1) before build_plans) or move the tensors"
)


def test_tensors_on_another_device_than_the_plans_raise_naming_both():
    g, ports = _ref_graph()
    g._binder.device = 0  # as if planned on cuda:0
    o = torch.full((1, 2, 8, 16), SENTINEL)
    pack = {ports[0]: _OnCuda(1), ports[1]: _OnCuda(1), ports[2]: _OnCuda(1), ports[3]: o}
    with pytest.raises(BindingError) as ei:
        g.execute(pack)
    assert str(ei.value) == WANT
    assert (o == SENTINEL).all()


def test_the_executor_paths_raise_the_same():
    g, ports = _ref_graph()
    g._binder.device = 0
    ex = g.executor(ports)
    o = torch.full((1, 2, 8, 16), SENTINEL)
    tensors = (_OnCuda(1), _OnCuda(1), _OnCuda(1), o)
    for call in (ex, ex.launch):
        with pytest.raises(BindingError) as ei:
            call(tensors)
        assert str(ei.value) == WANT
    assert (o == SENTINEL).all()


def test_check_device_allows_the_plans_device_and_cpu_plans():
    dev.check_device(0, 0, "x")
    dev.check_device(3, None, "x")  # a plan without a device (CPU, or no CUDA when it was built)
    dev.check_device(-1, 0, "x")  # off the GPU: the binder's own device checks judge it
    with pytest.raises(BindingError, match="is on cuda:2, but this plan was built for cuda:1"):
        dev.check_device(2, 1, "tensor 'k'")


def test_the_guard_switches_only_when_another_device_is_current(monkeypatch):
    switched = []

    @contextlib.contextmanager
    def switch(index):
        switched.append(index)
        yield

    monkeypatch.setattr(dev, "_switch", switch)
    guard = dev.DeviceGuard(None)
    ran = []
    guard.run(ran.append, "cpu plan")
    assert ran == ["cpu plan"] and switched == []
    guard = dev.DeviceGuard.__new__(dev.DeviceGuard)
    guard.index = 0
    current = [0]
    guard._get = lambda: current[0]
    guard.run(ran.append, "same device")
    assert switched == []
    current[0] = 1
    guard.run(ran.append, "other device current")
    assert switched == [0] and ran[-1] == "other device current"


def test_plans_without_a_gpu_have_no_device():
    assert dev.plan_device(CPU) is None
    if not torch.cuda.is_available():
        assert dev.plan_device(fake_target("H200")) is None
    g, _ = _ref_graph()
    assert g._binder.device is None and g._guard.index is None
