"""POST /v1/batch refusals: hostile descriptors, graph references, framing, limits.

Each case mutates one valid batch and checks the status, the field path and the rule the error
names, and a phrase of its message."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from support.framing import HEADER, framed
from support.inprocess import TestClient
from support.v1 import batch, bind, data, dispatch, error, post, v1_client, zeros

Header = dict[str, Any]


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with v1_client() as c:
        yield c


def valid() -> tuple[Header, bytes]:
    """XOR of two UINT32 [4, 4] tensors of buffer "in" (at 0 and 64) into "out", then NOT."""
    return batch(
        [data("in", np.arange(32, dtype=np.uint32)), zeros("out", 64)],
        [
            dispatch(
                "BIT_XOR",
                ATensor=bind("in", "UINT32", [4, 4]),
                BTensor=bind("in", "UINT32", [4, 4], offset=64),
                OutputTensor=bind("out", "UINT32", [4, 4]),
            ),
            dispatch(
                "BIT_NOT",
                InputTensor=bind("out", "UINT32", [4, 4]),
                OutputTensor=bind("out", "UINT32", [4, 4]),
            ),
        ],
        ["out"],
    )


def a_tensor(h: Header) -> dict[str, Any]:
    binding: dict[str, Any] = h["dispatches"][0]["bindings"]["ATensor"]
    return binding


def b_tensor(h: Header) -> dict[str, Any]:
    binding: dict[str, Any] = h["dispatches"][0]["bindings"]["BTensor"]
    return binding


def output(h: Header) -> dict[str, Any]:
    binding: dict[str, Any] = h["dispatches"][0]["bindings"]["OutputTensor"]
    return binding


def setter(get: Callable[[Header], dict[str, Any]], **values: Any) -> Callable[[Header], None]:
    return lambda h: get(h).update(values)


def desc_setter(get: Callable[[Header], dict[str, Any]], **values: Any) -> Callable[[Header], None]:
    return lambda h: get(h)["desc"].update(values)


D0 = "dispatches[0].bindings"
CASES: dict[str, tuple[Callable[[Header], object], str, str, str]] = {
    # name: (mutation, field, rule, phrase of the message)
    "misaligned offset": (
        setter(b_tensor, offset=8),
        f"{D0}.BTensor.offset",
        "offset_alignment",
        "not a multiple of 16",
    ),
    "offset below a larger alignment": (
        lambda h: (b_tensor(h).update(offset=48), b_tensor(h)["desc"].update(alignment=32)),
        f"{D0}.BTensor.offset",
        "offset_alignment",
        "not a multiple of 32",
    ),
    "alignment not a power of two": (
        desc_setter(a_tensor, alignment=24),
        f"{D0}.ATensor.desc.alignment",
        "alignment",
        "power of two",
    ),
    "range past the end": (
        setter(b_tensor, offset=80),
        f"{D0}.BTensor.offset",
        "buffer_bounds",
        "reaches past the end of buffer 'in'",
    ),
    "offset of 2^64 - 16": (
        setter(b_tensor, offset=2**64 - 16),
        f"{D0}.BTensor.offset",
        "buffer_bounds",
        "past the end",
    ),
    # Past what a 64-bit field holds: refused by the schema, before any arithmetic.
    "offset of 2^64": (
        setter(b_tensor, offset=2**64),
        f"{D0}.BTensor.offset",
        "less_than_equal",
        "less than or equal to 18446744073709551615",
    ),
    "negative offset": (
        setter(b_tensor, offset=-16),
        f"{D0}.BTensor.offset",
        "offset_alignment",
        "non-negative",
    ),
    "total size below the implied minimum": (
        desc_setter(a_tensor, total_size=60),
        f"{D0}.ATensor.desc.total_size",
        "total_size",
        "below the minimum implied size 64",
    ),
    "total size of 2^64": (
        desc_setter(a_tensor, total_size=2**64),
        f"{D0}.ATensor.desc.total_size",
        "less_than_equal",
        "less than or equal to 18446744073709551615",
    ),
    "stride of 2^64": (
        desc_setter(b_tensor, strides=[2**64, 1]),
        f"{D0}.BTensor.desc.strides[0]",
        "less_than_equal",
        "less than or equal to 18446744073709551615",
    ),
    "stride of 2^32": (
        desc_setter(b_tensor, strides=[2**32, 1]),
        f"{D0}.BTensor.desc.strides",
        "strides",
        "Strides[0] = 4294967296",
    ),
    "negative stride": (
        desc_setter(b_tensor, strides=[4, -1]),
        f"{D0}.BTensor.desc.strides",
        "strides",
        "Strides[1] = -1",
    ),
    "strides reaching past the buffer": (
        desc_setter(b_tensor, strides=[2**31, 1]),
        f"{D0}.BTensor.offset",
        "buffer_bounds",
        "past the end",
    ),
    "size of 2^32": (
        desc_setter(a_tensor, sizes=[2**32, 1]),
        f"{D0}.ATensor.desc.sizes",
        "size",
        "Sizes[0] = 4294967296",
    ),
    "zero size": (
        desc_setter(a_tensor, sizes=[0, 4]),
        f"{D0}.ATensor.desc.sizes",
        "size",
        "Sizes[0] = 0",
    ),
    "nine dimensions": (
        desc_setter(a_tensor, sizes=[1] * 9),
        f"{D0}.ATensor.desc.sizes",
        "rank",
        "9 dimensions",
    ),
    "strides and sizes of different ranks": (
        desc_setter(a_tensor, strides=[1]),
        f"{D0}.ATensor.desc.strides",
        "strides",
        "1 strides for 2 sizes",
    ),
    "binding size below the total size": (
        setter(a_tensor, size=32),
        f"{D0}.ATensor.size",
        "binding_size",
        "less than the desc's TotalTensorSizeInBytes 64",
    ),
    "binding size past the end": (
        setter(b_tensor, size=80),
        f"{D0}.BTensor.size",
        "buffer_bounds",
        "[64, 144)",
    ),
    "stride-0 output": (
        desc_setter(output, strides=[0, 1]),
        f"{D0}.OutputTensor.desc.strides",
        "output_overlap",
        "more than one output element",
    ),
    "interleaved output strides": (
        desc_setter(output, strides=[2, 1]),
        f"{D0}.OutputTensor.desc.strides",
        "output_overlap",
        "Strides [2, 1]",
    ),
    "output partly over an input": (
        lambda h: output(h).update(buffer="in", offset=32),
        f"{D0}.OutputTensor",
        "output_aliasing",
        "[32, 96) of buffer 'in' overlaps ATensor's bound range [0, 64)",
    ),
    "in-place output with another desc": (
        lambda h: output(h).update(
            buffer="in",
            desc={"datatype": "UINT32", "sizes": [4, 4], "strides": [4, 1], "total_size": 64 + 16},
            size=80,
        ),
        f"{D0}.OutputTensor",
        "output_aliasing",
        "same buffer, offset, size and desc",
    ),
    "missing buffer reference": (
        setter(b_tensor, buffer="nowhere"),
        f"{D0}.BTensor.buffer",
        "unknown_buffer",
        "no buffer named 'nowhere' (declared: in, out)",
    ),
    "unknown operator": (
        lambda h: h["dispatches"][1].update(operator="DML_OPERATOR_ELEMENT_WISE_BIT_NAND"),
        "dispatches[1].operator",
        "unknown_operator",
        "unknown model or operator 'DML_OPERATOR_ELEMENT_WISE_BIT_NAND'",
    ),
    "unknown binding name": (
        lambda h: h["dispatches"][0]["bindings"].update(CTensor=bind("in", "UINT32", [4, 4])),
        f"{D0}.CTensor",
        "unknown_binding",
        "has no tensor of that name (tensors: ATensor, BTensor, OutputTensor)",
    ),
    "missing binding": (
        lambda h: h["dispatches"][0]["bindings"].pop("BTensor"),
        f"{D0}.BTensor",
        "missing_binding",
        "missing binding",
    ),
    "data type not at this feature level": (
        lambda h: (
            h["dispatches"][0].update(parameters={"feature_level": "3_0"}),
            [b["desc"].update(datatype="INT32") for b in h["dispatches"][0]["bindings"].values()],
        ),
        f"{D0}.ATensor.desc.datatype",
        "datatype",
        "INT32 is not supported by DML_OPERATOR_ELEMENT_WISE_BIT_XOR at feature level 3_0 "
        "(allowed: UINT8, UINT16, UINT32)",
    ),
    "operator before its feature level": (
        lambda h: h["dispatches"][0].update(parameters={"feature_level": "2_1"}),
        "dispatches[0].parameters.feature_level",
        "feature_level",
        "does not exist at feature level 2_1",
    ),
    "unknown parameter": (
        lambda h: h["dispatches"][0].update(parameters={"axis": 1}),
        "dispatches[0].parameters.axis",
        "unknown_parameter",
        "unknown parameter",
    ),
    "different sizes (DML never broadcasts)": (
        desc_setter(b_tensor, sizes=[1, 4]),
        f"{D0}.BTensor.desc.sizes",
        "shape",
        "requires identical Sizes",
    ),
    "mixed data types": (
        desc_setter(b_tensor, datatype="INT32"),
        f"{D0}.BTensor.desc.datatype",
        "mixed_datatype",
        "differs from ATensor's UINT32",
    ),
    "output data type": (
        desc_setter(output, datatype="INT32"),
        f"{D0}.OutputTensor.desc.datatype",
        "output_datatype",
        "(allowed: UINT32)",
    ),
    "output sizes": (
        desc_setter(output, sizes=[2, 8]),
        f"{D0}.OutputTensor.desc.sizes",
        "output_shape",
        "(allowed: [4, 4])",
    ),
    "unknown data type": (
        desc_setter(a_tensor, datatype="UINT128"),
        f"{D0}.ATensor.desc.datatype",
        "literal_error",
        "Input should be",
    ),
    "string for an integer": (
        setter(a_tensor, offset="0"),
        f"{D0}.ATensor.offset",
        "int_type",
        "valid integer",
    ),
    "misspelt field": (
        desc_setter(a_tensor, stride=[4, 1]),
        f"{D0}.ATensor.desc.stride",
        "extra_forbidden",
        "Extra inputs are not permitted",
    ),
    "duplicate buffer name": (
        lambda h: h["buffers"].append({"name": "in", "byte_size": 4, "init": "zeros"}),
        "buffers[2].name",
        "duplicate_buffer",
        "duplicate buffer name 'in' (first declared at buffers[0])",
    ),
    "init other than zeros": (
        lambda h: h["buffers"][1].update(init="ones"),
        "buffers[1].init",
        "literal_error",
        "'zeros'",
    ),
    "unknown output": (
        lambda h: h["outputs"].append("tmp"),
        "outputs[1]",
        "unknown_buffer",
        "no buffer named 'tmp'",
    ),
    "output listed twice": (
        lambda h: h["outputs"].append("out"),
        "outputs[1]",
        "duplicate_output",
        "already listed at outputs[0]",
    ),
}


@pytest.mark.parametrize("case", CASES, ids=str)
def test_refused(client: TestClient, case: str) -> None:
    mutate, field, rule, phrase = CASES[case]
    header, payload = valid()
    mutate(header)
    body = error(post(client, header, payload))
    assert body["field"] == field
    assert body["rule"] == rule
    assert body["error"].startswith(f"{field}: ")
    assert phrase in body["error"]


def test_the_valid_batch_is_valid(client: TestClient) -> None:
    header, payload = valid()
    assert post(client, header, payload).status_code == 200


def test_in_place_is_refused_where_the_operator_has_none(client: TestClient) -> None:
    # BIT_COUNT lists no in-place input: even an identical binding is an overlap.
    same = bind("x", "UINT8", [16])
    header, payload = batch(
        [data("x", bytes(16))], [dispatch("BIT_COUNT", InputTensor=same, OutputTensor=same)], ["x"]
    )
    body = error(post(client, header, payload))
    assert body["rule"] == "output_aliasing"
    assert "computes nothing in place" in body["error"]


# --- framing ------------------------------------------------------------------------------------
def test_short_body(client: TestClient) -> None:
    header, payload = valid()
    body, headers = framed(header, payload[:-4])
    reply = error(client.post("/v1/batch", content=body, headers=headers))
    assert reply["field"] == "buffers[0].byte_size"
    assert reply["error"] == (
        "buffers[0].byte_size: unexpected size for buffer 'in', expecting 128 additional bytes "
        "but the body has 124 left"
    )


def test_leftover_body(client: TestClient) -> None:
    header, payload = valid()
    body, headers = framed(header, payload + b"extra")
    reply = error(client.post("/v1/batch", content=body, headers=headers))
    assert reply["field"] == "body"
    assert "unexpected additional input data: 5 bytes" in reply["error"]


def test_data_without_the_framing_header_is_leftover(client: TestClient) -> None:
    header, _ = valid()
    reply = error(client.post("/v1/batch", json=header))
    assert reply["field"] == "buffers[0].byte_size"
    assert "expecting 128 additional bytes but the body has 0 left" in reply["error"]


@pytest.mark.parametrize(
    ("value", "phrase"),
    [("abc", "Unable to parse"), ("-1", "Unable to parse"), ("99999", "should be in range (0, ")],
)
def test_bad_header_length(client: TestClient, value: str, phrase: str) -> None:
    header, payload = valid()
    body, _ = framed(header, payload)
    reply = error(client.post("/v1/batch", content=body, headers={HEADER: value}))
    assert reply["field"] == HEADER
    assert phrase in reply["error"]


@pytest.mark.parametrize(
    ("header", "field", "phrase"),
    [
        # The JSON reader and policy of v2 (tests/api/test_json_policy.py holds both APIs).
        (b"{not json", "header", "malformed JSON"),
        (b"[" * 5000 + b"]" * 5000, "header", "nesting depth 5000 exceeds the limit"),
        (b"[" * 9000 + b"]" * 9000, "header", "nesting depth 9000 exceeds the limit"),
        (b'{"buffers": [], "dispatches": []}', "outputs", "Field required"),
        (b'{"buffers": [], "dispatches": [], "outputs": [], "id": 7}', "id", "valid string"),
    ],
)
def test_malformed_header(client: TestClient, header: bytes, field: str, phrase: str) -> None:
    reply = error(client.post("/v1/batch", content=header, headers={HEADER: str(len(header))}))
    assert reply["field"] == field
    assert phrase in reply["error"]


# --- limits -------------------------------------------------------------------------------------
def test_too_many_dispatches() -> None:
    with v1_client(max_dispatches=1) as c:
        header, payload = valid()
        reply = error(post(c, header, payload), 413)
    assert reply["field"] == "dispatches"
    assert "2 dispatches listed, more than the limit of 1" in reply["error"]


def test_too_many_buffers() -> None:
    with v1_client(max_buffers=1) as c:
        header, payload = valid()
        reply = error(post(c, header, payload), 413)
    assert reply["field"] == "buffers"
    assert reply["rule"] == "max_buffers"


def test_zero_filled_buffers_are_bounded() -> None:
    with v1_client(max_body_bytes=4096, max_inflight_bytes=1 << 20) as c:
        header, payload = valid()
        header["buffers"].append(zeros("huge", 1 << 40))
        reply = error(post(c, header, payload), 413)
    assert reply["rule"] == "max_temporary_bytes"


def test_tensor_elements_are_bounded() -> None:
    with v1_client(max_tensor_elements=15) as c:
        header, payload = valid()
        reply = error(post(c, header, payload), 413)
    assert reply["field"] == f"{D0}.ATensor.desc.sizes"
    assert reply["rule"] == "max_tensor_elements"


def test_body_over_the_limit() -> None:
    with v1_client(max_body_bytes=1024, max_inflight_bytes=1 << 20) as c:
        header, _ = batch([data("big", bytes(2048))], [], ["big"])
        reply = error(post(c, header, bytes(2048)), 413)
    assert reply["rule"] == "max_body_bytes"


def test_a_batch_that_could_never_be_admitted_is_413() -> None:
    # 600 KiB of body plus 600 KiB of output cannot fit 1 MiB in flight even on an idle server.
    with v1_client(max_body_bytes=1 << 20, max_inflight_bytes=1 << 20) as c:
        header, payload = batch([data("a", bytes(600 * 1024))], [], ["a"])
        reply = error(post(c, header, payload), 413)
    assert reply["rule"] == "max_inflight_bytes"


def test_a_busy_server_answers_503_with_retry_after(client: TestClient) -> None:
    admission = client.app.state.runtime.plane.admission  # type: ignore[attr-defined]
    admission.bytes_in_flight = admission.max_bytes
    try:
        header, payload = valid()
        response = post(client, header, payload)
    finally:
        admission.bytes_in_flight = 0
    error(response, 503)
    assert response.headers["Retry-After"] == "1"
