"""A large binary answer written over its input's bytes in the request's body
(``rest_infer.written_over``), in process: the answer byte for byte the one a new buffer gives,
its output part a view of the request's own buffer (no buffer allocated), planned afresh and from
the header cache alike, beside a broadcast input too (one element, a row: never written over);
and every request that does not qualify answered as before, from a new buffer: a popcount into
another type, a broadcast without a binary input of the output's shape, an input in shared
memory, JSON output, a small answer; a swapped, read-only, strided or decoded input and a backend
without proven kernels, by the rule itself."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import pytest
import tritonclient.utils.shared_memory as system_shm
from httpx import Response
from support.framing import framed
from support.inprocess import TestClient, app_client, runtime_of
from support.v2 import binary_input, infer_binary, infer_json, json_input, output_array

from tensorbits.api import rest_infer
from tensorbits.core.backends.base import Backend
from tensorbits.core.plan import Plan
from tensorbits_protocol import codec

Arr = np.ndarray[Any, Any]
MIB = 1 << 20
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
PREFIX = f"/tensorbits_over_input_{os.getpid()}"
RNG = np.random.default_rng(41)


class Seen(NamedTuple):
    """What the front end had for one request: its body's buffer, its plan, its answer."""

    body: bytearray
    plan: Plan
    framed: codec.Framed


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[Seen]:
    """Each request's body, plan and framed answer, as ``rest_infer`` made them."""
    got: list[Seen] = []
    plan, encode = rest_infer.plan, rest_infer.encode
    bodies: list[bytearray] = []
    plans: list[Plan] = []

    def planning(*args: Any, **kwargs: Any) -> Plan:
        bodies.append(args[2])
        planned = plan(*args, **kwargs)
        plans.append(planned)
        return planned

    def encoding(planned: Plan, *args: Any, **kwargs: Any) -> codec.Framed:
        framed = encode(planned, *args, **kwargs)
        got.append(Seen(bodies[-1], plans[-1], framed))
        return framed

    monkeypatch.setattr(rest_infer, "plan", planning)
    monkeypatch.setattr(rest_infer, "encode", encoding)
    return got


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with app_client(shared_memory=True, shared_memory_prefix=PREFIX) as made:
        yield made


def _bits(n: int, dtype: str) -> Arr:
    return RNG.integers(0, 256, n * np.dtype(dtype).itemsize, dtype=np.uint8).view(dtype)


def _counts(n: int, dtype: str) -> Arr:
    """Shift counts below, at and past the width, negative for a signed type."""
    bits = np.dtype(dtype).itemsize * 8
    low = -3 if np.dtype(dtype).kind == "i" else 0
    return RNG.integers(low, bits + 4, n).astype(dtype)


# (model, inputs, parameters, the input written over, the expected output)
QUALIFYING: dict[str, Callable[[], tuple[str, dict[str, Arr], dict[str, Any], Arr]]] = {}


def _not() -> tuple[str, dict[str, Arr], dict[str, Any], Arr]:
    x = _bits(2 * MIB + 3, "uint8")
    return NOT, {"InputTensor": x}, {}, ~x


def _bit_shift_right() -> tuple[str, dict[str, Arr], dict[str, Any], Arr]:
    x, y = _bits(MIB // 2, "uint32"), _counts(MIB // 2, "uint32")
    want = np.where(y < 32, x >> np.minimum(y, 31), 0).astype(np.uint32)
    return "onnx.BitShift-11", {"X": x, "Y": y}, {"direction": "RIGHT"}, want


def _signed_right_shift() -> tuple[str, dict[str, Arr], dict[str, Any], Arr]:
    x, y = _bits(MIB // 8, "int64"), _counts(MIB // 8, "int64")
    inside = (y >= 0) & (y < 64)
    want = np.where(inside, x >> np.clip(y, 0, 63), np.where(x < 0, -1, 0)).astype(np.int64)
    return "openvino.BitwiseRightShift-15", {"input_1": x, "input_2": y}, {}, want


def _and() -> tuple[str, dict[str, Arr], dict[str, Any], Arr]:
    a, b = _bits(MIB // 4, "int32"), _bits(MIB // 4, "int32")
    return "onnx.BitwiseAnd-18", {"A": a, "B": b}, {}, a & b


def _count_same_type() -> tuple[str, dict[str, Arr], dict[str, Any], Arr]:
    x = _bits(MIB, "uint8")
    model = "DML_OPERATOR_ELEMENT_WISE_BIT_COUNT"
    return model, {"InputTensor": x}, {}, np.bitwise_count(x)


def _xor_one_element_first() -> tuple[str, dict[str, Arr], dict[str, Any], Arr]:
    a, b = _bits(2 * MIB, "uint8"), _bits(1, "uint8")
    return "onnx.BitwiseXor-18", {"A": b, "B": a}, {}, a ^ b


def _or_row() -> tuple[str, dict[str, Arr], dict[str, Any], Arr]:
    a, b = _bits(MIB // 4, "int32").reshape(256, -1), _bits(MIB // 1024, "int32")
    return "openvino.BitwiseOr-13", {"input_1": a, "input_2": b}, {}, a | b


def _one_value_shifted_by_each() -> tuple[str, dict[str, Arr], dict[str, Any], Arr]:
    x, y = _bits(1, "uint16"), _counts(MIB, "uint16")  # written over the counts
    want = np.where(y < 16, x << np.minimum(y, 15), 0).astype(np.uint16)
    return "onnx.BitShift-11", {"X": x, "Y": y}, {"direction": "LEFT"}, want


QUALIFYING.update(
    {
        "not": _not,
        "shift-right-unsigned": _bit_shift_right,
        "shift-right-signed": _signed_right_shift,
        "and": _and,
        "count-uint8": _count_same_type,
        "xor-one-element-broadcast": _xor_one_element_first,
        "or-row-broadcast": _or_row,
        "shift-of-one-value-broadcast": _one_value_shifted_by_each,
    }
)


def _answer(response: Response) -> tuple[bytes, dict[str, str]]:
    assert response.status_code == 200, response.text
    keep = ("content-type", "content-length", codec.HEADER_LENGTH.lower())
    return response.content, {k: response.headers[k] for k in keep if k in response.headers}


def _shares_body(one: Seen) -> bool:
    parts = one.framed.parts
    body = np.frombuffer(one.body, np.uint8)
    return len(parts) == 2 and np.shares_memory(np.frombuffer(parts[1], np.uint8), body)


@pytest.mark.parametrize("case", list(QUALIFYING))
def test_a_qualifying_answer_is_written_over_its_input_byte_for_byte(
    client: TestClient, seen: list[Seen], monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    model, arrays, parameters, want = QUALIFYING[case]()
    # Twice: planned afresh, then from the header cache's template.
    answers = [_answer(infer_binary(client, model, arrays, parameters)) for _ in range(2)]
    assert len(seen) == 2
    for one in seen:
        assert _shares_body(one), one.framed.parts[:1]
        assert one.framed.header_length == len(one.framed.parts[0])
    assert seen[1].plan.response_head is not None  # the second from the template
    got = output_array(infer_binary(client, model, arrays, parameters))
    np.testing.assert_array_equal(got, want)
    # Today's path: a new buffer for every answer, the same bytes and headers.
    monkeypatch.setattr(rest_infer, "IN_PLACE_MIN_BYTES", 1 << 62)
    seen.clear()
    before = [_answer(infer_binary(client, model, arrays, parameters)) for _ in range(2)]
    assert all(len(one.framed.parts) == 1 for one in seen)
    assert answers == before


def _backend(client: TestClient) -> Backend:
    return runtime_of(client).plane.backend


def _answered_from_a_new_buffer(client: TestClient, seen: list[Seen]) -> None:
    assert seen, "no answer encoded"
    for one in seen:
        assert len(one.framed.parts) == 1, "written over the body"
        part = np.frombuffer(one.framed.parts[0], np.uint8)
        assert not np.shares_memory(part, np.frombuffer(one.body, np.uint8))
        assert rest_infer.written_over(one.plan, _backend(client)) is None


def test_a_popcount_into_another_type_gets_a_new_buffer(
    client: TestClient, seen: list[Seen]
) -> None:
    x = _bits(MIB, "uint16")
    response = infer_binary(client, "DML_OPERATOR_ELEMENT_WISE_BIT_COUNT", {"InputTensor": x})
    np.testing.assert_array_equal(output_array(response), np.bitwise_count(x))
    _answered_from_a_new_buffer(client, seen)


def test_a_broadcast_gets_a_new_buffer_only_without_an_input_to_write_over(
    client: TestClient, seen: list[Seen]
) -> None:
    """A broadcast whose input of the output's shape qualifies is written over that input (the
    broadcast one left as sent: the cases of ``QUALIFYING``); one without such an input in the
    body gets a new buffer: each input repeated (a column against a row), or the input of the
    output's shape decoded from JSON beside a binary one of one element."""
    a, b = _bits(1024, "uint8").reshape(1024, 1), _bits(1024, "uint8")
    response = infer_binary(client, "onnx.BitwiseXor-18", {"A": a, "B": b})
    np.testing.assert_array_equal(output_array(response), a ^ b)
    x, y = _bits(MIB, "uint8"), _bits(1, "uint8")
    header = {
        "inputs": [json_input("A", x), binary_input("B", y)],
        "parameters": {"binary_data_output": True},
    }
    body, headers = framed(header, y.tobytes())
    response = client.post("/v2/models/onnx.BitwiseXor-18/infer", content=body, headers=headers)
    np.testing.assert_array_equal(output_array(response), x ^ y)
    assert len(seen) == 2
    _answered_from_a_new_buffer(client, seen)


def test_a_json_answer_gets_no_view_of_the_body(client: TestClient, seen: list[Seen]) -> None:
    x = _bits(MIB, "uint8")
    response = infer_binary(client, NOT, {"InputTensor": x}, binary_output=False)
    assert codec.HEADER_LENGTH.lower() not in response.headers
    np.testing.assert_array_equal(output_array(response), ~x)
    assert [len(one.framed.parts) for one in seen] == [1]
    assert rest_infer.written_over(seen[0].plan, _backend(client)) is None


def test_a_small_answer_gets_a_new_buffer(client: TestClient, seen: list[Seen]) -> None:
    x = _bits(rest_infer.IN_PLACE_MIN_BYTES - 1, "uint8")
    for _ in range(2):
        np.testing.assert_array_equal(
            output_array(infer_binary(client, NOT, {"InputTensor": x})), ~x
        )
    _answered_from_a_new_buffer(client, seen)


def test_an_input_in_shared_memory_gets_a_new_buffer(client: TestClient, seen: list[Seen]) -> None:
    x = _bits(2 * MIB, "uint8")
    key = f"{PREFIX}_in"
    region = system_shm.create_shared_memory_region("in", key, x.nbytes)
    try:
        system_shm.set_shared_memory_region(region, [x])
        registered = client.post(
            "/v2/systemsharedmemory/region/in/register",
            json={"key": key, "offset": 0, "byte_size": x.nbytes},
        )
        assert registered.status_code == 200, registered.text
        header = {
            "inputs": [
                {
                    "name": "X",
                    "datatype": "UINT8",
                    "shape": [x.size],
                    "parameters": {
                        "shared_memory_region": "in",
                        "shared_memory_byte_size": x.nbytes,
                    },
                }
            ],
            "parameters": {"binary_data_output": True},
        }
        for _ in range(2):
            response = client.post("/v2/models/onnx.BitwiseNot-18/infer", json=header)
            np.testing.assert_array_equal(output_array(response), ~x)
        _answered_from_a_new_buffer(client, seen)
    finally:
        client.post("/v2/systemsharedmemory/region/in/unregister")
        system_shm.destroy_shared_memory_region(region)


def test_json_data_input_is_not_written_over(client: TestClient, seen: list[Seen]) -> None:
    x = _bits(MIB, "uint8")
    response = infer_json(client, "onnx.BitwiseNot-18", {"X": x}, {"binary_data_output": True})
    np.testing.assert_array_equal(output_array(response), ~x)
    _answered_from_a_new_buffer(client, seen)


def test_the_rule_refuses_a_swapped_read_only_or_strided_input(
    client: TestClient, seen: list[Seen]
) -> None:
    """Inputs HTTP cannot send (its tensors are little-endian, its body a bytearray) put into a
    qualifying plan: each refused, and each answered from a new buffer, right."""
    x = _bits(MIB // 4, "uint32")
    infer_binary(client, "onnx.BitwiseNot-18", {"X": x})
    planned = seen[0].plan
    backend = _backend(client)
    assert rest_infer.written_over(planned, backend) == 0
    strided = np.frombuffer(bytearray(2 * x.nbytes), np.uint32)[::2]
    strided[:] = x
    swapped = np.frombuffer(bytearray(x.byteswap().tobytes()), np.dtype(">u4"))
    refused = {
        "read-only": np.frombuffer(x.tobytes(), np.uint32),
        "strided": strided,
        "swapped": swapped,
        "owned": x.copy(),
    }
    for name, given in refused.items():
        other = planned._replace(inputs=[given])
        assert rest_infer.written_over(other, backend) is None, name
        framed = rest_infer.encode(other, backend)
        assert len(framed.parts) == 1, name
        body = bytes(framed.parts[0])
        got = np.frombuffer(body[framed.header_length :], "<u4")
        np.testing.assert_array_equal(got, ~x, err_msg=name)


def test_a_backend_without_proven_kernels_keeps_the_new_buffer(
    client: TestClient, seen: list[Seen]
) -> None:
    x = _bits(MIB, "uint8")
    infer_binary(client, NOT, {"InputTensor": x})
    backend = _backend(client)

    class Placed:  # a host backend that lists no proven kernels (as a placed one)
        host_memory = True

    assert rest_infer.written_over(seen[0].plan, backend) == 0
    assert rest_infer.written_over(seen[0].plan, Placed()) is None  # type: ignore[arg-type]


def test_the_rule_refuses_a_broadcast_input_in_the_memory_written_over(
    client: TestClient, seen: list[Seen]
) -> None:
    """A broadcast input that is a view of the input the output would be written over (which
    HTTP cannot send: its tensors lie side by side) put into a qualifying plan: refused, as
    its element would be read once written, and answered right from a new buffer."""
    a, b = _bits(2 * MIB, "uint8"), _bits(1, "uint8")
    infer_binary(client, "onnx.BitwiseXor-18", {"A": b, "B": a})
    planned = seen[0].plan
    backend = _backend(client)
    assert rest_infer.written_over(planned, backend) == 1
    full = planned.inputs[1]
    inside = planned._replace(inputs=[full[5:6], full])
    assert rest_infer.written_over(inside, backend) is None
    want = (full ^ full[5]).tobytes()
    framed = rest_infer.encode(inside, backend)
    assert len(framed.parts) == 1
    assert bytes(framed.parts[0])[framed.header_length :] == want
