"""The v2 repository extension's unload and load, in process: an unloaded model is UNAVAILABLE
("unloaded") in the index, not ready, and its inferences are refused, naming the way back, until
it is loaded again. Each test has an app of its own: the state is the app's runtime's."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from support.inprocess import TestClient
from support.v2 import AND, NOT, error_of, infer_binary, json_input, v2_client

from tensorbits.core.models import ModelStates
from tensorbits.runtime import Drain
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.operators import OPERATORS

UNLOADED = (
    f"model '{NOT}' is unloaded (state UNAVAILABLE): load it again with "
    f"POST /v2/repository/models/{NOT}/load"
)
DATA = np.array([0, 1, 0xF0, 0xFF], dtype=np.uint8)
READY_PATHS = (f"/v2/models/{NOT}/ready", f"/v2/models/{NOT}/versions/1/ready")
INFER_PATHS = (f"/v2/models/{NOT}/infer", f"/v2/models/{NOT}/versions/1/infer")


@pytest.fixture
def client() -> Iterator[TestClient]:
    with v2_client() as c:
        yield c


def _unload(client: TestClient, model: str = NOT) -> None:
    response = client.post(f"/v2/repository/models/{model}/unload")
    assert (response.status_code, response.content) == (200, b"")


def _load(client: TestClient, model: str = NOT) -> None:
    response = client.post(f"/v2/repository/models/{model}/load")
    assert (response.status_code, response.content) == (200, b"")


def _infer_json(client: TestClient, path: str) -> tuple[int, dict[str, object]]:
    response = client.post(path, json={"inputs": [json_input("InputTensor", DATA)]})
    body: dict[str, object] = response.json()
    return response.status_code, body


def _index(client: TestClient, body: bytes = b"") -> dict[str, dict[str, str]]:
    response = client.post("/v2/repository/index", content=body)
    assert response.status_code == 200, response.text
    return {entry["name"]: entry for entry in response.json()}


def test_unload_makes_the_model_unavailable_in_the_index(client: TestClient) -> None:
    _unload(client)
    index = _index(client)
    assert index[NOT] == {"name": NOT, "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    others = [entry for name, entry in index.items() if name != NOT]
    assert len(others) == len(OPERATORS) - 1
    assert all(entry["state"] == "READY" and "reason" not in entry for entry in others)
    # {"ready": true} lists only the models ready now.
    assert set(_index(client, b'{"ready": true}')) == {op.name for op in OPERATORS} - {NOT}


def test_an_unloaded_model_is_not_ready_with_the_reason(client: TestClient) -> None:
    _unload(client)
    for path in READY_PATHS:
        response = client.get(path)
        assert error_of(response, 400) == UNLOADED
        assert response.json()["rule"] == "model_unloaded"
    assert client.get(f"/v2/models/{AND}/ready").status_code == 200
    assert client.get("/v2/health/ready").status_code == 200  # the server itself still is


def test_inference_of_an_unloaded_model_is_refused(client: TestClient) -> None:
    _unload(client)
    for path in INFER_PATHS:
        status, body = _infer_json(client, path)
        assert status == 400
        assert body == {
            "error": UNLOADED,
            "code": "model_unavailable",
            "field": "model_name",
            "rule": "model_unloaded",
        }
    binary = infer_binary(client, NOT, {"InputTensor": DATA})
    assert error_of(binary, 400) == UNLOADED
    # Another model is untouched.
    both = {"A": DATA, "B": DATA[::-1].copy()}
    assert infer_binary(client, AND, both).status_code == 200


def test_the_refusal_comes_before_the_body_is_read() -> None:
    # A body the server would refuse as malformed, or as too large, gets the unloaded answer:
    # the model is checked first, and the body is never read (nor admitted).
    with v2_client(max_body_bytes=1 << 10, max_inflight_bytes=1 << 20) as client:
        _unload(client)
        assert error_of(client.post(INFER_PATHS[0], content=b"{not json"), 400) == UNLOADED
        assert error_of(client.post(INFER_PATHS[0], content=b" " * (4 << 10)), 400) == UNLOADED


def test_load_brings_the_model_back(client: TestClient) -> None:
    _unload(client)
    _unload(client)  # unloading an unloaded model changes nothing
    _load(client)
    for path in READY_PATHS:
        response = client.get(path)
        assert (response.status_code, response.content) == (200, b"")
    assert {entry["state"] for entry in _index(client).values()} == {"READY"}
    for path in INFER_PATHS:
        status, body = _infer_json(client, path)
        assert status == 200, body
        outputs = body["outputs"]
        assert isinstance(outputs, list)
        assert outputs[0]["data"] == (~DATA).tolist()


def test_metadata_of_an_unloaded_model_still_answers(client: TestClient) -> None:
    # The operator is compiled in: its metadata does not change with the repository state.
    _unload(client)
    response = client.get(f"/v2/models/{NOT}")
    assert response.status_code == 200
    assert response.json()["name"] == NOT


def test_unknown_models_stay_404(client: TestClient) -> None:
    _unload(client)
    for action in ("load", "unload"):
        response = client.post(f"/v2/repository/models/nope/{action}")
        assert "unknown model or operator 'nope'" in error_of(response, 404)
    assert "unknown model" in error_of(client.get("/v2/models/nope/ready"), 404)
    assert "unknown model" in error_of(client.post("/v2/models/nope/infer", content=b"{}"), 404)
    unknown_version = client.get(f"/v2/models/{NOT}/versions/9/ready")
    assert "has no version '9'" in error_of(unknown_version, 404)


def test_the_state_is_each_servers_own() -> None:
    with v2_client() as first, v2_client() as second:
        _unload(first)
        assert first.get(READY_PATHS[0]).status_code == 400
        assert second.get(READY_PATHS[0]).status_code == 200
        assert _infer_json(second, INFER_PATHS[0])[0] == 200


def test_a_server_not_ready_says_so_first() -> None:
    drain = Drain()
    with v2_client(drain=drain) as client:
        _unload(client)
        drain.begin()
        assert "not ready" in error_of(client.get(READY_PATHS[0]), 503)
        assert _index(client)[NOT]["reason"] == "server is not ready"
        # Load and unload still answer while draining: they only change this server's state.
        _load(client)


def test_model_states() -> None:
    states = ModelStates()
    assert states.is_loaded(NOT)
    states.check_loaded(NOT)
    states.unload(NOT)
    assert not states.is_loaded(NOT)
    assert states.is_loaded(AND)
    with pytest.raises(InvalidRequest) as refused:
        states.check_loaded(NOT)
    assert refused.value.message == UNLOADED
    assert (refused.value.field, refused.value.rule) == ("model_name", "model_unloaded")
    states.load(NOT)
    states.load(NOT)
    assert states.is_loaded(NOT)
    states.check_loaded(NOT)
