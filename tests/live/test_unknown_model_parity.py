"""A model name the server does not serve is refused alike over HTTP and gRPC (404, NOT_FOUND):
the count of what exists takes in the graph models loaded, the closest name may be one of them,
and a graph model that was unloaded is told apart from a name never served, with the way back.

Its own server: the models it loads and unloads change what the shared server's refusals count."""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import pytest
from core.graph_models import chain_model
from support.grpc_live import serve_grpc
from support.repository_load import http_load, load_parameters
from support.wires import TIMEOUT_S, Form, Refused, Request, Tensor, Wires

from tensorbits.grpc import inference_pb2 as pb
from tensorbits_protocol.errors import OperatorNotFound
from tensorbits_protocol.operators import REGISTRY

pytestmark = pytest.mark.integration

GRAPH = "xor_shift_not"
CONFIG = json.dumps({"backend": "onnxruntime"})
X = np.arange(4, dtype=np.uint8)


@pytest.fixture(scope="module")
def wires() -> Iterator[Wires]:
    with (
        serve_grpc() as server,
        httpx.Client(base_url=server.http.base_url, timeout=TIMEOUT_S) as http,
        grpc.insecure_channel(server.grpc_url) as channel,
    ):
        yield Wires(http, channel)


def load(wires: Wires, name: str) -> None:
    parameters = load_parameters(CONFIG, {"file:1/model.onnx": chain_model(np.dtype(np.uint8))})
    assert http_load(str(wires.http.base_url).rstrip("/"), name, parameters) == (200, {})


def refusals(wires: Wires, model: str) -> list[Refused]:
    """The refusal of an inference and of a metadata query of ``model``, over each protocol."""
    request = Request(model, (Tensor("x", X), Tensor("y", X)))
    metadata = wires.grpc_outcome(
        lambda: wires.call(
            "ModelMetadata", pb.ModelMetadataRequest(name=model), pb.ModelMetadataResponse
        )
    )
    found = [
        wires.infer(request, Form.HTTP_JSON),
        wires.infer(request, Form.GRPC_TYPED),
        wires.http_refused(wires.http.get(f"/v2/models/{model}")),
        metadata,
    ]
    assert all(isinstance(refused, Refused) for refused in found), found
    return [r for r in found if isinstance(r, Refused)]


def test_the_count_and_the_suggestion_take_in_the_graph_models(wires: Wires) -> None:
    before = refusals(wires, "zzzz")
    load(wires, GRAPH)
    after = refusals(wires, "zzzz")
    close = refusals(wires, GRAPH[:-1])
    for refused in before:
        assert (refused.error, refused.rule) == (OperatorNotFound, "unknown_operator")
        assert f"lists the {len(REGISTRY)} that exist" in refused.message
    for refused in after:
        assert f"lists the {len(REGISTRY) + 1} that exist" in refused.message
    for refused in close:
        assert refused.message.endswith(f"; did you mean '{GRAPH}'?")
    assert len({*before}) == len({*after}) == len({*close}) == 1  # the same on every path


def test_an_unloaded_graph_model_is_told_apart_with_the_way_back(wires: Wires) -> None:
    load(wires, "unloaded_graph")
    assert wires.http.post("/v2/repository/models/unloaded_graph/unload").status_code == 200
    found = refusals(wires, "unloaded_graph")
    assert len(set(found)) == 1, found  # the same on every path
    refused = found[0]
    assert (refused.error, refused.field, refused.rule) == (
        OperatorNotFound,
        "model_name",
        "model_unloaded",
    )
    assert refused.message.startswith("model 'unloaded_graph' was unloaded")
    assert "POST /v2/repository/models/unloaded_graph/load" in refused.message
    # Loaded again, it is served again.
    load(wires, "unloaded_graph")
    request = Request("unloaded_graph", (Tensor("x", X), Tensor("y", X)))
    assert not isinstance(wires.infer(request, Form.GRPC_TYPED), Refused)
