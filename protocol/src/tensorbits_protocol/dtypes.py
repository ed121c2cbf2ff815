"""The one table of element data types: wire name, element size, NumPy dtype, same-width
unsigned.

The wire names are the Open Inference Protocol's (``FP32``, not DirectML's ``FLOAT32``); the
DirectML spellings are accepted as aliases where a DML tensor description is parsed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

import numpy as np


class DataType(StrEnum):
    """Element data types of the v2 protocol that the bitwise operators use."""

    BOOL = "BOOL"
    UINT8 = "UINT8"
    UINT16 = "UINT16"
    UINT32 = "UINT32"
    UINT64 = "UINT64"
    INT8 = "INT8"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    FP16 = "FP16"
    FP32 = "FP32"
    FP64 = "FP64"


@dataclass(frozen=True, slots=True)
class DataTypeInfo:
    itemsize: int
    numpy: np.dtype[np.generic]
    # The unsigned type of the same width: DML operators act on the stored bits through it.
    bits: np.dtype[np.generic]
    # The type as it travels: little-endian whatever the host (``numpy`` is the host's order).
    wire: np.dtype[np.generic]


def _info(name: str, bits: str) -> DataTypeInfo:
    dtype = np.dtype(name)
    return DataTypeInfo(
        itemsize=dtype.itemsize, numpy=dtype, bits=np.dtype(bits), wire=dtype.newbyteorder("<")
    )


DTYPES: dict[DataType, DataTypeInfo] = {
    DataType.BOOL: _info("bool", "uint8"),
    DataType.UINT8: _info("uint8", "uint8"),
    DataType.UINT16: _info("uint16", "uint16"),
    DataType.UINT32: _info("uint32", "uint32"),
    DataType.UINT64: _info("uint64", "uint64"),
    DataType.INT8: _info("int8", "uint8"),
    DataType.INT16: _info("int16", "uint16"),
    DataType.INT32: _info("int32", "uint32"),
    DataType.INT64: _info("int64", "uint64"),
    DataType.FP16: _info("float16", "uint16"),
    DataType.FP32: _info("float32", "uint32"),
    DataType.FP64: _info("float64", "uint64"),
}

# The data types by wire name: a dict lookup, where ``DataType(name)`` costs a microsecond.
BY_NAME: dict[str, DataType] = {t.value: t for t in DataType}

# DirectML's names for the float types (DML_TENSOR_DATA_TYPE_FLOAT32 ...).
DML_ALIASES: dict[str, DataType] = {
    "FLOAT16": DataType.FP16,
    "FLOAT32": DataType.FP32,
    "FLOAT64": DataType.FP64,
}

_BY_NUMPY: dict[np.dtype[np.generic], DataType] = {info.numpy: dt for dt, info in DTYPES.items()}


def itemsize(datatype: DataType) -> int:
    return DTYPES[datatype].itemsize


def numpy_dtype(datatype: DataType) -> np.dtype[np.generic]:
    return DTYPES[datatype].numpy


def wire_dtype(datatype: DataType) -> np.dtype[np.generic]:
    """The NumPy dtype of a tensor on the wire: little-endian whatever the host."""
    return DTYPES[datatype].wire


def from_numpy(dtype: np.dtype[np.generic] | type) -> DataType:
    """The wire data type of a NumPy dtype; little-endian only, as the wire is."""
    dt = np.dtype(dtype)
    if dt.byteorder == ">":
        dt = dt.newbyteorder("<")
    try:
        return _BY_NUMPY[dt]
    except KeyError:
        allowed = ", ".join(str(np.dtype(i.numpy)) for i in DTYPES.values())
        raise TypeError(f"dtype {dt} has no tensorbits data type (allowed: {allowed})") from None


@lru_cache(maxsize=64)
def parse_datatype(name: str) -> DataType | None:
    """The data type spelled ``name`` (v2 or DirectML spelling), or None when there is none."""
    if name in DML_ALIASES:
        return DML_ALIASES[name]
    try:
        return DataType(name)
    except ValueError:
        return None
