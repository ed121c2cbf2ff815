"""The ModelInfer plan cache (``PlanTemplate``s made by ``messages.template_of``) against
planning from scratch: for every model, the response to a repeated request planned from its
template is byte for byte the response planned anew; a cached request still sees an unloaded
model and new sizes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from tensorbits.config.settings import Settings
from tensorbits.grpc.service import InferenceService
from tensorbits.runtime import Runtime
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.operators import OPERATORS, Function, OperatorSpec

RNG = np.random.default_rng(3)


@pytest.fixture(scope="module")
def runtimes() -> Iterator[tuple[Runtime, Runtime]]:
    cached = Runtime.start(Settings(backend="numpy", cpu_threads=1))
    uncached = Runtime.start(Settings(backend="numpy", cpu_threads=1, header_cache_bytes=0))
    yield cached, uncached
    cached.close()
    uncached.close()


def _request(op: OperatorSpec, size: int = 6) -> bytes:
    request = service_pb2.ModelInferRequest(model_name=op.name)
    for name in op.inputs:
        high = 8 if op.function in (Function.SHIFT_LEFT, Function.SHIFT_RIGHT) else 256
        array = RNG.integers(0, high, size=size, dtype=np.uint8)
        request.inputs.add(name=name, datatype="UINT8", shape=[size])
        request.raw_input_contents.append(array.tobytes())
    if op.function is Function.SHIFT:
        request.parameters["direction"].string_param = "RIGHT"
    message: bytes = request.SerializeToString()
    return message


@pytest.mark.parametrize("op", OPERATORS, ids=lambda op: op.name)
def test_a_cached_plan_answers_as_a_new_one(
    runtimes: tuple[Runtime, Runtime], op: OperatorSpec
) -> None:
    cached, uncached = InferenceService(runtimes[0]), InferenceService(runtimes[1])
    plans = runtimes[0].plane.plans
    assert plans is not None
    assert runtimes[1].plane.plans is None
    first = _request(op)
    asyncio.run(cached.model_infer(first))  # plans and keeps the template
    assert len(plans) >= 1
    for _ in range(3):  # new data, the same message otherwise: planned from the template
        data = _request(op)
        assert asyncio.run(cached.model_infer(data)) == asyncio.run(uncached.model_infer(data))


def test_a_cached_request_still_sees_unloads_and_sizes(runtimes: tuple[Runtime, Runtime]) -> None:
    runtime = runtimes[0]
    service = InferenceService(runtime)
    op = next(op for op in OPERATORS if op.name == "onnx.BitwiseNot-18")
    data = _request(op)
    asyncio.run(service.model_infer(data))
    runtime.plane.models.unload(op.name)
    try:
        with pytest.raises(InvalidRequest) as caught:
            asyncio.run(service.model_infer(data))
        assert caught.value.rule == "model_unloaded"
    finally:
        runtime.plane.models.load(op.name)
    request = service_pb2.ModelInferRequest.FromString(data)
    request.raw_input_contents[0] = b"\0" * 5  # the same message but one raw size
    with pytest.raises(InvalidRequest) as caught:
        asyncio.run(service.model_infer(request.SerializeToString()))
    assert caught.value.rule == "binary_data_size"
