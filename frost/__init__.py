"""frost: a graph-API attention engine whose CuTe DSL kernels compile at plan time.

Importing frost is cheap: cutlass and kernel modules load lazily.
"""
from frost import cache
from frost.errors import (BindingError, EngineDecline, FrostError, GraphError, NotSupportedError,
                          PlanDuringCaptureError, PlanFileError, PlanFileWarning, TemplateParamsError,
                          UnsupportedArgumentError, WorkspaceError)
from frost.graph import Graph
from frost.ir.tensor import Tensor
from frost.knobs import Knobs
from frost.runtime.context import ExecutionContext
from frost.types import DataType
from frost.version import __version__

data_type = DataType  # cuDNN-style alias: frost.data_type.BFLOAT16


__all__ = ["Graph", "Tensor", "DataType", "data_type", "ExecutionContext", "Knobs", "FrostError", "GraphError",
           "BindingError", "WorkspaceError", "EngineDecline", "NotSupportedError", "TemplateParamsError",
           "PlanFileError", "PlanFileWarning", "UnsupportedArgumentError", "PlanDuringCaptureError", "cache",
           "precompile", "save_plan", "load_plan", "__version__"]


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
