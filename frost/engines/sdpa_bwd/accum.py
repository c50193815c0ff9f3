"""Views of the fp32 dQ accumulator and the jit entry and fakes of every kernel of a backward chain.

The accumulator's layout is stated by its params (`chain.BwdChainParams`): dense rows or 8x8 blocks
(`dq_accum_blocked`), one copy or `dq_splits` copies stacked copy-major along its batch mode; THD keeps
one (heads, packed tokens, head_dim) accumulator.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from frost.engines.common.sdpa_entry import FakeArgs, make_entry


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
    mode (`scratch.scratch_layout`); copy 0 is the accumulator every mode has."""
    return copy * n_batch + batch


def dense_acc_rows(p, mAcc: cute.Tensor, acc_batch, head, blocked: bool = True) -> cute.Tensor:
    """The (rows, head_dim) dQ accumulator of one head of a dense batch index (`copy_batch`): 8x8-blocked
    where the params block it, or, with `blocked=False`, the same memory row-major (zeroing)."""
    acc = mAcc[acc_batch, head, None, None]
    return blocked_rows(acc, p.head_dim) if blocked and p.dq_accum_blocked else acc


def acc_copies(p, mAcc: cute.Tensor, n_batch, batch, head, blocked: bool = True) -> list:
    """The (rows, head_dim) dQ accumulator views of one (batch, head), one per copy in copy order: THD's
    packed rows, or each dense copy (`dense_acc_rows`); the helper kernels zero and sum them."""
    if p.is_thd:
        return [mAcc[head, None, None]]
    return [dense_acc_rows(p, mAcc, copy_batch(c, n_batch, batch), head, blocked) for c in range(max(p.dq_splits, 1))]


def scratch_fake(fakes: FakeArgs, name: str):
    """Fakes of the chain's workspace buffers (scratch.scratch_layout), compact and symbolic."""
    p = fakes.p
    hq, d = p.num_heads_q, p.head_dim
    if name == "dpsum":
        return fakes.compact(Float32, (hq, fakes.rows_q) if p.is_thd else (fakes.batch, hq, fakes.rows_q))
    if name == "dq_accum":
        if p.is_thd:
            return fakes.compact(Float32, (hq, fakes.rows_q, d))
        rows = cute.sym_int(divisibility=8, symbol="acc_rows_q") if p.dq_accum_blocked else fakes.rows_q
        # dq_splits stacks its copies along the batch mode (copy_batch), so that extent is its own symbol
        batch = cute.sym_int(symbol="acc_batch") if p.dq_splits > 0 else fakes.batch
        return fakes.compact(Float32, (batch, hq, rows, d))
    if name == "dq_semaphore":
        return fakes.compact(Int32, (cute.sym_int(symbol="n_semaphores"),))
    if name == "dsink_partial":
        return fakes.compact(Float32, (cute.sym_int(symbol="n_dsink_partials"),))
    raise KeyError(f"no fake argument for {name!r}")


def build_entry(p, names: list[str], run):
    """(jit entry, fakes) of one kernel of the chain; `run(args)` receives the arguments by contract name."""
    return make_entry(run, names, p.is_thd), tuple(FakeArgs(p, extra=scratch_fake).all(names))
