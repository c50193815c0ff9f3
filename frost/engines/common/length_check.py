"""The opt-in device check of sequence lengths and offsets (docs/lengths.md), a one-warp kernel.

Each lane walks batch entries lane, lane + 32, ... and ORs the bits of the rules an entry breaks
(`length_check_params`); the warp ORs the lanes' bits and lane 0 stores them into the caller's int32 flag (a
store, not an accumulation: the flag needs no clearing, and execute fills nothing). The values are read as they
are: this kernel is the one reader that compares them instead of clamping them, so it stays out of the
compile tests' clamp check. B is symbolic; the envelopes are Int32 arguments (plan-time values and bound
extents), so one artifact serves every batch. Call signature: ``fn(flag, lengths_q, lengths_kv, *offsets,
env_q, env_kv, max_q, max_kv, stream)``.
"""

from __future__ import annotations

import inspect

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from frost.engines.common import length_check_params as lc
from frost.engines.common.length_check_params import LengthCheckParams, validate

TEMPLATE = __name__
_TYPES = {"int32": Int32, "int64": Int64}


def kernel_name(params: LengthCheckParams, arch: str) -> str:
    offs = "".join(f"_{side}{div}{dtype[3:]}" for side, div, dtype in params.offsets)
    return f"frost_length_check_{params.form}{offs}"


def arg_names(params: LengthCheckParams) -> list[str]:
    return (
        ["flag", "lengths_q", "lengths_kv"]
        + [f"offsets_{i}" for i in range(len(params.offsets))]
        + ["env_q", "env_kv", "max_q", "max_kv", "stream"]
    )


def build(params: LengthCheckParams, arch: str):
    """The host entry and its fakes, in `arg_names(params)` order."""
    validate(params)
    batch = cute.sym_int(symbol="batch")
    rows = cute.sym_int(symbol="batch_plus_1") if params.form == "packed" else batch
    flag = cute.runtime.make_fake_compact_tensor(Int32, (1,), assumed_align=4)
    lens = [cute.runtime.make_fake_compact_tensor(Int32, (rows,), assumed_align=4) for _ in range(2)]
    offs = [
        cute.runtime.make_fake_compact_tensor(_TYPES[dt], (cute.sym_int(symbol=f"offsets_{i}"),), assumed_align=4)
        for i, (_, _, dt) in enumerate(params.offsets)
    ]
    names = arg_names(params)
    op = LengthCheck(params)

    def length_check(*args):
        a = dict(zip(names, args))
        op.launch(
            a["flag"],
            a["lengths_q"],
            a["lengths_kv"],
            tuple(a[f"offsets_{i}"] for i in range(len(params.offsets))),
            (a["env_q"], a["env_kv"], a["max_q"], a["max_kv"]),
            a["stream"],
        )

    scalars = {"env_q", "env_kv", "max_q", "max_kv"}
    length_check.__signature__ = inspect.Signature(
        [
            inspect.Parameter(
                n,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                annotation=Int32 if n in scalars else cuda.CUstream if n == "stream" else cute.Tensor,
            )
            for n in names
        ]
    )
    fakes = (flag, *lens, *offs, Int32(1), Int32(1), Int32(1), Int32(1), cute.runtime.make_fake_stream())
    return cute.jit(length_check), fakes


class LengthCheck:
    """The kernel object: plan-time params and the host-side launch the jit entry calls; device code: `kernel`."""

    def __init__(self, p: LengthCheckParams):
        self.p = p

    def launch(self, flag, lengths_q, lengths_kv, offsets, envelope, stream) -> None:
        kernel(self.p, flag, lengths_q, lengths_kv, offsets, *envelope).launch(
            grid=(1, 1, 1), block=(32, 1, 1), stream=stream
        )


@cute.jit
def _length_bits(n: Int32, hi: Int32) -> Int32:
    bits = Int32(0)
    if n < 0:
        bits = Int32(lc.LENGTH_NEGATIVE)
    elif n > hi:
        bits = Int32(lc.LENGTH_ABOVE_MAX)
    return bits


@cute.jit
def _prefix_bits(mCu: cute.Tensor, b: Int32, total: Int32, most: Int32) -> Int32:
    s = mCu[b]
    e = mCu[b + 1]
    bits = Int32(0)
    if s < 0 or s > total or e < 0 or e > total:
        bits = Int32(lc.OFFSET_OUTSIDE)
    elif e < s:
        bits = Int32(lc.PREFIX_SUMS_DECREASE)
    elif e - s > most:
        bits = Int32(lc.LENGTH_ABOVE_MAX)
    return bits


@cute.jit
def _offset_bits(mOff: cute.Tensor, b: Int32, div: cutlass.Constexpr[int], n: Int32, total: Int32) -> Int32:
    off = mOff[b]
    t = type(off)
    bits = Int32(0)
    if off % t(div) != t(0):
        bits = Int32(lc.OFFSET_NOT_WHOLE_TOKEN)
    elif off // t(div) < t(0) or off // t(div) > t(total):
        bits = Int32(lc.OFFSET_OUTSIDE)
    elif n >= 0 and off // t(div) + t(n) > t(total):
        bits = Int32(lc.OFFSET_PLUS_LENGTH_OUTSIDE)
    return bits


@cute.kernel
def kernel(
    p: cutlass.Constexpr,
    mFlag: cute.Tensor,
    mLenQ: cute.Tensor,
    mLenKV: cute.Tensor,
    mOffsets,
    env_q: Int32,
    env_kv: Int32,
    max_q: Int32,
    max_kv: Int32,
):
    lane, _, _ = cute.arch.thread_idx()
    n = cute.size(mLenQ, mode=[0])
    if cutlass.const_expr(p.form == "packed"):
        n = n - 1
    bits = Int32(0)
    for i in cutlass.range((n - lane + 31) // 32, unroll=1):
        b = lane + i * 32
        if cutlass.const_expr(p.form == "padded"):
            bits = bits | _length_bits(mLenQ[b], env_q) | _length_bits(mLenKV[b], env_kv)
        elif cutlass.const_expr(p.form == "packed"):
            bits = bits | _prefix_bits(mLenQ, b, env_q, max_q) | _prefix_bits(mLenKV, b, env_kv, max_kv)
        else:
            n_q = mLenQ[b]
            n_kv = mLenKV[b]
            bits = bits | _length_bits(n_q, max_q) | _length_bits(n_kv, max_kv)
            for j in cutlass.range_constexpr(len(p.offsets)):
                side, div, _ = p.offsets[j]
                if cutlass.const_expr(side == "q"):
                    bits = bits | _offset_bits(mOffsets[j], b, div, n_q, env_q)
                else:
                    bits = bits | _offset_bits(mOffsets[j], b, div, n_kv, env_kv)
    for k in cutlass.range_constexpr(5):
        bits = bits | cute.arch.shuffle_sync_bfly(bits, offset=1 << k)
    if lane == 0:
        mFlag[0] = bits
