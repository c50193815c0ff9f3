"""fp32 reductions and acquire / release semaphore operations on global memory (inline PTX)."""
from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


@dsl_user_op
def red_add_f32(ptr: cute.Pointer, vals, *, loc=None, ip=None) -> None:
    """red.global.add (fire-and-forget) of 1, 2 or 4 neighbouring fp32 values; .v2 / .v4 need sm_90."""
    n = len(vals)
    addr = ptr.toint(loc=loc, ip=ip).ir_value()
    args = [addr] + [Float32(v).ir_value(loc=loc, ip=ip) for v in vals]
    regs = ", ".join(f"${i + 1}" for i in range(n))
    asm = {1: f"red.global.add.f32 [$0], {regs};", 2: f"red.global.add.v2.f32 [$0], {{{regs}}};",
           4: f"red.global.add.v4.f32 [$0], {{{regs}}};"}[n]
    llvm.inline_asm(None, args, asm, "l," + ",".join(["f"] * n), has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


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


@dsl_user_op
def bulk_reduce_add_f32(dst: cute.Pointer, src: cute.Pointer, nbytes: int, *, loc=None, ip=None) -> None:
    """cp.reduce.async.bulk .add.f32: add `nbytes` (a multiple of 16) of contiguous fp32 from shared memory
    into global memory, in the issuing thread's bulk group (commit and wait like any bulk copy)."""
    args = [dst.toint(loc=loc, ip=ip).ir_value(), src.toint(loc=loc, ip=ip).ir_value(),
            Int32(nbytes).ir_value(loc=loc, ip=ip)]
    llvm.inline_asm(None, args, "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [$0], [$1], $2;",
                    "l,r,r", has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)
