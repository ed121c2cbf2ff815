"""The operator kernels, written once against an array namespace ``xp`` (NumPy or CuPy).

A kernel writes into a preallocated ``out``. DirectML operators see the stored bits: every float
or signed tensor is viewed as the unsigned type of the same width first, so NaN payloads, -0.0
and denormals pass through bit-exact and BIT_COUNT counts the stored ones. The two pieces that
differ per backend (population count and the shift rule) come from the backend as ``BitOps``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tensorbits_protocol.dtypes import DTYPES
from tensorbits_protocol.operators import Encoding, Function
from tensorbits_protocol.validation import ResolvedCall

DeviceArray = (
    Any  # numpy.ndarray or cupy.ndarray (a backend's): the kernels use only what both provide
)


@dataclass(frozen=True, slots=True)
class BitOps:
    """The backend-specific element-wise pieces.

    ``popcount(x, out)`` counts the set bits of unsigned ``x`` into ``out``.
    ``shift(x, count, out, left)`` shifts by the rule of docs/semantics.md: a count at or above the
    width, or negative, gives 0 (a right shift of a negative signed value gives -1); right shifts
    of signed types are arithmetic; left shifts wrap modulo 2^width."""

    popcount: Callable[[DeviceArray, DeviceArray], None]
    shift: Callable[[DeviceArray, DeviceArray, DeviceArray, bool], None]


def _binary(
    ufunc_name: str,
) -> Callable[[Any, BitOps, ResolvedCall, Sequence[DeviceArray], DeviceArray], None]:
    def kernel(
        xp: Any, ops: BitOps, call: ResolvedCall, inputs: Sequence[DeviceArray], out: DeviceArray
    ) -> None:
        getattr(xp, ufunc_name)(inputs[0], inputs[1], out=out)

    return kernel


def _not(
    xp: Any, ops: BitOps, call: ResolvedCall, inputs: Sequence[DeviceArray], out: DeviceArray
) -> None:
    # invert of a bool array is the logical NOT in both NumPy and CuPy (OpenVINO BOOL rule).
    xp.invert(inputs[0], out=out)


def _count(
    xp: Any, ops: BitOps, call: ResolvedCall, inputs: Sequence[DeviceArray], out: DeviceArray
) -> None:
    ops.popcount(inputs[0], out)


def _shift(
    xp: Any, ops: BitOps, call: ResolvedCall, inputs: Sequence[DeviceArray], out: DeviceArray
) -> None:
    assert call.shift_left is not None
    ops.shift(inputs[0], inputs[1], out, call.shift_left)


Kernel = Callable[[Any, BitOps, ResolvedCall, Sequence[DeviceArray], DeviceArray], None]

KERNELS: dict[Function, Kernel] = {
    Function.AND: _binary("bitwise_and"),
    Function.OR: _binary("bitwise_or"),
    Function.XOR: _binary("bitwise_xor"),
    Function.NOT: _not,
    Function.COUNT: _count,
    Function.SHIFT_LEFT: _shift,
    Function.SHIFT_RIGHT: _shift,
    Function.SHIFT: _shift,
}


def as_kernel_operands(
    call: ResolvedCall, inputs: Sequence[DeviceArray], out: DeviceArray
) -> tuple[list[DeviceArray], DeviceArray]:
    """Views the kernel works on: unsigned bit views for DML, pdpd-reshaped inputs.

    Views only, never copies: ``out`` stays the caller's memory."""
    operands = [
        x.reshape(shape) if x.shape != shape else x
        for x, shape in zip(inputs, call.kernel_input_shapes, strict=True)
    ]
    if call.op.encoding is Encoding.NATIVE_BITS:
        bits = DTYPES[call.input_datatype].bits
        operands = [_bits_view(x, bits) for x in operands]
        out = _bits_view(out, DTYPES[call.output_datatype].bits)
    return operands, out


def _bits_view(x: DeviceArray, bits: Any) -> DeviceArray:
    # An unsigned tensor in native order already is its bits: no view to make (a view and its
    # byte-order dtype cost a microsecond, which a batch of small dispatches pays many times).
    if x.dtype == bits:
        return x
    # Keep the array's byte order: viewing a big-endian array as the native unsigned type would
    # reinterpret byte-swapped bits (BIT_NOT of big-endian FP32 1.0 gave 0xFFFF7FC0).
    return x.view(bits.newbyteorder(x.dtype.byteorder))


def run_kernel(
    xp: Any, ops: BitOps, call: ResolvedCall, operands: Sequence[DeviceArray], out: DeviceArray
) -> None:
    """Run the call's kernel on operands already prepared by ``as_kernel_operands``."""
    KERNELS[call.op.function](xp, ops, call, operands, out)
