"""The NumPy backend's threaded path: large calls are split into chunks
(``numpy_backend.chunked``) that run on several threads and write slices of one output.

Checked three ways: real arrays whose output alone is over PARALLEL_THRESHOLD_BYTES (so the
threaded path must run: contiguous, strided, broadcast, in place), the chunk plan itself (every
output element written exactly once, operands aligned with it), and the property suite again with
the thresholds at their minimum so every call, whatever its shape, is chunked.

Sizes are derived from the module's constants, never hard-coded, so tuning them keeps these valid.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from core.bitref import OP_TYPES, assert_bits_equal, cases, check, reference
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from support.host_calls import compute, validate_arrays

from tensorbits.core.backends import numpy_backend as nb
from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.engine import run_call
from tensorbits_protocol.dtypes import itemsize
from tensorbits_protocol.operators import get_operator

MIB = 1 << 20


def big_rows(itemsize: int, cols: int) -> int:
    """Rows of ``cols`` elements whose output is over both 1 MiB and the parallel threshold."""
    return max(MIB, nb.PARALLEL_THRESHOLD_BYTES) // (itemsize * cols) + 3


DML = "DML_OPERATOR_ELEMENT_WISE_"


@pytest.fixture(scope="module")
def threaded() -> Iterator[NumpyBackend]:
    backend = NumpyBackend(threads=4)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def single() -> Iterator[NumpyBackend]:
    backend = NumpyBackend(threads=1)
    yield backend
    backend.close()


@contextlib.contextmanager
def counting_chunks() -> Iterator[list[int]]:
    """Counts the pieces of every chunked call while the block runs, proving the threaded path
    really ran."""
    calls: list[int] = []
    real = nb.chunked

    def spy(operands: Any, out: Any, parts: int) -> Any:
        pieces = real(operands, out, parts)
        calls.append(len(pieces))
        return pieces

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nb, "chunked", spy)
        yield calls


@pytest.fixture
def chunk_calls() -> Iterator[list[int]]:
    with counting_chunks() as calls:
        yield calls


def _sample_check(
    got: np.ndarray[Any, Any], model: str, arrays: dict[str, Any], params: Any
) -> None:
    """The pure-Python reference on a sample of rows (whole arrays would take too long)."""
    rows = sorted({0, 1, got.shape[0] // 2, got.shape[0] - 1})
    small = {}
    for name, x in arrays.items():
        small[name] = x[rows] if x.ndim == got.ndim and x.shape[0] == got.shape[0] else x
    assert_bits_equal(got[rows], reference(model, small, params))


def _big(dtype: Any, shape: tuple[int, ...], seed: int) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    info = np.iinfo(np.dtype(dtype).str.replace("f", "u").replace("i", "u"))
    raw = rng.integers(0, int(info.max), size=shape, dtype=info.dtype, endpoint=True)
    return raw.view(dtype)


BIG_CASES = [
    (DML + "BIT_XOR", np.float32, {}),
    (DML + "BIT_NOT", np.int64, {}),
    (DML + "BIT_COUNT", np.int16, {"output_datatype": "UINT32"}),
    (DML + "BIT_COUNT", np.float16, {}),
    (DML + "BIT_COUNT", np.int64, {}),
    (DML + "BIT_SHIFT_LEFT", np.uint32, {}),
    ("openvino.BitwiseRightShift-15", np.int8, {}),
    ("openvino.BitwiseAnd-13", np.bool_, {}),
    ("onnx.BitShift-11", np.uint64, {"direction": "RIGHT"}),
    ("onnx.BitwiseOr-18", np.int32, {}),
]


def _arrays(model: str, dtype: Any, shape: tuple[int, ...]) -> dict[str, np.ndarray[Any, Any]]:
    op = get_operator(model)
    out: dict[str, np.ndarray[Any, Any]] = {}
    for i, name in enumerate(op.inputs):
        if dtype is np.bool_:
            out[name] = np.random.default_rng(i).integers(0, 2, shape).astype(bool)
        elif i == 1 and ("Shift" in model or "SHIFT" in model):
            width = np.dtype(dtype).itemsize * 8
            rng = np.random.default_rng(i)
            out[name] = rng.integers(0, width + 3, shape).astype(dtype)
        else:
            out[name] = _big(dtype, shape, seed=i)
    return out


@pytest.mark.parametrize(
    ("model", "dtype", "params"), BIG_CASES, ids=[f"{c[0]}-{np.dtype(c[1])}" for c in BIG_CASES]
)
def test_over_one_mib_matches_single_threaded(
    threaded: NumpyBackend,
    single: NumpyBackend,
    chunk_calls: list[int],
    model: str,
    dtype: Any,
    params: dict[str, Any],
) -> None:
    out_type = validate_arrays(model, _arrays(model, dtype, (1, 67)), params).output_datatype
    out_itemsize = itemsize(out_type)
    shape = (big_rows(out_itemsize, 67), 67)  # odd row length: chunks end mid-row
    arrays = _arrays(model, dtype, shape)
    got = compute(threaded, model, arrays, params)
    assert got.nbytes >= max(MIB, nb.PARALLEL_THRESHOLD_BYTES)
    assert chunk_calls
    assert chunk_calls[0] > 1
    np.testing.assert_array_equal(
        got.view(np.uint8), compute(single, model, arrays, params).view(np.uint8)
    )
    _sample_check(got, model, arrays, params)


def test_strided_broadcast_and_in_place_over_one_mib(
    threaded: NumpyBackend, chunk_calls: list[int]
) -> None:
    """run_call directly, so the backend itself sees non-contiguous operands and a strided out."""
    cols = 300
    rows = big_rows(4, cols)
    backing = _big(np.uint32, (rows, 2 * cols), seed=3)
    a = backing[:, ::2]  # strided rows
    b = _big(np.uint32, (cols,), seed=4)  # broadcast along axis 0 (stride 0 once broadcast)
    model = "onnx.BitwiseXor-18"
    call = validate_arrays(model, {"A": a, "B": b}, None)
    want = a ^ b
    out_backing = np.zeros((rows, 2 * cols), np.uint32)
    out = out_backing[:, 1::2]
    assert out.nbytes >= nb.PARALLEL_THRESHOLD_BYTES
    assert not out.flags.c_contiguous
    result = run_call(threaded, call, [a, b], out)
    assert result is out
    assert len(chunk_calls) == 1
    assert chunk_calls[0] > 1
    np.testing.assert_array_equal(out, want)
    assert not out_backing[:, ::2].any()  # nothing written between the strided elements

    # In place: the output is the first input itself (same memory, same description).
    before = a.copy()
    run_call(threaded, call, [a, b], a)
    np.testing.assert_array_equal(a, before ^ b)
    np.testing.assert_array_equal(backing[:, 1::2], _big(np.uint32, (rows, 2 * cols), 3)[:, 1::2])


def test_in_place_through_compute_over_one_mib(
    threaded: NumpyBackend, chunk_calls: list[int]
) -> None:
    x = _big(np.float64, (big_rows(8, 1),), seed=5)
    original = x.copy()
    got = compute(threaded, DML + "BIT_NOT", {"InputTensor": x}, out=x)
    assert got is x
    assert chunk_calls
    np.testing.assert_array_equal(x.view(np.uint64), ~original.view(np.uint64))


def test_size_one_leading_axis_strided(threaded: NumpyBackend, chunk_calls: list[int]) -> None:
    """Non-contiguous operands with one row on axis 0 (no split along axis 0 is possible)."""
    a = _big(np.uint8, (1, 2 * big_rows(1, 1)), seed=6)[:, ::2]
    b = np.array([0x0F], np.uint8)
    call = validate_arrays("onnx.BitwiseAnd-18", {"A": a, "B": b}, None)
    got = run_call(threaded, call, [a, b])
    np.testing.assert_array_equal(got, a & 0x0F)
    assert chunk_calls


@settings(max_examples=40, deadline=None)
@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_side=1, max_dims=4, max_side=5),
    parts=st.integers(1, 9),
    strided_out=st.booleans(),
)
def test_chunk_plan_covers_every_element_once(shapes: Any, parts: int, strided_out: bool) -> None:
    out_shape = shapes.result_shape
    sa, sb = shapes.input_shapes
    a = np.arange(int(np.prod(sa)), dtype=np.int64).reshape(sa)
    b = np.arange(int(np.prod(sb)), dtype=np.int64).reshape(sb) * 1000

    def fresh_out() -> np.ndarray[Any, Any]:
        if strided_out and len(out_shape) >= 1:
            return np.zeros((*out_shape[:-1], 2 * out_shape[-1]), np.int64)[..., ::2]
        return np.zeros(out_shape, np.int64)

    counts = fresh_out()
    pieces = nb.chunked([a, b], counts, parts)
    assert 1 <= len(pieces) <= parts
    for _operands, piece_out in pieces:
        assert np.shares_memory(piece_out, counts)
        piece_out += 1
    np.testing.assert_array_equal(counts, np.ones(out_shape, np.int64))

    out = fresh_out()
    for (pa, pb), piece_out in nb.chunked([a, b], out, parts):
        assert pa.shape == pb.shape == piece_out.shape
        np.add(pa, pb, out=piece_out)
    np.testing.assert_array_equal(out, a + b)


# --- every operator chunked, whatever its size ----------------------------------------------------
@pytest.fixture(scope="module")
def always_chunked() -> Iterator[NumpyBackend]:
    """Every call chunked into pieces as small as the backend allows (tuning constants that a
    version of the backend does not have are set anyway, harmlessly)."""
    backend = NumpyBackend(threads=3)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nb, "PARALLEL_THRESHOLD_BYTES", 0)
        mp.setattr(nb, "MIN_CHUNK_BYTES", 1, raising=False)
        mp.setattr(nb, "CHUNK_ALIGN_BYTES", 1, raising=False)
        yield backend
    backend.close()


@pytest.mark.parametrize(("model", "dt"), OP_TYPES[::3], ids=[f"{m}-{d}" for m, d in OP_TYPES[::3]])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_operator_matches_reference_when_chunked(
    always_chunked: NumpyBackend, model: str, dt: Any, data: st.DataObject
) -> None:
    assert nb.PARALLEL_THRESHOLD_BYTES == 0
    case = data.draw(cases(model, dt))
    want = reference(case.model, case.arrays, case.params)
    if want.size == 0:
        return  # nothing to split
    with counting_chunks() as calls:
        check(always_chunked, case.model, case.arrays, case.params)
    assert calls, "the threaded path did not run"
