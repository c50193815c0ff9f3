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
    UINT8 = "uint8"
    BOOLEAN = "bool"
    NOT_SET = "not_set"

    @property
    def short(self) -> str:
        return self.value

    @property
    def itemsize(self) -> int:
        return {"fp16": 2, "bf16": 2, "fp32": 4, "fp64": 8, "int32": 4, "int64": 8, "uint8": 1,
                "bool": 1}.get(self.value, 0)

    def to_torch(self):
        import torch

        return {DataType.HALF: torch.float16, DataType.BFLOAT16: torch.bfloat16, DataType.FLOAT: torch.float32,
                DataType.DOUBLE: torch.float64, DataType.INT32: torch.int32, DataType.INT64: torch.int64,
                DataType.UINT8: torch.uint8, DataType.BOOLEAN: torch.bool}[self]


_ALIASES = {
    "half": DataType.HALF, "float16": DataType.HALF, "fp16": DataType.HALF,
    "bfloat16": DataType.BFLOAT16, "bf16": DataType.BFLOAT16,
    "float": DataType.FLOAT, "float32": DataType.FLOAT, "fp32": DataType.FLOAT,
    "double": DataType.DOUBLE, "float64": DataType.DOUBLE, "fp64": DataType.DOUBLE,
    "int32": DataType.INT32, "int64": DataType.INT64, "uint8": DataType.UINT8, "bool": DataType.BOOLEAN,
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

        raise GraphError(f"unknown data type {x!r}; use frost.DataType, a torch dtype or one of "
                         f"{sorted(_ALIASES)}") from None
