"""Params of the probe copy template (no cutlass import, like every *_params module)."""

from __future__ import annotations

from typing import Literal

from frost.engines.params import TemplateParams


class ProbeCopyParams(TemplateParams):
    dtype: Literal["f16", "bf16", "f32"] = "f32"
