"""ONNX files for the graph model tests, built with ``onnx.helper``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

# An IR version every ONNX Runtime of the dev group reads (make_model's default may be newer).
IR_VERSION = 10

ONNX_OF = {
    np.dtype(np.uint8): onnx.TensorProto.UINT8,
    np.dtype(np.uint16): onnx.TensorProto.UINT16,
    np.dtype(np.uint32): onnx.TensorProto.UINT32,
    np.dtype(np.uint64): onnx.TensorProto.UINT64,
    np.dtype(np.int8): onnx.TensorProto.INT8,
    np.dtype(np.int16): onnx.TensorProto.INT16,
    np.dtype(np.int32): onnx.TensorProto.INT32,
    np.dtype(np.int64): onnx.TensorProto.INT64,
}
INTEGER_DTYPES = tuple(ONNX_OF)
UNSIGNED_DTYPES = INTEGER_DTYPES[:4]

Dims = Sequence[int | str | None] | None


def tensor(name: str, elem_type: int, dims: Dims) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, dims)


def model_bytes(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Sequence[onnx.TensorProto] = (),
    opset: int = 18,
) -> bytes:
    graph = helper.make_graph(list(nodes), "graph", list(inputs), list(outputs), list(initializers))
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION
    )
    data: bytes = model.SerializeToString()
    return data


def constant(name: str, array: np.ndarray[Any, Any]) -> onnx.TensorProto:
    return numpy_helper.from_array(array, name)


def chain_model(dtype: np.dtype[Any], dims: Dims = ("n",)) -> bytes:
    """XOR of x and y, shifted left by the constant k (one element), then NOT: the chain the
    fused path runs."""
    elem = ONNX_OF[np.dtype(dtype)]
    nodes = [
        helper.make_node("BitwiseXor", ["x", "y"], ["a"], name="xor"),
        helper.make_node("BitShift", ["a", "k"], ["b"], name="shift", direction="LEFT"),
        helper.make_node("BitwiseNot", ["b"], ["z"], name="not"),
    ]
    k = constant("k", np.array([3], dtype))
    return model_bytes(
        nodes, [tensor("x", elem, dims), tensor("y", elem, dims)], [tensor("z", elem, dims)], [k]
    )
