"""The shape every benchmarked implementation takes: availability, then a prepared call per buffer set.

`prepare` does all the one-time work (compilation, autograd graphs for peers'
backward, plan building for frost) so that a timed call is only the call.
Raising `Unsupported` marks a row "n/a" (the library does not offer this
workload); any other exception marks it "failed" with the reason.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

# Row statuses, shown in the table and stored in the JSON.
OK = "ok"
MISSING = "missing"  # library not installed / not importable
NA = "n/a"  # library does not offer this workload
FAILED = "failed"  # raised while preparing, running or timing
CHECK_FAILED = "check-failed"  # ran, but its output disagrees with the reference
SKIPPED = "skipped"


class Unsupported(Exception):
    """The implementation does not offer this workload; the message says why."""


@dataclass
class Prepared:
    """Ready-to-time calls, one per buffer set, and a way to read their outputs.

    `outputs(i)` returns the results of the last call on set i in storage
    shapes: (o,) for forward, (dq, dk, dv) for backward. `poison(i)` fills
    caller-owned outputs with NaN so unwritten elements show up in the check.
    `context()` is entered around every run of the calls (e.g. a backend
    selector), so its cost is not charged per call.
    """

    calls: list
    outputs: Callable[[int], tuple]
    poison: Callable[[int], None] = lambda i: None
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    bind_stream: Callable[[object], None] = lambda stream: None
    note: str = ""
    info: dict = field(default_factory=dict)


class Implementation:
    """Base of peers and frost engines."""

    key: str = ""  # short column id: cudnn, fa2, fa4, frost:<engine>
    label: str = ""  # human name for the report
    is_frost: bool = False

    def unavailable(self) -> str | None:
        """Why this implementation cannot run here at all (None when it can)."""
        return None

    def prepare(self, inputs) -> Prepared:  # pragma: no cover - interface
        raise NotImplementedError


def short_reason(exc: BaseException, limit: int = 200) -> str:
    """One line naming the exception, short enough for a table footnote."""
    msg = str(exc).strip().splitlines()
    first = next((line.strip() for line in msg if line.strip()), "")
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
