"""frost.Graph: the public graph, in the cuDNN frontend pygraph vocabulary.

It composes the layers below: declarations and validation (frost.ir), ranking and
plan building (frost.lowering), binding at execute (frost.runtime) and saved plans
(frost.plans). Those load on first use, which keeps `import frost` cheap.
"""
from __future__ import annotations

from typing import Optional

from frost.errors import GraphError, NotSupportedError
from frost.ir.graph import OpGraph


class Graph(OpGraph):
    """Declare tensors and one SDPA node, validate, build plans, execute.

    `target` (a frost Target) is a frost addition for planning against another
    device (tests use fake targets); by default the current CUDA device, or the
    CPU when there is none.
    """

    def __init__(self, io_data_type=None, intermediate_data_type=None, compute_data_type=None,
                 name: str = "frost_graph", target=None, handle=None):
        super().__init__(io_data_type, intermediate_data_type, compute_data_type, name)
        self._target = target
        self._ranking = None
        self.plan = None

    def _invalidate(self) -> None:
        super()._invalidate()
        self._ranking = None
        self.plan = None

    # planning -----------------------------------------------------------------------------
    @property
    def target(self):
        if self._target is None:
            from frost.target import discover_target

            self._target = discover_target()
        return self._target

    def create_execution_plans(self, heur_modes=None, engine: Optional[str] = None, knobs=None) -> "Graph":
        from frost.knobs import Knobs
        from frost.lowering.lower import rank

        self.build_operation_graph()
        if isinstance(knobs, Knobs):
            self._knobs = knobs
        else:
            try:
                self._knobs = Knobs(**(knobs or {}))
            except (TypeError, ValueError) as e:  # pydantic's ValidationError is a ValueError
                raise GraphError(f"bad knobs {knobs!r}; known knobs: {sorted(Knobs.model_fields)} "
                                 f"(ints and bools): {e}") from None
        self._ranking = rank(self.facts, self.target, self._knobs, engine)
        return self

    def check_support(self) -> "Graph":
        from frost.lowering.lower import describe

        if self._ranking is None:
            self.create_execution_plans()
        if not self._ranking.accepted:
            raise NotSupportedError(describe(self.facts) + f" on {self.target.name}", self._ranking.declines)
        return self

    def build_plans(self, policy=None, engine: Optional[str] = None, knobs=None) -> "Graph":
        """Rank the engines and compile the best (or the one named). Compiles at plan time only."""
        from frost.lowering.lower import build_plan
        from frost.runtime.binding import Binder

        if self._ranking is None or engine is not None or knobs is not None:
            self.create_execution_plans(engine=engine, knobs=knobs)
        self.check_support()
        self.plan = build_plan(self.facts, self.target, self._knobs, ranking=self._ranking)
        self._binder = Binder(self._roles(), vector_bytes=getattr(self.plan.adapter, "vector_bytes", 1),
                              is_thd=self.facts.is_thd, wants_cuda=not self.target.is_cpu,
                              engine=self.plan.engine_name, workspace_size=self.plan.workspace_size)
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
    def execute(self, variant_pack: dict, workspace=None, context=None, handle=None) -> None:
        """Bind tensors and launch on the context's stream. Never copies, allocates or syncs."""
        plan = self.plan
        if plan is None:
            self._require_plan()
        # straight to the adapter: each Python frame on this path costs ~0.1 us
        plan.adapter.execute(self._binder.bind(variant_pack, workspace), workspace,
                             None if context is None else context.stream)
