"""The measured data: one Row per workload with a Measurement per implementation.

Rows carry everything the writers need (table, JSON, Markdown, PNG), so the
writers can be tested on synthetic rows without a GPU. Ratios compare each
frost engine with the best peer that ran in the same row, and a deterministic
backward row with its non-deterministic twin.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from frost.bench.flops import tflops
from frost.bench.impl import CHECK_FAILED, OK
from frost.bench.workloads import Workload

SCHEMA = "frost-bench/1"


@dataclass
class Measurement:
    impl: str                      # cudnn | fa2 | fa4 | frost:<engine>
    status: str                    # ok | missing | n/a | failed | check-failed | skipped
    ms: float | None = None        # median per call (GPU time; probe rows: None)
    tflops: float | None = None
    host_us: float | None = None   # probe rows: wall-clock microseconds per call (GPU drained)
    issue_us: float | None = None  # probe rows: microseconds per call until the calls returned
    rel_err: float | None = None   # against the row's reference
    reason: str = ""               # why missing / n/a / failed / check-failed
    note: str = ""
    info: dict = field(default_factory=dict)

    @property
    def timed(self) -> bool:
        return self.status in (OK, CHECK_FAILED) and (self.ms is not None or self.host_us is not None)


@dataclass
class Row:
    workload: Workload
    measurements: dict = field(default_factory=dict)   # impl -> Measurement (insertion order kept)
    reference: str = ""                                 # impl (or "fp32-math") frost was checked against

    @property
    def flops(self) -> float:
        return self.workload.flops()

    def add(self, m: Measurement) -> Measurement:
        if m.ms is not None and m.tflops is None and not self.workload.probe:
            m.tflops = tflops(self.flops, m.ms)
        self.measurements[m.impl] = m
        return m

    def peers(self) -> list[Measurement]:
        return [m for k, m in self.measurements.items() if not k.startswith("frost:")]

    def frost(self) -> list[Measurement]:
        return [m for k, m in self.measurements.items() if k.startswith("frost:")]

    def best_peer(self) -> Measurement | None:
        """The fastest peer that ran (highest TFLOP/s; lowest host time on probe rows)."""
        ran = [m for m in self.peers() if m.status == OK]
        if self.workload.probe:
            ran = [m for m in ran if m.host_us is not None]
            return min(ran, key=lambda m: m.host_us) if ran else None
        ran = [m for m in ran if m.tflops is not None]
        return max(ran, key=lambda m: m.tflops) if ran else None

    def ratio(self, impl: str) -> float | None:
        """frost engine vs the best peer: TFLOP/s ratio (>1 is faster); probe rows: host-time ratio (<1 is faster)."""
        m, best = self.measurements.get(impl), self.best_peer()
        if m is None or best is None or not m.timed:
            return None
        if self.workload.probe:
            return m.host_us / best.host_us if m.host_us and best.host_us else None
        return m.tflops / best.tflops if m.tflops and best.tflops else None

    def to_dict(self) -> dict:
        best = self.best_peer()
        return {
            "label": self.workload.label,
            "workload": self.workload.to_dict(),
            "flops": self.flops,
            "reference": self.reference,
            "best_peer": best.impl if best else None,
            "ratios": {m.impl: self.ratio(m.impl) for m in self.frost()},
            "results": {k: asdict(m) for k, m in self.measurements.items()},
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Row":
        row = cls(Workload.from_dict(d["workload"]), reference=d.get("reference", ""))
        for k, m in d.get("results", {}).items():
            m = dict(m)
            for f in ("ms", "tflops", "host_us", "issue_us", "rel_err"):
                if isinstance(m.get(f), str):  # JSON spells non-finite floats as strings
                    m[f] = float(m[f])
            row.measurements[k] = Measurement(**m)
        return row


def impl_columns(rows: list[Row]) -> list[str]:
    """Every implementation seen, peers first (cudnn, fa2, fa4, others), then frost engines in first-seen order."""
    seen: list[str] = []
    for r in rows:
        for k in r.measurements:
            if k not in seen:
                seen.append(k)
    order = {"cudnn": 0, "fa2": 1, "fa4": 2}
    peers = sorted((k for k in seen if not k.startswith("frost:")), key=lambda k: (order.get(k, 9), k))
    return peers + [k for k in seen if k.startswith("frost:")]


def deterministic_pairs(rows: list[Row]) -> list[tuple[Row, Row]]:
    """(non-deterministic, deterministic) rows of one backward workload, in the deterministic rows' order."""
    plain = {r.workload: r for r in rows if not r.workload.deterministic}
    pairs = []
    for r in rows:
        base = plain.get(replace(r.workload, deterministic=False)) if r.workload.deterministic else None
        if base is not None:
            pairs.append((base, r))
    return pairs


def deterministic_ratios(base: Row, det: Row) -> dict:
    """Deterministic / non-deterministic time per implementation timed in both rows (>1 is slower)."""
    out = {}
    for k, m in det.measurements.items():
        b = base.measurements.get(k)
        if b is not None and m.timed and b.timed and m.ms and b.ms:
            out[k] = m.ms / b.ms
    return out


def report_dict(rows: list[Row], env: dict, settings: dict) -> dict:
    return {
        "schema": SCHEMA,
        "env": env,
        "settings": settings,
        "rows": [r.to_dict() for r in rows if not r.workload.probe],
        "probe": [r.to_dict() for r in rows if r.workload.probe],
        "deterministic_ratios": [{"label": base.workload.label, "ratios": deterministic_ratios(base, det)}
                                 for base, det in deterministic_pairs(rows)],
    }


def rows_from_dict(d: dict) -> list[Row]:
    return [Row.from_dict(x) for x in list(d.get("rows", [])) + list(d.get("probe", []))]
