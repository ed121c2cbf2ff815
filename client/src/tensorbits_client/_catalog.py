"""The operator rule tables the client checks calls against, and the checks themselves.

The tables come from the server (``GET /v1/operators``, rebuilt with ``catalog.from_wire``), so a
client checks against exactly the rules of the server it talks to, even when the two were
released apart. They are fetched on the first call that needs them and cached per client (and
shared by its ``with_options`` copies). Only a server without ``/v1/operators`` (a 404) makes the
client fall back to the tables it was shipped with; any other failure to fetch them is raised,
because the call itself would have failed the same way.

The checks are the shared ``validation.validate_call``, so a refused call raises
``LocalValidationError`` with the very message, field and rule the server's 400 would carry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from tensorbits_client._exceptions import LocalValidationError
from tensorbits_client._types import Array
from tensorbits_protocol.catalog import registry_from_wire
from tensorbits_protocol.dtypes import from_numpy
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.operators import REGISTRY, OperatorSpec
from tensorbits_protocol.validation import TensorSpec, input_count_error, validate_call

Registry = Mapping[str, OperatorSpec]
OPERATORS_PATH = "/v1/operators"


@dataclass
class Catalog:
    """The cached tables of one server; ``source`` says where they came from."""

    registry: Registry | None = None
    source: Literal["server", "bundled"] | None = None

    def load(self, body: object) -> Registry:
        if not isinstance(body, Mapping):
            raise ValueError("GET /v1/operators did not answer a JSON object")
        self.registry = registry_from_wire(body)
        self.source = "server"
        return self.registry

    def use_bundled(self) -> Registry:
        self.registry = REGISTRY
        self.source = "bundled"
        return self.registry


def datatype_of(name: str, array: Array) -> TensorSpec:
    """The TensorSpec of an input array; a dtype with no wire type fails here, whatever checks
    are on, since such an array cannot be sent."""
    try:
        datatype = from_numpy(array.dtype)
    except TypeError as exc:
        raise LocalValidationError(f"{name}: {exc}", field=name, rule="datatype") from None
    return TensorSpec(datatype=datatype, shape=tuple(array.shape))


def check_call(
    registry: Registry,
    model: str,
    inputs: Mapping[str, TensorSpec],
    parameters: Mapping[str, object],
) -> None:
    """Raise LocalValidationError where the server would answer 400.

    An unknown model is left to the server, whose 404 names what exists."""
    op = registry.get(model)
    if op is None:
        return
    try:
        validate_call(op, inputs, parameters)
    except InvalidRequest as exc:
        raise LocalValidationError.from_protocol(exc) from None


def input_names(registry: Registry, model: str, count: int) -> tuple[str, ...]:
    """Names for inputs given in order: the operator's first ``count``.

    Too many arrays are refused here, whatever ``local_validation`` says, since the extra ones
    cannot be named: "onnx.BitwiseNot-18 takes 1 input (X), got 2". (A placeholder name would only
    be refused as an unknown input the caller never wrote, and OpenVINO's inputs are called
    ``input_1``...) Too few are named and sent, or checked: the shared rule then says which input
    is missing and how many the operator takes, locally and on the server alike. An unknown
    model's inputs get placeholders: the server's 404 then says what exists."""
    op = registry.get(model)
    if op is None:
        return tuple(f"input_{i}" for i in range(count))
    if count > len(op.inputs):
        raise LocalValidationError.from_protocol(input_count_error(op, count))
    return op.inputs[:count]
