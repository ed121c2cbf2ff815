"""Validation of an operator call against its rule tables (``operators.py``).

Pure functions over names, data types, shapes and parameters: no arrays, no HTTP. The server runs
them before any buffer is touched, and the client runs the same code for its local checks, so both
give the same message. Every failure is an ``InvalidRequest`` naming the tensor, the rule and what
is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

import numpy as np

from tensorbits_protocol.dtypes import DataType
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.operators import (
    REGISTRY,
    Function,
    OperatorSpec,
    ShapeRule,
    SupportRow,
    did_you_mean,
    feature_level_index,
    get_operator,
)
from tensorbits_protocol.parameters import Level, check_entries, check_parameter

Shape = tuple[int, ...]
ParameterValue = str | int | float | bool  # an operator parameter's value (v2.WireParameterValue)


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """What validation needs to know of a tensor: its data type and shape."""

    datatype: DataType
    shape: Shape


@dataclass(frozen=True, slots=True)
class ResolvedCall:
    """A call that passed validation: parameters with defaults filled in, the output's type and
    shape, and the shape each input takes for the kernel (pdpd reshapes the second input)."""

    op: OperatorSpec
    parameters: Mapping[str, str | int]  # read-only (a MappingProxyType): calls are shared
    input_datatype: DataType
    output_datatype: DataType
    output_shape: Shape
    kernel_input_shapes: tuple[Shape, ...]
    shift_left: bool | None  # for shifts: the direction, resolved from the operator or parameter


def _allowed(items: tuple[object, ...]) -> str:
    return ", ".join(str(i) for i in items)


def _where(op: OperatorSpec, params: Mapping[str, str | int]) -> str:
    level = params.get("feature_level")
    return f"{op.name} at feature level {level}" if op.spec == "dml" else op.name


def resolve_parameters(
    op: OperatorSpec, parameters: Mapping[str, object] | None
) -> dict[str, str | int]:
    """The operator's parameters with defaults filled in; invalid ones are errors, and so are
    unknown ones: any key neither the operator's nor accepted by the request-level policy
    (``parameters.POLICY``)."""
    given = dict(parameters or {})
    check_entries("parameters", len(given))
    resolved: dict[str, str | int] = {}
    for key in given:
        if key not in op.parameter_index:
            check_parameter(
                Level.REQUEST,
                f"parameters.{key[:100]}",
                key,
                operator=(op.name, tuple(op.parameter_index)),
            )
    for spec in op.parameters:
        field = f"parameters.{spec.name}"
        if spec.name not in given:
            if spec.required:
                raise InvalidRequest(
                    f"{field}: required by {op.name} (allowed: {_allowed(spec.choices or ())})",
                    field=field,
                    rule="required_parameter",
                )
            if spec.default is not None:
                resolved[spec.name] = spec.default
            continue
        value = given[spec.name]
        if spec.choices is not None:
            if not isinstance(value, str) or value not in spec.choices:
                raise InvalidRequest(
                    f"{field}: {value!r:.100} is not a valid value for {op.name} "
                    f"(allowed: {_allowed(spec.choices)})"
                    f"{did_you_mean(value, spec.choices) if isinstance(value, str) else ''}",
                    field=field,
                    rule="parameter_value",
                )
            resolved[spec.name] = value
        else:
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidRequest(
                    f"{field}: {value!r:.100} is not an integer", field=field, rule="parameter_type"
                )
            resolved[spec.name] = value
    return resolved


def support_row(op: OperatorSpec, parameters: Mapping[str, str | int]) -> SupportRow:
    """The tensor-support row in force: by feature level for DML, the only row otherwise."""
    if op.spec != "dml":
        return op.support[0]
    level = str(parameters["feature_level"])
    for row in op.support:
        assert row.since is not None
        if feature_level_index(row.since) <= feature_level_index(level):
            return row
    raise InvalidRequest(
        f"parameters.feature_level: {op.name} does not exist at feature level {level} "
        f"(introduced at {op.introduced})",
        field="parameters.feature_level",
        rule="feature_level",
    )


def _rank_text(row: SupportRow) -> str:
    if row.min_rank == row.max_rank:
        return str(row.min_rank)
    return f"{row.min_rank} to {row.max_rank}"


def takes_inputs(op: OperatorSpec, got: int) -> str:
    """``"onnx.BitwiseNot-18 takes 1 input (X), got 2"``: the count and the names, which say
    more to a caller who passed arrays in order than any one name could."""
    count = "1 input" if len(op.inputs) == 1 else f"{len(op.inputs)} inputs"
    return f"{op.name} takes {count} ({_allowed(op.inputs)}), got {got}"


def input_count_error(op: OperatorSpec, got: int) -> InvalidRequest:
    """The error for ``got`` inputs given in order to ``op``, which takes fewer."""
    return InvalidRequest(takes_inputs(op, got), field="inputs", rule="input_count")


def _check_inputs_named(op: OperatorSpec, inputs: Mapping[str, TensorSpec]) -> None:
    missing = [name for name in op.inputs if name not in inputs]
    unknown = [name for name in inputs if name not in op.inputs]
    if not missing and not unknown:
        return
    # A misspelt name is both an unknown input and a missing one: both are said, the unknown
    # one with the missing name it is closest to.
    extra = "; ".join(
        f"unknown input '{name[:100]}'{did_you_mean(name, missing or op.inputs)}"
        for name in unknown[:3]
    )
    if missing:
        name = missing[0]
        raise InvalidRequest(
            f"{name}: missing input of {op.name} (inputs: {_allowed(op.inputs)}); "
            + (extra or takes_inputs(op, len(inputs))),
            field=name,
            rule="missing_input",
        )
    name = unknown[0]
    raise InvalidRequest(
        f"{name[:100]}: {op.name} has no input of that name (inputs: {_allowed(op.inputs)}); "
        f"{takes_inputs(op, len(inputs))}",
        field=name[:100],
        rule="unknown_input",
    )


def _check_tensor(
    op: OperatorSpec, row: SupportRow, where: str, name: str, tensor: TensorSpec
) -> None:
    if tensor.datatype not in row.input_types:
        raise InvalidRequest(
            f"{name}: data type {tensor.datatype} is not supported by {where} "
            f"(allowed: {_allowed(row.input_types)})",
            field=name,
            rule="datatype",
        )
    rank = len(tensor.shape)
    if not row.min_rank <= rank <= row.max_rank:
        raise InvalidRequest(
            f"{name}: rank {rank} is not supported by {where} (allowed: {_rank_text(row)})",
            field=name,
            rule="rank",
        )
    for axis, size in enumerate(tensor.shape):
        if size < 0:
            raise InvalidRequest(
                f"{name}: dimension {axis} has negative size {size}", field=name, rule="shape"
            )
        if size == 0 and not op.allow_empty:
            raise InvalidRequest(
                f"{name}: dimension {axis} has size 0, which {op.name} does not allow "
                "(allowed: sizes of at least 1)",
                field=name,
                rule="empty",
            )


def _numpy_broadcast(op: OperatorSpec, names: tuple[str, ...], shapes: tuple[Shape, ...]) -> Shape:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        described = " and ".join(f"{n} {list(s)}" for n, s in zip(names, shapes, strict=True))
        raise InvalidRequest(
            f"{names[-1]}: shapes {described} do not broadcast under NumPy rules for {op.name} "
            "(allowed: equal sizes or 1, aligned from the last dimension)",
            field=names[-1],
            rule="broadcast",
        ) from None


def _pdpd_broadcast(
    op: OperatorSpec, names: tuple[str, ...], shapes: tuple[Shape, ...], axis: int
) -> tuple[Shape, Shape]:
    """OpenVINO pdpd: the second input is broadcast onto the first from ``axis``.

    Returns the output shape (the first input's) and the second input's shape padded with 1s so
    that NumPy broadcasting then does the rest."""
    a, b = shapes
    start = len(a) - len(b) if axis == -1 else axis
    field = f"{names[1]}"
    if len(b) > len(a) or not 0 <= start <= len(a) - len(b):
        raise InvalidRequest(
            f"{field}: shape {list(b)} cannot be broadcast onto {names[0]} {list(a)} from axis "
            f"{axis} under pdpd rules for {op.name} (allowed: axis in -1 or 0 to "
            f"{max(len(a) - len(b), 0)}, rank of {names[1]} at most {len(a)})",
            field="parameters.axis" if len(b) <= len(a) else field,
            rule="broadcast",
        )
    for i, size in enumerate(b):
        if size not in (1, a[start + i]):
            raise InvalidRequest(
                f"{field}: dimension {i} of size {size} does not match {names[0]} dimension "
                f"{start + i} of size {a[start + i]} under pdpd rules for {op.name} "
                "(allowed: equal size or 1)",
                field=field,
                rule="broadcast",
            )
    padded = (1,) * start + b + (1,) * (len(a) - len(b) - start)
    return a, padded


def _output_shape(
    op: OperatorSpec, params: Mapping[str, str | int], specs: tuple[TensorSpec, ...]
) -> tuple[Shape, tuple[Shape, ...]]:
    names = op.inputs
    shapes = tuple(s.shape for s in specs)
    rule = op.shape_rule
    mode = str(params.get("auto_broadcast", "none"))
    if rule is ShapeRule.NUMPY or (rule is ShapeRule.AUTO_BROADCAST and mode == "numpy"):
        return _numpy_broadcast(op, names, shapes), shapes
    if rule is ShapeRule.AUTO_BROADCAST and mode == "pdpd":
        out, padded_b = _pdpd_broadcast(op, names, shapes, int(params.get("axis", -1)))
        return out, (shapes[0], padded_b)
    for name, shape in zip(names[1:], shapes[1:], strict=True):
        if shape != shapes[0]:
            how = "identical Sizes" if op.spec == "dml" else "equal shapes"
            raise InvalidRequest(
                f"{name}: shape {list(shape)} differs from {names[0]} {list(shapes[0])}; "
                f"{op.name} requires {how} (allowed: {list(shapes[0])})",
                field=name,
                rule="shape",
            )
    return shapes[0], shapes


# Calls remembered by validate_call: a server sees the same few operators, types, shapes and
# parameters over and over (a batch of 100 dispatches often holds one distinct call).
VALIDATED_CALLS_CACHED = 4096


def validate_call(
    op: OperatorSpec,
    inputs: Mapping[str, TensorSpec],
    parameters: Mapping[str, object] | None = None,
) -> ResolvedCall:
    """Check one call of ``op`` against its tables; return what execution needs to know.

    A call that passed once is remembered (by operator name, inputs and parameters, each
    parameter with its type, as ``1``, ``1.0`` and ``True`` compare equal); a call that fails
    is checked again each time. The result is shared, hence immutable throughout."""
    if REGISTRY.get(op.name) is not op:  # an operator built outside the registry
        return _validate_call(op, inputs, parameters)
    try:
        return _remembered_call(
            op.name,
            tuple(inputs.items()),
            tuple((k, type(v), v) for k, v in parameters.items()) if parameters else (),
        )
    except TypeError:  # an unhashable value: not one a valid call could have had
        return _validate_call(op, inputs, parameters)


@lru_cache(maxsize=VALIDATED_CALLS_CACHED)
def _remembered_call(
    op_name: str,
    inputs: tuple[tuple[str, TensorSpec], ...],
    parameters: tuple[tuple[str, type, object], ...],
) -> ResolvedCall:
    return _validate_call(
        get_operator(op_name), dict(inputs), {name: value for name, _, value in parameters}
    )


def _validate_call(
    op: OperatorSpec,
    inputs: Mapping[str, TensorSpec],
    parameters: Mapping[str, object] | None,
) -> ResolvedCall:
    params = resolve_parameters(op, parameters)
    row = support_row(op, params)
    where = _where(op, params)
    _check_inputs_named(op, inputs)
    ordered = tuple(inputs[name] for name in op.inputs)
    for name, tensor in zip(op.inputs, ordered, strict=True):
        _check_tensor(op, row, where, name, tensor)
    first = ordered[0].datatype
    for name, tensor in zip(op.inputs[1:], ordered[1:], strict=True):
        if tensor.datatype != first:
            raise InvalidRequest(
                f"{name}: data type {tensor.datatype} differs from {op.inputs[0]}'s {first}; "
                f"all inputs of {op.name} share one data type (allowed: {first})",
                field=name,
                rule="mixed_datatype",
            )
    output_shape, kernel_shapes = _output_shape(op, params, ordered)
    output_type = DataType(str(params["output_datatype"])) if "output_datatype" in params else first
    if row.output_types is not None and output_type not in row.output_types:
        raise InvalidRequest(
            f"{op.output}: data type {output_type} is not supported by {where} "
            f"(allowed: {_allowed(row.output_types)})",
            field=op.output,
            rule="datatype",
        )
    shift_left = {
        Function.SHIFT_LEFT: True,
        Function.SHIFT_RIGHT: False,
        Function.SHIFT: params.get("direction") == "LEFT",
    }.get(op.function)
    return ResolvedCall(
        op=op,
        parameters=MappingProxyType(params),
        input_datatype=first,
        output_datatype=output_type,
        output_shape=output_shape,
        kernel_input_shapes=kernel_shapes,
        shift_left=shift_left,
    )


def validate_output(call: ResolvedCall, datatype: DataType, shape: Shape) -> None:
    """Check a caller-described output tensor (native API) against what the call produces."""
    name = call.op.output
    if datatype != call.output_datatype:
        raise InvalidRequest(
            f"{name}: data type {datatype} does not match what {call.op.name} produces "
            f"(allowed: {call.output_datatype})",
            field=name,
            rule="output_datatype",
        )
    if tuple(shape) != call.output_shape:
        raise InvalidRequest(
            f"{name}: sizes {list(shape)} do not match what {call.op.name} produces "
            f"(allowed: {list(call.output_shape)})",
            field=name,
            rule="output_shape",
        )
