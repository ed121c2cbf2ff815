"""A small, obviously-correct reference for every operator, and the strategies that feed it.

The reference never calls a NumPy ufunc: it reads each element's stored bits as a Python int
(little-endian bytes, ``int.from_bytes``), applies the rule of docs/semantics.md to Python ints, and
writes the result's bits back. Shared by tests/core (NumPy backend) and tests/gpu (CuPy backend).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from support.host_calls import compute

from tensorbits_protocol.dtypes import DTYPES, DataType
from tensorbits_protocol.operators import OPERATORS, Encoding, Function, OperatorSpec, get_operator

Shape = tuple[int, ...]
Array = np.ndarray[Any, Any]
Arrays = Mapping[str, Array]
Params = Mapping[str, Any] | None
SIGNED = {DataType.INT8, DataType.INT16, DataType.INT32, DataType.INT64}
FLOATS = {DataType.FP16, DataType.FP32, DataType.FP64}


def width(dt: DataType) -> int:
    return DTYPES[dt].itemsize * 8


def np_dtype(dt: DataType) -> np.dtype[Any]:
    return DTYPES[dt].numpy


def bits_dtype(dt: DataType) -> np.dtype[Any]:
    return DTYPES[dt].bits


def from_bits(values: list[int], dt: DataType, shape: Shape) -> Array:
    """An array of data type ``dt`` whose elements have the given stored bits."""
    size = DTYPES[dt].itemsize
    raw = b"".join(v.to_bytes(size, "little") for v in values)
    little = np_dtype(dt).newbyteorder("<")
    return np.frombuffer(raw, dtype=little).astype(np_dtype(dt)).reshape(shape)


def stored_bits(array: Array) -> list[int]:
    """Each element's stored bits, row-major, as unsigned Python ints."""
    little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    raw = little.tobytes()
    size = array.dtype.itemsize
    return [int.from_bytes(raw[i : i + size], "little") for i in range(0, len(raw), size)]


def as_value(bits: int, dt: DataType) -> int:
    """The typed value of stored bits (two's complement for signed types)."""
    w = width(dt)
    if dt in SIGNED and bits >= 1 << (w - 1):
        return bits - (1 << w)
    return bits


# --- shapes --------------------------------------------------------------------------------------
def numpy_broadcast_shape(a: Shape, b: Shape) -> Shape | None:
    """NumPy's rule, written out: align from the right, sizes equal or 1."""
    rank = max(len(a), len(b))
    pa = (1,) * (rank - len(a)) + a
    pb = (1,) * (rank - len(b)) + b
    out = []
    for x, y in zip(pa, pb, strict=True):
        if x != y and 1 not in (x, y):
            return None
        out.append(y if x == 1 else x)
    return tuple(out)


def _index(shape: Shape, out_index: Shape) -> int:
    """Row-major flat index into an input of ``shape`` for an output index (right-aligned,
    size-1 dimensions broadcast)."""
    offset = len(out_index) - len(shape)
    flat = 0
    for axis, size in enumerate(shape):
        i = out_index[offset + axis] if size != 1 else 0
        flat = flat * size + i
    return flat


# --- the element rules -----------------------------------------------------------------------------
def _shift(value: int, count: int, w: int, left: bool) -> int:
    if count < 0 or count >= w:
        return -1 if (not left and value < 0) else 0
    return value << count if left else value >> count


def element(op: OperatorSpec, dt: DataType, args: list[int], left: bool | None) -> int:
    """One output element's stored bits from the inputs' stored bits."""
    w = width(dt)
    mask = (1 << w) - 1
    f = op.function
    if op.encoding is Encoding.NATIVE_BITS:  # DirectML: everything is unsigned bits
        if f is Function.COUNT:
            return bin(args[0]).count("1")
        vals = args
    elif dt is DataType.BOOL:  # OpenVINO BOOL: the logical operations, result 0 or 1
        t = [v != 0 for v in args]
        logical: Callable[[], bool] = {
            Function.AND: lambda: t[0] and t[1],
            Function.OR: lambda: t[0] or t[1],
            Function.XOR: lambda: t[0] != t[1],
            Function.NOT: lambda: not t[0],
        }[f]
        return int(logical())
    else:
        vals = [as_value(v, dt) for v in args]
    if f is Function.AND:
        r = vals[0] & vals[1]
    elif f is Function.OR:
        r = vals[0] | vals[1]
    elif f is Function.XOR:
        r = vals[0] ^ vals[1]
    elif f is Function.NOT:
        r = ~vals[0]
    else:
        assert left is not None
        r = _shift(vals[0], vals[1], w, left)
    return r & mask


def reference(model: str, arrays: Arrays, params: Params = None) -> Array:
    """What ``model`` must return for ``arrays``, computed element by element."""
    params = dict(params or {})
    op = get_operator(model)
    ins = [arrays[name] for name in op.inputs]
    dt = _datatype_of(ins[0])
    shapes = [tuple(int(d) for d in x.shape) for x in ins]
    mode = params.get("auto_broadcast", "numpy") if op.spec == "openvino" else None
    if len(ins) == 1 or op.spec == "dml" or mode == "none":
        assert all(s == shapes[0] for s in shapes)
        out_shape = shapes[0]
    elif mode == "pdpd":
        a, b = shapes
        axis = int(params.get("axis", -1))
        start = len(a) - len(b) if axis == -1 else axis
        out_shape = a
        shapes[1] = (1,) * start + b + (1,) * (len(a) - len(b) - start)
    else:
        out = numpy_broadcast_shape(shapes[0], shapes[1])
        assert out is not None
        out_shape = out
    left = None
    if op.function is Function.SHIFT_LEFT:
        left = True
    elif op.function is Function.SHIFT_RIGHT:
        left = False
    elif op.function is Function.SHIFT:
        left = params["direction"] == "LEFT"
    out_dt = dt
    if op.function is Function.COUNT:
        out_dt = DataType(params.get("output_datatype", "UINT8"))
    bits = [stored_bits(x) for x in ins]
    values = [
        element(op, dt, [b[_index(s, idx)] for b, s in zip(bits, shapes, strict=True)], left)
        for idx in itertools.product(*(range(n) for n in out_shape))
    ]
    return from_bits(values, out_dt, out_shape)


def _datatype_of(array: Array) -> DataType:
    native = array.dtype.newbyteorder("=") if array.dtype.byteorder == ">" else array.dtype
    for dt, info in DTYPES.items():
        if info.numpy == native:
            return dt
    raise AssertionError(f"no data type for {array.dtype}")


def assert_bits_equal(got: Array, want: Array) -> None:
    """Same shape, same data type, same stored bits (so NaN payloads and -0.0 count)."""
    assert isinstance(got, np.ndarray)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype.newbyteorder("=") == want.dtype.newbyteorder("="), (got.dtype, want.dtype)
    assert stored_bits(got) == stored_bits(want), (got, want)


def check(
    backend: Any, model: str, arrays: Arrays, params: Params = None, *, out: Array | None = None
) -> Array:
    """Run ``model`` on ``backend`` through the engine and compare with the reference."""
    want = reference(model, arrays, params)  # before the call: ``out`` may alias an input
    got = compute(backend, model, arrays, params, out=out)
    assert_bits_equal(got, want)
    if out is not None:
        assert got is out or np.shares_memory(got, out)
        assert_bits_equal(out, want)
    return got


def check_drawn(backend: Any, model: str, dt: DataType, data: st.DataObject) -> None:
    """``check`` a case of ``model`` on ``dt`` drawn from ``cases``."""
    case = data.draw(cases(model, dt))
    check(backend, case.model, case.arrays, case.params)


# --- operators and data types ----------------------------------------------------------------------
def allowed_types(op: OperatorSpec) -> tuple[DataType, ...]:
    return op.support[0].input_types  # the newest row: FL 6_4 for DML


OP_TYPES: list[tuple[str, DataType]] = [
    (op.name, dt) for op in OPERATORS for dt in allowed_types(op)
]

# Bit patterns worth hitting on purpose, by element width: sign bits, all ones, NaN payloads
# (quiet and signalling), infinities, -0.0, the smallest and largest denormals, 2^32 boundaries.
SPECIAL_BITS: dict[int, tuple[int, ...]] = {
    8: (0, 1, 0x7F, 0x80, 0xFF, 0x55, 0xAA),
    16: (0, 1, 0x8000, 0xFFFF, 0x7E01, 0x7C01, 0x7C00, 0xFC00, 0x0001, 0x03FF, 0x8001, 0x3C00),
    32: (
        0, 1, 0x80000000, 0xFFFFFFFF, 0x7FC00001, 0x7F800001, 0xFFC00000, 0x7F800000,
        0xFF800000, 0x00000001, 0x007FFFFF, 0x80000001, 0x3F800000,
    ),
    64: (
        0, 1, 1 << 63, (1 << 64) - 1, 0x7FF8000000000001, 0x7FF0000000000001,
        0xFFF8000000000000, 0x7FF0000000000000, 0x0000000000000001, 0x000FFFFFFFFFFFFF,
        0x8000000000000000, 0x100000000, 0x1FFFFFFFF, 0xFFFFFFFF00000000, 0x3FF0000000000000,
    ),
}  # fmt: skip


def bit_values(dt: DataType) -> st.SearchStrategy[int]:
    w = width(dt)
    return st.one_of(st.sampled_from(SPECIAL_BITS[w]), st.integers(0, (1 << w) - 1))


def count_values(dt: DataType) -> st.SearchStrategy[int]:
    """Shift counts as stored bits: small ones, the width and beyond, negative ones, huge ones."""
    w = width(dt)
    small = st.integers(-3 if dt in SIGNED else 0, w + 3).map(lambda v: v & ((1 << w) - 1))
    return st.one_of(small, small, st.integers(0, (1 << w) - 1))


@st.composite
def tensors(
    draw: st.DrawFn, dt: DataType, shape: Shape, values: st.SearchStrategy[int] | None = None
) -> Array:
    """An array of ``dt`` and ``shape``, sometimes strided, sometimes big-endian."""
    if dt is DataType.BOOL:
        base = draw(hnp.arrays(np.bool_, shape))
    else:
        elements = values if values is not None else bit_values(dt)
        n = math.prod(shape)
        flat = draw(st.lists(elements, min_size=n, max_size=n))
        base = from_bits(flat, dt, shape)
    layout = draw(st.sampled_from(["plain", "strided", "big-endian"]))
    if layout == "strided" and base.ndim >= 1:
        wide = np.zeros((*shape[:-1], 2 * shape[-1] + 1), dtype=base.dtype)
        view = wide[..., 1::2]
        view[...] = base
        return view
    if layout == "big-endian" and base.dtype.itemsize > 1:
        return base.astype(base.dtype.newbyteorder(">"))
    return base


@dataclass
class Case:
    model: str
    arrays: dict[str, Array]
    params: dict[str, Any] = field(default_factory=dict)


def _dims(min_dims: int, max_dims: int, min_side: int) -> st.SearchStrategy[Shape]:
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=4)


@st.composite
def cases(draw: st.DrawFn, model: str, dt: DataType) -> Case:
    """A valid call of ``model`` on ``dt``: shapes by the operator's rule, values by its kind."""
    op = get_operator(model)
    params: dict[str, Any] = {}
    dml = op.spec == "dml"
    min_dims, min_side = (1, 1) if dml else (0, 0)
    if dml and draw(st.booleans()):
        levels = ["4_1", "5_0", "6_4"]
        if dt in (DataType.UINT8, DataType.UINT16, DataType.UINT32):
            levels.append("3_0")
        params["feature_level"] = draw(st.sampled_from(levels))
    if op.function is Function.COUNT and draw(st.booleans()):
        params["output_datatype"] = draw(st.sampled_from(["UINT8", "UINT32"]))
    if op.function is Function.SHIFT:
        params["direction"] = draw(st.sampled_from(["LEFT", "RIGHT"]))
    if len(op.inputs) == 1:
        shapes: list[Shape] = [draw(_dims(min_dims, 4, min_side))]
    elif dml:
        shape = draw(_dims(1, 4, 1))
        shapes = [shape, shape]
    else:
        mode = "numpy"
        if op.spec == "openvino":
            mode = draw(st.sampled_from(["default", "numpy", "none", "pdpd"]))
            if mode != "default":
                params["auto_broadcast"] = mode
        if mode == "none":
            shape = draw(_dims(0, 4, 0))
            shapes = [shape, shape]
        elif mode == "pdpd":
            a = draw(_dims(0, 4, 0))
            k = draw(st.integers(0, len(a)))
            start = draw(st.integers(0, len(a) - k))
            trailing = start == len(a) - k
            how = draw(st.sampled_from(["default", "-1", "explicit"])) if trailing else "explicit"
            if how != "default":
                params["axis"] = -1 if how == "-1" else start
            b = tuple(1 if draw(st.booleans()) else a[start + i] for i in range(k))
            shapes = [a, b]
        else:
            bs = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=4))
            shapes = list(bs.input_shapes)
            if draw(st.booleans()):  # also sizes of 0 (empty tensors are allowed here)
                shapes = [tuple(0 if d == 4 else d for d in s) for s in shapes]
    shifts = op.function in (Function.SHIFT, Function.SHIFT_LEFT, Function.SHIFT_RIGHT)
    arrays = {}
    for i, (name, shape) in enumerate(zip(op.inputs, shapes, strict=True)):
        values = count_values(dt) if shifts and i == 1 else None
        arrays[name] = draw(tensors(dt, shape, values))
    return Case(model, arrays, params)
