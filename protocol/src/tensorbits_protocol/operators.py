"""The operator registry: every operator of the bitwise family described as data.

Each ``OperatorSpec`` says what its tensors are called, which data types and ranks each feature
level (DirectML) or spec version (OpenVINO, ONNX) allows, how input shapes combine, which
parameters it takes, and which inputs its output may alias. ``validation.py`` reads these tables;
nothing here branches on an operator's name.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from tensorbits_protocol.dtypes import DataType
from tensorbits_protocol.errors import OperatorNotFound


class Function(StrEnum):
    """What an operator computes; the kernels are keyed by it."""

    AND = "and"
    OR = "or"
    XOR = "xor"
    NOT = "not"
    COUNT = "count"
    SHIFT_LEFT = "shift_left"
    SHIFT_RIGHT = "shift_right"
    SHIFT = "shift"  # ONNX BitShift: the ``direction`` parameter picks left or right


class ShapeRule(StrEnum):
    """How input shapes combine into the output shape."""

    IDENTICAL = "identical"  # DirectML: identical Sizes, no implicit broadcasting
    NUMPY = "numpy"  # ONNX multidirectional broadcasting
    AUTO_BROADCAST = "auto_broadcast"  # OpenVINO: the ``auto_broadcast`` parameter picks


class Encoding(StrEnum):
    """How the kernel reads the elements."""

    NATIVE_BITS = "native_bits"  # DirectML: reinterpret as same-width unsigned, bit-exact
    TYPED = "typed"  # OpenVINO/ONNX: act on the typed values (bool logical, signed arithmetic)


Spec = Literal["dml", "openvino", "onnx"]

FEATURE_LEVELS: tuple[str, ...] = (
    "1_0", "2_0", "2_1", "3_0", "3_1", "4_0", "4_1",
    "5_0", "5_1", "5_2", "6_0", "6_1", "6_2", "6_3", "6_4",
)  # fmt: skip
DEFAULT_FEATURE_LEVEL = "6_4"


def feature_level_index(level: str) -> int:
    return FEATURE_LEVELS.index(level)


@dataclass(frozen=True, slots=True)
class SupportRow:
    """One row of a tensor-support table: from ``since`` on, these ranks and data types."""

    since: str | None  # DML feature level the row starts at; None for OpenVINO/ONNX
    min_rank: int
    max_rank: int
    input_types: tuple[DataType, ...]
    output_types: tuple[DataType, ...] | None = None  # None: the output has the input's type


@dataclass(frozen=True, slots=True)
class ParameterSpec:
    """A request parameter: its allowed values (strings) or integer type, default, requiredness."""

    name: str
    choices: tuple[str, ...] | None = None  # None: an integer parameter
    default: str | int | None = None
    required: bool = False
    description: str = ""

    @property
    def type(self) -> Literal["string", "integer"]:
        """The convention above, spelled out for readers of the wire form (``ParameterInfo``)."""
        return "integer" if self.choices is None else "string"


@dataclass(frozen=True, slots=True)
class OperatorSpec:
    name: str
    spec: Spec
    function: Function
    inputs: tuple[str, ...]
    output: str
    shape_rule: ShapeRule
    encoding: Encoding
    support: tuple[SupportRow, ...]  # newest first
    parameters: tuple[ParameterSpec, ...] = ()
    in_place: tuple[str, ...] = ()  # inputs the output may be bound to (identical range and desc)
    allow_empty: bool = True
    summary: str = ""
    parameter_index: dict[str, ParameterSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "parameter_index", {p.name: p for p in self.parameters})

    @property
    def introduced(self) -> str | None:
        """The feature level a DML operator first appears at (the oldest row's)."""
        return self.support[-1].since


# --- data-type sets -----------------------------------------------------------------------------
U8_32 = (DataType.UINT8, DataType.UINT16, DataType.UINT32)
U8_64 = (*U8_32, DataType.UINT64)
DML_ALL = (
    DataType.FP64, DataType.FP32, DataType.FP16,
    DataType.INT64, DataType.INT32, DataType.INT16, DataType.INT8,
    DataType.UINT64, DataType.UINT32, DataType.UINT16, DataType.UINT8,
)  # fmt: skip
INTEGERS = (
    DataType.UINT8, DataType.UINT16, DataType.UINT32, DataType.UINT64,
    DataType.INT8, DataType.INT16, DataType.INT32, DataType.INT64,
)  # fmt: skip
INTEGERS_AND_BOOL = (*INTEGERS, DataType.BOOL)
COUNT_OUTPUTS = (DataType.UINT8, DataType.UINT32)

# --- parameters ---------------------------------------------------------------------------------
FEATURE_LEVEL = ParameterSpec(
    "feature_level",
    choices=FEATURE_LEVELS,
    default=DEFAULT_FEATURE_LEVEL,
    description="DirectML feature level whose tensor-support tables apply",
)
OUTPUT_DATATYPE = ParameterSpec(
    "output_datatype",
    choices=tuple(str(t) for t in COUNT_OUTPUTS),
    default="UINT8",
    description="data type of BIT_COUNT's OutputTensor",
)
AUTO_BROADCAST = ParameterSpec(
    "auto_broadcast",
    choices=("numpy", "none", "pdpd"),
    default="numpy",
    description="OpenVINO broadcasting rule",
)
AXIS = ParameterSpec(
    "axis", default=-1, description="pdpd broadcasting: where input_2 aligns on input_1"
)
DIRECTION = ParameterSpec(
    "direction", choices=("LEFT", "RIGHT"), required=True, description="shift direction"
)

# --- support tables -----------------------------------------------------------------------------
DML_BITWISE_SUPPORT = (
    SupportRow("4_1", 1, 8, DML_ALL),
    SupportRow("3_0", 1, 8, U8_32),
)
DML_COUNT_SUPPORT = (
    SupportRow("4_1", 1, 8, DML_ALL, COUNT_OUTPUTS),
    SupportRow("3_0", 1, 8, U8_32, COUNT_OUTPUTS),
)
DML_SHIFT_SUPPORT = (
    SupportRow("4_1", 1, 8, U8_64),
    SupportRow("3_0", 1, 8, U8_32),
    SupportRow("2_1", 4, 4, U8_32),
)


def _dml(
    suffix: str,
    function: Function,
    inputs: tuple[str, ...],
    support: tuple[SupportRow, ...],
    *,
    extra: tuple[ParameterSpec, ...] = (),
    in_place: tuple[str, ...],
    summary: str,
) -> OperatorSpec:
    return OperatorSpec(
        name=f"DML_OPERATOR_ELEMENT_WISE_{suffix}",
        spec="dml",
        function=function,
        inputs=inputs,
        output="OutputTensor",
        shape_rule=ShapeRule.IDENTICAL,
        encoding=Encoding.NATIVE_BITS,
        support=support,
        parameters=(FEATURE_LEVEL, *extra),
        in_place=in_place,
        allow_empty=False,
        summary=summary,
    )


@dataclass(frozen=True, slots=True)
class _TypedForms:
    """How a specification of typed operators names their tensors and shapes their binary
    calls (a unary call keeps its input's shape)."""

    spec: Spec
    binary_inputs: tuple[str, ...]
    unary_inputs: tuple[str, ...]
    binary_output: str
    unary_output: str
    binary_shape_rule: ShapeRule
    binary_parameters: tuple[ParameterSpec, ...]


_OPENVINO_FORMS = _TypedForms(
    "openvino",
    ("input_1", "input_2"),
    ("input_1",),
    "output_1",
    "output_1",
    ShapeRule.AUTO_BROADCAST,
    (AUTO_BROADCAST, AXIS),
)
_ONNX_FORMS = _TypedForms("onnx", ("A", "B"), ("X",), "C", "Y", ShapeRule.NUMPY, ())


def _typed(
    forms: _TypedForms, name: str, function: Function, types: tuple[DataType, ...], summary: str
) -> OperatorSpec:
    binary = function is not Function.NOT
    return OperatorSpec(
        name=f"{forms.spec}.{name}",
        spec=forms.spec,
        function=function,
        inputs=forms.binary_inputs if binary else forms.unary_inputs,
        output=forms.binary_output if binary else forms.unary_output,
        shape_rule=forms.binary_shape_rule if binary else ShapeRule.IDENTICAL,
        encoding=Encoding.TYPED,
        support=(SupportRow(None, 0, 8, types),),
        parameters=forms.binary_parameters if binary else (),
        summary=summary,
    )


def _openvino(
    name: str, function: Function, types: tuple[DataType, ...], summary: str
) -> OperatorSpec:
    return _typed(_OPENVINO_FORMS, name, function, types, summary)


def _onnx(name: str, function: Function, summary: str) -> OperatorSpec:
    return _typed(_ONNX_FORMS, name, function, INTEGERS, summary)


AB = ("ATensor", "BTensor")
OPERATORS: tuple[OperatorSpec, ...] = (
    _dml("BIT_AND", Function.AND, AB, DML_BITWISE_SUPPORT, in_place=AB,
         summary="bitwise AND of the stored bits"),
    _dml("BIT_OR", Function.OR, AB, DML_BITWISE_SUPPORT, in_place=AB,
         summary="bitwise OR of the stored bits"),
    _dml("BIT_XOR", Function.XOR, AB, DML_BITWISE_SUPPORT, in_place=AB,
         summary="bitwise XOR of the stored bits"),
    _dml("BIT_NOT", Function.NOT, ("InputTensor",), DML_BITWISE_SUPPORT, in_place=("InputTensor",),
         summary="bitwise NOT of the stored bits"),
    _dml("BIT_COUNT", Function.COUNT, ("InputTensor",), DML_COUNT_SUPPORT,
         extra=(OUTPUT_DATATYPE,), in_place=(),
         summary="population count of the stored bits"),
    _dml("BIT_SHIFT_LEFT", Function.SHIFT_LEFT, AB, DML_SHIFT_SUPPORT, in_place=AB,
         summary="ATensor << BTensor; counts at or above the width give 0"),
    _dml("BIT_SHIFT_RIGHT", Function.SHIFT_RIGHT, AB, DML_SHIFT_SUPPORT, in_place=AB,
         summary="ATensor >> BTensor (logical); counts at or above the width give 0"),
    _openvino("BitwiseAnd-13", Function.AND, INTEGERS_AND_BOOL, "bitwise AND (BOOL: logical)"),
    _openvino("BitwiseOr-13", Function.OR, INTEGERS_AND_BOOL, "bitwise OR (BOOL: logical)"),
    _openvino("BitwiseXor-13", Function.XOR, INTEGERS_AND_BOOL, "bitwise XOR (BOOL: logical)"),
    _openvino("BitwiseNot-13", Function.NOT, INTEGERS_AND_BOOL, "bitwise NOT (BOOL: logical)"),
    _openvino("BitwiseLeftShift-15", Function.SHIFT_LEFT, INTEGERS, "input_1 << input_2"),
    _openvino("BitwiseRightShift-15", Function.SHIFT_RIGHT, INTEGERS,
              "input_1 >> input_2 (arithmetic for signed types)"),
    _onnx("BitwiseAnd-18", Function.AND, "bitwise AND"),
    _onnx("BitwiseOr-18", Function.OR, "bitwise OR"),
    _onnx("BitwiseXor-18", Function.XOR, "bitwise XOR"),
    _onnx("BitwiseNot-18", Function.NOT, "bitwise NOT"),
    OperatorSpec(
        name="onnx.BitShift-11",
        spec="onnx",
        function=Function.SHIFT,
        inputs=("X", "Y"),
        output="Z",
        shape_rule=ShapeRule.NUMPY,
        encoding=Encoding.TYPED,
        support=(SupportRow(None, 0, 8, U8_64),),
        parameters=(DIRECTION,),
        summary="X shifted by Y in the given direction",
    ),
)  # fmt: skip

REGISTRY: dict[str, OperatorSpec] = {op.name: op for op in OPERATORS}


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'X'?"`` for the closest of ``choices`` to a misspelt ``value``, or ""
    when none is close. Case is ignored (``x`` for ``X``); the value is cut to 200 characters
    first, as difflib's time grows with the product of the lengths."""
    folded = {choice.casefold(): choice for choice in choices}
    close = difflib.get_close_matches(value[:200].casefold(), folded, n=1)
    return f"; did you mean '{folded[close[0]]}'?" if close else ""


def unknown_model(name: str, graphs: Sequence[str] = ()) -> OperatorNotFound:
    """The 404 of a name that is no operator and none of ``graphs`` (the graph models a server
    has loaded): where what exists is listed, how many, and the closest name when one is close.
    The operator listing holds no graph model, so with some the two listings are counted apart."""
    listed = (
        f"POST /v2/repository/index lists the {len(REGISTRY) + len(graphs)} that exist, "
        f"GET /v1/operators the {len(REGISTRY)} operators"
        if graphs
        else f"POST /v2/repository/index or GET /v1/operators lists the {len(REGISTRY)} that exist"
    )
    return OperatorNotFound(
        f"unknown model or operator '{name[:200]}' ({listed})"
        f"{did_you_mean(name, [*REGISTRY, *graphs])}",
        field="model_name",
        rule="unknown_operator",
    )


def get_operator(name: str) -> OperatorSpec:
    """The operator called ``name``; OperatorNotFound (404) names what exists when there is none,
    and the closest name when one is close (``unknown_model``)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise unknown_model(name) from None
