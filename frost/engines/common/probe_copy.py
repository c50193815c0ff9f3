"""Probe template: an elementwise copy with a symbolic length.

It exists so that the compile boundary, the artifact cache and the worker pool
can be exercised in seconds (CPU tests, smoke checks) with a real CuTe DSL
kernel that has the same contract as the SDPA templates: plan-time params,
fake tensors with a symbolic extent, the caller's stream (TVM-FFI env stream).
Call signature of the compiled kernel: ``fn(src, dst)``, 1-D, equal lengths.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from frost.engines.common.probe_copy_params import ProbeCopyParams

TEMPLATE = __name__
THREADS = 256
_DTYPES = {"f16": cutlass.Float16, "bf16": cutlass.BFloat16, "f32": cutlass.Float32}


def kernel_name(params: ProbeCopyParams, arch: str) -> str:
    return f"frost_probe_copy_{params.dtype}"


def build(params: ProbeCopyParams, arch: str):
    """The host entry and its fake args (src, dst, env stream); one symbolic n."""
    n = cute.sym_int()
    dtype = _DTYPES[params.dtype]
    src = cute.runtime.make_fake_compact_tensor(dtype, (n,))
    dst = cute.runtime.make_fake_compact_tensor(dtype, (n,))
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return probe_copy, (src, dst, stream)


@cute.kernel
def probe_copy_kernel(src: cute.Tensor, dst: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    if i < cute.size(src, mode=[0]):
        dst[i] = src[i]


@cute.jit
def probe_copy(src: cute.Tensor, dst: cute.Tensor, stream: cuda.CUstream):
    n = cute.size(src, mode=[0])
    probe_copy_kernel(src, dst).launch(grid=((n + THREADS - 1) // THREADS, 1, 1), block=(THREADS, 1, 1), stream=stream)
