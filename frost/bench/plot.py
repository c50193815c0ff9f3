"""The PNG chart: grouped bars of TFLOP/s per configuration and implementation.

matplotlib is optional (`pip install frost[bench]`); without it the chart is
skipped with a message, never an error.
"""
from __future__ import annotations

import os

from frost.bench.results import Row, impl_columns

COLORS = {"cudnn": "#76b900", "fa2": "#8c8c8c", "fa4": "#1f77b4"}
FROST_COLORS = ["#d62728", "#ff7f0e", "#9467bd", "#e377c2", "#8c564b"]


def matplotlib_missing() -> str | None:
    try:
        import matplotlib  # noqa: F401
    except Exception as e:
        return f"matplotlib not available ({type(e).__name__}); install frost[bench] for the PNG chart"
    return None


def _short(w) -> str:
    d = f"d{w.head_dim_label}"
    shape = f"thd-{w.mix.split('(')[0]}" if w.is_thd else f"s{w.seqlen_q}"
    gqa = f" g{w.gqa_ratio}" if w.heads_q != w.heads_kv else ""
    return f"{w.dtype} {d} {shape}{' c' if w.causal else ''}{gqa}"


def write_png(path: str, rows: list[Row], title: str = "frost benchmark") -> str | None:
    """Write the chart; returns the path, or None when matplotlib is missing or there is nothing to plot."""
    if matplotlib_missing():
        return None
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    rows = [r for r in rows if not r.workload.probe]
    if not rows:
        return None
    keys = impl_columns(rows)
    directions = [d for d in ("fwd", "bwd") if any(r.workload.direction == d for r in rows)]
    groups = {d: [r for r in rows if r.workload.direction == d] for d in directions}
    most = max(len(g) for g in groups.values())
    width = max(8.0, min(60.0, 0.35 * most * max(1, len(keys)) + 2.0))
    fig, axes = plt.subplots(len(directions), 1, figsize=(width, 4.2 * len(directions)), squeeze=False)
    frost_i = 0
    colors = {}
    for k in keys:
        if k in COLORS:
            colors[k] = COLORS[k]
        else:
            colors[k] = FROST_COLORS[frost_i % len(FROST_COLORS)]
            frost_i += 1
    bar = 0.8 / max(1, len(keys))
    for ax, d in zip(axes[:, 0], directions):
        g = groups[d]
        for j, k in enumerate(keys):
            xs, ys = [], []
            for i, r in enumerate(g):
                m = r.measurements.get(k)
                if m is not None and m.timed and m.tflops is not None:
                    xs.append(i - 0.4 + bar * (j + 0.5))
                    ys.append(m.tflops)
            ax.bar(xs, ys, width=bar, label=k, color=colors[k])
        ax.set_xticks(range(len(g)))
        ax.set_xticklabels([_short(r.workload) for r in g], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"{title}: {d}")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, ncol=min(6, len(keys)), loc="upper left")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
