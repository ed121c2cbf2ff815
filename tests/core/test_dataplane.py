"""The data plane as both front ends share it: one cache of planned inferences whose entries are
one kind (``PlanTemplate``) under one budget, and one repository index, answered alike over
HTTP and gRPC by the same server."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from core.bitref import assert_bits_equal
from support.framing import HEADER, framed
from support.inprocess import TestClient
from support.v2 import NOT, binary_input, output_array, v2_client
from tritonclient.grpc import service_pb2

from tensorbits.api import rest_infer
from tensorbits.core.header_cache import ENTRY_BYTES, HeaderCache
from tensorbits.core.plan import PlanTemplate
from tensorbits.grpc import inference_pb2 as pb
from tensorbits.grpc import service, wire
from tensorbits.grpc.service import InferenceService
from tensorbits.runtime import Runtime


def _runtime(client: TestClient) -> Runtime:
    runtime: Runtime = client.app.state.runtime  # type: ignore[attr-defined]
    return runtime


def _grpc_request(x: np.ndarray[Any, Any]) -> bytes:
    request = service_pb2.ModelInferRequest(model_name=NOT, id="same-every-time")
    request.inputs.add(name="InputTensor", datatype="UINT8", shape=list(x.shape))
    request.raw_input_contents.append(x.tobytes())
    data: bytes = request.SerializeToString()
    return data


def _grpc_output(answer: bytes) -> np.ndarray[Any, Any]:
    response = pb.ModelInferResponse.FromString(answer)
    return np.frombuffer(response.raw_output_contents[0], np.uint8)


def test_both_front_ends_keep_one_kind_of_plan_in_one_cache() -> None:
    # Each front end keys its own wire form (a JSON header, a message without its raw
    # contents): the same request sent over both is two entries, of one kind, in one budget,
    # each deciding the same run.
    rng = np.random.default_rng(11)
    shaped = np.zeros(8, np.uint8)  # the inputs' type and shape: their bytes vary
    http_header = {
        "id": "same-every-time",
        "inputs": [binary_input("InputTensor", shaped)],
        "parameters": {"binary_data_output": True},  # as gRPC answers: raw bytes
    }
    with v2_client() as client:
        runtime = _runtime(client)
        grpc = InferenceService(runtime)
        cache = runtime.plane.plans
        assert isinstance(cache, HeaderCache)
        for _ in range(3):  # planned once, then from each front end's entry
            x = rng.integers(0, 256, 8, dtype=np.uint8)
            body, headers = framed(http_header, x.tobytes())
            response = client.post(f"/v2/models/{NOT}/infer", content=body, headers=headers)
            assert_bits_equal(output_array(response), ~x)
            assert_bits_equal(_grpc_output(asyncio.run(grpc.model_infer(_grpc_request(x)))), ~x)
            assert len(cache) == 2
        head = body[: int(headers[HEADER])]
        split = wire.split_infer_request(_grpc_request(x), grpc.wire_limits)
        over_http = cache.get((rest_infer.CACHE_TAG, NOT, None, head, 8))
        over_grpc = cache.get((service.CACHE_TAG, split.message, (8,)))
        assert type(over_http) is PlanTemplate
        assert type(over_grpc) is PlanTemplate
        decided = ("op", "call", "request_id", "output_nbytes", "held_bytes", "work_bytes")
        for name in decided:
            assert getattr(over_http, name) == getattr(over_grpc, name), name
        # Each answers its own wire form: HTTP's JSON header, gRPC's serialized head.
        assert over_http.response_head != over_grpc.response_head
        assert cache.held == len(head) + len(split.message) + 2 * ENTRY_BYTES


def _http_index(client: TestClient, ready: bool) -> list[tuple[str, str, str, str]]:
    response = client.post("/v2/repository/index", json={"ready": ready})
    assert response.status_code == 200, response.text
    return [
        (entry["name"], entry["version"], entry["state"], entry.get("reason", ""))
        for entry in response.json()
    ]


def _grpc_index(grpc: InferenceService, ready: bool) -> list[tuple[str, str, str, str]]:
    request = pb.RepositoryIndexRequest(ready=ready).SerializeToString()
    response = pb.RepositoryIndexResponse.FromString(asyncio.run(grpc.repository_index(request)))
    return [(m.name, m.version, m.state, m.reason) for m in response.models]


def test_the_repository_index_is_the_same_over_both_protocols() -> None:
    with v2_client() as client:
        runtime = _runtime(client)
        grpc = InferenceService(runtime)
        runtime.plane.models.unload(NOT)  # one model UNAVAILABLE, with its reason
        for ready in (False, True):
            listed = _http_index(client, ready)
            assert listed == _grpc_index(grpc, ready)
            assert ((NOT, "1", "UNAVAILABLE", "unloaded") in listed) is not ready
        runtime.drain.begin()  # not ready: every model UNAVAILABLE, for the same reason
        listed = _http_index(client, False)
        assert listed == _grpc_index(grpc, False)
        assert {(state, reason) for _, _, state, reason in listed} == {
            ("UNAVAILABLE", "server is not ready")
        }
        assert _http_index(client, True) == _grpc_index(grpc, True) == []
