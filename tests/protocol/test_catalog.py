"""The operator catalog round trip: describe → JSON → from_wire rebuilds every OperatorSpec, and
the rebuilt registry makes validate_call say exactly what the server's says."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, get_args

import pytest

from tensorbits_protocol import catalog
from tensorbits_protocol.dtypes import DML_ALIASES, DataType
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.operators import OPERATORS, REGISTRY, OperatorSpec
from tensorbits_protocol.v1 import DataTypeName
from tensorbits_protocol.validation import TensorSpec, validate_call

IDS = [op.name for op in OPERATORS]


def through_json(op: OperatorSpec) -> OperatorSpec:
    return catalog.from_wire(json.loads(json.dumps(catalog.to_wire(op))))


def test_every_operator_is_described() -> None:
    assert [info.name for info in catalog.listing().operators] == IDS


@pytest.mark.parametrize("op", OPERATORS, ids=IDS)
def test_round_trip_rebuilds_the_spec(op: OperatorSpec) -> None:
    rebuilt = through_json(op)
    assert rebuilt == op
    assert rebuilt.parameter_index == op.parameter_index
    # Tuples and enums come back as the registry holds them, not as lists and strings.
    assert type(rebuilt.support[0].input_types) is tuple
    assert all(type(t) is DataType for row in rebuilt.support for t in row.input_types)


@pytest.mark.parametrize("op", OPERATORS, ids=IDS)
def test_parameter_types_follow_choices(op: OperatorSpec) -> None:
    for info in catalog.describe(op).parameters:
        assert (info.type == "string") == (info.choices is not None)


def test_registry_from_wire_matches_the_registry() -> None:
    body = json.loads(catalog.listing().model_dump_json())
    assert catalog.registry_from_wire(body) == REGISTRY


def test_malformed_tables_are_refused() -> None:
    wire = catalog.to_wire(OPERATORS[0])
    wire["shape_rule"] = "sideways"
    with pytest.raises(ValueError, match="shape_rule"):
        catalog.from_wire(wire)


def test_data_type_names_are_the_ones_parse_datatype_reads() -> None:
    assert set(get_args(DataTypeName)) == {str(t) for t in DataType} | set(DML_ALIASES)


# Calls that break each kind of rule (and some that pass): (operator, inputs, parameters).
T = TensorSpec
U8, I32, U64, BOOL = DataType.UINT8, DataType.INT32, DataType.UINT64, DataType.BOOL
Call = tuple[str, dict[str, TensorSpec], Mapping[str, Any]]
DML = "DML_OPERATOR_ELEMENT_WISE_"
CALLS: list[Call] = [
    (f"{DML}BIT_AND", {"ATensor": T(U8, (2, 3)), "BTensor": T(U8, (2, 3))}, {}),
    (f"{DML}BIT_AND", {"ATensor": T(I32, (2,)), "BTensor": T(I32, (2,))}, {"feature_level": "3_0"}),
    (f"{DML}BIT_AND", {"ATensor": T(U8, (2,)), "BTensor": T(U8, (2,))}, {"feature_level": "2_1"}),
    (f"{DML}BIT_AND", {"ATensor": T(U8, (2,)), "BTensor": T(U8, (3,))}, {}),
    (f"{DML}BIT_AND", {"ATensor": T(U8, (2,)), "BTensor": T(I32, (2,))}, {}),
    (f"{DML}BIT_AND", {"ATensor": T(U8, (2,))}, {}),
    (f"{DML}BIT_AND", {"ATensor": T(U8, ()), "BTensor": T(U8, ())}, {}),
    (f"{DML}BIT_NOT", {"InputTensor": T(U8, (0,))}, {}),
    (f"{DML}BIT_COUNT", {"InputTensor": T(U64, (4,))}, {"output_datatype": "UINT16"}),
    (f"{DML}BIT_COUNT", {"InputTensor": T(U64, (4,))}, {"output_datatype": "UINT32"}),
    (
        f"{DML}BIT_SHIFT_LEFT",
        {"ATensor": T(U8, (2,)), "BTensor": T(U8, (2,))},
        {"feature_level": "2_1"},
    ),
    (f"{DML}BIT_SHIFT_RIGHT", {"ATensor": T(I32, (2,)), "BTensor": T(I32, (2,))}, {}),
    ("openvino.BitwiseAnd-13", {"input_1": T(BOOL, (2, 3)), "input_2": T(BOOL, (3,))}, {}),
    (
        "openvino.BitwiseOr-13",
        {"input_1": T(U8, (2, 3)), "input_2": T(U8, (3,))},
        {"auto_broadcast": "none"},
    ),
    (
        "openvino.BitwiseXor-13",
        {"input_1": T(U8, (2, 3)), "input_2": T(U8, (2,))},
        {"auto_broadcast": "pdpd", "axis": 0},
    ),
    (
        "openvino.BitwiseXor-13",
        {"input_1": T(U8, (2, 3)), "input_2": T(U8, (2,))},
        {"auto_broadcast": "pdpd", "axis": "0"},
    ),
    ("openvino.BitwiseLeftShift-15", {"input_1": T(BOOL, (2,)), "input_2": T(BOOL, (2,))}, {}),
    ("onnx.BitwiseNot-18", {"X": T(U8, (9,) * 9)}, {}),
    ("onnx.BitwiseAnd-18", {"A": T(U8, (2, 3)), "B": T(U8, (4,))}, {}),
    ("onnx.BitShift-11", {"X": T(U8, (2,)), "Y": T(U8, (2,))}, {}),
    ("onnx.BitShift-11", {"X": T(U8, (2,)), "Y": T(U8, (2,))}, {"direction": "UP"}),
    ("onnx.BitShift-11", {"X": T(U8, (2,)), "Y": T(U8, (2,))}, {"direction": "LEFT", "speed": 1}),
]


def outcome(
    op: OperatorSpec, inputs: dict[str, TensorSpec], parameters: Mapping[str, Any]
) -> object:
    try:
        call = validate_call(op, inputs, parameters)
    except InvalidRequest as exc:
        return ("refused", exc.to_dict())
    return (
        "accepted",
        call.parameters,
        call.output_datatype,
        call.output_shape,
        call.kernel_input_shapes,
    )


@pytest.mark.parametrize(
    ("name", "inputs", "parameters"), CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(CALLS)]
)
def test_rebuilt_registry_validates_identically(
    name: str, inputs: dict[str, TensorSpec], parameters: Mapping[str, Any]
) -> None:
    server, client = REGISTRY[name], through_json(REGISTRY[name])
    assert outcome(client, inputs, parameters) == outcome(server, inputs, parameters)


def test_the_calls_cover_refusals_and_acceptances() -> None:
    kinds = {str(outcome(REGISTRY[n], i, p)[0]) for n, i, p in CALLS}  # type: ignore[index]
    assert kinds == {"refused", "accepted"}
