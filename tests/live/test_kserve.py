"""KServe's own SDK, unchanged, against a live server (REST and gRPC): health, model readiness,
JSON and binary inference, and a body naming another model than its URL. ``kserve_checks.py``
drives the SDK in a child interpreter (KServe's protobuf messages and tritonclient's share their
names, and protobuf keeps one pool of them per process); each check here reads its outcome."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.grpc_live import serve_grpc

pytestmark = pytest.mark.integration

CHECKS = Path(__file__).with_name("kserve_checks.py")
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
AND = "onnx.BitwiseAnd-18"
X = np.array([[0, 1, 127], [128, 254, 255]], dtype=np.uint8)  # kserve_checks' inputs
A = np.arange(6, dtype=np.int32).reshape(2, 3) * 1000
B = np.full((2, 3), 0x0F0F, dtype=np.int32)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with serve_grpc() as server:
        run = subprocess.run(
            [sys.executable, str(CHECKS), server.http.base_url, server.grpc_url],
            capture_output=True, text=True, timeout=120, check=False,
            cwd=tmp_path_factory.mktemp("kserve"),  # nothing of the repository shadows a module
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-4000:]
        yield json.loads(run.stdout)


def value(outcomes: dict[str, Any], check: str) -> Any:
    outcome = outcomes[check]
    assert "error" not in outcome, outcome["error"]
    return outcome["value"]


def output(values: Any, model: str, request_id: str, name: str, datatype: str) -> Any:
    assert (values["model_name"], values["id"]) == (model, request_id)
    (only,) = values["outputs"]
    assert only == name
    tensor = values["outputs"][name]
    assert tensor["datatype"] == datatype
    return np.array(tensor["values"]).reshape(tensor["shape"])


@pytest.mark.parametrize(
    "check",
    [
        "rest_server_live",  # reads {"live": true} from the body
        "rest_server_ready",  # reads {"ready": true}
        "rest_model_ready",
        "grpc_server_live",
        "grpc_server_ready",
        "grpc_model_ready",
    ],
)
def test_health(outcomes: dict[str, Any], check: str) -> None:
    assert value(outcomes, check) is True


def test_rest_json_inference(outcomes: dict[str, Any]) -> None:
    # KServe's REST client names the model in the body too (model_name): the URL's, accepted.
    values = value(outcomes, "rest_json_inference")
    assert values["binary_output"] is False
    np.testing.assert_array_equal(output(values, NOT, "json-1", "OutputTensor", "UINT8"), ~X)


def test_rest_binary_inference(outcomes: dict[str, Any]) -> None:
    values = value(outcomes, "rest_binary_inference")
    assert values["binary_output"] is True
    np.testing.assert_array_equal(output(values, AND, "binary-1", "C", "INT32"), A & B)


def test_rest_body_naming_another_model_is_refused_naming_both(outcomes: dict[str, Any]) -> None:
    answer = value(outcomes, "rest_another_model_in_the_body")
    assert answer["status"] == 400
    assert answer["body"] == {
        "error": f"model_name '{AND}' in the request body is not the model the URL names, '{NOT}'",
        "code": "invalid_request",
        "field": "model_name",
        "rule": "model_mismatch",
    }


def test_grpc_raw_inference(outcomes: dict[str, Any]) -> None:
    values = value(outcomes, "grpc_raw_inference")
    np.testing.assert_array_equal(output(values, AND, "grpc-1", "C", "INT32"), A & B)


def test_grpc_typed_inference(outcomes: dict[str, Any]) -> None:
    values = value(outcomes, "grpc_typed_inference")
    np.testing.assert_array_equal(output(values, NOT, "grpc-2", "OutputTensor", "UINT8"), ~X)
