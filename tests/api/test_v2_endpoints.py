"""The v2 endpoints other than infer: health, server and model metadata, readiness, repository."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.inprocess import TestClient
from support.v2 import AND, NOT, error_of, v2_client

from tensorbits import __version__
from tensorbits.config.settings import Settings
from tensorbits.runtime import Drain
from tensorbits.server.app import create_app
from tensorbits_protocol.operators import OPERATORS, OperatorSpec


@pytest.fixture(scope="module")
def client(v2: TestClient) -> TestClient:
    return v2  # tests/api/conftest.py's app


@pytest.fixture(scope="module")
def draining() -> Iterator[TestClient]:
    """A server told to stop: it began the drain its app was given, so readiness goes false
    first."""
    drain = Drain()
    with v2_client(drain=drain) as c:
        drain.begin()
        yield c


def test_server_metadata(client: TestClient) -> None:
    response = client.get("/v2")
    assert response.status_code == 200
    body = response.json()
    assert body["name"] == "tensorbits"
    assert body["version"] == __version__
    assert {"binary_tensor_data", "model_repository"} <= set(body["extensions"])


@pytest.mark.parametrize(
    ("path", "body"), [("/v2/health/live", {"live": True}), ("/v2/health/ready", {"ready": True})]
)
def test_health_is_200_with_a_json_body(client: TestClient, path: str, body: object) -> None:
    # KServe's REST client reads the body; Triton's read the status (tested live with both).
    response = client.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == body


def test_not_ready_while_draining_but_still_live(draining: TestClient) -> None:
    assert "not ready" in error_of(draining.get("/v2/health/ready"), 503)
    assert "not ready" in error_of(draining.get(f"/v2/models/{NOT}/ready"), 503)
    assert "not ready" in error_of(draining.get(f"/v2/models/{NOT}/versions/1/ready"), 503)
    live = draining.get("/v2/health/live")
    assert (live.status_code, live.json()) == (200, {"live": True})


def test_not_ready_before_the_lifespan_ran() -> None:
    # Without the context manager, the lifespan never runs: no runtime exists.
    client = TestClient(create_app(Settings(backend="numpy")))
    assert error_of(client.get("/v2/health/ready"), 503) == "server is not ready"
    assert client.get("/v2/health/live").status_code == 200


@pytest.mark.parametrize("op", OPERATORS, ids=lambda op: op.name)
def test_model_metadata_of_every_operator(client: TestClient, op: OperatorSpec) -> None:
    for path in (f"/v2/models/{op.name}", f"/v2/models/{op.name}/versions/1"):
        response = client.get(path)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["name"] == op.name
        assert body["versions"] == ["1"]
        assert body["platform"] == "tensorbits"
        assert [t["name"] for t in body["inputs"]] == list(op.inputs)
        assert [t["name"] for t in body["outputs"]] == [op.output]
        # UINT8 is accepted by every operator at every feature level: a client that builds its
        # inputs from this metadata gets a valid request.
        assert {t["datatype"] for t in body["inputs"] + body["outputs"]} == {"UINT8"}
        assert all(t["shape"] == [-1] for t in body["inputs"] + body["outputs"])


def test_model_ready(client: TestClient) -> None:
    for path in (f"/v2/models/{AND}/ready", f"/v2/models/{AND}/versions/1/ready"):
        response = client.get(path)
        assert (response.status_code, response.content) == (200, b"")


@pytest.mark.parametrize(
    "path",
    [
        "/v2/models/nope",
        "/v2/models/nope/ready",
        "/v2/models/nope/versions/1",
        "/v2/models/nope/versions/1/ready",
    ],
)
def test_unknown_model_is_404(client: TestClient, path: str) -> None:
    message = error_of(client.get(path), 404)
    assert "unknown model or operator 'nope'" in message


@pytest.mark.parametrize("suffix", ["", "/ready"])
@pytest.mark.parametrize("version", ["2", "0", "latest"])
def test_unknown_version_is_404_naming_the_versions(
    client: TestClient, version: str, suffix: str
) -> None:
    message = error_of(client.get(f"/v2/models/{AND}/versions/{version}{suffix}"), 404)
    assert message == f"model '{AND}' has no version '{version}' (versions: 1)"


def test_unknown_version_infer_is_404(client: TestClient) -> None:
    response = client.post(f"/v2/models/{AND}/versions/7/infer", content=b"{}")
    assert "has no version '7'" in error_of(response, 404)


def test_no_such_endpoint_is_a_json_404(client: TestClient) -> None:
    assert "no endpoint" in error_of(client.get("/v2/nothing/here"), 404)


def test_infer_only_takes_post(client: TestClient) -> None:
    assert client.get(f"/v2/models/{AND}/infer").status_code == 405


@pytest.mark.parametrize("body", [b"", b"{}", b'{"ready": false}', b'  {"ready": true} '])
def test_repository_index_lists_every_operator(client: TestClient, body: bytes) -> None:
    response = client.post("/v2/repository/index", content=body)
    assert response.status_code == 200, response.text
    assert response.json() == [
        {"name": op.name, "version": "1", "state": "READY"} for op in OPERATORS
    ]


def test_repository_index_while_not_ready(draining: TestClient) -> None:
    every = draining.post("/v2/repository/index").json()
    assert {e["state"] for e in every} == {"UNAVAILABLE"}
    assert all(e["reason"] == "server is not ready" for e in every)
    assert draining.post("/v2/repository/index", json={"ready": True}).json() == []


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b'{"ready": "yes"}', "ready: Input should be a valid boolean"),
        (b'{"ready": 1}', "ready: Input should be a valid boolean"),
        (b'{"readyy": true}', "readyy: Extra inputs are not permitted"),
        (b"[true]", "Input should be a valid dictionary"),
        (b'{"ready": tru', "malformed JSON"),
        (b'{"ready": NaN}', "NaN is not a JSON value"),
        (b"[[[[[[[[1]]]]]]]]", "nesting depth"),
    ],
)
def test_repository_index_refuses_a_bad_body(client: TestClient, body: bytes, words: str) -> None:
    assert words in error_of(client.post("/v2/repository/index", content=body), 400)


def test_repository_index_body_is_bounded(client: TestClient) -> None:
    response = client.post("/v2/repository/index", content=b" " * (65 << 10))
    assert "exceeds the limit" in error_of(response, 413)


def test_load_of_a_loaded_model_changes_nothing(client: TestClient) -> None:
    # The unload and load cycle itself: tests/api/test_model_states.py (on apps of its own,
    # since this module's app is shared).
    load = client.post(f"/v2/repository/models/{NOT}/load")
    assert (load.status_code, load.content) == (200, b"")
    assert client.get(f"/v2/models/{NOT}/ready").status_code == 200


@pytest.mark.parametrize("action", ["load", "unload"])
def test_load_and_unload_of_an_unknown_model_are_404(client: TestClient, action: str) -> None:
    response = client.post(f"/v2/repository/models/nope/{action}")
    assert "unknown model or operator 'nope'" in error_of(response, 404)
