"""Kernel cases that the tests, tools/kernel_ir.py and the benchmark scripts share.

The compile tests' covering sets (every tuned head-dim pair, feature flag, family and
arch at least once, not the cross product; a representative set of the other head
dims), which tools/kernel_ir.py dumps; and
the SM90 forward's direct-call cases, which the GPU kernel tests run and the
SM90 benchmark scripts precompile. Data and params records only: no cutlass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from frost.engines.sm80 import sdpa_bwd_knobs as _bwd80
from frost.engines.sm80 import sdpa_fwd_params as _fwd80
from frost.engines.sm90.sdpa_fwd_params import default_knobs as _sm90_knobs
from frost.engines.sm90.sdpa_fwd_params import score_mods_of

SM80_FWD_TEMPLATE = "frost.engines.sm80.sdpa_fwd"
SM90_FWD_TEMPLATE = "frost.engines.sm90.sdpa_fwd"
SM90_BWD_TEMPLATE = "frost.engines.sm90.sdpa_bwd"


def params_kwargs(default_knobs, family="sm80", dtype="bf16", d=128, dv=None, hq=4, hk=4, knobs=None, **flags) -> dict:
    """Keyword arguments of Sm80FwdParams / Sm80BwdParams: a family's default knobs (`default_knobs` of the
    matching params module), then overrides, then feature flags."""
    dv = dv or d
    k = default_knobs(family, d, dv, dtype)
    k.update(knobs or {})
    return dict(family=family, dtype=dtype, head_dim=d, head_dim_v=dv, num_heads_q=hq, num_heads_kv=hk, **flags, **k)


def _mma_fwd(**kw) -> dict:
    return params_kwargs(_fwd80.default_knobs, **kw)


def _mma_bwd(**kw) -> dict:
    return params_kwargs(_bwd80.default_knobs, **kw)


def _sm90(d=128, dv=None, hq=4, hk=4, dtype="bf16", knobs=None, **flags) -> dict:
    dv = dv or d
    k = _sm90_knobs(d, dv, score_mods=score_mods_of(flags))
    k.update(knobs or {})
    return dict(dtype=dtype, head_dim=d, head_dim_v=dv, num_heads_q=hq, num_heads_kv=hk, **flags, **k)


# the mma.sync forward, by arch (sm_120a compiles the sm120 family)
SM80_FWD_COVER = {
    "sm_80": [
        _mma_fwd(dtype="fp16", d=64),
        _mma_fwd(d=128, hq=8, hk=2, is_thd=True, has_window_right=True, has_lse=True),
        _mma_fwd(d=256, hq=2, hk=2, has_seqused=True, has_sinks=True, has_lse=True),
    ],
    "sm_90a": [
        _mma_fwd(d=96, has_window_left=True, has_window_right=True, bottom_right=True, has_lse=True),
        _mma_fwd(d=192, dv=128, hq=4, hk=1, is_thd=True, has_sinks=True, has_window_left=True),
        _mma_fwd(d=128, knobs=dict(num_stages=2, tile_n=32)),
    ],
    "sm_120a": [
        _mma_fwd(family="sm120", d=128, is_thd=True, has_window_right=True, has_lse=True),
        _mma_fwd(family="sm120", d=256, hq=2, hk=2, has_window_right=True, bottom_right=True, has_lse=True),
        _mma_fwd(family="sm120", dtype="fp16", d=64, hq=6, hk=2, has_seqused=True, has_sinks=True),
    ],
}

# the mma.sync backward chain (preprocess, main, dQ convert), by arch
SM80_BWD_COVER = {
    "sm_80": [
        _mma_bwd(d=128, hq=8, hk=2, has_window_right=True),
        _mma_bwd(dtype="fp16", d=96, has_window_left=True, has_sinks=True, has_dsinks=True),
        _mma_bwd(d=64, has_seqused=True, deterministic=True, knobs=dict(dq_splits=2)),
    ],
    "sm_90a": [
        _mma_bwd(d=64, hq=4, hk=2, is_thd=True, has_window_left=True, has_window_right=True, deterministic=True),
        _mma_bwd(d=256, dtype="fp16", has_seqused=True, has_window_right=True, bottom_right=True),
        _mma_bwd(d=128, hq=4, hk=2, deterministic=True),
        _mma_bwd(
            d=128,
            hq=4,
            hk=2,
            has_window_right=True,
            has_sinks=True,
            has_dsinks=True,
            deterministic=True,
            knobs=dict(dq_splits=3),
        ),
    ],
    "sm_120a": [
        _mma_bwd(family="sm120", d=192, dv=128, hq=4, hk=1, is_thd=True, has_sinks=True, has_dsinks=True),
        _mma_bwd(family="sm120", d=128, has_seqused=True, deterministic=True, has_window_right=True),
        _mma_bwd(family="sm120", d=64, hq=4, hk=2, is_thd=True, deterministic=True, knobs=dict(det_order="rotated")),
    ],
}

# head dims outside the tuned set (tiles padded past the head dim, d_qk != d_v), apart from the sets above so
# that tools/kernel_ir.py keeps those kernels' file names: every head dim on sm_80, a few on the other arches
SM80_FWD_HEAD_DIM_COVER = {
    "sm_80": [
        _mma_fwd(d=32, has_lse=True),
        _mma_fwd(d=48, hq=8, hk=2, has_window_right=True, has_lse=True),
        _mma_fwd(d=72, has_window_right=True, bottom_right=True, has_lse=True),
        _mma_fwd(d=80, is_thd=True, has_window_left=True, has_window_right=True, has_lse=True),
        _mma_fwd(d=112, dtype="fp16", has_seqused=True, has_sinks=True, has_lse=True),
        _mma_fwd(d=160, has_window_right=True, has_lse=True),
        _mma_fwd(d=192, dv=64, hq=4, hk=1, has_lse=True),
        _mma_fwd(d=40, is_thd=True, has_sinks=True),
        _mma_fwd(d=8, dv=24),
    ],
    "sm_90a": [
        _mma_fwd(d=72, hq=8, hk=2, is_thd=True, has_window_right=True, has_lse=True),
        _mma_fwd(d=64, dv=256, has_window_right=True, has_lse=True),
    ],
    "sm_120a": [
        _mma_fwd(family="sm120", d=136, dv=128, has_window_right=True, has_lse=True),
        _mma_fwd(family="sm120", d=80, is_thd=True, has_lse=True),
    ],
}

SM80_BWD_HEAD_DIM_COVER = {
    "sm_80": [
        _mma_bwd(d=32),
        _mma_bwd(d=48, hq=8, hk=2, has_window_right=True),
        _mma_bwd(d=72, has_window_right=True, bottom_right=True),
        _mma_bwd(d=80, is_thd=True, has_window_left=True, has_window_right=True, deterministic=True),
        _mma_bwd(d=112, dtype="fp16", has_seqused=True, has_sinks=True, has_dsinks=True),
        _mma_bwd(d=160, has_window_right=True),
        _mma_bwd(d=192, dv=64, hq=4, hk=1),
        _mma_bwd(d=40, is_thd=True, has_sinks=True, has_dsinks=True),
        _mma_bwd(d=8, dv=24, deterministic=True, knobs=dict(dq_splits=2)),
    ],
    "sm_90a": [
        _mma_bwd(d=72, hq=8, hk=2, deterministic=True, has_window_right=True),
        _mma_bwd(d=64, dv=256, is_thd=True, has_window_right=True),
    ],
    "sm_120a": [
        _mma_bwd(family="sm120", d=136, dv=128, has_window_right=True),
        _mma_bwd(family="sm120", d=80, is_thd=True, deterministic=True),
    ],
}

# the score modifiers (bias, dBias, ALiBi) on the mma.sync templates, apart from the sets above so that
# tools/kernel_ir.py keeps those kernels' file names: every bias broadcast, both dBias paths (written directly,
# through the fp32 accumulator), ALiBi with a non-power-of-two head count, packed and padded batches, each arch
SM80_FWD_SCORE_MOD_COVER = {
    "sm_80": [
        _mma_fwd(d=128, has_bias=True, bias_per_batch=True, bias_per_head=True, has_lse=True),
        _mma_fwd(dtype="fp16", d=64, hq=6, hk=2, has_alibi=True, has_window_right=True, has_lse=True),
    ],
    "sm_90a": [
        _mma_fwd(
            d=128,
            is_thd=True,
            has_bias=True,
            bias_per_head=True,
            has_alibi=True,
            has_window_right=True,
            has_sinks=True,
            has_lse=True,
        ),
        _mma_fwd(
            d=72,
            has_seqused=True,
            has_bias=True,
            bias_per_batch=True,
            bias_key_strided=True,
            has_window_right=True,
            bottom_right=True,
        ),
    ],
    "sm_120a": [
        _mma_fwd(
            family="sm120",
            d=128,
            has_bias=True,
            has_alibi=True,
            has_window_left=True,
            has_window_right=True,
            has_lse=True,
        ),
    ],
}

SM80_BWD_SCORE_MOD_COVER = {
    "sm_80": [
        _mma_bwd(d=128, has_bias=True, bias_per_batch=True, bias_per_head=True, has_dbias=True, has_window_right=True),
        _mma_bwd(
            dtype="fp16",
            d=64,
            hq=6,
            hk=2,
            has_alibi=True,
            has_window_right=True,
            has_bias=True,
            bias_per_head=True,
            bias_key_strided=True,
            has_dbias=True,
            dbias_accum=True,
        ),
    ],
    "sm_90a": [
        _mma_bwd(
            d=128,
            hq=4,
            hk=2,
            has_seqused=True,
            has_bias=True,
            bias_per_batch=True,
            bias_per_head=True,
            has_dbias=True,
            deterministic=True,
            knobs=dict(dq_splits=2),
        ),
        _mma_bwd(
            d=64, is_thd=True, has_bias=True, has_dbias=True, dbias_accum=True, has_window_right=True, has_alibi=True
        ),
        _mma_bwd(d=96, has_bias=True, bias_per_head=True),
    ],
    "sm_120a": [
        _mma_bwd(
            family="sm120",
            d=128,
            has_bias=True,
            bias_per_batch=True,
            has_dbias=True,
            dbias_accum=True,
            has_window_right=True,
        ),
    ],
}

# the SM90 forward, in two groups (each compiles in its own process)
SM90_FWD_COVER = [
    [
        _sm90(),
        _sm90(dtype="fp16", hq=8, hk=2, is_thd=True, has_window_right=True),
        _sm90(d=64, has_window_right=True, bottom_right=True, has_seqused=True, has_sinks=True),
        _sm90(d=256, has_window_left=True, has_window_right=True, has_lse=False),
        _sm90(hq=16, hk=4, has_window_right=True, knobs=dict(pack_gqa=True)),  # GQA packed, r=4
    ],
    [
        _sm90(d=96, is_thd=True, has_sinks=True, knobs=dict(persistent=False)),
        _sm90(d=192, dv=128, hq=6, hk=3, has_window_right=True),
        _sm90(has_window_left=True, knobs=dict(tile_n=176, separate_o_smem=False)),
        _sm90(d=192, has_window_right=True, knobs=dict(pingpong=False, num_stages=1)),
        _sm90(hq=16, hk=2, is_thd=True, has_window_right=True, knobs=dict(pack_gqa=True)),
        _sm90(
            hq=8,
            hk=2,
            has_sinks=True,
            has_seqused=True,
            has_window_left=True,
            has_window_right=True,
            bottom_right=True,
            knobs=dict(pack_gqa=True),
        ),
    ],
]


@dataclass(frozen=True)
class Sm90Case:
    """One direct-call case of the SM90 forward: geometry, features and optional knob overrides."""

    d: int = 128
    dv: Optional[int] = None
    hq: int = 4
    hkv: int = 4
    b: int = 2
    sq: int = 300
    skv: int = 300
    dtype: str = "bf16"
    wl: Optional[int] = None
    wr: Optional[int] = None
    br: bool = False
    lse: bool = True
    sinks: bool = False
    sink_shift: float = 0.0  # added to the random sinks (a dominant sink must not overflow)
    seqused: Optional[tuple] = None  # ((len_q...), (len_kv...)) per batch
    thd: Optional[tuple] = None  # ((len_q, len_kv), ...)
    strided: bool = False
    knobs: dict = field(default_factory=dict)

    @property
    def id(self):
        bits = [f"d{self.d}" + (f"v{self.dv}" if self.dv else ""), f"h{self.hq}x{self.hkv}", self.dtype]
        bits += [f"wl{self.wl}"] if self.wl is not None else []
        bits += [f"wr{self.wr}"] if self.wr is not None else []
        bits += ["br"] * self.br + ["nolse"] * (not self.lse) + ["sink"] * self.sinks
        bits += [f"shift{self.sink_shift:g}"] if self.sink_shift else []
        bits += ["seqused"] * (self.seqused is not None) + ["thd"] * (self.thd is not None)
        bits += ["strided"] * self.strided + [f"{k}{v}" for k, v in sorted(self.knobs.items())]
        bits += [f"s{self.sq}x{self.skv}"] if self.thd is None else []
        return "-".join(bits)


SM90_FWD_CASES = [
    Sm90Case(),
    Sm90Case(wr=0),
    Sm90Case(wr=0, sq=300, skv=700),
    Sm90Case(wr=0, br=True, sq=200, skv=520),
    Sm90Case(wr=0, br=True, sq=520, skv=200),
    Sm90Case(hq=8, hkv=2, wr=0, sq=1000, skv=1000),
    Sm90Case(dtype="fp16", wr=0),
    Sm90Case(wl=100, wr=17, sinks=True, sq=700, skv=700),
    Sm90Case(wl=33, br=True, sq=130, skv=260),
    Sm90Case(wr=0, br=True, sq=520, skv=200, sinks=True, hq=2, hkv=1),
    Sm90Case(seqused=((250, 0), (300, 17)), sq=300, skv=300, wr=0),
    Sm90Case(lse=False, strided=True, sq=257, skv=383),
    Sm90Case(hq=8, hkv=2, thd=((0, 0), (1, 1), (129, 129), (500, 500), (77, 300), (1, 5)), wr=0),
    Sm90Case(thd=((513, 513), (1, 7), (0, 3), (64, 64)), sinks=True),
    Sm90Case(d=64, hq=4, hkv=4, wr=0, sq=700, skv=700),
    Sm90Case(d=64, thd=((300, 300), (1, 1), (190, 190))),
    Sm90Case(d=96, wr=0),
    Sm90Case(d=192, dv=128, wr=0),
    Sm90Case(d=256, wr=0, sq=333, skv=333),
    Sm90Case(knobs=dict(persistent=False, separate_o_smem=False, pingpong=False), wr=0, sq=600, skv=600),
    Sm90Case(knobs=dict(tile_n=176, separate_o_smem=False), sq=700, skv=700),
    Sm90Case(b=3, sq=900, skv=1100),
    Sm90Case(hq=4, hkv=2, thd=((700, 900), (1, 1), (333, 129))),
    Sm90Case(wr=0, sinks=True, sq=500, skv=500),
    Sm90Case(knobs=dict(tile_m=64), wr=0, sq=300, skv=300),
    Sm90Case(d=96, thd=((200, 200), (1, 1), (77, 77)), wr=0),
    Sm90Case(d=192, dv=192, wr=0, sq=300, skv=300),
    Sm90Case(d=192, dv=192, thd=((129, 300), (64, 64))),
    Sm90Case(sinks=True, sink_shift=150.0, wr=0, sq=200, skv=200),
    # longest-first order over 5 x 3 (batch, head) pairs; unpacked GQA; one-CTA-per-tile launches
    Sm90Case(hq=5, hkv=5, b=3, wr=0, sq=700, skv=700),
    Sm90Case(hq=4, hkv=2, b=3, wr=0, br=True, sq=500, skv=900, knobs=dict(pack_gqa=False)),
    Sm90Case(hq=5, hkv=5, b=3, wr=0, sq=700, skv=700, knobs=dict(persistent=False)),
]

# head dims between 16-element steps (tiles padded past them), d_qk and d_v apart, and d_qk above 256
SM90_FWD_HEAD_DIM_CASES = [
    Sm90Case(d=72, sq=300, skv=300),
    Sm90Case(d=80, wr=0, sq=300, skv=500),
    Sm90Case(d=112, wr=0, br=True, sq=200, skv=520),
    Sm90Case(d=72, dv=40, hq=8, hkv=2, thd=((129, 129), (1, 1), (300, 77)), wr=0),
    Sm90Case(d=72, hq=8, hkv=2, thd=((129, 129), (1, 1), (300, 77)), wr=0, knobs=dict(pack_gqa=True)),
    Sm90Case(d=104, thd=((200, 200), (1, 1), (77, 300))),
    Sm90Case(d=192, dv=64, seqused=((250, 0), (300, 17)), sinks=True),
    Sm90Case(d=64, dv=256, wr=0),  # O's tile larger than Q's, which it reuses
    Sm90Case(d=320, dv=128, wr=0),
    Sm90Case(d=512, dv=256, sq=300, skv=400),
    Sm90Case(d=512, dv=256, thd=((129, 300), (64, 64), (1, 1)), wr=0),
    # d_v above 256 in column slices of O, and d_qk up to 1024
    Sm90Case(d=520, dv=520, wr=0, sq=300, skv=300),
    Sm90Case(d=64, dv=264, hq=4, hkv=2, thd=((129, 129), (1, 1), (300, 77)), wr=0, sinks=True),
    Sm90Case(d=128, dv=520, hq=8, hkv=2, sq=200, skv=333),
    Sm90Case(d=200, dv=264, seqused=((250, 0), (300, 17)), sq=300, skv=300),
    Sm90Case(d=1024, dv=1024, thd=((129, 300), (64, 64), (1, 1))),
]


def sm90_params(c: Sm90Case, sm_count: int):
    """The Sm90FwdParams a case compiles from, with the default knobs for a GPU of `sm_count` SMs."""
    from frost.engines.sm90.sdpa_fwd_params import Sm90FwdParams

    dv = c.dv or c.d
    knobs = _sm90_knobs(c.d, dv, sm_count=sm_count)
    knobs.update(c.knobs)
    return Sm90FwdParams(
        dtype=c.dtype,
        head_dim=c.d,
        head_dim_v=dv,
        num_heads_q=c.hq,
        num_heads_kv=c.hkv,
        is_thd=c.thd is not None,
        has_seqused=c.seqused is not None,
        has_lse=c.lse,
        has_sinks=c.sinks,
        has_window_left=c.wl is not None,
        has_window_right=c.wr is not None,
        bottom_right=c.br,
        **knobs,
    )


# GQA heads packed into one M tile: decode-like shapes are what packing exists for
_PACK = dict(pack_gqa=True)
_S4K = 4096

SM90_PACK_GQA_CASES = [
    # r = 2, 4, 8 over Sq in {1, 7, 128, 1000} against 4k keys
    *[Sm90Case(hq=4, hkv=2, b=2, sq=sq, skv=_S4K, wr=0, br=True, knobs=_PACK) for sq in (1, 7, 128, 1000)],
    *[Sm90Case(hq=8, hkv=2, b=2, sq=sq, skv=_S4K, knobs=_PACK) for sq in (1, 7, 128, 1000)],
    *[Sm90Case(hq=16, hkv=2, b=1, sq=sq, skv=_S4K, wr=0, br=True, sinks=True, knobs=_PACK) for sq in (1, 7, 128, 1000)],
    Sm90Case(hq=16, hkv=2, b=2, sq=1000, skv=1000, wr=0, knobs=_PACK),  # causal, top-left
    Sm90Case(hq=8, hkv=2, b=2, sq=300, skv=700, wr=0, knobs=_PACK),  # causal top-left, Sq < Skv
    # bottom-right, Sq > Skv (empty rows)
    Sm90Case(hq=8, hkv=2, b=2, sq=520, skv=200, wr=0, br=True, knobs=_PACK),
    Sm90Case(hq=8, hkv=2, wl=100, wr=17, sinks=True, sq=700, skv=700, knobs=_PACK),
    Sm90Case(hq=8, hkv=4, wl=33, br=True, sq=130, skv=260, knobs=_PACK),
    Sm90Case(hq=8, hkv=2, seqused=((250, 0), (300, 17)), sq=300, skv=300, wr=0, knobs=_PACK),
    Sm90Case(hq=16, hkv=4, lse=False, strided=True, sq=257, skv=383, knobs=_PACK),
    Sm90Case(
        hq=16, hkv=2, thd=((0, 0), (1, 1), (129, 129), (500, 500), (77, 300), (1, 4096), (7, 4096)), wr=0, knobs=_PACK
    ),
    Sm90Case(hq=8, hkv=2, thd=((513, 513), (1, 7), (0, 3), (64, 64)), sinks=True, knobs=_PACK),
    # tile_m 192: 96 positions x 2 heads
    Sm90Case(d=64, hq=8, hkv=4, wr=0, br=True, sq=700, skv=900, knobs=_PACK),
    Sm90Case(hq=32, hkv=4, sq=3, skv=_S4K, knobs=dict(pack_gqa=True, tile_m=64)),  # one warpgroup, r = 8
    # 64-row tiles: what the adapter picks for decode-like shapes
    *[
        Sm90Case(hq=32, hkv=4, b=2, sq=sq, skv=_S4K, wr=0, br=True, sinks=True, knobs=dict(pack_gqa=True, tile_m=64))
        for sq in (1, 16, 100)
    ],
    Sm90Case(
        hq=16,
        hkv=2,
        thd=((1, 4096), (0, 5), (7, 4096), (16, 16), (100, 3000)),
        wr=0,
        br=True,
        knobs=dict(pack_gqa=True, tile_m=64),
    ),
    Sm90Case(dtype="fp16", hq=8, hkv=2, wr=0, sq=333, skv=333, knobs=_PACK),
    Sm90Case(d=256, hq=4, hkv=2, wr=0, sq=333, skv=333, knobs=_PACK),
    Sm90Case(d=192, dv=128, hq=8, hkv=2, wr=0, sq=200, skv=600, knobs=_PACK),
    # r = 64: one position fills a warpgroup
    Sm90Case(hq=64, hkv=1, sq=5, skv=2000, wr=0, br=True, knobs=_PACK),
]
# the unpacked twin of a dense case: same inputs, same params but pack_gqa off
SM90_PACK_GQA_TWINS = [c for c in SM90_PACK_GQA_CASES if c.thd is None and c.seqused is None][::3]


def unpacked(c: Sm90Case) -> Sm90Case:
    """The unpacked twin of a packed case: same inputs, pack_gqa off."""
    return Sm90Case(**{**c.__dict__, "knobs": {**c.knobs, "pack_gqa": False}})


def sm90_bwd_kwargs(d=128, dv=None, hq=4, hk=4, dtype="bf16", knobs=None, **flags) -> dict:
    """Keyword arguments of Sm90BwdParams: `knobs` requested as the planner requests them (`default_knobs`
    fills the rest, the dQ path from the tile height among them)."""
    from frost.engines.sm90.sdpa_bwd_knobs import default_knobs

    k = default_knobs(
        d,
        dv or d,
        banded=bool(flags.get("has_window_right")),
        packed=bool(flags.get("is_thd")),
        ragged=bool(flags.get("token_div_q")),
        bias=bool(flags.get("has_bias")),
        alibi=bool(flags.get("has_alibi")),
        dbias=bool(flags.get("has_dbias")),
        **(knobs or {}),
    )
    return dict(dtype=dtype, head_dim=d, head_dim_v=dv or d, num_heads_q=hq, num_heads_kv=hk, **flags, **k)


# the SM90 (wgmma) backward main kernel, in three groups: every head dim and tile height, fp16, every mask flag,
# GQA / MQA and the deterministic mode at least once; then packed THD, padding masks and sinks (each head dim
# and tile height, deterministic turns of both orders, one stage)
SM90_BWD_COVER = [
    [
        sm90_bwd_kwargs(),
        sm90_bwd_kwargs(d=64, hq=8, hk=2, has_window_right=True),
        sm90_bwd_kwargs(d=96, dtype="fp16", has_window_left=True),
        sm90_bwd_kwargs(hq=8, hk=2, has_window_right=True, deterministic=True),
    ],
    [
        sm90_bwd_kwargs(hq=4, hk=1, has_window_left=True, has_window_right=True, bottom_right=True),
        sm90_bwd_kwargs(d=64, knobs=dict(tile_m=64, num_stages=1)),
        sm90_bwd_kwargs(dtype="fp16", has_window_right=True, bottom_right=True),
        sm90_bwd_kwargs(knobs=dict(tile_m=64, dq_fragments=False), has_window_left=True, deterministic=True),
    ],
    [
        sm90_bwd_kwargs(hq=4, hk=2, is_thd=True, has_window_right=True, has_sinks=True, has_dsinks=True),
        sm90_bwd_kwargs(d=64, is_thd=True, deterministic=True),
        sm90_bwd_kwargs(d=96, hq=4, hk=2, is_thd=True, has_window_right=True, deterministic=True),
        sm90_bwd_kwargs(
            dtype="fp16",
            is_thd=True,
            has_window_left=True,
            has_window_right=True,
            bottom_right=True,
            knobs=dict(tile_m=64, num_stages=1),
        ),
        sm90_bwd_kwargs(has_seqused=True, has_window_right=True, bottom_right=True),
        sm90_bwd_kwargs(d=96, has_seqused=True, has_sinks=True, has_dsinks=True, deterministic=True),
        sm90_bwd_kwargs(d=64, hq=4, hk=1, has_seqused=True, has_window_left=True, deterministic=True),
    ],
]
# the SM90 backward above d=128 (both warpgroups share 64 keys): dQ through fragment tiles (the dense defaults),
# rows (packed) and register adds (with two stages), every mask flag, deterministic turns with register adds,
# packed and padded lengths, fp16, and d=128 on shared keys
SM90_BWD_WIDE_COVER = [
    [
        sm90_bwd_kwargs(d=256),
        sm90_bwd_kwargs(d=192, dv=128, hq=4, hk=1, has_window_right=True, bottom_right=True),
        sm90_bwd_kwargs(d=256, knobs=dict(num_stages=2, dq_red=True)),
        sm90_bwd_kwargs(
            d=256,
            dtype="fp16",
            hq=8,
            hk=2,
            has_window_left=True,
            has_window_right=True,
            deterministic=True,
            knobs=dict(num_stages=2, dq_red=True),
        ),
    ],
    [
        sm90_bwd_kwargs(d=256, hq=4, hk=2, is_thd=True, has_window_right=True, has_sinks=True, has_dsinks=True),
        sm90_bwd_kwargs(d=192, dv=128, is_thd=True, deterministic=True),
        sm90_bwd_kwargs(d=256, has_seqused=True, has_window_right=True),
        sm90_bwd_kwargs(has_window_right=True, knobs=dict(tile_m=64, tile_n=64)),
    ],
]
# the SM90 backward at the other head dims (multiples of 8 up to 256): tiles padded past the head dim (80 on 96
# columns, 112 on 128 with 80 and 64 rows, 72x40 on 96x48, 40 on 48 with 128 rows, packed 8 on 32x16 with 64 rows,
# 200 on 224 with shared keys and register adds) and pairs on whole tiles (128x64 on 80 rows; 192x64 and 64x256 with
# fragment tiles; 160 packed), packed THD and padding lengths, sinks, fp16 and deterministic turns
SM90_BWD_HEAD_DIM_COVER = [
    [
        sm90_bwd_kwargs(d=80),
        sm90_bwd_kwargs(d=112),
        sm90_bwd_kwargs(d=112, hq=8, hk=2, has_window_right=True),
        sm90_bwd_kwargs(d=72, dv=40, dtype="fp16", has_window_left=True),
        sm90_bwd_kwargs(d=40, deterministic=True),
        sm90_bwd_kwargs(d=8, is_thd=True, has_window_right=True),
        sm90_bwd_kwargs(d=88, hq=8, hk=2, has_window_right=True, deterministic=True),
    ],
    [
        sm90_bwd_kwargs(d=128, dv=64),
        sm90_bwd_kwargs(d=192, dv=64, has_window_right=True),
        sm90_bwd_kwargs(d=160, is_thd=True, deterministic=True),
        sm90_bwd_kwargs(d=80, is_thd=True, has_window_right=True, has_sinks=True, has_dsinks=True),
        sm90_bwd_kwargs(d=200, has_seqused=True, knobs=dict(dq_red=True)),
        sm90_bwd_kwargs(d=64, dv=256),
    ],
]


def ragged(hq=4, hk=4, d=128, int64=False, stats="ragged", **flags) -> dict:
    """The feature flags of cuDNN's ragged-offset form for bshd-packed (B, H, S, D) tensors: each group's token
    stride (H * D) divides its element offsets, int32 or int64 (`int64`: the q group's and Stats'); Stats ragged
    (token stride H), per batch, or none (`stats` None)."""
    kind = "int64" if int64 else "int32"
    f = dict(
        is_thd=True,
        has_seqused=True,
        token_div_q=hq * d,
        token_div_kv=hk * d,
        offset_dtype_q=kind,
        offset_dtype_kv="int32",
        **flags,
    )
    if stats == "ragged":
        f.update(token_div_lse=hq, offset_dtype_lse=kind)
    elif stats == "batch":
        f.update(stats_per_batch=True)
    return f


# cuDNN's ragged-offset form, by arch: int32 and int64 offsets, ragged and per-batch Stats, GQA, masks and the
# deterministic backward; apart from the sets above, so tools/kernel_ir.py keeps those kernels' file names
RAGGED_MMA_FWD_COVER = {
    "sm_80": [
        _mma_fwd(d=128, hq=8, hk=2, has_window_right=True, has_lse=True, **ragged(8, 2)),
        _mma_fwd(d=64, has_lse=True, **ragged(d=64, int64=True, stats="batch")),
    ],
    "sm_90a": [
        _mma_fwd(d=72, hq=4, hk=1, has_sinks=True, **ragged(4, 1, 72, int64=True, stats=None)),
    ],
}
RAGGED_MMA_BWD_COVER = {
    "sm_80": [
        _mma_bwd(d=128, hq=8, hk=2, has_window_right=True, **ragged(8, 2)),
        _mma_bwd(d=64, deterministic=True, **ragged(d=64, int64=True, stats="batch")),
    ],
    "sm_90a": [
        _mma_bwd(
            d=96, hq=4, hk=2, has_window_left=True, has_sinks=True, has_dsinks=True, **ragged(4, 2, 96, int64=True)
        ),
    ],
}
RAGGED_SM90_FWD_COVER = [
    _sm90(hq=8, hk=2, has_window_right=True, **ragged(8, 2), knobs=dict(pack_gqa=True)),
    _sm90(d=64, **ragged(d=64, int64=True, stats="batch")),
    _sm90(hq=8, hk=2, has_window_right=True, **ragged(8, 2, int64=True, stats="batch"), knobs=dict(pack_gqa=True)),
    _sm90(d=96, has_sinks=True, has_lse=False, **ragged(d=96, stats=None)),
]
RAGGED_SM90_BWD_COVER = [
    sm90_bwd_kwargs(hq=8, hk=2, has_window_right=True, **ragged(8, 2)),
    sm90_bwd_kwargs(
        d=64, deterministic=True, has_sinks=True, has_dsinks=True, **ragged(d=64, int64=True, stats="batch")
    ),
    sm90_bwd_kwargs(
        d=96,
        hq=4,
        hk=1,
        has_window_left=True,
        has_window_right=True,
        deterministic=True,
        **ragged(4, 1, 96, int64=True),
    ),
]

# the SM90 forward at head dims padded up to 16-element tiles (d_qk and d_v apart), above d_qk=256, and in the
# row-predicated O store of packed sequences (pack-GQA and the ragged form too), in two groups
SM90_FWD_HEAD_DIM_COVER = [
    [
        _sm90(d=80),
        _sm90(d=112, has_window_right=True),
        _sm90(d=72, dv=40, hq=8, hk=2, is_thd=True, has_window_right=True, knobs=dict(pack_gqa=True)),
        _sm90(d=192, dv=64, has_seqused=True, has_sinks=True),
        _sm90(d=8, dv=24, has_window_left=True, has_window_right=True),
    ],
    [
        _sm90(d=64, dv=256, has_window_right=True, bottom_right=True),
        _sm90(d=320, dv=128, has_window_right=True),
        _sm90(d=512, dv=256),
        _sm90(d=512, dv=256, hq=8, hk=2, is_thd=True, has_window_right=True, knobs=dict(pack_gqa=True)),
        _sm90(d=104, hq=8, hk=2, has_window_right=True, **ragged(8, 2, 104), knobs=dict(pack_gqa=True)),
    ],
]

# the SM90 forward with score modifiers (unpacked: a tile reads one query head's bias and ALiBi slope): a bias
# full along batch and heads, broadcast (1, 1, S_q, S_kv) with a strided key dim under padding, ALiBi with GQA
# and sinks, a bias in a packed batch with GQA, both beside a band, and d=256's registers, in two groups
SM90_FWD_SCORE_MOD_COVER = [
    [
        _sm90(has_bias=True, bias_per_batch=True, bias_per_head=True),
        _sm90(has_bias=True, bias_key_strided=True, has_window_right=True, has_seqused=True),
        _sm90(hq=8, hk=2, has_alibi=True, has_window_right=True, has_sinks=True),
    ],
    [
        _sm90(hq=8, hk=2, is_thd=True, has_bias=True, bias_per_head=True, has_window_right=True),
        _sm90(
            d=64,
            hq=8,
            hk=2,
            has_bias=True,
            bias_per_batch=True,
            has_alibi=True,
            has_window_left=True,
            has_window_right=True,
            bottom_right=True,
            knobs=dict(tile_m=128),
        ),  # the planner's tile with them
        _sm90(d=256, has_bias=True, bias_per_head=True, has_window_right=True, has_score_max=True),
    ],
]

# cuDNN's block_mask in the mma.sync forward: one bit per tile (tiles inside 128x128 blocks, dense, packed and in
# cuDNN's ragged-offset form, with the band, sinks, a bias and padding), and bit by bit where a tile straddles
# blocks (tile_n 96)
SM80_FWD_BLOCK_MASK_COVER = {
    "sm_80": [
        _mma_fwd(d=128, has_block_mask=True, has_lse=True),
        _mma_fwd(dtype="fp16", d=64, hq=8, hk=2, is_thd=True, has_block_mask=True, has_window_right=True, has_lse=True),
        _mma_fwd(d=128, hq=8, hk=2, has_block_mask=True, has_window_right=True, has_lse=True, **ragged(8, 2)),
    ],
    "sm_90a": [
        _mma_fwd(
            d=128,
            has_block_mask=True,
            has_seqused=True,
            has_sinks=True,
            has_window_right=True,
            bottom_right=True,
            has_lse=True,
            has_score_max=True,
        ),
        _mma_fwd(
            d=64, hq=4, hk=1, has_block_mask=True, has_bias=True, bias_per_head=True, has_window_left=True, has_lse=True
        ),
        _mma_fwd(d=64, has_block_mask=True, has_window_right=True, has_lse=True, knobs=dict(tile_n=96, num_stages=1)),
    ],
    "sm_120a": [
        _mma_fwd(family="sm120", d=128, is_thd=True, has_block_mask=True, has_lse=True),
    ],
}

#: a split decode over 16-row blocks with the query heads of a KV group packed (sm_80 and sm_90a builds)
_PAGED16_SPLIT_DECODE = _mma_fwd(
    d=128,
    hq=32,
    hk=8,
    has_seqused=True,
    has_sinks=True,
    has_lse=True,
    paged_block_k=16,
    paged_block_v=16,
    knobs=dict(tile_m=64, pack_gqa=True, num_splits=5),
)

# cuDNN's paged K/V cache in the mma.sync forward (key tiles read through the block tables): decode-like GQA with
# block size 64 (d=128's 64-key tiles), bottom-right causal with sinks and a window at block size 256 (d=64's 128-key
# tiles), K and V in blocks of different sizes with a padded head dim; the sm120 family's decode-style MQA. Blocks
# smaller than the key tile (each row read from its own block): 16-row blocks under d=128's 64-key tiles; 16-row K
# blocks at d=96, whose copy passes of 32 rows span two blocks (each row's block read per thread), beside 128-row V
# blocks; 32-row blocks with a padded head dim (d=80); a GQA-packed decode split over the keys (sm_80 and sm_90a,
# which the H200 runs); a bias over 16-row blocks and a block mask over 32-row ones; 32-row K blocks beside 64-row V
# blocks under d=64's tiles shrunk to 64; the sm120 family's packed decode on 16-row blocks
SM80_FWD_PAGED_COVER = {
    "sm_80": [
        _mma_fwd(d=128, hq=8, hk=2, has_seqused=True, has_lse=True, paged_block_k=64, paged_block_v=64),
        _mma_fwd(
            d=80,
            has_seqused=True,
            has_window_right=True,
            bottom_right=True,
            paged_block_k=128,
            paged_block_v=64,
            knobs=dict(tile_n=64),
        ),
        _mma_fwd(d=128, hq=8, hk=2, has_seqused=True, has_lse=True, paged_block_k=16, paged_block_v=16),
        _mma_fwd(d=96, has_seqused=True, has_window_right=True, bottom_right=True, paged_block_k=16, paged_block_v=128),
        _mma_fwd(d=80, hq=4, hk=2, has_seqused=True, has_sinks=True, paged_block_k=32, paged_block_v=32),
        _PAGED16_SPLIT_DECODE,
        # spanning blocks beside a bias and a block mask (their key columns are positions in the sequence, not in the
        # container), on 64-key tiles as the plan takes them with a bias (128-key ones spill 300 bytes at d=64)
        _mma_fwd(
            d=64,
            has_seqused=True,
            has_bias=True,
            bias_per_head=True,
            paged_block_k=16,
            paged_block_v=16,
            knobs=dict(tile_n=64),
        ),
        _mma_fwd(
            d=64,
            has_seqused=True,
            has_block_mask=True,
            has_lse=True,
            paged_block_k=32,
            paged_block_v=32,
            knobs=dict(tile_n=64),
        ),
    ],
    "sm_90a": [
        _mma_fwd(d=128, hq=8, hk=2, has_seqused=True, has_lse=True, paged_block_k=64, paged_block_v=64),
        _mma_fwd(
            d=64,
            hq=4,
            hk=1,
            has_seqused=True,
            has_sinks=True,
            has_window_left=True,
            has_window_right=True,
            bottom_right=True,
            has_lse=True,
            paged_block_k=256,
            paged_block_v=256,
        ),
        _PAGED16_SPLIT_DECODE,
        _mma_fwd(
            d=64,
            hq=4,
            hk=1,
            has_seqused=True,
            has_window_right=True,
            bottom_right=True,
            paged_block_k=32,
            paged_block_v=64,
            knobs=dict(tile_n=64),
        ),
    ],
    "sm_120a": [
        _mma_fwd(
            family="sm120",
            d=128,
            hq=8,
            hk=1,
            has_seqused=True,
            has_window_right=True,
            bottom_right=True,
            paged_block_k=128,
            paged_block_v=128,
        ),
        _mma_fwd(
            family="sm120",
            d=64,
            hq=8,
            hk=2,
            has_seqused=True,
            has_lse=True,
            paged_block_k=16,
            paged_block_v=16,
            knobs=dict(tile_m=64, pack_gqa=True),
        ),
    ],
}


# cuDNN's paged K/V cache in the wgmma forward (each key tile's TMA load names its block through the table): decode
# with GQA packed into 64-row tiles at block size 64; chunked prefill with bottom-right causal, a sliding window and
# sinks at block size 256 (d=64's 128-key tiles, three consumer warpgroups); K and V in blocks of different sizes
# with a padded head dim (d=80's 112-key tiles shrunk to 64) under bottom-right causal; blocks smaller than the key
# tile (one TMA load per block): 16-row blocks under d=128's 128-key tiles (two column atoms per block) with
# bottom-right causal, 32-row blocks in a GQA-packed decode
SM90_FWD_PAGED_COVER = [
    _sm90(
        hq=8,
        hk=2,
        has_seqused=True,
        paged_block_k=64,
        paged_block_v=64,
        knobs=dict(tile_m=64, tile_n=64, pack_gqa=True),
    ),
    _sm90(
        d=64,
        hq=4,
        hk=1,
        has_seqused=True,
        has_sinks=True,
        has_window_left=True,
        has_window_right=True,
        bottom_right=True,
        paged_block_k=256,
        paged_block_v=256,
    ),
    _sm90(
        d=80,
        has_seqused=True,
        has_window_right=True,
        bottom_right=True,
        paged_block_k=128,
        paged_block_v=64,
        knobs=dict(tile_n=64),
    ),
    _sm90(hq=8, hk=2, has_seqused=True, has_window_right=True, bottom_right=True, paged_block_k=16, paged_block_v=16),
    _sm90(d=64, hq=8, hk=2, has_seqused=True, paged_block_k=32, paged_block_v=32, knobs=dict(tile_m=64, pack_gqa=True)),
]

#: the wgmma forward's split-KV (docs/decode.md): the packed decodes the H200 plans, dense and paged with sinks, and
#: an unpacked bottom-right causal split on the longest-first order
SM90_FWD_SPLIT_COVER = [
    _sm90(hq=32, hk=8, has_lse=True, knobs=dict(tile_m=64, pack_gqa=True, num_splits=14)),
    _sm90(
        hq=32,
        hk=8,
        has_lse=True,
        has_seqused=True,
        has_sinks=True,
        paged_block_k=128,
        paged_block_v=128,
        knobs=dict(tile_m=64, pack_gqa=True, num_splits=8),
    ),
    _sm90(hq=32, hk=8, has_lse=True, has_window_right=True, bottom_right=True, knobs=dict(num_splits=3)),
]


#: split-KV over packed (THD) query batches (docs/decode.md): frost's packed form (with score_max / score_sum_exp
#: too), and cuDNN's ragged offsets with sinks and per-batch Stats, on the mma.sync forward's 64-row decode tiles; the
#: wgmma forward's packed decode with sinks (and score_max), and an unpacked bottom-right causal packed split
SM80_FWD_SPLIT_THD_COVER = {
    "sm_80": [
        _mma_fwd(hq=32, hk=8, is_thd=True, has_lse=True, knobs=dict(tile_m=64, num_warps=4, num_splits=7)),
        _mma_fwd(
            hq=32,
            hk=8,
            is_thd=True,
            has_lse=True,
            has_score_max=True,
            has_score_sum_exp=True,
            knobs=dict(tile_m=64, num_warps=4, num_splits=7),
        ),
        _mma_fwd(
            hq=32,
            hk=8,
            is_thd=True,
            has_seqused=True,
            has_sinks=True,
            has_lse=True,
            token_div_q=4096,
            token_div_kv=1024,
            stats_per_batch=True,
            knobs=dict(tile_m=64, num_warps=4, num_splits=5),
        ),
    ]
}
SM90_FWD_SPLIT_THD_COVER = [
    _sm90(hq=32, hk=8, is_thd=True, has_lse=True, has_sinks=True, knobs=dict(tile_m=64, pack_gqa=True, num_splits=7)),
    _sm90(
        hq=32,
        hk=8,
        is_thd=True,
        has_lse=True,
        has_sinks=True,
        has_score_max=True,
        knobs=dict(tile_m=64, pack_gqa=True, num_splits=7),
    ),
    _sm90(hq=8, hk=8, is_thd=True, has_lse=True, has_window_right=True, bottom_right=True, knobs=dict(num_splits=3)),
]


def ragged_own(hq, hk, hv, d, dv, bwd=False, scores="", **flags) -> dict:
    """cuDNN's ragged-offset form as its own tests declare it: q, k, v and o each with an offset tensor of its own
    (dO taking o's, dQ q's, dK k's, dV v's), so O, V (and dO, dV) read their own offsets over their own token
    strides; K and V head counts may differ (`hv` != `hk`), Stats per batch. `scores`: score_max and
    score_sum_exp too, "ragged" (each its own offsets, Stats ragged as well) or "batch" (per batch)."""
    own = (("o", hq * dv, "int64"), ("v", hv * dv, "int32"))
    if bwd:
        own += (("do", hq * dv, "int64"), ("dv", hv * dv, "int32"))
    if scores == "ragged":
        own += (("score_max", hq, "int64"), ("score_sum_exp", hq, "int32"))
    extra = dict(has_score_max=True, has_score_sum_exp=True) if scores else {}
    return dict(
        ragged(hq, hk, d, int64=True, stats="ragged" if scores == "ragged" else "batch", **flags),
        own_offsets=own,
        **extra,
        **({"num_heads_v": hv} if hv != hk else {}),
    )


# cuDNN's ragged-offset form with an offset tensor per tensor: d_qk != d_v, K and V head counts apart, a bias
# (dBias through the accumulator) and ALiBi, by template
RAGGED_OWN_MMA_FWD_COVER = {
    "sm_90a": [
        _mma_fwd(d=128, dv=64, hq=6, hk=3, has_lse=True, **ragged_own(6, 3, 1, 128, 64)),
        _mma_fwd(
            d=56,
            dv=96,
            hq=6,
            hk=2,
            has_lse=True,
            has_bias=True,
            bias_per_head=True,
            has_alibi=True,
            has_window_right=True,
            **ragged_own(6, 2, 2, 56, 96),
        ),
        _mma_fwd(d=64, hq=4, hk=4, has_lse=True, has_window_right=True, **ragged_own(4, 4, 4, 64, 64, scores="ragged")),
    ],
}
RAGGED_OWN_MMA_BWD_COVER = {
    "sm_90a": [
        _mma_bwd(
            d=64,
            dv=128,
            hq=6,
            hk=2,
            has_bias=True,
            bias_per_head=True,
            has_dbias=True,
            dbias_accum=True,
            has_window_right=True,
            **ragged_own(6, 2, 2, 64, 128, bwd=True),
        ),
        _mma_bwd(d=128, hq=6, hk=6, deterministic=True, **ragged_own(6, 6, 1, 128, 128, bwd=True)),
    ],
}
RAGGED_OWN_SM90_FWD_COVER = [
    _sm90(d=128, dv=64, hq=6, hk=3, **ragged_own(6, 3, 1, 128, 64)),
    _sm90(
        d=56,
        dv=96,
        hq=6,
        hk=2,
        has_bias=True,
        bias_per_batch=True,
        has_alibi=True,
        has_window_right=True,
        **ragged_own(6, 2, 2, 56, 96),
    ),
    _sm90(d=128, hq=8, hk=2, has_window_right=True, **ragged_own(8, 2, 2, 128, 128, scores="ragged")),
    _sm90(d=64, hq=4, hk=4, **ragged_own(4, 4, 4, 64, 64, scores="batch")),
]
RAGGED_OWN_SM90_BWD_COVER = [
    sm90_bwd_kwargs(d=64, dv=128, hq=6, hk=2, has_window_right=True, **ragged_own(6, 2, 2, 64, 128, bwd=True)),
]

# the deterministic dBias of a bias broadcast over batch entries or heads: an fp32 copy per (batch entry, query
# head), stored once per element, summed by the dQ convert in a fixed order (dense and packed)
DET_DBIAS_MMA_BWD_COVER = {
    "sm_90a": [
        _mma_bwd(
            d=64,
            hq=4,
            hk=2,
            has_bias=True,
            bias_per_head=True,
            has_dbias=True,
            dbias_accum=True,
            deterministic=True,
            has_window_right=True,
        ),
        _mma_bwd(d=128, is_thd=True, has_bias=True, has_dbias=True, dbias_accum=True, deterministic=True),
    ],
}

# the SM90 backward's rows warp with its stages handed over through named barriers of the whole CTA (the
# default hands them over through mbarriers, `rows_mbar`)
SM90_BWD_ROWS_BARRIER_COVER = [
    sm90_bwd_kwargs(has_window_right=True, knobs=dict(rows_mbar=False)),
    sm90_bwd_kwargs(hq=8, hk=2, deterministic=True, knobs=dict(rows_mbar=False)),
]

# cuDNN's block_mask in the wgmma forward: cleared key blocks skipped, visited ones masked bit by bit (dense with the
# band, sinks and a bias; packed with a window, on the 128 rows the planner takes with it; 96-key blocks straddling
# 128-key tiles)
SM90_FWD_BLOCK_MASK_COVER = [
    _sm90(d=128, has_block_mask=True, has_window_right=True, has_sinks=True, has_bias=True, bias_per_head=True),
    _sm90(
        d=64,
        hq=8,
        hk=2,
        is_thd=True,
        has_block_mask=True,
        has_window_left=True,
        has_window_right=True,
        knobs=dict(tile_m=128),
    ),
    _sm90(d=96, has_block_mask=True, has_seqused=True, has_score_max=True, knobs=dict(tile_n=96)),
]

# the wgmma forward's block skipping where registers are tight: the producer warp's walk over the bits (24 registers)
# beside the packed scheduler (causal THD at the planner's knobs, unpacked GQA), rows spanning two 128-query blocks
# (tile_m 192), 80-key blocks straddling 128-key tiles (d=256), one consumer warpgroup over 64-key blocks in column
# slices of O (d above 256)
SM90_FWD_BLOCK_SKIP_COVER = [
    _sm90(d=128, hq=8, hk=2, is_thd=True, has_block_mask=True, has_window_right=True),
    _sm90(d=128, has_block_mask=True, has_window_right=True),
    _sm90(d=64, has_block_mask=True, has_window_right=True, knobs=dict(tile_m=192)),
    _sm90(d=256, is_thd=True, has_block_mask=True, has_sinks=True),
    _sm90(d=512, has_block_mask=True, has_window_right=True, has_seqused=True),
]

# the SM90 backward's score modifiers: a bias read through its transposed view and ALiBi with the slope negated,
# dBias written directly (the band's outside zeroed) or through the fp32 accumulator (broadcast, packed, and a copy
# per (batch entry, head) when deterministic); 64-row packed tiles as the planner takes them with modifiers
SM90_BWD_SCORE_MOD_COVER = [
    sm90_bwd_kwargs(
        hq=8, hk=2, has_bias=True, bias_per_batch=True, bias_per_head=True, has_dbias=True, has_window_right=True
    ),
    sm90_bwd_kwargs(has_bias=True, bias_per_head=True, has_dbias=True, dbias_accum=True, deterministic=True),
    sm90_bwd_kwargs(
        d=64, hq=8, hk=2, is_thd=True, has_bias=True, has_dbias=True, dbias_accum=True, has_window_right=True
    ),
    sm90_bwd_kwargs(hq=8, hk=2, has_alibi=True, has_window_right=True, has_sinks=True),
    sm90_bwd_kwargs(d=256, has_bias=True, bias_key_strided=True, has_dbias=True),
]

# K and V head counts that do not nest in the mma.sync backward: both tiles change within a walk (K groups of 3 query
# heads, V groups of 2), dense with a band and padding, packed and deterministic
SM80_BWD_UNNESTED_COVER = {
    "sm_90a": [
        _mma_bwd(d=64, hq=12, hk=4, num_heads_v=6, has_window_right=True, has_seqused=True),
        _mma_bwd(d=128, hq=6, hk=2, num_heads_v=3, is_thd=True, deterministic=True),
    ],
}

# the SM90 backward's packed batches with fragment-order dQ tiles (each sequence's own tiles, `dq_fragments` on THD)
SM90_BWD_PACKED_FRAGMENT_COVER = [
    sm90_bwd_kwargs(d=64, is_thd=True, knobs=dict(dq_fragments=True)),
    sm90_bwd_kwargs(
        hq=8,
        hk=2,
        is_thd=True,
        has_window_right=True,
        deterministic=True,
        has_sinks=True,
        has_dsinks=True,
        knobs=dict(tile_m=64, dq_fragments=True),
    ),
]

# the SM90 forward past d_v 256 and d_qk 512: O in column slices (`v_slices`), each its own work tile; dense,
# packed (the row-predicated O store's per-slice column limit), GQA (unpacked), cuDNN's ragged form with every row
# output (written by the first slice alone), score modifiers, and d_qk 1024 on 32-key blocks
SM90_FWD_WIDE_V_COVER = [
    _sm90(d=520, dv=520, has_window_right=True),
    _sm90(d=64, dv=264, hq=4, hk=2, is_thd=True, has_window_right=True, has_sinks=True),
    _sm90(d=128, dv=520, hq=8, hk=2),
    _sm90(
        d=56,
        dv=520,
        hq=6,
        hk=2,
        has_window_left=True,
        has_window_right=True,
        **ragged_own(6, 2, 2, 56, 520, scores="ragged"),
    ),
    _sm90(d=200, dv=264, has_bias=True, bias_per_head=True, has_alibi=True, has_window_right=True, has_seqused=True),
    _sm90(d=1024, dv=1024, is_thd=True),
]
