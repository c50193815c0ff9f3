"""The bench CLI's arguments for the tests' small CPU runs (the reference engine, wall-clock timing)."""

from __future__ import annotations

#: a tiny forward row on the CPU: a few milliseconds a sample
CPU_RUN = dict(
    device="cpu",
    tokens="64",
    hidden="128",
    seqlen="32",
    head_dim="64",
    layout="bshd",
    causal="no",
    direction="fwd",
    reps="2",
    warmup="1",
    impl="frost",
    name="cpu",
    json="",
    png="",
)


def cpu_run_argv(tmp_path, *flags: str, **options) -> list[str]:
    """`--option value` pairs of CPU_RUN with `options` over them (underscores become dashes; None leaves an option
    out), results in `tmp_path`, quiet, then the bare `flags` (e.g. "--no-probe")."""
    merged = {**CPU_RUN, "results_dir": str(tmp_path), **options}
    argv = []
    for key, value in merged.items():
        if value is not None:
            argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv + ["-q", *flags]
