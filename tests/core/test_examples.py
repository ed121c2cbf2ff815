"""Every worked example of the seed documents and operators.md, verbatim, through the engine.

Each expected value is written out by hand here (not computed), and each case is also checked
against the pure-Python reference, so a wrong example and a wrong reference cannot agree.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from core.bitref import assert_bits_equal, reference
from support.host_calls import compute

from tensorbits.core.backends import Backend
from tensorbits_protocol.dtypes import DataType
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.operators import get_operator
from tensorbits_protocol.validation import TensorSpec, validate_call

DML = "DML_OPERATOR_ELEMENT_WISE_"
OV = "openvino."


def run(backend: Backend, model: str, arrays: dict[str, Any], params: Any = None) -> Any:
    got = compute(backend, model, arrays, params)
    assert_bits_equal(got, reference(model, arrays, params))
    return got


def u8(values: Any) -> np.ndarray[Any, Any]:
    return np.array(values, dtype=np.uint8)


# --- DirectML ------------------------------------------------------------------------------------
def test_dml_bit_not_uint8_example(numpy_backend: Backend) -> None:
    got = run(numpy_backend, DML + "BIT_NOT", {"InputTensor": u8([[0, 128], [42, 255]])})
    assert got.dtype == np.uint8
    assert got.tolist() == [[255, 127], [213, 0]]


def test_dml_bit_count_uint32_example_with_uint32_output(numpy_backend: Backend) -> None:
    x = np.array([[0, 123], [456, 789]], dtype=np.uint32)
    got = run(numpy_backend, DML + "BIT_COUNT", {"InputTensor": x}, {"output_datatype": "UINT32"})
    assert got.dtype == np.uint32
    assert got.tolist() == [[0, 6], [4, 5]]


def test_dml_bit_count_defaults_to_uint8_output(numpy_backend: Backend) -> None:
    x = np.array([[0, 123], [456, 789]], dtype=np.uint32)
    got = run(numpy_backend, DML + "BIT_COUNT", {"InputTensor": x})
    assert got.dtype == np.uint8
    assert got.tolist() == [[0, 6], [4, 5]]


@pytest.mark.parametrize(
    ("dtype", "value", "count"),
    [
        (np.float32, 1.0, 7),  # 0x3F800000
        (np.float16, 1.0, 4),  # 0x3C00
        (np.float64, 1.0, 10),  # 0x3FF0000000000000
        (np.int8, -1, 8),
        (np.int32, -1, 32),
        (np.int64, -2, 63),
        (np.int8, -128, 1),
        (np.int16, -1, 16),
        (np.uint64, 2**64 - 1, 64),
        (np.int64, -(2**63), 1),
    ],
)
def test_dml_bit_count_counts_stored_bits(
    numpy_backend: Backend, dtype: Any, value: Any, count: int
) -> None:
    """Not NumPy's bitwise_count, which counts |x| (INT8 -1 would give 1)."""
    got = run(numpy_backend, DML + "BIT_COUNT", {"InputTensor": np.array([value], dtype=dtype)})
    assert got.tolist() == [count]


def test_dml_bit_not_fp32_one_is_0xc07fffff(numpy_backend: Backend) -> None:
    got = run(numpy_backend, DML + "BIT_NOT", {"InputTensor": np.array([1.0], np.float32)})
    assert got.dtype == np.float32
    assert got.view(np.uint32).tolist() == [0xC07FFFFF]
    assert got[0] == np.float32(-3.9999998)


def test_dml_bit_not_fp32_negative_zero_is_nan_0x7fffffff(numpy_backend: Backend) -> None:
    got = run(numpy_backend, DML + "BIT_NOT", {"InputTensor": np.array([-0.0], np.float32)})
    assert got.view(np.uint32).tolist() == [0x7FFFFFFF]
    assert np.isnan(got[0])


def test_dml_xor_doc_bug_example_is_not_an_xor() -> None:
    """The XOR page shows the NOT example (one input); as an XOR it is a missing-input error."""
    with pytest.raises(InvalidRequest, match="BTensor: missing input"):
        validate_call(
            get_operator(DML + "BIT_XOR"), {"ATensor": TensorSpec(DataType.UINT8, (2, 2))}
        )


# --- OpenVINO ------------------------------------------------------------------------------------
def test_openvino_not_bool_example(numpy_backend: Backend) -> None:
    got = run(numpy_backend, OV + "BitwiseNot-13", {"input_1": np.array([True, False])})
    assert got.dtype == np.bool_
    assert got.tolist() == [False, True]


def test_openvino_not_uint8_example(numpy_backend: Backend) -> None:
    got = run(numpy_backend, OV + "BitwiseNot-13", {"input_1": u8([1, 3])})
    assert got.tolist() == [254, 252]


@pytest.mark.parametrize(
    ("model", "expected"),
    [("BitwiseAnd-13", [1, 32]), ("BitwiseOr-13", [23, 125]), ("BitwiseXor-13", [22, 93])],
)
def test_openvino_uint8_examples(numpy_backend: Backend, model: str, expected: list[int]) -> None:
    got = run(numpy_backend, OV + model, {"input_1": u8([21, 120]), "input_2": u8([3, 37])})
    assert got.dtype == np.uint8
    assert got.tolist() == expected


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("BitwiseAnd-13", [True, False, False]),
        ("BitwiseOr-13", [True, True, False]),
        ("BitwiseXor-13", [False, True, False]),
    ],
)
def test_openvino_bool_examples(numpy_backend: Backend, model: str, expected: list[bool]) -> None:
    a = np.array([True, False, False])
    b = np.array([True, True, False])
    got = run(numpy_backend, OV + model, {"input_1": a, "input_2": b})
    assert got.dtype == np.bool_
    assert got.tolist() == expected
    assert set(got.view(np.uint8).tolist()) <= {0, 1}


@pytest.mark.parametrize("model", ["BitwiseAnd-13", "BitwiseOr-13", "BitwiseXor-13"])
def test_openvino_broadcast_example_shape(numpy_backend: Backend, model: str) -> None:
    rng = np.random.default_rng(7)
    a = rng.integers(0, 256, (8, 1, 6, 1), dtype=np.uint8)
    b = rng.integers(0, 256, (7, 1, 5), dtype=np.uint8)
    got = run(numpy_backend, OV + model, {"input_1": a, "input_2": b})
    assert got.shape == (8, 7, 6, 5)
    ufunc = {"BitwiseAnd-13": np.bitwise_and, "BitwiseOr-13": np.bitwise_or}.get(
        model, np.bitwise_xor
    )
    np.testing.assert_array_equal(got, ufunc(a, b))


def test_openvino_no_broadcast_example_shape(numpy_backend: Backend) -> None:
    x = np.arange(256 * 56, dtype=np.int32).reshape(256, 56) - 7000
    got = run(numpy_backend, OV + "BitwiseNot-13", {"input_1": x})
    assert got.shape == (256, 56)
    np.testing.assert_array_equal(got, -x - 1)


# --- ONNX ----------------------------------------------------------------------------------------
def test_onnx_bitshift_right_doc_example(numpy_backend: Backend) -> None:
    got = run(
        numpy_backend,
        "onnx.BitShift-11",
        {"X": u8([1, 4]), "Y": u8([1, 1])},
        {"direction": "RIGHT"},
    )
    assert got.tolist() == [0, 2]


def test_onnx_bitshift_left_doc_example(numpy_backend: Backend) -> None:
    got = run(
        numpy_backend, "onnx.BitShift-11", {"X": u8([1, 2]), "Y": u8([1, 2])}, {"direction": "LEFT"}
    )
    assert got.tolist() == [2, 8]


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize(("direction", "expected"), [("LEFT", [32, 16, 8]), ("RIGHT", [8, 1, 0])])
def test_onnx_node_test_bitshift(
    numpy_backend: Backend, dtype: Any, direction: str, expected: list[int]
) -> None:
    """test_bitshift_{left,right}_uint{8,16,32,64}."""
    x = np.array([16, 4, 1], dtype=dtype)
    y = np.array([1, 2, 3], dtype=dtype)
    got = run(numpy_backend, "onnx.BitShift-11", {"X": x, "Y": y}, {"direction": direction})
    assert got.dtype == dtype
    assert got.tolist() == expected


def _random_int(shape: tuple[int, ...], dtype: Any, seed: int = 1) -> np.ndarray[Any, Any]:
    """onnx.numpy_helper.create_random_int: randint(max(min, -2^31), min(max, 2^31 - 1))."""
    info = np.iinfo(dtype)
    rng = np.random.RandomState(seed)
    return rng.randint(max(info.min, -(2**31)), min(info.max, 2**31 - 1), shape).astype(dtype)


ONNX_NODE_TESTS = [
    # (test name, op, dtype, shape A, shape B or None)
    ("test_bitwise_not_2d", "BitwiseNot-18", np.int32, (3, 4), None),
    ("test_bitwise_not_3d", "BitwiseNot-18", np.uint16, (3, 4, 5), None),
    ("test_bitwise_not_4d", "BitwiseNot-18", np.uint8, (3, 4, 5, 6), None),
    ("test_bitwise_and_i32_2d", "BitwiseAnd-18", np.int32, (3, 4), (3, 4)),
    ("test_bitwise_and_i16_3d", "BitwiseAnd-18", np.int16, (3, 4, 5), (3, 4, 5)),
    ("test_bitwise_and_ui64_bcast_3v1d", "BitwiseAnd-18", np.uint64, (3, 4, 5), (5,)),
    ("test_bitwise_and_ui8_bcast_4v3d", "BitwiseAnd-18", np.uint8, (3, 4, 5, 6), (4, 5, 6)),
    ("test_bitwise_or_i32_2d", "BitwiseOr-18", np.int32, (3, 4), (3, 4)),
    ("test_bitwise_or_i16_4d", "BitwiseOr-18", np.int8, (3, 4, 5, 6), (3, 4, 5, 6)),
    ("test_bitwise_or_ui64_bcast_3v1d", "BitwiseOr-18", np.uint64, (3, 4, 5), (5,)),
    ("test_bitwise_or_ui8_bcast_4v3d", "BitwiseOr-18", np.uint8, (3, 4, 5, 6), (4, 5, 6)),
    ("test_bitwise_xor_i32_2d", "BitwiseXor-18", np.int32, (3, 4), (3, 4)),
    ("test_bitwise_xor_i16_3d", "BitwiseXor-18", np.int16, (3, 4, 5), (3, 4, 5)),
    ("test_bitwise_xor_ui64_bcast_3v1d", "BitwiseXor-18", np.uint64, (3, 4, 5), (5,)),
    ("test_bitwise_xor_ui8_bcast_4v3d", "BitwiseXor-18", np.uint8, (3, 4, 5, 6), (4, 5, 6)),
]


@pytest.mark.parametrize(
    ("op", "dtype", "shape_a", "shape_b"),
    [case[1:] for case in ONNX_NODE_TESTS],
    ids=[case[0] for case in ONNX_NODE_TESTS],
)
def test_onnx_node_tests_match_numpy(
    numpy_backend: Backend,
    op: str,
    dtype: Any,
    shape_a: tuple[int, ...],
    shape_b: tuple[int, ...] | None,
) -> None:
    a = _random_int(shape_a, dtype, seed=1)
    if shape_b is None:
        got = run(numpy_backend, f"onnx.{op}", {"X": a})
        want = np.bitwise_not(a)
    else:
        b = _random_int(shape_b, dtype, seed=2)
        got = run(numpy_backend, f"onnx.{op}", {"A": a, "B": b})
        ufunc = {"BitwiseAnd-18": np.bitwise_and, "BitwiseOr-18": np.bitwise_or}.get(
            op, np.bitwise_xor
        )
        want = ufunc(a, b)
    assert got.shape == shape_a
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)
