"""A look at an ONNX file's protobuf wire format before it is parsed, to hold it to
``GraphLimits`` first: the parser would otherwise build every node, string and number of a
hostile file in memory before any count could be checked.

The scan walks only the messages whose counts matter (the model, its graph, the graph's nodes
and their attributes, initializers and ``Constant`` tensors, the inputs' and outputs' types) and
skips every other field by its length. It counts each field it looks at against
``max_fields`` (a packed list of numbers counts one per number), so its own time is bounded too.
It refuses what the reader never takes anyway: nested graphs, model-local functions, training
information, sparse tensors, external data and protobuf groups. What it lets through is parsed
by ``onnx`` and checked again, in full, by the reader.

The encoding is read by the core's protobuf reader (``core/wire.py``), the one the gRPC requests
are walked with; what an ONNX file holds, its bounds and the words of its refusals are here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

from tensorbits.core import wire as core_wire
from tensorbits.core.graphs.limits import GraphLimits
from tensorbits.core.graphs.refusals import invalid, too_large
from tensorbits.core.wire import LEN, VARINT, Fault, WireFault
from tensorbits_protocol.errors import TensorbitsError

# Field numbers (onnx.proto) of what the scan reads or refuses.
MODEL_GRAPH, MODEL_TRAINING_INFO, MODEL_FUNCTIONS = 7, 20, 25
GRAPH_NODE, GRAPH_INITIALIZER, GRAPH_INPUT, GRAPH_OUTPUT, GRAPH_VALUE_INFO = 1, 5, 11, 12, 13
# Graph fields whose number is bounded: the ``WireCounts`` field counting them, which also names
# their bound (``GraphLimits.max_nodes`` ...) and their place in refusals (``nodes[3]``), and the
# refusal's words.
GRAPH_COUNTED = {
    GRAPH_NODE: ("nodes", "too many nodes"),
    GRAPH_INPUT: ("inputs", "too many graph inputs"),
    GRAPH_OUTPUT: ("outputs", "too many graph outputs"),
}
GRAPH_REFUSED = {14: "quantization annotations", 15: "sparse initializers"}
NODE_ATTRIBUTE = 5
ATTRIBUTE_TENSOR, ATTRIBUTE_FLOATS, ATTRIBUTE_INTS = 5, 7, 8
ATTRIBUTE_REFUSED = {
    6: "a graph",
    10: "a list of tensors",
    11: "a list of graphs",
    14: "a type",
    15: "a list of types",
    22: "a sparse tensor",
    23: "a list of sparse tensors",
}
VALUE_INFO_TYPE, TYPE_TENSOR, TENSOR_TYPE_SHAPE = 2, 1, 2
TYPE_REFUSED = {4: "a sequence", 5: "a map", 8: "a sparse tensor", 9: "an optional"}
TENSOR_DIMS, TENSOR_DATA_TYPE, TENSOR_SEGMENT, TENSOR_RAW_DATA = 1, 2, 3, 9
TENSOR_STRING_DATA, TENSOR_EXTERNAL_DATA, TENSOR_DATA_LOCATION = 6, 13, 14
# Typed number lists: each number counts as a field (``max_fields``).
TENSOR_NUMBER_LISTS = {4: 4, 5: 0, 7: 0, 10: 8, 11: 0}  # field: fixed width, 0 for varints
# Bytes per element of onnx.TensorProto data types (unknown ones count 1; the reader refuses
# them after parsing, with the type named).
ELEMENT_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8}


@dataclass(slots=True)
class WireCounts:
    """What the scan found: the counts the reader's bounds apply to."""

    nodes: int = 0
    initializers: int = 0  # initializers and Constant nodes' tensors
    initializer_bytes: int = 0
    inputs: int = 0
    outputs: int = 0
    fields: int = 0


def _truncated(where: str) -> TensorbitsError:
    return invalid("model", "truncated_model", f"the file ends inside {where}; it is cut short")


def _malformed(where: str, what: str) -> TensorbitsError:
    return invalid("model", "malformed_model", f"{what} in {where}; this is not an ONNX file")


def _refusal(fault: WireFault, where: str) -> TensorbitsError:
    """The refusal of a fault the protobuf reader found in ``where``."""
    if fault.fault is Fault.CUT:
        return _truncated(where)
    if fault.fault is Fault.OVERLONG:
        return _malformed(where, "a varint longer than 10 bytes")
    if fault.fault is Fault.FIELD_ZERO:
        return _malformed(where, "field number 0")
    return _malformed(where, f"protobuf wire type {fault.wire_type} (groups are not used)")


class _Scanner:
    def __init__(self, data: bytes, limits: GraphLimits) -> None:
        self.data = data
        self.limits = limits
        self.counts = WireCounts()

    def count_fields(self, n: int, where: str) -> None:
        self.counts.fields += n
        if self.counts.fields > self.limits.max_fields:
            raise too_large(
                where,
                "max_fields",
                "the file holds more protobuf fields than a graph model of the allowed size needs",
                self.limits.max_fields,
            )

    def varint(self, pos: int, end: int, where: str) -> tuple[int, int]:
        """The varint at ``pos`` and the position after it (``core_wire.read_varint``)."""
        try:
            return core_wire.read_varint(self.data, pos, end)
        except WireFault as fault:
            raise _refusal(fault, where) from None

    def fields(self, start: int, end: int, where: str) -> Iterator[tuple[int, int, int, int]]:
        """``(number, wire type, a, b)`` for each field of the message in ``[start, end)``: a
        varint's value and its end, or the bounds of a length-delimited or fixed value
        (``core_wire.fields``), each counted against ``max_fields`` before it is read."""
        try:
            yield from core_wire.fields(self.data, start, end, partial(self.count_fields, 1, where))
        except WireFault as fault:
            raise _refusal(fault, where) from None

    def message(self, number: int, wire_type: int, where: str) -> None:
        if wire_type != LEN:
            raise _malformed(where, f"field {number} is not a message")

    def messages(self, start: int, end: int, wanted: int, where: str) -> Iterator[tuple[int, int]]:
        """The bounds of each field ``wanted`` (a message) of the message in ``[start, end)``;
        its other fields are counted and skipped."""
        for number, wire_type, a, b in self.fields(start, end, where):
            if number == wanted:
                self.message(number, wire_type, where)
                yield a, b

    def counted(self, number: int) -> str:
        """Where the graph's next node, input or output (field ``number``) stands: counted, and
        refused past its bound."""
        kind, what = GRAPH_COUNTED[number]
        index: int = getattr(self.counts, kind)
        setattr(self.counts, kind, index + 1)
        bound: int = getattr(self.limits, f"max_{kind}")
        where = f"{kind}[{index}]"
        if index >= bound:
            raise too_large(where, f"max_{kind}", what, bound)
        return where

    def packed_count(self, wire_type: int, a: int, b: int, width: int) -> int:
        if wire_type != LEN:
            return 1
        if width:
            return (b - a) // width
        return core_wire.count_varints(self.data[a:b])

    def model(self) -> WireCounts:
        for number, wire_type, a, b in self.fields(0, len(self.data), "the model"):
            if number == MODEL_GRAPH:
                self.message(number, wire_type, "the model")
                self.graph(a, b)
            elif number == MODEL_FUNCTIONS:
                raise invalid(
                    "model", "unsupported_model_part", "model-local functions are not taken"
                )
            elif number == MODEL_TRAINING_INFO:
                raise invalid(
                    "model", "unsupported_model_part", "training information is not taken"
                )
        return self.counts

    def graph(self, start: int, end: int) -> None:
        initializers = 0  # of this graph field, as the parsed graph will number them
        for number, wire_type, a, b in self.fields(start, end, "the graph"):
            if number in GRAPH_COUNTED:
                where = self.counted(number)
                self.message(number, wire_type, where)
                (self.node if number == GRAPH_NODE else self.value_info)(a, b, where)
            elif number == GRAPH_INITIALIZER:
                where = f"initializers[{initializers}]"
                initializers += 1
                self.message(number, wire_type, where)
                self.tensor(a, b, where)
            elif number == GRAPH_VALUE_INFO:
                self.message(number, wire_type, "value_info")
                self.value_info(a, b, "value_info")
            elif number in GRAPH_REFUSED:
                raise invalid(
                    "graph", "unsupported_graph_part", f"{GRAPH_REFUSED[number]} are not taken"
                )

    def node(self, start: int, end: int, where: str) -> None:
        for a, b in self.messages(start, end, NODE_ATTRIBUTE, where):
            self.attribute(a, b, where)

    def attribute(self, start: int, end: int, where: str) -> None:
        for number, wire_type, a, b in self.fields(start, end, where):
            if number == ATTRIBUTE_TENSOR:
                self.message(number, wire_type, where)
                self.tensor(a, b, where)
            elif number in (ATTRIBUTE_FLOATS, ATTRIBUTE_INTS):
                width = 4 if number == ATTRIBUTE_FLOATS else 0
                self.count_fields(self.packed_count(wire_type, a, b, width) - 1, where)
            elif number in ATTRIBUTE_REFUSED:
                raise invalid(
                    where,
                    "unsupported_attribute",
                    f"an attribute holds {ATTRIBUTE_REFUSED[number]}, which no node taken here has",
                )

    def value_type(self, start: int, end: int, where: str) -> None:
        for number, wire_type, a, b in self.fields(start, end, where):
            if number in TYPE_REFUSED:
                raise invalid(
                    where,
                    "value_type",
                    f"the type is {TYPE_REFUSED[number]}; only tensors are taken",
                )
            if number == TYPE_TENSOR:
                self.message(number, wire_type, where)
                for c, d in self.messages(a, b, TENSOR_TYPE_SHAPE, where):
                    for _ in self.fields(c, d, where):  # the dimensions: counted
                        pass

    def value_info(self, start: int, end: int, where: str) -> None:
        for a, b in self.messages(start, end, VALUE_INFO_TYPE, where):
            self.value_type(a, b, where)

    def tensor(self, start: int, end: int, where: str) -> None:
        counts, limits = self.counts, self.limits
        counts.initializers += 1
        if counts.initializers > limits.max_initializers:
            raise too_large(
                where,
                "max_initializers",
                "too many initializers and Constant nodes",
                limits.max_initializers,
            )
        dims: list[int] = []
        element_bytes = 1
        raw_bytes = 0
        for number, wire_type, a, b in self.fields(start, end, where):
            if number == TENSOR_DIMS:
                dims.extend(self.dims(wire_type, a, b, where))
            elif number == TENSOR_DATA_TYPE and wire_type == VARINT:
                element_bytes = ELEMENT_BYTES.get(a, 1)
            elif number == TENSOR_RAW_DATA:
                raw_bytes += b - a
            elif number in TENSOR_NUMBER_LISTS:
                width = TENSOR_NUMBER_LISTS[number]
                self.count_fields(self.packed_count(wire_type, a, b, width) - 1, where)
            elif number in (TENSOR_EXTERNAL_DATA, TENSOR_DATA_LOCATION):
                if number == TENSOR_EXTERNAL_DATA or a != 0:
                    raise invalid(
                        where, "external_data", "tensor data outside the file is not taken"
                    )
            elif number in (TENSOR_SEGMENT, TENSOR_STRING_DATA):
                raise invalid(where, "initializer_form", "segments and strings are not taken")
        declared = element_bytes
        for size in dims:
            declared *= size
            if declared > limits.max_initializer_bytes:
                break
        counts.initializer_bytes += max(declared, raw_bytes)
        if counts.initializer_bytes > limits.max_initializer_bytes:
            raise too_large(
                where,
                "max_initializer_bytes",
                f"the constant tensors hold at least {counts.initializer_bytes} bytes",
                limits.max_initializer_bytes,
            )

    def dims(self, wire_type: int, a: int, b: int, where: str) -> list[int]:
        if wire_type == VARINT:
            values = [a]
        elif wire_type == LEN:
            self.count_fields(self.packed_count(wire_type, a, b, 0) - 1, where)
            values = []
            pos = a
            while pos < b:
                value, pos = self.varint(pos, b, where)
                values.append(value)
        else:
            raise _malformed(where, "tensor dimensions of the wrong wire type")
        for value in values:
            if value >= 1 << 63:  # an int64 below zero
                raise invalid(where, "shape", f"dimension of negative size {value - (1 << 64)}")
        return values


def scan_model(data: bytes, limits: GraphLimits) -> WireCounts:
    """The counts of the ONNX file ``data``, or the refusal of the first bound it passes, of a
    malformed or truncated encoding, or of a part the reader never takes."""
    return _Scanner(data, limits).model()
