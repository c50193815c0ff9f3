"""Positional execution of a built plan: `Graph.executor(ports)` (a frost addition).

A variant pack is a dict built per call and read back through one lookup per declared tensor; a caller
that runs one plan many times (the torch face) knows its tensors' order once. An `Executor` takes them
positionally, in the order of the ports it was made with, and binds them with the plan's `Binder`:

- `ex(tensors, workspace, handle)` checks each tensor as `execute` does (dtype, dims, strides, device,
  alignment; the same errors) and launches;
- `ex.launch(tensors, workspace, handle)` is for a caller whose cache key holds each tensor's dtype, dims
  and strides (keyed on what a checked call accepted, or allocated from such tensors): it checks only
  what differs between tensors of equal metadata, their devices, address alignment and that no output
  shares memory with another tensor (`aliasing.py`), then launches;
  a tensor that fails goes through the full checks (and their errors).

Neither allocates, copies or syncs: the workspace and every output are the caller's.
"""

from __future__ import annotations

from frost.errors import BindingError, GraphError
from frost.runtime.binding import check_thd_totals, matches_spec
from frost.runtime.context import launch_stream
from frost.runtime.workspace import check_workspace


def _port_index(ports: tuple, decl) -> int:
    """Where `decl` is among the ports (each a tensor handle, its uid or its name), or -1."""
    for i, p in enumerate(ports):
        if p is decl:
            return i
    for i, p in enumerate(ports):
        if (type(p) is int and p == decl.uid) or (type(p) is str and p == decl.name):
            return i
    return -1


class Executor:
    """A built graph's plan, executed with tensors given positionally (see the module docstring)."""

    __slots__ = (
        "_graph",
        "_ports",
        "_plan",
        "_binder",
        "_execute",
        "_roles",
        "_specs",
        "_lead",
        "_misalign",
        "_workspace_size",
        "_wants_cuda",
        "_is_thd",
        "_aliasing",
        "_device",
        "_guard",
    )

    def __init__(self, graph, ports):
        self._graph = graph
        self._ports = tuple(ports)
        self._plan = None
        self._refresh()

    def _refresh(self) -> None:
        """(Re)derive everything from the graph's current plan; raises when it has none."""
        g = self._graph
        g._require_plan()
        binder = g._binder
        order = []
        for spec in binder.specs:
            role, decl = spec.role, spec.decl
            i = _port_index(self._ports, decl)
            if i < 0:
                raise GraphError(
                    f"graph {g.name!r}: executor ports {self._port_names()} miss tensor {decl.name!r} "
                    f"({role}); pass every tensor an execute binds"
                )
            order.append((i, spec))
        if len(order) != len(self._ports) or len({i for i, _ in order}) != len(order):
            raise GraphError(
                f"graph {g.name!r}: executor ports {self._port_names()} must name each bound tensor "
                f"once ({', '.join(s.decl.name for s in binder.specs)})"
            )
        order.sort(key=lambda x: x[0])
        specs = tuple(s for _, s in order)
        self._aliasing = binder.alias_guard(specs)  # in port order
        self._specs = specs
        self._roles = tuple(s.role for s in specs)
        self._misalign = tuple(s.misalign for s in specs)
        self._lead = next(i for i, s in enumerate(specs) if s is binder.specs[0])  # whose device all share
        self._binder = binder
        self._execute = g.plan.adapter.execute
        self._workspace_size = binder.workspace_size
        self._wants_cuda = binder.wants_cuda
        self._is_thd = binder.is_thd
        self._device = -1 if binder.device is None else binder.device  # the plan's CUDA device (-1: any)
        self._guard = g._guard
        self._plan = g.plan

    def _port_names(self) -> list:
        return [getattr(p, "name", p) for p in self._ports]

    @property
    def roles(self) -> tuple:
        """The graph role of each positional tensor ("q", "k", "v", "o", "stats", ...)."""
        return self._roles

    def _stream(self, handle):
        if handle is None:
            handle = self._graph.handle
        return None if handle is None else launch_stream(handle)

    def _checked(self, tensors, workspace) -> dict:
        """The bound tensors by role, every check of `execute` applied (its errors raised)."""
        if len(tensors) != len(self._ports):
            raise BindingError(
                f"executor of graph {self._graph.name!r} takes {len(self._ports)} tensors "
                f"({', '.join(self._roles)}), got {len(tensors)}"
            )
        lead = tensors[self._lead]
        try:
            index = lead.get_device()
            device = lead.device
        except AttributeError:
            index = None  # not a tensor: the binder says so
        if index is not None and (index == self._device or self._device < 0) and (index >= 0 or not self._wants_cuda):
            ptrs = [matches_spec(t, spec, index, device) for t, spec in zip(tensors, self._specs)]
            if all(ptrs):
                bound = dict(zip(self._roles, tensors))
                if self._is_thd:
                    check_thd_totals(bound)
                if self._workspace_size:
                    check_workspace(workspace, self._workspace_size, device)
                self._aliasing.fast(ptrs, tensors, workspace)
                return bound
        # a mismatch, or a legal variation the comparison above does not know: the binder's own checks
        return self._binder.bind(dict(zip(self._ports, tensors)), workspace)

    def __call__(self, tensors, workspace=None, handle=None) -> None:
        """Check `tensors` (in port order) as `execute` does, then launch on the handle's (or current) stream."""
        if self._graph.plan is not self._plan:
            self._refresh()
        bound = self._checked(tensors, workspace)
        if self._guard.index is None:
            self._execute(bound, workspace, self._stream(handle))
        else:
            self._guard.run(self._execute, bound, workspace, self._stream(handle))

    def launch(self, tensors, workspace=None, handle=None) -> None:
        """Launch tensors whose dtype, dims and strides the caller has pinned (see the module docstring):
        their devices and alignment are checked here, anything else is the caller's."""
        if self._graph.plan is not self._plan or len(tensors) != len(self._ports):
            return self(tensors, workspace, handle)
        lead = tensors[self._lead]
        index = lead.get_device()
        ptrs = []
        if index >= 0:
            if index != self._device and self._device >= 0:
                return self(tensors, workspace, handle)  # the binder names the device mismatch
            for t, misalign in zip(tensors, self._misalign):
                if t.get_device() != index or (p := t.data_ptr()) & misalign:
                    return self(tensors, workspace, handle)
                ptrs.append(p + 1)
        elif self._wants_cuda:
            return self(tensors, workspace, handle)
        else:  # off the GPU: the device itself (cpu, meta, ...) must agree
            device = lead.device
            for t, misalign in zip(tensors, self._misalign):
                if t.device != device or (p := t.data_ptr()) & misalign:
                    return self(tensors, workspace, handle)
                ptrs.append(p + 1)
        if self._workspace_size:
            check_workspace(workspace, self._workspace_size, lead.device)
        self._aliasing.fast(ptrs, tensors, workspace)  # packed graphs: exact spans (their lengths vary)
        if self._guard.index is None:
            self._execute(dict(zip(self._roles, tensors)), workspace, self._stream(handle))
        else:
            self._guard.run(self._execute, dict(zip(self._roles, tensors)), workspace, self._stream(handle))
