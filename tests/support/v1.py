"""Helpers for the /v1 tests: build a framed batch request, post it, split the framed response."""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
from httpx import Response

from support.framing import HEADER, framed
from support.inprocess import TestClient, app_client
from tensorbits.config.settings import Settings
from tensorbits.core.backends import Backend
from tensorbits.core.batch import BatchLimits, plan_rest, run_batch


def v1_client(**settings: Any) -> AbstractContextManager[TestClient]:
    """``app_client`` as the /v1 tests use it: an exception the app lets out fails the test."""
    return app_client(**settings)


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


def post(client: TestClient, header: dict[str, Any], payload: bytes = b"") -> Response:
    body, headers = framed(header, payload, binary=True)
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


def rich_batch(rng: np.random.Generator) -> tuple[dict[str, Any], bytes]:
    """Every kind of binding: packed at offsets, in place, a size-1 dimension with an odd stride,
    padded, transposed and broadcast views, other data types, and a chain through a buffer."""
    a = rng.integers(0, 256, 512, dtype=np.uint8)
    b = rng.integers(0, 256, 512, dtype=np.uint8)
    flags = rng.integers(0, 2, 64, dtype=np.uint8)  # BOOL elements are bytes 0 or 1
    return batch(
        [data("a", a), data("b", b), data("flags", flags), zeros("z", 1024)],
        [
            dispatch(
                "BIT_XOR",
                ATensor=bind("a", "UINT32", [4, 4], offset=16),
                BTensor=bind("b", "UINT32", [4, 4], offset=32),
                OutputTensor=bind("z", "UINT32", [4, 4]),
            ),
            dispatch(
                "BIT_OR",
                ATensor=bind("a", "UINT64", [8], offset=128),
                BTensor=bind("b", "UINT64", [8], offset=128),
                OutputTensor=bind("a", "UINT64", [8], offset=128),
            ),
            dispatch(
                "BIT_NOT",
                InputTensor=bind("a", "UINT16", [2, 1, 8], offset=256, strides=[8, 999, 1]),
                OutputTensor=bind("z", "UINT16", [2, 1, 8], offset=64, strides=[8, 999, 1]),
            ),
            dispatch(
                "BIT_AND",
                ATensor=bind("a", "INT16", [3, 4], strides=[8, 1]),
                BTensor=bind("b", "INT16", [3, 4], offset=320),
                OutputTensor=bind("z", "INT16", [3, 4], offset=128, strides=[8, 1]),
            ),
            dispatch(
                "BIT_XOR",
                ATensor=bind("a", "UINT8", [4, 16], offset=384),
                BTensor=bind("b", "UINT8", [4, 16], offset=448, strides=[0, 1]),
                OutputTensor=bind("z", "UINT8", [4, 16], offset=256),
            ),
            dispatch(
                "BIT_COUNT",
                {"output_datatype": "UINT32"},
                InputTensor=bind("b", "FP16", [4, 4], strides=[1, 4]),
                OutputTensor=bind("z", "UINT32", [4, 4], offset=320),
            ),
            dispatch(  # reads what the first dispatch wrote, in place
                "BIT_SHIFT_LEFT",
                ATensor=bind("z", "UINT32", [16]),
                BTensor=bind("b", "UINT32", [16], offset=480, strides=[0]),
                OutputTensor=bind("z", "UINT32", [16]),
            ),
            dispatch(
                "openvino.BitwiseXor-13",
                input_1=bind("flags", "BOOL", [4, 16]),
                input_2=bind("flags", "BOOL", [1, 16], offset=48),
                output_1=bind("z", "BOOL", [4, 16], offset=512),
            ),
            dispatch(
                "onnx.BitShift-11",
                {"direction": "RIGHT"},
                X=bind("b", "UINT64", [2, 2, 2], offset=64),
                Y=bind("a", "UINT64", [2, 2, 2], offset=192, strides=[0, 0, 1]),
                Z=bind("z", "UINT64", [2, 2, 2], offset=576),
            ),
        ],
        ["a", "b", "z"],
    )


def run_planned(header: dict[str, Any], payload: bytes, backend: Backend) -> bytes:
    """A batch planned and run in process on ``backend``: its output buffers' bytes, joined."""
    body, headers = framed(header, payload, binary=True)
    request = bytearray(body)
    settings = Settings(backend="numpy")
    plan = plan_rest(request, int(headers[HEADER]), BatchLimits.of(settings.core_limits))
    sinks = [bytearray(plan.buffers[i].byte_size) for i in plan.outputs]
    run_batch(plan, request, backend, [memoryview(s) for s in sinks])
    return b"".join(sinks)
