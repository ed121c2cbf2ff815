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

from pydantic import TypeAdapter

from tensorbits_protocol.operators import OPERATORS, OperatorSpec
from tensorbits_protocol.v1 import OperatorInfo, OperatorList

# The registry's dataclasses read back from the wire: pydantic converts the lists to the tuples
# the registry holds and the strings to its enums, and ignores what only the wire carries (a
# parameter's ``type``).
_SPEC = TypeAdapter(OperatorSpec)


def describe(op: OperatorSpec) -> OperatorInfo:
    """The wire form of one operator's rule tables, read off the spec field for field."""
    return OperatorInfo.model_validate(op, from_attributes=True)


def to_wire(op: OperatorSpec) -> dict[str, Any]:
    """``describe`` as a JSON-able dict."""
    return describe(op).model_dump(mode="json")


def listing(operators: Iterable[OperatorSpec] = OPERATORS) -> OperatorList:
    """The body of GET /v1/operators."""
    return OperatorList(operators=[describe(op) for op in operators])


def from_wire(data: OperatorInfo | Mapping[str, Any]) -> OperatorSpec:
    """The OperatorSpec that ``to_wire`` described (pydantic's ValidationError if malformed)."""
    info = data if isinstance(data, OperatorInfo) else OperatorInfo.model_validate(data)
    return _SPEC.validate_python(info.model_dump())


def registry_from_wire(data: OperatorList | Mapping[str, Any]) -> dict[str, OperatorSpec]:
    """A registry (name → OperatorSpec) rebuilt from a GET /v1/operators body."""
    body = data if isinstance(data, OperatorList) else OperatorList.model_validate(data)
    return {info.name: from_wire(info) for info in body.operators}
