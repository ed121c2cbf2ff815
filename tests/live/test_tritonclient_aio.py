"""The stock asyncio clients, ``tritonclient.http.aio`` and ``tritonclient.grpc.aio``, unchanged,
against a live server: health, metadata, binary inference (one request, then several at once on
the one client), a graph model loaded with ``load_model(name, config=..., files=...)`` and a
refusal each; and the synchronous ``tritonclient.http``'s ``load_model`` with files, as it is.

``load_model(..., files=...)`` over HTTP base64s each file into bytes and writes the body with
python-rapidjson, whose default ``bytes_mode`` writes bytes as text: the stock call sends
Triton's body. Without ``config`` the server refuses the files (``missing_config``), as Triton
does."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http as triton_http
import tritonclient.http.aio as http_aio
from support.grpc_live import GrpcServer, serve_grpc
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.integration

NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
MASKED = Path(__file__).resolve().parents[2] / "examples" / "models" / "masked" / "1" / "model.onnx"
CONFIG = json.dumps({"backend": "onnxruntime"})
RNG = np.random.default_rng(11)
Arr = np.ndarray[Any, Any]
# The refusal asked for: a signed type at a feature level that has none for BIT_NOT.
SIGNED = np.array([1, 2], np.int32)
OLD = {"feature_level": "3_0"}
REFUSAL = "data type INT32 is not supported by DML_OPERATOR_ELEMENT_WISE_BIT_NOT at feature level"


@pytest.fixture(scope="module")
def server() -> Iterator[GrpcServer]:
    with serve_grpc() as server:
        yield server


def mask(x: Arr) -> Arr:
    """``examples/models/masked``'s answer: each row of 4 AND [1, 3, 7, 15]."""
    out: Arr = x & np.array([1, 3, 7, 15], np.uint8)
    return out


def masked_file() -> dict[str, bytes]:
    return {"file:1/model.onnx": MASKED.read_bytes()}


def http_input(name: str, array: Arr, datatype: str) -> Any:
    given = http_aio.InferInput(name, list(array.shape), datatype)
    given.set_data_from_numpy(array, binary_data=True)
    return given


def grpc_input(name: str, array: Arr, datatype: str) -> Any:
    given = grpc_aio.InferInput(name, list(array.shape), datatype)
    given.set_data_from_numpy(array)
    return given


async def http_session(url: str) -> None:
    client = http_aio.InferenceServerClient(url)
    try:
        assert await client.is_server_live()
        assert await client.is_server_ready()
        assert await client.is_model_ready(NOT)
        assert (await client.get_server_metadata())["name"] == "tensorbits"
        metadata = await client.get_model_metadata(NOT)
        assert [t["name"] for t in metadata["inputs"]] == ["InputTensor"]

        xs = [RNG.integers(0, 2**32, size=16, dtype=np.uint32) for _ in range(8)]
        wanted = [http_aio.InferRequestedOutput("OutputTensor", binary_data=True)]
        answers = await asyncio.gather(
            *(
                client.infer(NOT, [http_input("InputTensor", x, "UINT32")], outputs=wanted)
                for x in xs
            )
        )
        for x, answer in zip(xs, answers, strict=True):
            np.testing.assert_array_equal(answer.as_numpy("OutputTensor"), ~x)
            params = answer.get_output("OutputTensor")["parameters"]
            assert params["binary_data_size"] == x.nbytes

        await client.load_model("masked_http_aio", config=CONFIG, files=masked_file())
        assert await client.is_model_ready("masked_http_aio")
        x8 = np.arange(8, dtype=np.uint8).reshape(2, 4)
        answer = await client.infer("masked_http_aio", [http_input("x", x8, "UINT8")])
        np.testing.assert_array_equal(answer.as_numpy("z"), mask(x8))
        await client.unload_model("masked_http_aio")

        with pytest.raises(InferenceServerException) as refused:
            await client.infer(NOT, [http_input("InputTensor", SIGNED, "INT32")], parameters=OLD)
        assert refused.value.status() == "400"
        assert REFUSAL in refused.value.message()
        with pytest.raises(InferenceServerException) as missing:
            await client.infer("no_such_model", [http_input("InputTensor", xs[0], "UINT32")])
        assert missing.value.status() == "404"
    finally:
        await client.close()


async def grpc_session(url: str) -> None:
    client = grpc_aio.InferenceServerClient(url)
    try:
        assert await client.is_server_live()
        assert await client.is_server_ready()
        assert await client.is_model_ready(NOT)
        assert (await client.get_server_metadata()).name == "tensorbits"
        metadata = await client.get_model_metadata(NOT)
        assert [t.name for t in metadata.inputs] == ["InputTensor"]

        xs = [RNG.integers(0, 2**32, size=16, dtype=np.uint32) for _ in range(8)]
        answers = await asyncio.gather(
            *(client.infer(NOT, [grpc_input("InputTensor", x, "UINT32")]) for x in xs)
        )
        for x, answer in zip(xs, answers, strict=True):
            np.testing.assert_array_equal(answer.as_numpy("OutputTensor"), ~x)
            assert len(answer.get_response().raw_output_contents[0]) == x.nbytes

        await client.load_model("masked_grpc_aio", config=CONFIG, files=masked_file())
        assert await client.is_model_ready("masked_grpc_aio")
        x8 = np.arange(8, dtype=np.uint8).reshape(2, 4)
        answer = await client.infer("masked_grpc_aio", [grpc_input("x", x8, "UINT8")])
        np.testing.assert_array_equal(answer.as_numpy("z"), mask(x8))
        await client.unload_model("masked_grpc_aio")

        with pytest.raises(InferenceServerException) as refused:
            await client.infer(NOT, [grpc_input("InputTensor", SIGNED, "INT32")], parameters=OLD)
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert REFUSAL in refused.value.message()
        with pytest.raises(InferenceServerException) as missing:
            await client.infer("no_such_model", [grpc_input("InputTensor", xs[0], "UINT32")])
        assert missing.value.status() == "StatusCode.NOT_FOUND"
    finally:
        await client.close()


def test_http_aio(server: GrpcServer) -> None:
    asyncio.run(http_session(server.http.url))


def test_grpc_aio(server: GrpcServer) -> None:
    asyncio.run(grpc_session(server.grpc_url))


def test_http_load_model_with_files(server: GrpcServer) -> None:
    """The synchronous client's ``load_model(name, config=..., files=...)``, unchanged: loaded
    and served; the same files without ``config`` refused, and nothing loaded."""
    client = triton_http.InferenceServerClient(server.http.url)
    try:
        client.load_model("masked_http", config=CONFIG, files=masked_file())
        assert client.is_model_ready("masked_http")
        x = np.arange(12, dtype=np.uint8).reshape(3, 4)
        given = triton_http.InferInput("x", [3, 4], "UINT8")
        given.set_data_from_numpy(x, binary_data=True)
        np.testing.assert_array_equal(client.infer("masked_http", [given]).as_numpy("z"), mask(x))
        client.unload_model("masked_http")

        with pytest.raises(InferenceServerException) as refused:
            client.load_model("masked_no_config", files=masked_file())
        assert refused.value.status() == "400"
        assert "config" in refused.value.message()
        assert not client.is_model_ready("masked_no_config")
        names = {m["name"] for m in client.get_model_repository_index()}
        assert "masked_no_config" not in names
    finally:
        client.close()
