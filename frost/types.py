"""Data types: frost's enum, and conversion from torch dtypes and names."""

from __future__ import annotations

import enum


class DataType(enum.Enum):
    HALF = "fp16"
    BFLOAT16 = "bf16"
    FLOAT = "fp32"
    DOUBLE = "fp64"
    INT32 = "int32"
    INT64 = "int64"
    INT8 = "int8"
    UINT8 = "uint8"
    BOOLEAN = "bool"
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"
    NOT_SET = "not_set"

    @property
    def short(self) -> str:
        return self.value

    @property
    def itemsize(self) -> int:
        return {
            "fp16": 2,
            "bf16": 2,
            "fp32": 4,
            "fp64": 8,
            "int32": 4,
            "int64": 8,
            "int8": 1,
            "uint8": 1,
            "bool": 1,
            "fp8_e4m3": 1,
            "fp8_e5m2": 1,
        }.get(self.value, 0)

    def to_torch(self):
        import torch

        return {
            DataType.HALF: torch.float16,
            DataType.BFLOAT16: torch.bfloat16,
            DataType.FLOAT: torch.float32,
            DataType.DOUBLE: torch.float64,
            DataType.INT32: torch.int32,
            DataType.INT64: torch.int64,
            DataType.INT8: torch.int8,
            DataType.UINT8: torch.uint8,
            DataType.BOOLEAN: torch.bool,
            DataType.FP8_E4M3: torch.float8_e4m3fn,
            DataType.FP8_E5M2: torch.float8_e5m2,
        }[self]


_ALIASES = {
    "half": DataType.HALF,
    "float16": DataType.HALF,
    "fp16": DataType.HALF,
    "bfloat16": DataType.BFLOAT16,
    "bf16": DataType.BFLOAT16,
    "float": DataType.FLOAT,
    "float32": DataType.FLOAT,
    "fp32": DataType.FLOAT,
    "double": DataType.DOUBLE,
    "float64": DataType.DOUBLE,
    "fp64": DataType.DOUBLE,
    "int32": DataType.INT32,
    "int64": DataType.INT64,
    "int8": DataType.INT8,
    "uint8": DataType.UINT8,
    "bool": DataType.BOOLEAN,
    "boolean": DataType.BOOLEAN,
    "fp8_e4m3": DataType.FP8_E4M3,
    "float8_e4m3fn": DataType.FP8_E4M3,
    "fp8_e5m2": DataType.FP8_E5M2,
    "float8_e5m2": DataType.FP8_E5M2,
    "not_set": DataType.NOT_SET,
}


def as_data_type(x) -> DataType:
    """Accept a DataType, a torch dtype, or a name ('bf16', 'float32', ...)."""
    if x is None:
        return DataType.NOT_SET
    if isinstance(x, DataType):
        return x
    name = getattr(x, "name", None) if not isinstance(x, str) else x
    if name is None:
        name = str(x)
    name = str(name).lower().replace("torch.", "")
    if name.startswith("data_type."):
        name = name.split(".", 1)[1]
    try:
        return _ALIASES[name]
    except KeyError:
        from frost.errors import GraphError

        raise GraphError(
            f"unknown data type {x!r}; use frost.DataType, a torch dtype or one of {sorted(_ALIASES)}"
        ) from None


# the cuDNN frontend's enums, by the names its Python programs use (cudnn.heur_mode.A, ...)
class heur_mode(enum.Enum):  # noqa: N801
    """Heuristic modes of `create_execution_plans([...])`: frost ranks its engines the same way for each."""

    A = "A"
    B = "B"
    FALLBACK = "FALLBACK"
    OPENSOURCE = "OPENSOURCE"


class build_plan_policy(enum.Enum):  # noqa: N801
    """`build_plans(policy)`: frost compiles the best accepted engine under either policy."""

    HEURISTICS_CHOICE = "HEURISTICS_CHOICE"
    ALL = "ALL"


class diagonal_alignment(enum.Enum):  # noqa: N801
    """Where the mask band's diagonal starts: `sdpa(..., diagonal_alignment=...)`."""

    TOP_LEFT = "TOP_LEFT"
    BOTTOM_RIGHT = "BOTTOM_RIGHT"


class attention_implementation(enum.Enum):  # noqa: N801
    """cuDNN's choice of SDPA backend path; frost's engines serve AUTO."""

    AUTO = "AUTO"
    COMPOSITE = "COMPOSITE"
    UNIFIED = "UNIFIED"


class tensor_reordering(enum.Enum):  # noqa: N801
    """Tensor reorderings; frost serves NONE."""

    NONE = "NONE"
    INT8x32 = "INT8x32"
    F16x16 = "F16x16"
    F8_128x4 = "F8_128x4"


def enum_name(value, enum_cls, what: str) -> str:
    """The member name of `value`: a member of `enum_cls`, or its exact name as a string."""
    if isinstance(value, enum_cls):
        return value.name
    name = getattr(value, "name", value)  # a foreign enum member with the same names (cudnn's own) works too
    if isinstance(name, str) and name in enum_cls.__members__:
        return name
    from frost.errors import GraphError

    raise GraphError(
        f"{what} must be one of {[m for m in enum_cls.__members__]} (frost.{enum_cls.__name__}), got {value!r}"
    )
