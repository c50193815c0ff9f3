"""frost.Graph: the public graph, in the cuDNN frontend pygraph vocabulary.

It composes the layers below: declarations and validation (frost.ir), ranking and
plan building (frost.lowering), binding at execute (frost.runtime) and saved plans
(frost.plans). Those load on first use, which keeps `import frost` cheap.
"""

from __future__ import annotations

from typing import Optional

from frost.errors import GraphError, NotSupportedError
from frost.ir.graph import OpGraph
from frost.runtime.context import launch_stream


class Graph(OpGraph):
    """Declare tensors and one SDPA node, validate, build plans, execute.

    `target` (a frost Target) is a frost addition for planning against another
    device (tests use fake targets); by default the current CUDA device, or the
    CPU when there is none.
    """

    def __init__(
        self,
        io_data_type=None,
        intermediate_data_type=None,
        compute_data_type=None,
        name: str = "frost_graph",
        target=None,
        handle=None,
        sm_count=None,
        sm_version=None,
        kernel_cache=None,
        device_property=None,
        is_dynamic_shape_enabled: bool = False,
        is_override_shape_enabled: bool = False,
    ):
        if not isinstance(name, str):
            raise GraphError(f"Graph(): name must be a string, got {name!r}")
        super().__init__(io_data_type, intermediate_data_type, compute_data_type, name or "frost_graph")
        for key, value in (("device_property", device_property),):
            if value is not None:
                raise GraphError(
                    f"Graph {self.name!r}: {key} is not served; frost plans for the device it finds, "
                    f"for sm_version=..., or for target=..."
                )
        for key, value in (
            ("is_dynamic_shape_enabled", is_dynamic_shape_enabled),
            ("is_override_shape_enabled", is_override_shape_enabled),
        ):
            if value is not False:
                raise GraphError(
                    f"Graph {self.name!r}: {key}={value!r} is not served; a dense frost plan binds its "
                    f"declared dims, a packed one any token count up to its envelope"
                )
        if handle is not None:
            from frost.runtime.context import as_handle

            handle = as_handle(handle)
        self.handle = handle
        self.kernel_cache = kernel_cache  # cuDNN's kernel cache object; frost keeps its own persistent cache
        self._target = _target_for(target, sm_version, sm_count)
        self._ranking = None
        self._ranked_for = None  # the (engine, knobs) of the ranking
        self.plan = None

    def _invalidate(self) -> None:
        super()._invalidate()
        self._ranking = None
        self.plan = None

    def validate(self) -> "Graph":
        """The declaration's checks (GraphError), then, as cuDNN's validate() does, whether any engine serves the
        graph on its target: NotSupportedError (cuDNN's cudnnGraphNotSupportedError) lists every engine's reason
        when none does. The reference engine, never chosen silently on a GPU, still builds by name after it."""
        super().validate()
        self._ranking = None  # the facts are new: rank them (create_execution_plans then reuses the ranking)
        self.check_support()
        return self

    # planning -----------------------------------------------------------------------------
    @property
    def target(self):
        if self._target is None:
            from frost.target import discover_target

            self._target = discover_target()
        return self._target

    def create_execution_plans(self, heur_modes=None, engine: Optional[str] = None, knobs=None) -> "Graph":
        """Rank the engines for this graph. `heur_modes` (cuDNN's list of `heur_mode` members) are accepted;
        frost ranks the same way for every mode."""
        from frost.knobs import Knobs
        from frost.lowering.lower import rank

        _check_heur_modes(heur_modes)
        self.build_operation_graph()
        if isinstance(knobs, Knobs):
            self._knobs = knobs
        else:
            try:
                self._knobs = Knobs(**(knobs or {}))
            except (TypeError, ValueError) as e:  # pydantic's ValidationError is a ValueError
                raise GraphError(
                    f"bad knobs {knobs!r}; known knobs: {sorted(Knobs.model_fields)} (ints and bools): {e}"
                ) from None
        if self._ranking is None or self._ranked_for != (engine, self._knobs):  # validate() may have ranked
            self._ranking = rank(self.facts, self.target, self._knobs, engine)
            self._ranked_for = (engine, self._knobs)
        return self

    def check_support(self) -> "Graph":
        from frost.lowering.lower import describe

        if self._ranking is None:
            self.create_execution_plans()
        if not self._ranking.accepted:
            raise NotSupportedError(describe(self.facts) + f" on {self.target.name}", self._ranking.declines)
        return self

    def build(self, heur_modes=None) -> "Graph":
        """cuDNN's one-call build: validate, rank (heur_modes as in create_execution_plans), check, build."""
        self.validate()
        self.create_execution_plans(heur_modes)
        self.check_support()
        return self.build_plans()

    def get_execution_plan_count(self) -> int:
        """How many engines accept this graph (cuDNN's count of candidate plans)."""
        return len(self.available_engines())

    def build_plans(self, policy=None, engine: Optional[str] = None, knobs=None) -> "Graph":
        """Rank the engines and compile the best (or the one named). Compiles at plan time only.

        `policy` is cuDNN's `build_plan_policy` (HEURISTICS_CHOICE or ALL): frost compiles the best
        accepted engine under either, as every accepted engine computes the same attention.
        """
        from frost.lowering.lower import build_plan
        from frost.runtime.binding import Binder, ragged_specs
        from frost.runtime.device import DeviceGuard, plan_device
        from frost.types import build_plan_policy, enum_name

        if policy is not None:
            enum_name(policy, build_plan_policy, "build_plans(policy)")

        if self._ranking is None or engine is not None or knobs is not None:
            self.create_execution_plans(engine=engine, knobs=knobs)
        self.check_support()
        self.plan = build_plan(self.facts, self.target, self._knobs, ranking=self._ranking)
        device = plan_device(self.target)
        self._binder = Binder(
            self._roles(),
            vector_bytes=getattr(self.plan.adapter, "vector_bytes", 1),
            is_thd=self.facts.is_thd and self.facts.ragged is None,
            wants_cuda=not self.target.is_cpu,
            engine=self.plan.engine_name,
            workspace_size=self.plan.workspace_size,
            ragged=ragged_specs(self.facts, self.node),
            device=device,
        )
        self._guard = DeviceGuard(device)
        return self

    def save_plan(self, path):
        """Write the built plan and its compiled kernels to one file (frost addition); returns the path."""
        from frost.plans.plan_io import save_plan

        return save_plan(self, path)

    def load_plan(self, path) -> "Graph":
        """Build the plan saved in `path` without compiling (frost addition).

        The graph must declare what the saved one did; a PlanFileError (a GraphError)
        names what differs. A file from another frost build or arch loads too: its
        kernels then compile, with a PlanFileWarning.
        """
        from frost.plans.plan_io import load_plan

        return load_plan(self, path)

    def available_engines(self) -> list[str]:
        """Engines that accept this graph on this machine, best first."""
        if self._ranking is None:
            self.create_execution_plans()
        return [row.name for row, _ in self._ranking.accepted]

    def declines(self) -> list[tuple[str, str]]:
        """(engine, reason) for every engine that declined this graph."""
        if self._ranking is None:
            self.create_execution_plans()
        return list(self._ranking.declines)

    @property
    def engine_name(self) -> Optional[str]:
        return self.plan.engine_name if self.plan is not None else None

    def get_workspace_size(self) -> int:
        self._require_plan()
        return self.plan.workspace_size

    def _require_plan(self) -> None:
        if self.plan is None:
            raise GraphError(f"graph {self.name!r} has no plan; call build_plans() first")

    # execution ----------------------------------------------------------------------------
    def execute(self, variant_pack: dict, workspace=None, handle=None, context=None) -> None:
        """Bind tensors and launch. Never copies, allocates or syncs.

        The third argument (positional, `handle=` or `context=`) is a handle from `create_handle()` (its
        stream, as `set_stream` left it) or a `frost.ExecutionContext` (its stream); without one, the graph's
        own handle, else torch's current stream.
        """
        plan = self.plan
        if plan is None:
            self._require_plan()
        if context is not None:
            if handle is not None:
                raise TypeError("execute: pass a handle or a context, not both")
            handle = context
        elif handle is None:
            handle = self.handle
        # straight to the adapter (under the plan's device): each Python frame on this path costs ~0.1 us
        bound = self._binder.bind(variant_pack, workspace)
        guard = self._guard
        if guard.index is None:
            plan.adapter.execute(bound, workspace, None if handle is None else launch_stream(handle))
        else:
            guard.run(plan.adapter.execute, bound, workspace, None if handle is None else launch_stream(handle))

    def length_check(self):
        """A frost addition: the opt-in device check of this graph's lengths and offsets (docs/lengths.md).

            check = g.length_check()               # after build_plans(); compiles the check kernel
            check(variant_pack, flag)              # flag: one int32 of yours; 0, or the rules broken

        It launches on execute's stream, reads nothing on the host and allocates nothing; the default execute
        path never runs it (the kernels clamp bad values instead)."""
        from frost.adapters.length_check import LengthCheck

        self._require_plan()
        return LengthCheck(self.facts, self._roles(), self.target, self.handle)

    def executor(self, ports):
        """A frost addition: this graph's plan executed with tensors given positionally, in the order of
        `ports` (tensor handles, uids or names; every tensor an execute binds, once each).

            run = g.executor((q, k, v, o, stats))
            run((q_t, k_t, v_t, o_t, lse_t), workspace)       # == g.execute({q: q_t, ...}, workspace)

        `run(tensors, workspace, handle)` makes every check of `execute` (the same errors) without a
        variant pack per call; `run.launch(...)` checks only devices and alignment, for callers whose cache
        key holds each tensor's dtype, dims and strides (see `frost/runtime/executor.py`).
        """
        from frost.runtime.executor import Executor

        return Executor(self, ports)


def _check_heur_modes(heur_modes) -> None:
    from frost.types import enum_name, heur_mode

    if heur_modes is None:
        return
    modes = [heur_modes] if not isinstance(heur_modes, (list, tuple)) else heur_modes
    for m in modes:
        enum_name(m, heur_mode, "create_execution_plans(heur_modes)")


def _target_record(target):
    """A Target record from a record or the name of a fake target ("H200"); anything else says what a target is."""
    from frost.target import FAKE_TARGETS, Target

    if isinstance(target, Target):
        return target
    if isinstance(target, str):
        by_name = {k.lower(): v for k, v in FAKE_TARGETS.items()}
        found = by_name.get(target.lower().replace(" ", "").replace("-", ""))
        if found is not None:
            return found
    raise GraphError(
        f"Graph(target={target!r}): a target is the device record frost plans for: "
        f"frost.target.discover_target() for this machine's GPU (the default), "
        f"frost.target.fake_target(name) or just the name for a device you do not have "
        f"({', '.join(sorted(FAKE_TARGETS))}), or a record of your own (frost.target.Target)"
    )


def _target_for(target, sm_version, sm_count):
    """The planning target: `target`, else the device (or a fake one of cuDNN's `sm_version`), with `sm_count`."""
    if target is not None and sm_version is not None:
        raise GraphError("Graph(): pass target= or sm_version=, not both")
    if target is not None:
        target = _target_record(target)
    if sm_version is not None:
        if isinstance(sm_version, bool) or not isinstance(sm_version, int) or sm_version < 0:
            raise GraphError(f"Graph(): sm_version must be an int such as 80, 90, 100 or 120, got {sm_version!r}")
        from frost.target import FAKE_TARGETS, discover_target

        cc = divmod(sm_version, 10)
        found = discover_target()  # this device's own number is taken as it is (0 on a machine without a GPU)
        if found.cc != cc and sm_version < 10:
            raise GraphError(f"Graph(): sm_version must be an int such as 80, 90, 100 or 120, got {sm_version!r}")
        if found.cc != cc:
            matches = [t for t in FAKE_TARGETS.values() if t.cc == cc]
            if not matches:
                known = sorted(t.cc[0] * 10 + t.cc[1] for t in FAKE_TARGETS.values())
                raise GraphError(
                    f"Graph(): sm_version={sm_version} is neither this device's ({found.name}) nor one "
                    f"frost has a target record for ({known})"
                )
            found = matches[0]
        target = found
    if sm_count is not None:
        if isinstance(sm_count, bool) or not isinstance(sm_count, int) or sm_count < 1:
            raise GraphError(f"Graph(): sm_count must be a positive int, got {sm_count!r}")
        if target is None:
            from frost.target import discover_target

            target = discover_target()
        target = target.model_copy(update={"sm_count": sm_count})
    return target


class pygraph(Graph):  # noqa: N801
    """cuDNN's `pygraph`, with its constructor's positional order (name first); otherwise frost.Graph."""

    def __init__(
        self,
        name: str = "frost_graph",
        io_data_type=None,
        intermediate_data_type=None,
        compute_data_type=None,
        handle=None,
        sm_count=None,
        sm_version=None,
        kernel_cache=None,
        device_property=None,
        is_dynamic_shape_enabled: bool = False,
        is_override_shape_enabled: bool = False,
        target=None,
    ):
        super().__init__(
            io_data_type,
            intermediate_data_type,
            compute_data_type,
            name,
            target=target,
            handle=handle,
            sm_count=sm_count,
            sm_version=sm_version,
            kernel_cache=kernel_cache,
            device_property=device_property,
            is_dynamic_shape_enabled=is_dynamic_shape_enabled,
            is_override_shape_enabled=is_override_shape_enabled,
        )
