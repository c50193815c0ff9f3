"""The cuDNN engine: `SdpaFwdCudnn` / `SdpaBwdCudnn`, the cuDNN library through nvidia-cudnn-frontend.

Behind the same contract as the DSL adapters. At plan time the adapter lowers its facts to a
`CudnnSdpaCall` (`cudnn_lowering.py`, pure Python), replays it against `cudnn.pygraph`, asks cuDNN
for support (a refusal is an `EngineDecline` carrying cuDNN's message), builds an execution plan and
keeps it with cuDNN's workspace size, which `scratch_workspace_bytes()` reports so the caller's
workspace covers it. Execute looks up the cuDNN handle of the launch stream, binds the bound tensors'
pointers and launches: no allocation, no fill, no device-to-host read.

Handles: one cuDNN handle per (device, stream), created and set to its stream once, then cached for
the process (`cudnnSetStream` is never called per execute). Planning creates the handle of the
current stream; the first execute on another stream creates that stream's handle (host work, once);
each plan keeps the handles it launched with by stream, with the path that stream's executes take (one dict
lookup per execute).

Packed (THD) graphs: cuDNN serves them in its ragged form (see `cudnn_lowering.py`). Its per-batch lengths
and ragged offsets are derived from `cu_seq_len_q/kv` on the launch stream by frost's ragged-offsets kernel
(`frost/engines/common/ragged_offsets.py`, compiled at plan time) into scratch carved after cuDNN's own
workspace, then the cuDNN graph runs: no host read, no allocation, and a captured execute replays with new
lengths. The graph is built for the declared batch B (cu_seq_len's (B+1,)), S = max_seq_len_q/kv and the
declared token totals; a batch of fewer sequences passes empty ones.

The cuDNN library's own engines only: nvidia-cudnn-frontend 1.32's `pygraph` also ranks Python engines of its
own (CuTe DSL kernels it ships) into the plan list; they are deselected before the plans are built, so this
engine runs what torch's cuDNN SDPA backend runs. Execute hands the bound tensors' device pointers to the
backend's raw-pointer entry where the binding has one (`RawLaunch`: the pointers in the backend's own operand
order, one call), else to `pygraph.execute` in the plan's operand order (`tensor_uids=`), falling back once,
with a warning, to the mapping form if this binding refuses the ordered one. The binder has checked every
tensor against the declarations the cuDNN graph was built from, so the binding's own checks of the same facts
are not repeated per call.

nvidia-cudnn-frontend is an optional extra (`pip install 'frost[cudnn]'`) imported here lazily, so
`import frost` and planning never need it; without it the engine declines naming the package.
"""

from __future__ import annotations

import itertools
import operator
import threading
from array import array
from typing import NamedTuple, Optional

from frost.adapters.base import SdpaBwdAdapter, SdpaFwdAdapter
from frost.adapters.cudnn_lowering import CudnnSdpaCall, CudnnUnsupported, lower_cudnn_sdpa
from frost.engines.common.ragged_offsets_params import scratch_buffers
from frost.runtime.context import stream_handle
from frost.runtime.workspace import CarvedViews, align_up, layout_bytes, layout_offsets

#: frost's kernel that derives cuDNN's ragged lengths and offsets from cu_seq_len (packed graphs)
RAGGED_TEMPLATE = "frost.engines.common.ragged_offsets"

CUDNN_MISSING = "nvidia-cudnn-frontend is not installed (pip install 'frost[cudnn]')"
FAKE_TARGET = (
    "plans only for the device it runs on (cuDNN picks its kernels from the live device); this target is a fake record"
)


#: the oldest nvidia-cudnn-frontend whose Python API this engine speaks (the pure-Python `pygraph`, `cudnn.Handle`,
#: `generate_stats`, `execute(..., tensor_uids=)`); an older binding is a decline naming its version
MIN_FRONTEND = (1, 32)


def frontend_version(text: str) -> tuple:
    """(major, minor) of a version string such as '1.32.0' or '1.32.0.dev1'; () when it has none."""
    parts = []
    for piece in str(text).split(".")[:2]:
        digits = "".join(itertools.takewhile(str.isdigit, piece))
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) if len(parts) == 2 else ()


def cudnn_missing_reason() -> Optional[str]:
    """None when the cuDNN frontend's Python binding imports and is recent enough, else the decline reason."""
    try:
        import cudnn
    except ModuleNotFoundError:
        return CUDNN_MISSING
    except Exception as e:  # the binding is there but cannot load (no libcudnn, a broken build)
        return f"nvidia-cudnn-frontend is installed but does not import: {type(e).__name__}: {e}"
    version = getattr(cudnn, "__version__", "")
    if frontend_version(version) < MIN_FRONTEND:
        return (
            f"nvidia-cudnn-frontend {version or '(no version)'} is installed; the cuDNN engine needs "
            f"{'.'.join(map(str, MIN_FRONTEND))} or later (pip install 'frost[cudnn]')"
        )
    return None


def _cudnn():
    import cudnn

    return cudnn


#: keywords of cuDNN's sdpa that older bindings lack, and what they need
NEWER_KEYWORDS = {"block_mask": "cuDNN 9.14's unified SDPA node and a frontend that declares it"}


def binding_takes(op: str, keyword: str) -> bool:
    """Whether the installed binding's `pygraph.<op>` takes `keyword` (True where its signature cannot be read:
    cuDNN's own support check then answers)."""
    import inspect

    try:
        params = inspect.signature(getattr(_cudnn().pygraph, op)).parameters
    except (TypeError, ValueError, AttributeError):
        return True
    return keyword in params or any(p.kind == p.VAR_KEYWORD for p in params.values())


_DTYPES = {"bf16": "BFLOAT16", "fp16": "HALF", "fp32": "FLOAT", "int32": "INT32", "int64": "INT64", "uint8": "UINT8"}
#: first engine id of nvidia-cudnn-frontend's Python engines (`cudnn.engines.engine_ids.PYTHON_ENGINE_ID_BASE`)
PYTHON_ENGINE_ID_BASE = 20_000
#: exception types a binding mismatch raises (a frost bug, never a decline): they propagate out of planning
_BUG_TYPES = (TypeError, AttributeError, KeyError, IndexError, NameError, AssertionError)

# (device index, raw stream) -> cuDNN handle bound to that stream; process-wide, never per execute
_HANDLES: dict = {}
_HANDLES_LOCK = threading.Lock()
# (CudnnSdpaCall, device index) -> Built: one cuDNN build per specialization and device, shared by every frost plan
# of that graph (execute passes its own handle)
_BUILT: dict = {}


class RawLaunch(NamedTuple):
    """The backend's raw-pointer execute of a built plan (`_execute_with_raw_ptrs` of nvidia-cudnn-frontend 1.32's
    lowered graph): the operands' device pointers in the backend's order (ascending uid), one call."""

    execute: object  # (pointer array address, count, workspace pointer, backend handle, plan index) -> None
    roles: tuple  # the role of each operand, in the backend's order
    plan_index: int  # the backend's index of the plan built (-1: its selected one)


class Built(NamedTuple):
    graph: object
    pack_roles: tuple  # ((role, cudnn tensor), ...) of every operand
    workspace: int  # cuDNN's workspace bytes
    uids: Optional[tuple]  # operand uids in `pack_roles` order for `execute(tensor_uids=)`, or None
    raw: Optional[RawLaunch]


def handle_for(device: int, stream: int):
    """The cached cuDNN handle of `stream` on `device` (created and set to the stream on first use)."""
    h = _HANDLES.get((device, stream))
    if h is not None:
        return h
    with _HANDLES_LOCK:
        h = _HANDLES.get((device, stream))
        if h is None:
            import torch

            cudnn = _cudnn()
            with torch.cuda.device(device):
                h = cudnn.create_handle()
                cudnn.set_stream(handle=h, stream=stream)
            _HANDLES[(device, stream)] = h
    return h


def build_cudnn_graph(cudnn, call: CudnnSdpaCall, handle):
    """Replay a lowering record against `cudnn.pygraph`: returns (graph, {role: cudnn tensor})."""
    dt = lambda short: getattr(cudnn.data_type, _DTYPES[short])  # noqa: E731
    g = cudnn.pygraph(
        io_data_type=dt(call.io_dtype),
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        handle=handle,
    )
    ts = {
        t.role: g.tensor(name=t.role, dim=list(t.dim), stride=list(t.stride), data_type=dt(t.dtype))
        for t in call.inputs
    }
    for role, offset in call.ragged:  # the inputs' ragged offsets before the op reads them, the outputs' after
        if role in ts:
            ts[role].set_ragged_offset(ts[offset])
    kw = {}
    for key, value in call.scalar_kwargs:
        kw[key] = getattr(cudnn.diagonal_alignment, value) if key == "diagonal_alignment" else value
    kw.update({key: ts[role] for key, role in call.tensor_kwargs})
    if call.dropout is not None:
        p, seed, offset = call.dropout
        kw["dropout"] = (float(p), ts[seed], ts[offset])
    outs = getattr(g, call.op)(*(ts[r] for r in call.positional), name=f"frost_{call.op}", **kw)
    for spec, t in zip(call.outputs, outs):
        t.set_output(True).set_dim(list(spec.dim)).set_stride(list(spec.stride)).set_data_type(dt(spec.dtype))
        ts[spec.role] = t
    for role in call.output_kwargs:
        ts[role].set_output(True)
    outputs = {spec.role for spec in call.outputs}
    for role, offset in call.ragged:
        if role in outputs:
            ts[role].set_ragged_offset(ts[offset])
    return g, ts


class LibraryHasNoPlan(Exception):
    """Every plan cuDNN's frontend ranked for a graph is one of its own Python engines, none the library's."""


def library_plans_only(g) -> None:
    """Deselect nvidia-cudnn-frontend's own Python engines from `g`'s ranked plans (after create_execution_plans).

    1.32's `pygraph` ranks CuTe DSL engines it ships beside the cuDNN library's engines (ids from
    PYTHON_ENGINE_ID_BASE up) and may put them first; the build walk then skips them, so the plan built is the
    library's. A binding without that plan list (older frontends) has the library's engines only.
    """
    plans = getattr(g, "plans", None)
    if not isinstance(plans, (list, tuple)) or not plans:
        return
    own = [i for i, cfg in enumerate(plans) if getattr(cfg, "engine_id", -1) >= PYTHON_ENGINE_ID_BASE]
    if not own:
        return
    names = sorted({g.get_plan_name_at_index(i).split("[", 1)[0] for i in own})
    if len(own) == len(plans):
        why = getattr(g, "_backend_declined", None)  # the library's own refusal, when the frontend kept it
        raise LibraryHasNoPlan(
            f"the cuDNN library has no engine for this graph (the frontend offers only its own "
            f"Python engines: {', '.join(names)})" + (f"; the library said: {why}" if why else "")
        )
    g.deselect_engines(names)


def ordered_uids(g, ts: dict, roles: tuple):
    """The uids of `roles` in that order when `g.execute` takes operands by position (`tensor_uids=`), else None."""
    import inspect

    try:
        if "tensor_uids" not in inspect.signature(g.execute).parameters:
            return None
        return tuple(int(ts[role].get_uid()) for role in roles)
    except (TypeError, ValueError, AttributeError):
        return None


def raw_launch(g, ts: dict, roles: tuple) -> Optional[RawLaunch]:
    """`g`'s raw-pointer execute when this binding has one and its operands are exactly `roles`, else None.

    It is the call 1.32's `pygraph.execute` makes for a backend plan once it has turned the caller's pack into
    pointers; None (a binding without it, a Python-engine plan, operands bound by the graph itself) keeps
    execute on the binding's public path."""
    try:
        lowered = g._lowered_graph
        execute = lowered._execute_with_raw_ptrs
        lowered._prepare_variant_pack_template()
        order = [int(u) for u in lowered._get_variant_pack_uids_sorted()]
        if g.selected_engine is not None or g._data_bindings:
            return None
        cfg = g._materialize_backend_plan(g._plan_index) if g._plans else None
        index = -1 if cfg is None or cfg.cpp_index is None else int(cfg.cpp_index)
        by_uid = {int(ts[role].get_uid()): role for role in roles}
    except Exception:  # noqa: BLE001 - an optional entry of a private surface: any failure means "not here"
        return None
    if not callable(execute) or len(by_uid) != len(roles) or order != sorted(by_uid):
        return None
    return RawLaunch(execute, tuple(by_uid[u] for u in order), index)


def _pointer_getter(roles: tuple, derived: dict):
    """(bound, workspace address) -> the operands' device pointers: the bound tensors' `data_ptr()`, derived
    operands at their plan-time offsets into the workspace."""
    if not derived:
        get = operator.itemgetter(*roles)
        return lambda bound, ws: [t.data_ptr() for t in get(bound)]
    slots = tuple((role, derived.get(role)) for role in roles)
    return lambda bound, ws: [bound[role].data_ptr() if off is None else ws + off for role, off in slots]


def derived_rows(call: CudnnSdpaCall) -> list:
    """(role, scratch buffer, row, length) of each operand the ragged-offsets kernel writes (packed graphs): the
    lengths' rows (B entries), then the offset arrays' (B+1), as `scratch_buffers` lays them out."""
    b, roles = call.batch, call.derived_roles()
    return [(r, "ragged_lengths", i, b) for i, r in enumerate(roles[:2])] + [
        (r, "ragged_offsets", i, b + 1) for i, r in enumerate(roles[2:])
    ]


class _CudnnAdapter:
    """What the cuDNN forward and backward share (mixed in before the contract class)."""

    vector_bytes = 16  # the rows' stride rule; the binder checks pointer alignment with it
    costly_support_check = True  # asking cuDNN builds its plan: ranking asks only when this engine could win

    def check_support(self, quick: bool = False) -> None:
        """The binding, then the lowering, then (on the live device, unless `quick`) cuDNN's own verdict."""
        reason = cudnn_missing_reason()
        if reason:
            raise self.decline(reason)
        try:
            self.call = lower_cudnn_sdpa(self.facts)
        except CudnnUnsupported as e:
            raise self.decline(e.reason) from None
        for key, _ in self.call.tensor_kwargs:
            if key in NEWER_KEYWORDS and not binding_takes(self.call.op, key):
                raise self.decline(
                    f"this nvidia-cudnn-frontend's {self.call.op} takes no {key} ({NEWER_KEYWORDS[key]})"
                )
        if quick or self.target.is_fake or self.target.is_cpu:
            return  # a record cannot be asked: cuDNN is asked on the device itself (compile declines on a record)
        self._build()

    def _build(self) -> None:
        import torch

        self._device = torch.cuda.current_device()
        key = (self.call, self._device)
        built = _BUILT.get(key)
        if built is None:
            cudnn = _cudnn()
            handle = handle_for(self._device, stream_handle(None))
            try:
                g, ts = build_cudnn_graph(cudnn, self.call, handle)
                g.validate()
                g.build_operation_graph()
                g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
                library_plans_only(g)
                g.check_support()
                g.build_plans()
                ws = int(g.get_workspace_size())
            except _BUG_TYPES:
                raise  # a call this binding does not take: frost's bug, not cuDNN's verdict
            except Exception as e:  # cuDNN's refusal (cudnnGraphNotSupportedError and kin) names the reason
                raise self.decline(f"cuDNN declines this graph: {type(e).__name__}: {e}") from None
            roles = self.call.roles()
            built = _BUILT[key] = Built(
                g, tuple((role, ts[role]) for role in roles), ws, ordered_uids(g, ts, roles), raw_launch(g, ts, roles)
            )
        self._graph, self._pack_roles, self._cudnn_ws, self._uids = (
            built.graph,
            built.pack_roles,
            built.workspace,
            built.uids,
        )
        self._roles = tuple(role for role, _ in self._pack_roles)
        self._handles = {}  # raw stream -> (cuDNN handle, its backend handle or None), kept by this plan
        self._derive_scratch()
        self._raw = built.raw
        self._pointers = None if built.raw is None else _pointer_getter(built.raw.roles, self._derived_at)

    def _derive_scratch(self) -> None:
        """Packed graphs: where the derived lengths and offsets live, after cuDNN's own workspace: their byte
        offsets (the raw path's pointers) and their views as cuDNN declares them (the public paths' tensors,
        carved with the kernel's outputs once per workspace)."""
        call = self.call
        self._derived_at, self._derived_views, self._scratch_bytes = {}, None, 0
        if call.derived is None:
            return
        start = align_up(self._cudnn_ws)
        buffers = scratch_buffers(call.derived, call.batch)
        at = layout_offsets(buffers, start)
        row_bytes = {b.name: b.nbytes // b.shape[0] for b in buffers}
        rows = derived_rows(call)
        self._derived_at = {role: at[name] + i * row_bytes[name] for role, name, i, _ in rows}
        self._derived_views = CarvedViews(
            buffers, start, derive=lambda v: {role: v[name][i, :n].view(n, 1, 1, 1) for role, name, i, n in rows}
        )
        self._scratch_bytes = layout_bytes(buffers)

    def kernel_specs(self) -> list:
        """(template, params) of frost's own kernel: the ragged offsets of a packed graph (none otherwise)."""
        derived = self.call.derived if hasattr(self, "call") else None
        return [(RAGGED_TEMPLATE, derived)] if derived is not None else []

    def compiled_kernels(self) -> list:
        kernel = getattr(self, "_kernel", None)
        return [kernel] if kernel is not None else []

    def compile(self) -> None:
        if not hasattr(self, "call"):
            self.check_support()
        if self.target.is_fake or self.target.is_cpu:
            raise self.decline(FAKE_TARGET)
        if not hasattr(self, "_graph"):
            self._build()
        if self.call.derived is not None:
            from frost.compiler.compile import compile_kernel

            self._kernel = compile_kernel(RAGGED_TEMPLATE, self.call.derived, self.target)
        self.compiled = True

    def scratch_workspace_bytes(self) -> int:
        return align_up(getattr(self, "_cudnn_ws", 0)) + getattr(self, "_scratch_bytes", 0)

    def _handle_of(self, s: int) -> tuple:
        """(cuDNN handle, its backend handle or None) of raw stream `s`, kept by this plan after its first use.
        An execute takes the raw-pointer entry while the plan holds one and the stream has a backend handle."""
        h = handle_for(self._device, s)
        backend = getattr(h, "backend_handle", None)
        entry = self._handles[s] = (h, backend if type(backend) is int else None)
        return entry

    def execute(self, bound: dict, workspace, stream) -> None:
        s = stream_handle(stream)
        h = self._handles.get(s)  # the plan's device, found at plan time
        if h is None:
            h = self._handle_of(s)
        views = self._derived_views
        if views is not None:  # packed: cuDNN's lengths and offsets from cu_seq_len, on this stream
            v = views(workspace)
            self._kernel(
                bound["cu_seq_len_q"],
                bound["cu_seq_len_kv"],
                v["ragged_lengths"],
                v["ragged_offsets"],
                *self.call.envelope,
                s,
            )
        raw = self._raw
        if h[1] is not None and raw is not None:
            ws = workspace.data_ptr() if workspace is not None else 0
            ptrs = array("Q", self._pointers(bound, ws))
            raw.execute(ptrs.buffer_info()[0], len(ptrs), ws if self._cudnn_ws else 0, h[1], raw.plan_index)
            return
        if views is not None:
            bound = {**bound, **v}  # the derived operands, carved as cuDNN declares them
        ws = workspace if self._cudnn_ws else None
        if self._uids is not None:
            try:
                self._graph.execute(tuple([bound[r] for r in self._roles]), ws, handle=h[0], tensor_uids=self._uids)
                return
            except (TypeError, ValueError) as e:
                self._refuse_ordered(e)
        self._graph.execute({t: bound[role] for role, t in self._pack_roles}, ws, handle=h[0])

    def _refuse_ordered(self, e: Exception) -> None:
        """This binding refused the ordered operands: this plan binds by mapping from now on (said once)."""
        import warnings

        self._uids = None
        warnings.warn(
            f"{self.engine_name}: cuDNN refused the ordered variant pack ({type(e).__name__}: {e}); "
            f"binding by mapping instead",
            RuntimeWarning,
            stacklevel=3,
        )


class SdpaFwdCudnn(_CudnnAdapter, SdpaFwdAdapter):
    engine_name = "SdpaFwdCudnn"


class SdpaBwdCudnn(_CudnnAdapter, SdpaBwdAdapter):
    engine_name = "SdpaBwdCudnn"
