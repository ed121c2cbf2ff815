"""KServe's own SDK (``kserve``: ``InferenceRESTClient`` and ``InferenceGRPCClient``, unchanged)
against a live tensorbits server, each check's outcome printed as one JSON object on stdout for
``test_kserve.py`` to judge.

A child interpreter runs this, never the test process: KServe's generated protobuf messages and
tritonclient's share their names (package ``inference``), and protobuf keeps one pool of message
names per process, so the second of the two to be imported fails.

    python kserve_checks.py <http base URL> <gRPC host:port>
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig  # type: ignore[import-untyped]  # no type hints
from kserve.protocol.infer_type import InferResponse, RequestedOutput  # type: ignore[import-untyped]

NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
AND = "onnx.BitwiseAnd-18"
X = np.array([[0, 1, 127], [128, 254, 255]], dtype=np.uint8)
A = np.arange(6, dtype=np.int32).reshape(2, 3) * 1000
B = np.full((2, 3), 0x0F0F, dtype=np.int32)


def _input(name: str, array: np.ndarray[Any, Any], binary: bool) -> InferInput:
    tensor = InferInput(name, list(array.shape), _DATATYPES[array.dtype.name])
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


_DATATYPES = {"uint8": "UINT8", "int32": "INT32"}


def _answer(response: InferResponse) -> dict[str, Any]:
    """What the SDK made of a response: the model, the id, each output as it decoded it."""
    return {
        "model_name": response.model_name,
        "id": response.id,
        "outputs": {
            output.name: {
                "datatype": output.datatype,
                "shape": list(output.shape),
                "values": output.as_numpy().tolist(),
            }
            for output in response.outputs
        },
    }


async def rest_checks(base_url: str) -> dict[str, Callable[[], Awaitable[Any]]]:
    client = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=30))

    async def infer(request: InferRequest, model: str) -> Any:
        headers: dict[str, str] = {}
        answer = _answer(await client.infer(base_url, request, model, response_headers=headers))
        # Binary outputs follow a JSON header of this many bytes; an all-JSON answer has none.
        answer["binary_output"] = "inference-header-content-length" in headers
        return answer

    async def json_inference() -> Any:
        request = InferRequest(NOT, [_input("InputTensor", X, binary=False)], request_id="json-1")
        return await infer(request, NOT)

    async def binary_inference() -> Any:
        request = InferRequest(
            AND,
            [_input("A", A, binary=True), _input("B", B, binary=True)],
            request_id="binary-1",
            request_outputs=[RequestedOutput("C", {"binary_data": True})],
        )
        return await infer(request, AND)

    async def another_model_in_the_body() -> Any:
        request = InferRequest(AND, [_input("InputTensor", X, binary=False)])
        try:
            await client.infer(base_url, request, model_name=NOT)
        except httpx.HTTPStatusError as exc:
            return {"status": exc.response.status_code, "body": exc.response.json()}
        return "answered"

    return {
        "rest_server_live": lambda: client.is_server_live(base_url),
        "rest_server_ready": lambda: client.is_server_ready(base_url),
        "rest_model_ready": lambda: client.is_model_ready(base_url, NOT),
        "rest_json_inference": json_inference,
        "rest_binary_inference": binary_inference,
        "rest_another_model_in_the_body": another_model_in_the_body,
    }


async def grpc_checks(grpc_url: str) -> dict[str, Callable[[], Awaitable[Any]]]:
    client = InferenceGRPCClient(grpc_url, timeout=30)

    async def raw_inference() -> Any:
        # set_data_from_numpy's binary form: raw_input_contents (binary_data_size beside them).
        request = InferRequest(
            AND, [_input("A", A, binary=True), _input("B", B, binary=True)], request_id="grpc-1"
        )
        return _answer(await client.infer(request))

    async def typed_inference() -> Any:
        # The JSON form's values go as typed contents over gRPC.
        request = InferRequest(NOT, [_input("InputTensor", X, binary=False)], request_id="grpc-2")
        return _answer(await client.infer(request))

    return {
        "grpc_server_live": client.is_server_live,
        "grpc_server_ready": client.is_server_ready,
        "grpc_model_ready": lambda: client.is_model_ready(NOT),
        "grpc_raw_inference": raw_inference,
        "grpc_typed_inference": typed_inference,
    }


async def main(base_url: str, grpc_url: str) -> dict[str, Any]:
    outcomes: dict[str, Any] = {}
    checks = {**await rest_checks(base_url), **await grpc_checks(grpc_url)}
    for name, check in checks.items():
        try:
            outcomes[name] = {"value": await check()}
        except Exception:
            outcomes[name] = {"error": traceback.format_exc(limit=4)}
    return outcomes


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))))
