"""Rank engines for a facts record and build the winner's plan through lower_fwd / lower_bwd."""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from typing import Optional

from frost.adapters.base import lower_bwd, lower_fwd
from frost.errors import EngineDecline, NotSupportedError
from frost.ir.facts import SdpaFacts
from frost.knobs import Knobs
from frost.lowering.capabilities import CapabilityRow, resolve_engine_name, rows_for
from frost.lowering.mismatch import mismatch
from frost.target import Target

REFERENCE_ON_GPU = "is the numerics oracle and is never chosen silently on a GPU; request it with engine='reference'"


def adapter_class(row: CapabilityRow):
    module, cls = row.adapter.split(":")
    return getattr(importlib.import_module(module), cls)


@dataclass
class Ranking:
    accepted: list = field(default_factory=list)  # [(row, adapter_instance)] best first
    declines: list = field(default_factory=list)  # [(engine name, reason)]


def rank(facts: SdpaFacts, target: Target, knobs: Optional[Knobs] = None, engine: Optional[str] = None) -> Ranking:
    knobs = knobs or Knobs()
    rows = rows_for(facts.direction)
    if engine is not None:
        wanted = resolve_engine_name(engine, facts.direction)
        rows = [r for r in rows if r.name == wanted]
    out = Ranking()
    for row in sorted(rows, key=lambda r: r.priority):
        reason = mismatch(row, facts, knobs, target)
        if reason is None and row.explicit_only_on_gpu and not target.is_cpu and engine is None:
            reason = REFERENCE_ON_GPU
        if reason is not None:
            out.declines.append((row.name, reason))
            continue
        adapter = adapter_class(row)(facts, target, knobs)
        try:
            if out.accepted and engine is None and getattr(adapter, "costly_support_check", False):
                # a fallback below an engine that already accepted: its own cheap checks only (the library's
                # verdict costs plan time, and the plan never reaches it unless it is requested by name)
                adapter.check_support(quick=True)
            else:
                adapter.check_support()
        except EngineDecline as e:
            out.declines.append((row.name, e.reason))
            continue
        out.accepted.append((row, adapter))
    return out


@dataclass
class Plan:
    """A built plan: one adapter whose kernels are compiled. Owns no device memory."""

    engine_name: str
    adapter: object
    facts: SdpaFacts
    plan_seconds: float

    @property
    def workspace_size(self) -> int:
        return self.adapter.scratch_workspace_bytes()


def describe(facts: SdpaFacts) -> str:
    layout = "thd" if facts.is_thd else "dense"
    return (
        f"sdpa {facts.direction} ({facts.io_dtype}, d={facts.head_dim_qk}x{facts.head_dim_v}, "
        f"heads {facts.num_heads_q}/{facts.num_heads_kv}, {layout}, features "
        f"{sorted(facts.features()) or 'none'})"
    )


def build_plan(
    facts: SdpaFacts,
    target: Target,
    knobs: Optional[Knobs] = None,
    engine: Optional[str] = None,
    ranking: Optional[Ranking] = None,
) -> Plan:
    t0 = time.perf_counter()
    ranking = ranking or rank(facts, target, knobs, engine)
    if not ranking.accepted:
        raise NotSupportedError(describe(facts) + f" on {target.name}", ranking.declines)
    row, adapter = ranking.accepted[0]
    lower = lower_fwd if facts.direction == "fwd" else lower_bwd
    adapter = lower(type(adapter), facts, target, knobs)
    return Plan(engine_name=row.name, adapter=adapter, facts=facts, plan_seconds=time.perf_counter() - t0)
