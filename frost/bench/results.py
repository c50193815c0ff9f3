"""The measured data: one Row per workload with a Measurement per implementation.

Rows carry everything the writers need (table, JSON, Markdown, PNG), so the
writers can be tested on synthetic rows without a GPU. Ratios compare each
frost engine with the best peer that ran in the same row, each frost engine with
cuDNN through torch (the same library under frost's cuDNN engine), a
deterministic backward row with its non-deterministic twin, and a paged row with
its contiguous twin.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from frost.bench.flops import tflops
from frost.bench.impl import CHECK_FAILED, OK
from frost.bench.spread import Spread, compare_ms
from frost.bench.workloads import Workload

SCHEMA = "frost-bench/1"
CUDNN_PEER = "cudnn"  # cuDNN through torch SDPA (its CUDNN_ATTENTION backend)
CUDNN_ENGINE = "frost:cudnn"  # frost's cuDNN engine: the same library through frost's graph API


@dataclass
class Measurement:
    impl: str  # cudnn | fa2 | fa4 | frost:<engine>
    status: str  # ok | missing | n/a | failed | check-failed | skipped
    ms: float | None = None  # median per call (GPU time; probe rows: None)
    tflops: float | None = None
    host_us: float | None = None  # probe rows: wall-clock microseconds per call (GPU drained)
    issue_us: float | None = None  # probe rows: microseconds per call until the calls returned
    rel_err: float | None = None  # against the row's reference
    reason: str = ""  # why missing / n/a / failed / check-failed
    note: str = ""
    info: dict = field(default_factory=dict)

    @property
    def timed(self) -> bool:
        return self.status in (OK, CHECK_FAILED) and (self.ms is not None or self.host_us is not None)

    def add_note(self, text: str) -> None:
        """Append `text` to the note ("; " between notes)."""
        self.note = f"{self.note}; {text}" if self.note else text


@dataclass
class Row:
    workload: Workload
    measurements: dict = field(default_factory=dict)  # impl -> Measurement (insertion order kept)
    reference: str = ""  # impl (or "fp32-math") frost was checked against

    @property
    def flops(self) -> float:
        return self.workload.flops()

    def add(self, m: Measurement) -> Measurement:
        if m.ms is not None and m.tflops is None and not self.workload.probe:
            m.tflops = tflops(self.flops, m.ms)
        if m.ms and (self.workload.is_paged or self.workload.is_decode):  # K/V bytes read per second
            m.info["kv_tb_s"] = float(f"{self.workload.kv_bytes() / (m.ms * 1e-3) / 1e12:.4g}")
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
        return self.ratio_to(impl, self.best_peer())

    def ratio_to(self, impl: str, peer) -> float | None:
        """`impl` vs one peer (a Measurement or its key), in `ratio`'s terms; None unless both were timed."""
        m = self.measurements.get(impl)
        if isinstance(peer, str):
            peer = self.measurements.get(peer)
            if peer is not None and peer.status != OK:
                peer = None
        if m is None or peer is None or not m.timed:
            return None
        if self.workload.probe:
            return m.host_us / peer.host_us if m.host_us and peer.host_us else None
        return m.tflops / peer.tflops if m.tflops and peer.tflops else None

    def to_dict(self) -> dict:
        best = self.best_peer()
        return {
            "label": self.workload.label,
            "workload": self.workload.to_dict(),
            "flops": self.flops,
            "reference": self.reference,
            "best_peer": best.impl if best else None,
            "ratios": {m.impl: self.ratio(m.impl) for m in self.frost()},
            "vs_cudnn": {m.impl: self.ratio_to(m.impl, CUDNN_PEER) for m in self.frost()},
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


def _twins(rows: list[Row], picks, twin_of) -> list[tuple[Row, Row]]:
    """(row, its twin) for every row `picks` selects whose twin workload (`twin_of`) was measured, in row order."""
    by_workload = {r.workload: r for r in rows}
    return [(r, by_workload[t]) for r in rows if picks(r.workload) and (t := twin_of(r.workload)) in by_workload]


def deterministic_pairs(rows: list[Row]) -> list[tuple[Row, Row]]:
    """(non-deterministic, deterministic) rows of one backward workload, in the deterministic rows' order."""
    pairs = _twins(rows, lambda w: w.deterministic, lambda w: replace(w, deterministic=False))
    return [(base, det) for det, base in pairs]


def deterministic_ratios(base: Row, det: Row) -> dict:
    """Deterministic / non-deterministic time per implementation timed in both rows (>1 is slower)."""
    out = {}
    for k, m in det.measurements.items():
        b = base.measurements.get(k)
        if b is not None and m.timed and b.timed and m.ms and b.ms:
            out[k] = m.ms / b.ms
    return out


def paged_pairs(rows: list[Row]) -> list[tuple[Row, Row]]:
    """(paged row, its contiguous twin) for every paged row whose twin was measured, in the paged rows' order."""
    return _twins(rows, lambda w: w.is_paged, lambda w: w.contiguous_twin())


def paged_vs_contiguous(paged: Row, twin: Row) -> dict:
    """Each frost engine timed in both rows: the paged call's speed over the contiguous one's (< 1: the table
    costs time), with the range from the interleaved samples' extremes and a verdict where both rows have them."""
    out = {}
    for k, m in paged.measurements.items():
        c = twin.measurements.get(k)
        if not k.startswith("frost:") or c is None or not (m.timed and c.timed and m.ms and c.ms):
            continue
        ms, cs = m.info.get("samples_ms"), c.info.get("samples_ms")
        if ms and cs:
            out[k] = compare_ms(Spread.of(ms), Spread.of(cs))
        else:
            out[k] = {"ratio": c.ms / m.ms}
    return out


def cudnn_engine_summary(rows: list[Row], tolerance: float = 0.03) -> list[dict]:
    """frost's cuDNN engine against cuDNN through torch, per direction (probe rows apart): the rows where both
    were timed, the TFLOP/s ratios' min / median / max and how many are within `tolerance` below 1 (or above);
    probe rows: the host-time ratio (<1: frost's execute costs less host time than torch's call)."""
    out = []
    for probe in (False, True):
        for direction in ("fwd", "bwd"):
            pairs = [
                (r, r.ratio_to(CUDNN_ENGINE, CUDNN_PEER))
                for r in rows
                if r.workload.probe == probe and r.workload.direction == direction and not r.workload.deterministic
            ]
            ratios = sorted(x for _, x in pairs if x is not None)
            if not ratios:
                continue
            entry = {
                "direction": direction,
                "probe": probe,
                "rows": len(ratios),
                "min": ratios[0],
                "median": ratios[len(ratios) // 2]
                if len(ratios) % 2
                else (ratios[len(ratios) // 2 - 1] + ratios[len(ratios) // 2]) / 2,
                "max": ratios[-1],
            }
            if probe:
                m = [(r.measurements[CUDNN_ENGINE], r.measurements[CUDNN_PEER]) for r, x in pairs if x is not None]
                entry.update(frost_us=m[0][0].host_us, cudnn_us=m[0][1].host_us)
            else:
                entry["within"] = sum(x >= 1 - tolerance for x in ratios)
                entry["tolerance"] = tolerance
            out.append(entry)
    return out


def report_dict(rows: list[Row], env: dict, settings: dict) -> dict:
    return {
        "schema": SCHEMA,
        "env": env,
        "settings": settings,
        "rows": [r.to_dict() for r in rows if not r.workload.probe],
        "probe": [r.to_dict() for r in rows if r.workload.probe],
        "deterministic_ratios": [
            {"label": base.workload.label, "ratios": deterministic_ratios(base, det)}
            for base, det in deterministic_pairs(rows)
        ],
        "cudnn_engine_vs_cudnn": cudnn_engine_summary(rows),
        "paged_vs_contiguous": [
            {"label": p.workload.label, "ratios": paged_vs_contiguous(p, c)} for p, c in paged_pairs(rows)
        ],
    }


def rows_from_dict(d: dict) -> list[Row]:
    return [Row.from_dict(x) for x in list(d.get("rows", [])) + list(d.get("probe", []))]
