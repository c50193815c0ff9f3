"""The measuring loop: for each workload, run the peers, pick the check reference,
then check and time every frost engine that accepts the graph.

Each implementation is isolated: a missing library, an unsupported workload or
an exception becomes a status with a reason on that cell, never a crash. A
CUDA error that poisons the context stops the run (later rows are marked) since
nothing after it could be trusted.
"""

from __future__ import annotations

import fnmatch
import re
import sys
import time
import warnings
from dataclasses import dataclass, field

from frost.bench import check as checks
from frost.bench.impl import CHECK_FAILED, FAILED, MISSING, NA, OK, SKIPPED, Implementation, Unsupported, short_reason
from frost.bench.flops import tflops
from frost.bench.results import Measurement, Row
from frost.bench.spread import MIN_SAMPLES, Spread, compare_ms, interleave, matmul_ceiling
from frost.bench.timing import TimingOptions, _event_ms, host_time_us, is_cuda, sync, time_calls

FROST_ALL = "frost:*"  # column used when frost as a whole is missing or declines the graph
REFERENCE_ORDER = ("cudnn", "fa4", "fa2")


@dataclass
class RunOptions:
    impls: list = field(default_factory=lambda: ["cudnn", "fa2", "fa4", "frost"])
    frost_engines: list = field(default_factory=list)  # fnmatch patterns; empty = every engine
    exclude_engines: list = field(default_factory=list)  # fnmatch patterns
    timing: TimingOptions = field(default_factory=TimingOptions)
    check: bool = True
    tol: dict = field(default_factory=lambda: dict(checks.DEFAULT_TOL))
    max_buffers: int = 8
    l2_multiple: float = 2.0
    probe_calls: int = 500
    seed: int = 0
    time_budget_s: float | None = None
    device: str = "cuda"  # "cpu" only to self-test the harness (wall-clock timing)
    interleave: int = 0  # >= 1: re-time every timed cell of a row in this many interleaved rounds (spread.py)
    ceiling_n: int = 0  # > 0: measure the bf16 matmul ceiling (n x n GEMM) once at the start of the run


class Progress:
    """A one-line progress indicator on stderr (a line per row when stderr is not a terminal)."""

    def __init__(self, total: int, enabled: bool = True, stream=None):
        self.total, self.enabled = total, enabled
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.i, self.label, self.t0 = 0, "", time.perf_counter()

    def row(self, label: str):
        self.i += 1
        self.label = label
        if self.enabled and not self.tty:
            self._write(f"[{self.i}/{self.total}] {label}\n")
        self.step("")

    def step(self, what: str):
        if self.enabled and self.tty:
            line = f"[{self.i}/{self.total} {time.perf_counter() - self.t0:5.0f}s] {self.label}"
            line += f" . {what}" if what else ""
            self._write("\r\033[K" + line[:160])

    def done(self):
        if self.enabled and self.tty:
            self._write("\r\033[K")

    def _write(self, s: str):
        self.stream.write(s)
        self.stream.flush()


def engine_selected(name: str, include: list, exclude: list) -> bool:
    """Glob patterns match the full engine name or its short column name ('sm90')."""
    from frost.bench.frost_runner import engine_short

    names = (name, engine_short(name))

    def hit(patterns):
        return any(fnmatch.fnmatch(n, p) or fnmatch.fnmatch(n.lower(), p.lower()) for p in patterns for n in names)

    if include and not hit(include):
        return False
    return not hit(exclude)


def warning_hints(caught) -> list[str]:
    """Distinct, informative warning texts (torch's 'kernel not used because:' headers dropped)."""
    hints: list[str] = []
    for wmsg in caught or ():
        text = " ".join(str(getattr(wmsg, "message", wmsg)).split())
        text = re.sub(r"\s*\(Triggered internally at [^)]*\)\.?", "", text).strip()
        if text and not text.endswith("because:") and text not in hints:
            hints.append(text)
    return hints


def _context_alive(device) -> str | None:
    """None when the CUDA context still works; otherwise the error that broke it."""
    try:
        sync(device)
        return None
    except Exception as e:
        return short_reason(e)


class Runner:
    def __init__(self, opts: RunOptions, peers: list[Implementation], progress: Progress | None = None, on_row=None):
        self.opts, self.peers = opts, peers
        self.progress = progress or Progress(0, enabled=False)
        self.on_row = on_row
        self.broken: str | None = None
        # per row: the lone peer that is the check reference, the float32 math asked for a second opinion, and
        # (peer, rel err) when that math sided with frost against the peer
        self._sole_peer, self._math, self.disputed = None, None, None
        self._live: dict = {}  # interleaving: impl key -> (prepared implementation, calls per sample)
        self.ceiling: dict | None = None
        self.t0 = time.perf_counter()

    # ---- one implementation ---------------------------------------------------
    def _measure(self, impl: Implementation, inputs, row: Row, ref) -> tuple[Measurement, tuple | None]:
        w, dev = inputs.workload, self.opts.device
        self.progress.step(impl.key)
        reason = impl.unavailable()
        if reason:
            return Measurement(impl.key, MISSING, reason=reason), None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            try:
                prep = impl.prepare(inputs)
            except Unsupported as e:
                return Measurement(impl.key, NA, reason=str(e)), None
            except Exception as e:
                return self._failed(impl.key, e, "prepare", caught), None
            m = Measurement(impl.key, OK, info=dict(prep.info), note=prep.note)
            m.info["prepare_s"] = round(time.perf_counter() - t0, 4)
            outs = None
            try:
                with prep.context():
                    t0 = time.perf_counter()
                    prep.poison(0)
                    prep.calls[0]()
                    sync(dev)
                    m.info["first_call_s"] = round(time.perf_counter() - t0, 4)
                    outs = tuple(prep.outputs(0))
                    if impl.is_frost and self.opts.check and not w.probe:
                        self._check(m, outs, ref, w, inputs)
                    elif ref is not None and ref[1] is not None:
                        m.rel_err = checks.compare(outs, ref[1])
                    if w.probe:
                        m.host_us, m.issue_us = host_time_us(prep.calls[0], self.opts.probe_calls, device=dev)
                    else:
                        t = time_calls(prep.calls, self.opts.timing, prep.bind_stream, device=dev)
                        m.ms = t.median_ms
                        m.info.update(
                            {
                                "min_ms": t.min_ms,
                                "inner": t.inner,
                                "reps": len(t.samples_ms),
                                "timing": t.mode,
                                "buffer_sets": len(prep.calls),
                            }
                        )
                        if t.note:
                            m.add_note(t.note)
                        if self.opts.interleave and t.mode == "loop":
                            self._live[impl.key] = (prep, t.inner)  # kept for the interleaved rounds
            except Exception as e:
                return self._failed(impl.key, e, "run", caught), None
            finally:
                del prep
        return m, outs

    def _failed(self, key: str, e: Exception, stage: str, caught=()) -> Measurement:
        """A failed cell; warnings the library raised on the way often say why, so they join the reason."""
        hints = warning_hints(caught)
        why = short_reason(e)
        if hints:
            why += " (" + "; ".join(h[:160] for h in hints[-2:]) + ")"
        m = Measurement(key, FAILED, reason=f"{stage}: {why}")
        broken = _context_alive(self.opts.device)
        if broken:
            self.broken = broken
        return m

    def _tol(self, w) -> float:
        """The relative-error tolerance of a workload's direction."""
        return self.opts.tol.get(w.direction, 1e-2)

    def _check(self, m: Measurement, outs: tuple, ref, w, inputs=None) -> None:
        if ref is None:
            m.note = "unchecked (no reference)"
            return
        bad = checks.unwritten(outs)
        m.rel_err = checks.compare(outs, ref[1])
        tol = self._tol(w)
        if bad:
            m.status, m.reason = CHECK_FAILED, f"{bad} output elements not written (NaN after poisoning)"
        elif not (m.rel_err <= tol):
            if self._sole_peer == ref[0] and inputs is not None and self._second_opinion(m, outs, ref, inputs, tol):
                return
            m.status, m.reason = CHECK_FAILED, f"rel err {m.rel_err:.2e} > tol {tol:.0e} vs {ref[0]}"

    def _second_opinion(self, m: Measurement, outs: tuple, ref, inputs, tol: float) -> bool:
        """frost disagrees with the row's only peer: ask the float32 math (once per row). True when frost agrees
        with it and the peer does not; frost is then checked against the math, and the peer's disagreement is
        noted on both (`disputed`)."""
        if self._math is None:
            self.progress.step("fp32 reference (second opinion)")
            try:
                self._math = self._math_reference(inputs)
            except Exception as e:
                m.add_note(f"no second opinion: {short_reason(e, 120)}")
                return False
        err = checks.compare(outs, self._math[1])
        peer_err = checks.compare(ref[1], self._math[1])
        if not (err <= tol) or peer_err <= tol:
            return False
        m.add_note(
            f"checked against fp32-math: {ref[0]}, the only peer, disagrees with it (rel err {peer_err:.1e}) "
            f"and with frost ({m.rel_err:.1e})"
        )
        m.rel_err = err
        self.disputed = (ref[0], peer_err)
        return True

    # ---- the reference --------------------------------------------------------
    def _math_reference(self, inputs):
        from frost.bench.reference import reference_backward, reference_forward

        w, b = inputs.workload, inputs.sets[0]
        if w.direction == "fwd":
            return ("fp32-math", (reference_forward(w, b.q, b.k, b.v, table=b.table)[0],))
        return ("fp32-math", reference_backward(w, b.q, b.k, b.v, b.do))

    # ---- one workload ---------------------------------------------------------
    def run_workload(self, w) -> Row:
        import torch

        from frost.bench.inputs import buffer_count, make_inputs

        row = Row(w)
        self.progress.row(w.label)
        selected_peers = [p for p in self.peers if p.key in self.opts.impls]
        want_frost = "frost" in self.opts.impls
        keys = [p.key for p in selected_peers] + ([FROST_ALL] if want_frost else [])
        if self.broken:
            for k in keys:
                row.add(Measurement(k, SKIPPED, reason=f"CUDA context broken earlier: {self.broken}"))
            return row
        if self.opts.time_budget_s is not None and time.perf_counter() - self.t0 > self.opts.time_budget_s:
            for k in keys:
                row.add(Measurement(k, SKIPPED, reason=f"time budget of {self.opts.time_budget_s:.0f} s spent"))
            return row

        dev = self.opts.device
        try:
            l2 = 0
            if is_cuda(dev):
                props = torch.cuda.get_device_properties(torch.cuda.current_device())
                l2 = int(getattr(props, "L2_cache_size", 0) or 0)
            n_sets = 1 if w.probe else buffer_count(w.set_bytes(), l2, self.opts.max_buffers, self.opts.l2_multiple)
            inputs = make_inputs(w, n_sets, dev, self.opts.seed)
        except Exception as e:
            for k in keys:
                row.add(Measurement(k, FAILED, reason=f"inputs: {short_reason(e)}"))
            self.broken = self.broken or _context_alive(dev)
            return row

        peer_outs: dict = {}
        for p in selected_peers:
            m, outs = self._measure(p, inputs, row, None)
            row.add(m)
            if m.status == OK and outs is not None:
                peer_outs[p.key] = outs
            if self.broken:
                break

        key, outs, notes = checks.choose_reference(peer_outs, REFERENCE_ORDER, self._tol(w))
        # a lone peer is the reference unconfirmed: where frost disagrees with it, the float32 math decides
        self._sole_peer = key if key is not None and len(peer_outs) == 1 else None
        for k, note in notes.items():
            row.measurements[k].note = note
        ref = (key, outs) if key is not None else None  # None: frost is checked against the float32 math
        for k, outs in peer_outs.items():
            if ref is not None:
                row.measurements[k].rel_err = checks.compare(outs, ref[1])
        peer_outs.clear()

        if want_frost and not self.broken:
            self._run_frost(row, inputs, ref)
        if self._live and not self.broken:
            try:
                self._interleave_row(row)
            except Exception as e:
                for k in self._live:
                    row.measurements[k].add_note(f"interleaved timing failed: {short_reason(e)}")
                self.broken = self.broken or _context_alive(dev)
        self._live.clear()
        row.reference = ref[0] if ref else row.reference
        if self.disputed:
            peer, err = self.disputed
            row.measurements[peer].add_note(f"disagrees with the fp32 math (rel err {err:.1e})")
            row.reference = f"fp32-math ({peer} disputed)"
        self._math, self.disputed = None, None  # per row (and the math's tensors freed)
        del inputs, ref
        if is_cuda(dev):
            torch.cuda.empty_cache()
        return row

    def _run_frost(self, row: Row, inputs, ref) -> None:
        from frost.bench import frost_runner

        w = inputs.workload
        self.progress.step("frost engines")
        reason = frost_runner.frost_unavailable()
        if reason:
            row.add(Measurement(FROST_ALL, MISSING, reason=reason))
            return
        try:
            names = frost_runner.list_engines(w)
        except Unsupported as e:
            row.add(Measurement(FROST_ALL, NA, reason=str(e)))
            return
        except Exception as e:
            row.add(self._failed(FROST_ALL, e, "listing engines"))
            return
        chosen = [n for n in names if engine_selected(n, self.opts.frost_engines, self.opts.exclude_engines)]
        if not chosen:
            row.add(Measurement(FROST_ALL, SKIPPED, reason=f"engines {names} filtered out"))
            return
        if ref is None and self.opts.check and not w.probe:
            self.progress.step("fp32 reference")
            try:
                ref = self._math_reference(inputs)
            except Exception as e:
                row.reference = f"none (fp32 reference failed: {short_reason(e)})"
        if ref is not None:
            row.reference = ref[0]
        for name in chosen:
            m, _ = self._measure(frost_runner.FrostEngine(name), inputs, row, ref)
            row.add(m)
            if self.broken:
                break

    def _sampler(self, prep, inner: int):
        """One sample of `prep`'s calls: milliseconds per call over `inner` calls, rotating its buffer sets."""
        dev, calls, state = self.opts.device, prep.calls, {"i": 0}

        def loop():
            i = state["i"]
            for _ in range(inner):
                calls[i % len(calls)]()
                i += 1
            state["i"] = i

        def sample():
            with prep.context():
                return _event_ms(loop, dev) / inner

        return sample

    def _interleave_row(self, row: Row) -> None:
        """Re-time the row's timed cells in interleaved rounds (engine order rotated each round); each keeps its
        median, min and max (`spread_ms`), each frost engine its ratio and verdict against each peer (`vs`), and
        every cell its fraction of the run's matmul ceiling (`of_ceiling`)."""
        self.progress.step("interleaved rounds")
        rounds = max(MIN_SAMPLES, self.opts.interleave)
        samples = interleave({k: self._sampler(p, inner) for k, (p, inner) in self._live.items()}, rounds)
        spreads = {}
        for k, xs in samples.items():
            m, sp = row.measurements[k], Spread.of(xs)
            spreads[k] = sp
            m.ms, m.tflops = sp.median, tflops(row.flops, sp.median)
            m.info.update({"spread_ms": [sp.median, sp.lo, sp.hi], "samples_ms": xs, "interleaved": rounds})
            if self.ceiling and m.tflops:
                m.info["of_ceiling"] = m.tflops / self.ceiling["tflops"]
        for k, sp in spreads.items():
            if not k.startswith("frost:"):
                continue
            row.measurements[k].info["vs"] = {
                p: compare_ms(sp, psp) for p, psp in spreads.items() if not p.startswith("frost:")
            }

    def run(self, workloads) -> list:
        rows = []
        if self.opts.ceiling_n:
            self.progress.step("bf16 matmul ceiling")
            self.ceiling = matmul_ceiling(
                self.opts.ceiling_n, max(MIN_SAMPLES, self.opts.interleave), device=self.opts.device
            )
        for w in workloads:
            row = self.run_workload(w)
            rows.append(row)
            if self.on_row:
                self.on_row(rows)
        self.progress.done()
        return rows
