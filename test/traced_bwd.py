"""Trace-time access to the mma.sync backward's main kernel, for CPU tests of its memory access patterns."""

from __future__ import annotations

from frost.testing.cases import params_kwargs

FAMILIES = ("sm80", "sm120")
#: head dims the tiles pad (72 on 96 columns, 40 on 64, 8 on 32), tile widths off the tuned ones (160, 224),
#: and pairs whose d_qk and d_v differ
PADDED_HEAD_DIMS = ((72, 72), (40, 40), (8, 24), (160, 160), (224, 224), (192, 64), (64, 256))


def default_params(family: str, d: int, dv: int):
    """Sm80BwdParams with the family's default knobs for these head dims."""
    from frost.engines.sm80.sdpa_bwd_knobs import default_knobs
    from frost.engines.sm80.sdpa_bwd_params import Sm80BwdParams

    return Sm80BwdParams(**params_kwargs(default_knobs, family=family, d=d, dv=dv))


def trace_main(p, collect) -> None:
    """Call `collect(main)` while tracing: `main` holds the kernel's smem layouts, MMAs and copies for `p`.

    `collect` is plain Python (not preprocessed by the DSL), so its loops and indexing run on static values.
    Nothing is launched; the trace compiles for sm_90a on the CPU.
    """
    import cutlass.cute as cute

    from frost.engines.sm80.sdpa_bwd import SdpaBwdSm80

    @cute.jit
    def trace():
        m = SdpaBwdSm80(p, "sm_90a")
        m._layouts()
        collect(m)

    cute.compile(trace)
