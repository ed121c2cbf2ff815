"""The image under test (TENSORBITS_IMAGE_URL, host:port), driven as its users drive it: the
stock tritonclient.http on every operator, the SDK on every family and a /v1 batch. Results are
checked against the reference (tests/core/bitref.py), not against the server's own code."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from core.bitref import assert_bits_equal, reference
from support.sdk import assert_both_apis_answer

from tensorbits_client import Client
from tensorbits_protocol.operators import OPERATORS, Function, OperatorSpec

URL = os.environ["TENSORBITS_IMAGE_URL"]
RNG = np.random.default_rng(14)
Arr = np.ndarray[Any, Any]


@pytest.fixture(scope="module")
def triton_client() -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(URL, network_timeout=30)
    yield client
    client.close()


@pytest.fixture(scope="module")
def sdk() -> Iterator[Client]:
    with Client(f"http://{URL}") as client:
        yield client


def _inputs(op: OperatorSpec) -> tuple[dict[str, Arr], dict[str, str]]:
    arrays = {name: RNG.integers(0, 256, size=(3, 4), dtype=np.uint8) for name in op.inputs}
    if op.function in (Function.SHIFT, Function.SHIFT_LEFT, Function.SHIFT_RIGHT):
        arrays[op.inputs[1]] = RNG.integers(0, 10, size=(3, 4), dtype=np.uint8)
    return arrays, ({"direction": "LEFT"} if op.function is Function.SHIFT else {})


def test_server_metadata_lists_every_operator(triton_client: triton.InferenceServerClient) -> None:
    assert triton_client.is_server_ready()
    assert triton_client.get_server_metadata()["name"] == "tensorbits"
    names = {model["name"] for model in triton_client.get_model_repository_index()}
    assert names == {op.name for op in OPERATORS}


@pytest.mark.parametrize("op", OPERATORS, ids=lambda op: op.name)
def test_every_operator_through_tritonclient(
    triton_client: triton.InferenceServerClient, op: OperatorSpec
) -> None:
    arrays, params = _inputs(op)
    inputs = []
    for name, array in arrays.items():
        tensor = triton.InferInput(name, list(array.shape), "UINT8")
        tensor.set_data_from_numpy(array, binary_data=True)
        inputs.append(tensor)
    outputs = [triton.InferRequestedOutput(op.output, binary_data=True)]
    result = triton_client.infer(op.name, inputs, outputs=outputs, parameters=params)
    assert_bits_equal(result.as_numpy(op.output), reference(op.name, arrays, params))


def test_every_family_through_the_sdk(sdk: Client) -> None:
    a = np.arange(12, dtype=np.uint32).reshape(3, 4)
    b = np.full((3, 4), 0xF0F0, dtype=np.uint32)
    np.testing.assert_array_equal(sdk.dml.bit_xor(a, b), a ^ b)
    np.testing.assert_array_equal(sdk.openvino.bitwise_and(a, b[:1]), a & b[:1])
    shifted = sdk.onnx.bit_shift(a, np.full(1, 2, np.uint32), direction="RIGHT")
    np.testing.assert_array_equal(shifted, a >> 2)


def test_a_v1_batch_through_the_sdk(sdk: Client) -> None:
    assert_both_apis_answer(sdk, RNG.integers(0, 256, size=(64, 3), dtype=np.uint8))
