"""`python -m frost.bench` / `frost bench`: parse the sweep, run it, print and write the report."""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys

from frost.bench.check import DEFAULT_TOL
from frost.bench.timing import TimingOptions
from frost.bench.workloads import (
    DEFAULT_THD_LENGTHS,
    DIRECTIONS,
    DTYPES,
    LAYOUTS,
    SweepSpec,
    parse_gqa,
    parse_head_dim,
    parse_size,
    split_list,
)

# Presets time the non-deterministic backward; add `--deterministic both` to any of them for each
# backward row's deterministic twin and the det / non-det time ratio (`yes` for deterministic rows only).
PRESETS = {
    # the full sweep the harness exists for
    "default": dict(
        directions=["fwd", "bwd"],
        dtypes=["bf16"],
        head_dims=[(64, 64), (128, 128), (256, 256)],
        seqlens=[512, 1024, 2048, 4096, 8192, 16384],
        causal=[False, True],
        gqa=[1],
        layouts=["bshd", "thd"],
        thd_mixes=["fixed", "random"],
        probe=True,
    ),
    # a few minutes: one head dim, three lengths, the fixed THD mix
    "quick": dict(
        directions=["fwd", "bwd"],
        dtypes=["bf16"],
        head_dims=[(128, 128)],
        seqlens=[1024, 4096, 16384],
        causal=[False, True],
        gqa=[1],
        layouts=["bshd", "thd"],
        thd_mixes=["fixed"],
        probe=True,
    ),
    # the configurations of shared/anchors.md's dense table
    "anchors": dict(
        directions=["fwd", "bwd"],
        dtypes=["bf16"],
        head_dims=[(64, 64), (128, 128), (256, 256)],
        seqlens=[4096, 16384],
        causal=[False, True],
        gqa=[1],
        layouts=["bshd"],
        thd_mixes=["fixed"],
        probe=True,
    ),
    # a functional pass: does every implementation run at all
    "smoke": dict(
        directions=["fwd", "bwd"],
        dtypes=["bf16"],
        head_dims=[(128, 128)],
        seqlens=[1024],
        causal=[False, True],
        gqa=[1],
        layouts=["bshd", "thd"],
        thd_mixes=["fixed"],
        probe=True,
    ),
    # frost's cuDNN engine against cuDNN through torch (the same library; the bar is within 3%) with the
    # host-time probe; `--impl cudnn,frost --frost-engines cudnn` times just those two (a minute or two on an H200)
    "cudnn": dict(
        directions=["fwd", "bwd"],
        dtypes=["bf16"],
        head_dims=[(64, 64), (128, 128)],
        seqlens=[4096, 16384],
        causal=[False, True],
        gqa=[1],
        layouts=["bshd"],
        thd_mixes=["fixed"],
        probe=True,
    ),
    # paged K/V caches (forward only): decode (64 sequences of 8k keys, one query row each, GQA 32:8; K/V TB/s in
    # each cell's info) and causal prefill, block sizes 16, 64, 128, 256, each shape with its contiguous twin (the
    # report's paged / contiguous speed per frost engine); frost's engines that serve paged caches, FA4's
    # page_table and cuDNN's paged SDPA
    "paged": dict(
        directions=["fwd"],
        dtypes=["bf16"],
        head_dims=[(128, 128)],
        seqlens=[8192],
        causal=[False, True],
        gqa=[4],
        layouts=["paged"],
        thd_mixes=["fixed"],
        probe=False,
        heads_q=32,
    ),
    # everything the flags can express
    "all": dict(
        directions=["fwd", "bwd"],
        dtypes=["bf16", "fp16"],
        head_dims=[(64, 64), (128, 128), (256, 256), (192, 128)],
        seqlens=[512, 1024, 2048, 4096, 8192, 16384],
        causal=[False, True],
        gqa=[1, 4],
        layouts=["bshd", "thd"],
        thd_mixes=["fixed", "random"],
        probe=True,
    ),
}
PRESET_TIMING = {"smoke": dict(reps=5, warmup=2, probe_calls=100)}
IMPLS = ("cudnn", "fa2", "fa4", "frost")


def _choices(allowed):
    def parse(text):
        items = split_list(text)
        bad = [x for x in items if x not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(allowed)}")
        return items

    return parse


def _list_of(fn):
    def parse(text):
        try:
            items = [fn(x) for x in split_list(text)]
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        return items

    return parse


def _flag_values(table: dict, usage: str):
    """An argparse type mapping words (case-insensitive) to the flag values they select."""

    def parse(text):
        t = text.strip().lower()
        if t not in table:
            raise argparse.ArgumentTypeError(f"{text!r}: use {usage}")
        return table[t]

    return parse


_causal = _flag_values(
    {
        "both": [False, True],
        "yes": [True],
        "no": [False],
        "true": [True],
        "false": [False],
        "causal": [True],
        "full": [False],
    },
    "both, yes or no",
)
_deterministic = _flag_values({"no": [False], "yes": [True], "both": [False, True]}, "no, yes or both")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="frost bench",
        description="Benchmark frost's SDPA engines against cuDNN, FlashAttention-2 and FlashAttention-4 "
        "on this GPU: TFLOP/s per configuration, the ratio to the best peer, a checked output.",
    )
    s = p.add_argument_group("workloads (explicit flags override the preset)")
    s.add_argument("--preset", choices=sorted(PRESETS), default="default", help="starting sweep (default: %(default)s)")
    s.add_argument("--direction", type=_choices(DIRECTIONS), help="fwd,bwd")
    s.add_argument("--dtype", type=_choices(DTYPES), help="bf16,fp16")
    s.add_argument("--head-dim", type=_list_of(parse_head_dim), help="e.g. 64,128,256,192x128 (Dqk x Dv)")
    s.add_argument("--seqlen", type=_list_of(parse_size), help="dense sequence lengths, e.g. 512,1k,4k,16k")
    s.add_argument(
        "--tokens", type=parse_size, default=16384, help="total tokens per batch; B = tokens / S (default: %(default)s)"
    )
    s.add_argument(
        "--hidden", type=parse_size, default=2048, help="hidden size; Hq = hidden / Dv (default: %(default)s)"
    )
    s.add_argument(
        "--heads",
        type=int,
        default=0,
        help="query heads of every row instead of hidden / Dv (a head-dim sweep at one head count, "
        "e.g. --head-dim 80,96,112,128 --heads 16)",
    )
    s.add_argument("--causal", type=_causal, help="both, yes or no")
    s.add_argument(
        "--deterministic",
        type=_deterministic,
        help="backward rows: no (default), yes, or both (each row then its deterministic twin, "
        "with frost's det / non-det time ratio); forward rows ignore it",
    )
    s.add_argument("--gqa", type=_list_of(parse_gqa), help="GQA ratios Hq/Hkv, e.g. 1,4 or 32:8")
    s.add_argument("--layout", type=_choices(LAYOUTS), help="bshd (dense), thd (packed varlen)")
    s.add_argument("--thd-mix", type=_choices(("fixed", "random")), help="packed length mixes: fixed,random")
    s.add_argument(
        "--thd-lengths",
        type=_list_of(parse_size),
        help="the fixed mix (default: %s)" % ",".join(map(str, DEFAULT_THD_LENGTHS)),
    )
    s.add_argument(
        "--thd-max-len", type=parse_size, default=8192, help="longest sequence of the random mix (default: %(default)s)"
    )
    s.add_argument("--seed", type=int, default=0, help="seeds the random mix and the inputs (default: 0)")
    s.add_argument(
        "--probe",
        dest="probe",
        action="store_true",
        default=None,
        help="run the tiny-problem host-time probe (1x1x128x64)",
    )
    s.add_argument("--no-probe", dest="probe", action="store_false")
    s.add_argument("--probe-calls", type=int, help="calls in the probe's wall-clock loop (default: 500)")

    i = p.add_argument_group("implementations")
    i.add_argument(
        "--impl", type=_choices(IMPLS), default=list(IMPLS), help="which to run (default: %s)" % ",".join(IMPLS)
    )
    i.add_argument(
        "--frost-engines",
        type=split_list,
        default=[],
        help="only frost engines matching these glob patterns (default: every engine)",
    )
    i.add_argument(
        "--exclude-engines",
        type=split_list,
        default=[],
        help="skip frost engines matching these glob patterns, e.g. sm80 (default: none)",
    )

    t = p.add_argument_group("method")
    t.add_argument("--reps", type=int, help="event-timed samples per measurement; the median is reported (default: 20)")
    t.add_argument("--warmup", type=int, help="warm-up passes over the buffer sets (default: 3)")
    t.add_argument(
        "--interleave",
        type=int,
        default=0,
        metavar="N",
        help="re-time each row's cells in N >= 5 interleaved rounds (engine order rotated) and report "
        "median [min-max], ratios with their range, win / loss / tie (default: off)",
    )
    t.add_argument(
        "--ceiling",
        type=int,
        default=0,
        metavar="N",
        help="measure the bf16 matmul ceiling (N x N GEMM, e.g. 8192) first and report each cell as a "
        "fraction of it (default: off)",
    )
    t.add_argument(
        "--min-sample-ms",
        type=float,
        default=2.0,
        help="each sample loops enough calls to last this long (default: %(default)s)",
    )
    t.add_argument("--max-inner", type=int, default=100, help="most calls in one sample (default: %(default)s)")
    t.add_argument(
        "--timing",
        choices=("loop", "graph"),
        default="loop",
        help="time a loop of calls, or replays of it captured in a CUDA graph (default: %(default)s)",
    )
    t.add_argument(
        "--max-buffers",
        type=int,
        default=8,
        help="most rotated input sets; enough are made to exceed 2x L2 (default: %(default)s)",
    )
    t.add_argument("--no-check", dest="check", action="store_false", help="skip the frost output check")
    t.add_argument(
        "--tol-fwd", type=float, default=DEFAULT_TOL["fwd"], help="forward rel err tolerance (default: %(default)s)"
    )
    t.add_argument(
        "--tol-bwd", type=float, default=DEFAULT_TOL["bwd"], help="backward rel err tolerance (default: %(default)s)"
    )
    t.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help="stop starting new rows after this many seconds (the rest are marked skipped)",
    )

    o = p.add_argument_group("output")
    o.add_argument(
        "--json",
        default=None,
        help="JSON path (default: frost-bench.json; '' for none); "
        "rewritten after every row so an interrupted run keeps what it measured",
    )
    o.add_argument("--png", default=None, help="PNG chart path (default: frost-bench.png; '' for none)")
    o.add_argument(
        "--results-dir", default=None, help="write <name>.json, <name>.md and <name>.png here (e.g. benchmarks/results)"
    )
    o.add_argument("--name", default=None, help="file stem under --results-dir (default: <date>_<gpu>_<preset>)")
    o.add_argument("--title", default="frost benchmark", help="title of the Markdown file and the chart")
    o.add_argument("--dry-run", action="store_true", help="list what would run; needs no GPU")
    o.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    o.add_argument("--strict", action="store_true", help="exit 3 when a frost row fails or fails its check")
    o.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cuda (default); cpu only self-tests the harness with wall-clock timing",
    )
    return p


def spec_from_args(a) -> SweepSpec:
    base = dict(PRESETS[a.preset])
    over = {
        "directions": a.direction,
        "dtypes": a.dtype,
        "head_dims": a.head_dim,
        "seqlens": a.seqlen,
        "causal": a.causal,
        "deterministic": a.deterministic,
        "gqa": a.gqa,
        "layouts": a.layout,
        "thd_mixes": a.thd_mix,
        "probe": a.probe,
    }
    base.update({k: v for k, v in over.items() if v is not None})
    if a.heads < 0:
        raise SystemExit(f"frost bench: --heads {a.heads} must be positive")
    heads = a.heads or base.pop("heads_q", 0)
    base.pop("heads_q", None)
    spec = SweepSpec(**base, tokens=a.tokens, hidden=a.hidden, heads_q=heads, thd_max_len=a.thd_max_len, seed=a.seed)
    if a.thd_lengths:
        spec.thd_lengths = tuple(a.thd_lengths)
    return spec


def timing_from_args(a) -> TimingOptions:
    pt = PRESET_TIMING.get(a.preset, {})
    return TimingOptions(
        warmup=a.warmup if a.warmup is not None else pt.get("warmup", 3),
        reps=a.reps if a.reps is not None else pt.get("reps", 20),
        min_sample_ms=a.min_sample_ms,
        max_inner=a.max_inner,
        mode=a.timing,
    )


def probe_calls_from_args(a) -> int:
    return a.probe_calls if a.probe_calls is not None else PRESET_TIMING.get(a.preset, {}).get("probe_calls", 500)


def settings_dict(a, spec: SweepSpec, timing: TimingOptions) -> dict:
    return {
        "preset": a.preset,
        "device": a.device,
        "sweep": {
            "directions": spec.directions,
            "dtypes": spec.dtypes,
            "head_dims": [f"{q}x{v}" if q != v else str(q) for q, v in spec.head_dims],
            "seqlens": spec.seqlens,
            "tokens": spec.tokens,
            "hidden": spec.hidden,
            "heads": spec.heads_q,
            "causal": spec.causal,
            "deterministic": spec.deterministic,
            "gqa": spec.gqa,
            "layouts": spec.layouts,
            "thd_mixes": spec.thd_mixes,
            "thd_lengths": list(spec.thd_lengths),
            "thd_max_len": spec.thd_max_len,
            "seed": spec.seed,
            "probe": spec.probe,
        },
        "impls": a.impl,
        "frost_engines": a.frost_engines,
        "exclude_engines": a.exclude_engines,
        "timing": {
            "mode": timing.mode,
            "reps": timing.reps,
            "warmup": timing.warmup,
            "min_sample_ms": timing.min_sample_ms,
            "max_inner": timing.max_inner,
            "max_buffers": a.max_buffers,
            "probe_calls": probe_calls_from_args(a),
            "interleave": a.interleave,
        },
        "check": a.check,
        "tol": {"fwd": a.tol_fwd, "bwd": a.tol_bwd},
    }


def output_paths(a, gpu_name: str | None) -> dict:
    """Where the report goes: {'json': path|None, 'png': path|None, 'md': path|None}."""
    from frost.bench.envinfo import slug

    paths = {
        "json": a.json if a.json is not None else (None if a.results_dir else "frost-bench.json"),
        "png": a.png if a.png is not None else (None if a.results_dir else "frost-bench.png"),
        "md": None,
    }
    paths = {k: (v or None) for k, v in paths.items()}
    extra = {}
    if a.results_dir:
        name = a.name or "_".join([datetime.date.today().isoformat(), slug(gpu_name or "gpu"), a.preset])
        stem = os.path.join(a.results_dir, name)
        extra = {"json": stem + ".json", "md": stem + ".md", "png": stem + ".png"}
    return {"json": paths["json"], "png": paths["png"], "md": None, **{f"dir_{k}": v for k, v in extra.items()}}


def no_cuda_device() -> str | None:
    """Why no CUDA device is here ("no CUDA device here"), or None when one is (asks torch; starts no context)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return "no torch"
    return None if torch.cuda.is_available() else "no CUDA device here"


def dry_run(a, spec: SweepSpec, workloads: list, out=None) -> int:
    """Print the sweep and the implementations that would run; touches no GPU."""
    from frost.bench.frost_runner import frost_unavailable
    from frost.bench.peers import all_peers

    out = out or sys.stdout
    probes = [w for w in workloads if w.probe]
    rows = [w for w in workloads if not w.probe]
    det = [w for w in rows if w.deterministic]
    print(f"frost bench --dry-run: {len(rows)} workloads, {len(probes)} probe rows, preset {a.preset}", file=out)
    paged = [w for w in rows if w.is_paged]
    if paged:
        print(
            f"paged K/V: {len(paged)} rows (block sizes {sorted({w.block_size for w in paged})}; decode rows also "
            f"report the K/V bytes read per second): frost's engines that serve paged caches (frost's wgmma "
            f"forward on cc 9.0, its mma.sync forward on other GPUs, block sizes 16 to 256), FA4 with page_table, "
            f"cuDNN's paged SDPA in the cudnn column; FA2 n/a; each shape's contiguous twin is timed too, for each "
            f"frost engine's paged / contiguous speed",
            file=out,
        )
    if det:
        print(
            f"deterministic backward: {len(det)} rows ('bwd det'): frost with use_deterministic_algorithm=True, "
            f"FA4 with deterministic=True where its API has it, cuDNN and FA2 n/a",
            file=out,
        )
    no_gpu = no_cuda_device() if a.device == "cuda" else None
    if no_gpu:
        print(f"{no_gpu}: nothing here can be timed on a GPU (--device cpu runs the harness's self-test)", file=out)
    print("implementations:", file=out)
    for p in all_peers():
        if p.key in a.impl:
            why = p.unavailable() or no_gpu
            print(f"  {p.key:6s} {p.label}: {'available' if not why else 'missing: ' + why}", file=out)
    if "frost" in a.impl:
        from frost.bench.frost_runner import cudnn_engine_unavailable
        from frost.bench.runner import engine_selected

        why = frost_unavailable()
        filt = []
        if a.frost_engines:
            filt.append("only " + ",".join(a.frost_engines))
        if a.exclude_engines:
            filt.append("excluding " + ",".join(a.exclude_engines))
        state = ("graph API available" if not why else "missing: " + why) + (
            f"; {no_gpu}: only the reference engine would serve" if no_gpu else ""
        )
        print(
            f"  frost  every engine that accepts each graph, resolved on the GPU ({state}"
            f"{'; ' + '; '.join(filt) if filt else ''})",
            file=out,
        )
        if engine_selected("SdpaFwdCudnn", a.frost_engines, a.exclude_engines):
            why = cudnn_engine_unavailable() or no_gpu
            print(
                f"  frost:cudnn  frost's cuDNN engine, beside cuDNN through torch (cudnn/cuDNN column): "
                f"{'available' if not why else 'missing: ' + why}",
                file=out,
            )
    header = (
        f"{'#':>3}  {'dir':7}  {'dtype':5}  {'D':>7}  {'shape':34}  {'heads':>5}  {'mask':6}  {'GFLOP':>9}  "
        f"{'set MiB':>7}"
    )
    print(header, file=out)
    for n, w in enumerate(workloads, 1):
        gflop = "-" if w.probe else f"{w.flops() / 1e9:.1f}"
        shape = w.shape_label + (" (probe)" if w.probe else "")
        print(
            f"{n:>3}  {w.direction_label:7}  {w.dtype:5}  {w.head_dim_label:>7}  {shape:34}  {w.heads_label:>5}  "
            f"{'causal' if w.causal else 'full':6}  {gflop:>9}  {w.set_bytes() / 2**20:7.1f}",
            file=out,
        )
    thd = [w for w in rows if w.is_thd]
    for mix in sorted({w.mix for w in thd}):
        lens = next(w.seqlens for w in thd if w.mix == mix)
        print(f"THD mix {mix}: {len(lens)} sequences, {sum(lens)} tokens: {','.join(map(str, lens))}", file=out)
    paths = output_paths(a, None)
    files = [v for v in paths.values() if v]
    print("would write: " + (", ".join(files) if files else "nothing (terminal table only)"), file=out)
    return 0


_log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    from frost.cli import console_logging

    console_logging()
    parser = build_parser()
    a = parser.parse_args(argv)
    try:
        spec = spec_from_args(a)
        workloads = spec.probes() + spec.expand()  # probes first: cheap, never cut by the time budget
    except ValueError as e:
        parser.error(str(e))
    for why in spec.skipped:
        _log.warning("frost bench: left out: %s", why)
    timing = timing_from_args(a)
    if a.dry_run:
        return dry_run(a, spec, workloads)

    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        _log.error("frost bench: no CUDA device here (use --dry-run to list the sweep)")
        return 1

    from frost.bench import envinfo, plot, report
    from frost.bench.impl import CHECK_FAILED, FAILED
    from frost.bench.peers import all_peers
    from frost.bench.runner import Progress, Runner, RunOptions

    env = envinfo.static_env()
    env.update(envinfo.gpu_env() if a.device == "cuda" else {"gpu": "cpu (harness self-test)"})
    settings = settings_dict(a, spec, timing)
    paths = output_paths(a, env.get("gpu"))
    json_paths = [p for p in (paths["json"], paths.get("dir_json")) if p]
    md_path = paths.get("dir_md")

    def save(rows):
        for p in json_paths:
            report.write_json(p, rows, env, settings)
        if md_path:
            report.write_markdown(md_path, rows, env, settings, a.title)

    opts = RunOptions(
        impls=a.impl,
        frost_engines=a.frost_engines,
        exclude_engines=a.exclude_engines,
        timing=timing,
        check=a.check,
        tol={"fwd": a.tol_fwd, "bwd": a.tol_bwd},
        max_buffers=a.max_buffers,
        probe_calls=probe_calls_from_args(a),
        seed=a.seed,
        time_budget_s=a.time_budget,
        device=a.device,
        interleave=a.interleave,
        ceiling_n=a.ceiling,
    )
    progress = Progress(len(workloads), enabled=not a.quiet)
    _log.info(
        "frost bench on %s (driver %s, torch %s, cuDNN %s, flash-attn-4 %s, frost %s)",
        env.get("gpu"),
        env.get("driver"),
        env.get("torch"),
        env.get("cudnn"),
        env.get("flash_attn_4"),
        env.get("frost_commit"),
    )
    runner = Runner(opts, all_peers(), progress, on_row=save)
    rows = runner.run(workloads)
    if runner.ceiling:
        settings["ceiling"] = {k: v for k, v in runner.ceiling.items() if k != "samples_ms"}
    save(rows)

    print(report.render_report(rows, device=a.device, ceiling=settings.get("ceiling")))
    written = [p for p in json_paths] + ([md_path] if md_path else [])
    for p in (paths["png"], paths.get("dir_png")):
        if not p:
            continue
        why = plot.matplotlib_missing()
        if why:
            _log.warning("frost bench: %s; skipped %s", why, p)
            continue
        if plot.write_png(p, rows, a.title, env=env):
            written.append(p)
    if written:
        _log.info("wrote: %s", ", ".join(written))
    if a.strict and any(m.status in (FAILED, CHECK_FAILED) for r in rows for m in r.frost()):
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
