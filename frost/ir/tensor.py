"""Tensor descriptors: declared dims, strides and data type of one graph port."""

from __future__ import annotations

import itertools
import operator

from frost.errors import GraphError
from frost.types import DataType, as_data_type

_uids = itertools.count(1)


def next_uid() -> int:
    """A uid no tensor of this process was given automatically before."""
    return next(_uids)


def compact_strides(dim, order=None) -> tuple[int, ...]:
    """Row-major strides for `dim` (or the order given, fastest dim last in `order`)."""
    order = list(range(len(dim))) if order is None else list(order)
    strides = [0] * len(dim)
    acc = 1
    for axis in reversed(order):
        strides[axis] = acc
        acc *= max(int(dim[axis]), 1)
    return tuple(strides)


class Tensor:
    """A graph port. Methods mirror the cuDNN frontend's tensor handle and return self."""

    def __init__(self, graph, name: str, dim=None, stride=None, data_type=None, *, is_virtual=False):
        self._graph = graph
        self.uid = next(_uids)
        self.uid_chosen = False  # True once the caller set it (tensor(uid=...) or set_uid)
        self.name = name
        self.dim = _ints(dim, "dim", name)
        self.stride = _ints(stride, "stride", name)
        self.data_type = as_data_type(data_type)
        self.is_output = False
        self.is_virtual = is_virtual  # produced by a node; becomes real when set_output(True)
        self.producer = None
        self.ragged_offset = None  # cuDNN's packed form: int32/int64 (B+1, 1, 1, 1) element offsets per batch

    # cuDNN-style setters / getters -------------------------------------------------------
    def set_output(self, value: bool = True) -> "Tensor":
        self.is_output = bool(value)
        return self

    def set_dim(self, dim) -> "Tensor":
        self.dim = _ints(dim, "dim", self.name)
        self._graph._invalidate()
        return self

    def set_stride(self, stride) -> "Tensor":
        self.stride = _ints(stride, "stride", self.name)
        self._graph._invalidate()
        return self

    def set_data_type(self, data_type) -> "Tensor":
        self.data_type = as_data_type(data_type)
        self._graph._invalidate()
        return self

    def set_name(self, name: str) -> "Tensor":
        if not isinstance(name, str) or not name:
            raise GraphError(f"tensor {self.name!r}: set_name takes a non-empty string, got {name!r}")
        self._graph._check_name(self, name)
        self.name = name
        return self

    def set_uid(self, uid: int) -> "Tensor":
        self._graph._set_uid(self, uid)
        return self

    def set_ragged_offset(self, offset: "Tensor") -> "Tensor":
        """cuDNN's packed (ragged) form: `offset` holds each batch's first element, (B+1, 1, 1, 1) int32/int64."""
        if offset is not None:
            if not isinstance(offset, Tensor):
                raise GraphError(
                    f"tensor {self.name!r}: set_ragged_offset takes a tensor from graph.tensor() "
                    f"(int32/int64, dim (B+1, 1, 1, 1)), got {type(offset).__name__}"
                )
            if offset._graph is not self._graph:
                raise GraphError(f"tensor {self.name!r}: ragged offset {offset.name!r} belongs to another graph")
            if offset is self:
                raise GraphError(f"tensor {self.name!r}: a tensor cannot be its own ragged offset")
        self.ragged_offset = offset
        self._graph._invalidate()
        return self

    def get_ragged_offset(self):
        return self.ragged_offset

    def get_is_virtual(self) -> bool:
        return self.is_virtual and not self.is_output

    def get_is_pass_by_value(self) -> bool:
        return False

    def get_dim(self):
        return list(self.dim) if self.dim is not None else None

    def get_stride(self):
        return list(self.stride) if self.stride is not None else None

    def get_data_type(self) -> DataType:
        return self.data_type

    def get_name(self) -> str:
        return self.name

    def get_uid(self) -> int:
        return self.uid

    def get_is_output(self) -> bool:
        return self.is_output

    def __repr__(self) -> str:
        return (
            f"frost.Tensor(name={self.name!r}, dim={self.dim}, stride={self.stride}, data_type={self.data_type.short})"
        )

    # checks -------------------------------------------------------------------------------
    def require_declared(self) -> None:
        if self.dim is None or self.stride is None:
            raise GraphError(
                f"tensor {self.name!r}: dim and stride must be declared (dim={self.dim}, stride={self.stride})"
            )
        if len(self.dim) != len(self.stride):
            raise GraphError(f"tensor {self.name!r}: dim {self.dim} and stride {self.stride} have different ranks")
        if any(d < 0 for d in self.dim):
            raise GraphError(f"tensor {self.name!r}: negative extent in dim {self.dim}")
        if any(s < 0 for s in self.stride):
            raise GraphError(f"tensor {self.name!r}: negative stride in {self.stride} (dim {self.dim})")
        if self.data_type is DataType.NOT_SET:
            raise GraphError(f"tensor {self.name!r}: data_type is not set")
        if _overlaps(self.dim, self.stride):
            raise GraphError(
                f"tensor {self.name!r}: strides {self.stride} make elements of dim {self.dim} "
                f"overlap (two indices address one element)"
            )


def _ints(values, what: str, name):
    """A tuple of ints from a sequence of integers (a float or a string is a declaration error)."""
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise GraphError(f"tensor {name!r}: {what} must be a sequence of ints, got {values!r}")
    try:
        return tuple(operator.index(v) for v in values)
    except TypeError:
        raise GraphError(f"tensor {name!r}: {what} must be a sequence of ints, got {values!r}") from None


def _overlaps(dim, stride) -> bool:
    """True when two distinct indices map to one address (ignoring size-1 dims)."""
    pairs = sorted((s, d) for d, s in zip(dim, stride) if d > 1)
    span = 1
    for s, d in pairs:
        if s < span:
            return True
        span = s * d
    return False
