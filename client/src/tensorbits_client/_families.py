"""One typed method per operator, grouped by spec: ``client.dml``, ``client.openvino``,
``client.onnx``.

Each class is generic in what a call returns, so the same methods serve both clients: for
``Client`` a method returns the result array, for ``AsyncClient`` an awaitable of it. Every method
sends the operator's parameters explicitly (the spec's defaults are the methods' defaults), and the
result keeps the dtype and shape the server declares.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Generic, Literal, TypeAlias, TypeVar

import numpy.typing as npt

from tensorbits_client._types import NOT_GIVEN, NotGiven, ParameterValue, TimeoutTypes

R = TypeVar("R")

FeatureLevel: TypeAlias = Literal[
    "1_0", "2_0", "2_1", "3_0", "3_1", "4_0", "4_1",
    "5_0", "5_1", "5_2", "6_0", "6_1", "6_2", "6_3", "6_4",
]  # fmt: skip
CountType: TypeAlias = Literal["UINT8", "UINT32"]
AutoBroadcast: TypeAlias = Literal["numpy", "none", "pdpd"]
Direction: TypeAlias = Literal["LEFT", "RIGHT"]

#: How a family reaches its client: (model, inputs by name, parameters, timeout) -> R.
Runner: TypeAlias = Callable[
    [str, Mapping[str, npt.ArrayLike], Mapping[str, ParameterValue], TimeoutTypes | NotGiven], R
]

_DML = "DML_OPERATOR_ELEMENT_WISE_"


class _Family(Generic[R]):
    def __init__(self, run: Runner[R]) -> None:
        self._run = run


class DML(_Family[R]):
    """DirectML's element-wise bit operators. They act on the stored bits: FP16/32/64 and signed
    inputs are reinterpreted as same-width unsigned, bit-exact. Inputs have identical shapes."""

    def _binary(
        self,
        suffix: str,
        a: npt.ArrayLike,
        b: npt.ArrayLike,
        feature_level: FeatureLevel,
        timeout: TimeoutTypes | NotGiven,
    ) -> R:
        inputs = {"ATensor": a, "BTensor": b}
        return self._run(_DML + suffix, inputs, {"feature_level": feature_level}, timeout)

    def bit_and(
        self,
        a: npt.ArrayLike,
        b: npt.ArrayLike,
        *,
        feature_level: FeatureLevel = "6_4",
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> R:
        """``DML_OPERATOR_ELEMENT_WISE_BIT_AND``: a & b of the stored bits."""
        return self._binary("BIT_AND", a, b, feature_level, timeout)

    def bit_or(
        self,
        a: npt.ArrayLike,
        b: npt.ArrayLike,
        *,
        feature_level: FeatureLevel = "6_4",
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> R:
        """``DML_OPERATOR_ELEMENT_WISE_BIT_OR``: a | b of the stored bits."""
        return self._binary("BIT_OR", a, b, feature_level, timeout)

    def bit_xor(
        self,
        a: npt.ArrayLike,
        b: npt.ArrayLike,
        *,
        feature_level: FeatureLevel = "6_4",
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> R:
        """``DML_OPERATOR_ELEMENT_WISE_BIT_XOR``: a ^ b of the stored bits."""
        return self._binary("BIT_XOR", a, b, feature_level, timeout)

    def bit_not(
        self,
        x: npt.ArrayLike,
        *,
        feature_level: FeatureLevel = "6_4",
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> R:
        """``DML_OPERATOR_ELEMENT_WISE_BIT_NOT``: ~x of the stored bits."""
        params = {"feature_level": feature_level}
        return self._run(_DML + "BIT_NOT", {"InputTensor": x}, params, timeout)

    def bit_count(
        self,
        x: npt.ArrayLike,
        *,
        output_datatype: CountType = "UINT8",
        feature_level: FeatureLevel = "6_4",
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> R:
        """``DML_OPERATOR_ELEMENT_WISE_BIT_COUNT``: set bits per element (INT8 -1 has 8), as
        ``output_datatype``."""
        params = {"feature_level": feature_level, "output_datatype": output_datatype}
        return self._run(_DML + "BIT_COUNT", {"InputTensor": x}, params, timeout)

    def bit_shift_left(
        self,
        a: npt.ArrayLike,
        b: npt.ArrayLike,
        *,
        feature_level: FeatureLevel = "6_4",
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> R:
        """``DML_OPERATOR_ELEMENT_WISE_BIT_SHIFT_LEFT``: a << b (unsigned; counts at or above the
        width give 0)."""
        return self._binary("BIT_SHIFT_LEFT", a, b, feature_level, timeout)

    def bit_shift_right(
        self,
        a: npt.ArrayLike,
        b: npt.ArrayLike,
        *,
        feature_level: FeatureLevel = "6_4",
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> R:
        """``DML_OPERATOR_ELEMENT_WISE_BIT_SHIFT_RIGHT``: a >> b (logical; counts at or above the
        width give 0)."""
        return self._binary("BIT_SHIFT_RIGHT", a, b, feature_level, timeout)


class OpenVINO(_Family[R]):
    """OpenVINO's Bitwise* operators: typed values (BOOL is logical, signed shifts arithmetic),
    broadcast per ``auto_broadcast`` (``axis`` is used by ``pdpd``)."""

    def _binary(
        self,
        name: str,
        a: npt.ArrayLike,
        b: npt.ArrayLike,
        auto_broadcast: AutoBroadcast,
        axis: int,
        timeout: TimeoutTypes | NotGiven,
    ) -> R:
        params: dict[str, ParameterValue] = {"auto_broadcast": auto_broadcast, "axis": axis}
        return self._run(f"openvino.{name}", {"input_1": a, "input_2": b}, params, timeout)

    def bitwise_and(
        self,
        a: npt.ArrayLike,
        b: npt.ArrayLike,
        *,
        auto_broadcast: AutoBroadcast = "numpy",
        axis: int = -1,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> R:
        """``openvino.BitwiseAnd-13``: a & b (BOOL: logical and)."""
        return self._binary("BitwiseAnd-13", a, b, auto_broadcast, axis, timeout)

    def bitwise_or(
        self,
        a: npt.ArrayLike,
        b: npt.ArrayLike,
        *,
        auto_broadcast: AutoBroadcast = "numpy",
        axis: int = -1,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> R:
        """``openvino.BitwiseOr-13``: a | b (BOOL: logical or)."""
        return self._binary("BitwiseOr-13", a, b, auto_broadcast, axis, timeout)

    def bitwise_xor(
        self,
        a: npt.ArrayLike,
        b: npt.ArrayLike,
        *,
        auto_broadcast: AutoBroadcast = "numpy",
        axis: int = -1,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> R:
        """``openvino.BitwiseXor-13``: a ^ b (BOOL: logical xor)."""
        return self._binary("BitwiseXor-13", a, b, auto_broadcast, axis, timeout)

    def bitwise_not(self, x: npt.ArrayLike, *, timeout: TimeoutTypes | NotGiven = NOT_GIVEN) -> R:
        """``openvino.BitwiseNot-13``: ~x (BOOL: logical not)."""
        return self._run("openvino.BitwiseNot-13", {"input_1": x}, {}, timeout)

    def left_shift(
        self,
        a: npt.ArrayLike,
        b: npt.ArrayLike,
        *,
        auto_broadcast: AutoBroadcast = "numpy",
        axis: int = -1,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> R:
        """``openvino.BitwiseLeftShift-15``: a << b, wrapping modulo 2^width."""
        return self._binary("BitwiseLeftShift-15", a, b, auto_broadcast, axis, timeout)

    def right_shift(
        self,
        a: npt.ArrayLike,
        b: npt.ArrayLike,
        *,
        auto_broadcast: AutoBroadcast = "numpy",
        axis: int = -1,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> R:
        """``openvino.BitwiseRightShift-15``: a >> b (arithmetic for signed types)."""
        return self._binary("BitwiseRightShift-15", a, b, auto_broadcast, axis, timeout)


class ONNX(_Family[R]):
    """ONNX's bitwise operators on integer tensors, with NumPy broadcasting."""

    def bitwise_and(
        self, a: npt.ArrayLike, b: npt.ArrayLike, *, timeout: TimeoutTypes | NotGiven = NOT_GIVEN
    ) -> R:
        """``onnx.BitwiseAnd-18``: a & b."""
        return self._run("onnx.BitwiseAnd-18", {"A": a, "B": b}, {}, timeout)

    def bitwise_or(
        self, a: npt.ArrayLike, b: npt.ArrayLike, *, timeout: TimeoutTypes | NotGiven = NOT_GIVEN
    ) -> R:
        """``onnx.BitwiseOr-18``: a | b."""
        return self._run("onnx.BitwiseOr-18", {"A": a, "B": b}, {}, timeout)

    def bitwise_xor(
        self, a: npt.ArrayLike, b: npt.ArrayLike, *, timeout: TimeoutTypes | NotGiven = NOT_GIVEN
    ) -> R:
        """``onnx.BitwiseXor-18``: a ^ b."""
        return self._run("onnx.BitwiseXor-18", {"A": a, "B": b}, {}, timeout)

    def bitwise_not(self, x: npt.ArrayLike, *, timeout: TimeoutTypes | NotGiven = NOT_GIVEN) -> R:
        """``onnx.BitwiseNot-18``: ~x."""
        return self._run("onnx.BitwiseNot-18", {"X": x}, {}, timeout)

    def bit_shift(
        self,
        x: npt.ArrayLike,
        y: npt.ArrayLike,
        *,
        direction: Direction,
        timeout: TimeoutTypes | NotGiven = NOT_GIVEN,
    ) -> R:
        """``onnx.BitShift-11``: x shifted by y, ``direction`` "LEFT" or "RIGHT" (unsigned types)."""
        return self._run("onnx.BitShift-11", {"X": x, "Y": y}, {"direction": direction}, timeout)
