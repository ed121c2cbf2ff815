"""The operator registry as data on the wire (GET /v1/operators), and back.

``describe`` turns an ``OperatorSpec`` into the ``v1.OperatorInfo`` the server publishes, with
every rule table (support rows by feature level, ranks, shape rule, parameters, in-place inputs,
empty tensors). ``from_wire`` is its inverse: a client rebuilds the registry from the server's
tables and runs the same ``validate_call`` locally, so a request the server would refuse is
refused before it is sent, with the server's message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tensorbits_protocol.operators import (
    OPERATORS,
    OperatorSpec,
    ParameterSpec,
    SupportRow,
)
from tensorbits_protocol.v1 import (
    OperatorInfo,
    OperatorList,
    ParameterInfo,
    SupportRowInfo,
)


def _describe_row(row: SupportRow) -> SupportRowInfo:
    return SupportRowInfo(
        since=row.since,
        min_rank=row.min_rank,
        max_rank=row.max_rank,
        input_types=list(row.input_types),
        output_types=None if row.output_types is None else list(row.output_types),
    )


def _describe_parameter(param: ParameterSpec) -> ParameterInfo:
    return ParameterInfo(
        name=param.name,
        # ParameterSpec's convention (no choices: an integer), spelled out for readers.
        type="integer" if param.choices is None else "string",
        choices=None if param.choices is None else list(param.choices),
        default=param.default,
        required=param.required,
        description=param.description,
    )


def describe(op: OperatorSpec) -> OperatorInfo:
    """The wire form of one operator's rule tables."""
    return OperatorInfo(
        name=op.name,
        spec=op.spec,
        function=op.function,
        inputs=list(op.inputs),
        output=op.output,
        shape_rule=op.shape_rule,
        encoding=op.encoding,
        support=[_describe_row(row) for row in op.support],
        parameters=[_describe_parameter(p) for p in op.parameters],
        in_place=list(op.in_place),
        allow_empty=op.allow_empty,
        summary=op.summary,
    )


def to_wire(op: OperatorSpec) -> dict[str, Any]:
    """``describe`` as a JSON-able dict."""
    return describe(op).model_dump(mode="json")


def listing(operators: Iterable[OperatorSpec] = OPERATORS) -> OperatorList:
    """The body of GET /v1/operators."""
    return OperatorList(operators=[describe(op) for op in operators])


def from_wire(data: OperatorInfo | Mapping[str, Any]) -> OperatorSpec:
    """The OperatorSpec that ``to_wire`` described (pydantic's ValidationError if malformed)."""
    info = data if isinstance(data, OperatorInfo) else OperatorInfo.model_validate(data)
    return OperatorSpec(
        name=info.name,
        spec=info.spec,
        function=info.function,
        inputs=tuple(info.inputs),
        output=info.output,
        shape_rule=info.shape_rule,
        encoding=info.encoding,
        support=tuple(
            SupportRow(
                since=row.since,
                min_rank=row.min_rank,
                max_rank=row.max_rank,
                input_types=tuple(row.input_types),
                output_types=None if row.output_types is None else tuple(row.output_types),
            )
            for row in info.support
        ),
        parameters=tuple(
            ParameterSpec(
                name=p.name,
                choices=None if p.choices is None else tuple(p.choices),
                default=p.default,
                required=p.required,
                description=p.description,
            )
            for p in info.parameters
        ),
        in_place=tuple(info.in_place),
        allow_empty=info.allow_empty,
        summary=info.summary,
    )


def registry_from_wire(data: OperatorList | Mapping[str, Any]) -> dict[str, OperatorSpec]:
    """A registry (name → OperatorSpec) rebuilt from a GET /v1/operators body."""
    body = data if isinstance(data, OperatorList) else OperatorList.model_validate(data)
    return {info.name: from_wire(info) for info in body.operators}
