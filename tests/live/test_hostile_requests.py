"""Hostile request bodies against the live server: oversized integers in every integer field of
both APIs, and counts past every limit, as classes of cases.

Each case checks the status, the JSON body naming the field and the rule, that the server still
answers and that another client was served meanwhile; the count cases also check that the
server's peak memory grew by no more than a small multiple of the request's own size (a refused
request costs in proportion to the limit, not to what was sent)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from support.live import LiveServer, serve
from support.rawhttp import Reply, assert_json_error, one_reply, repeatedly, request

MiB = 1 << 20
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
AND = "openvino.BitwiseAnd-13"
BIG = "__BIG__"  # where an integer too long for json.dumps goes, written as raw text


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with serve({"TENSORBITS_MAX_BATCH_HEADER_BYTES": str(16 * MiB)}) as live:
        yield live


def _post(path: str, header: dict[str, Any], big: str = "", payload: bytes = b"") -> bytes:
    text = json.dumps(header).replace(f'"{BIG}"', big).encode()
    headers = {"Inference-Header-Content-Length": str(len(text)), "Connection": "close"}
    return request("POST", path, headers, text + payload)


# --- 2. integers past what their field's format holds ------------------------------------------
HUGE = {
    "2^64": str(2**64),
    "2^64+1": str(2**64 + 1),
    "-2^63-1": str(-(2**63) - 1),
    "-2^64": str(-(2**64)),
    "30 digits": "9" * 30,
    "4300 digits": "9" * 4300,
    "4301 digits": "9" * 4301,
    "20000 digits": "9" * 20000,
    "-20000 digits": "-" + "9" * 20000,
}
every_huge_value = pytest.mark.parametrize("value", HUGE.values(), ids=list(HUGE))


def _batch(op: str = NOT) -> dict[str, Any]:
    inputs = ["InputTensor"] if op == NOT else ["input_1", "input_2"]
    output = "OutputTensor" if op == NOT else "output_1"
    bindings = {
        name: {
            "buffer": "in",
            "offset": 0,
            "size": 16,
            "desc": {"datatype": "UINT8", "sizes": [16]},
        }
        for name in inputs
    }
    bindings[output] = {"buffer": "out", "desc": {"datatype": "UINT8", "sizes": [16]}}
    return {
        "buffers": [
            {"name": "in", "byte_size": 16},
            {"name": "out", "byte_size": 16, "init": "zeros"},
        ],
        "dispatches": [{"operator": op, "parameters": {}, "bindings": bindings}],
        "outputs": ["out"],
    }


def _v1_field(path: tuple[str | int, ...], op: str = NOT) -> dict[str, Any]:
    header = _batch(op)
    node: Any = header
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = BIG
    return header


D0 = ("dispatches", 0)
V1_FIELDS = {
    "buffers[0].byte_size": ("buffers", 0, "byte_size"),
    "dispatches[0].bindings.InputTensor.offset": (*D0, "bindings", "InputTensor", "offset"),
    "dispatches[0].bindings.InputTensor.size": (*D0, "bindings", "InputTensor", "size"),
    "dispatches[0].bindings.InputTensor.desc.sizes[0]": (
        *D0, "bindings", "InputTensor", "desc", "sizes", 0,
    ),
    "dispatches[0].bindings.InputTensor.desc.strides": (
        *D0, "bindings", "InputTensor", "desc", "strides",
    ),
    "dispatches[0].bindings.InputTensor.desc.total_size": (
        *D0, "bindings", "InputTensor", "desc", "total_size",
    ),
    "dispatches[0].bindings.InputTensor.desc.alignment": (
        *D0, "bindings", "InputTensor", "desc", "alignment",
    ),
}  # fmt: skip


def _assert_refused_integer(reply: Reply, field: str, whole: str) -> None:
    """400 naming ``field`` (or, for a number no JSON reader takes, the document ``whole``),
    in a message of bounded length that never repeats the number."""
    assert reply.status == 400, (reply.status, reply.body[:300])
    body = reply.json()
    assert body["field"] in (field, whole), body
    assert len(body["error"]) < 400, body
    assert "9" * 41 not in body["error"]  # a number of over 40 digits is described, not written


@every_huge_value
@pytest.mark.parametrize(("field", "path"), V1_FIELDS.items(), ids=list(V1_FIELDS))
def test_v1_integer_fields_refuse_what_64_bits_cannot_hold(
    server: LiveServer, field: str, path: tuple[str | int, ...], value: str
) -> None:
    header = _v1_field(path)
    if field.endswith("strides"):
        header["dispatches"][0]["bindings"]["InputTensor"]["desc"]["strides"] = [BIG]
        field += "[0]"
    reply = one_reply(server, _post("/v1/batch", header, value, bytes(16)))
    _assert_refused_integer(reply, field, "header")


@every_huge_value
def test_v1_parameter_values_refuse_what_64_bits_cannot_hold(
    server: LiveServer, value: str
) -> None:
    header = _batch(AND)
    header["dispatches"][0]["parameters"] = {"axis": BIG}
    reply = one_reply(server, _post("/v1/batch", header, value, bytes(16)))
    assert reply.status == 400, reply
    assert reply.json()["field"] in ("dispatches[0].parameters.axis", "header"), reply.json()


def _infer(
    input_fields: dict[str, Any], request_fields: dict[str, Any] | None = None
) -> dict[str, Any]:
    tensor = {"name": "InputTensor", "shape": [4], "datatype": "UINT32", **input_fields}
    return {"inputs": [tensor], **(request_fields or {})}


V2_CASES = {
    "inputs[0].shape[0]": _infer({"shape": [BIG], "data": [1, 2, 3, 4]}),
    "inputs[0].parameters.binary_data_size": _infer({"parameters": {"binary_data_size": BIG}}),
    "parameters.feature_level": _infer(
        {"data": [1, 2, 3, 4]}, {"parameters": {"feature_level": BIG}}
    ),
    # An input parameter the server ignores (Triton's reserved prefix): still bounded.
    "inputs[0].parameters.triton_x": _infer(
        {"data": [1, 2, 3, 4], "parameters": {"triton_x": BIG}}
    ),
    "InputTensor": _infer({"data": [1, BIG, 3, 4]}),  # a data element: named by its tensor
}


@every_huge_value
@pytest.mark.parametrize(("field", "header"), V2_CASES.items(), ids=list(V2_CASES))
def test_v2_integer_fields_refuse_what_their_format_cannot_hold(
    server: LiveServer, field: str, header: dict[str, Any], value: str
) -> None:
    text = json.dumps(header).replace(f'"{BIG}"', value).encode()
    data = request("POST", f"/v2/models/{NOT}/infer", {"Connection": "close"}, text)
    reply = one_reply(server, data)
    _assert_refused_integer(reply, field, "request body")


def test_integer_cases_leave_other_clients_served(server: LiveServer) -> None:
    data = _post("/v1/batch", _v1_field(V1_FIELDS["buffers[0].byte_size"]), "9" * 20000, bytes(16))
    for reply in repeatedly(server, lambda: one_reply(server, data)):
        assert reply.status == 400
    assert server.get("/v2/health/live") == 200


# --- 3. counts past each limit, refused before anything is built ------------------------------
def _dispatch() -> dict[str, Any]:
    dispatch: dict[str, Any] = _batch()["dispatches"][0]
    return dispatch


def _many(what: str, count: int) -> tuple[str, dict[str, Any]]:
    """A request listing ``count`` of ``what``: its path and header."""
    header = _batch()
    if what == "dispatches":
        # Small ones (the smallest that parse): 300,000 of them fit the header's byte limit.
        header["dispatches"] = [_dispatch()] + [{"operator": "x", "bindings": {}}] * (count - 1)
    elif what == "buffers":
        header["buffers"] = [{"name": f"b{i}", "byte_size": 0} for i in range(count)]
    elif what == "outputs":
        header["outputs"] = ["out"] * count
    elif what == "v2 inputs":
        return f"/v2/models/{NOT}/infer", {"inputs": [{}] * count}
    elif what == "v2 outputs":
        return f"/v2/models/{NOT}/infer", {"inputs": [], "outputs": [{"name": "o"}] * count}
    return "/v1/batch", header


# (what, count, field, rule): just past the limit, far past it, and 300,000 of them.
COUNT_CASES = [
    pytest.param(what, count, field, rule, id=f"{what}-{count}")
    for what, limit, field, rule in (
        ("dispatches", 4096, "dispatches", "max_dispatches"),
        ("buffers", 256, "buffers", "max_buffers"),
        ("outputs", 256, "outputs", "max_buffers"),
        ("v2 inputs", 64, "inputs", "max_tensors"),
        ("v2 outputs", 64, "inputs", "max_tensors"),
    )
    for count in (limit + 1, 10 * limit, 300_000)
]


@pytest.mark.parametrize(("what", "count", "field", "rule"), COUNT_CASES)
def test_counts_past_a_limit_are_refused_before_parsing(
    server: LiveServer, what: str, count: int, field: str, rule: str
) -> None:
    path, header = _many(what, count)
    data = _post(path, header)
    baseline = server.reset_peak_rss()
    (reply, *_) = repeatedly(server, lambda: one_reply(server, data), seconds=0.3)
    grown = server.peak_rss() - baseline
    body = assert_json_error(reply, 413, field, rule)
    assert body["code"] == "payload_too_large"
    # The body itself, a copy of its header and the scan's blocks: a few times the request, never
    # the hundreds of bytes per element that parsing would cost (300,000 dispatches as models
    # took about 800 MiB before the scan).
    assert grown < 4 * len(data) + 48 * MiB, (grown, len(data))
    assert server.get("/v2/health/live") == 200


def test_json_values_past_the_limit_are_refused(server: LiveServer) -> None:
    # 2^22 + 1 elements of JSON data: more values than TENSORBITS_MAX_JSON_ELEMENTS allows.
    count = (1 << 22) + 1
    text = b'{"inputs":[{"name":"InputTensor","shape":[%d],"datatype":"UINT8","data":[' % count
    text += b"1," * (count - 1) + b"1]}]}"
    data = request("POST", f"/v2/models/{NOT}/infer", {"Connection": "close"}, text)
    baseline = server.reset_peak_rss()
    (reply, *_) = repeatedly(server, lambda: one_reply(server, data), seconds=0.3)
    grown = server.peak_rss() - baseline
    # Within the values a JSON document may hold (the element limit plus an envelope), so read,
    # then refused by its tensor's element count.
    assert_json_error(reply, 413, "inputs", "max_json_elements")
    assert grown < 4 * len(data) + 48 * MiB, (grown, len(data))


def test_a_batch_header_past_its_byte_limit_is_refused_unread() -> None:
    with serve({"TENSORBITS_MAX_BATCH_HEADER_BYTES": str(MiB)}) as small:
        header = _batch()
        header["id"] = "x" * 200  # a valid header...
        text = json.dumps(header).encode() + b" " * (2 * MiB)  # ...padded past 1 MiB
        data = request(
            "POST",
            "/v1/batch",
            {"Inference-Header-Content-Length": str(len(text)), "Connection": "close"},
            text + bytes(16),
        )
        reply = one_reply(small, data)
        body = assert_json_error(reply, 413, "header", "max_header_bytes")
        assert "TENSORBITS_MAX_BATCH_HEADER_BYTES" in body["error"]
        assert small.get("/v2/health/live") == 200


@pytest.mark.parametrize("where", ["request", "input", "output"])
def test_a_flood_of_parameters_is_refused_before_parsing(server: LiveServer, where: str) -> None:
    # 1.5 million keys in one parameter map (about 18 MB): within the values a document may hold,
    # but a dict entry each once parsed (3 s and +500 MiB before the keys were counted on the
    # bytes); refused on the bytes with the other maps' room, as gRPC refuses it on the wire.
    count = 1_500_000
    flood = "{" + ",".join(f'"k{i}":1' for i in range(count)) + "}"
    tensor = '{"name":"InputTensor","shape":[1],"datatype":"UINT8","data":[1]'
    inputs = tensor + (f',"parameters":{flood}' if where == "input" else "") + "}"
    outputs = (
        f',"outputs":[{{"name":"OutputTensor","parameters":{flood}}}]' if where == "output" else ""
    )
    request_parameters = f',"parameters":{flood}' if where == "request" else ""
    text = f'{{"inputs":[{inputs}]{outputs}{request_parameters}}}'.encode()
    data = request("POST", f"/v2/models/{NOT}/infer", {"Connection": "close"}, text)
    baseline = server.reset_peak_rss()
    (reply, *_) = repeatedly(server, lambda: one_reply(server, data), seconds=0.3)
    grown = server.peak_rss() - baseline
    body = assert_json_error(reply, 413, "request body", "max_object_keys")
    assert "64 parameters per map" in body["error"]
    assert grown < 4 * len(data) + 48 * MiB, (grown, len(data))


def test_a_flood_of_dispatch_parameters_is_refused_before_parsing(server: LiveServer) -> None:
    # 400,000 keys in one /v1 dispatch's parameters (4.5 MB): within the header's values (106 a
    # dispatch), but parsed they took 0.83 s and +141 MiB; the one object's keys are counted on
    # the bytes, with v2's bound.
    header = _batch()
    header["dispatches"][0]["parameters"] = BIG
    flood = "{" + ",".join(f'"k{i}":1' for i in range(400_000)) + "}"
    data = _post("/v1/batch", header, flood, bytes(16))
    baseline = server.reset_peak_rss()
    (reply, *_) = repeatedly(server, lambda: one_reply(server, data), seconds=0.3)
    grown = server.peak_rss() - baseline
    assert_json_error(reply, 413, "header", "max_object_keys")
    assert grown < 4 * len(data) + 48 * MiB, (grown, len(data))
