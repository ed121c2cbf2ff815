"""What the reader makes of an ONNX file: the graph, checked, in the family's terms.

Shapes of graph inputs may hold symbolic dimensions (a ``dim_param`` name, or none at all):
the planner resolves them from each request's shapes, and a name used twice must get one size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorbits_protocol.dtypes import DataType
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.operators import OperatorSpec
from tensorbits_protocol.validation import ResolvedCall, TensorSpec, validate_call

# A dimension as declared: a size, a dim_param name, or None (unknown, free).
Dim = int | str | None


@dataclass(frozen=True, slots=True)
class ValueDecl:
    """A graph input or output as the file declares it. An output's ``dims`` is None where the
    file gives no shape (its rank is then whatever the graph computes)."""

    name: str
    datatype: DataType
    dims: tuple[Dim, ...] | None


@dataclass(frozen=True, slots=True)
class GraphNode:
    """An operator node: the family's operator it runs, on which values, into which value.
    ``index`` is its place in the file's node list (``nodes[index]`` in refusals); ``inputs``
    are in the operator's input order, already past any ``Identity``."""

    index: int
    name: str
    op_type: str
    operator: OperatorSpec
    parameters: Mapping[str, str]
    inputs: tuple[str, ...]
    output: str

    @property
    def field(self) -> str:
        return f"nodes[{self.index}]"

    def describe(self) -> str:
        named = f" {self.name[:100]!r}" if self.name else ""
        return f"nodes[{self.index}]{named} ({self.op_type}, {self.operator.name})"


@dataclass(frozen=True, slots=True)
class GraphSpec:
    """A checked graph model: its inputs, its operator nodes in an order that runs (each after
    what it reads), its constant tensors (read-only arrays), and its outputs, each with the
    value it holds (``output_sources``: past any ``Identity``, so possibly a graph input or a
    constant)."""

    opset: int
    inputs: tuple[ValueDecl, ...]
    outputs: tuple[ValueDecl, ...]
    output_sources: tuple[str, ...]
    nodes: tuple[GraphNode, ...]
    constants: Mapping[str, np.ndarray[Any, Any]]
    depth: int  # the longest chain of nodes, Identity and Constant included


def node_call(node: GraphNode, specs: Mapping[str, TensorSpec]) -> ResolvedCall:
    """The node's call checked by the family's own rules (``validate_call``); a refusal names
    the node, its operator and the rule broken."""
    try:
        return validate_call(node.operator, specs, node.parameters)
    except InvalidRequest as exc:
        raise InvalidRequest(
            f"{node.describe()}: {exc.message}", field=node.field, rule=exc.rule
        ) from None
