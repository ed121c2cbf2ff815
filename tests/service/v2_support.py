"""Helpers for the v2 tests: an in-process client, and request bodies built by hand (JSON or the
binary tensor data extension), so every byte the server sees is the test's choice."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
from httpx import Response
from starlette.exceptions import StarletteDeprecationWarning

with warnings.catch_warnings():
    # Starlette 1.x asks for httpx2 under its TestClient; the workspace pins httpx 0.28, which
    # works. Import it once here with that one warning silenced.
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from fastapi.testclient import TestClient

from tensorbits.app import create_app
from tensorbits.config import Settings
from tensorbits.runtime import Drain
from tensorbits_protocol.dtypes import from_numpy

HEADER = "Inference-Header-Content-Length"
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
AND = "onnx.BitwiseAnd-18"

__all__ = ["AND", "HEADER", "NOT", "TestClient"]


@contextmanager
def v2_client(drain: Drain | None = None, **settings: Any) -> Iterator[TestClient]:
    """A TestClient on an app with the NumPy backend (lifespan run) and the given settings;
    ``drain``: the server's, as ``create_app`` takes it."""
    app = create_app(Settings(backend="numpy", cpu_threads=2, **settings), drain=drain)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


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


def framed(header: Mapping[str, Any], *buffers: bytes) -> tuple[bytes, dict[str, str]]:
    """A binary-extension body and its headers: JSON, then the buffers as given."""
    head = json.dumps(header).encode()
    return head + b"".join(buffers), {HEADER: str(len(head))}


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
    return client.post(f"/v2/models/{model}/infer", content=body, headers=headers)


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
    return client.post(f"/v2/models/{model}/infer", content=json.dumps(header).encode())


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
