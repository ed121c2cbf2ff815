"""Helpers for the v2 tests: an in-process client, and request bodies built by hand (JSON or the
binary tensor data extension), so every byte the server sees is the test's choice."""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
from httpx import Response

from support.framing import HEADER, framed
from support.inprocess import TestClient, app_client
from support.rawhttp import request
from tensorbits.runtime import Drain
from tensorbits_protocol.dtypes import from_numpy
from tensorbits_protocol.operators import Function, OperatorSpec

NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
AND = "onnx.BitwiseAnd-18"
SHIFTS = (Function.SHIFT, Function.SHIFT_LEFT, Function.SHIFT_RIGHT)


def uint8_inputs(
    op: OperatorSpec, rng: np.random.Generator, shape: tuple[int, ...] = (2, 3)
) -> tuple[dict[str, np.ndarray[Any, Any]], dict[str, str]]:
    """Random UINT8 inputs every operator takes (shift counts below 10), and the parameters it
    needs (onnx.BitShift's direction): one valid call of any model."""
    arrays = {name: rng.integers(0, 256, size=shape, dtype=np.uint8) for name in op.inputs}
    if op.function in SHIFTS:
        arrays[op.inputs[1]] = rng.integers(0, 10, size=shape, dtype=np.uint8)
    return arrays, ({"direction": "LEFT"} if op.function is Function.SHIFT else {})


def v2_client(drain: Drain | None = None, **settings: Any) -> AbstractContextManager[TestClient]:
    """``app_client`` as the v2 tests use it: an exception the app lets out is a 500 answer."""
    return app_client(drain=drain, raise_server_exceptions=False, **settings)


def json_input(name: str, array: np.ndarray[Any, Any], nested: bool = False) -> dict[str, Any]:
    data = array.tolist() if nested else array.reshape(-1).tolist()
    return {
        "name": name,
        "shape": list(array.shape),
        "datatype": str(from_numpy(array.dtype)),
        "data": data,
    }


def binary_input(name: str, array: np.ndarray[Any, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "shape": list(array.shape),
        "datatype": str(from_numpy(array.dtype)),
        "parameters": {"binary_data_size": array.nbytes},
    }


def statistics_counts(entry: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """A model's entry of the statistics extension, as the counts a request moves: successes,
    failures, inferences and executions."""
    stats = entry["inference_stats"]
    return (
        stats["success"]["count"],
        stats["fail"]["count"],
        entry["inference_count"],
        entry["execution_count"],
    )


def bit_not_request(data: np.ndarray[Any, Any]) -> bytes:
    """A whole HTTP/1.1 request (head and body) for NOT of ``data``, written by hand for a live
    server's socket: the input and the output as binary data."""
    header = {
        "inputs": [binary_input("InputTensor", data)],
        "parameters": {"binary_data_output": True},
    }
    body, headers = framed(header, data.tobytes())
    return request("POST", f"/v2/models/{NOT}/infer", headers, body)


def assert_bit_not(reply: tuple[int, dict[str, str], bytes], data: np.ndarray[Any, Any]) -> None:
    """``reply`` (status, headers, body) to a ``bit_not_request`` for ``data`` is a 200 whose
    binary output is NOT of every element."""
    status, headers, body = reply
    assert status == 200, (headers, body[:300])
    offset = int(headers["inference-header-content-length"])
    np.testing.assert_array_equal(np.frombuffer(body[offset:], data.dtype), ~data)


def infer_binary(
    client: TestClient,
    model: str,
    arrays: Mapping[str, np.ndarray[Any, Any]],
    parameters: Mapping[str, Any] | None = None,
    *,
    binary_output: bool = True,
) -> Response:
    """Every input as binary data, the output as asked."""
    header: dict[str, Any] = {
        "inputs": [binary_input(n, a) for n, a in arrays.items()],
        "parameters": {**(parameters or {}), "binary_data_output": binary_output},
    }
    body, headers = framed(header, *(a.tobytes() for a in arrays.values()))
    response: Response = client.post(f"/v2/models/{model}/infer", content=body, headers=headers)
    return response


def infer_json(
    client: TestClient,
    model: str,
    arrays: Mapping[str, np.ndarray[Any, Any]],
    parameters: Mapping[str, Any] | None = None,
    **extra: Any,
) -> Response:
    header: dict[str, Any] = {"inputs": [json_input(n, a) for n, a in arrays.items()], **extra}
    if parameters:
        header["parameters"] = dict(parameters)
    response: Response = client.post(
        f"/v2/models/{model}/infer", content=json.dumps(header).encode()
    )
    return response


def output_array(response: Response, index: int = 0) -> np.ndarray[Any, Any]:
    """An output of a 200 response as an array, from binary data or JSON ``data``."""
    assert response.status_code == 200, response.text
    length = response.headers.get(HEADER)
    body = response.content
    header = json.loads(body[: int(length)] if length is not None else body)
    output = header["outputs"][index]
    dtype = np.dtype(_NUMPY[output["datatype"]]).newbyteorder("<")
    if length is None:
        return np.array(output["data"], dtype=dtype).reshape(output["shape"])
    start = int(length) + sum(
        o["parameters"]["binary_data_size"] for o in header["outputs"][:index]
    )
    size = output["parameters"]["binary_data_size"]
    return np.frombuffer(body[start : start + size], dtype=dtype).reshape(output["shape"])


def error_of(response: Response, status: int) -> str:
    """The ``error`` message of a failed response, after checking its status and shape."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert isinstance(body["error"], str)
    message: str = body["error"]
    return message


_NUMPY = {
    "BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32",
    "UINT64": "uint64", "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64",
    "FP16": "float16", "FP32": "float32", "FP64": "float64",
}  # fmt: skip
