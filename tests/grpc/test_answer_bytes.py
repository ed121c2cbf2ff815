"""A large gRPC answer is written straight into the ``bytes`` grpcio sends
(``grpc/answer_bytes.py``): the same bytes as an answer built in a bytearray and copied, unary
and streamed, for every operator's output type and for answers on both sides of the threshold."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from tensorbits.config.settings import Settings
from tensorbits.grpc import answer_bytes
from tensorbits.grpc.service import InferenceService
from tensorbits.runtime import Runtime

NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
COUNT = "DML_OPERATOR_ELEMENT_WISE_BIT_COUNT"
RNG = np.random.default_rng(31)


@pytest.fixture(scope="module")
def service() -> Iterator[InferenceService]:
    runtime = Runtime.start(Settings(backend="numpy", header_cache_bytes=0))
    yield InferenceService(runtime)
    runtime.close()


def _message(model: str, datatype: str, data: np.ndarray[Any, Any]) -> bytes:
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="InputTensor", datatype=datatype, shape=[data.size])
    request.raw_input_contents.append(data.tobytes())
    message: bytes = request.SerializeToString()
    return message


def test_fresh_bytes_hold_what_was_written() -> None:
    made, view = answer_bytes.fresh(1 << 20)
    assert type(made) is bytes
    assert len(made) == 1 << 20
    view[:] = bytes(range(256)) * 4096
    assert made == bytes(range(256)) * 4096
    assert not view.readonly


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize(
    ("model", "datatype", "dtype"),
    [(NOT, "UINT8", np.uint8), (NOT, "INT64", np.int64), (COUNT, "UINT32", np.uint32)],
)
@pytest.mark.parametrize("elements", [100, 70_000, 1 << 20])
def test_large_answers_equal_copied_ones(
    service: InferenceService,
    monkeypatch: pytest.MonkeyPatch,
    model: str,
    datatype: str,
    dtype: type,
    elements: int,
    streamed: bool,
) -> None:
    info = np.iinfo(dtype)
    data = RNG.integers(info.min, info.max, size=elements, dtype=dtype, endpoint=True)
    message = _message(model, datatype, data)
    if streamed:
        fresh = asyncio.run(service._infer(message, streamed=True))
    else:
        fresh = asyncio.run(service.model_infer(message))
    monkeypatch.setattr(answer_bytes, "FRESH_MIN_BYTES", 1 << 62)  # every answer copied
    if streamed:
        copied = asyncio.run(service._infer(message, streamed=True))
    else:
        copied = asyncio.run(service.model_infer(message))
    assert type(fresh) is bytes
    assert fresh == copied
    response = (
        service_pb2.ModelStreamInferResponse.FromString(fresh).infer_response
        if streamed
        else service_pb2.ModelInferResponse.FromString(fresh)
    )
    (raw,) = response.raw_output_contents
    if model == NOT:
        assert raw == (~data).tobytes()
        return
    out_dtype = {"UINT8": np.uint8, "UINT32": np.uint32}[response.outputs[0].datatype]
    counts = np.unpackbits(data.view(np.uint8).reshape(elements, -1), axis=1).sum(axis=1)
    assert raw == counts.astype(out_dtype).tobytes()
