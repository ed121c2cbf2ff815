"""``Client.statistics`` / ``Client.model_config`` and their async twins, offline: the paths they
ask, the typed models they return (the server's own documents read back), and what a body that
is not one becomes."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fake_server import FakeServer

from tensorbits import model_info
from tensorbits.core.statistics import Statistics
from tensorbits_client import APIResponseValidationError, NotFoundError
from tensorbits_client.types import ModelConfigResponse, ModelStatisticsResponse
from tensorbits_protocol.operators import OPERATORS, get_operator

NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
SHIFT = "onnx.BitShift-11"


STATS = Statistics()
STATS.record(NOT, 0, 10, 20, 30, 70)


def _server_documents(request: httpx.Request) -> httpx.Response:
    """What the server answers on the two routes, from its own builders."""
    path = request.url.raw_path.decode()
    stats = STATS
    if path == "/v2/models/stats":
        return httpx.Response(200, json=stats.response(OPERATORS))
    _, _, _, quoted, what = path.split("/")
    model = httpx.URL("http://x/" + quoted).path[1:]
    if what == "stats":
        return httpx.Response(200, json=stats.response([get_operator(model)]))
    return httpx.Response(200, json=model_info.model_config(get_operator(model)))


def _both(server: FakeServer, method: str, *args: Any) -> tuple[Any, Any]:
    with server.client() as client:
        sync = getattr(client, method)(*args)

    async def run() -> Any:
        async with server.async_client() as client:
            return await getattr(client, method)(*args)

    return sync, asyncio.run(run())


def test_statistics_of_every_model() -> None:
    server = FakeServer(_server_documents)
    sync, async_ = _both(server, "statistics")
    assert isinstance(sync, ModelStatisticsResponse)
    assert sync == async_
    assert [s.name for s in sync.model_stats] == [op.name for op in OPERATORS]
    entry = next(s for s in sync.model_stats if s.name == NOT)
    assert entry.inference_stats.success.count == 1
    assert entry.inference_stats.compute_infer.ns == 20
    assert [r.url.path for r in server.requests] == ["/v2/models/stats"] * 2


def test_statistics_of_one_model() -> None:
    server = FakeServer(_server_documents)
    sync, async_ = _both(server, "statistics", NOT)
    assert sync == async_
    assert [s.name for s in sync.model_stats] == [NOT]
    assert server.requests[0].url.path == f"/v2/models/{NOT}/stats"


def test_model_config_is_typed_and_names_the_parameters() -> None:
    server = FakeServer(_server_documents)
    sync, async_ = _both(server, "model_config", SHIFT)
    assert isinstance(sync, ModelConfigResponse)
    assert sync == async_
    assert sync.name == SHIFT
    assert [(t.name, t.data_type, t.dims) for t in sync.input] == [
        ("X", "TYPE_UINT8", [-1]),
        ("Y", "TYPE_UINT8", [-1]),
    ]
    assert sync.parameters["parameter.direction.choices"].string_value == "LEFT,RIGHT"
    assert sync.parameters["parameter.direction.required"].string_value == "true"


def test_a_model_name_is_quoted_in_the_path() -> None:
    server = FakeServer(lambda request: httpx.Response(404, json={"error": "unknown model"}))
    with server.client() as client, pytest.raises(NotFoundError):
        client.model_config("a/b c")
    assert server.requests[0].url.raw_path == b"/v2/models/a%2Fb%20c/config"


def test_a_body_that_is_no_statistics_is_a_response_validation_error() -> None:
    server = FakeServer(lambda request: httpx.Response(200, json={"model_stats": [{"x": 1}]}))
    with server.client() as client, pytest.raises(APIResponseValidationError):
        client.statistics()
