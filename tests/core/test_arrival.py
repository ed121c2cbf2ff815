"""An element-wise plan computed as its body arrives (``core/arrival.py``), and the HTTP body
read it runs under (``api/body.receive_first``, ``receive_rest``), in process.

The body is filled in uneven parts, as a socket fills it; after each, ``arrived`` may compute only
elements whose every input byte is in (checked against a count made element by element), and the
answer, once ``finish`` has run, is byte for byte NumPy's, for every kind of qualifying operator
and type; an input decoded from JSON never holds a piece back. A broadcast input (one element, a
row, a column) is awaited whole, before or after the input written over in the body, and the
pieces are whole rows. The reads around it refuse a body in the words a body read whole is
refused in."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import numpy as np
import pytest
from core.graph_models import chain_model, model_bytes, tensor
from onnx import TensorProto, helper
from support.inprocess import TestClient, app_client, runtime_of

from tensorbits.api import rest_graph, rest_infer
from tensorbits.api.body import receive_first, receive_rest
from tensorbits.core import arrival as arrival_module
from tensorbits.core.arrival import Arrival
from tensorbits.core.dataplane import DataPlane
from tensorbits.core.engine import rows
from tensorbits.observability import BodyInto
from tensorbits_protocol.dtypes import DataType, from_numpy
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.operators import OPERATORS, REGISTRY
from tensorbits_protocol.validation import TensorSpec, validate_call

Arr = np.ndarray[Any, Any]
RNG = np.random.default_rng(7)
PIECE = 64 << 10  # pieces of 64 KiB here, so that small bodies run in many
GRAPH_CONFIG = json.dumps({"backend": "onnxruntime"})
GRAPH_FILE = "file:1/model.onnx"


@pytest.fixture(scope="module")
def plane() -> Iterator[DataPlane]:
    client: TestClient
    with app_client() as client:
        yield runtime_of(client).plane


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arrival_module, "PIECE_BYTES", PIECE)
    monkeypatch.setattr(rest_infer, "IN_PLACE_MIN_BYTES", 1)


def _bits(n: int, dtype: str) -> Arr:
    return RNG.integers(0, 256, n * np.dtype(dtype).itemsize, dtype=np.uint8).view(dtype)


def _header(arrays: dict[str, Arr], parameters: dict[str, Any], json_data: str = "") -> bytes:
    inputs = []
    for name, x in arrays.items():
        tensor: dict[str, Any] = {
            "name": name, "shape": list(x.shape), "datatype": str(from_numpy(x.dtype)),
        }  # fmt: skip
        if name == json_data:
            tensor["data"] = x.reshape(-1).tolist()
        else:
            tensor["parameters"] = {"binary_data_size": x.nbytes}
        inputs.append(tensor)
    return json.dumps(
        {"inputs": inputs, "parameters": {**parameters, "binary_data_output": True}}
    ).encode()


# (model, inputs, parameters, the expected output)
CASES: dict[str, Callable[[], tuple[str, dict[str, Arr], dict[str, Any], Arr]]] = {
    "not-uint8": lambda: (lambda x: ("DML_OPERATOR_ELEMENT_WISE_BIT_NOT", {"InputTensor": x},
                                     {}, ~x))(_bits(300_001, "uint8")),
    "xor-uint32": lambda: (lambda a, b: ("DML_OPERATOR_ELEMENT_WISE_BIT_XOR",
                                         {"ATensor": a, "BTensor": b}, {}, a ^ b))(
        _bits(100_003, "uint32"), _bits(100_003, "uint32")),
    "and-int64": lambda: (lambda a, b: ("onnx.BitwiseAnd-18", {"A": a, "B": b}, {}, a & b))(
        _bits(40_001, "int64"), _bits(40_001, "int64")),
    "count-uint8": lambda: (lambda x: ("DML_OPERATOR_ELEMENT_WISE_BIT_COUNT",
                                       {"InputTensor": x}, {}, np.bitwise_count(x)))(
        _bits(200_000, "uint8")),
}  # fmt: skip


def _arriving(
    plane: DataPlane,
    model: str,
    arrays: dict[str, Arr],
    parameters: dict[str, Any],
    json_data: str = "",
) -> tuple[bytearray, bytes, Arrival]:
    """The body's buffer with only its JSON header in, the rest of its bytes, and its arrival."""
    header = _header(arrays, parameters, json_data)
    tail = b"".join(x.tobytes() for name, x in arrays.items() if name != json_data)
    body = bytearray(len(header) + len(tail))
    body[: len(header)] = header
    op = next(o for o in OPERATORS if o.name == model)
    planned = rest_infer.plan(plane, op, body, len(header))
    arrival = rest_infer.arriving(planned, plane.backend, body)
    assert arrival is not None, "the case does not qualify"
    return body, header + tail, arrival


def _ready_by_element(arrays: dict[str, Arr], header: int, filled: int, json_data: str) -> int:
    """How many leading elements have every body input's bytes in, counted one by one."""
    at = header
    ends: list[tuple[int, int]] = []
    for name, x in arrays.items():
        if name != json_data:
            ends.append((at, x.dtype.itemsize))
            at += x.nbytes
    total = next(iter(arrays.values())).size
    count = 0
    while count < total and all(a + (count + 1) * s <= filled for a, s in ends):
        count += 1
    return count


def _fill(body: bytearray, whole: bytes, arrival: Arrival, start: int) -> list[tuple[int, int]]:
    """``whole``'s bytes from ``start`` copied into ``body`` in uneven parts of at most a piece
    (so a body of several pieces has pieces to run before its end, whatever the order tests
    run in), ``arrived`` told after each; (bytes in, elements computed) after each."""
    seen: list[tuple[int, int]] = []
    rng = np.random.default_rng(len(whole))

    async def arrive() -> None:
        filled = start
        while filled < len(whole):
            end = min(len(whole), filled + int(rng.integers(1, PIECE + 1)))
            body[filled:end] = whole[filled:end]
            filled = end
            await arrival.arrived(filled)
            seen.append((filled, arrival.done))

    asyncio.run(arrive())
    return seen


@pytest.mark.parametrize("case", list(CASES))
def test_pieces_as_the_body_arrives_give_numpys_answer(plane: DataPlane, case: str) -> None:
    model, arrays, parameters, want = CASES[case]()
    body, whole, arrival = _arriving(plane, model, arrays, parameters)
    header = len(whole) - sum(x.nbytes for x in arrays.values())
    seen = _fill(body, whole, arrival, header)
    for filled, done in seen:  # never an element whose bytes are not all in
        assert done <= _ready_by_element(arrays, header, filled, ""), (filled, done)
    assert any(0 < done < arrival.total for _, done in seen), "no piece ran before the end"
    arrival.finish()
    assert arrival.done == arrival.total
    at = header + sum(x.nbytes for x in list(arrays.values())[: arrival.over])
    answer = np.frombuffer(body, want.dtype, want.size, at)
    np.testing.assert_array_equal(answer, want)


def test_ready_counts_each_input_in_the_body(plane: DataPlane) -> None:
    a, b = _bits(50_001, "uint32"), _bits(50_001, "uint32")
    arrays = {"ATensor": a, "BTensor": b}
    _, whole, arrival = _arriving(plane, "DML_OPERATOR_ELEMENT_WISE_BIT_XOR", arrays, {})
    header = len(whole) - a.nbytes - b.nbytes
    for filled in (0, header, header + a.nbytes, header + a.nbytes + 3, header + a.nbytes + 4,
                   header + a.nbytes + 4001, len(whole) - 1, len(whole)):  # fmt: skip
        assert arrival.ready(filled) == _ready_by_element(arrays, header, filled, "")


def test_an_input_decoded_from_json_holds_no_piece_back(plane: DataPlane) -> None:
    x, y = _bits(20_000, "uint8"), RNG.integers(0, 8, 20_000, dtype=np.uint8)
    arrays = {"X": x, "Y": y}
    body, whole, arrival = _arriving(
        plane, "onnx.BitShift-11", arrays, {"direction": "LEFT"}, json_data="Y"
    )
    header = len(whole) - x.nbytes
    assert arrival.ready(header + 1000) == 1000  # X's bytes alone decide
    _fill(body, whole, arrival, header)
    arrival.finish()
    np.testing.assert_array_equal(np.frombuffer(body, np.uint8, x.size, header), x << y)


# --- a broadcast input beside the one written over --------------------------------------------
K, M = 151, 1000  # the output's rows and row length: many pieces of 64 KiB, rows across them


def _counts(shape: tuple[int, ...], dtype: str) -> Arr:
    """Shift counts below, at and past the width."""
    return RNG.integers(0, np.dtype(dtype).itemsize * 8 + 3, shape).astype(dtype)


# (model, inputs in the body's order, parameters, the expected output, the row's elements)
BroadcastCase = tuple[str, dict[str, Arr], dict[str, Any], Arr, int]


def _xor_one(first: bool) -> BroadcastCase:
    a, b = _bits(K * M, "uint8").reshape(K, M), _bits(1, "uint8")
    arrays = {"B": b, "A": a} if first else {"A": a, "B": b}
    return "onnx.BitwiseXor-18", arrays, {}, a ^ b, 1


def _and_row(first: bool) -> BroadcastCase:
    a, b = _bits(K * M, "uint32").reshape(K, M), _bits(M, "uint32")
    arrays = {"B": b, "A": a} if first else {"A": a, "B": b}
    return "onnx.BitwiseAnd-18", arrays, {}, a & b, M


def _or_column(first: bool) -> BroadcastCase:  # (K, 1): split along the first axis only
    a, b = _bits(K * M, "int16").reshape(K, M), _bits(K, "int16").reshape(K, 1)
    arrays = {"input_2": b, "input_1": a} if first else {"input_1": a, "input_2": b}
    return "openvino.BitwiseOr-13", arrays, {}, a | b, M


def _or_leading(first: bool) -> BroadcastCase:  # (L, M) against (K, L, M): rows of L * M
    a, b = _bits(K * 4 * 250, "int64").reshape(K, 4, 250), _bits(4 * 250, "int64").reshape(4, 250)
    arrays = {"B": b, "A": a} if first else {"A": a, "B": b}
    return "onnx.BitwiseOr-18", arrays, {}, a | b, 4 * 250


def _shift_left_by_one(first: bool) -> BroadcastCase:
    x, y = _bits(K * M, "uint16").reshape(K, M), _counts((1,), "uint16")
    arrays = {"Y": y, "X": x} if first else {"X": x, "Y": y}
    want = np.where(y < 16, x << np.minimum(y, 15), 0).astype(np.uint16)
    return "onnx.BitShift-11", arrays, {"direction": "LEFT"}, want, 1


def _shift_right_by_row(first: bool) -> BroadcastCase:
    x, y = _bits(K * M, "uint8").reshape(K, M), _counts((M,), "uint8")
    arrays = {"Y": y, "X": x} if first else {"X": x, "Y": y}
    want = np.where(y < 8, x >> np.minimum(y, 7), 0).astype(np.uint8)
    return "onnx.BitShift-11", arrays, {"direction": "RIGHT"}, want, M


def _one_value_shifted_by_each(first: bool) -> BroadcastCase:  # written over the counts
    x, y = _bits(1, "uint32"), _counts((K, M), "uint32")
    arrays = {"X": x, "Y": y} if first else {"Y": y, "X": x}
    want = np.where(y < 32, x << np.minimum(y, 31), 0).astype(np.uint32)
    return "onnx.BitShift-11", arrays, {"direction": "LEFT"}, want, 1


BROADCASTS: dict[str, Callable[[bool], BroadcastCase]] = {
    "xor-one-element": _xor_one,
    "and-row": _and_row,
    "or-column": _or_column,
    "or-leading-axes": _or_leading,
    "shift-left-by-one-element": _shift_left_by_one,
    "shift-right-by-row": _shift_right_by_row,
    "one-value-shifted-by-each": _one_value_shifted_by_each,
}


def _ready_broadcast(arrays: dict[str, Arr], header: int, filled: int, total: int) -> int:
    """How many leading elements have every body input's bytes in, counted one by one: an input
    of fewer elements than the output is read whole by every element (broadcast)."""
    at = header
    ends: list[tuple[int, int]] = []
    for x in arrays.values():
        if x.size < total and filled < at + x.nbytes:
            return 0
        if x.size == total:
            ends.append((at, x.dtype.itemsize))
        at += x.nbytes
    count = 0
    while count < total and all(a + (count + 1) * s <= filled for a, s in ends):
        count += 1
    return count


@pytest.mark.parametrize("first", [True, False], ids=["broadcast-first", "broadcast-last"])
@pytest.mark.parametrize("case", list(BROADCASTS))
def test_pieces_beside_a_broadcast_give_numpys_answer(
    plane: DataPlane, case: str, first: bool
) -> None:
    model, arrays, parameters, want, row = BROADCASTS[case](first)
    body, whole, arrival = _arriving(plane, model, arrays, parameters)
    header = len(whole) - sum(x.nbytes for x in arrays.values())
    small = next(x for x in arrays.values() if x.size < want.size)
    small_ends = header + small.nbytes if first else len(whole)
    seen = _fill(body, whole, arrival, header)
    for filled, done in seen:  # never an element whose bytes are not all in; whole rows
        assert done <= _ready_broadcast(arrays, header, filled, want.size), (filled, done)
        assert done % row == 0, (filled, done, row)
        if filled < small_ends:
            assert done == 0, (filled, done)  # the broadcast input is awaited whole
    if first:
        assert any(0 < done < arrival.total for _, done in seen), "no piece ran before the end"
    arrival.finish()
    assert arrival.done == arrival.total == want.size
    over = REGISTRY[model].inputs[arrival.over]  # by the operator's order, not the body's
    assert arrays[over].shape == want.shape  # written over the input of the output's shape
    starts = dict(zip(arrays, itertools.accumulate((x.nbytes for x in arrays.values()),
                                                    initial=header), strict=False))  # fmt: skip
    answer = np.frombuffer(body, want.dtype, want.size, starts[over])
    assert answer.tobytes() == want.tobytes()
    for name, x in arrays.items():  # the broadcast input as it was sent
        if name != over:
            assert bytes(body[starts[name] : starts[name] + x.nbytes]) == x.tobytes()


@pytest.mark.parametrize(
    ("full", "small", "split"),
    [
        ((K, M), (1,), (K * M,)),
        ((K, M), (1, 1), (K * M,)),
        ((K, M), (M,), (K, M)),
        ((K, M), (K, 1), (K, M)),
        ((K, 4, M), (M,), (K * 4, M)),
        ((K, 4, M), (4, M), (K, 4, M)),
        ((K, 4, M), (4, 1), (K, 4, M)),
        ((2, 3, 4, 5), (1, 1, 4, 1), (6, 4, 5)),
        ((K, M), (K, M), (K * M,)),
    ],
)
def test_rows_merge_the_leading_axes_a_broadcast_repeats(
    full: tuple[int, ...], small: tuple[int, ...], split: tuple[int, ...]
) -> None:
    op = REGISTRY["onnx.BitwiseXor-18"]
    specs = {"A": TensorSpec(DataType.UINT8, full), "B": TensorSpec(DataType.UINT8, small)}
    call = validate_call(op, specs)
    assert rows(call) == split


def test_ready_awaits_a_broadcast_input_whole_and_counts_whole_rows(plane: DataPlane) -> None:
    a, b = _bits(K * M, "uint32").reshape(K, M), _bits(M, "uint32")
    arrays = {"A": a, "B": b}
    _, whole, arrival = _arriving(plane, "onnx.BitwiseXor-18", arrays, {})
    header = len(whole) - a.nbytes - b.nbytes
    for filled in (header, header + 4 * M * 3, len(whole) - 1):
        assert arrival.ready(filled) == 0  # B, after A, not all in
    assert arrival.ready(len(whole)) == a.size
    arrays = {"B": b, "A": a}
    _, whole, arrival = _arriving(plane, "onnx.BitwiseXor-18", arrays, {})
    header = len(whole) - a.nbytes - b.nbytes
    assert arrival.ready(header + b.nbytes - 1) == 0
    assert arrival.ready(header + b.nbytes) == 0
    assert arrival.ready(header + b.nbytes + 4 * M - 1) == 0  # a row but one element
    assert arrival.ready(header + b.nbytes + 4 * M) == M
    assert arrival.ready(header + b.nbytes + 4 * (3 * M + 7)) == 3 * M
    assert arrival.ready(len(whole)) == a.size


# --- the reads: the first part of a body, then its rest ---------------------------------------
def _into(*chunks: bytes | None) -> BodyInto:
    """A ``BODY_INTO`` as the server's: each call returns once ``until`` bytes are in (or the
    body ended, or the client left: None), the chunks written in place as they come."""
    pending = list(chunks)
    state = {"filled": 0}

    def into(view: memoryview, until: int | None = None) -> Awaitable[tuple[int, bool]]:
        async def read() -> tuple[int, bool]:
            while pending:
                if until is not None and state["filled"] >= until:
                    return state["filled"], False
                chunk = pending.pop(0)
                if chunk is None:
                    return state["filled"], False
                end = state["filled"] + len(chunk)
                if end <= len(view):
                    view[state["filled"] : end] = chunk
                state["filled"] = end
            return state["filled"], True

        return read()

    return into


def _read(length: int, first: int, *chunks: bytes | None) -> tuple[bytearray, list[int]]:
    body = bytearray(length)
    told: list[int] = []

    async def arrived(filled: int) -> None:
        told.append(filled)

    async def run() -> None:
        into = _into(*chunks)
        view = memoryview(body)
        read = await receive_first(into, view, first)
        await receive_rest(into, view, read, 4, arrived)

    asyncio.run(run())
    return body, told


def test_the_rest_is_read_in_place_and_told_as_it_comes() -> None:
    body, told = _read(12, 3, b"ab", b"cd", b"efgh", b"ijkl")
    assert body == b"abcdefghijkl"
    assert told == [8]  # at least every 4 bytes past the last look, until the end


@pytest.mark.parametrize(
    ("chunks", "rule", "words"),
    [
        ((b"abc", b"defg"), "body_length", "longer than its Content-Length 6"),
        ((b"abc", None), "truncated", "client disconnected before the request body was complete"),
        ((b"ab", None), "truncated", "client disconnected before the request body was complete"),
        ((b"abc",), "truncated", "ended after 3 of its 6 declared bytes"),
        ((b"a",), "truncated", "ended after 1 of its 6 declared bytes"),
    ],
    ids=["longer", "gone-after-the-first-part", "gone-before-it", "shorter", "shorter-first"],
)
def test_a_body_read_in_parts_is_refused_as_one_read_whole(
    chunks: tuple[bytes | None, ...], rule: str, words: str
) -> None:
    with pytest.raises(InvalidRequest, match=words) as caught:
        _read(6, 2, *chunks)
    assert caught.value.rule == rule


# --- a fused graph model: the chain computed as its inputs arrive ------------------------------
def _graph_request(
    plane: DataPlane, name: str, data: bytes, arrays: dict[str, Arr]
) -> tuple[bytearray, bytes, rest_graph.Arriving]:
    """A graph model ``name`` of ``data`` loaded, and a body for it with only its JSON header
    in: the buffer, all its bytes, and how it is computed as the rest arrives."""
    model = plane.load_graph(name, GRAPH_CONFIG, {GRAPH_FILE: data})
    header = _header(arrays, {})
    tail = b"".join(x.tobytes() for x in arrays.values())
    body = bytearray(len(header) + len(tail))
    body[: len(header)] = header
    request = rest_graph.plan(model, plane.limits, body, len(header), None)
    arriving = rest_graph.arriving(request, plane.backend, body)
    assert arriving is not None, "the graph does not qualify"
    return body, header + tail, arriving


def test_a_fused_chain_as_its_body_arrives_gives_the_whole_runs_answer(plane: DataPlane) -> None:
    x, y = _bits(70_001, "uint32"), _bits(70_001, "uint32")
    arrays = {"x": x, "y": y}
    body, whole, arriving = _graph_request(
        plane, "arriving_chain", chain_model(np.dtype(np.uint32)), arrays
    )
    header = len(whole) - x.nbytes - y.nbytes
    arrival = arriving.arrival
    seen = _fill(body, whole, arrival, header)
    for filled, done in seen:  # the constant k is in the model; x and y decide
        assert done <= _ready_by_element(arrays, header, filled, ""), (filled, done)
    assert any(0 < done < arrival.total for _, done in seen), "no piece ran before the end"
    model = plane.graphs.get("arriving_chain")
    assert model is not None
    request = rest_graph.plan(model, plane.limits, body, header, None)
    assert rest_graph.encode(request, plane.backend, arriving) is arriving.framed  # finished
    (answer,) = arriving.framed.parts
    assert arriving.framed.header_length is not None
    z = np.frombuffer(answer, np.uint32, x.size, arriving.framed.header_length)
    np.testing.assert_array_equal(z, ~((x ^ y) << np.uint32(3)))
    # Byte for byte the answer of the same body run whole.
    whole_body = bytearray(whole)
    again = rest_graph.plan(model, plane.limits, whole_body, header, None)
    assert bytes(answer) == bytes(rest_graph.encode(again, plane.backend).parts[0])


def test_a_graph_answering_an_input_is_computed_once_its_body_is_in(plane: DataPlane) -> None:
    u32 = TensorProto.UINT32
    data = model_bytes(  # z = NOT x, and x itself answered: copied after, not as it arrives
        [helper.make_node("BitwiseNot", ["x"], ["z"]), helper.make_node("Identity", ["x"], ["x2"])],
        [tensor("x", u32, ["n"])],
        [tensor("z", u32, ["n"]), tensor("x2", u32, ["n"])],
    )
    plane.load_graph("answering_an_input", GRAPH_CONFIG, {GRAPH_FILE: data})
    x = _bits(1000, "uint32")
    header = _header({"x": x}, {})
    body = bytearray(header + x.tobytes())
    model = plane.graphs.get("answering_an_input")
    assert model is not None
    request = rest_graph.plan(model, plane.limits, body, len(header), None)
    assert rest_graph.arriving(request, plane.backend, body) is None
