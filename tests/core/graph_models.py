"""ONNX files for the graph model tests, built with ``onnx.helper``."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tensorbits.config.settings import Settings
from tensorbits.core.batch import BatchLimits
from tensorbits_protocol.v1 import BindingGraph

# An IR version every ONNX Runtime of the dev group reads (make_model's default may be newer).
IR_VERSION = 10
# The batch API's bounds a binding graph's file is read under, as a server's defaults make them.
BATCH_LIMITS = BatchLimits.of(Settings().core_limits)

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


def random_array(
    rng: np.random.Generator, dtype: Any, shape: tuple[int, ...]
) -> np.ndarray[Any, Any]:
    """Every bit pattern of the type equally likely (for BOOL: any byte, nonzero is true)."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape)) * dtype.itemsize
    out: np.ndarray[Any, Any] = rng.integers(0, 256, count, np.uint8).view(dtype).reshape(shape)
    return out


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


def pair_model_bytes() -> bytes:
    """Two UINT32 inputs of one length, two outputs: ``xor``, and ``nand`` (NOT of AND): a
    fused chain of three steps."""
    u32 = TensorProto.UINT32
    return model_bytes(
        [
            helper.make_node("BitwiseXor", ["x", "y"], ["xor"]),
            helper.make_node("BitwiseAnd", ["x", "y"], ["and"]),
            helper.make_node("BitwiseNot", ["and"], ["nand"]),
        ],
        [tensor("x", u32, ["n"]), tensor("y", u32, ["n"])],
        [tensor("xor", u32, ["n"]), tensor("nand", u32, ["n"])],
    )


def several_outputs_model(mask: np.ndarray[Any, Any], value: np.ndarray[Any, Any]) -> bytes:
    """Six UINT32 elements in (x), five outputs: ``b`` a node's written in place, ``b_copy`` an
    Identity of it (copied), ``a`` an intermediate also read further on, ``not_b``, and
    ``x_again`` an Identity of the input; ``mask`` an initializer, ``value`` a Constant node."""
    elem = TensorProto.UINT32
    nodes = [
        helper.make_node("Constant", [], ["c"], value=constant("c", value)),
        helper.make_node("BitwiseAnd", ["x", "mask"], ["a"]),
        helper.make_node("BitwiseXor", ["a", "c"], ["b"]),
        helper.make_node("Identity", ["b"], ["b_copy"]),
        helper.make_node("Identity", ["x"], ["x_again"]),
        helper.make_node("BitwiseNot", ["b_copy"], ["not_b"]),
    ]
    outputs = ("b", "b_copy", "a", "not_b", "x_again")
    return model_bytes(
        nodes,
        [tensor("x", elem, [6])],
        [tensor(name, elem, [6]) for name in outputs],
        [constant("mask", mask)],
    )


def broadcast_model() -> bytes:
    """``e = (a & b) | d`` over INT16 shapes that broadcast: a [3, 1, 5], b [4, 1], d [5]."""
    elem = TensorProto.INT16
    return model_bytes(
        [
            helper.make_node("BitwiseAnd", ["a", "b"], ["c"]),
            helper.make_node("BitwiseOr", ["c", "d"], ["e"]),
        ],
        [tensor("a", elem, [3, 1, 5]), tensor("b", elem, [4, 1]), tensor("d", elem, [5])],
        [tensor("e", elem, [3, 4, 5])],
    )


def broadcast_inputs(rng: np.random.Generator) -> dict[str, np.ndarray[Any, Any]]:
    """Random inputs of ``broadcast_model``'s shapes."""
    shapes = {"a": (3, 1, 5), "b": (4, 1), "d": (5,)}
    return {name: random_array(rng, np.int16, shape) for name, shape in shapes.items()}


def binding_example() -> dict[str, Any]:
    """The protocol's example of a binding graph (``v1.BindingGraph``'s schema example), a fresh
    copy: XOR in place in codes' buffer (a query row broadcast by a stride of 0), then a
    population count at feature level 4_1 into a zero-filled buffer, the output "distance"."""
    extra = BindingGraph.model_config.get("json_schema_extra")
    assert isinstance(extra, dict)
    examples = extra["examples"]
    assert isinstance(examples, list)
    first = examples[0]
    assert isinstance(first, dict)
    return copy.deepcopy(dict(first))


# A model the configuration tests load: z = x AND k, x and z of a symbolic row count by 4 UINT8,
# k a constant row; and Triton's configuration of it as config.pbtxt.
MASKED_PBTXT = """\
name: "masked"
backend: "onnxruntime"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_UINT8 dims: [ -1, 4 ] } ]
output [ { name: "z" data_type: TYPE_UINT8 dims: [ -1, 4 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def masked_model() -> bytes:
    return model_bytes(
        [helper.make_node("BitwiseAnd", ["x", "k"], ["z"])],
        [tensor("x", TensorProto.UINT8, ["n", 4])],
        [tensor("z", TensorProto.UINT8, ["n", 4])],
        [constant("k", np.array([1, 3, 7, 15], np.uint8))],
    )
