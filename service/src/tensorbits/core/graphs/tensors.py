"""ONNX element types as the family's data types, and constant tensors (initializers and
``Constant`` nodes' values) as read-only NumPy arrays.

A tensor's size is checked against what is left of ``max_initializer_bytes`` from its
dimensions before a byte of its data is copied, and its data must hold exactly that many
elements. Data stored outside the file is refused (the scan already did; this checks the
parsed message again).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from tensorbits.core.graphs.refusals import invalid, too_large
from tensorbits_protocol.dtypes import DataType, itemsize, numpy_dtype, wire_dtype

MAX_RANK = 8  # the family's largest rank (operators.py): no tensor here needs more

TP = onnx.TensorProto
ONNX_TYPES: dict[int, DataType] = {
    TP.BOOL: DataType.BOOL,
    TP.UINT8: DataType.UINT8,
    TP.UINT16: DataType.UINT16,
    TP.UINT32: DataType.UINT32,
    TP.UINT64: DataType.UINT64,
    TP.INT8: DataType.INT8,
    TP.INT16: DataType.INT16,
    TP.INT32: DataType.INT32,
    TP.INT64: DataType.INT64,
    TP.FLOAT16: DataType.FP16,
    TP.FLOAT: DataType.FP32,
    TP.DOUBLE: DataType.FP64,
}
ONNX_TYPE_OF = {datatype: code for code, datatype in ONNX_TYPES.items()}

# Which typed list holds the values of each type when raw_data is not used (onnx.proto):
# the types not named here (the narrower ones, INT32, and FP16 as its bits) use int32_data.
_WIDE_LISTS = {
    DataType.FP32: "float_data",
    DataType.INT64: "int64_data",
    DataType.UINT32: "uint64_data",
    DataType.UINT64: "uint64_data",
    DataType.FP64: "double_data",
}
# Each list with the type its values are read as before the range check, in the order a refusal
# looks for values stored in another list than their type's.
_READ_AS: dict[str, np.dtype[Any]] = {
    "float_data": np.dtype(np.float32),
    "int32_data": np.dtype(np.int64),
    "int64_data": np.dtype(np.int64),
    "uint64_data": np.dtype(np.uint64),
    "double_data": np.dtype(np.float64),
}


def onnx_datatype(code: int, field: str) -> DataType:
    """The family's data type of ONNX element type ``code``."""
    datatype = ONNX_TYPES.get(code)
    if datatype is None:
        name = onnx.TensorProto.DataType.Name(code) if code in TP.DataType.values() else code
        allowed = ", ".join(str(t) for t in ONNX_TYPES.values())
        raise invalid(field, "datatype", f"element type {name} is not taken (allowed: {allowed})")
    return datatype


class ConstantBudget:
    """What is left of ``max_initializer_bytes`` while the constant tensors are read."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.used = 0

    def take(self, nbytes: int, field: str) -> None:
        self.used += nbytes
        if self.used > self.bound:
            raise too_large(
                field,
                "max_initializer_bytes",
                f"the constant tensors hold at least {self.used} bytes",
                self.bound,
            )


def tensor_array(
    tensor: onnx.TensorProto, field: str, budget: ConstantBudget
) -> np.ndarray[Any, Any]:
    """The tensor's values as a read-only, C-contiguous array of its own type and shape."""
    if tensor.data_location == TP.EXTERNAL or len(tensor.external_data):
        raise invalid(field, "external_data", "tensor data outside the file is not taken")
    if tensor.HasField("segment") or len(tensor.string_data):
        raise invalid(field, "initializer_form", "segments and strings are not taken")
    datatype = onnx_datatype(tensor.data_type, field)
    dims = tuple(int(d) for d in tensor.dims)
    if len(dims) > MAX_RANK:
        raise invalid(field, "rank", f"rank {len(dims)} (allowed: 0 to {MAX_RANK})")
    if any(d < 0 for d in dims):
        raise invalid(field, "shape", f"dimensions {list(dims)} hold a negative size")
    count = 1
    for size in dims:
        count *= size
        if count * itemsize(datatype) > budget.bound:
            break
    nbytes = count * itemsize(datatype)
    budget.take(nbytes, field)
    if tensor.HasField("raw_data"):
        values = _from_raw(tensor.raw_data, datatype, nbytes, field)
    else:
        values = _from_list(tensor, datatype, count, field)
    array = values.reshape(dims)
    array.setflags(write=False)
    return array


def _from_raw(raw: bytes, datatype: DataType, nbytes: int, field: str) -> np.ndarray[Any, Any]:
    if len(raw) != nbytes:
        raise invalid(
            field,
            "initializer_size",
            f"raw_data holds {len(raw)} bytes, its dimensions and type {datatype} need {nbytes}",
        )
    if datatype is DataType.BOOL:
        stored = np.frombuffer(raw, np.uint8)
        if stored.size and int(stored.max()) > 1:
            raise invalid(field, "initializer_value", "a BOOL value other than 0 or 1")
    # Little-endian on the wire: a copy in the host's order, which the array owns.
    return np.frombuffer(raw, wire_dtype(datatype)).astype(numpy_dtype(datatype))


def _from_list(
    tensor: onnx.TensorProto, datatype: DataType, count: int, field: str
) -> np.ndarray[Any, Any]:
    list_name = _WIDE_LISTS.get(datatype, "int32_data")
    for other in _READ_AS:
        if other != list_name and len(getattr(tensor, other)):
            raise invalid(
                field,
                "initializer_form",
                f"{datatype} values stored in {other} (onnx: {list_name})",
            )
    values = np.array(getattr(tensor, list_name), dtype=_READ_AS[list_name])
    if values.size != count:
        raise invalid(
            field,
            "initializer_size",
            f"{list_name} holds {values.size} values, its dimensions need {count}",
        )
    if datatype in (DataType.FP32, DataType.FP64):
        return values.astype(numpy_dtype(datatype))
    target = np.dtype(np.uint16) if datatype is DataType.FP16 else numpy_dtype(datatype)
    if datatype is DataType.BOOL:
        low, high = 0, 1
    else:
        limits = np.iinfo(target.str)  # by name: iinfo's stubs take integer dtypes only
        low, high = int(limits.min), int(limits.max)
    if values.size and (values.min() < low or values.max() > high):
        raise invalid(field, "initializer_value", f"a value outside {datatype}'s range")
    return values.astype(target).view(numpy_dtype(datatype))
