"""The model repository extension over real sockets, with the stock ``tritonclient.http``: unload
a model, see it not ready, UNAVAILABLE in the index and its inference refused with our words;
load it, and it is ready and infers again. A server of its own: the unload is that server's.
And a repository folder with one hostile entry of each kind (``support/hostile_repository.py``)
on two workers: each listed UNAVAILABLE with its reason, the same over HTTP and gRPC, and the
index, statistics, configuration and both metrics listeners answering, none with a 500."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
from core.graph_models import masked_model
from support.grpc_live import GrpcServer, serve_grpc
from support.hostile_repository import GOOD, LARGEST, REFUSED, hostile_repository
from support.live import free_port, serve
from support.rawhttp import ask, request
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.integration

NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
AND = "onnx.BitwiseAnd-18"
UNLOADED = (
    f"model '{NOT}' is unloaded (state UNAVAILABLE): load it again with "
    f"POST /v2/repository/models/{NOT}/load"
)
DATA = np.array([[0, 1, 0x0F, 0xFF]], dtype=np.uint8)


@pytest.fixture(scope="module")
def client() -> Iterator[triton.InferenceServerClient]:
    with serve() as server:
        c = triton.InferenceServerClient(server.url, network_timeout=30)
        yield c
        c.close()


def _infer_not(client: triton.InferenceServerClient, *, binary: bool) -> Any:
    tensor = triton.InferInput("InputTensor", list(DATA.shape), "UINT8")
    tensor.set_data_from_numpy(DATA, binary_data=binary)
    output = triton.InferRequestedOutput("OutputTensor", binary_data=binary)
    return client.infer(NOT, [tensor], outputs=[output])


def _states(client: triton.InferenceServerClient) -> dict[str, tuple[str, str | None]]:
    index: list[dict[str, str]] = client.get_model_repository_index()
    return {entry["name"]: (entry["state"], entry.get("reason")) for entry in index}


def test_unload_then_load_as_a_triton_client_sees_it(
    client: triton.InferenceServerClient,
) -> None:
    assert client.is_model_ready(NOT)

    client.unload_model(NOT)
    assert not client.is_model_ready(NOT)
    assert not client.is_model_ready(NOT, "1")
    assert client.is_model_ready(AND)
    assert client.is_server_ready()
    states = _states(client)
    assert states[NOT] == ("UNAVAILABLE", "unloaded")
    assert {state for name, state in states.items() if name != NOT} == {("READY", None)}
    for binary in (False, True):
        with pytest.raises(InferenceServerException) as refused:
            _infer_not(client, binary=binary)
        assert refused.value.message() == UNLOADED
        assert refused.value.status() == "400"

    client.load_model(NOT)
    assert client.is_model_ready(NOT)
    assert {state for state, _ in _states(client).values()} == {"READY"}
    for binary in (False, True):
        result = _infer_not(client, binary=binary)
        np.testing.assert_array_equal(result.as_numpy("OutputTensor"), ~DATA)


def test_unknown_model_load_and_unload_are_errors(client: triton.InferenceServerClient) -> None:
    for action in (client.load_model, client.unload_model):
        with pytest.raises(InferenceServerException) as refused:
            action("nope")
        assert refused.value.status() == "404"
        assert "unknown model or operator 'nope'" in str(refused.value.message())


def _entries(body: bytes) -> list[dict[str, Any]]:
    """The repository index's entries (a JSON list)."""
    entries: list[dict[str, Any]] = json.loads(body)
    return entries


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GrpcServer, int]]:
    """Two workers serving a repository folder with every hostile entry (and a metrics port)."""
    folder = tmp_path_factory.mktemp("hostile")
    root = hostile_repository(folder / "repository", folder / "outside", masked_model())
    metrics_port = free_port()
    env = {
        "TENSORBITS_WORKERS": "2",
        "TENSORBITS_MODEL_REPOSITORY": str(root),
        "TENSORBITS_METRICS_PORT": str(metrics_port),
    }
    with serve_grpc(env) as live:
        yield live, metrics_port


def test_a_hostile_repository_folder_is_listed_and_the_server_serves_on(
    hostile: tuple[GrpcServer, int],
) -> None:
    server, metrics_port = hostile
    reply = ask(server.http, request("POST", "/v2/repository/index", body=b"{}"))
    assert reply.status == 200, reply.body[:300]
    assert b"SECRET" not in reply.body
    assert b"PYTHONPATH" not in reply.body
    over_http = {e["name"]: (e["state"], e.get("reason", "")) for e in _entries(reply.body)}
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    try:
        listed = client.get_model_repository_index().models
        over_grpc = {m.name: (m.state, m.reason) for m in listed}
        assert over_grpc == over_http  # the same entries, states and reasons
        assert over_http[GOOD] == over_http[LARGEST] == ("READY", "")
        for name, rule in REFUSED.items():
            state, reason = over_http[name]
            assert state == "UNAVAILABLE"
            assert reason.startswith(f"failed to load '{name}': "), reason
            assert rule in reason, reason
        # The largest version a folder may have: served, and answered as an int64 everywhere.
        largest = str((1 << 63) - 1)
        assert client.get_model_config(LARGEST).config.name == LARGEST  # no INTERNAL
        assert list(client.get_model_metadata(LARGEST).versions) == [largest]
        (stats,) = client.get_inference_statistics(LARGEST).model_stats
        assert stats.version == largest
        assert client.get_inference_statistics().model_stats  # every model's, no INTERNAL
        assert client.is_model_ready(GOOD)
    finally:
        client.close()
    for path in ("/v2/models/stats", f"/v2/models/{GOOD}/stats", f"/v2/models/{LARGEST}/config"):
        assert ask(server.http, request("GET", path)).status == 200, path
    assert server.http.get("/metrics") == 200
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as scrape:
        assert scrape.status == 200
    # A refused entry is unloaded by its listed name, on every worker (an HTTP path's quoting).
    shown = next(name for name in REFUSED if name.startswith("bad"))
    target = f"/v2/repository/models/{quote(shown, safe='')}/unload"
    assert ask(server.http, request("POST", target)).status == 200
    after = _entries(ask(server.http, request("POST", "/v2/repository/index", body=b"{}")).body)
    assert shown not in {e["name"] for e in after}
