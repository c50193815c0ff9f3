"""fp32 reductions, acquire / release semaphore operations and predicated element loads and stores on global
memory (inline PTX)."""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass._mlir.dialects import arith, llvm
from cutlass.cutlass_dsl import T, dsl_user_op


def _flag(ok, loc=None, ip=None):
    """A predicate operand (`setp.ne.b32 p, flag, 0`) from a Boolean or Int32."""
    return Int32(ok).ir_value(loc=loc, ip=ip)


@dsl_user_op
def red_add_f32(ptr: cute.Pointer, vals, ok=None, *, loc=None, ip=None) -> None:
    """red.global.add (fire-and-forget) of 1, 2 or 4 neighbouring fp32 values; .v2 / .v4 need sm_90. With `ok`,
    predicated on it (no branch)."""
    n = len(vals)
    addr = ptr.toint(loc=loc, ip=ip).ir_value()
    args = [addr] + [Float32(v).ir_value(loc=loc, ip=ip) for v in vals]
    regs = ", ".join(f"${i + 1}" for i in range(n))
    op = {
        1: f"red.global.add.f32 [$0], {regs};",
        2: f"red.global.add.v2.f32 [$0], {{{regs}}};",
        4: f"red.global.add.v4.f32 [$0], {{{regs}}};",
    }[n]
    cons = "l," + ",".join(["f"] * n)
    if ok is not None:
        args.append(_flag(ok, loc, ip))
        op = f"{{ .reg .pred p; setp.ne.b32 p, ${n + 1}, 0; @p {op} }}"
        cons += ",r"
    llvm.inline_asm(
        None, args, op, cons, has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT
    )


@dsl_user_op
def ld_16bit_as_f32_if(ptr: cute.Pointer, ok, bf16: bool, *, loc=None, ip=None) -> Float32:
    """One bf16 (`bf16`) or fp16 element widened to fp32, or 0.0 where `ok` is false: a predicated load through
    the read-only path with no branch, so a tile's loads issue back to back and their latency is paid once."""
    widen = "mov.b32 $0, {z, h};" if bf16 else "cvt.f32.f16 $0, h;"
    asm = (
        "{ .reg .pred p; .reg .b16 h, z; setp.ne.b32 p, $2, 0; mov.b16 z, 0; mov.b16 h, 0; "
        f"@p ld.global.nc.b16 h, [$1]; {widen} }}"
    )
    return Float32(
        llvm.inline_asm(
            T.f32(),
            [ptr.toint(loc=loc, ip=ip).ir_value(), _flag(ok, loc, ip)],
            asm,
            "=f,l,r",
            has_side_effects=False,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


@dsl_user_op
def st_16bit_if(ptr: cute.Pointer, v, ok, *, loc=None, ip=None) -> None:
    """Store one bf16 / fp16 value where `ok` holds (predicated, no branch)."""
    bits = arith.bitcast(T.i16(), v.ir_value(loc=loc, ip=ip))
    llvm.inline_asm(
        None,
        [ptr.toint(loc=loc, ip=ip).ir_value(), bits, _flag(ok, loc, ip)],
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p st.global.b16 [$0], $1; }",
        "l,h,r",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


@dsl_user_op
def st_f32_if(ptr: cute.Pointer, vals, ok, *, loc=None, ip=None) -> None:
    """Store 1, 2 or 4 neighbouring fp32 values (one vector store, aligned to its size) where `ok` holds
    (predicated, no branch)."""
    n = len(vals)
    regs = ", ".join(f"${i + 1}" for i in range(n))
    op = {
        1: f"st.global.f32 [$0], {regs};",
        2: f"st.global.v2.f32 [$0], {{{regs}}};",
        4: f"st.global.v4.f32 [$0], {{{regs}}};",
    }[n]
    args = (
        [ptr.toint(loc=loc, ip=ip).ir_value()]
        + [Float32(v).ir_value(loc=loc, ip=ip) for v in vals]
        + [_flag(ok, loc, ip)]
    )
    llvm.inline_asm(
        None,
        args,
        f"{{ .reg .pred p; setp.ne.b32 p, ${n + 1}, 0; @p {op} }}",
        "l," + ",".join(["f"] * n) + ",r",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


@dsl_user_op
def ld_acquire_i32(ptr: cute.Pointer, *, loc=None, ip=None) -> Int32:
    """ld.acquire.gpu.b32: read a semaphore with acquire ordering."""
    addr = ptr.toint(loc=loc, ip=ip).ir_value()
    return Int32(
        llvm.inline_asm(
            T.i32(),
            [addr],
            "ld.acquire.gpu.global.b32 $0, [$1];",
            "=r,l",
            has_side_effects=True,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


@dsl_user_op
def red_release_add_i32(ptr: cute.Pointer, a: Int32, *, loc=None, ip=None) -> None:
    """red.release.gpu.add.s32: publish a semaphore step after this CTA's fenced writes."""
    addr = ptr.toint(loc=loc, ip=ip).ir_value()
    llvm.inline_asm(
        None,
        [addr, Int32(a).ir_value(loc=loc, ip=ip)],
        "red.release.gpu.global.add.s32 [$0], $1;",
        "l,r",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


def elem_ptr(t: cute.Tensor, coord) -> cute.Pointer:
    """Pointer to one element of a (possibly swizzle-free) global tensor."""
    return t.iterator + cute.crd2idx(coord, t.layout)


@dsl_user_op
def bulk_reduce_add_f32(dst: cute.Pointer, src: cute.Pointer, nbytes: int, *, loc=None, ip=None) -> None:
    """cp.reduce.async.bulk .add.f32: add `nbytes` (a multiple of 16) of contiguous fp32 from shared memory
    into global memory, in the issuing thread's bulk group (commit and wait like any bulk copy)."""
    args = [
        dst.toint(loc=loc, ip=ip).ir_value(),
        src.toint(loc=loc, ip=ip).ir_value(),
        Int32(nbytes).ir_value(loc=loc, ip=ip),
    ]
    llvm.inline_asm(
        None,
        args,
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [$0], [$1], $2;",
        "l,r,r",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )
