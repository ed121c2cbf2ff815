"""The /v1 planner's and executor's shortcuts against the long way round: packed views against
``as_strided``, checks remembered within a batch against checks made every time, the dict reader
of the header against the wire models."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from pydantic import TypeAdapter, ValidationError
from support.framing import framed
from support.inprocess import IDENTITY, TestClient
from support.v1 import (
    batch,
    bind,
    data,
    dispatch,
    error,
    outputs,
    post,
    rich_batch,
    run_planned,
    v1_client,
    zeros,
)

from tensorbits.api import routers, v1
from tensorbits.api.fastpath import FastPathMiddleware
from tensorbits.config.settings import Settings
from tensorbits.core import batch as planner
from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.server.app import create_app
from tensorbits_protocol import v1_codec
from tensorbits_protocol.dml import TensorDesc, check_placement, is_packed, layout_of
from tensorbits_protocol.dtypes import DataType
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.v1 import BatchRequest
from tensorbits_protocol.v1_codec import BATCH_REQUEST_DATA

RNG = np.random.default_rng(7)
# Starlette types Middleware.cls as a factory protocol, which mypy does not match to a class:
# compared as the objects they are.
FAST_PATH: object = FastPathMiddleware
SETTINGS = Settings(backend="numpy")
BATCH_LIMITS = planner.BatchLimits.of(SETTINGS.core_limits)
LIMITS = BATCH_LIMITS.header


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with v1_client() as c:
        yield c


# --- packed views against as_strided --------------------------------------------------------------
@pytest.mark.parametrize(
    ("sizes", "strides", "packed"),
    [
        ((16,), None, True),
        ((2, 3, 4), None, True),
        ((2, 3, 4), (12, 4, 1), True),
        ((2, 1, 8), (8, 999, 1), True),  # a dimension of size 1 never uses its stride
        ((1, 1), (0, 0), True),
        ((4, 1), (1, 0), True),
        ((3, 4), (8, 1), False),  # padded rows
        ((4, 4), (1, 4), False),  # transposed
        ((4, 16), (0, 1), False),  # broadcast rows
        ((4,), (2,), False),
    ],
)
def test_packed_means_a_plain_slice(
    sizes: tuple[int, ...], strides: tuple[int, ...] | None, packed: bool
) -> None:
    layout = layout_of("ATensor", TensorDesc(DataType.UINT16, sizes, strides))
    assert layout.packed is packed
    assert is_packed(layout.shape, layout.byte_strides, 2) is packed
    if packed:
        # What NumPy itself calls C-contiguous for the same shape and byte strides.
        view = np.lib.stride_tricks.as_strided(
            np.zeros(64, np.uint16), shape=layout.shape, strides=layout.byte_strides
        )
        assert view.flags.c_contiguous


def test_describe_lays_a_description_out_for_any_offset() -> None:
    desc = TensorDesc(DataType.FP32, (2, 3), (4, 1), total_size=32, alignment=32)
    layout = layout_of("ATensor", desc)
    assert (layout.shape, layout.byte_strides, layout.total_size) == ((2, 3), (16, 4), 32)
    assert (layout.alignment, layout.itemsize, layout.elements, layout.packed) == (32, 4, 6, False)
    check_placement("ATensor", layout, 64, 128)  # placed at a multiple of its alignment, inside


def test_packed_views_equal_strided_views(monkeypatch: pytest.MonkeyPatch) -> None:
    header, payload = rich_batch(RNG)
    body, headers = framed(header, payload, binary=True)
    plan = planner.plan_rest(
        bytearray(body), int(headers["Inference-Header-Content-Length"]), BATCH_LIMITS
    )
    tensors = [t for d in plan.dispatches for t in (*d.inputs, d.output)]
    assert sum(t.desc.packed for t in tensors) >= 14  # both paths are exercised
    assert sum(not t.desc.packed for t in tensors) >= 6

    fast = run_planned(header, payload, NumpyBackend(1))
    monkeypatch.setattr(planner._Views, "of", planner._Views.strided)
    strided = run_planned(header, payload, NumpyBackend(1))
    assert fast == strided


def test_rich_batch_over_http_matches_numpy(client: TestClient) -> None:
    header, payload = rich_batch(RNG)
    _, got = outputs(post(client, header, payload))
    a = np.frombuffer(payload[:512], np.uint8)
    b = np.frombuffer(payload[512:1024], np.uint8)
    z = np.frombuffer(got["z"], np.uint8)
    first = a[16:80].view(np.uint32) ^ b[32:96].view(np.uint32)
    shift = b[480:484].view(np.uint32)[0]
    np.testing.assert_array_equal(z[:64].view(np.uint32), first << shift)
    np.testing.assert_array_equal(z[64:96].view(np.uint16), ~a[256:288].view(np.uint16))
    np.testing.assert_array_equal(
        np.frombuffer(got["a"], np.uint64)[16:24],
        a[128:192].view(np.uint64) | b[128:192].view(np.uint64),
    )
    rows = a[384:448].reshape(4, 16) ^ b[448:464]
    np.testing.assert_array_equal(z[256:320].reshape(4, 16), rows)


# --- checks remembered within a batch ----------------------------------------------------------------
def _xor(offset: int, buffer_bytes: int = 128) -> tuple[dict[str, Any], bytes]:
    """Two identical XORs, the second with its A tensor at ``offset``."""
    x = np.zeros(buffer_bytes, np.uint8)
    return batch(
        [data("x", x), zeros("y", 64)],
        [
            dispatch(
                "BIT_XOR",
                ATensor=bind("x", "UINT32", [4], offset=off),
                BTensor=bind("x", "UINT32", [4]),
                OutputTensor=bind("y", "UINT32", [4], offset=16 * i),
            )
            for i, off in enumerate((0, offset))
        ],
        ["y"],
    )


@pytest.mark.parametrize(
    ("offset", "rule", "phrase"),
    [
        (8, "offset_alignment", "byte offset 8 into buffer 'x' is not a multiple of 16"),
        (128, "buffer_bounds", "bound range [128, 144) reaches past the end of buffer 'x'"),
    ],
)
def test_a_repeated_description_is_still_placed_each_time(
    client: TestClient, offset: int, rule: str, phrase: str
) -> None:
    body = error(post(client, *_xor(offset)))
    assert body["field"] == "dispatches[1].bindings.ATensor.offset"
    assert body["rule"] == rule
    assert phrase in body["error"]


def test_remembered_calls_tell_parameter_types_apart(client: TestClient) -> None:
    # axis 0 passes; false compares equal to 0 but is not an integer.
    def shift(i: int, axis: object) -> dict[str, Any]:
        return dispatch(
            "openvino.BitwiseAnd-13",
            {"auto_broadcast": "pdpd", "axis": axis},
            input_1=bind("x", "UINT8", [4, 16]),
            input_2=bind("x", "UINT8", [4], offset=64),
            output_1=bind("y", "UINT8", [4, 16], offset=64 * i),
        )

    header, payload = batch(
        [data("x", np.arange(80, dtype=np.uint8)), zeros("y", 128)],
        [shift(0, 0), shift(1, False)],
        ["y"],
    )
    body = error(post(client, header, payload))
    assert body["field"] == "dispatches[1].parameters.axis"
    assert body["rule"] == "parameter_type"


def test_in_place_compares_descriptions_after_normalisation(client: TestClient) -> None:
    bits = np.array([1, 2, 3, 4], np.uint32)
    # FP32 / FLOAT32 and absent / explicit packed strides: the same binding, so in place is fine.
    a = bind("x", "FP32", [2, 2])
    out = bind("x", "FLOAT32", [2, 2], strides=[2, 1])
    header, payload = batch(
        [data("x", bits)], [dispatch("BIT_NOT", InputTensor=a, OutputTensor=out)], ["x"]
    )
    _, got = outputs(post(client, header, payload))
    np.testing.assert_array_equal(np.frombuffer(got["x"], np.uint32), ~bits)
    # Same range, but a TotalTensorSizeInBytes that differs makes it another binding: refused.
    given = bind("x", "FP32", [2, 2], total_size=32, size=32)
    implied = bind("x", "FP32", [2, 2], size=32)
    header, payload = batch(
        [data("x", np.arange(8, dtype=np.uint32))],
        [dispatch("BIT_NOT", InputTensor=implied, OutputTensor=given)],
        ["x"],
    )
    assert error(post(client, header, payload))["rule"] == "output_aliasing"


# --- the dict reader against the wire models ---------------------------------------------------
def _normalised(schema: Any) -> Any:
    """A JSON Schema without its names and prose: the definitions' names lose ``Data``."""
    if isinstance(schema, dict):
        return {
            k.removesuffix("Data"): _normalised(v)
            for k, v in schema.items()
            if k not in ("title", "description", "examples")
        }
    if isinstance(schema, list):
        return [_normalised(v) for v in schema]
    if isinstance(schema, str) and schema.startswith("#/$defs/"):
        return schema.removesuffix("Data")
    return schema


def test_the_dict_reader_has_the_models_schema() -> None:
    assert _normalised(BATCH_REQUEST_DATA.json_schema()) == _normalised(
        BatchRequest.model_json_schema()
    )


VALID_BINDING = {"buffer": "a", "desc": {"datatype": "UINT8", "sizes": [4]}}
HEADERS = [
    {"buffers": [], "dispatches": [], "outputs": []},
    {
        "id": "x",
        "buffers": [{"name": "a", "byte_size": 4, "init": None}],
        "dispatches": [{"operator": "X", "bindings": {"A": VALID_BINDING}}],
        "outputs": ["a"],
    },
    {
        "id": None,
        "buffers": [{"name": "a", "byte_size": 4, "init": "zeros"}],
        "dispatches": [
            {
                "operator": "X",
                "parameters": {"s": "t", "i": 2**64 - 1, "f": 1.5, "b": True},
                "bindings": {
                    "A": {
                        "buffer": "a",
                        "offset": 16,
                        "size": None,
                        "desc": {
                            "datatype": "FLOAT16",
                            "sizes": [2, 2],
                            "strides": None,
                            "total_size": None,
                            "alignment": 0,
                        },
                    },
                    "B": {**VALID_BINDING, "size": 8},
                },
            }
        ],
        "outputs": [],
    },
]
BAD_HEADERS = [
    {"buffers": [], "dispatches": []},
    {"buffers": [], "dispatches": [], "outputs": [], "extra": 1},
    {"buffers": [{"name": "a", "byte_size": "4"}], "dispatches": [], "outputs": []},
    {"buffers": [{"name": "a", "byte_size": 4.0}], "dispatches": [], "outputs": []},
    {"buffers": [{"name": "a", "byte_size": True}], "dispatches": [], "outputs": []},
    {"buffers": [{"name": "a", "byte_size": -1}], "dispatches": [], "outputs": []},
    {"buffers": [{"name": "", "byte_size": 1}], "dispatches": [], "outputs": []},
    {"buffers": [{"name": "a" * 129, "byte_size": 1}], "dispatches": [], "outputs": []},
    {"buffers": [{"name": "a", "byte_size": 1, "init": "ones"}], "dispatches": [], "outputs": []},
    {"id": "x" * 257, "buffers": [], "dispatches": [], "outputs": []},
    {"buffers": [], "dispatches": [{"operator": "", "bindings": {}}], "outputs": []},
    {"buffers": [], "dispatches": [{"operator": "X"}], "outputs": []},
    {"buffers": [], "dispatches": [{"operator": "X", "bindings": {}, "parameters": None}]},
    {"buffers": [], "dispatches": [{"operator": "X", "bindings": {"A": {}}}], "outputs": []},
    *(
        {
            "buffers": [],
            "dispatches": [{"operator": "X", "bindings": {"A": {**VALID_BINDING, **change}}}],
            "outputs": [],
        }
        for change in (
            {"offset": None},
            {"offset": 1.0},
            {"stride": [1]},
            {"desc": {"datatype": "uint8", "sizes": [4]}},
            {"desc": {"datatype": "UINT8", "sizes": [4.0]}},
            {"desc": {"datatype": "UINT8", "sizes": [4], "strides": [True]}},
            {"desc": {"datatype": "UINT8", "sizes": [4], "alignment": None}},
            {"desc": {"datatype": "UINT8"}},
        )
    ),
    {"buffers": [], "dispatches": [{"operator": "X", "bindings": {}, "parameters": {"p": []}}]},
    {"buffers": [], "dispatches": [{"operator": "X", "bindings": {}, "parameters": {"": 1}}]},
]


@pytest.mark.parametrize("header", HEADERS)
def test_the_dict_reader_reads_what_the_models_read(header: dict[str, Any]) -> None:
    raw = json.dumps(header).encode()
    assert (
        BATCH_REQUEST_DATA.validate_json(raw) == BatchRequest.model_validate_json(raw).model_dump()
    )


@pytest.mark.parametrize("header", BAD_HEADERS)
def test_the_dict_reader_refuses_what_the_models_refuse(header: dict[str, Any]) -> None:
    raw = json.dumps(header).encode()
    with pytest.raises(ValidationError):
        BatchRequest.model_validate_json(raw)
    with pytest.raises(ValidationError):
        BATCH_REQUEST_DATA.validate_json(raw)


def test_what_the_dict_reader_refuses_is_read_by_the_models(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Were the two ever to differ, the models decide: a refusal by the fast reader alone is not
    # an error, and the models' error is the one reported.
    raw = json.dumps(HEADERS[2]).encode()
    expected = v1_codec.decode_request(raw, LIMITS)
    monkeypatch.setattr(v1_codec, "BATCH_REQUEST_DATA", TypeAdapter(int))
    assert v1_codec.decode_request(raw, LIMITS) == expected
    with pytest.raises(InvalidRequest) as info:
        v1_codec.decode_request(json.dumps(BAD_HEADERS[2]).encode(), LIMITS)
    assert info.value.field == "buffers[0].byte_size"
    assert info.value.rule == "int_type"


# --- the batch ahead of the framework -------------------------------------------------------------
@pytest.fixture
def framework_client() -> Iterator[TestClient]:
    """The app without the layer that serves ``routers.FAST_ROUTES`` ahead of FastAPI: the
    framework's router serves the same routes (``fastpath.install`` lists them there too)."""
    app = create_app(Settings(backend="numpy", cpu_threads=2))
    app.user_middleware[:] = [m for m in app.user_middleware if m.cls is not FAST_PATH]
    with TestClient(app, headers=IDENTITY) as c:
        yield c


def test_the_route_ahead_of_the_framework_answers_as_the_fastapi_route(
    framework_client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert any(route in routers.FAST_ROUTES for route in v1.ROUTES)
    client = framework_client
    served = []
    endpoint = v1.BatchEndpoint.__call__

    async def counted(self: v1.BatchEndpoint, scope: Any, receive: Any, send: Any) -> None:
        served.append((scope["path"], "router" in scope))  # FastAPI's router marks the scope
        await endpoint(self, scope, receive, send)

    monkeypatch.setattr(v1.BatchEndpoint, "__call__", counted)
    header, payload = rich_batch(RNG)
    unknown = json.loads(json.dumps(header))
    unknown["dispatches"][3]["operator"] = "DML_OPERATOR_NOPE"
    cases = [
        (header, payload),
        (unknown, payload),  # 400 from the planner
        (header, payload[:-1]),  # 400 from the body's framing
        ({**header, "stray": 1}, payload),  # 400 from the models
    ]
    with v1_client() as fast_client:
        _same_answers(client, fast_client, cases)
        metrics = fast_client.get("/metrics").text
    # The one endpoint answered both: behind the framework's router, then ahead of it.
    assert served == [("/v1/batch", True), ("/v1/batch", False)] * len(cases)
    assert 'route="/v1/batch"' in metrics


def _same_answers(
    client: TestClient, fast_client: TestClient, cases: list[tuple[dict[str, Any], bytes]]
) -> None:
    for case in cases:
        slow, fast = post(client, *case), post(fast_client, *case)
        assert (fast.status_code, fast.content) == (slow.status_code, slow.content)
        assert {k: v for k, v in fast.headers.items() if k != "x-request-id"} == {
            k: v for k, v in slow.headers.items() if k != "x-request-id"
        }


RAW_HEADERS = [
    b'{"buffers":[],"dispatches":[],"outputs":[],"outputs":["x"]}',  # the last key wins
    b'{"buffers":[{"name":"a","byte_size":4,"byte_size":8}],"dispatches":[],"outputs":[]}',
    b'{"buffers":[],"dispatches":[{"operator":"X","parameters":{"f":Infinity},"bindings":{}}],'
    b'"outputs":[]}',
    b'{"buffers":[{"name":"a","byte_size":1e2}],"dispatches":[],"outputs":[]}',
    b'{"buffers":[{"name":"a","byte_size":-0}],"dispatches":[],"outputs":[]}',
    b'{"buffers":[{"name":"\\u00e9\\ud83d\\ude00","byte_size":1}],"dispatches":[],"outputs":[]}',
    b'{"buffers":[{"name":"\\ud800","byte_size":1}],"dispatches":[],"outputs":[]}',
    b'{"buffers":[{"name":"a","byte_size":100000000000000000000000000}],"dispatches":[],'
    b'"outputs":[]}',
    b'  {"buffers":[],"dispatches":[],"outputs":[]}   ',
    b'{"buffers":[],"dispatches":[],"outputs":[]} x',
    b"[]",
    b"",
    b"null",
]


@pytest.mark.parametrize("raw", RAW_HEADERS)
def test_the_dict_reader_agrees_with_the_models_on_raw_json(raw: bytes) -> None:
    try:
        expected: Any = BatchRequest.model_validate_json(raw).model_dump()
    except ValidationError:
        expected = ValidationError
    try:
        got: Any = BATCH_REQUEST_DATA.validate_json(raw)
    except ValidationError:
        got = ValidationError
    assert got == expected
