"""pytest plugin (`-p cpu_cuda_shim`): CUDA test code of the cuDNN frontend runs on the CPU, for frost's reference
engine. "cuda" allocations and generators land on the CPU; torch.cuda's queries answer, for the test files only
(paths under a `cudnn-tests` directory), as for a device that is the CPU (capability (0, 0), which frost plans
for as this machine); frost itself still sees no GPU. Used by cudnn_frontend_cpu.sh."""

import sys
import types

import torch
from torch.overrides import TorchFunctionMode

_real_is_available = torch.cuda.is_available
_RealGenerator = torch.Generator


def _from_tests() -> bool:
    return "/cudnn-tests/" in sys._getframe(2).f_code.co_filename


def _is_available():
    return True if _from_tests() else _real_is_available()


class _Stream:
    cuda_stream = 0

    def __init__(self, *a, **k):
        pass

    def synchronize(self):
        pass


class _Event:
    def __init__(self, *a, **k):
        pass

    def record(self, *a):
        pass

    def elapsed_time(self, other):
        return 0.0


torch.cuda.is_available = _is_available
torch.cuda.synchronize = lambda *a, **k: None
torch.cuda.current_stream = lambda *a, **k: _Stream()
torch.cuda.Stream = _Stream
torch.cuda.Event = _Event
torch.cuda.empty_cache = lambda: None
torch.cuda.get_device_name = lambda *a, **k: "CPU (frost reference engine)"
torch.cuda.get_device_capability = lambda *a, **k: (0, 0)
torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(multi_processor_count=0, name="cpu")
torch.Generator = lambda device=None: _RealGenerator()


def _cpu(dev):
    if isinstance(dev, torch.device) and dev.type == "cuda":
        return torch.device("cpu")
    if isinstance(dev, str) and dev.startswith("cuda"):
        return "cpu"
    return "cpu" if isinstance(dev, int) and not isinstance(dev, bool) else dev


class _CudaToCpu(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.to and args:
            args = (args[0],) + tuple(_cpu(a) if isinstance(a, (str, torch.device)) else a for a in args[1:])
        return func(*args, **kwargs)


_CudaToCpu().__enter__()
