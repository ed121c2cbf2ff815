"""Refusals say what was received and, when a close match exists, what was probably meant.

A schema error names the field, the value (bounded), the rule and "did you mean
'X'?"; so do an unknown model, input and parameter, on v2 and /v1 alike (one formatter,
``tensorbits_protocol.schema_errors``, and one rule table, ``validation``). Arrays given
in order to an operator that takes fewer are refused by count, naming the inputs it takes.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from support.inprocess import TestClient
from support.v1 import batch, bind, data, dispatch, zeros
from support.v1 import error as v1_error
from support.v1 import post as v1_post
from support.v2 import NOT

from tensorbits_client import Client, LocalValidationError
from tensorbits_client._catalog import Catalog

U8 = {"shape": [2], "datatype": "UINT8", "data": [1, 2]}


def v2_refusal(client: TestClient, model: str, document: Any, status: int = 400) -> Any:
    response = client.post(f"/v2/models/{model}/infer", content=json.dumps(document).encode())
    assert response.status_code == status, response.text
    return response.json()


def one(name: str = "InputTensor", **changes: Any) -> dict[str, Any]:
    return {"inputs": [{"name": name, **U8, **changes}]}


# --- v2 ---------------------------------------------------------------------------------------------

V2_CASES = [
    pytest.param(
        NOT, one(datatype="UINT9"), "inputs[0].datatype", "literal_error",
        "request body: input 'InputTensor': inputs[0].datatype: Input should be 'BOOL', 'UINT8', "
        "'UINT16', 'UINT32', 'UINT64', 'INT8', 'INT16', 'INT32', 'INT64', 'FP16', 'FP32' or "
        "'FP64' (got 'UINT9'; did you mean 'UINT8'?)",
        id="datatype-UINT9",
    ),
    pytest.param(
        NOT, {**one(), "paramters": {"feature_level": "6_4"}}, "paramters", "extra_forbidden",
        "request body: paramters: Extra inputs are not permitted (got an object; allowed fields: "
        "id, model_name, model_version, parameters, inputs, outputs; did you mean "
        "'parameters'?)",
        id="misspelt-parameters-key",
    ),
    # A misspelt required key is answered as the unknown key it is, with the one it is close to,
    # not as the required key that is then missing.
    pytest.param(
        NOT, {"input": one()["inputs"]}, "input", "extra_forbidden",
        "request body: input: Extra inputs are not permitted (got an array of 1 item; allowed "
        "fields: id, model_name, model_version, parameters, inputs, outputs; did you mean "
        "'inputs'?)",
        id="misspelt-inputs-key",
    ),
    pytest.param(
        NOT, {"inputs": [{"name": "InputTensor", "shape": [2], "dtype": "UINT8", "data": [1, 2]}]},
        "inputs[0].dtype", "extra_forbidden",
        "request body: input 'InputTensor': inputs[0].dtype: Extra inputs are not permitted "
        "(got 'UINT8'; allowed fields: name, shape, datatype, parameters, data; did you mean "
        "'datatype'?)",
        id="misspelt-datatype-key",
    ),
    pytest.param(
        NOT, one(shpe=[2]), "inputs[0].shpe", "extra_forbidden",
        "request body: input 'InputTensor': inputs[0].shpe: Extra inputs are not permitted "
        "(got an array of 1 item; allowed fields: name, shape, datatype, parameters, data; "
        "did you mean 'shape'?)",
        id="misspelt-tensor-key",
    ),
    pytest.param(
        NOT, one("InputTensr"), "InputTensor", "missing_input",
        "InputTensor: missing input of DML_OPERATOR_ELEMENT_WISE_BIT_NOT (inputs: InputTensor); "
        "unknown input 'InputTensr'; did you mean 'InputTensor'?",
        id="misspelt-input-name",
    ),
    pytest.param(
        "onnx.BitwiseNot-18", {"inputs": [{"name": "X", **U8}, {"name": "Y", **U8}]}, "Y",
        "unknown_input",
        "Y: onnx.BitwiseNot-18 has no input of that name (inputs: X); onnx.BitwiseNot-18 takes "
        "1 input (X), got 2",
        id="two-inputs-to-a-unary-operator",
    ),
    pytest.param(
        "onnx.BitwiseAnd-18", {"inputs": [{"name": "A", **U8}]}, "B", "missing_input",
        "B: missing input of onnx.BitwiseAnd-18 (inputs: A, B); onnx.BitwiseAnd-18 takes 2 "
        "inputs (A, B), got 1",
        id="one-input-to-a-binary-operator",
    ),
    pytest.param(
        NOT, {**one(), "parameters": {"feature_levl": "6_4"}}, "parameters.feature_levl",
        "unknown_parameter",
        "parameters.feature_levl: unknown parameter for DML_OPERATOR_ELEMENT_WISE_BIT_NOT "
        "(allowed: feature_level; the protocol's: binary_data_output, sequence_id, "
        "sequence_start, sequence_end, priority, timeout, headers, triton_*); did you mean "
        "'feature_level'?",
        id="misspelt-parameter",
    ),
    pytest.param(
        "openvino.BitwiseAnd-13",
        {"inputs": [{"name": "input_1", **U8}, {"name": "input_2", **U8}],
         "parameters": {"auto_broadcast": "numpi"}},
        "parameters.auto_broadcast", "parameter_value",
        "parameters.auto_broadcast: 'numpi' is not a valid value for openvino.BitwiseAnd-13 "
        "(allowed: numpy, none, pdpd); did you mean 'numpy'?",
        id="misspelt-parameter-value",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("model", "document", "field", "rule", "message"), V2_CASES)
def test_v2_refusal_names_value_rule_and_suggestion(
    v2: TestClient, model: str, document: Any, field: str, rule: str, message: str
) -> None:
    body = v2_refusal(v2, model, document)
    assert (body["error"], body["field"], body["rule"]) == (message, field, rule)


def test_v2_unknown_model_suggests_the_closest(v2: TestClient) -> None:
    body = v2_refusal(v2, f"{NOT}T", one(), status=404)
    # The hint names each listing with the method that serves it.
    assert body["error"].startswith(
        f"unknown model or operator '{NOT}T' (POST /v2/repository/index or GET /v1/operators"
    )
    assert body["error"].endswith(f"; did you mean '{NOT}'?")


def test_v2_unknown_model_far_from_any_gets_no_suggestion(v2: TestClient) -> None:
    assert "did you mean" not in v2_refusal(v2, "zzzz", one(), status=404)["error"]


def test_v2_long_value_is_described_not_echoed(v2: TestClient) -> None:
    # Within the text bound (past it, refused as max_text_bytes before its value is read).
    body = v2_refusal(v2, NOT, one(datatype="U" * 4_000))
    assert f"(got {'U' * 80!r}... (a string of 4000 characters))" in body["error"]
    assert len(body["error"]) < 500


def test_v2_value_past_the_text_bound_is_refused_by_its_size(v2: TestClient) -> None:
    body = v2_refusal(v2, NOT, one(datatype="U" * 100_000))
    assert (body["field"], body["rule"]) == ("inputs[0].datatype", "max_text_bytes")
    assert "U" * 80 not in body["error"]


def test_v2_huge_integer_is_described_by_its_length(v2: TestClient) -> None:
    body = v2_refusal(v2, NOT, one(shape=[10**200]))
    assert body["field"] == "inputs[0].shape[0]"
    assert body["error"].endswith("(got an integer of about 201 digits)")


def test_v2_missing_field_does_not_echo_the_object(v2: TestClient) -> None:
    body = v2_refusal(v2, NOT, {"inputs": [{"name": "InputTensor", "shape": [2], "data": [1, 2]}]})
    assert body["error"].endswith("inputs[0].datatype: Field required")


# --- /v1 --------------------------------------------------------------------------------------------


def v1_batch(operator: str = "BIT_NOT", **changes: Any) -> tuple[dict[str, Any], bytes]:
    header, payload = batch(
        [data("in", np.arange(4, dtype=np.uint32)), zeros("out", 16)],
        [
            dispatch(
                operator,
                InputTensor=bind("in", "UINT32", [4]),
                OutputTensor=bind("out", "UINT32", [4]),
            )
        ],
        ["out"],
    )
    header["dispatches"][0].update(changes)
    return header, payload


def test_v1_unknown_operator_suggests_the_closest(v1: TestClient) -> None:
    body = v1_error(v1_post(v1, *v1_batch("BIT_NOTT")))
    assert body["field"] == "dispatches[0].operator"
    assert body["error"].startswith(
        "dispatches[0].operator: unknown model or operator 'DML_OPERATOR_ELEMENT_WISE_BIT_NOTT'"
    )
    assert body["error"].endswith("; did you mean 'DML_OPERATOR_ELEMENT_WISE_BIT_NOT'?")


def test_v1_datatype_names_the_value_and_the_closest(v1: TestClient) -> None:
    header, payload = v1_batch()
    header["dispatches"][0]["bindings"]["InputTensor"]["desc"]["datatype"] = "UINT9"
    body = v1_error(v1_post(v1, header, payload))
    assert body["field"] == "dispatches[0].bindings.InputTensor.desc.datatype"
    assert body["rule"] == "literal_error"
    assert body["error"].startswith(f"{body['field']}: Input should be 'BOOL'")
    assert body["error"].endswith("(got 'UINT9'; did you mean 'UINT8'?)")


def test_v1_misspelt_key_lists_the_fields_and_the_closest(v1: TestClient) -> None:
    body = v1_error(v1_post(v1, *v1_batch(paramters={})))
    assert (body["field"], body["rule"]) == ("dispatches[0].paramters", "extra_forbidden")
    assert body["error"] == (
        "dispatches[0].paramters: Extra inputs are not permitted (got an empty object; allowed "
        "fields: operator, parameters, bindings; did you mean 'parameters'?)"
    )


def test_v1_misspelt_required_key_is_the_unknown_key_not_the_missing_one(v1: TestClient) -> None:
    header, payload = v1_batch()
    header["dispatch"] = header.pop("dispatches")
    body = v1_error(v1_post(v1, header, payload))
    assert (body["field"], body["rule"]) == ("dispatch", "extra_forbidden")
    assert body["error"].endswith("did you mean 'dispatches'?)")


def test_v1_misspelt_descriptor_key(v1: TestClient) -> None:
    header, payload = v1_batch()
    header["dispatches"][0]["bindings"]["InputTensor"]["desc"]["stride"] = [1]
    body = v1_error(v1_post(v1, header, payload))
    assert body["field"] == "dispatches[0].bindings.InputTensor.desc.stride"
    assert body["error"].endswith("did you mean 'strides'?)")


def test_v1_misspelt_parameter(v1: TestClient) -> None:
    body = v1_error(v1_post(v1, *v1_batch(parameters={"feature_levl": "6_4"})))
    assert body["field"] == "dispatches[0].parameters.feature_levl"
    assert body["rule"] == "unknown_parameter"
    assert body["error"].startswith(
        "dispatches[0].parameters.feature_levl: unknown parameter for "
        "DML_OPERATOR_ELEMENT_WISE_BIT_NOT (allowed: feature_level; "
    )
    assert body["error"].endswith("triton_*); did you mean 'feature_level'?")


def test_v1_misspelt_binding_suggests_the_tensor(v1: TestClient) -> None:
    header, payload = v1_batch()
    bindings = header["dispatches"][0]["bindings"]
    bindings["InputTensr"] = bindings.pop("InputTensor")
    body = v1_error(v1_post(v1, header, payload))
    assert body["field"] == "dispatches[0].bindings.InputTensr"
    assert body["rule"] == "unknown_binding"
    assert body["error"].endswith(
        "(tensors: InputTensor, OutputTensor); did you mean 'InputTensor'?"
    )


# --- the client: arrays in order ------------------------------------------------------------------


@pytest.mark.parametrize("local_validation", [True, False])
def test_two_arrays_to_a_unary_operator_are_refused_by_count(local_validation: bool) -> None:
    """Refused before anything is sent (the URL is unroutable), checks or not: the second array
    has no name to go by."""
    catalog = Catalog()
    catalog.use_bundled()
    u8 = np.zeros(2, np.uint8)
    client = Client(
        "http://tensorbits.invalid",
        local_validation=local_validation,
        max_retries=0,
        _catalog=catalog,
    )
    with client, pytest.raises(LocalValidationError) as caught:
        client.infer("onnx.BitwiseNot-18", [u8, u8])
    assert caught.value.message == "onnx.BitwiseNot-18 takes 1 input (X), got 2"
    assert (caught.value.field, caught.value.rule) == ("inputs", "input_count")


def test_one_array_to_a_binary_operator_says_the_count_locally() -> None:
    catalog = Catalog()
    catalog.use_bundled()
    client = Client("http://tensorbits.invalid", max_retries=0, _catalog=catalog)
    with client, pytest.raises(LocalValidationError) as caught:
        client.infer("onnx.BitwiseAnd-18", [np.zeros(2, np.uint8)])
    assert caught.value.message == (
        "B: missing input of onnx.BitwiseAnd-18 (inputs: A, B); onnx.BitwiseAnd-18 takes 2 "
        "inputs (A, B), got 1"
    )


def test_a_binary_body_without_its_header_length_is_told_what_is_missing(v2: TestClient) -> None:
    """JSON then binary data, but no Inference-Header-Content-Length: the reader's own words
    (not UTF-8, or data after the JSON) and then what to send."""
    header = json.dumps(
        {"inputs": [{"name": "InputTensor", "shape": [4], "datatype": "UINT8",
                     "parameters": {"binary_data_size": 4}}]}
    ).encode()  # fmt: skip
    for tail, words in ((b"\xff\x00\x01\x02", "not UTF-8"), (b"1234", "Extra data")):
        response = v2.post(f"/v2/models/{NOT}/infer", content=header + tail)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error.endswith(
            "give the header's length in bytes as Inference-Header-Content-Length"
        )
        assert ("UTF-8" in error) if words == "not UTF-8" else (words in error)
        # With the header, the same bytes are a valid request.
        framed = v2.post(
            f"/v2/models/{NOT}/infer",
            content=header + tail,
            headers={"Inference-Header-Content-Length": str(len(header))},
        )
        assert framed.status_code == 200, framed.text
