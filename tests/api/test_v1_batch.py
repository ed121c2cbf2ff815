"""POST /v1/batch end to end (in process, NumPy backend): results, views, in-place, chains."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from support.framing import HEADER
from support.host_calls import compute
from support.inprocess import TestClient
from support.v1 import batch, bind, data, dispatch, outputs, post, v1_client, zeros

from tensorbits.core.backends import Backend
from tensorbits_protocol.dtypes import from_numpy
from tensorbits_protocol.operators import OPERATORS, OperatorSpec

RNG = np.random.default_rng(20240607)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with v1_client() as c:
        yield c


def u64(*shape: int) -> np.ndarray[Any, Any]:
    return RNG.integers(0, 2**64, size=shape, dtype=np.uint64)


def xor_with_query(
    rows: int, words: int, parameters: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Buffer "codes" XOR buffer "query" into "diff", UINT64 ``rows`` x ``words``: the query's
    one row is broadcast over the codes' by a stride of 0."""
    return dispatch(
        "BIT_XOR",
        parameters,
        ATensor=bind("codes", "UINT64", [rows, words]),
        BTensor=bind("query", "UINT64", [rows, words], strides=[0, 1]),
        OutputTensor=bind("diff", "UINT64", [rows, words]),
    )


def test_hamming_distance_chain(client: TestClient) -> None:
    """XOR every packed code with the query (broadcast by stride 0), then count the bits."""
    rows, words = 64, 4
    codes, query = u64(rows, words), u64(1, words)
    header, payload = batch(
        [
            data("codes", codes),
            data("query", query),
            zeros("diff", codes.nbytes),
            zeros("counts", rows * words),
        ],
        [
            xor_with_query(rows, words, {"feature_level": "4_1"}),
            dispatch(
                "BIT_COUNT",
                InputTensor=bind("diff", "UINT64", [rows, words]),
                OutputTensor=bind("counts", "UINT8", [rows, words]),
            ),
        ],
        ["counts", "diff"],
        id="hamming",
    )
    head, got = outputs(post(client, header, payload))
    assert head == {
        "id": "hamming",
        "outputs": [
            {"name": "counts", "byte_size": rows * words},
            {"name": "diff", "byte_size": codes.nbytes},
        ],
    }
    want_diff = codes ^ query
    counts = np.frombuffer(got["counts"], np.uint8).reshape(rows, words)
    np.testing.assert_array_equal(
        np.frombuffer(got["diff"], np.uint64).reshape(rows, words), want_diff
    )
    np.testing.assert_array_equal(counts, np.bitwise_count(want_diff))
    distances = counts.sum(axis=1, dtype=np.int64)
    want = [
        sum(bin(int(a) ^ int(b)).count("1") for a, b in zip(row, query[0], strict=True))
        for row in codes
    ]
    assert distances.tolist() == want


def test_in_place_not_bound_to_the_input_range(client: TestClient) -> None:
    a = RNG.integers(0, 256, size=(2, 24), dtype=np.uint8)
    # The tensor sits at offset 16 of the buffer; the bytes around it must not change.
    buffer = np.arange(64, dtype=np.uint8)
    buffer[16:64] = a.reshape(-1)
    same = bind("a", "UINT8", [2, 24], offset=16)
    header, payload = batch(
        [data("a", buffer)], [dispatch("BIT_NOT", InputTensor=same, OutputTensor=same)], ["a"]
    )
    _, got = outputs(post(client, header, payload))
    result = np.frombuffer(got["a"], np.uint8)
    np.testing.assert_array_equal(result[:16], np.arange(16, dtype=np.uint8))
    np.testing.assert_array_equal(result[16:].reshape(2, 24), ~a)


def test_in_place_xor_bound_to_a_tensor(client: TestClient) -> None:
    a, b = u64(8), u64(8)
    header, payload = batch(
        [data("a", a), data("b", b)],
        [
            dispatch(
                "BIT_XOR",
                ATensor=bind("a", "UINT64", [8]),
                BTensor=bind("b", "UINT64", [8]),
                OutputTensor=bind("a", "UINT64", [8]),
            )
        ],
        ["a", "b"],
    )
    _, got = outputs(post(client, header, payload))
    np.testing.assert_array_equal(np.frombuffer(got["a"], np.uint64), a ^ b)
    np.testing.assert_array_equal(np.frombuffer(got["b"], np.uint64), b)


def test_in_place_not_of_float_bits_is_bit_exact(client: TestClient) -> None:
    # FLOAT32 is DirectML's spelling; NaN payloads and -0.0 pass through as bits.
    bits = np.array([0x3F800000, 0x80000000, 0x7FC00001, 0x00000001], dtype=np.uint32)
    same = bind("x", "FLOAT32", [4])
    header, payload = batch(
        [data("x", bits)], [dispatch("BIT_NOT", InputTensor=same, OutputTensor=same)], ["x"]
    )
    _, got = outputs(post(client, header, payload))
    np.testing.assert_array_equal(np.frombuffer(got["x"], np.uint32), ~bits)


def test_stride_zero_broadcasts_rows_and_columns(client: TestClient) -> None:
    row = np.array([1, 2, 4, 8], dtype=np.uint32)
    column = np.array([16, 32, 64], dtype=np.uint32)
    header, payload = batch(
        [data("row", row), data("col", column), zeros("out", 3 * 4 * 4)],
        [
            dispatch(
                "BIT_OR",
                ATensor=bind("row", "UINT32", [3, 4], strides=[0, 1]),
                BTensor=bind("col", "UINT32", [3, 4], strides=[1, 0]),
                OutputTensor=bind("out", "UINT32", [3, 4]),
            )
        ],
        ["out"],
    )
    _, got = outputs(post(client, header, payload))
    np.testing.assert_array_equal(
        np.frombuffer(got["out"], np.uint32).reshape(3, 4), row[None, :] | column[:, None]
    )


def test_padded_strides_read_and_write_only_their_elements(client: TestClient) -> None:
    # A 3x4 UINT16 tensor stored in rows of 8; the output goes to rows of 6 at offset 32.
    stored = RNG.integers(0, 2**16, size=(3, 8), dtype=np.uint16)
    out_bytes = 32 + (2 * 6 + 4) * 2  # offset, then the minimum implied size of [3,4]/[6,1]
    sentinel = np.full(out_bytes + 8, 0xAB, dtype=np.uint8)
    header, payload = batch(
        [data("in", stored), data("out", sentinel)],
        [
            dispatch(
                "BIT_NOT",
                InputTensor=bind("in", "UINT16", [3, 4], strides=[8, 1]),
                OutputTensor=bind("out", "UINT16", [3, 4], offset=32, strides=[6, 1]),
            )
        ],
        ["out"],
    )
    _, got = outputs(post(client, header, payload))
    result = np.frombuffer(got["out"], np.uint8)
    assert (result[:32] == 0xAB).all()
    assert (result[out_bytes:] == 0xAB).all()  # past the bound range: untouched
    written = np.frombuffer(got["out"][32:], np.uint16, count=3 * 6 - 2).tolist()
    for r in range(3):
        assert written[r * 6 : r * 6 + 4] == (~stored[r, :4]).tolist()


def test_offsets_honour_a_larger_alignment(client: TestClient) -> None:
    a, b = u64(4), u64(4)
    buffer = np.zeros(128, dtype=np.uint8)
    buffer[0:32] = a.view(np.uint8)
    buffer[64:96] = b.view(np.uint8)
    header, payload = batch(
        [data("ab", buffer), zeros("out", 256)],
        [
            dispatch(
                "BIT_AND",
                ATensor=bind("ab", "INT64", [4], alignment=64),
                BTensor=bind("ab", "INT64", [4], offset=64, alignment=64),
                OutputTensor=bind("out", "INT64", [4], offset=192, alignment=64),
            )
        ],
        ["out"],
    )
    _, got = outputs(post(client, header, payload))
    np.testing.assert_array_equal(np.frombuffer(got["out"][192:224], np.uint64), a & b)
    assert got["out"][:192] == bytes(192)


def test_a_dispatch_reads_what_an_earlier_one_wrote(client: TestClient) -> None:
    a = RNG.integers(0, 2**32, size=16, dtype=np.uint32)
    shifts = np.full(16, 3, dtype=np.uint32)
    header, payload = batch(
        [data("a", a), data("s", shifts), zeros("t", 64), zeros("u", 64)],
        [
            dispatch(
                "BIT_NOT",
                InputTensor=bind("a", "UINT32", [16]),
                OutputTensor=bind("t", "UINT32", [16]),
            ),
            dispatch(
                "BIT_SHIFT_LEFT",
                ATensor=bind("t", "UINT32", [16]),
                BTensor=bind("s", "UINT32", [16]),
                OutputTensor=bind("u", "UINT32", [16]),
            ),
            dispatch(
                "BIT_AND",
                ATensor=bind("u", "UINT32", [16]),
                BTensor=bind("a", "UINT32", [16]),
                OutputTensor=bind("u", "UINT32", [16]),
            ),
        ],
        ["u"],
    )
    _, got = outputs(post(client, header, payload))
    np.testing.assert_array_equal(np.frombuffer(got["u"], np.uint32), ((~a) << np.uint32(3)) & a)


def test_one_hundred_small_dispatches_in_one_request(client: TestClient) -> None:
    n = 100
    a = RNG.integers(0, 2**32, size=(n, 4), dtype=np.uint32)
    b = RNG.integers(0, 2**32, size=(n, 4), dtype=np.uint32)
    dispatches = [
        dispatch(
            "BIT_XOR",
            {"feature_level": "3_0"},
            ATensor=bind("a", "UINT32", [4], offset=16 * i),
            BTensor=bind("b", "UINT32", [4], offset=16 * i),
            OutputTensor=bind("out", "UINT32", [4], offset=16 * i),
        )
        for i in range(n)
    ]
    header, payload = batch(
        [data("a", a), data("b", b), zeros("out", a.nbytes)], dispatches, ["out"]
    )
    _, got = outputs(post(client, header, payload))
    np.testing.assert_array_equal(np.frombuffer(got["out"], np.uint32).reshape(n, 4), a ^ b)


def _case(op: OperatorSpec) -> tuple[dict[str, np.ndarray[Any, Any]], dict[str, Any]]:
    """Inputs and parameters that exercise ``op``: broadcasting where its rule allows it."""
    row = op.support[0]
    dtype = np.dtype(row.input_types[-1].lower() if row.input_types[-1].name != "BOOL" else "int8")
    info = np.iinfo(dtype)
    first = RNG.integers(info.min, info.max, size=(2, 3), dtype=dtype, endpoint=True)
    broadcasts = op.spec != "dml"
    if len(op.inputs) == 1:
        return {op.inputs[0]: first}, {}
    second = RNG.integers(
        0, dtype.itemsize * 8 + 2, size=(3,) if broadcasts else (2, 3), dtype=dtype
    )
    parameters = {"direction": "RIGHT"} if "direction" in op.parameter_index else {}
    return {op.inputs[0]: first, op.inputs[1]: second}, parameters


@pytest.mark.parametrize("op", OPERATORS, ids=lambda op: op.name)
def test_every_operator_matches_the_v2_engine(
    client: TestClient, numpy_backend: Backend, op: OperatorSpec
) -> None:
    arrays, parameters = _case(op)
    want = compute(numpy_backend, op.name, arrays, parameters)
    out_type = str(from_numpy(want.dtype))
    header, payload = batch(
        [data(name, array) for name, array in arrays.items()]
        + [zeros("result", -(-want.nbytes // 4) * 4)],
        [
            dispatch(
                op.name,
                parameters,
                **{
                    name: bind(name, str(from_numpy(a.dtype)), list(a.shape))
                    for name, a in arrays.items()
                },
                **{op.output: bind("result", out_type, list(want.shape))},
            )
        ],
        ["result"],
    )
    _, got = outputs(post(client, header, payload))
    result = np.frombuffer(got["result"], want.dtype, count=want.size).reshape(want.shape)
    np.testing.assert_array_equal(result, want)


def test_a_json_only_body_needs_no_framing_header(client: TestClient) -> None:
    header, _ = batch(
        [zeros("z", 8)],
        [
            dispatch(
                "BIT_NOT", InputTensor=bind("z", "UINT8", [8]), OutputTensor=bind("z", "UINT8", [8])
            )
        ],
        ["z"],
    )
    response = client.post("/v1/batch", json=header)
    _, got = outputs(response)
    assert got["z"] == b"\xff" * 8


def test_empty_batch_returns_an_empty_framed_body(client: TestClient) -> None:
    response = post(client, {"buffers": [], "dispatches": [], "outputs": []})
    assert json.loads(response.content) == {"outputs": []}
    # The header is padded with spaces so that the first output starts 8-byte aligned.
    assert response.headers[HEADER] == str(len(response.content))
    assert len(response.content) % 8 == 0


def test_nothing_runs_when_a_later_dispatch_is_invalid(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[str] = []
    backend = client.app.state.runtime.selection.backend  # type: ignore[attr-defined]
    monkeypatch.setattr(backend, "run", lambda call, inputs, out: runs.append(call.op.name))
    good = dispatch(
        "BIT_NOT", InputTensor=bind("a", "UINT8", [16]), OutputTensor=bind("a", "UINT8", [16])
    )
    bad = dispatch(
        "BIT_NOT",
        InputTensor=bind("a", "UINT8", [16]),
        OutputTensor=bind("a", "UINT8", [16], offset=8),
    )
    header, payload = batch([data("a", bytes(32))], [good] * 7 + [bad], ["a"])
    response = post(client, header, payload)
    assert response.status_code == 400
    assert response.json()["field"] == "dispatches[7].bindings.OutputTensor.offset"
    assert runs == []


def test_large_views_take_the_parallel_path(client: TestClient) -> None:
    # 2 MiB outputs pass the NumPy backend's threshold, so the strided views are split across
    # threads: a broadcast input (stride 0), then an in-place NOT of the result.
    rows, words = 1 << 16, 4
    codes, query = u64(rows, words), u64(1, words)
    header, payload = batch(
        [data("codes", codes), data("query", query), zeros("diff", codes.nbytes)],
        [
            xor_with_query(rows, words),
            dispatch(
                "BIT_NOT",
                InputTensor=bind("diff", "UINT64", [rows, words]),
                OutputTensor=bind("diff", "UINT64", [rows, words]),
            ),
        ],
        ["diff"],
    )
    _, got = outputs(post(client, header, payload))
    diff = np.frombuffer(got["diff"], np.uint64).reshape(rows, words)
    np.testing.assert_array_equal(diff, ~(codes ^ query))


def test_openvino_bool_is_logical(client: TestClient) -> None:
    a = np.array([True, True, False, False], dtype=np.bool_)
    b = np.array([True, False], dtype=np.bool_)
    header, payload = batch(
        [data("a", a), data("b", b), zeros("out", 4)],
        [
            dispatch(
                "openvino.BitwiseXor-13",
                {"auto_broadcast": "numpy"},
                input_1=bind("a", "BOOL", [2, 2]),
                input_2=bind("b", "BOOL", [2]),
                output_1=bind("out", "BOOL", [2, 2]),
            )
        ],
        ["out"],
    )
    _, got = outputs(post(client, header, payload))
    assert list(got["out"]) == [0, 1, 1, 0]
