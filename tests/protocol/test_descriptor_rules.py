"""The rule table of descriptors and parameter values (``tensorbits_protocol.descriptors``) and the
REST models (``v2``) state one set of rules: the same data types, the same keys with a rule of
their own, in the same order, and for every value, the same answer. Each value below is checked
both ways, by pydantic through ``schema_errors`` (what HTTP answers) and by the table's checks
(what gRPC answers), and must be accepted by both or refused by both in the same words, field and
rule."""

from __future__ import annotations

from typing import Any, get_args

import pytest
from pydantic import BaseModel

from tensorbits_protocol.descriptors import (
    ANY_VALUE,
    DATATYPES,
    DIMENSION,
    PARAMETER_VALUES,
    REGION_NAME,
    Where,
    check_datatype,
    check_parameter_values,
    check_shape,
    described,
)
from tensorbits_protocol.dtypes import DataType
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.integers import INT64_MAX, INT64_MIN, UINT64_MAX
from tensorbits_protocol.parameters import Level
from tensorbits_protocol.schema_errors import validate_document
from tensorbits_protocol.v2 import (
    MAX_REGION_NAME,
    MAX_WIRE_RANK,
    Datatype,
    InferenceRequest,
    InferenceRequestParameters,
    RequestInputParameters,
    RequestOutputParameters,
)

WHAT = "document"
MODELS: dict[Level, type[BaseModel]] = {
    Level.REQUEST: InferenceRequestParameters,
    Level.INPUT: RequestInputParameters,
    Level.OUTPUT: RequestOutputParameters,
}
# Values of every JSON kind, at and past every bound the table holds.
VALUES: tuple[Any, ...] = (
    True, False, None, 0, 1, -1, 4.0, 1.5, float("inf"), "", "r", "true",
    "r" * MAX_REGION_NAME, "r" * (MAX_REGION_NAME + 1), "é" * (MAX_REGION_NAME + 1), "x" * 5000,
    INT64_MAX, INT64_MAX + 1, UINT64_MAX, UINT64_MAX + 1, INT64_MIN, INT64_MIN - 1, 10**5000,
    [], [1], {}, {"a": 1},
)  # fmt: skip
TENSOR = {"name": "A", "shape": [1], "datatype": "UINT8"}


def over_http(document: dict[str, Any]) -> InvalidRequest | None:
    """The refusal pydantic's model gives ``document`` (through ``schema_errors``), or None."""
    try:
        validate_document(InferenceRequest, document, WHAT)
    except InvalidRequest as refusal:
        return refusal
    return None


def by_table(check: Any, *args: Any) -> InvalidRequest | None:
    try:
        check(*args)
    except InvalidRequest as refusal:
        return refusal
    return None


def same(table: InvalidRequest | None, model: InvalidRequest | None) -> None:
    if model is None or table is None:
        assert table is model, (table, model)
        return
    assert (table.field, table.rule, table.message) == (model.field, model.rule, model.message)


def test_the_data_types_are_the_models() -> None:
    assert tuple(DATATYPES) == get_args(Datatype)
    assert all(DATATYPES[name] is DataType(name) for name in DATATYPES)


@pytest.mark.parametrize("level", list(Level))
def test_the_keys_with_a_rule_are_the_models_fields_in_their_order(level: Level) -> None:
    assert tuple(PARAMETER_VALUES[level]) == tuple(MODELS[level].model_fields)


def test_the_bounds_are_the_models_constants() -> None:
    assert (REGION_NAME.max_chars, DIMENSION.low, DIMENSION.high) == (MAX_REGION_NAME, 0, INT64_MAX)
    assert (ANY_VALUE.low, ANY_VALUE.high) == (INT64_MIN, UINT64_MAX)


def _document(level: Level, parameters: dict[str, Any]) -> tuple[dict[str, Any], Where]:
    if level is Level.REQUEST:
        return {"inputs": [], "parameters": parameters}, Where(WHAT)
    if level is Level.INPUT:
        return {"inputs": [{**TENSOR, "parameters": parameters}]}, Where(WHAT, "inputs", 0, "A")
    document = {"inputs": [], "outputs": [{"name": "A", "parameters": parameters}]}
    return document, Where(WHAT, "outputs", 0, "A")


@pytest.mark.parametrize("level", list(Level))
@pytest.mark.parametrize("value", VALUES, ids=lambda value: described(value)[:30])
def test_each_parameter_value_has_the_models_answer(level: Level, value: Any) -> None:
    for key in (*PARAMETER_VALUES[level], "any_other_key"):
        document, where = _document(level, {key: value})
        same(by_table(check_parameter_values, level, {key: value}, where), over_http(document))


@pytest.mark.parametrize("level", list(Level))
def test_the_first_refusal_is_the_models(level: Level) -> None:
    # Every key wrong, given in the reverse of the models' order: the first field is named.
    parameters: dict[str, Any] = {key: [] for key in reversed((*PARAMETER_VALUES[level], "z", "a"))}
    document, where = _document(level, parameters)
    refusal = by_table(check_parameter_values, level, parameters, where)
    same(refusal, over_http(document))
    assert refusal is not None
    assert refusal.field is not None
    assert refusal.field.endswith(f"parameters.{next(iter(PARAMETER_VALUES[level]))}")


DATATYPE_VALUES = (*DATATYPES, "uint8", "UINT9", "BF16", "BYTES", "", "X" * 200, 5, None, [1])


@pytest.mark.parametrize("value", DATATYPE_VALUES, ids=repr)
def test_each_datatype_has_the_models_answer(value: Any) -> None:
    document = {"inputs": [{**TENSOR, "datatype": value}]}
    refusal = by_table(check_datatype, value, Where(WHAT, "inputs", 0, "A"))
    same(refusal, over_http(document))


SHAPES: tuple[Any, ...] = (
    [], [0], [2, 3], [INT64_MAX], [INT64_MAX + 1], [-1], [2, -3], [INT64_MIN], [1] * MAX_WIRE_RANK,
    [1] * (MAX_WIRE_RANK + 1), [-1] * (MAX_WIRE_RANK + 1), [True], [1.0], ["4"], [None], [[1]],
    None, "x", 4, {},
)  # fmt: skip


@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: repr(shape)[:30])
def test_each_shape_has_the_models_answer(shape: Any) -> None:
    document = {"inputs": [{**TENSOR, "shape": shape}]}
    refusal = by_table(check_shape, shape, Where(WHAT, "inputs", 0, "A"))
    same(refusal, over_http(document))
    if refusal is None:
        assert check_shape(shape, Where(WHAT)) == tuple(shape)


def test_a_shape_past_the_rank_bound_is_said_in_the_tables_words() -> None:
    refusal = over_http({"inputs": [{**TENSOR, "shape": [1] * (MAX_WIRE_RANK + 1)}]})
    assert refusal is not None
    assert (refusal.field, refusal.rule) == ("inputs[0].shape", "max_rank")
    assert refusal.message == (
        f"{WHAT}: inputs[0].shape has more than {MAX_WIRE_RANK} dimensions (MAX_WIRE_RANK; "
        "operators take rank 8 at most)"
    )
