"""The shared-memory extension is off unless switched on: every route of it and every
shared-memory tensor parameter is a 400 that says how to turn it on, over HTTP and gRPC, and
``GET /v2`` does not list it. Switched on, it needs one worker (regions live in one process)."""

from __future__ import annotations

import grpc
import pytest
from httpx import Response
from pydantic import ValidationError
from support.inprocess import app_client
from support.live import free_port
from tritonclient.grpc import service_pb2

from tensorbits.config.settings import Settings

NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
WORDS = "Client shared memory is disabled on this server"
SHARED = {"shared_memory_region": "r", "shared_memory_byte_size": 4}


def _refused(response: Response) -> None:
    assert response.status_code == 400
    body = response.json()
    assert WORDS in body["error"]
    assert body["rule"] == "shared_memory"


def test_every_route_and_parameter_is_refused() -> None:
    with app_client() as client:
        assert "system_shared_memory" not in client.get("/v2").json()["extensions"]
        _refused(client.get("/v2/systemsharedmemory/status"))
        _refused(client.get("/v2/systemsharedmemory/region/r/status"))
        _refused(client.post("/v2/systemsharedmemory/region/r/register", json={"key": "/x"}))
        _refused(client.post("/v2/systemsharedmemory/region/r/unregister"))
        _refused(client.post("/v2/systemsharedmemory/unregister"))
        _refused(client.get("/v2/cudasharedmemory/status"))
        _refused(client.post("/v2/cudasharedmemory/region/r/register", json={}))
        _refused(client.post("/v2/cudasharedmemory/unregister"))
        tensor = {"name": "InputTensor", "shape": [4], "datatype": "UINT8"}
        _refused(
            client.post(
                f"/v2/models/{NOT}/infer", json={"inputs": [{**tensor, "parameters": SHARED}]}
            )
        )
        _refused(
            client.post(
                f"/v2/models/{NOT}/infer",
                json={
                    "inputs": [{**tensor, "data": [1, 2, 3, 4]}],
                    "outputs": [{"name": "OutputTensor", "parameters": SHARED}],
                },
            )
        )


def test_grpc_refuses_too() -> None:
    port = free_port()
    with app_client(grpc_port=port), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        register: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            "/inference.GRPCInferenceService/SystemSharedMemoryRegister"
        )
        request = service_pb2.SystemSharedMemoryRegisterRequest(name="r", key="/x", byte_size=8)
        with pytest.raises(grpc.RpcError) as caught:
            register(request.SerializeToString(), timeout=10)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert WORDS in str(caught.value.details())
        infer = service_pb2.ModelInferRequest(model_name=NOT)
        tensor = infer.inputs.add(name="InputTensor", datatype="UINT8", shape=[4])
        tensor.parameters["shared_memory_region"].string_param = "r"
        tensor.parameters["shared_memory_byte_size"].int64_param = 4
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer"
        )
        with pytest.raises(grpc.RpcError) as caught:
            call(infer.SerializeToString(), timeout=10)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert WORDS in str(caught.value.details())


def test_switched_on_it_needs_one_worker() -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(shared_memory=True, workers=2)
    assert "shared_memory needs workers 1" in str(caught.value)
    with pytest.raises(ValidationError):
        Settings(shared_memory=True, shared_memory_prefix="no/slash")
