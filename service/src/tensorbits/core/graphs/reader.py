"""``read_onnx``: an ONNX file, held to ``GraphLimits`` and checked, as a ``GraphSpec``.

Order of the checks, so that a hostile file costs little: its size, before anything else; then
a scan of its protobuf encoding (``wire.py``) that counts nodes, constant tensors and their
bytes, inputs, outputs and fields before the parser builds any of them; then the parse
(``onnx.ModelProto.FromString``; onnx's checker and shape inference are not run: the family's
rules infer every type and shape); then each node, the graph's structure and every call.

Taken:

* the operators of the family in ONNX: ``BitwiseAnd``, ``BitwiseOr``, ``BitwiseXor`` and
  ``BitwiseNot`` (opset 18 on) and ``BitShift`` (opset 11 on, attribute ``direction`` LEFT or
  RIGHT), in the default domain ("" or "ai.onnx"), each checked by the family's rules
  (``validation.validate_call``: types, ranks, broadcasting);
* two structural nodes: ``Identity`` (a second name for a value: nothing runs) and ``Constant``
  with a ``value`` tensor (a constant tensor like an initializer, counted with them against
  ``max_initializers`` and ``max_initializer_bytes``); their other forms (``value_int`` ...) are
  not;
* initializers with their data in the file (``raw_data`` or the typed lists), of the types
  ``tensors.ONNX_TYPES`` names;
* graph inputs of a tensor type with a known rank; each dimension fixed (``dim_value``) or
  symbolic (a ``dim_param``, or none): the planner takes the sizes from each request's shapes,
  the same size for every use of one ``dim_param`` name. While reading, a symbolic dimension
  counts as 1, which broadcasts with any size, so types, ranks and fixed sizes that cannot
  match are refused here and the rest when a plan is made;
* graph outputs naming any value (a node's, an input, a constant); a declared element type and
  rank must be what the graph computes, declared fixed sizes are checked by the planner.

Refused (``field`` and ``rule`` of the ``TensorbitsError``): every bound of ``GraphLimits``
(``PayloadTooLarge``, the rule its name); ``truncated_model``, ``malformed_model``;
``ir_version``, ``opset_import``, ``opset_version`` (too old for a node, or newer than the
installed onnx knows); ``unknown_operator`` (any other op type or domain); ``input_count``,
``output_count``, ``unknown_attribute``, ``unsupported_attribute``, ``empty_name``; a value
named twice (``duplicate_name``), read but never made (``undefined_value``), a cycle
(``graph_cycle``); ``datatype``, ``value_type``, ``unknown_rank``, ``rank``, ``shape``;
``type_mismatch`` (an output declared with another type or rank); ``external_data``,
``initializer_form``, ``initializer_size``, ``initializer_value``; and each rule of
``validate_call`` (``datatype``, ``mixed_datatype``, ``broadcast``, ``parameter_value`` ...)
with the node named. Model-local functions, training information, sparse tensors and nested
graphs are refused by the scan.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from tensorbits.core.graphs.limits import GraphLimits
from tensorbits.core.graphs.refusals import invalid, shown, too_large
from tensorbits.core.graphs.spec import Dim, GraphNode, GraphSpec, ValueDecl, node_call
from tensorbits.core.graphs.tensors import MAX_RANK, ConstantBudget, onnx_datatype, tensor_array
from tensorbits.core.graphs.wire import scan_model
from tensorbits_protocol.dtypes import from_numpy
from tensorbits_protocol.operators import get_operator
from tensorbits_protocol.validation import TensorSpec

DEFAULT_DOMAINS = ("", "ai.onnx")
# The ONNX op types taken, each with its operator and the first opset that has it.
OPERATOR_NODES: dict[str, tuple[str, int]] = {
    "BitwiseAnd": ("onnx.BitwiseAnd-18", 18),
    "BitwiseOr": ("onnx.BitwiseOr-18", 18),
    "BitwiseXor": ("onnx.BitwiseXor-18", 18),
    "BitwiseNot": ("onnx.BitwiseNot-18", 18),
    "BitShift": ("onnx.BitShift-11", 11),
}
IDENTITY, CONSTANT = "Identity", "Constant"
TAKEN = (*OPERATOR_NODES, IDENTITY, CONSTANT)
# IR version 3 introduced opset imports; newer ones than the installed onnx knows are refused,
# as are opsets past its newest: an operator may have changed in them.
MIN_IR_VERSION = 3
MAX_IR_VERSION = onnx.IR_VERSION
MAX_OPSET = onnx.defs.onnx_opset_version()


def read_onnx(data: bytes, limits: GraphLimits | None = None) -> GraphSpec:
    """The graph model in the ONNX file ``data``, or a ``TensorbitsError`` naming the part and
    the rule that refuses it (see the module's documentation)."""
    limits = limits or GraphLimits()
    if len(data) > limits.max_model_bytes:
        raise too_large(
            "model", "max_model_bytes", f"the file is {len(data)} bytes", limits.max_model_bytes
        )
    scan_model(data, limits)
    try:
        model = onnx.ModelProto.FromString(data)
    except DecodeError as exc:
        raise invalid("model", "malformed_model", f"not an ONNX model ({exc})") from None
    try:
        return _Reader(model, limits).spec()
    except UnicodeDecodeError:
        raise invalid("model", "malformed_model", "a name is not UTF-8 text") from None


@dataclass(slots=True, kw_only=True)
class _Node:
    """A node of the file, checked on its own, before the graph is. Made once its names are
    read, so that refusals can name it; its output and parameters are filled in as they are
    checked."""

    index: int
    name: str
    op_type: str
    inputs: tuple[str, ...]
    output: str
    parameters: dict[str, str]

    def describe(self) -> str:
        named = f" {shown(self.name)}" if self.name else ""
        return f"nodes[{self.index}]{named} ({shown(self.op_type)})"


class _Reader:
    def __init__(self, model: onnx.ModelProto, limits: GraphLimits) -> None:
        self.model = model
        self.limits = limits
        self.budget = ConstantBudget(limits.max_initializer_bytes)
        self.constants: dict[str, np.ndarray[Any, Any]] = {}
        self.defined: set[str] = set()

    def name(self, value: str, field: str) -> str:
        if len(value) > self.limits.max_name_chars:
            raise too_large(
                field,
                "max_name_chars",
                f"a name of {len(value)} characters ({shown(value)}...)",
                self.limits.max_name_chars,
            )
        return value

    def define(self, value: str, field: str) -> None:
        if not value:
            raise invalid(field, "empty_name", "a value without a name")
        if value in self.defined:
            raise invalid(field, "duplicate_name", f"value {shown(value)} is defined twice")
        self.defined.add(value)

    def spec(self) -> GraphSpec:
        model = self.model
        if not MIN_IR_VERSION <= model.ir_version <= MAX_IR_VERSION:
            raise invalid(
                "model",
                "ir_version",
                f"IR version {model.ir_version} (allowed: {MIN_IR_VERSION} to {MAX_IR_VERSION})",
            )
        opset = self.opset()
        if not model.HasField("graph"):
            raise invalid("model", "missing_graph", "the model holds no graph")
        graph = model.graph
        inputs = tuple(self.graph_input(i, v) for i, v in enumerate(graph.input))
        for i, tensor in enumerate(graph.initializer):
            field = f"initializers[{i}]"
            name = self.name(tensor.name, field)
            self.define(name, field)
            self.constants[name] = tensor_array(tensor, field, self.budget)
        nodes = [self.node(i, node, opset) for i, node in enumerate(graph.node)]
        order, depth = self.order(nodes)
        specs: dict[str, TensorSpec] = {
            decl.name: TensorSpec(
                decl.datatype, tuple(d if isinstance(d, int) else 1 for d in decl.dims or ())
            )
            for decl in inputs
        }
        specs.update(
            (name, TensorSpec(from_numpy(a.dtype), a.shape)) for name, a in self.constants.items()
        )
        aliases: dict[str, str] = {}
        checked: list[GraphNode] = []
        for node in order:
            sources = tuple(aliases.get(v, v) for v in node.inputs)
            if node.op_type == IDENTITY:
                aliases[node.output] = sources[0]
                specs[node.output] = specs[sources[0]]
                continue
            if node.op_type == CONSTANT:
                continue  # its tensor is among the constants already
            operator = get_operator(OPERATOR_NODES[node.op_type][0])
            graph_node = GraphNode(
                node.index, node.name, node.op_type, operator, node.parameters, sources, node.output
            )
            call = node_call(
                graph_node, {n: specs[v] for n, v in zip(operator.inputs, sources, strict=True)}
            )
            specs[node.output] = TensorSpec(call.output_datatype, call.output_shape)
            checked.append(graph_node)
        outputs, sources = self.graph_outputs(specs, aliases)
        return GraphSpec(
            opset=opset,
            inputs=inputs,
            outputs=outputs,
            output_sources=sources,
            nodes=tuple(checked),
            constants=self.constants,
            depth=depth,
        )

    def opset(self) -> int:
        versions = [o.version for o in self.model.opset_import if o.domain in DEFAULT_DOMAINS]
        if len(versions) != 1:
            raise invalid(
                "opset_import",
                "opset_import",
                f"{len(versions)} imports of the default domain (allowed: exactly one)",
            )
        if not 1 <= versions[0] <= MAX_OPSET:
            raise invalid(
                "opset_import",
                "opset_version",
                f"opset {versions[0]} of the default domain (allowed: 1 to {MAX_OPSET})",
            )
        return int(versions[0])

    def graph_input(self, index: int, value: onnx.ValueInfoProto) -> ValueDecl:
        field = f"inputs[{index}]"
        name = self.name(value.name, field)
        self.define(name, field)
        if not value.type.HasField("tensor_type"):
            raise invalid(field, "value_type", f"input {shown(name)} is not a tensor")
        tensor_type = value.type.tensor_type
        datatype = onnx_datatype(tensor_type.elem_type, field)
        if not tensor_type.HasField("shape"):
            raise invalid(field, "unknown_rank", f"input {shown(name)} has no shape")
        dims: list[Dim] = []
        for dim in tensor_type.shape.dim:
            if dim.HasField("dim_value"):
                if dim.dim_value < 0:
                    raise invalid(field, "shape", f"input {shown(name)} has a negative size")
                dims.append(int(dim.dim_value))
            elif dim.HasField("dim_param"):
                dims.append(self.name(dim.dim_param, field))
            else:
                dims.append(None)
        if len(dims) > MAX_RANK:
            raise invalid(
                field,
                "rank",
                f"input {shown(name)} has rank {len(dims)} (allowed: 0 to {MAX_RANK})",
            )
        return ValueDecl(name, datatype, tuple(dims))

    def node(self, index: int, proto: onnx.NodeProto, opset: int) -> _Node:
        field = f"nodes[{index}]"
        node = _Node(
            index=index,
            name=self.name(proto.name, field),
            op_type=proto.op_type[: self.limits.max_name_chars + 1],
            inputs=tuple(self.name(v, field) for v in proto.input),
            output="",  # read after the inputs and op type are checked
            parameters={},  # from the attributes, last
        )
        where = node.describe()
        if proto.domain not in DEFAULT_DOMAINS or node.op_type not in TAKEN:
            domain = (
                f" of domain {shown(proto.domain)}" if proto.domain not in DEFAULT_DOMAINS else ""
            )
            raise invalid(
                field,
                "unknown_operator",
                f"{where}: op type {shown(node.op_type)}{domain} is not taken "
                f"(allowed: {', '.join(TAKEN)} of the default domain)",
            )
        since = OPERATOR_NODES[node.op_type][1] if node.op_type in OPERATOR_NODES else 1
        if opset < since:
            raise invalid(
                field,
                "opset_version",
                f"{where}: {node.op_type} needs opset {since} or newer; the model imports {opset}",
            )
        expected = (
            len(get_operator(OPERATOR_NODES[node.op_type][0]).inputs)
            if node.op_type in OPERATOR_NODES
            else (1 if node.op_type == IDENTITY else 0)
        )
        if len(node.inputs) != expected or "" in node.inputs:
            raise invalid(
                field,
                "input_count",
                f"{where}: {len(node.inputs)} inputs {[shown(v) for v in node.inputs[:4]]} "
                f"(allowed: {expected}, each named)",
            )
        if len(proto.output) != 1:
            raise invalid(
                field, "output_count", f"{where}: {len(proto.output)} outputs (allowed: 1)"
            )
        node.output = self.name(proto.output[0], field)
        self.define(node.output, field)
        self.attributes(node, proto, where)
        return node

    def attributes(self, node: _Node, proto: onnx.NodeProto, where: str) -> None:
        field = f"nodes[{node.index}]"
        allowed = {"BitShift": "direction", CONSTANT: "value"}.get(node.op_type)
        names = [a.name for a in proto.attribute]
        if [n for n in names if n != allowed] or len(names) > 1 or (allowed and not names):
            raise invalid(
                field,
                "unknown_attribute",
                f"{where}: attributes {[shown(n) for n in names[:4]]} "
                f"(allowed: {allowed or 'none'})",
            )
        if not names:
            return
        attribute = proto.attribute[0]
        expected = (
            onnx.AttributeProto.STRING if allowed == "direction" else onnx.AttributeProto.TENSOR
        )
        if attribute.type != expected or attribute.ref_attr_name:
            raise invalid(
                field,
                "unsupported_attribute",
                f"{where}: attribute {allowed} must be a {onnx.AttributeProto.AttributeType.Name(expected)}",
            )
        if node.op_type == CONSTANT:
            self.constants[node.output] = tensor_array(attribute.t, field, self.budget)
        else:
            node.parameters["direction"] = attribute.s.decode()

    def order(self, nodes: list[_Node]) -> tuple[list[_Node], int]:
        """The nodes in an order that runs (file order where it does), and the graph's depth."""
        producer = {node.output: node.index for node in nodes}
        waiting = [0] * len(nodes)
        readers: dict[int, list[int]] = {}
        for node in nodes:
            for value in node.inputs:
                if value in producer:
                    waiting[node.index] += 1
                    readers.setdefault(producer[value], []).append(node.index)
                elif value not in self.defined:
                    raise invalid(
                        f"nodes[{node.index}]",
                        "undefined_value",
                        f"{node.describe()} reads {shown(value)}, which no input, initializer "
                        "or node defines",
                    )
        ready = [node.index for node in nodes if waiting[node.index] == 0]
        heapq.heapify(ready)
        depth = [1] * len(nodes)
        ordered: list[_Node] = []
        while ready:
            index = heapq.heappop(ready)
            if depth[index] > self.limits.max_depth:
                raise too_large(
                    f"nodes[{index}]",
                    "max_depth",
                    f"{nodes[index].describe()} ends a chain of {depth[index]} nodes",
                    self.limits.max_depth,
                )
            ordered.append(nodes[index])
            for reader in readers.get(index, ()):
                depth[reader] = max(depth[reader], depth[index] + 1)
                waiting[reader] -= 1
                if waiting[reader] == 0:
                    heapq.heappush(ready, reader)
        if len(ordered) < len(nodes):
            stuck = min(i for i in range(len(nodes)) if waiting[i])
            raise invalid(
                f"nodes[{stuck}]",
                "graph_cycle",
                f"{nodes[stuck].describe()} is on a cycle: it reads, through other nodes, what "
                "it writes",
            )
        return ordered, max(depth, default=0)

    def graph_outputs(
        self, specs: Mapping[str, TensorSpec], aliases: Mapping[str, str]
    ) -> tuple[tuple[ValueDecl, ...], tuple[str, ...]]:
        outputs: list[ValueDecl] = []
        sources: list[str] = []
        seen: set[str] = set()
        for index, value in enumerate(self.model.graph.output):
            field = f"outputs[{index}]"
            name = self.name(value.name, field)
            if name in seen:
                raise invalid(field, "duplicate_name", f"output {shown(name)} is named twice")
            seen.add(name)
            if name not in specs:
                raise invalid(
                    field,
                    "undefined_value",
                    f"output {shown(name)} is no input, constant or node's",
                )
            computed = specs[name]
            dims: tuple[Dim, ...] | None = None
            if value.type.HasField("tensor_type"):
                tensor_type = value.type.tensor_type
                if (
                    tensor_type.elem_type
                    and onnx_datatype(tensor_type.elem_type, field) != computed.datatype
                ):
                    raise invalid(
                        field,
                        "type_mismatch",
                        f"output {shown(name)} is declared "
                        f"{onnx_datatype(tensor_type.elem_type, field)}; the graph makes {computed.datatype}",
                    )
                if tensor_type.HasField("shape"):
                    dims = tuple(
                        int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None)
                        for d in tensor_type.shape.dim
                    )
                    if len(dims) != len(computed.shape):
                        raise invalid(
                            field,
                            "type_mismatch",
                            f"output {shown(name)} is declared of rank {len(dims)}; the graph "
                            f"makes rank {len(computed.shape)}",
                        )
            elif value.type.WhichOneof("value") is not None:
                raise invalid(field, "value_type", f"output {shown(name)} is not a tensor")
            outputs.append(ValueDecl(name, computed.datatype, dims))
            sources.append(aliases.get(name, name))
        if not outputs:
            raise invalid("outputs", "output_count", "the graph has no outputs")
        return tuple(outputs), tuple(sources)
