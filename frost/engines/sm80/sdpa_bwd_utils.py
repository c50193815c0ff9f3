"""Pieces shared by the three kernels of the mma.sync backward chain.

Fake arguments (one symbol per runtime extent, shared wherever extents must be
equal; every declared stride its own symbol), binding of the positional
argument list by name, lane / warp reductions, and the fp32 reduction stores
used to accumulate dQ.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from frost.engines.sm80.sdpa_bwd_params import Sm80BwdParams

_IO_DTYPES = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16}


def io_dtype(p: Sm80BwdParams):
    return _IO_DTYPES[p.dtype]


def bind(names: list[str], args: tuple) -> dict:
    """Positional arguments of a host entry, keyed by their contract names."""
    if len(names) != len(args):
        raise TypeError(f"expected {len(names)} arguments ({', '.join(names)}), got {len(args)}")
    return dict(zip(names, args))


class FakeArgs:
    """Fake tensors, scalars and stream for every argument name of the chain.

    Runtime extents (batch, sequence lengths, packed totals, scratch lengths) are
    symbolic and shared where they must agree; every non-unit stride is its own
    64-bit symbol, 8-element divisible for the 16-byte io tensors.
    """

    def __init__(self, p: Sm80BwdParams):
        self.p = p
        self._made: dict = {}
        self.batch = cute.sym_int(symbol="batch")
        if p.is_thd:
            self.rows_q = cute.sym_int(symbol="total_q")
            self.rows_kv = cute.sym_int(symbol="total_kv")
            self.batch1 = cute.sym_int(symbol="batch_plus_1")
        else:
            self.rows_q = cute.sym_int(symbol="seqlen_q")
            self.rows_kv = cute.sym_int(symbol="seqlen_kv")

    def _io(self, rows, heads: int, dim: int):
        dt = io_dtype(self.p)
        if self.p.is_thd:
            shape = (rows, heads, dim)
            stride = (cute.sym_int64(divisibility=8), cute.sym_int64(divisibility=8), 1)
        else:
            shape = (self.batch, rows, heads, dim)
            stride = (cute.sym_int64(divisibility=8), cute.sym_int64(divisibility=8),
                      cute.sym_int64(divisibility=8), 1)
        return cute.runtime.make_fake_tensor(dt, shape, stride, assumed_align=16)

    def _stats(self):
        if self.p.is_thd:
            shape = (self.p.num_heads_q, self.rows_q)
            stride = (cute.sym_int64(), cute.sym_int64())
        else:
            shape = (self.batch, self.p.num_heads_q, self.rows_q)
            stride = (cute.sym_int64(), cute.sym_int64(), cute.sym_int64())
        return cute.runtime.make_fake_tensor(Float32, shape, stride, assumed_align=4)

    def _compact(self, dtype, shape, align=16):
        order = tuple(range(len(shape) - 1, -1, -1))
        return cute.runtime.make_fake_compact_tensor(dtype, shape, stride_order=order, assumed_align=align)

    def _make(self, name: str):
        p = self.p
        hq, hkv, d, dv = p.num_heads_q, p.num_heads_kv, p.head_dim, p.head_dim_v
        if name in ("q", "dq"):
            return self._io(self.rows_q, hq, d)
        if name in ("o", "do"):
            return self._io(self.rows_q, hq, dv)
        if name in ("k", "dk"):
            return self._io(self.rows_kv, hkv, d)
        if name in ("v", "dv"):
            return self._io(self.rows_kv, hkv, dv)
        if name == "lse":
            return self._stats()
        if name in ("cu_seqlens_q", "cu_seqlens_kv"):
            return self._compact(Int32, (self.batch1,), align=4)
        if name in ("seqused_q", "seqused_kv"):
            return self._compact(Int32, (self.batch,), align=4)
        if name in ("sinks", "dsinks"):
            return self._compact(Float32, (hq,), align=4)
        if name == "dpsum":
            shape = (hq, self.rows_q) if p.is_thd else (self.batch, hq, self.rows_q)
            return self._compact(Float32, shape)
        if name == "dq_accum":
            shape = (hq, self.rows_q, d) if p.is_thd else (self.batch, hq, self.rows_q, d)
            return self._compact(Float32, shape)
        if name == "dq_semaphore":
            return self._compact(Int32, (cute.sym_int(symbol="n_semaphores"),))
        if name == "dsink_partial":
            return self._compact(Float32, (cute.sym_int(symbol="n_dsink_partials"),))
        if name == "softmax_scale":
            return Float32(1.0)
        if name in ("window_left", "window_right", "max_seqlen_q", "max_seqlen_kv"):
            return Int32(0)
        if name == "stream":
            return cute.runtime.make_fake_stream()
        raise KeyError(f"no fake argument for {name!r}")

    def get(self, name: str):
        if name not in self._made:
            self._made[name] = self._make(name)
        return self._made[name]


class ArityHost:
    """Host entries with a fixed positional signature, one per argument count.

    The chain's argument lists vary with the feature flags; the compile
    boundary (and its persistent cache) wants plain positional parameters, so
    `entry(n)` picks the n-argument entry, which hands the tuple to `run`.
    """

    def run(self, args: tuple) -> None:  # pragma: no cover - per template
        raise NotImplementedError

    def entry(self, n: int):
        fn = getattr(self, f"_entry{n}", None)
        if fn is None:
            raise TypeError(f"no host entry with {n} arguments")
        return fn

    @cute.jit
    def _entry4(self, a0, a1, a2, a3):
        self.run((a0, a1, a2, a3,))

    @cute.jit
    def _entry5(self, a0, a1, a2, a3, a4):
        self.run((a0, a1, a2, a3, a4,))

    @cute.jit
    def _entry6(self, a0, a1, a2, a3, a4, a5):
        self.run((a0, a1, a2, a3, a4, a5,))

    @cute.jit
    def _entry7(self, a0, a1, a2, a3, a4, a5, a6):
        self.run((a0, a1, a2, a3, a4, a5, a6,))

    @cute.jit
    def _entry8(self, a0, a1, a2, a3, a4, a5, a6, a7):
        self.run((a0, a1, a2, a3, a4, a5, a6, a7,))

    @cute.jit
    def _entry9(self, a0, a1, a2, a3, a4, a5, a6, a7, a8):
        self.run((a0, a1, a2, a3, a4, a5, a6, a7, a8,))

    @cute.jit
    def _entry10(self, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9):
        self.run((a0, a1, a2, a3, a4, a5, a6, a7, a8, a9,))

    @cute.jit
    def _entry11(self, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10):
        self.run((a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10,))

    @cute.jit
    def _entry12(self, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11):
        self.run((a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11,))

    @cute.jit
    def _entry13(self, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12):
        self.run((a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12,))

    @cute.jit
    def _entry14(self, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13):
        self.run((a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13,))

    @cute.jit
    def _entry15(self, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14):
        self.run((a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14,))

    @cute.jit
    def _entry16(self, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15):
        self.run((a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15,))

    @cute.jit
    def _entry17(self, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16):
        self.run((a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16,))

    @cute.jit
    def _entry18(self, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17):
        self.run((a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17,))


@cute.jit
def lane_group_sum(x: Float32, width: cutlass.Constexpr[int]) -> Float32:
    """Sum over `width` consecutive lanes (a power of two); every lane gets the total."""
    offset = width // 2
    while cutlass.const_expr(offset >= 1):
        x = x + cute.arch.shuffle_sync_bfly(x, offset=offset)
        offset = offset // 2
    return x


@dsl_user_op
def red_add_f32(ptr: cute.Pointer, a: Float32, *, loc=None, ip=None) -> None:
    """red.global.add.f32: fire-and-forget fp32 add into global memory."""
    addr = ptr.toint(loc=loc, ip=ip).ir_value()
    llvm.inline_asm(None, [addr, Float32(a).ir_value(loc=loc, ip=ip)], "red.global.add.f32 [$0], $1;", "l,f",
                    has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def red_add_v2_f32(ptr: cute.Pointer, a: Float32, b: Float32, *, loc=None, ip=None) -> None:
    """red.global.add.v2.f32 (sm_90+): two neighbouring fp32 adds in one 8-byte reduction."""
    addr = ptr.toint(loc=loc, ip=ip).ir_value()
    llvm.inline_asm(None, [addr, Float32(a).ir_value(loc=loc, ip=ip), Float32(b).ir_value(loc=loc, ip=ip)],
                    "red.global.add.v2.f32 [$0], {$1, $2};", "l,f,f",
                    has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def ld_acquire_i32(ptr: cute.Pointer, *, loc=None, ip=None) -> Int32:
    """ld.acquire.gpu.b32: read a semaphore with acquire ordering."""
    addr = ptr.toint(loc=loc, ip=ip).ir_value()
    return Int32(llvm.inline_asm(T.i32(), [addr], "ld.acquire.gpu.global.b32 $0, [$1];", "=r,l",
                                 has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def red_release_add_i32(ptr: cute.Pointer, a: Int32, *, loc=None, ip=None) -> None:
    """red.release.gpu.add.s32: publish a semaphore step after this CTA's fenced writes."""
    addr = ptr.toint(loc=loc, ip=ip).ir_value()
    llvm.inline_asm(None, [addr, Int32(a).ir_value(loc=loc, ip=ip)], "red.release.gpu.global.add.s32 [$0], $1;",
                    "l,r", has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


def elem_ptr(t: cute.Tensor, coord) -> cute.Pointer:
    """Pointer to one element of a (possibly swizzle-free) global tensor."""
    return t.iterator + cute.crd2idx(coord, t.layout)


__all__ = ["ArityHost", "FakeArgs", "bind", "io_dtype", "lane_group_sum", "red_add_f32", "red_add_v2_f32", "ld_acquire_i32",
           "red_release_add_i32", "elem_ptr"]
