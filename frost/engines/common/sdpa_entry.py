"""The jit entry and fake arguments of every SDPA kernel (see frost.engines.sdpa_args).

Execute passes the bound tensors in their declared order; the entry selects the
canonical modes at trace time, so reordering costs nothing per call and the
kernels keep one view of their operands. The fakes follow the declared order:
one symbol per runtime extent, shared wherever extents must agree, and every
stride its own 64-bit symbol (16-byte multiples for the io tensors).
"""

from __future__ import annotations

import inspect

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from frost.engines.sdpa_args import IO_ROLES, OWN_OFFSET_ROLES, Q_ROLES, STATS_ROLES

IO_DTYPES = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16}
_SCALARS = {
    "softmax_scale": Float32,
    "window_left": Int32,
    "window_right": Int32,
    "max_seqlen_q": Int32,
    "max_seqlen_kv": Int32,
    "total_q": Int32,
    "total_kv": Int32,
    "stream": cuda.CUstream,
}
OFFSET_DTYPES = {"int32": Int32, "int64": cutlass.Int64}


def select_modes(t: cute.Tensor, modes) -> cute.Tensor:
    """The same tensor with its layout's modes picked / reordered (a trace-time view)."""
    return cute.make_tensor(t.iterator, cute.select(t.layout, mode=modes))


def canonical(name: str, t, is_thd: bool):
    """The canonical view of one declared-order argument (trace time only)."""
    if name in IO_ROLES and not is_thd:
        return select_modes(t, [0, 2, 1, 3])  # (B, H, S, D) -> (B, S, H, D)
    if name in STATS_ROLES:
        return select_modes(t, [1, 0] if is_thd else [0, 1, 2])  # drop the unit mode; THD: (H, T)
    return t


def canonical_args(names, args, is_thd: bool) -> dict:
    """The arguments keyed by their contract names (the entry's signature fixes their number), tensors in
    canonical views; optional arguments a flavor does not take are absent."""
    return {n: canonical(n, a, is_thd) for n, a in zip(names, args)}


def ragged_view(name: str, t, named: dict, stats_per_batch: bool):
    """cuDNN's ragged-offset form: a bound (B, H, S, D) io tensor as packed (T, H, D) with its S and H strides
    (T: the plan's token envelope total_q / total_kv, a runtime Int32), ragged Stats, score_max and score_sum_exp
    (B, H, S, 1) as (H, T), per-batch ones as a dense batch's (B, H, S); everything else as frost's packed form
    takes it."""
    if name in IO_ROLES:
        total = named["total_q"] if name in Q_ROLES else named["total_kv"]
        layout = cute.make_layout((total, t.shape[1], t.shape[3]), stride=(t.stride[2], t.stride[1], t.stride[3]))
        return cute.make_tensor(t.iterator, layout)
    if name in STATS_ROLES:
        if stats_per_batch:
            return select_modes(t, [0, 1, 2])
        return cute.make_tensor(
            t.iterator, cute.make_layout((t.shape[1], named["total_q"]), stride=(t.stride[1], t.stride[2]))
        )
    return t


def make_entry(run, names: list[str], is_thd: bool, ragged=None):
    """A @cute.jit host entry with one positional parameter per name; `run(args by name)` inside.

    The compile boundary exports and reloads plain positional functions, so the
    entry advertises exactly this flavor's signature; templates read their
    arguments by contract name, never by position. `ragged`: the params of a ragged-offset
    kernel (`ragged_view`), else None.
    """

    def sdpa_entry(*args):
        if ragged is not None:
            named = dict(zip(names, args))
            run({n: ragged_view(n, a, named, ragged.stats_per_batch) for n, a in named.items()})
        else:
            run(canonical_args(names, args, is_thd))

    sdpa_entry.__signature__ = inspect.Signature(
        [
            inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=_SCALARS.get(n, cute.Tensor))
            for n in names
        ]
    )
    return cute.jit(sdpa_entry)


class FakeArgs:
    """Declared-order fakes for the argument names of sdpa_args; `extra(name)` covers template scratch."""

    def __init__(self, p, extra=None):
        self.p = p
        self.extra = extra
        self._made: dict = {}
        self.batch = cute.sym_int(symbol="batch")
        self.ragged = getattr(p, "ragged", False)
        # ragged: bound (B, H, S, D), each with an S of its own (a packed buffer binds as (B, H, S', D), S' the
        # tokens it holds: the kernels read the tokens through the offsets, never S); scratch keeps the packed
        # extents (total_q / total_kv)
        if p.is_thd:
            self.rows_q, self.rows_kv = cute.sym_int(symbol="total_q"), cute.sym_int(symbol="total_kv")
            self.batch1 = cute.sym_int(symbol="batch_plus_1")
        else:
            self.rows_q, self.rows_kv = cute.sym_int(symbol="seqlen_q"), cute.sym_int(symbol="seqlen_kv")

    def _io(self, rows, heads: int, dim: int):
        st = cute.sym_int64(divisibility=8)
        if self.ragged:
            rows = cute.sym_int()
        if self.p.is_thd and not self.ragged:
            shape, stride = (rows, heads, dim), (st, cute.sym_int64(divisibility=8), 1)
        else:
            shape = (self.batch, heads, rows, dim)
            stride = (st, cute.sym_int64(divisibility=8), cute.sym_int64(divisibility=8), 1)
        return cute.runtime.make_fake_tensor(IO_DTYPES[self.p.dtype], shape, stride, assumed_align=16)

    def _container(self, block_size: int, heads: int, dim: int):
        """A paged cache's K or V container (num_blocks, H, block_size, D): its own block count, the block size a
        plan-time constant, 16-byte multiple strides."""
        stride = (cute.sym_int64(divisibility=8), cute.sym_int64(divisibility=8), cute.sym_int64(divisibility=8), 1)
        return cute.runtime.make_fake_tensor(
            IO_DTYPES[self.p.dtype], (cute.sym_int(), heads, block_size, dim), stride, assumed_align=16
        )

    def bias_rows(self):
        """(S_q, S_kv) of a bias-shaped tensor: the io tensors' own extents (dense), or two symbols (THD, whose
        biases are max_seq_len_q x max_seq_len_kv)."""
        if not self.p.is_thd:
            return self.rows_q, self.rows_kv
        if not hasattr(self, "_bias_rows"):
            self._bias_rows = (cute.sym_int(symbol="bias_rows_q"), cute.sym_int(symbol="bias_rows_kv"))
        return self._bias_rows

    def partial_rows(self):
        """The query rows of a packed batch's split-KV partials: one symbol for O's and the LSE's."""
        if not hasattr(self, "_partial_rows"):
            self._partial_rows = cute.sym_int(symbol="partial_rows")
        return self._partial_rows

    def _bias(self, per_batch: bool, per_head: bool, unit_key: bool = False):
        """A (B or 1, Hq or 1, S_q, S_kv) io-dtype bias or dBias: symbolic strides (any layout), the key stride 1
        with `unit_key`."""
        shape = (self.batch if per_batch else 1, self.p.num_heads_q if per_head else 1, *self.bias_rows())
        stride = (cute.sym_int64(), cute.sym_int64(), cute.sym_int64(), 1 if unit_key else cute.sym_int64())
        return cute.runtime.make_fake_tensor(IO_DTYPES[self.p.dtype], shape, stride, assumed_align=2)

    def _stats(self):
        hq = self.p.num_heads_q
        if self.ragged:
            shape = (self.batch, hq, cute.sym_int(), 1)
        else:
            shape = (self.rows_q, hq, 1) if self.p.is_thd else (self.batch, hq, self.rows_q, 1)
        return cute.runtime.make_fake_tensor(Float32, shape, tuple(cute.sym_int64() for _ in shape), assumed_align=4)

    def compact(self, dtype, shape, align=16):
        order = tuple(range(len(shape) - 1, -1, -1))
        return cute.runtime.make_fake_compact_tensor(dtype, shape, stride_order=order, assumed_align=align)

    def _offsets(self, kind: str):
        """A ragged form's (B+1,) element offsets of dtype `kind` (int32 / int64)."""
        return self.compact(OFFSET_DTYPES[kind], (self.batch1,), align=8 if kind == "int64" else 4)

    def _make(self, name: str):
        p = self.p
        hq, hkv, hv, d, dv = p.num_heads_q, p.num_heads_kv, p.heads_v, p.head_dim, p.head_dim_v
        io = {
            "q": (self.rows_q, hq, d),
            "dq": (self.rows_q, hq, d),
            "o": (self.rows_q, hq, dv),
            "do": (self.rows_q, hq, dv),
            "k": (self.rows_kv, hkv, d),
            "dk": (self.rows_kv, hkv, d),
            "v": (self.rows_kv, hv, dv),
            "dv": (self.rows_kv, hv, dv),
        }
        if name in ("k", "v") and getattr(p, "paged", False):
            return self._container(p.paged_block_k if name == "k" else p.paged_block_v, *io[name][1:])
        if name in io:
            return self._io(*io[name])
        if name in ("k_table", "v_table"):  # int32 (B, 1, max_blocks, 1), any declared strides
            return cute.runtime.make_fake_tensor(
                Int32, (self.batch, 1, cute.sym_int(), 1), tuple(cute.sym_int64() for _ in range(4)), assumed_align=4
            )
        if name in STATS_ROLES:
            return self._stats()
        if name in ("cu_seqlens_q", "cu_seqlens_kv", "lse_offsets"):
            if not self.ragged:
                return self._offsets("int32")
            return self._offsets(
                {
                    "cu_seqlens_q": p.offset_dtype_q,
                    "cu_seqlens_kv": p.offset_dtype_kv,
                    "lse_offsets": p.offset_dtype_lse,
                }[name]
            )
        if name.endswith("_offsets") and name[: -len("_offsets")] in OWN_OFFSET_ROLES:
            return self._offsets(dict((r, k) for r, _, k in p.own_offsets)[name[: -len("_offsets")]])
        if name in ("seqused_q", "seqused_kv"):
            return self.compact(Int32, (self.batch,), align=4)
        if name in ("sinks", "dsinks"):
            return self.compact(Float32, (hq,), align=4)
        if name == "bias":
            return self._bias(p.bias_per_batch, p.bias_per_head, unit_key=not p.bias_key_strided)
        if name == "block_mask":  # uint8 (B, Hq, q tiles, key-tile bytes), any declared strides
            return cute.runtime.make_fake_tensor(
                cutlass.Uint8,
                (self.batch, p.num_heads_q, cute.sym_int(), cute.sym_int()),
                tuple(cute.sym_int64() for _ in range(4)),
                assumed_align=1,
            )
        if name == "dbias":  # the main kernel's (the bias's dims) or, from its accumulator, the dQ convert's
            if getattr(p, "dbias_accum", False):  # the accumulator's dims less the copies it sums
                return self._bias(
                    p.dbias_accum_per_batch and not p.dbias_sum_batch, p.dbias_accum_per_head and not p.dbias_sum_heads
                )
            return self._bias(p.bias_per_batch, p.bias_per_head)
        if name in ("o_partial", "lse_partial", "max_partial"):  # split-KV partials: compact fp32 workspace views
            # packed batches keep a dense batch's per-sequence rows (max_seq_len_q of them, a runtime extent)
            rows = (p.num_splits, self.batch, hq, self.partial_rows() if p.is_thd else self.rows_q)
            return self.compact(Float32, rows + (dv,) if name == "o_partial" else rows, align=16)
        if name == "stream":
            return cute.runtime.make_fake_stream()
        if name in _SCALARS:
            return _SCALARS[name](1.0 if name == "softmax_scale" else 0)
        if self.extra is not None:
            return self.extra(self, name)
        raise KeyError(f"no fake argument for {name!r}")

    def get(self, name: str):
        if name not in self._made:
            self._made[name] = self._make(name)
        return self._made[name]

    def all(self, names) -> list:
        return [self.get(n) for n in names]
