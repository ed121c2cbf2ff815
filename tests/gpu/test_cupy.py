"""The CuPy backend against the same pure-Python reference as the NumPy backend (core/bitref.py):
every operator × every allowed data type, the shift and popcount edge cases CUDA gets wrong
natively, bit-exact floats, 64-bit values, ``out=`` (in place, strided, big-endian), and sizes
over 1 MiB. Skipped, with the reason, where CuPy or a working CUDA device is missing (in GPU mode,
failed: gpu/devices.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from core.bitref import OP_TYPES, SPECIAL_BITS, check, check_drawn, from_bits, np_dtype, width
from gpu.devices import cupy_backend_or_skip
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.host_calls import compute, validate_arrays
from support.wide_kernel_cases import cases as wide_cases

from tensorbits.core.backends import Backend, select_backend
from tensorbits_protocol.dtypes import DTYPES, DataType
from tensorbits_protocol.operators import get_operator

pytestmark = pytest.mark.gpu

DML = "DML_OPERATOR_ELEMENT_WISE_"
SIGNED = [DataType.INT8, DataType.INT16, DataType.INT32, DataType.INT64]
UNSIGNED = [DataType.UINT8, DataType.UINT16, DataType.UINT32, DataType.UINT64]


BACKEND = cupy_backend_or_skip()


@pytest.fixture(scope="module")
def cupy_backend() -> Any:
    yield BACKEND
    BACKEND.close()


def test_backend_is_cupy(cupy_backend: Backend) -> None:
    assert cupy_backend.name == "cupy"
    assert cupy_backend.device.startswith("cuda:")


@pytest.mark.parametrize(("model", "dt"), OP_TYPES, ids=[f"{m}-{d}" for m, d in OP_TYPES])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_operator_matches_reference(
    cupy_backend: Backend, model: str, dt: DataType, data: st.DataObject
) -> None:
    check_drawn(cupy_backend, model, dt, data)


@pytest.mark.parametrize("dt", SIGNED + UNSIGNED)
def test_shift_counts_at_and_past_the_width(cupy_backend: Backend, dt: DataType) -> None:
    """CUDA's native << and >> are undefined here; the kernel must enforce docs/semantics.md rule 3."""
    w = width(dt)
    signed = dt in SIGNED
    values = [1, 5, (1 << (w - 1)) - 1, -1 if signed else (1 << w) - 1, 16]
    if signed:
        values += [-(1 << (w - 1)), -16]
    counts = [0, 1, w - 1, w, w + 1, 2 * w, 32, 64, 65, (1 << (w - 1)) - 1]
    if signed:
        counts += [-1, -w, -(1 << (w - 1))]
    counts = [c for c in counts if (-(1 << (w - 1)) if signed else 0) <= c < (1 << w)]
    x = np.array([v for v in values for _ in counts], dtype=np_dtype(dt))
    y = np.array([c for _ in values for c in counts], dtype=np_dtype(dt))
    for model in ("openvino.BitwiseLeftShift-15", "openvino.BitwiseRightShift-15"):
        check(cupy_backend, model, {"input_1": x, "input_2": y})
    if not signed:
        for model in (DML + "BIT_SHIFT_LEFT", DML + "BIT_SHIFT_RIGHT"):
            check(cupy_backend, model, {"ATensor": x, "BTensor": y})
        for direction in ("LEFT", "RIGHT"):
            check(cupy_backend, "onnx.BitShift-11", {"X": x, "Y": y}, {"direction": direction})


@pytest.mark.parametrize("dt", SIGNED)
def test_popcount_of_negative_values(cupy_backend: Backend, dt: DataType) -> None:
    w = width(dt)
    x = np.array([-1, -2, -(1 << (w - 1)), 1], dtype=np_dtype(dt))
    for out in ("UINT8", "UINT32"):
        got = check(cupy_backend, DML + "BIT_COUNT", {"InputTensor": x}, {"output_datatype": out})
        assert got.tolist() == [w, w - 1, 1, 1]


@pytest.mark.parametrize("dt", [DataType.FP16, DataType.FP32, DataType.FP64])
def test_float_bits_are_exact(cupy_backend: Backend, dt: DataType) -> None:
    patterns = list(SPECIAL_BITS[width(dt)])
    a = from_bits(patterns, dt, (len(patterns),))
    b = from_bits(patterns[::-1], dt, (len(patterns),))
    for op in ("BIT_AND", "BIT_OR", "BIT_XOR"):
        check(cupy_backend, DML + op, {"ATensor": a, "BTensor": b})
    check(cupy_backend, DML + "BIT_NOT", {"InputTensor": a})
    check(cupy_backend, DML + "BIT_COUNT", {"InputTensor": a}, {"output_datatype": "UINT32"})
    same = check(cupy_backend, DML + "BIT_AND", {"ATensor": a, "BTensor": a})
    assert same.view(DTYPES[dt].bits).tolist() == patterns


def test_64_bit_values_above_2_32(cupy_backend: Backend) -> None:
    big = [2**32, 2**32 + 1, 2**40 + 12345, 2**63 + 2**33 + 7, 2**64 - 1, 0xDEADBEEFCAFEBABE]
    a = np.array(big, np.uint64)
    counts = np.array([1, 31, 32, 33, 63, 64], np.uint64)
    check(cupy_backend, "onnx.BitwiseXor-18", {"A": a, "B": a[::-1].copy()})
    check(cupy_backend, "onnx.BitShift-11", {"X": a, "Y": counts}, {"direction": "LEFT"})
    check(cupy_backend, DML + "BIT_SHIFT_RIGHT", {"ATensor": a, "BTensor": counts})
    check(cupy_backend, DML + "BIT_COUNT", {"InputTensor": a})


def test_out_in_place_strided_and_big_endian(cupy_backend: Backend) -> None:
    x = np.arange(-40, 40, dtype=np.int32).reshape(8, 10)
    y = (np.arange(80, dtype=np.int32).reshape(8, 10) % 40) - 3
    model = "openvino.BitwiseRightShift-15"
    check(cupy_backend, model, {"input_1": x, "input_2": y}, out=x)  # in place
    backing = np.zeros((8, 20), np.int32)
    strided = backing[:, ::2]
    check(cupy_backend, model, {"input_1": x, "input_2": y}, out=strided)
    assert not backing[:, 1::2].any()
    be = np.zeros((8, 10), np.dtype(">i4"))
    check(cupy_backend, model, {"input_1": x.astype(">i4"), "input_2": y.astype(">i4")}, out=be)
    f = np.array([1.0, -0.0], np.dtype(">f4"))
    got = check(cupy_backend, DML + "BIT_NOT", {"InputTensor": f})
    assert got.astype("<f4").view(np.uint32).tolist() == [0xC07FFFFF, 0x7FFFFFFF]


@pytest.mark.parametrize("model", [DML + "BIT_XOR", "openvino.BitwiseRightShift-15"])
def test_over_one_mib(cupy_backend: Backend, model: str) -> None:
    rng = np.random.default_rng(0)
    op = get_operator(model)
    shape = (1 << 20) // 4 + 7
    x = rng.integers(-(2**31), 2**31, shape, dtype=np.int32)
    y = rng.integers(-2, 40, shape, dtype=np.int32)
    arrays = {op.inputs[0]: x, op.inputs[1]: y}
    got = compute(cupy_backend, model, arrays)
    want = np.bitwise_xor(x, y) if "XOR" in model else np.right_shift(x, y)
    np.testing.assert_array_equal(got, want)


WIDE_CASES = list(wide_cases())


def test_wide_kernels_serve_every_case_and_match_numpy(cupy_backend: Any) -> None:
    """The wide kernels on the device, on the cases the host build of their source passes
    (tests/core/test_wide_kernels.py): each must run wide and give NumPy's bytes."""
    cupy = cupy_backend.xp
    wrong = []
    for case in WIDE_CASES:
        operands = [cupy.asarray(x) for x in case.operands]
        out = cupy.empty(case.out.shape, case.out.dtype)
        if not cupy_backend.wide.run(case.function, case.left, operands, out):
            wrong.append(f"{case.name}: not run wide")
        elif not np.array_equal(out.get(), case.want):
            wrong.append(f"{case.name}: wrong result")
    assert not wrong, wrong[:20]


@pytest.mark.parametrize("offset", [0, 1, 8])
@pytest.mark.parametrize(
    "model", [DML + "BIT_NOT", DML + "BIT_XOR", "openvino.BitwiseLeftShift-15", DML + "BIT_COUNT"]
)
def test_wide_and_element_wise_kernels_agree_at_any_alignment(
    cupy_backend: Any, model: str, offset: int
) -> None:
    """An operand offset from 16 bytes runs element-wise, an aligned one wide: the same bytes."""
    cupy = cupy_backend.xp
    op = get_operator(model)
    rng = np.random.default_rng(offset)
    count = (1 << 20) + 13
    host = {name: rng.integers(0, 256, count + 16, np.uint8) for name in op.inputs}
    if "Shift" in model:
        host[op.inputs[1]] %= 10
    arrays = {name: x[offset : offset + count] for name, x in host.items()}
    want = compute(select_backend("numpy").backend, model, arrays)
    device = {name: cupy.asarray(x)[offset : offset + count] for name, x in host.items()}
    call = validate_arrays(model, arrays, None)
    out = cupy.empty(call.output_shape, want.dtype)
    cupy_backend.run(call, [device[name] for name in op.inputs], out)
    np.testing.assert_array_equal(out.get(), want)
