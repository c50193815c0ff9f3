"""The PNG chart: TFLOP/s per configuration and implementation, as small multiples.

One panel per (direction, deterministic or not, dtype, head dim, GQA) group; inside a panel, grouped
bars per sequence configuration (dense length or THD mix, full / causal), one
bar per implementation, frost bars labelled with their ratio to the best peer.
matplotlib is optional (`pip install frost[bench]`): without it the chart is
skipped with a message, never an error.
"""

from __future__ import annotations

import math
import os

from frost.bench.results import Row, impl_columns

COLORS = {"cudnn": "#76b900", "fa2": "#9e9e9e", "fa4": "#1f77b4"}
FROST_COLORS = ["#d62728", "#ff7f0e", "#9467bd", "#e377c2", "#8c564b"]
DIRECTION_ORDER = {"fwd": 0, "bwd": 1}


def matplotlib_missing() -> str | None:
    try:
        import matplotlib  # noqa: F401
    except Exception as e:
        return f"matplotlib not available ({type(e).__name__}); install frost[bench] for the PNG chart"
    return None


def panel_key(w) -> tuple:
    return (DIRECTION_ORDER.get(w.direction, 9), w.direction_label, w.dtype, w.d_qk, w.d_v, w.gqa_ratio)


def panel_title(key: tuple) -> str:
    _, direction, dtype, dq, dv, g = key
    d = f"d{dq}" if dq == dv else f"d{dq}x{dv}"
    return f"{direction} {dtype} {d}" + (f" gqa {g}" if g > 1 else "")


def tick_label(w) -> str:
    shape = (
        f"thd {w.mix.split('(')[0]}"
        if w.is_thd
        else (f"{w.seqlen_q // 1024}k" if w.seqlen_q % 1024 == 0 else str(w.seqlen_q))
    )
    return shape + (" c" if w.causal else "")


def _colors(keys: list[str]) -> dict:
    out, i = {}, 0
    for k in keys:
        if k in COLORS:
            out[k] = COLORS[k]
        else:
            out[k] = FROST_COLORS[i % len(FROST_COLORS)]
            i += 1
    return out


def provenance(env: dict | None) -> str:
    """The line a chart carries so that it is never read without its source: GPU, date, frost commit."""
    env = env or {}
    return (
        f"GPU: {env.get('gpu') or 'unknown'}  |  date: {env.get('date') or 'unknown'}  |  "
        f"frost commit: {env.get('frost_commit') or 'unknown'}"
    )


def write_png(path: str, rows: list[Row], title: str = "frost benchmark", env: dict | None = None) -> str | None:
    """Write the chart (`provenance(env)` below it and in its PNG text); returns the path, or None when matplotlib is
    missing or there is nothing to plot."""
    if matplotlib_missing():
        return None
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    rows = [r for r in rows if not r.workload.probe]
    if not rows:
        return None
    keys = [k for k in impl_columns(rows) if k != "frost:*"]
    colors = _colors(keys)
    panels: dict = {}
    for r in rows:
        panels.setdefault(panel_key(r.workload), []).append(r)
    order = sorted(panels)
    ncols = min(3, len(order))
    nrows = math.ceil(len(order) / ncols)
    most = max(len(v) for v in panels.values())
    pw = max(4.5, 0.28 * most * max(1, len(keys)) + 1.0)
    fig, axes = plt.subplots(nrows, ncols, figsize=(pw * ncols, 3.6 * nrows + 0.8), squeeze=False)
    bar = 0.8 / max(1, len(keys))
    for ax in axes.flat[len(order) :]:
        ax.set_visible(False)
    for ax, key in zip(axes.flat, order):
        group = sorted(
            panels[key], key=lambda r: (r.workload.causal, r.workload.is_thd, r.workload.seqlen_q, r.workload.mix)
        )
        for j, k in enumerate(keys):
            for i, r in enumerate(group):
                m = r.measurements.get(k)
                if m is None or not m.timed or m.tflops is None:
                    continue
                x = i - 0.4 + bar * (j + 0.5)
                ax.bar(x, m.tflops, width=bar, color=colors[k], hatch="//" if m.status != "ok" else None)
                ratio = r.ratio(k) if k.startswith("frost:") else None
                if ratio is not None:
                    ax.text(x, m.tflops, f"{ratio:.2f}x", ha="center", va="bottom", fontsize=6, rotation=90)
        ax.set_xticks(range(len(group)))
        ax.set_xticklabels([tick_label(r.workload) for r in group], rotation=45, ha="right", fontsize=7)
        ax.set_title(panel_title(key), fontsize=9)
        ax.set_ylabel("TFLOP/s", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(axis="y", alpha=0.3)
        ax.margins(y=0.15)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[k]) for k in keys]
    fig.legend(handles, keys, loc="upper center", ncol=min(8, len(keys)), fontsize=8, frameon=False)
    fig.suptitle(title, y=0.995, fontsize=10, x=0.01, ha="left")
    height = 3.6 * nrows + 0.8
    fig.text(0.01, 0.005, provenance(env), fontsize=8, ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.3 / height, 1, 1 - 0.5 / height))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Title": title, "Description": provenance(env)})
    plt.close(fig)
    return path
