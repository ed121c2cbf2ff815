"""A model load is admitted as an inference is, over both protocols: for what it sends, then for
the copies its decoding makes (``model_lifecycle.LOAD_COPIES`` times), refused with 413 when no
idle server could hold that and 503 while the server is too busy; nothing is loaded then, and
the grant is given back whatever the answer."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np
import pytest
from core.graph_models import chain_model
from support.inprocess import app_client, runtime_of
from tritonclient.grpc import service_pb2

from tensorbits.grpc.service import InferenceService
from tensorbits.model_lifecycle import LOAD_COPIES
from tensorbits_protocol.errors import Overloaded, PayloadTooLarge

MiB = 1 << 20
MODEL = chain_model(np.dtype(np.uint8))
CONFIG = json.dumps({"backend": "onnxruntime"})
# The smallest server that still takes a whole body: in flight, at least one body's bytes.
BOUND = 2 * MiB


def _small_server() -> Any:
    return app_client(max_body_bytes=BOUND, max_inflight_bytes=BOUND)


def _http_body(padding: int = 0) -> bytes:
    document = {
        "parameters": {
            "config": CONFIG + " " * padding,  # JSON whitespace: the same configuration
            "file:1/model.onnx": base64.b64encode(MODEL).decode(),
        }
    }
    return json.dumps(document).encode()


def _grpc_message(padding: int = 0) -> bytes:
    request = service_pb2.RepositoryModelLoadRequest(model_name="chain")
    request.parameters["config"].string_param = CONFIG + " " * padding
    request.parameters["file:1/model.onnx"].bytes_param = MODEL
    data: bytes = request.SerializeToString()
    return data


def test_a_load_within_the_bound_loads_and_gives_its_grant_back() -> None:
    with _small_server() as client:
        runtime = runtime_of(client)
        answer = client.post("/v2/repository/models/chain/load", content=_http_body())
        assert answer.status_code == 200, answer.text
        assert runtime.plane.graphs.get("chain") is not None
        assert runtime.plane.admission.bytes_in_flight == 0
        assert runtime.plane.admission.requests_in_flight == 0


def test_a_load_no_idle_server_could_hold_is_413_over_http() -> None:
    # A body of about 0.8 MiB: sent whole, but three copies of it are past the 2 MiB bound.
    body = _http_body(padding=int(0.8 * MiB))
    assert len(body) * LOAD_COPIES > BOUND > len(body)
    with _small_server() as client:
        runtime = runtime_of(client)
        answer = client.post("/v2/repository/models/chain/load", content=body)
        assert answer.status_code == 413, answer.text
        error = answer.json()
        assert error["rule"] == "max_inflight_bytes"
        assert "model load needs" in error["error"]
        assert runtime.plane.graphs.get("chain") is None
        assert runtime.plane.admission.bytes_in_flight == 0


def test_a_load_is_503_while_the_server_is_busy_over_http() -> None:
    with _small_server() as client:
        runtime = runtime_of(client)
        held = runtime.plane.admission.acquire(2 * MiB)  # another request holds every byte
        try:
            answer = client.post("/v2/repository/models/chain/load", content=_http_body())
        finally:
            held.release()
        assert answer.status_code == 503, answer.text
        assert runtime.plane.graphs.get("chain") is None
        assert runtime.plane.admission.bytes_in_flight == 0


def test_grpc_loads_are_admitted_alike() -> None:
    with _small_server() as client:
        runtime = runtime_of(client)
        service = InferenceService(runtime)
        big = _grpc_message(padding=int(0.8 * MiB))
        with pytest.raises(PayloadTooLarge) as caught:
            asyncio.run(service.repository_model_load(big))
        assert caught.value.rule == "max_inflight_bytes"
        held = runtime.plane.admission.acquire(2 * MiB)
        try:
            with pytest.raises(Overloaded):
                asyncio.run(service.repository_model_load(_grpc_message()))
        finally:
            held.release()
        assert runtime.plane.graphs.get("chain") is None
        asyncio.run(service.repository_model_load(_grpc_message()))
        assert runtime.plane.graphs.get("chain") is not None
        assert runtime.plane.admission.bytes_in_flight == 0
