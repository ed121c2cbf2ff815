"""One typed method per operator, grouped by spec: ``client.dml``, ``client.openvino``,
``client.onnx``.

A method is one row of the operator table (``tensorbits_protocol.operators.OPERATORS``) sent
through a *shape*: a function whose signature is the method's (its inputs, then its parameters
with the table's defaults) and which sends the operator's name, its inputs in the table's order
and every parameter explicitly. ``bit_and = _dml_binary("DML_OPERATOR_ELEMENT_WISE_BIT_AND")``
is the whole method; its docstring is the table's summary. Adding an operator is a table row, a
kernel and one such line (tests/client/test_operator_methods.py fails until there is one).

Each family is generic in what a call returns, so the same methods serve both clients: for
``Client`` a method returns the result array, for ``AsyncClient`` an awaitable of it. The result
keeps the dtype and shape the server declares. ``Batch``'s DML methods are made the same way, from
shapes of their own (_batch.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from functools import partial
from types import FunctionType, MethodType
from typing import (
    Any,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    Self,
    TypeAlias,
    TypeVar,
    overload,
)

import numpy.typing as npt

from tensorbits_client._codec import InferResult
from tensorbits_client._types import NOT_GIVEN, Array, NotGiven, ParameterValue, TimeoutTypes
from tensorbits_protocol.operators import OperatorSpec, get_operator

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
P = ParamSpec("P")

# The parameters' values, for the type checker; each equals its ParameterSpec's choices (tested).
FeatureLevel: TypeAlias = Literal[
    "1_0", "2_0", "2_1", "3_0", "3_1", "4_0", "4_1",
    "5_0", "5_1", "5_2", "6_0", "6_1", "6_2", "6_3", "6_4",
]  # fmt: skip
CountType: TypeAlias = Literal["UINT8", "UINT32"]
AutoBroadcast: TypeAlias = Literal["numpy", "none", "pdpd"]
Direction: TypeAlias = Literal["LEFT", "RIGHT"]

Timeout: TypeAlias = TimeoutTypes | NotGiven
#: How a family reaches its client: (model, inputs by name, parameters, timeout) -> R.
Runner: TypeAlias = Callable[
    [str, Mapping[str, npt.ArrayLike], Mapping[str, ParameterValue], Timeout], R
]


class Infers(Protocol[R_co]):
    """What runs operators through its ``infer`` (a client, a region), as a runner calls it."""

    def infer(
        self,
        model: str,
        inputs: Mapping[str, npt.ArrayLike],
        parameters: Mapping[str, ParameterValue],
        *,
        timeout: Timeout,
    ) -> R_co: ...


def output_of(owner: Infers[InferResult]) -> Runner[Array]:
    """The runner of an owner whose ``infer`` blocks: an operator method returns the output."""

    def run(
        model: str,
        inputs: Mapping[str, npt.ArrayLike],
        parameters: Mapping[str, ParameterValue],
        timeout: Timeout,
    ) -> Array:
        return owner.infer(model, inputs, parameters, timeout=timeout).output

    return run


def awaited_output_of(
    owner: Infers[Awaitable[InferResult]],
) -> Runner[Coroutine[Any, Any, Array]]:
    """``output_of`` for an owner whose ``infer`` is awaited: a method returns an awaitable."""

    async def run(
        model: str,
        inputs: Mapping[str, npt.ArrayLike],
        parameters: Mapping[str, ParameterValue],
        timeout: Timeout,
    ) -> Array:
        return (await owner.infer(model, inputs, parameters, timeout=timeout)).output

    return run


class MethodOwner(Generic[R]):
    """A class with operator methods whose calls return ``R``: a family (its client's result)
    or ``Batch`` (a ``Binding``). Named here so that the methods' types need not know the
    owners, and _batch.py can build on this module without it importing that one back."""


class OperatorMethod(Generic[P]):
    """The method that sends one operator: ``spec`` is its row of the table, ``send`` its shape.

    ``send(spec, owner, *args, **kwargs)`` does the work. Bound to an owner (a ``MethodOwner``:
    a family, or a ``Batch``) the method is a bound method of ``send`` with the spec filled in:
    its signature, ``P``, is the shape's after those two, and its docstring is the table's
    summary followed by the shape's.
    """

    def __init__(
        self,
        send: Callable[Concatenate[OperatorSpec, Any, P], object],
        operator: str | OperatorSpec,
    ):
        self.spec = get_operator(operator) if isinstance(operator, str) else operator
        self.send = send
        summary = f"``{self.spec.name}``: {self.spec.summary}."
        self.__doc__ = f"{summary}\n\n{inspect.getdoc(send) or ''}".strip()
        self._function = partial(send, self.spec)

    def __set_name__(self, owner: type[Any], attr: str) -> None:
        self._attr = attr
        qualname = f"{owner.__qualname__}.{attr}"
        # The shape is shared by every method of its kind: each gets a copy of its function
        # named as the method, because Python names the function, not the method, in the
        # TypeError of a wrong call ("ONNX.bitwise_not() missing ... 'x'", not "_unary()").
        send = self.send
        assert isinstance(send, FunctionType)
        own = FunctionType(
            send.__code__, send.__globals__, attr, send.__defaults__, send.__closure__
        )
        own.__kwdefaults__ = send.__kwdefaults__
        own.__annotations__ = send.__annotations__
        own.__qualname__ = qualname
        self._function = partial(own, self.spec)
        # What a bound method shows: ``<bound method DML.bit_and of ...>``, its docstring, and
        # (help()) its module.
        vars(self._function).update(
            __name__=attr, __qualname__=qualname, __module__=owner.__module__, __doc__=self.__doc__
        )

    @overload
    def __get__(self, instance: None, owner: type[Any] | None = None) -> Self: ...
    @overload
    def __get__(
        self, instance: MethodOwner[R], owner: type[Any] | None = None
    ) -> Callable[P, R]: ...
    def __get__(self, instance: object, owner: type[Any] | None = None) -> Any:
        if instance is None:
            return self
        bound = MethodType(self._function, instance)
        if isinstance(instance, _Family):
            # Kept: later calls then cost what a plain method's do. (Not on a Batch: a bound method
            # kept there would make a reference cycle, holding its input bytes until the cycle
            # collector runs; a family is in one with its client anyway.)
            vars(instance)[self._attr] = bound
        return bound

    def __repr__(self) -> str:
        return f"<operator method {self.spec.name}>"


def method_shape(
    send: Callable[Concatenate[OperatorSpec, Any, P], object],
) -> Callable[[str | OperatorSpec], OperatorMethod[P]]:
    """Decorate a shape: ``shape(name)`` is then the method sending the operator ``name`` (or
    the one an ``OperatorSpec`` describes)."""
    return partial(OperatorMethod, send)


class _Family(MethodOwner[R]):
    def __init__(self, run: Runner[R]) -> None:
        self._run = run


# --- shapes: one signature each, the table's defaults as its defaults ----------------------------
@method_shape
def _dml_binary(
    op: OperatorSpec,
    family: _Family[R],
    a: npt.ArrayLike,
    b: npt.ArrayLike,
    *,
    feature_level: FeatureLevel = "6_4",
    timeout: Timeout = NOT_GIVEN,
) -> R:
    """``a`` and ``b`` have identical shapes; ``feature_level`` picks the support tables."""
    first, second = op.inputs
    return family._run(op.name, {first: a, second: b}, {"feature_level": feature_level}, timeout)


@method_shape
def _dml_unary(
    op: OperatorSpec,
    family: _Family[R],
    x: npt.ArrayLike,
    *,
    feature_level: FeatureLevel = "6_4",
    timeout: Timeout = NOT_GIVEN,
) -> R:
    """``feature_level`` picks the support tables."""
    (name,) = op.inputs
    return family._run(op.name, {name: x}, {"feature_level": feature_level}, timeout)


@method_shape
def _dml_count(
    op: OperatorSpec,
    family: _Family[R],
    x: npt.ArrayLike,
    *,
    output_datatype: CountType = "UINT8",
    feature_level: FeatureLevel = "6_4",
    timeout: Timeout = NOT_GIVEN,
) -> R:
    """Set bits per element (INT8 -1 has 8), as ``output_datatype``."""
    (name,) = op.inputs
    params = {"feature_level": feature_level, "output_datatype": output_datatype}
    return family._run(op.name, {name: x}, params, timeout)


@method_shape
def _openvino_binary(
    op: OperatorSpec,
    family: _Family[R],
    a: npt.ArrayLike,
    b: npt.ArrayLike,
    *,
    auto_broadcast: AutoBroadcast = "numpy",
    axis: int = -1,
    timeout: Timeout = NOT_GIVEN,
) -> R:
    """``a`` and ``b`` broadcast per ``auto_broadcast`` (``axis`` is used by ``pdpd``)."""
    first, second = op.inputs
    params: dict[str, ParameterValue] = {"auto_broadcast": auto_broadcast, "axis": axis}
    return family._run(op.name, {first: a, second: b}, params, timeout)


@method_shape
def _binary(
    op: OperatorSpec,
    family: _Family[R],
    a: npt.ArrayLike,
    b: npt.ArrayLike,
    *,
    timeout: Timeout = NOT_GIVEN,
) -> R:
    """``a`` and ``b`` broadcast as NumPy arrays do."""
    first, second = op.inputs
    return family._run(op.name, {first: a, second: b}, {}, timeout)


@method_shape
def _unary(
    op: OperatorSpec, family: _Family[R], x: npt.ArrayLike, *, timeout: Timeout = NOT_GIVEN
) -> R:
    (name,) = op.inputs
    return family._run(op.name, {name: x}, {}, timeout)


@method_shape
def _bit_shift(
    op: OperatorSpec,
    family: _Family[R],
    x: npt.ArrayLike,
    y: npt.ArrayLike,
    *,
    direction: Direction,
    timeout: Timeout = NOT_GIVEN,
) -> R:
    """``x`` shifted by ``y`` toward ``direction``; unsigned types only."""
    first, second = op.inputs
    return family._run(op.name, {first: x, second: y}, {"direction": direction}, timeout)


# --- the families -------------------------------------------------------------------------------
class DML(_Family[R]):
    """DirectML's element-wise bit operators. They act on the stored bits: FP16/32/64 and signed
    inputs are reinterpreted as same-width unsigned, bit-exact. Inputs have identical shapes."""

    bit_and = _dml_binary("DML_OPERATOR_ELEMENT_WISE_BIT_AND")
    bit_or = _dml_binary("DML_OPERATOR_ELEMENT_WISE_BIT_OR")
    bit_xor = _dml_binary("DML_OPERATOR_ELEMENT_WISE_BIT_XOR")
    bit_not = _dml_unary("DML_OPERATOR_ELEMENT_WISE_BIT_NOT")
    bit_count = _dml_count("DML_OPERATOR_ELEMENT_WISE_BIT_COUNT")
    bit_shift_left = _dml_binary("DML_OPERATOR_ELEMENT_WISE_BIT_SHIFT_LEFT")
    bit_shift_right = _dml_binary("DML_OPERATOR_ELEMENT_WISE_BIT_SHIFT_RIGHT")


class OpenVINO(_Family[R]):
    """OpenVINO's Bitwise* operators: typed values (BOOL is logical, signed shifts arithmetic,
    left shifts wrap modulo 2^width), broadcast per ``auto_broadcast`` (``axis`` is used by
    ``pdpd``)."""

    bitwise_and = _openvino_binary("openvino.BitwiseAnd-13")
    bitwise_or = _openvino_binary("openvino.BitwiseOr-13")
    bitwise_xor = _openvino_binary("openvino.BitwiseXor-13")
    bitwise_not = _unary("openvino.BitwiseNot-13")
    left_shift = _openvino_binary("openvino.BitwiseLeftShift-15")
    right_shift = _openvino_binary("openvino.BitwiseRightShift-15")


class ONNX(_Family[R]):
    """ONNX's bitwise operators on integer tensors, with NumPy broadcasting."""

    bitwise_and = _binary("onnx.BitwiseAnd-18")
    bitwise_or = _binary("onnx.BitwiseOr-18")
    bitwise_xor = _binary("onnx.BitwiseXor-18")
    bitwise_not = _unary("onnx.BitwiseNot-18")
    bit_shift = _bit_shift("onnx.BitShift-11")


class Families(Generic[R]):
    """``dml``, ``openvino`` and ``onnx`` of what runs operators (a client, a shared-memory
    region): ``_add_families`` makes them, sending through the subclass's ``_runner``."""

    dml: DML[R]
    openvino: OpenVINO[R]
    onnx: ONNX[R]

    def _runner(self) -> Runner[R]:
        raise NotImplementedError

    def _add_families(self) -> None:
        run = self._runner()
        self.dml = DML(run)
        self.openvino = OpenVINO(run)
        self.onnx = ONNX(run)
