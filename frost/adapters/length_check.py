"""`Graph.length_check()`: the opt-in device check of a graph's lengths and offsets (docs/lengths.md).

Built at plan time from the graph's facts (the check kernel compiles then); each call launches one warp on the
launch stream that writes the rules any batch entry breaks into the caller's int32 flag. Nothing is read on the
host, nothing is allocated, so it is capturable like execute. On the CPU (the reference engine's machines) the
same flag is computed on the host from the same rules (`length_check_params.host_flag`).
"""

from __future__ import annotations

from frost.adapters.views import lengths_view
from frost.engines.common.length_check_params import LengthCheckParams, host_flag
from frost.errors import BindingError, GraphError
from frost.ir.validate import Q_GROUP
from frost.runtime.context import launch_stream, stream_handle

TEMPLATE = "frost.engines.common.length_check"


def check_params(facts) -> LengthCheckParams:
    """The check kernel's params for a graph's facts; GraphError for a graph without device lengths."""
    if facts.ragged is not None:
        dtypes = dict(facts.ragged.offset_dtypes)
        offsets = tuple(
            ("q" if role in Q_GROUP else "kv", stride, dtypes[role]) for role, stride in facts.ragged.token_strides
        )
        return LengthCheckParams(form="ragged", offsets=offsets)
    if facts.is_thd:
        return LengthCheckParams(form="packed")
    if facts.has_padding:
        return LengthCheckParams(form="padded")
    raise GraphError(
        "length_check(): this graph reads no lengths from the device (no padding mask, cu_seq_len or ragged offsets)"
    )


class LengthCheck:
    """One graph's length check: `check(variant_pack, flag, handle=None)` (a handle or context as execute takes;
    without one, the graph's handle, else torch's current stream)."""

    def __init__(self, facts, roles: dict, target, handle=None):
        self.facts, self.target, self.handle = facts, target, handle
        self.p = check_params(facts)
        f = facts
        if self.p.form == "ragged":
            self._len_roles = ("seq_len_q", "seq_len_kv")
            self._off_roles = tuple(f"{role}_ragged_offset" for role, _ in f.ragged.token_strides)
        else:
            self._len_roles = ("cu_seq_len_q", "cu_seq_len_kv") if f.is_thd else ("seq_len_q", "seq_len_kv")
            self._off_roles = ()
        self._ports = {r: roles[r] for r in ("q", "k") + self._len_roles + self._off_roles}
        self._kernel = None
        if not target.is_cpu:
            from frost.compiler.compile import compile_kernel

            self._kernel = compile_kernel(TEMPLATE, self.p, target)

    def _envelope(self, q, k) -> tuple[int, int, int, int]:
        """(env_q, env_kv, max_q, max_kv) of `host_flag`, from the plan and the bound tensors' metadata."""
        f = self.facts
        if self.p.form == "padded":
            return q.shape[2], k.shape[2], q.shape[2], k.shape[2]
        if self.p.form == "packed":
            return q.shape[0], k.shape[0], f.seq_q or q.shape[0], f.seq_kv or k.shape[0]
        most_q = min(q.shape[2], f.seq_q) if f.seq_q else q.shape[2]
        most_kv = min(k.shape[2], f.seq_kv) if f.seq_kv else k.shape[2]
        return f.total_q, f.total_kv, most_q, most_kv

    def __call__(self, variant_pack: dict, flag, handle=None) -> None:
        try:
            t = {role: variant_pack[h] for role, h in self._ports.items()}
        except KeyError as e:
            raise BindingError(f"length_check: the variant pack has no tensor for {e.args[0]!r}") from None
        if str(flag.dtype) != "torch.int32" or flag.numel() != 1:
            raise BindingError(f"length_check: the flag must be one int32, got {tuple(flag.shape)} {flag.dtype}")
        envelope = self._envelope(t["q"], t["k"])
        lens = [lengths_view(t[r]) for r in self._len_roles]
        offs = [t[r].reshape(-1) for r in self._off_roles]
        if self._kernel is None:  # the host: the same rules, the same flag
            value = host_flag(
                self.p, {"q": lens[0].tolist(), "kv": lens[1].tolist()}, [o.tolist() for o in offs], envelope
            )
            flag.view(-1)[0] = value
            return
        handle = self.handle if handle is None else handle
        self._kernel(
            flag.view(-1), *lens, *offs, *envelope, stream_handle(None if handle is None else launch_stream(handle))
        )
