"""Helpers for the /v1 tests: build a framed batch request, post it, split the framed response."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from httpx import Response
from starlette.exceptions import StarletteDeprecationWarning

with warnings.catch_warnings():
    # Starlette 1.x asks for httpx2 under its TestClient; the workspace pins httpx 0.28, which
    # works. Import it here, once, with that one warning silenced (test modules import it from us).
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from fastapi.testclient import TestClient

from tensorbits.app import create_app
from tensorbits.config import Settings

HEADER = "Inference-Header-Content-Length"

__all__ = ["HEADER", "TestClient"]


@contextmanager
def v1_client(**settings: Any) -> Iterator[TestClient]:
    """A TestClient on an app with the NumPy backend (lifespan run) and the given settings."""
    with TestClient(create_app(Settings(backend="numpy", cpu_threads=2, **settings))) as client:
        yield client


def desc(datatype: str, sizes: list[int], **extra: Any) -> dict[str, Any]:
    return {"datatype": datatype, "sizes": sizes, **extra}


def bind(
    buffer: str, datatype: str, sizes: list[int], offset: int = 0, **extra: Any
) -> dict[str, Any]:
    """A binding; ``extra`` goes into the desc, except ``size`` which is the binding's."""
    binding: dict[str, Any] = {"buffer": buffer, "offset": offset}
    if "size" in extra:
        binding["size"] = extra.pop("size")
    binding["desc"] = desc(datatype, sizes, **extra)
    return binding


def data(
    name: str, array: np.ndarray[Any, Any] | bytes, pad: int = 4
) -> tuple[dict[str, Any], bytes]:
    """A data buffer declaration and its bytes, zero-padded to a multiple of ``pad`` (DirectML
    rounds every TotalTensorSizeInBytes up to 4)."""
    raw = array if isinstance(array, bytes) else array.tobytes()
    raw += bytes(-len(raw) % pad)
    return {"name": name, "byte_size": len(raw)}, raw


def zeros(name: str, byte_size: int) -> dict[str, Any]:
    return {"name": name, "byte_size": byte_size, "init": "zeros"}


def frame(header: dict[str, Any], payload: bytes = b"") -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    return head + payload, {HEADER: str(len(head)), "Content-Type": "application/octet-stream"}


def post(client: TestClient, header: dict[str, Any], payload: bytes = b"") -> Response:
    body, headers = frame(header, payload)
    response: Response = client.post("/v1/batch", content=body, headers=headers)
    return response


def batch(
    buffers: list[tuple[dict[str, Any], bytes] | dict[str, Any]],
    dispatches: list[dict[str, Any]],
    outputs: list[str],
    **extra: Any,
) -> tuple[dict[str, Any], bytes]:
    """A header and its payload; ``buffers`` mixes data() pairs and zeros() declarations."""
    declared = [b[0] if isinstance(b, tuple) else b for b in buffers]
    payload = b"".join(b[1] for b in buffers if isinstance(b, tuple))
    return {"buffers": declared, "dispatches": dispatches, "outputs": outputs, **extra}, payload


def dispatch(
    operator: str, parameters: dict[str, Any] | None = None, **bindings: Any
) -> dict[str, Any]:
    full = (
        operator
        if "." in operator or operator.startswith("DML_")
        else f"DML_OPERATOR_ELEMENT_WISE_{operator}"
    )
    return {"operator": full, "parameters": parameters or {}, "bindings": bindings}


def outputs(response: Response) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The response's JSON header and each output buffer's bytes, checked against the framing."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    length = int(response.headers[HEADER])
    header = json.loads(response.content[:length])
    result: dict[str, bytes] = {}
    position = length
    for entry in header["outputs"]:
        result[entry["name"]] = response.content[position : position + entry["byte_size"]]
        position += entry["byte_size"]
    assert position == len(response.content)
    return header, result


def error(response: Response, status: int = 400) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    return body
