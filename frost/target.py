"""The compile target: a frozen record of the device, discovered once in the parent.

Kernels compile for `Target.arch`; launch policy (persistent grid size) reads
`sm_count`. Nothing compiles against a live device query, so tests use the fake
targets below on machines without a GPU.
"""

from __future__ import annotations

import functools

from pydantic import BaseModel, ConfigDict


class Target(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    cc_major: int
    cc_minor: int
    sm_count: int
    smem_per_block_optin: int
    l2_bytes: int
    is_fake: bool = False

    @property
    def cc(self) -> tuple[int, int]:
        return (self.cc_major, self.cc_minor)

    @property
    def arch(self) -> str:
        """The `--gpu-arch` string kernels compile for (arch-specific 'a' on 9.0+)."""
        suffix = "a" if self.cc_major >= 9 else ""
        return f"sm_{self.cc_major}{self.cc_minor}{suffix}"

    @property
    def is_cpu(self) -> bool:
        return self.cc_major == 0


CPU = Target(name="cpu", cc_major=0, cc_minor=0, sm_count=0, smem_per_block_optin=0, l2_bytes=0)

FAKE_TARGETS: dict[str, Target] = {
    "A100": Target(
        name="NVIDIA A100-SXM4-80GB (fake)",
        cc_major=8,
        cc_minor=0,
        sm_count=108,
        smem_per_block_optin=166912,
        l2_bytes=40 * 2**20,
        is_fake=True,
    ),
    "H200": Target(
        name="NVIDIA H200 (fake)",
        cc_major=9,
        cc_minor=0,
        sm_count=132,
        smem_per_block_optin=232448,
        l2_bytes=60 * 2**20,
        is_fake=True,
    ),
    "B200": Target(
        name="NVIDIA B200 (fake)",
        cc_major=10,
        cc_minor=0,
        sm_count=148,
        smem_per_block_optin=232448,
        l2_bytes=126 * 2**20,
        is_fake=True,
    ),
    "RTX5090": Target(
        name="NVIDIA GeForce RTX 5090 (fake)",
        cc_major=12,
        cc_minor=0,
        sm_count=170,
        smem_per_block_optin=101376,
        l2_bytes=96 * 2**20,
        is_fake=True,
    ),
}


def fake_target(name: str) -> Target:
    try:
        return FAKE_TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown fake target {name!r}; known: {sorted(FAKE_TARGETS)}") from None


@functools.lru_cache(maxsize=None)
def discover_target(device_index: int | None = None) -> Target:
    """The target of a CUDA device (the current one by default), or CPU when none.

    Reads properties through torch, which the parent process has anyway; worker
    processes never call this (they receive the parent's record).
    """
    import torch

    if not torch.cuda.is_available():
        return CPU
    idx = torch.cuda.current_device() if device_index is None else device_index
    p = torch.cuda.get_device_properties(idx)
    smem = getattr(p, "shared_memory_per_block_optin", 0) or 49152
    l2 = getattr(p, "L2_cache_size", 0) or 0
    return Target(
        name=p.name,
        cc_major=p.major,
        cc_minor=p.minor,
        sm_count=p.multi_processor_count,
        smem_per_block_optin=int(smem),
        l2_bytes=int(l2),
    )
