"""One status table for both protocols (``tensorbits_protocol.errors.STATUSES``): every error
class, raised inside an inference, is answered over HTTP with its HTTP status and code and over
gRPC with its gRPC status code, the field and the rule in both; what is not a refusal is a
500 / INTERNAL naming no internals, never UNKNOWN; out of memory is a 503 / UNAVAILABLE on both.

The app runs in process with its gRPC endpoint on a free loopback port, so one patched backend
serves both front ends; gRPC goes over a real socket with the stock tritonclient."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton
from support.inprocess import TestClient, app_client
from support.live import free_port
from tritonclient.utils import InferenceServerException

from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits_protocol.errors import STATUSES, TensorbitsError

NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
DATA = np.array([0, 1, 2, 255], np.uint8)


@pytest.fixture(scope="module")
def both() -> Iterator[tuple[TestClient, triton.InferenceServerClient]]:
    port = free_port()
    # No plan cache: every call is planned afresh and reaches the backend's ``run``, where the
    # failures are raised (a template's plans run the kernel it bound: ``NumpyBackend.bound``).
    with app_client(grpc_port=port, header_cache_bytes=0, raise_server_exceptions=False) as http:
        grpc_client = triton.InferenceServerClient(f"127.0.0.1:{port}")
        yield http, grpc_client
        grpc_client.close()


def _raising(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    def run(self: NumpyBackend, *args: Any, **kwargs: Any) -> None:
        raise error

    monkeypatch.setattr(NumpyBackend, "run", run)


def _http(http: TestClient) -> Any:
    body = {"inputs": [{"name": "InputTensor", "shape": [4], "datatype": "UINT8", "data": [0] * 4}]}
    return http.post(f"/v2/models/{NOT}/infer", json=body)


def _grpc(client: triton.InferenceServerClient) -> InferenceServerException:
    tensor = triton.InferInput("InputTensor", [4], "UINT8")
    tensor.set_data_from_numpy(DATA)
    with pytest.raises(InferenceServerException) as caught:
        client.infer(NOT, [tensor])
    return caught.value


def _instance(cls: type[TensorbitsError]) -> TensorbitsError:
    return cls("simulated", field="somewhere", rule="some_rule")


def test_the_table_covers_every_error_class() -> None:
    def tree(root: type[TensorbitsError]) -> set[type[TensorbitsError]]:
        return {root}.union(*(tree(sub) for sub in root.__subclasses__()))

    assert set(STATUSES) == tree(TensorbitsError)
    assert all(code not in ("UNKNOWN", "OK") for _, code in STATUSES.values())


@pytest.mark.parametrize("cls", list(STATUSES), ids=lambda cls: cls.__name__)
def test_every_class_is_answered_from_the_table_on_both_protocols(
    both: tuple[TestClient, triton.InferenceServerClient],
    monkeypatch: pytest.MonkeyPatch,
    cls: type[TensorbitsError],
) -> None:
    http, grpc_client = both
    http_status, grpc_code = STATUSES[cls]
    error = _instance(cls)
    _raising(monkeypatch, error)
    response = _http(http)
    assert response.status_code == http_status
    assert response.json()["code"] == cls.code
    refused = _grpc(grpc_client)
    assert refused.status() == f"StatusCode.{grpc_code}"
    assert refused.message() == "simulated"
    if error.field is not None:
        assert response.json()["field"] == error.field


@pytest.mark.parametrize(
    ("raised", "http_status", "grpc_code", "words"),
    [
        (MemoryError("out of device memory"), 503, "UNAVAILABLE", "ran out of memory"),
        (RuntimeError("a bug"), 500, "INTERNAL", "internal server error"),
    ],
    ids=["out of memory", "a bug"],
)
def test_what_is_not_a_refusal_is_answered_the_same_on_both_protocols(
    both: tuple[TestClient, triton.InferenceServerClient],
    monkeypatch: pytest.MonkeyPatch,
    raised: BaseException,
    http_status: int,
    grpc_code: str,
    words: str,
) -> None:
    http, grpc_client = both
    _raising(monkeypatch, raised)
    response = _http(http)
    assert response.status_code == http_status
    assert words in response.json()["error"]
    refused = _grpc(grpc_client)
    assert refused.status() == f"StatusCode.{grpc_code}"
    assert words in str(refused.message())
    assert "a bug" not in str(refused.message())  # no internals named


def test_natural_refusals_agree(both: tuple[TestClient, triton.InferenceServerClient]) -> None:
    """Refusals the server makes itself, not simulated: the same class on both protocols."""
    http, grpc_client = both
    tensor = triton.InferInput("InputTensor", [4], "UINT8")
    tensor.set_data_from_numpy(DATA)
    body = {"inputs": [{"name": "InputTensor", "shape": [4], "datatype": "UINT8", "data": [0] * 4}]}
    # An unknown model: 404 / NOT_FOUND.
    assert http.post("/v2/models/nope/infer", json=body).status_code == 404
    with pytest.raises(InferenceServerException) as caught:
        grpc_client.infer("nope", [tensor])
    assert caught.value.status() == "StatusCode.NOT_FOUND"
    # An unloaded model: 400 / FAILED_PRECONDITION, the rule named on both.
    grpc_client.unload_model(NOT)
    try:
        response = http.post(f"/v2/models/{NOT}/infer", json=body)
        assert (response.status_code, response.json()["rule"]) == (400, "model_unloaded")
        with pytest.raises(InferenceServerException) as caught:
            grpc_client.infer(NOT, [tensor])
        assert caught.value.status() == "StatusCode.FAILED_PRECONDITION"
    finally:
        grpc_client.load_model(NOT)
