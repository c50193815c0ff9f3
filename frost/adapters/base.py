"""The adapter contract: `SdpaFwdAdapter` / `SdpaBwdAdapter`, driven by `lower_fwd` / `lower_bwd`.

Every engine implements it: the CuTe DSL lines (`DslFwdAdapter` / `DslBwdAdapter`, which add the
template params and compiled kernels), the cuDNN frontend and the reference oracle. An adapter is
constructed with plan-time descriptors only (facts, target, knobs; no storage). `check_support()`
raises `EngineDecline`; `compile()` builds every artifact execute will need; `scratch_workspace_bytes()`
is a closed form; `execute(bound, workspace, stream)` takes tensors the binder has checked, makes the
views its kernels want and launches.
Subclasses may only add optional keywords.
"""

from __future__ import annotations

from typing import Optional

from frost.target import Target
from frost.errors import EngineDecline
from frost.ir.facts import SdpaFacts
from frost.knobs import Knobs


class SdpaAdapter:
    """What an engine is to the planner and the executor, whatever runs its math."""

    engine_name: str = "abstract"

    def __init__(self, facts: SdpaFacts, target: Target, knobs: Optional[Knobs] = None):
        self.facts = facts
        self.target = target
        self.knobs = knobs or Knobs()
        self.compiled = False

    def decline(self, reason: str) -> EngineDecline:
        return EngineDecline(self.engine_name, reason)

    def check_support(self) -> None:
        """Raise EngineDecline when this adapter cannot serve its facts on its target."""

    def compile(self) -> None:
        self.compiled = True

    def scratch_workspace_bytes(self) -> int:
        return 0

    def kernel_names(self) -> list[str]:
        return [k.name for k in self.compiled_kernels()]

    def compiled_kernels(self) -> list:
        """The CompiledKernel objects execute launches, in launch order (saved plans carry them)."""
        return []

    def kernel_specs(self) -> list:
        """(template module, params) of every kernel compile() builds, in launch order (precompile)."""
        return []

    def execute(self, bound: dict, workspace, stream) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class SdpaFwdAdapter(SdpaAdapter):
    """Contract of every SDPA forward adapter (DSL, cuDNN, reference)."""

    direction = "fwd"


class SdpaBwdAdapter(SdpaAdapter):
    """Contract of every SDPA backward adapter (DSL, cuDNN, reference)."""

    direction = "bwd"


def _lower(adapter_cls, direction: str, facts: SdpaFacts, target: Target, knobs: Optional[Knobs], **kw):
    if facts.direction != direction:
        raise ValueError(f"lower_{direction} got {facts.direction} facts")
    adapter = adapter_cls(facts, target, knobs, **kw)
    adapter.check_support()
    adapter.compile()
    return adapter


def lower_fwd(adapter_cls, facts: SdpaFacts, target: Target, knobs: Optional[Knobs] = None, **kw):
    """The one forward lowering: construct, check support, compile. `adapter_cls` is the parameter."""
    return _lower(adapter_cls, "fwd", facts, target, knobs, **kw)


def lower_bwd(adapter_cls, facts: SdpaFacts, target: Target, knobs: Optional[Knobs] = None, **kw):
    """The one backward lowering: construct, check support, compile. `adapter_cls` is the parameter."""
    return _lower(adapter_cls, "bwd", facts, target, knobs, **kw)
