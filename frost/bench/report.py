"""Turning rows into a table (terminal text or Markdown) and the JSON / Markdown files.

One table row per workload: TFLOP/s per implementation, the best peer, then for
each frost engine its ratio to the best peer and its relative error against the
reference. Where frost's cuDNN engine and cuDNN through torch both ran, a
`cudnn/cuDNN` column gives their ratio (the same library behind two front ends)
and a summary block says how many rows are within 3%. Cells that did not run say
why through numbered footnotes. Rows measured with and without a deterministic
backward get one line per pair with each implementation's deterministic /
non-deterministic time ratio.
"""

from __future__ import annotations

import json
import math
import os

from frost.bench.impl import CHECK_FAILED, FAILED, MISSING, NA, OK, SKIPPED
from frost.bench.results import (
    CUDNN_ENGINE,
    CUDNN_PEER,
    Row,
    cudnn_engine_summary,
    deterministic_pairs,
    deterministic_ratios,
    impl_columns,
    paged_pairs,
    paged_vs_contiguous,
    report_dict,
)

_STATUS_TAG = {MISSING: "miss", NA: "n/a", FAILED: "FAIL", SKIPPED: "skip"}
PEER_NAMES = {"cudnn": "cuDNN", "fa2": "FA2", "fa4": "FA4"}


def impl_name(key: str) -> str:
    if key == "frost:*":
        return "frost"
    return PEER_NAMES.get(key, key)


def fmt_tflops(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    if x >= 100:
        return f"{x:.0f}"
    return f"{x:.1f}" if x >= 1 else f"{x:.2g}"


def fmt_ratio(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.2f}x"


def fmt_err(x: float | None) -> str:
    if x is None:
        return "-"
    return "inf" if not math.isfinite(x) else f"{x:.1e}"


class Footnotes:
    """Numbered, de-duplicated reasons for cells that did not produce a number."""

    def __init__(self):
        self.items: list[str] = []

    def ref(self, text: str) -> int:
        if text not in self.items:
            self.items.append(text)
        return self.items.index(text) + 1

    def lines(self) -> list[str]:
        return [f"[{i}] {t}" for i, t in enumerate(self.items, 1)]


def _cell(m, value: str, notes: Footnotes) -> str:
    if m is None:
        return "-"
    if m.status == OK:
        return value
    if m.status == CHECK_FAILED:
        return f"{value}!{notes.ref(f'{m.impl} check failed: {m.reason}')}" if m.reason else f"{value}!"
    tag = _STATUS_TAG.get(m.status, m.status)
    if not m.reason:
        return tag
    return f"{tag}[{notes.ref(f'{m.impl} {m.status}: {m.reason}')}]"


def _frost_engines(keys: list[str]) -> list[str]:
    """Frost engine columns that get ratio and error columns (not the 'frost:*' catch-all)."""
    return [k for k in keys if k.startswith("frost:") and k != "frost:*"]


VS_CUDNN = "cudnn/cuDNN"  # column: frost's cuDNN engine / cuDNN through torch


def _vs_cudnn(keys: list[str]) -> bool:
    """Whether the table gets the cudnn/cuDNN column: both frost's cuDNN engine and the cuDNN peer appear."""
    return CUDNN_ENGINE in keys and CUDNN_PEER in keys


def throughput_table(rows: list[Row], notes: Footnotes | None = None):
    """(headers, body) of the TFLOP/s table over non-probe rows."""
    notes = notes if notes is not None else Footnotes()
    rows = [r for r in rows if not r.workload.probe]
    keys = impl_columns(rows)
    frost_keys = _frost_engines(keys)
    vs_cudnn = _vs_cudnn(keys)
    headers = ["dir", "dtype", "D", "shape", "heads", "mask"] + [impl_name(k) for k in keys] + ["best"]
    headers += [f"{k.split(':', 1)[1]}/best" for k in frost_keys] + ([VS_CUDNN] if vs_cudnn else [])
    headers += [f"{k.split(':', 1)[1]} err" for k in frost_keys]
    body = []
    for r in rows:
        w = r.workload
        line = [
            w.direction_label,
            w.dtype,
            w.head_dim_label,
            w.shape_label,
            w.heads_label,
            "causal" if w.causal else "full",
        ]
        for k in keys:
            m = r.measurements.get(k)
            line.append(_cell(m, fmt_tflops(m.tflops) if m else "-", notes))
        best = r.best_peer()
        line.append(impl_name(best.impl) if best else "-")
        line += [fmt_ratio(r.ratio(k)) for k in frost_keys]
        line += [fmt_ratio(r.ratio_to(CUDNN_ENGINE, CUDNN_PEER))] if vs_cudnn else []
        line += [fmt_err(r.measurements[k].rel_err) if k in r.measurements else "-" for k in frost_keys]
        body.append(line)
    return headers, body


def _probe_text(m) -> str:
    if m is None or m.host_us is None:
        return "-"
    return f"{m.host_us:.1f}" + (f" ({m.issue_us:.1f})" if m.issue_us is not None else "")


def probe_table(rows: list[Row], notes: Footnotes | None = None):
    """(headers, body) of the host-time probe: microseconds per call, lower is better."""
    notes = notes if notes is not None else Footnotes()
    rows = [r for r in rows if r.workload.probe]
    keys = impl_columns(rows)
    frost_keys = _frost_engines(keys)
    vs_cudnn = _vs_cudnn(keys)
    headers = ["dir", "dtype", "shape"] + [f"{impl_name(k)} us" for k in keys] + ["best"]
    headers += [f"{k.split(':', 1)[1]}/best" for k in frost_keys] + ([VS_CUDNN] if vs_cudnn else [])
    body = []
    for r in rows:
        w = r.workload
        line = [w.direction, w.dtype, f"{w.batch}x{w.heads_q}x{w.seqlen_q}x{w.d_qk}"]
        for k in keys:
            m = r.measurements.get(k)
            line.append(_cell(m, _probe_text(m), notes))
        best = r.best_peer()
        line.append(impl_name(best.impl) if best else "-")
        line += [fmt_ratio(r.ratio(k)) for k in frost_keys]
        line += [fmt_ratio(r.ratio_to(CUDNN_ENGINE, CUDNN_PEER))] if vs_cudnn else []
        body.append(line)
    return headers, body


def cudnn_engine_lines(rows: list[Row]) -> list[str]:
    """frost's cuDNN engine against cuDNN through torch: one line per direction, then the probe's host times."""
    lines = []
    for e in cudnn_engine_summary(rows):
        spread = (
            f"{fmt_ratio(e['min'])} - {fmt_ratio(e['max'])} (median {fmt_ratio(e['median'])})"
            if e["rows"] > 1
            else fmt_ratio(e["min"])
        )
        if e["probe"]:
            lines.append(
                f"{e['direction']} host time per call: frost:cudnn {e['frost_us']:.1f} us, cuDNN (torch) "
                f"{e['cudnn_us']:.1f} us: {spread}"
            )
        else:
            lines.append(
                f"{e['direction']}: {spread} over {e['rows']} rows; {e['within']} of {e['rows']} within "
                f"{e['tolerance']:.0%} of cuDNN or faster"
            )
    return lines


def deterministic_lines(rows: list[Row]) -> list[str]:
    """One line per (non-deterministic, deterministic) pair: frost engines' time ratios, then peers'."""
    lines = []
    for base, det in deterministic_pairs(rows):
        ratios = deterministic_ratios(base, det)
        keys = sorted(ratios, key=lambda k: not k.startswith("frost:"))
        cells = ", ".join(f"{impl_name(k)} {fmt_ratio(ratios[k])}" for k in keys)
        lines.append(f"{base.workload.label}: {cells or 'not timed in both modes'}")
    return lines


PAGED_LEGEND = (
    "Paged against contiguous: each frost engine's speed on the paged row over its speed on the same row over a "
    "dense cache (< 1: reading through the table costs time) [range from the interleaved samples' extremes]; the "
    "two rows were timed one after the other in this process, not interleaved with each other."
)


def paged_lines(rows: list[Row]) -> list[str]:
    """One line per paged row whose contiguous twin was measured: each frost engine's paged / contiguous speed."""
    lines = []
    for paged, twin in paged_pairs(rows):
        cells = []
        for k, v in paged_vs_contiguous(paged, twin).items():
            text = f"{impl_name(k)} {v['ratio']:.3f}x"
            if "ratio_lo" in v:
                text += f" [{v['ratio_lo']:.3f}-{v['ratio_hi']:.3f}] {v['verdict']}"
            cells.append(text)
        lines.append(f"{paged.workload.label}: {', '.join(cells) or 'no frost engine timed in both rows'}")
    return lines


def _text_columns(headers: list[str]) -> int:
    """How many leading columns describe the configuration (left-aligned); the rest are numbers."""
    return 6 if len(headers) > 5 and headers[5] == "mask" else 3


def render_text(headers: list[str], body: list[list[str]]) -> str:
    n_text = _text_columns(headers)
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(headers)]

    def fmt(cells):
        return "  ".join(
            c.rjust(wd) if i >= n_text else c.ljust(wd) for i, (c, wd) in enumerate(zip(cells, widths))
        ).rstrip()

    out = [fmt(headers), "  ".join("-" * wd for wd in widths)]
    out += [fmt(b) for b in body]
    return "\n".join(out)


def render_markdown(headers: list[str], body: list[list[str]]) -> str:
    def esc(c):
        return c.replace("|", "\\|")

    n_text = _text_columns(headers)
    out = [
        "| " + " | ".join(esc(h) for h in headers) + " |",
        "|" + "|".join("---" if i < n_text else "---:" for i in range(len(headers))) + "|",
    ]
    out += ["| " + " | ".join(esc(c) for c in b) + " |" for b in body]
    return "\n".join(out)


#: how a row's time was taken, by the device the run measured (a CPU run is the harness's self-test: wall clock)
TIMED_BY = {
    "cuda": "median per-call time of CUDA-event-timed samples",
    "cpu": "median per-call wall-clock time on the CPU (a harness self-test, not a GPU measurement)",
}
LEGEND = (
    "TFLOP/s: {timed}; FLOPs 4*B*H*Sq*Skv*D "
    "(2*...*(Dqk+Dv) when they differ), halved when causal, summed per sequence for THD, bwd = 2.5x fwd. "
    "<engine>/best = frost TFLOP/s / best peer's; err = ||frost - ref|| / ||ref|| against the row's "
    "reference; '!' marks a failed check."
)
DET_LEGEND = (
    "Deterministic backward: time with use_deterministic_algorithm=True (FA4: deterministic=True) / "
    "time without, same workload and implementation (1.00x = no cost)."
)
CUDNN_LEGEND = (
    "frost's cuDNN engine (frost:cudnn) / cuDNN through torch SDPA's CUDNN_ATTENTION backend, the same "
    "library behind two front ends: TFLOP/s ratio per row (>1: frost's is faster); on probe rows the "
    "host-time ratio (<1: frost's execute costs less host time than torch's call)."
)
PROBE_LEGEND = (
    "Host time per call on a tiny problem, wall clock over many back-to-back calls until the GPU drained "
    "(in parentheses: until the last call returned, before the final sync, i.e. host time without "
    "the tiny kernels' own GPU time); lower is better."
)


def legend(device: str = "cuda") -> str:
    return LEGEND.format(timed=TIMED_BY.get(device, TIMED_BY["cpu"]))


SPREAD_LEGEND = (
    "Interleaved timing: median [min-max] ms over the rounds (engine order rotated each round); each "
    "frost engine against each peer as a speed ratio (> 1: frost faster) [its range from the extremes]; "
    "win / loss only when the time ranges do not overlap, else tie; % of ceiling: TFLOP/s over the "
    "run's bf16 matmul."
)


def spread_lines(rows: list[Row]) -> list[str]:
    """One line per interleaved cell: its spread, its fraction of the ceiling, and (frost) its verdicts."""
    out = []
    for row in rows:
        for k, m in row.measurements.items():
            sp = m.info.get("spread_ms")
            if not sp:
                continue
            text = f"{row.workload.label} {impl_name(k)}: {sp[0]:.4g} ms [{sp[1]:.4g}-{sp[2]:.4g}]"
            if "of_ceiling" in m.info:
                text += f", {100 * m.info['of_ceiling']:.0f}% of ceiling"
            for peer, v in m.info.get("vs", {}).items():
                text += (
                    f"; vs {impl_name(peer)} {v['ratio']:.2f}x [{v['ratio_lo']:.2f}-{v['ratio_hi']:.2f}] {v['verdict']}"
                )
            out.append(text)
    return out


def ceiling_line(ceiling: dict | None) -> str:
    if not ceiling:
        return ""
    return (
        f"bf16 matmul ceiling ({ceiling['n']}^3 GEMM, torch.matmul): {ceiling['tflops']:.0f} TFLOP/s "
        f"[{ceiling['tflops_lo']:.0f}-{ceiling['tflops_hi']:.0f}]"
    )


def render_report(rows: list[Row], markdown: bool = False, device: str = "cuda", ceiling: dict | None = None) -> str:
    """The whole terminal (or Markdown) report: throughput table, probe table, footnotes. `device` is what the
    run timed on ("cuda" or "cpu"): the legend says how the times were taken."""
    notes = Footnotes()
    render = render_markdown if markdown else render_text
    parts = []
    h, b = throughput_table(rows, notes)
    if b:
        parts += [legend(device), "", render(h, b)]
    det = deterministic_lines(rows)
    if det:
        parts += ["", DET_LEGEND, ""] + ([f"- {line}" for line in det] if markdown else det)
    same = cudnn_engine_lines(rows)
    if same:
        parts += ["", CUDNN_LEGEND, ""] + ([f"- {line}" for line in same] if markdown else same)
    paged = paged_lines(rows)
    if paged:
        parts += ["", PAGED_LEGEND, ""] + ([f"- {line}" for line in paged] if markdown else paged)
    spread = spread_lines(rows)
    if spread or ceiling:
        head = [SPREAD_LEGEND] + ([ceiling_line(ceiling)] if ceiling else [])
        parts += [""] + head + [""] + ([f"- {line}" for line in spread] if markdown else spread)
    h, b = probe_table(rows, notes)
    if b:
        parts += ["", PROBE_LEGEND, "", render(h, b)]
    if notes.items:
        parts += [""] + ([f"- {line}" for line in notes.lines()] if markdown else notes.lines())
    return "\n".join(parts)


ENV_KEYS = [
    ("gpu", "GPU"),
    ("driver", "driver"),
    ("cuda", "CUDA (torch)"),
    ("torch", "torch"),
    ("cudnn", "cuDNN"),
    ("cutlass_dsl", "nvidia-cutlass-dsl"),
    ("tvm_ffi", "apache-tvm-ffi"),
    ("flash_attn_4", "flash-attn-4"),
    ("frost_commit", "frost commit"),
    ("python", "python"),
    ("date", "date (UTC)"),
    ("command", "command"),
]


def render_markdown_file(rows: list[Row], env: dict, settings: dict, title: str = "frost benchmark") -> str:
    lines = [f"# {title}", ""]
    for key, name in ENV_KEYS:
        if key in env and env[key] not in (None, ""):
            lines.append(f"- {name}: `{env[key]}`")
    timing = settings.get("timing", {})
    if timing:
        lines.append("- timing: " + ", ".join(f"{k}={v}" for k, v in timing.items()))
    lines += [
        "",
        render_report(rows, markdown=True, device=settings.get("device", "cuda"), ceiling=settings.get("ceiling")),
        "",
    ]
    return "\n".join(lines)


def _atomic_write(path: str, data: str | bytes) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    os.replace(tmp, path)


def _json_safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def write_json(path: str, rows: list[Row], env: dict, settings: dict) -> str:
    doc = _json_safe(report_dict(rows, env, settings))
    _atomic_write(path, json.dumps(doc, indent=1, sort_keys=False) + "\n")
    return path


def write_markdown(path: str, rows: list[Row], env: dict, settings: dict, title: str = "frost benchmark") -> str:
    _atomic_write(path, render_markdown_file(rows, env, settings, title))
    return path
