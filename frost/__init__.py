"""frost: a graph-API attention engine whose CuTe DSL kernels compile at plan time.

Importing frost is cheap: cutlass and kernel modules load lazily.
"""

from frost import cache
from frost.errors import (
    BindingError,
    EngineDecline,
    FrostError,
    GraphError,
    GraphNotSupportedError,
    NotSupportedError,
    PlanDuringCaptureError,
    PlanFileError,
    PlanFileWarning,
    TemplateParamsError,
    UnsupportedArgumentError,
    WorkspaceError,
    cudnnGraphNotSupportedError,
)
from frost.engines.common.length_check_params import length_check_errors
from frost.graph import Graph, pygraph
from frost.ir.tensor import Tensor
from frost.knobs import Knobs
from frost.runtime.context import ExecutionContext, Handle, create_handle, destroy_handle, get_stream, set_stream
from frost.types import (
    DataType,
    attention_implementation,
    build_plan_policy,
    diagonal_alignment,
    heur_mode,
    tensor_reordering,
)
from frost.version import __version__

data_type = DataType  # cuDNN-style alias: frost.data_type.BFLOAT16
tensor = Tensor  # cuDNN's name of the tensor handle class

#: the cuDNN release whose SDPA graph vocabulary frost follows; version gates in cuDNN programs compare with it.
#: 9.20.0: the first release whose Python SDPA declares every combination of Stats, score_max and score_sum_exp
#: (frost serves each on its own), after the unified implementation (9.13.1), block masks and -inf Stats in padded
#: rows (9.14.0). What frost declines in that vocabulary (fp8, dropout outside the cuDNN engine, paged caches in
#: blocks under 64 rows on the DSL engines) it declines with a reason instead of a version gate: docs/porting.md
#: lists it.
CUDNN_VOCABULARY_VERSION = 92000


def backend_version() -> int:
    """cuDNN's backend_version(): the cuDNN release (major*10000 + minor*100 + patch) whose SDPA graph
    vocabulary frost accepts, so version gates in cuDNN programs take the branch of the keywords frost takes.
    frost's own version is frost.__version__."""
    return CUDNN_VOCABULARY_VERSION


def backend_version_string() -> str:
    v = CUDNN_VOCABULARY_VERSION
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


__all__ = [
    "Graph",
    "Tensor",
    "DataType",
    "data_type",
    "ExecutionContext",
    "Knobs",
    "FrostError",
    "GraphError",
    "BindingError",
    "WorkspaceError",
    "EngineDecline",
    "NotSupportedError",
    "GraphNotSupportedError",
    "TemplateParamsError",
    "PlanFileError",
    "PlanFileWarning",
    "UnsupportedArgumentError",
    "PlanDuringCaptureError",
    "cache",
    "precompile",
    "save_plan",
    "load_plan",
    "length_check_errors",
    "__version__",
    # the cuDNN frontend's names: `import frost as cudnn` runs cuDNN's SDPA graph programs
    "pygraph",
    "tensor",
    "heur_mode",
    "build_plan_policy",
    "diagonal_alignment",
    "attention_implementation",
    "tensor_reordering",
    "Handle",
    "create_handle",
    "set_stream",
    "get_stream",
    "destroy_handle",
    "backend_version",
    "backend_version_string",
    "cudnnGraphNotSupportedError",
]


def precompile(*args, **kwargs):
    """Compile many kernels ahead of time in worker processes (see frost.plans.precompile)."""
    from frost.plans.precompile import precompile as _precompile

    return _precompile(*args, **kwargs)


def save_plan(graph, path):
    """Write a graph's built plan and its compiled kernels to one file (see Graph.save_plan)."""
    return graph.save_plan(path)


def load_plan(path, graph):
    """Build `graph`'s plan from a file written by save_plan, without compiling (see Graph.load_plan)."""
    return graph.load_plan(path)
