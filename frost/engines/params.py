"""TemplateParams: the frozen, hashable record that parameterizes one kernel template.

Every field is a plan-time value. Runtime extents (batch, sequence lengths,
packed totals) are never fields: they compile as symbolic ints.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class TemplateParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def key(self) -> str:
        """Stable text form used in compile keys."""
        return self.model_dump_json()
