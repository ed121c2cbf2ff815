"""Every way a v2 inference request can be wrong, and the exact status and message it gets.

Bad input is always a 4xx with a JSON ``{"error": ...}`` naming the input, field or header and
the rule; never a 500. A Hypothesis test mangles valid bodies to hold the server to that.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.framing import HEADER, framed
from support.inprocess import TestClient
from support.v2 import AND, NOT, binary_input, error_of, json_input, v2_client

from tensorbits.runtime import Runtime

X16 = np.arange(4, dtype=np.uint32)  # 16 bytes
GOOD_BINARY = {"inputs": [binary_input("InputTensor", X16)]}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with v2_client(max_body_bytes=1 << 20, max_tensors=4, max_json_elements=1000) as c:
        yield c


def post(
    client: TestClient, body: bytes, headers: dict[str, str] | None = None, model: str = NOT
) -> Any:
    return client.post(f"/v2/models/{model}/infer", content=body, headers=headers or {})


def runtime_of(client: TestClient) -> Runtime:
    runtime = client.app.state.runtime  # type: ignore[attr-defined]
    assert isinstance(runtime, Runtime)
    return runtime


# --- framing of the binary extension ---------------------------------------------------------------

FRAMING = [
    pytest.param(GOOD_BINARY, X16.tobytes(), "abc", "Unable to parse Inference-Header-Content-Length, got: 'abc'", id="header-not-a-number"),
    pytest.param(GOOD_BINARY, X16.tobytes(), "-1", "Unable to parse Inference-Header-Content-Length", id="header-negative"),
    pytest.param(GOOD_BINARY, X16.tobytes(), "1e2", "Unable to parse Inference-Header-Content-Length", id="header-float"),
    pytest.param(GOOD_BINARY, X16.tobytes(), "9" * 30, "Unable to parse Inference-Header-Content-Length", id="header-huge"),
    pytest.param(GOOD_BINARY, X16.tobytes(), "99999", "inference header size should be in range (0, ", id="header-past-body"),
    pytest.param(GOOD_BINARY, X16.tobytes(), "10", "malformed JSON", id="header-cuts-json"),
    pytest.param(GOOD_BINARY, X16.tobytes()[:-3], None, "unexpected size for input 'InputTensor', expecting 3 additional bytes for model 'DML_OPERATOR_ELEMENT_WISE_BIT_NOT'", id="short-input"),
    pytest.param(GOOD_BINARY, b"", None, "expecting 16 additional bytes", id="no-input-bytes"),
    pytest.param(GOOD_BINARY, X16.tobytes() + b"xx", None, "unexpected additional input data for model 'DML_OPERATOR_ELEMENT_WISE_BIT_NOT'", id="leftover-bytes"),
    pytest.param({"inputs": [json_input("InputTensor", X16)]}, b"\0", None, "unexpected additional input data", id="leftover-after-json-inputs"),
    pytest.param(
        {"inputs": [{**binary_input("InputTensor", X16), "parameters": {"binary_data_size": 12}}]},
        X16.tobytes()[:12], None,
        "input byte size mismatch for input 'InputTensor' for model 'DML_OPERATOR_ELEMENT_WISE_BIT_NOT'. Expected 16, got 12",
        id="size-not-shape-times-itemsize",
    ),
    pytest.param(
        {"inputs": [{**binary_input("InputTensor", X16), "data": [1, 2, 3, 4]}]},
        X16.tobytes(), None,
        "input 'InputTensor': Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But set 'data' 'binary_data_size'",
        id="data-and-binary",
    ),
    pytest.param(
        {"inputs": [{"name": "InputTensor", "shape": [4], "datatype": "UINT32"}]}, b"", None,
        "But no field is set", id="neither-data-nor-binary",
    ),
    pytest.param(
        {"inputs": [{"name": "InputTensor", "shape": [4], "datatype": "UINT32", "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16}}]},
        b"", None, "input 'InputTensor': Client shared memory is disabled on this server", id="shared-memory",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("header", "tail", "length", "words"), FRAMING)
def test_framing_errors(
    client: TestClient, header: dict[str, Any], tail: bytes, length: str | None, words: str
) -> None:
    body, headers = framed(header, tail)
    if length is not None:
        headers[HEADER] = length
    assert words in error_of(post(client, body, headers), 400)


def test_binary_input_without_the_header(client: TestClient) -> None:
    body, _ = framed(GOOD_BINARY, X16.tobytes())
    message = error_of(post(client, body), 400)
    # Without the header the whole body is JSON: here it is not.
    assert "malformed JSON" in message
    just_json = json.dumps(GOOD_BINARY).encode()
    message = error_of(post(client, just_json), 400)
    assert message == (
        "input 'InputTensor': must specify valid 'Inference-Header-Content-Length' in request "
        "header and 'binary_data_size' when passing inputs in binary data format"
    )


# --- the JSON document ---------------------------------------------------------------------------

JSON_ERRORS = [
    pytest.param(b"", "request body: malformed JSON: Expecting value at line 1 column 1", id="empty"),
    pytest.param(b'{"inputs": [', "malformed JSON", id="truncated"),
    pytest.param(b'{"inputs": []} x', "malformed JSON: Extra data", id="trailing-garbage"),
    pytest.param(b"\xff\xfe{}", "JSON must be UTF-8", id="not-utf8"),
    pytest.param(b'{"inputs": [], "inputs": []}', "duplicate key 'inputs' in a JSON object", id="duplicate-key"),
    pytest.param(b'{"id": 1' + b"0" * 5000 + b', "inputs": []}', "invalid JSON", id="int-too-long"),
    pytest.param(b"[" * 70 + b"]" * 70, "JSON nesting depth 70 exceeds the limit of 64", id="too-deep"),
    pytest.param(b"[]", "request body: Input should be a valid dictionary or instance of InferenceRequest", id="not-an-object"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "words"), JSON_ERRORS)
def test_json_errors(client: TestClient, body: bytes, words: str) -> None:
    assert words in error_of(post(client, body), 400)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_rfc8259_numbers_are_refused(client: TestClient, literal: str) -> None:
    body = '{"inputs": [{"name": "InputTensor", "shape": [1], "datatype": "FP32", "data": [%s]}]}'
    message = error_of(post(client, (body % literal).encode()), 400)
    assert f"{literal} is not a JSON value (RFC 8259 has no NaN or Infinity)" in message


def test_a_number_past_float64_is_out_of_range(client: TestClient) -> None:
    body = (
        b'{"inputs": [{"name": "InputTensor", "shape": [1], "datatype": "FP64", "data": [1e999]}]}'
    )
    assert "value inf is out of range for FP64" in error_of(post(client, body), 400)


def test_deep_nesting_cannot_blow_the_stack(client: TestClient) -> None:
    body = b"[" * 200_000 + b"]" * 200_000
    assert "nesting depth 200000 exceeds" in error_of(post(client, body), 400)


def test_brackets_inside_strings_are_not_nesting(client: TestClient) -> None:
    header = {"id": '[[[[[{{{{{\\"' * 20, "inputs": [json_input("InputTensor", X16)]}
    assert post(client, json.dumps(header).encode()).status_code == 200


def test_too_many_json_values_is_413_before_parsing(client: TestClient) -> None:
    body = b'{"inputs": [], "id": [' + b"0," * 100_000 + b"0]}"
    assert "JSON document has more than" in error_of(post(client, body), 413)


# --- the wire model (pydantic) ---------------------------------------------------------------------


def tensor(**changes: Any) -> dict[str, Any]:
    base = {"name": "InputTensor", "shape": [4], "datatype": "UINT32", "data": [1, 2, 3, 4]}
    return {k: v for k, v in {**base, **changes}.items() if v is not None}


MODEL_ERRORS = [
    pytest.param({"inputs": [tensor(shape=[-4])]}, "input 'InputTensor': inputs[0].shape[0]: Input should be greater than or equal to 0", id="negative-dim"),
    pytest.param({"inputs": [tensor(shape=["4"])]}, "inputs[0].shape[0]: Input should be a valid integer", id="string-dim"),
    pytest.param({"inputs": [tensor(shape=[4.0])]}, "inputs[0].shape[0]: Input should be a valid integer", id="float-dim"),
    pytest.param({"inputs": [tensor(shape=[True])]}, "inputs[0].shape[0]: Input should be a valid integer", id="bool-dim"),
    pytest.param({"inputs": [tensor(shape=[2**64])]}, "inputs[0].shape[0]: Input should be less than or equal to", id="dim-past-int64"),
    pytest.param({"inputs": [tensor(shape=[1] * 33)]}, "request body: inputs[0].shape has more than 32 dimensions (MAX_WIRE_RANK", id="rank-33"),
    pytest.param({"inputs": [tensor(datatype="FLOAT32")]}, "input 'InputTensor': inputs[0].datatype: Input should be 'BOOL', 'UINT8'", id="unknown-datatype"),
    pytest.param({"inputs": [tensor(datatype="BF16")]}, "inputs[0].datatype: Input should be", id="bf16"),
    pytest.param({"inputs": [tensor(name=7)]}, "inputs[0].name: Input should be a valid string", id="name-not-string"),
    pytest.param({"inputs": [tensor(contents={})]}, "inputs[0].contents: Extra inputs are not permitted", id="extra-key"),
    pytest.param({"inputs": [tensor(shape=None)]}, "inputs[0].shape: Field required", id="no-shape"),
    pytest.param({}, "request body: inputs: Field required", id="no-inputs"),
    pytest.param({"inputs": {}}, "inputs: Input should be a valid list", id="inputs-not-list"),
    pytest.param({"inputs": [tensor()], "id": 5}, "id: Input should be a valid string", id="id-not-string"),
    pytest.param({"inputs": [tensor()], "parameters": {"x": {"y": 1}}}, "parameters.x: Input should be a string, number or boolean", id="parameter-object"),
    pytest.param({"inputs": [tensor()], "parameters": {"binary_data_output": "yes"}}, "parameters.binary_data_output: Input should be a valid boolean", id="binary-output-not-bool"),
    pytest.param({"inputs": [tensor(data=None, parameters={"binary_data_size": -1})]}, "inputs[0].parameters.binary_data_size: Input should be greater than or equal to 0", id="negative-size"),
    pytest.param({"inputs": [tensor(data=None, parameters={"binary_data_size": "16"})]}, "binary_data_size: Input should be a valid integer", id="size-string"),
    pytest.param({"inputs": [tensor()], "outputs": [{"name": "OutputTensor", "parameters": {"binary_data": 1}}]}, "output 'OutputTensor': outputs[0].parameters.binary_data: Input should be a valid boolean", id="binary-data-not-bool"),
]  # fmt: skip


@pytest.mark.parametrize(("header", "words"), MODEL_ERRORS)
def test_wire_model_errors(client: TestClient, header: dict[str, Any], words: str) -> None:
    assert words in error_of(post(client, json.dumps(header).encode()), 400)


# --- operator rules and JSON data ------------------------------------------------------------------


def ab(a: dict[str, Any], b: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "A", **a}, {"name": "B", **b}], **extra}


U8 = {"shape": [2], "datatype": "UINT8", "data": [1, 2]}

RULE_ERRORS = [
    pytest.param(AND, {"inputs": [{"name": "A", **U8}, {"name": "A", **U8}]}, "input 'A' appears more than once", id="duplicate-input"),
    pytest.param(AND, {"inputs": [{"name": "A", **U8}]}, "B: missing input of onnx.BitwiseAnd-18 (inputs: A, B)", id="missing-input"),
    pytest.param(AND, {"inputs": [{"name": n, **U8} for n in "ABQ"]}, "Q: onnx.BitwiseAnd-18 has no input of that name", id="unknown-input"),
    pytest.param(AND, ab({**U8, "datatype": "BOOL", "data": [True, False]}, {**U8, "datatype": "BOOL", "data": [True, True]}), "A: data type BOOL is not supported by onnx.BitwiseAnd-18", id="datatype-not-allowed"),
    pytest.param(AND, ab(U8, {**U8, "datatype": "INT8"}), "B: data type INT8 differs from A's UINT8", id="mixed-datatypes"),
    pytest.param(AND, ab(U8, {**U8, "shape": [3], "data": [1, 2, 3]}), "do not broadcast", id="no-broadcast"),
    pytest.param("openvino.BitwiseAnd-13", {"inputs": [{"name": "input_1", **U8}, {"name": "input_2", "shape": [1], "datatype": "UINT8", "data": [1]}], "parameters": {"auto_broadcast": "none"}}, "input_2: shape [1] differs from input_1 [2]", id="auto-broadcast-none"),
    pytest.param(AND, ab(U8, U8, parameters={"feature_level": "6_4"}), "parameters.feature_level: unknown parameter for onnx.BitwiseAnd-18", id="unknown-parameter"),
    pytest.param(NOT, {"inputs": [{"name": "InputTensor", **U8}], "parameters": {"feature_level": "9_9"}}, "parameters.feature_level: '9_9' is not a valid value", id="bad-feature-level"),
    pytest.param(NOT, {"inputs": [{"name": "InputTensor", **U8}], "parameters": {"feature_level": "2_0"}}, "does not exist at feature level 2_0", id="before-the-operator"),
    pytest.param("onnx.BitShift-11", {"inputs": [{"name": "X", **U8}, {"name": "Y", **U8}]}, "parameters.direction: required by onnx.BitShift-11 (allowed: LEFT, RIGHT)", id="direction-required"),
    pytest.param(NOT, {"inputs": [{"name": "InputTensor", "shape": [0], "datatype": "UINT8", "data": []}]}, "dimension 0 has size 0", id="dml-empty"),
    pytest.param(AND, ab(U8, U8, outputs=[{"name": "Z"}]), "output 'Z': onnx.BitwiseAnd-18 has no output of that name (outputs: C)", id="unknown-output"),
    pytest.param(AND, ab(U8, U8, outputs=[{"name": "C"}, {"name": "C"}]), "output 'C' is requested more than once", id="duplicate-output"),
    pytest.param(AND, ab(U8, U8, outputs=[{"name": "C", "parameters": {"classification": 2}}]), "output 'C': outputs[0].parameters.classification: the classification extension is not supported (it changes what the output means", id="classification"),
    pytest.param(NOT, {"inputs": [{"name": "InputTensor", "shape": [1], "datatype": "FP16", "data": [1.0]}]}, "input 'InputTensor': FP16 has no JSON representation; send it as binary data (parameters.binary_data_size)", id="fp16-json-input"),
    pytest.param(AND, ab({**U8, "data": [1, 300]}, U8), "input 'A': value 300 is out of range for UINT8 (allowed: integers 0 to 255)", id="uint8-300"),
    pytest.param(AND, ab({**U8, "data": [-1, 0]}, U8), "input 'A': value -1 is out of range for UINT8", id="uint8-negative"),
    pytest.param(AND, ab({**U8, "datatype": "INT8", "data": [-129, 0]}, {**U8, "datatype": "INT8"}), "value -129 is out of range for INT8 (allowed: integers -128 to 127)", id="int8-low"),
    pytest.param(AND, ab({**U8, "datatype": "UINT64", "data": [2**64, 0]}, {**U8, "datatype": "UINT64"}), f"value {2**64} is out of range for UINT64", id="uint64-high"),
    pytest.param(AND, ab({**U8, "data": [1.5, 2]}, U8), "input 'A': 1.5 is not a valid UINT8 element (allowed: integers 0 to 255)", id="float-for-int"),
    pytest.param(AND, ab({**U8, "data": [1.0, 2]}, U8), "1.0 is not a valid UINT8 element", id="integral-float-for-int"),
    pytest.param(AND, ab({**U8, "data": [True, 2]}, U8), "true is not a valid UINT8 element", id="bool-for-int"),
    pytest.param(AND, ab({**U8, "data": ["1", 2]}, U8), '"1" is not a valid UINT8 element', id="string-for-int"),
    pytest.param(AND, ab({**U8, "data": [None, 2]}, U8), "null is not a valid UINT8 element", id="null-for-int"),
    pytest.param("openvino.BitwiseNot-13", {"inputs": [{"name": "input_1", "shape": [2], "datatype": "BOOL", "data": [1, 0]}]}, "input 'input_1': 1 is not a valid BOOL element (allowed: true or false)", id="int-for-bool"),
    pytest.param(NOT, {"inputs": [{"name": "InputTensor", "shape": [1], "datatype": "FP32", "data": [1e39]}]}, "out of range for FP32 (allowed: finite numbers within ±3.4028235e+38)", id="fp32-overflow"),
    pytest.param(NOT, {"inputs": [{"name": "InputTensor", "shape": [1], "datatype": "FP64", "data": [10**400]}]}, "is out of range for FP64", id="fp64-huge-int"),
    pytest.param(AND, ab({**U8, "data": [1]}, U8), "input 'A': data has 1 elements, shape [2] needs 2", id="data-too-short"),
    pytest.param(AND, ab({"shape": [2, 2], "datatype": "UINT8", "data": [[1, 2], [3]]}, {"shape": [2, 2], "datatype": "UINT8", "data": [1, 2, 3, 4]}), "input 'A': nested data does not match shape [2, 2]: dimension 1 needs arrays of length 2, found length 1", id="ragged-nesting"),
    pytest.param(AND, ab({"shape": [2, 2], "datatype": "UINT8", "data": [[1, 2], 3]}, {"shape": [2, 2], "datatype": "UINT8", "data": [1, 2, 3, 4]}), "found a number", id="mixed-nesting"),
    pytest.param(AND, ab({**U8, "data": "12"}, U8), "input 'A': data must be a JSON array, not a string", id="data-not-array"),
]  # fmt: skip


@pytest.mark.parametrize(("model", "header", "words"), RULE_ERRORS)
def test_rule_errors(client: TestClient, model: str, header: dict[str, Any], words: str) -> None:
    assert words in error_of(post(client, json.dumps(header).encode(), model=model), 400)


def test_fp16_output_refused_as_json_before_any_work(client: TestClient) -> None:
    x = np.ones(2, np.float16)
    body, headers = framed({"inputs": [binary_input("InputTensor", x)]}, x.tobytes())
    message = error_of(post(client, body, headers), 400)
    assert message == (
        "output 'OutputTensor': FP16 has no JSON representation; send it as binary data "
        "(binary_data: true)"
    )


def test_nan_result_refused_as_json(client: TestClient) -> None:
    header = {"inputs": [{"name": "InputTensor", "shape": [2], "datatype": "FP32", "data": [0, 1]}]}
    message = error_of(post(client, json.dumps(header).encode()), 400)
    assert "the result holds NaN or infinity, which JSON cannot represent" in message


# --- limits (413) and load (503) -------------------------------------------------------------------


def test_body_over_the_limit_is_413(client: TestClient) -> None:
    message = error_of(post(client, b" " * ((1 << 20) + 1)), 413)
    assert "request body of 1048577 bytes exceeds the limit of 1048576 bytes" in message


def test_decompressed_body_over_the_limit_is_413(client: TestClient) -> None:
    bomb = gzip.compress(b" " * (4 << 20))
    response = post(client, bomb, {"Content-Encoding": "gzip"})
    assert "decompressed request body" in error_of(response, 413)


def test_unknown_content_encoding_is_400(client: TestClient) -> None:
    response = post(client, b"{}", {"Content-Encoding": "br"})
    assert "Content-Encoding 'br' is not supported" in error_of(response, 400)


def test_too_many_tensors_is_413(client: TestClient) -> None:
    header = {"inputs": [tensor(name=f"t{i}") for i in range(3)], "outputs": [{"name": "x"}] * 2}
    message = error_of(post(client, json.dumps(header).encode()), 413)
    assert "5 inputs and outputs listed, more than the limit of 4" in message


def test_huge_shape_is_413_not_an_overflow(client: TestClient) -> None:
    header = {
        "inputs": [{"name": "InputTensor", "shape": [2**40, 2**40], "datatype": "UINT64",
                    "parameters": {"binary_data_size": 8}}]
    }  # fmt: skip
    body, headers = framed(header, b"\0" * 8)
    message = error_of(post(client, body, headers), 413)
    assert f"shape [{2**40}, {2**40}] has {2**80} elements" in message


def test_output_after_broadcast_over_the_limit_is_413() -> None:
    a, b = np.zeros((1000, 1), np.uint8), np.zeros((1, 1000), np.uint8)
    with v2_client(max_tensor_elements=100_000) as small:
        body, headers = framed(
            {"inputs": [binary_input("A", a), binary_input("B", b)]}, a.tobytes(), b.tobytes()
        )
        message = error_of(post(small, body, headers, model=AND), 413)
    assert "output 'C': shape [1000, 1000] has 1000000 elements" in message


def test_json_data_over_the_limit_is_413(client: TestClient) -> None:
    header = {"inputs": [json_input("InputTensor", np.zeros(1001, np.uint8))]}
    message = error_of(post(client, json.dumps(header).encode()), 413)
    assert "JSON data of 1001 elements exceeds the limit of 1000" in message


def test_json_output_over_the_limit_is_413(client: TestClient) -> None:
    a, b = np.zeros((40, 1), np.uint8), np.zeros((1, 40), np.uint8)
    header = {"inputs": [binary_input("A", a), binary_input("B", b)]}
    body, headers = framed(header, a.tobytes(), b.tobytes())
    message = error_of(post(client, body, headers, model=AND), 413)
    assert "output 'C': 1600 elements are too many for JSON data" in message


@pytest.mark.parametrize(
    ("field", "rule", "setting"),
    [
        ("requests_in_flight", "max_inflight_requests", "TENSORBITS_MAX_INFLIGHT_REQUESTS"),
        ("bytes_in_flight", "max_inflight_bytes", "TENSORBITS_MAX_INFLIGHT_BYTES"),
    ],
)
def test_overloaded_is_503_with_retry_after_naming_its_bound(
    client: TestClient, field: str, rule: str, setting: str
) -> None:
    admission = runtime_of(client).plane.admission
    full = admission.max_requests if field == "requests_in_flight" else admission.max_bytes
    setattr(admission, field, full)
    try:
        body, headers = framed(GOOD_BINARY, X16.tobytes())
        response = post(client, body, headers)
    finally:
        setattr(admission, field, 0)
    message = error_of(response, 503)
    assert "server busy" in message
    assert setting in message
    assert (response.json()["field"], response.json()["rule"]) == ("request", rule)
    assert response.headers["retry-after"] == "1"


def test_infer_before_the_backend_started_is_503() -> None:
    with v2_client() as c:
        runtime_of(c).started = False
        try:
            response = post(c, json.dumps(GOOD_BINARY).encode())
        finally:
            runtime_of(c).started = True
    assert "not ready" in error_of(response, 503)


def test_unknown_model_is_404_without_reading_the_body(client: TestClient) -> None:
    message = error_of(post(client, b"not even json", model="nope"), 404)
    assert "unknown model or operator 'nope'" in message


# --- never a 500 -----------------------------------------------------------------------------------

VALID = framed(
    {"inputs": [binary_input("A", X16), json_input("B", X16)], "outputs": [{"name": "C"}]},
    X16.tobytes(),
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    start=st.integers(0, len(VALID[0])),
    removed=st.integers(0, 40),
    insert=st.binary(max_size=8),
    length=st.one_of(
        st.just(VALID[1][HEADER]),
        st.none(),
        st.integers(-5, len(VALID[0]) + 5).map(str),
        st.text(max_size=6),
    ),
)
def test_mangled_bodies_get_4xx_never_5xx(
    client: TestClient, start: int, removed: int, insert: bytes, length: str | None
) -> None:
    """A span of a valid framed body replaced by other bytes, under any header length."""
    body = VALID[0][:start] + insert + VALID[0][start + removed :]
    headers = {} if length is None else {HEADER: length}
    try:
        response = post(client, body, headers, model=AND)
    except UnicodeEncodeError:
        return  # httpx refuses to send such a header at all
    assert response.status_code in (200, 400, 413), response.text
    if response.status_code != 200:
        assert response.json()["error"]


@pytest.mark.parametrize(
    ("method", "path", "status", "field", "rule"),
    [
        ("GET", "/v2/nowhere", 404, "path", "no_route"),
        ("DELETE", "/v2/health/live", 405, "method", "method_not_allowed"),
        ("GET", f"/v2/models/{NOT}/infer", 405, "method", "method_not_allowed"),
    ],
)
def test_the_frameworks_refusals_name_the_field_and_rule(
    client: TestClient, method: str, path: str, status: int, field: str, rule: str
) -> None:
    response = client.request(method, path)
    assert response.status_code == status
    body = response.json()
    assert (body["field"], body["rule"], body["code"]) == (field, rule, "http_error")
    assert path in body["error"]


def test_an_integer_past_float64_in_fp_data_is_a_400_not_a_500(client: TestClient) -> None:
    for value in (2**1024 - 2**970, 2**1024, -(2**1024)):
        header = {
            "inputs": [{"name": "InputTensor", "shape": [1], "datatype": "FP64", "data": [value]}]
        }
        message = error_of(post(client, json.dumps(header).encode()), 400)
        assert "is out of range for FP64" in message
        assert "an integer of about 309 digits" in message


def test_an_integer_too_long_to_read_says_so_without_pythons_advice(client: TestClient) -> None:
    raw = (
        b'{"inputs": [{"name": "InputTensor", "shape": [1], "datatype": "UINT8", "data": ['
        + b"9" * 5000
        + b"]}]}"
    )
    message = error_of(post(client, raw), 400)
    assert "an integer of more than 4300 digits" in message
    assert "sys.set_int_max_str_digits" not in message
