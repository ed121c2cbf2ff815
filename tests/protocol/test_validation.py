"""One test per validation rule, with the message, field, rule and status checked, plus the
whole data-type × feature-level table of docs/semantics.md written out independently."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np
import pytest
from support.host_calls import compute, validate_arrays

from tensorbits_protocol.dtypes import DataType
from tensorbits_protocol.errors import InvalidRequest, OperatorNotFound, TensorbitsError
from tensorbits_protocol.operators import FEATURE_LEVELS, OPERATORS, get_operator
from tensorbits_protocol.validation import (
    ResolvedCall,
    TensorSpec,
    validate_call,
    validate_output,
)

DML = "DML_OPERATOR_ELEMENT_WISE_"
U8, U16, U32, U64 = DataType.UINT8, DataType.UINT16, DataType.UINT32, DataType.UINT64
I8, I16, I32, I64 = DataType.INT8, DataType.INT16, DataType.INT32, DataType.INT64
F16, F32, F64, BOOL = DataType.FP16, DataType.FP32, DataType.FP64, DataType.BOOL


def spec(dt: DataType, *shape: int) -> TensorSpec:
    return TensorSpec(dt, tuple(shape))


def call(
    model: str, inputs: Mapping[str, TensorSpec], params: Mapping[str, object] | None = None
) -> ResolvedCall:
    return validate_call(get_operator(model), inputs, params)


def rejected(fn: Callable[[], object], message: str, field: str, rule: str) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        fn()
    err = info.value
    assert message in str(err), str(err)
    assert err.message == str(err)
    assert err.field == field
    assert err.rule == rule
    assert err.status_code == 400
    assert err.code == "invalid_request"
    assert err.to_dict() == {
        "error": err.message,
        "code": "invalid_request",
        "field": field,
        "rule": rule,
    }
    return err


def ab(dt: DataType, shape: tuple[int, ...] = (2, 2), dt_b: DataType | None = None) -> Any:
    return {"ATensor": TensorSpec(dt, shape), "BTensor": TensorSpec(dt_b or dt, shape)}


# --- refusals of one call, verbatim ------------------------------------------------------------
CALL_REFUSALS = {
    # id: (operator, inputs, parameters, field, rule, message)
    # data types and feature levels
    "at-a-feature-level": (
        DML + "BIT_AND", ab(I32), {"feature_level": "3_0"}, "ATensor", "datatype",
        "ATensor: data type INT32 is not supported by DML_OPERATOR_ELEMENT_WISE_BIT_AND at "
        "feature level 3_0 (allowed: UINT8, UINT16, UINT32)"),
    "dml-shift-at-4_0": (
        DML + "BIT_SHIFT_LEFT", ab(U64), {"feature_level": "4_0"}, "ATensor", "datatype",
        "ATensor: data type UINT64 is not supported by DML_OPERATOR_ELEMENT_WISE_BIT_SHIFT_LEFT"
        " at feature level 4_0 (allowed: UINT8, UINT16, UINT32)"),
    "openvino-shift-bool": (
        "openvino.BitwiseLeftShift-15", {"input_1": spec(BOOL, 2), "input_2": spec(BOOL, 2)}, None,
        "input_1", "datatype",
        "input_1: data type BOOL is not supported by openvino.BitwiseLeftShift-15 (allowed: "
        "UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64)"),
    "dml-shift-signed": (  # shifts never take signed or float types on DML
        DML + "BIT_SHIFT_RIGHT", ab(I32), None, "ATensor", "datatype",
        "data type INT32 is not supported by DML_OPERATOR_ELEMENT_WISE_BIT_SHIFT_RIGHT at "
        "feature level 6_4 (allowed: UINT8, UINT16, UINT32, UINT64)"),
    "onnx-bool": (
        "onnx.BitwiseNot-18", {"X": spec(BOOL, 3)}, None, "X", "datatype",
        "X: data type BOOL is not supported by onnx.BitwiseNot-18 (allowed: UINT8, UINT16, "
        "UINT32, UINT64, INT8, INT16, INT32, INT64)"),
    "onnx-bitshift-signed": (
        "onnx.BitShift-11", {"X": spec(I8, 3), "Y": spec(I8, 3)}, {"direction": "LEFT"},
        "X", "datatype",
        "X: data type INT8 is not supported by onnx.BitShift-11 (allowed: UINT8, UINT16, "
        "UINT32, UINT64)"),
    "bit-and-before-its-feature-level": (
        DML + "BIT_AND", ab(U8), {"feature_level": "2_1"},
        "parameters.feature_level", "feature_level",
        "parameters.feature_level: DML_OPERATOR_ELEMENT_WISE_BIT_AND does not exist at feature "
        "level 2_1 (introduced at 3_0)"),
    # ranks and sizes
    "negative-dimension": (
        "onnx.BitwiseNot-18", {"X": spec(U8, 3, -1)}, None, "X", "shape",
        "X: dimension 1 has negative size -1"),
    # inputs
    "mixed-datatypes-dml": (
        DML + "BIT_AND", ab(U8, dt_b=U16), None, "BTensor", "mixed_datatype",
        "BTensor: data type UINT16 differs from ATensor's UINT8; all inputs of "
        "DML_OPERATOR_ELEMENT_WISE_BIT_AND share one data type (allowed: UINT8)"),
    "mixed-datatypes-onnx": (
        "onnx.BitwiseXor-18", {"A": spec(U8, 2), "B": spec(I8, 2)}, None, "B", "mixed_datatype",
        "B: data type INT8 differs from A's UINT8"),
    "missing-input": (
        DML + "BIT_AND", {"ATensor": spec(U8, 2)}, None, "BTensor", "missing_input",
        "BTensor: missing input of DML_OPERATOR_ELEMENT_WISE_BIT_AND (inputs: ATensor, BTensor)"),
    "unknown-input-name": (
        "onnx.BitwiseNot-18", {"X": spec(U8, 2), "input_1": spec(U8, 2)}, None,
        "input_1", "unknown_input",
        "input_1: onnx.BitwiseNot-18 has no input of that name (inputs: X)"),
    # parameters
    "unknown-parameter-dml": (
        DML + "BIT_NOT", {"InputTensor": spec(U8, 2)}, {"output_datatype": "UINT8"},
        "parameters.output_datatype", "unknown_parameter",
        "parameters.output_datatype: unknown parameter for DML_OPERATOR_ELEMENT_WISE_BIT_NOT "
        "(allowed: feature_level; the protocol's: binary_data_output, sequence_id, "
        "sequence_start, sequence_end, priority, timeout, headers, triton_*)"),
    "unknown-parameter-onnx": (
        "onnx.BitwiseAnd-18", {"A": spec(U8, 2), "B": spec(U8, 2)}, {"axis": 0},
        "parameters.axis", "unknown_parameter",
        "parameters.axis: unknown parameter for onnx.BitwiseAnd-18 (allowed: none; the "
        "protocol's: binary_data_output, sequence_id, sequence_start, sequence_end, priority, "
        "timeout, headers, triton_*)"),
    "missing-required-direction": (
        "onnx.BitShift-11", {"X": spec(U8, 2), "Y": spec(U8, 2)}, None,
        "parameters.direction", "required_parameter",
        "parameters.direction: required by onnx.BitShift-11 (allowed: LEFT, RIGHT)"),
    # broadcasting
    "numpy-broadcast-onnx": (
        "onnx.BitwiseAnd-18", {"A": spec(U8, 2, 3), "B": spec(U8, 4)}, None, "B", "broadcast",
        "B: shapes A [2, 3] and B [4] do not broadcast under NumPy rules for onnx.BitwiseAnd-18 "
        "(allowed: equal sizes or 1, aligned from the last dimension)"),
    "numpy-broadcast-openvino-default-rule": (  # openvino's default rule is NumPy's
        "openvino.BitwiseXor-13", {"input_1": spec(I64, 8, 1, 6, 1), "input_2": spec(I64, 7, 2, 5)},
        None, "input_2", "broadcast",
        "input_2: shapes input_1 [8, 1, 6, 1] and input_2 [7, 2, 5] do not broadcast under NumPy "
        "rules for openvino.BitwiseXor-13"),
    "none-requires-equal-shapes": (
        "openvino.BitwiseOr-13", {"input_1": spec(U8, 2, 3), "input_2": spec(U8, 1, 3)},
        {"auto_broadcast": "none"}, "input_2", "shape",
        "input_2: shape [1, 3] differs from input_1 [2, 3]; openvino.BitwiseOr-13 requires equal "
        "shapes (allowed: [2, 3])"),
    "dml-requires-identical-sizes": (
        DML + "BIT_XOR", {"ATensor": spec(U8, 2, 3), "BTensor": spec(U8, 1, 3)}, None,
        "BTensor", "shape",
        "BTensor: shape [1, 3] differs from ATensor [2, 3]; DML_OPERATOR_ELEMENT_WISE_BIT_XOR "
        "requires identical Sizes (allowed: [2, 3])"),
}  # fmt: skip


@pytest.mark.parametrize(
    ("model", "inputs", "params", "field", "rule", "message"),
    CALL_REFUSALS.values(),
    ids=list(CALL_REFUSALS),
)
def test_call_refusals_verbatim(
    model: str,
    inputs: Mapping[str, TensorSpec],
    params: Mapping[str, object] | None,
    field: str,
    rule: str,
    message: str,
) -> None:
    rejected(lambda: call(model, inputs, params), message, field, rule)


# --- feature levels ------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["BIT_SHIFT_LEFT", "BIT_SHIFT_RIGHT"])
def test_operator_missing_at_feature_level_shifts_at_2_0(model: str) -> None:
    rejected(
        lambda: call(DML + model, ab(U8, (1, 1, 2, 2)), {"feature_level": "2_0"}),
        f"parameters.feature_level: DML_OPERATOR_ELEMENT_WISE_{model} does not exist at "
        "feature level 2_0 (introduced at 2_1)",
        "parameters.feature_level",
        "feature_level",
    )


# --- ranks and sizes -----------------------------------------------------------------------------
@pytest.mark.parametrize("rank", [1, 3, 5, 8])
def test_shift_rank_exactly_four_at_2_1(rank: int) -> None:
    rejected(
        lambda: call(DML + "BIT_SHIFT_LEFT", ab(U16, (2,) * rank), {"feature_level": "2_1"}),
        f"ATensor: rank {rank} is not supported by DML_OPERATOR_ELEMENT_WISE_BIT_SHIFT_LEFT at "
        "feature level 2_1 (allowed: 4)",
        "ATensor",
        "rank",
    )


def test_shift_rank_four_accepted_at_2_1_and_any_rank_from_3_0() -> None:
    ok = call(DML + "BIT_SHIFT_RIGHT", ab(U32, (1, 1, 2, 3)), {"feature_level": "2_1"})
    assert ok.output_shape == (1, 1, 2, 3)
    assert ok.shift_left is False
    assert call(DML + "BIT_SHIFT_RIGHT", ab(U32, (3,)), {"feature_level": "3_0"}).output_shape == (
        3,
    )


@pytest.mark.parametrize(
    ("model", "inputs", "allowed"),
    [
        (DML + "BIT_XOR", ab(U8, (1,) * 9), "1 to 8"),
        ("openvino.BitwiseNot-13", {"input_1": spec(U8, *(1,) * 9)}, "0 to 8"),
        ("onnx.BitwiseAnd-18", {"A": spec(U8, *(1,) * 9), "B": spec(U8, 1)}, "0 to 8"),
    ],
)
def test_rank_above_eight(model: str, inputs: Any, allowed: str) -> None:
    first = get_operator(model).inputs[0]
    where = f"{model} at feature level 6_4" if model.startswith("DML") else model
    rejected(
        lambda: call(model, inputs),
        f"{first}: rank 9 is not supported by {where} (allowed: {allowed})",
        first,
        "rank",
    )


def test_rank_zero_rejected_for_dml_allowed_elsewhere() -> None:
    rejected(
        lambda: call(DML + "BIT_NOT", {"InputTensor": spec(U8)}),
        "InputTensor: rank 0 is not supported by DML_OPERATOR_ELEMENT_WISE_BIT_NOT at feature "
        "level 6_4 (allowed: 1 to 8)",
        "InputTensor",
        "rank",
    )
    assert call("onnx.BitwiseNot-18", {"X": spec(U8)}).output_shape == ()
    assert call("openvino.BitwiseNot-13", {"input_1": spec(BOOL)}).output_shape == ()


def test_empty_dimension_rejected_for_dml_allowed_for_onnx_and_openvino() -> None:
    rejected(
        lambda: call(DML + "BIT_COUNT", {"InputTensor": spec(U8, 2, 0)}),
        "InputTensor: dimension 1 has size 0, which DML_OPERATOR_ELEMENT_WISE_BIT_COUNT does not "
        "allow (allowed: sizes of at least 1)",
        "InputTensor",
        "empty",
    )
    rejected(
        lambda: call(DML + "BIT_OR", ab(U8, (0, 3))),
        "ATensor: dimension 0 has size 0",
        "ATensor",
        "empty",
    )
    assert call("onnx.BitwiseOr-18", {"A": spec(U8, 0, 3), "B": spec(U8, 3)}).output_shape == (
        0,
        3,
    )
    got = call("openvino.BitwiseXor-13", {"input_1": spec(I8, 2, 0), "input_2": spec(I8, 1, 0)})
    assert got.output_shape == (2, 0)


# --- inputs --------------------------------------------------------------------------------------


def test_unknown_input_name_is_truncated() -> None:
    name = "Z" * 500
    err = rejected(
        lambda: call("onnx.BitwiseNot-18", {"X": spec(U8, 2), name: spec(U8, 2)}),
        "Z" * 100 + ": onnx.BitwiseNot-18 has no input",
        "Z" * 100,
        "unknown_input",
    )
    assert "Z" * 101 not in err.message


# --- parameters ----------------------------------------------------------------------------------


def test_protocol_parameters_are_not_operator_parameters() -> None:
    ok = call(
        "onnx.BitwiseAnd-18",
        {"A": spec(U8, 2), "B": spec(U8, 2)},
        {
            "binary_data_output": True,
            "sequence_id": 3,
            "priority": 1,
            "triton_enable_empty_final_response": True,
            "triton_not_yet_invented": "x",
        },
    )
    assert ok.parameters == {}


@pytest.mark.parametrize(
    ("model", "inputs", "params", "field", "allowed"),
    [
        (
            DML + "BIT_AND",
            ab(U8),
            {"feature_level": "7_0"},
            "feature_level",
            ", ".join(FEATURE_LEVELS),
        ),
        (DML + "BIT_AND", ab(U8), {"feature_level": 3}, "feature_level", "1_0, 2_0, 2_1"),
        (
            "openvino.BitwiseOr-13",
            {"input_1": spec(U8, 2), "input_2": spec(U8, 2)},
            {"auto_broadcast": "NUMPY"},
            "auto_broadcast",
            "numpy, none, pdpd",
        ),
        (
            "onnx.BitShift-11",
            {"X": spec(U8, 2), "Y": spec(U8, 2)},
            {"direction": "left"},
            "direction",
            "LEFT, RIGHT",
        ),
    ],
)
def test_bad_parameter_value(
    model: str, inputs: Any, params: dict[str, Any], field: str, allowed: str
) -> None:
    value = params[field]
    rejected(
        lambda: call(model, inputs, params),
        f"parameters.{field}: {value!r} is not a valid value for {model} (allowed: {allowed}",
        f"parameters.{field}",
        "parameter_value",
    )


def test_bit_count_output_datatype() -> None:
    x = {"InputTensor": spec(U16, 2, 2)}
    for bad in ("UINT16", "UINT64", "uint8", "INT32"):
        rejected(
            partial(call, DML + "BIT_COUNT", x, {"output_datatype": bad}),
            f"parameters.output_datatype: '{bad}' is not a valid value for "
            "DML_OPERATOR_ELEMENT_WISE_BIT_COUNT (allowed: UINT8, UINT32)",
            "parameters.output_datatype",
            "parameter_value",
        )
    assert call(DML + "BIT_COUNT", x).output_datatype is U8
    assert call(DML + "BIT_COUNT", x, {"output_datatype": "UINT32"}).output_datatype is U32
    # The count's output type is its own, not the input's.
    got = call(DML + "BIT_COUNT", {"InputTensor": spec(F64, 3)}, {"output_datatype": "UINT8"})
    assert (got.input_datatype, got.output_datatype) == (F64, U8)


def test_direction_picks_the_shift() -> None:
    xy = {"X": spec(U8, 2), "Y": spec(U8, 2)}
    assert call("onnx.BitShift-11", xy, {"direction": "LEFT"}).shift_left is True
    assert call("onnx.BitShift-11", xy, {"direction": "RIGHT"}).shift_left is False


@pytest.mark.parametrize("axis", ["1", 1.0, True, None, [1]])
def test_non_integer_axis(axis: object) -> None:
    rejected(
        lambda: call(
            "openvino.BitwiseAnd-13",
            {"input_1": spec(U8, 2, 3), "input_2": spec(U8, 3)},
            {"auto_broadcast": "pdpd", "axis": axis},
        ),
        f"parameters.axis: {axis!r} is not an integer",
        "parameters.axis",
        "parameter_type",
    )


def test_a_remembered_call_is_shared_read_only_and_keyed_by_parameter_type() -> None:
    model = "openvino.BitwiseAnd-13"
    inputs = {"input_1": spec(U8, 2, 3), "input_2": spec(U8, 3)}
    pdpd = {"auto_broadcast": "pdpd", "axis": 1}
    first = call(model, inputs, pdpd)
    assert call(model, dict(inputs), dict(pdpd)) is first
    with pytest.raises(TypeError):
        first.parameters["axis"] = 0  # type: ignore[index]
    # True == 1.0 == 1 in Python; a call remembered with 1 must not let the others through.
    for axis in (True, 1.0):
        rejected(
            partial(call, model, inputs, {"auto_broadcast": "pdpd", "axis": axis}),
            f"parameters.axis: {axis!r} is not an integer",
            "parameters.axis",
            "parameter_type",
        )
    # Another shape is another call, checked on its own.
    rejected(
        lambda: call(model, {"input_1": spec(U8, 2, 3), "input_2": spec(U8, 4)}, pdpd),
        "input_2",
        "input_2",
        "broadcast",
    )


# --- broadcasting --------------------------------------------------------------------------------


def test_broadcast_example_shape_validates() -> None:
    got = call(
        "openvino.BitwiseAnd-13", {"input_1": spec(U8, 8, 1, 6, 1), "input_2": spec(U8, 7, 1, 5)}
    )
    assert got.output_shape == (8, 7, 6, 5)
    assert got.parameters == {"auto_broadcast": "numpy", "axis": -1}


def pdpd(a: tuple[int, ...], b: tuple[int, ...], axis: int | None = None) -> ResolvedCall:
    params: dict[str, object] = {"auto_broadcast": "pdpd"}
    if axis is not None:
        params["axis"] = axis
    return call(
        "openvino.BitwiseAnd-13", {"input_1": spec(U8, *a), "input_2": spec(U8, *b)}, params
    )


def test_pdpd_accepted_shapes() -> None:
    got = pdpd((2, 3, 4, 5), (3, 4), axis=1)
    assert got.output_shape == (2, 3, 4, 5)
    assert got.kernel_input_shapes == ((2, 3, 4, 5), (1, 3, 4, 1))
    assert pdpd((2, 3, 4, 5), (4, 1)).kernel_input_shapes[1] == (1, 1, 4, 1)
    assert pdpd((2, 3, 4, 5), (1, 5), axis=-1).kernel_input_shapes[1] == (1, 1, 1, 5)
    assert pdpd((2, 3), ()).kernel_input_shapes[1] == (1, 1)


@pytest.mark.parametrize("axis", [3, 4, -2, 100])
def test_pdpd_axis_out_of_range(axis: int) -> None:
    rejected(
        lambda: pdpd((2, 3, 4, 5), (3, 4), axis=axis),
        f"input_2: shape [3, 4] cannot be broadcast onto input_1 [2, 3, 4, 5] from axis {axis} "
        "under pdpd rules for openvino.BitwiseAnd-13 (allowed: axis in -1 or 0 to 2, rank of "
        "input_2 at most 4)",
        "parameters.axis",
        "broadcast",
    )


def test_pdpd_second_input_of_higher_rank() -> None:
    rejected(
        lambda: pdpd((3, 4), (2, 3, 4)),
        "input_2: shape [2, 3, 4] cannot be broadcast onto input_1 [3, 4] from axis -1",
        "input_2",
        "broadcast",
    )


def test_pdpd_dimension_mismatch() -> None:
    rejected(
        lambda: pdpd((2, 3, 4, 5), (3, 5), axis=1),
        "input_2: dimension 1 of size 5 does not match input_1 dimension 2 of size 4 under pdpd "
        "rules for openvino.BitwiseAnd-13 (allowed: equal size or 1)",
        "input_2",
        "broadcast",
    )
    # pdpd broadcasts only the second input: a 1 in the first does not stretch.
    rejected(lambda: pdpd((2, 1), (2, 3)), "dimension 1 of size 3", "input_2", "broadcast")


# --- operators and outputs -----------------------------------------------------------------------
def test_unknown_operator_is_404() -> None:
    with pytest.raises(OperatorNotFound) as info:
        get_operator("DML_OPERATOR_ELEMENT_WISE_BIT_NAND")
    err = info.value
    assert err.status_code == 404
    assert err.code == "not_found"
    assert err.field == "model_name"
    assert err.rule == "unknown_operator"
    assert "unknown model or operator 'DML_OPERATOR_ELEMENT_WISE_BIT_NAND'" in err.message
    assert f"lists the {len(OPERATORS)} that exist" in err.message
    assert isinstance(err, TensorbitsError)
    assert not isinstance(err, InvalidRequest)
    # The one place the count is written: the 18 operators of docs/semantics.md (adding one
    # changes this line, the table row, the kernel if it is new, and the README's table).
    assert len(OPERATORS) == 18


def test_unknown_operator_name_is_truncated() -> None:
    with pytest.raises(OperatorNotFound) as info:
        get_operator("x" * 5000)
    assert "x" * 200 + "'" in info.value.message
    assert "x" * 201 not in info.value.message


def test_engine_validates_before_computing(numpy_backend: Any) -> None:
    with pytest.raises(OperatorNotFound):
        compute(numpy_backend, "onnx.BitwiseNand-18", {"A": np.zeros(2, np.uint8)})
    with pytest.raises(InvalidRequest, match="data type INT32 is not supported"):
        compute(
            numpy_backend,
            DML + "BIT_AND",
            {"ATensor": np.zeros(2, np.int32), "BTensor": np.zeros(2, np.int32)},
            {"feature_level": "4_0"},
        )
    got = validate_arrays(
        "openvino.BitwiseNot-13", {"input_1": np.zeros((2, 3), np.dtype(">i4"))}, None
    )
    assert got.input_datatype is I32


def test_validate_output_datatype_mismatch() -> None:
    resolved = call(DML + "BIT_COUNT", {"InputTensor": spec(U32, 2, 2)})
    rejected(
        lambda: validate_output(resolved, U32, (2, 2)),
        "OutputTensor: data type UINT32 does not match what DML_OPERATOR_ELEMENT_WISE_BIT_COUNT "
        "produces (allowed: UINT8)",
        "OutputTensor",
        "output_datatype",
    )
    validate_output(resolved, U8, (2, 2))


def test_validate_output_shape_mismatch() -> None:
    resolved = call("onnx.BitwiseAnd-18", {"A": spec(I16, 3, 1), "B": spec(I16, 4)})
    rejected(
        lambda: validate_output(resolved, I16, (3, 1)),
        "C: sizes [3, 1] do not match what onnx.BitwiseAnd-18 produces (allowed: [3, 4])",
        "C",
        "output_shape",
    )
    rejected(
        lambda: validate_output(resolved, I16, (12,)),
        "C: sizes [12] do not match",
        "C",
        "output_shape",
    )
    validate_output(resolved, I16, (3, 4))
    validate_output(resolved, I16, [3, 4])  # type: ignore[arg-type]


# --- the whole support table, written out from docs/semantics.md --------------------------------------
DML_ALL = {U8, U16, U32, U64, I8, I16, I32, I64, F16, F32, F64}
U8_32 = {U8, U16, U32}
INTS = {U8, U16, U32, U64, I8, I16, I32, I64}


def expected_types(model: str, level: str) -> set[DataType] | None:
    """None: the operator does not exist at that feature level."""
    at = FEATURE_LEVELS.index
    if model.startswith("DML"):
        shift = "SHIFT" in model
        if at(level) < at("2_1") or (not shift and at(level) < at("3_0")):
            return None
        if at(level) >= at("4_1"):
            return {U8, U16, U32, U64} if shift else DML_ALL
        return U8_32
    if model == "onnx.BitShift-11":
        return {U8, U16, U32, U64}
    if model.startswith("onnx."):
        return INTS
    if "Shift" in model:
        return INTS
    return INTS | {BOOL}


@pytest.mark.parametrize("model", [op.name for op in OPERATORS])
def test_support_table(model: str) -> None:
    op = get_operator(model)
    levels = FEATURE_LEVELS if op.spec == "dml" else ("-",)
    for level in levels:
        params: dict[str, object] = {"feature_level": level} if op.spec == "dml" else {}
        if op.name == "onnx.BitShift-11":
            params["direction"] = "LEFT"
        shape = (1, 2, 1, 3) if level == "2_1" else (2, 3)
        allowed = expected_types(model, level)
        for dt in DataType:
            inputs = {name: TensorSpec(dt, shape) for name in op.inputs}
            if allowed is None:
                rejected(
                    partial(validate_call, op, inputs, params),
                    f"does not exist at feature level {level}",
                    "parameters.feature_level",
                    "feature_level",
                )
            elif dt in allowed:
                resolved = validate_call(op, inputs, params)
                assert resolved.output_shape == shape
                assert resolved.input_datatype is dt
                want_out = U8 if op.name.endswith("BIT_COUNT") else dt
                assert resolved.output_datatype is want_out
            else:
                err = rejected(
                    partial(validate_call, op, inputs, params),
                    f"{op.inputs[0]}: data type {dt} is not supported by {op.name}",
                    op.inputs[0],
                    "datatype",
                )
                listed = err.message.rsplit("(allowed: ", 1)[1].rstrip(")").split(", ")
                assert set(listed) == {str(t) for t in allowed}
