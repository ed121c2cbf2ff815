"""Property tests: every operator × every allowed data type × random shapes against the
pure-Python reference (core/bitref.py), on the NumPy backend through ``support.host_calls.compute``.

Plus the edge cases written out: shift counts at and past the width, negative counts, popcount of
negative values, NaN payloads / -0.0 / denormals through the DML operators, 64-bit values past 2^32.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from core.bitref import (
    OP_TYPES,
    SPECIAL_BITS,
    bits_dtype,
    cases,
    check,
    check_drawn,
    from_bits,
    np_dtype,
    reference,
    width,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.host_calls import compute

from tensorbits.core.backends import Backend
from tensorbits_protocol.dtypes import DataType
from tensorbits_protocol.operators import OPERATORS, get_operator

PROPERTY = settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
DML = "DML_OPERATOR_ELEMENT_WISE_"
UNSIGNED = [DataType.UINT8, DataType.UINT16, DataType.UINT32, DataType.UINT64]
SIGNED = [DataType.INT8, DataType.INT16, DataType.INT32, DataType.INT64]


def test_every_operator_and_type_is_covered() -> None:
    assert {name for name, _ in OP_TYPES} == {op.name for op in OPERATORS}
    assert len(OP_TYPES) == 151


@pytest.mark.parametrize(("model", "dt"), OP_TYPES, ids=[f"{m}-{d}" for m, d in OP_TYPES])
@PROPERTY
@given(data=st.data())
def test_operator_matches_reference(
    numpy_backend: Backend, model: str, dt: DataType, data: st.DataObject
) -> None:
    check_drawn(numpy_backend, model, dt, data)


@pytest.mark.parametrize(
    ("model", "dt"),
    [(m, d) for m, d in OP_TYPES if get_operator(m).in_place or get_operator(m).spec != "dml"],
    ids=lambda v: str(v),
)
@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_in_place_out_is_the_first_input(
    numpy_backend: Backend, model: str, dt: DataType, data: st.DataObject
) -> None:
    """``out=`` bound to the first input (same buffer, same description) gives the same result."""
    case = data.draw(cases(model, dt))
    op = get_operator(model)
    first = case.arrays[op.inputs[0]]
    want = reference(case.model, case.arrays, case.params)
    if want.shape != first.shape or want.dtype.newbyteorder("=") != first.dtype.newbyteorder("="):
        return  # broadcast to a larger shape: the output cannot alias this input
    if not first.flags.writeable:
        first = case.arrays[op.inputs[0]] = first.copy()
    check(numpy_backend, case.model, case.arrays, case.params, out=first)


# --- shifts --------------------------------------------------------------------------------------
def _shift_models(dt: DataType) -> list[tuple[str, dict[str, str], bool]]:
    models: list[tuple[str, dict[str, str], bool]] = [
        ("openvino.BitwiseLeftShift-15", {}, True),
        ("openvino.BitwiseRightShift-15", {}, False),
    ]
    if dt in UNSIGNED:
        models += [
            (DML + "BIT_SHIFT_LEFT", {}, True),
            (DML + "BIT_SHIFT_RIGHT", {}, False),
            ("onnx.BitShift-11", {"direction": "LEFT"}, True),
            ("onnx.BitShift-11", {"direction": "RIGHT"}, False),
        ]
    return models


def _names(model: str) -> tuple[str, str]:
    inputs = get_operator(model).inputs
    return inputs[0], inputs[1]


@pytest.mark.parametrize("dt", UNSIGNED + SIGNED)
def test_shift_counts_at_and_past_the_width(numpy_backend: Backend, dt: DataType) -> None:
    w = width(dt)
    npdt = np_dtype(dt)
    signed = dt in SIGNED
    values = [1, 5, (1 << (w - 1)) - 1, -1 if signed else (1 << w) - 1]
    if signed:
        values += [-(1 << (w - 1)), -16]
    counts = [0, 1, w - 1, w, w + 1, 2 * w, (1 << (w - 1)) - 1]
    if signed:
        counts += [-1, -w, -(1 << (w - 1))]
    x = np.array([v for v in values for _ in counts], dtype=npdt)
    y = np.array([c for _ in values for c in counts], dtype=npdt)
    for model, params, left in _shift_models(dt):
        a, b = _names(model)
        got = check(numpy_backend, model, {a: x, b: y}, params).tolist()
        for v, c, r in zip(x.tolist(), y.tolist(), got, strict=True):
            if c < 0 or c >= w:
                assert r == (-1 if (not left and v < 0) else 0), (model, v, c, r)
            elif left:
                wrapped = (v << c) & ((1 << w) - 1)
                if signed and wrapped >= 1 << (w - 1):
                    wrapped -= 1 << w
                assert r == wrapped, (model, v, c, r)
            else:
                assert r == v >> c, (model, v, c, r)  # arithmetic for signed (Python's >>)


def test_shift_spot_values(numpy_backend: Backend) -> None:
    """A few answers written out by hand (docs/semantics.md rule 3)."""
    rs = "openvino.BitwiseRightShift-15"
    ls = "openvino.BitwiseLeftShift-15"
    i8 = np.int8

    def ov(model: str, x: list[int], y: list[int], dt: Any) -> list[int]:
        arrays = {"input_1": np.array(x, dt), "input_2": np.array(y, dt)}
        values: list[int] = check(numpy_backend, model, arrays).tolist()
        return values

    assert ov(rs, [-16, -16, -16, 16, -128], [1, -1, 8, -1, 7], i8) == [-8, -1, -1, 0, -1]
    assert ov(ls, [16, 64, 127, -1, 1], [-1, 2, 1, 7, 8], i8) == [0, 0, -2, -128, 0]
    assert ov(rs, [255, 255], [7, 8], np.uint8) == [1, 0]
    assert ov(ls, [1, 1, 1], [63, 64, 65], np.uint64) == [2**63, 0, 0]
    assert ov(rs, [-(2**63), -(2**63)], [63, 64], np.int64) == [-1, -1]
    dml = check(
        numpy_backend,
        DML + "BIT_SHIFT_RIGHT",
        {
            "ATensor": np.array([0x80, 0x80, 0xFF], np.uint8),
            "BTensor": np.array([7, 8, 200], np.uint8),
        },
    )
    assert dml.tolist() == [1, 0, 0]  # logical: unsigned only


@pytest.mark.parametrize("dt", SIGNED + UNSIGNED)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_shift_property_with_any_count(
    numpy_backend: Backend, dt: DataType, data: st.DataObject
) -> None:
    w = width(dt)
    lo, hi = (-(1 << (w - 1)), (1 << (w - 1)) - 1) if dt in SIGNED else (0, (1 << w) - 1)
    edge = st.sampled_from([lo, hi, 0, 1, -1 if lo < 0 else 2])
    x = data.draw(st.lists(st.one_of(edge, st.integers(lo, hi)), min_size=1, max_size=16))
    near = st.integers(max(lo, -w - 2), min(hi, w + 2))
    y = data.draw(st.lists(st.one_of(near, st.integers(lo, hi)), min_size=len(x), max_size=len(x)))
    arrays = {"input_1": np.array(x, np_dtype(dt)), "input_2": np.array(y, np_dtype(dt))}
    check(numpy_backend, "openvino.BitwiseLeftShift-15", arrays)
    check(numpy_backend, "openvino.BitwiseRightShift-15", arrays)


# --- popcount, native bits -----------------------------------------------------------------------
@pytest.mark.parametrize("dt", SIGNED)
def test_popcount_of_negative_values_counts_stored_bits(
    numpy_backend: Backend, dt: DataType
) -> None:
    w = width(dt)
    x = np.array([-1, -2, -(1 << (w - 1)), -3, 1], dtype=np_dtype(dt))
    for out in ("UINT8", "UINT32"):
        got = check(numpy_backend, DML + "BIT_COUNT", {"InputTensor": x}, {"output_datatype": out})
        assert got.tolist() == [w, w - 1, 1, w - 1, 1]


FLOAT_PATTERNS = {
    DataType.FP16: SPECIAL_BITS[16],
    DataType.FP32: SPECIAL_BITS[32],
    DataType.FP64: SPECIAL_BITS[64],
}


@pytest.mark.parametrize("dt", list(FLOAT_PATTERNS))
def test_dml_ops_are_bit_exact_on_nan_payloads_zeros_and_denormals(
    numpy_backend: Backend, dt: DataType
) -> None:
    patterns = list(FLOAT_PATTERNS[dt])
    w = width(dt)
    mask = (1 << w) - 1
    a = from_bits(patterns, dt, (len(patterns),))
    b = from_bits(patterns[::-1], dt, (len(patterns),))
    ub = bits_dtype(dt)
    results = {
        "BIT_NOT": (
            {"InputTensor": a},
            [~p & mask for p in patterns],
        ),
        "BIT_AND": (
            {"ATensor": a, "BTensor": b},
            [p & q for p, q in zip(patterns, patterns[::-1], strict=True)],
        ),
        "BIT_OR": (
            {"ATensor": a, "BTensor": b},
            [p | q for p, q in zip(patterns, patterns[::-1], strict=True)],
        ),
        "BIT_XOR": (
            {"ATensor": a, "BTensor": b},
            [p ^ q for p, q in zip(patterns, patterns[::-1], strict=True)],
        ),
        "BIT_COUNT": ({"InputTensor": a}, [bin(p).count("1") for p in patterns]),
    }
    for op, (arrays, want) in results.items():
        got = check(numpy_backend, DML + op, arrays)
        values = got.tolist() if op == "BIT_COUNT" else got.view(ub).tolist()
        assert values == want, op
    # An identity through the bits: a AND a returns every payload untouched, signalling NaN too.
    same = check(numpy_backend, DML + "BIT_AND", {"ATensor": a, "BTensor": a})
    assert same.view(ub).tolist() == patterns


def test_signalling_nan_payload_fp32_explicit(numpy_backend: Backend) -> None:
    x = np.array([0x7FC00001, 0x7F800001, 0x80000000, 0x00000001], np.uint32).view(np.float32)
    got = compute(numpy_backend, DML + "BIT_OR", {"ATensor": x, "BTensor": x})
    assert got.view(np.uint32).tolist() == [0x7FC00001, 0x7F800001, 0x80000000, 0x00000001]
    got = compute(numpy_backend, DML + "BIT_NOT", {"InputTensor": x})
    assert got.view(np.uint32).tolist() == [0x803FFFFE, 0x807FFFFE, 0x7FFFFFFF, 0xFFFFFFFE]


# --- 64-bit --------------------------------------------------------------------------------------
def test_64_bit_values_above_2_32_are_exact(numpy_backend: Backend) -> None:
    big = [2**32, 2**32 + 1, 2**40 + 12345, 2**63 + 2**33 + 7, 2**64 - 1, 0xDEADBEEFCAFEBABE]
    a = np.array(big, np.uint64)
    b = np.array(big[::-1], np.uint64)
    assert check(numpy_backend, "onnx.BitwiseAnd-18", {"A": a, "B": b}).tolist() == [
        x & y for x, y in zip(big, big[::-1], strict=True)
    ]
    assert check(numpy_backend, "onnx.BitwiseXor-18", {"A": a, "B": b}).tolist() == [
        x ^ y for x, y in zip(big, big[::-1], strict=True)
    ]
    assert check(numpy_backend, "onnx.BitwiseNot-18", {"X": a}).tolist() == [
        ~x & (2**64 - 1) for x in big
    ]
    counts = np.array([1, 31, 32, 33, 63, 64], np.uint64)
    left = check(numpy_backend, "onnx.BitShift-11", {"X": a, "Y": counts}, {"direction": "LEFT"})
    assert left.tolist() == [
        (x << c) & (2**64 - 1) if c < 64 else 0 for x, c in zip(big, counts.tolist(), strict=True)
    ]
    right = check(numpy_backend, DML + "BIT_SHIFT_RIGHT", {"ATensor": a, "BTensor": counts})
    assert right.tolist() == [
        x >> c if c < 64 else 0 for x, c in zip(big, counts.tolist(), strict=True)
    ]
    signed = np.array([-(2**40) - 3, 2**62 + 5, -(2**63)], np.int64)
    assert check(numpy_backend, "openvino.BitwiseNot-13", {"input_1": signed}).tolist() == [
        2**40 + 2,
        -(2**62) - 6,
        2**63 - 1,
    ]
    assert check(
        numpy_backend, DML + "BIT_COUNT", {"InputTensor": signed}, {"output_datatype": "UINT32"}
    ).tolist() == [bin(int(v) & (2**64 - 1)).count("1") for v in signed.tolist()]


# --- shapes the spec allows at the edges ---------------------------------------------------------
def test_rank_zero_and_empty_tensors_for_onnx_and_openvino(numpy_backend: Backend) -> None:
    s = np.array(0xF0, np.uint8)
    assert check(numpy_backend, "onnx.BitwiseNot-18", {"X": s}).shape == ()
    v = np.array([1, 2, 4], np.uint8)
    got = check(numpy_backend, "onnx.BitwiseOr-18", {"A": s, "B": v})
    assert got.tolist() == [0xF1, 0xF2, 0xF4]
    empty = np.zeros((2, 0, 3), np.int16)
    got = check(numpy_backend, "openvino.BitwiseAnd-13", {"input_1": empty, "input_2": empty[:1]})
    assert got.shape == (2, 0, 3)
    got = check(
        numpy_backend,
        "openvino.BitwiseXor-13",
        {"input_1": empty, "input_2": np.zeros((3,), np.int16)},
        {"auto_broadcast": "pdpd"},
    )
    assert got.shape == (2, 0, 3)


def test_pdpd_broadcasts_from_axis(numpy_backend: Backend) -> None:
    a = np.arange(2 * 3 * 4 * 5, dtype=np.uint16).reshape(2, 3, 4, 5)
    b = np.array([[1], [2], [4]], np.uint16).reshape(3, 1)
    got = check(
        numpy_backend,
        "openvino.BitwiseOr-13",
        {"input_1": a, "input_2": b},
        {"auto_broadcast": "pdpd", "axis": 1},
    )
    np.testing.assert_array_equal(got, a | b.reshape(1, 3, 1, 1))


def test_reference_is_not_vacuous() -> None:
    """The reference disagrees with NumPy exactly where docs/semantics.md says NumPy is wrong."""
    x = np.array([-1], np.int8)
    assert reference(DML + "BIT_COUNT", {"InputTensor": x}).tolist() == [8]
    assert np.bitwise_count(x).tolist() == [1]


@pytest.mark.parametrize(
    "model", ["BitwiseAnd-13", "BitwiseOr-13", "BitwiseXor-13", "BitwiseNot-13"]
)
def test_openvino_bool_with_non_canonical_bytes_is_logical(
    numpy_backend: Backend, model: str
) -> None:
    """A BOOL byte other than 0 or 1 (possible on the wire) is true; results are 0 or 1 bytes."""
    raw_a = np.array([0, 1, 2, 255, 0x80, 0, 2, 1] * 9, np.uint8)
    raw_b = np.array([2, 2, 1, 0x80, 0, 0, 255, 1] * 9, np.uint8)
    a, b = raw_a.view(np.bool_), raw_b.view(np.bool_)
    arrays = {"input_1": a} if model == "BitwiseNot-13" else {"input_1": a, "input_2": b}
    got = check(numpy_backend, "openvino." + model, arrays)
    assert set(got.view(np.uint8).tolist()) <= {0, 1}
    ta, tb = raw_a != 0, raw_b != 0
    want = {
        "BitwiseAnd-13": ta & tb,
        "BitwiseOr-13": ta | tb,
        "BitwiseXor-13": ta != tb,
        "BitwiseNot-13": ~ta,
    }[model]
    assert got.tolist() == want.tolist()
