"""Pieces shared by the three kernels of the mma.sync backward chain.

The jit entry and fakes of each kernel (through frost.engines.common.sdpa_entry,
plus the workspace buffers' fakes), and the fp32 reduction stores
used to accumulate dQ.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from frost.engines.common.sdpa_entry import FakeArgs, make_entry
from frost.engines.sm80.sdpa_bwd_params import Sm80BwdParams, blocked_accumulator


def blocked_layout(rows, d: int):
    """(rows, d) -> offset of an fp32 accumulator stored in 8x8 blocks (row groups of 8, then columns).

    An MMA accumulator fragment puts each lane quad on 8 columns of one of 8 rows, so a warp's reduction of
    one fragment register pair lands in one 256-byte block: two whole cache lines.
    """
    return cute.make_layout(((8, rows // 8), (8, d // 8)), stride=((8, 8 * d), (1, 64)))


@cute.jit
def blocked_rows(acc: cute.Tensor, d: cutlass.Constexpr[int]) -> cute.Tensor:
    """The blocked (`blocked_layout`) view of a compact (rows, d) accumulator."""
    return cute.make_tensor(acc.iterator, blocked_layout(acc.shape[0], d))


def copy_batch(copy, n_batch, batch):
    """Batch index of a dense accumulator's copy `copy`: `dq_splits` copies stack copy-major along the batch
    mode (`scratch_layout`); copy 0 is the accumulator every mode has."""
    return copy * n_batch + batch


def dense_acc_rows(p: Sm80BwdParams, mAcc: cute.Tensor, acc_batch, head, blocked: bool = True) -> cute.Tensor:
    """The (rows, head_dim) dQ accumulator of one head of a dense batch index (`copy_batch`): 8x8-blocked
    where the params block it, or, with `blocked=False`, the same memory row-major (zeroing)."""
    acc = mAcc[acc_batch, head, None, None]
    return blocked_rows(acc, p.head_dim) if blocked and blocked_accumulator(p) else acc


def acc_copies(p: Sm80BwdParams, mAcc: cute.Tensor, n_batch, batch, head, blocked: bool = True) -> list:
    """The (rows, head_dim) dQ accumulator views of one (batch, head), one per copy in copy order: THD's
    packed rows, or each dense copy (`dense_acc_rows`); the helper kernels zero and sum them."""
    if p.is_thd:
        return [mAcc[head, None, None]]
    return [dense_acc_rows(p, mAcc, copy_batch(c, n_batch, batch), head, blocked) for c in range(max(p.dq_splits, 1))]


def scratch_fake(fakes: FakeArgs, name: str):
    """Fakes of the chain's workspace buffers (sdpa_bwd_params.scratch_layout), compact and symbolic."""
    p = fakes.p
    hq, d = p.num_heads_q, p.head_dim
    if name == "dpsum":
        return fakes.compact(Float32, (hq, fakes.rows_q) if p.is_thd else (fakes.batch, hq, fakes.rows_q))
    if name == "dq_accum":
        if p.is_thd:
            return fakes.compact(Float32, (hq, fakes.rows_q, d))
        rows = cute.sym_int(divisibility=8, symbol="acc_rows_q") if blocked_accumulator(p) else fakes.rows_q
        # dq_splits stacks its copies along the batch mode (copy_batch), so that extent is its own symbol
        batch = cute.sym_int(symbol="acc_batch") if p.dq_splits > 0 else fakes.batch
        return fakes.compact(Float32, (batch, hq, rows, d))
    if name == "dq_semaphore":
        return fakes.compact(Int32, (cute.sym_int(symbol="n_semaphores"),))
    if name == "dsink_partial":
        return fakes.compact(Float32, (cute.sym_int(symbol="n_dsink_partials"),))
    raise KeyError(f"no fake argument for {name!r}")


def build_entry(p: Sm80BwdParams, names: list[str], run):
    """(jit entry, fakes) of one kernel of the chain; `run(args)` receives the arguments by contract name."""
    return make_entry(run, names, p.is_thd), tuple(FakeArgs(p, extra=scratch_fake).all(names))


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


__all__ = ["blocked_layout", "blocked_rows", "copy_batch", "dense_acc_rows", "acc_copies", "build_entry",
           "scratch_fake", "red_add_f32", "ld_acquire_i32", "red_release_add_i32", "elem_ptr"]
