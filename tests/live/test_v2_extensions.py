"""The HTTP extensions on a live server, through the stock ``tritonclient.http`` and the
SDK: the model configuration, statistics that move by exactly the requests sent, compressed
responses, and a generic client that reads NOTHING but the metadata and the model configuration
and still builds a valid request for every model and every data type they allow."""

from __future__ import annotations

import gzip
import json
import urllib.request
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from support.live import LiveServer, serve
from support.v2 import statistics_counts
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from tensorbits_client import Client

pytestmark = pytest.mark.integration

NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
AND = "onnx.BitwiseAnd-18"
RNG = np.random.default_rng(12)


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    """A server of this module's own: the statistics here must see only this module's requests."""
    with serve({"TENSORBITS_GRPC_PORT": "0"}) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(server.url, network_timeout=30)
    yield c
    c.close()


def _not_input(array: np.ndarray[Any, Any], binary: bool = True) -> list[triton.InferInput]:
    tensor = triton.InferInput("InputTensor", list(array.shape), "UINT8")
    tensor.set_data_from_numpy(array, binary_data=binary)
    return [tensor]


def _counts(client: triton.InferenceServerClient, model: str) -> tuple[int, int, int, int]:
    (entry,) = client.get_inference_statistics(model)["model_stats"]
    return statistics_counts(entry)


# --- model configuration and statistics, as tritonclient reads them ------------------------------


def test_server_metadata_lists_the_extensions(client: triton.InferenceServerClient) -> None:
    extensions = client.get_server_metadata()["extensions"]
    assert "model_configuration" in extensions
    assert "statistics" in extensions


def test_get_model_config(client: triton.InferenceServerClient) -> None:
    config = client.get_model_config("onnx.BitShift-11")
    assert config["name"] == "onnx.BitShift-11"
    assert config["max_batch_size"] == 0
    assert [(t["name"], t["data_type"]) for t in config["input"]] == [
        ("X", "TYPE_UINT8"),
        ("Y", "TYPE_UINT8"),
    ]
    assert config["parameters"]["parameter.direction.required"] == {"string_value": "true"}
    with pytest.raises(InferenceServerException) as info:
        client.get_model_config("nope")
    assert info.value.status() == "404"


def test_statistics_move_by_exactly_the_requests_sent(
    client: triton.InferenceServerClient,
) -> None:
    before, other = _counts(client, NOT), _counts(client, AND)
    array = RNG.integers(0, 256, 64, dtype=np.uint8)
    for binary in (True, True, False):
        client.infer(NOT, _not_input(array, binary))
    for bad in ("FP32", "BOOL"):  # data types BIT_NOT does not take: failures of the model
        tensor = triton.InferInput("InputTensor", [4], bad)
        tensor.set_data_from_numpy(np.zeros(4, triton_to_np_dtype(bad)))
        with pytest.raises(InferenceServerException):
            client.infer(NOT, [tensor], parameters={"feature_level": "3_0"})
    after = _counts(client, NOT)
    assert after == (before[0] + 3, before[1] + 2, before[2] + 3, before[3] + 3)
    assert _counts(client, AND) == other
    every = client.get_inference_statistics()["model_stats"]
    assert len(every) == 18
    entry = next(e for e in every if e["name"] == NOT)
    assert entry["inference_stats"]["success"]["count"] == after[0]
    assert entry["last_inference"] > 0


def test_sdk_statistics_and_model_config(server: LiveServer) -> None:
    with Client(server.base_url) as sdk:
        before = sdk.statistics(NOT).model_stats[0].inference_stats.success.count
        sdk.dml.bit_not(np.arange(8, dtype=np.uint16))
        sdk.dml.bit_not(np.arange(8, dtype=np.uint16))
        (entry,) = sdk.statistics(NOT).model_stats
        assert entry.inference_stats.success.count == before + 2
        assert entry.inference_stats.compute_infer.ns > 0
        assert len(sdk.statistics().model_stats) == 18
        config = sdk.model_config(NOT)
        assert config.parameters["parameter.feature_level.default"].string_value == "6_4"


# --- compressed responses -------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
@pytest.mark.parametrize("size", [16, 3 << 20])
@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_response_compression_round_trip(
    client: triton.InferenceServerClient, algorithm: str, size: int, binary: bool
) -> None:
    if not binary and size > 1 << 20:
        size = 4096  # a JSON output of millions of elements is not what this is about
    array = RNG.integers(0, 4, size, dtype=np.uint8)
    output = triton.InferRequestedOutput("OutputTensor", binary_data=binary)
    result = client.infer(
        NOT,
        _not_input(array),
        outputs=[output],
        request_compression_algorithm=algorithm,
        response_compression_algorithm=algorithm,
    )
    np.testing.assert_array_equal(result.as_numpy("OutputTensor"), ~array)


def _post(server: LiveServer, accept: str | None) -> tuple[dict[str, str], bytes]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "InputTensor",
                    "shape": [1 << 16],
                    "datatype": "UINT8",
                    "parameters": {"binary_data_size": 1 << 16},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    headers = {"Inference-Header-Content-Length": str(len(header))}
    if accept is not None:
        headers["Accept-Encoding"] = accept
    request = urllib.request.Request(
        f"{server.base_url}/v2/models/{NOT}/infer",
        data=header + bytes(1 << 16),
        headers=headers,
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return {k.lower(): v for k, v in response.headers.items()}, response.read()


def test_compressed_only_when_asked(server: LiveServer) -> None:
    headers, body = _post(server, None)  # urllib sends no Accept-Encoding
    assert "content-encoding" not in headers
    length = int(headers["inference-header-content-length"])
    assert len(body) == length + (1 << 16)
    for accept, inflate in (("gzip", gzip.decompress), ("deflate", zlib.decompress)):
        headers, raw = _post(server, accept)
        assert headers["content-encoding"] == accept
        assert int(headers["content-length"]) == len(raw) < len(body) // 10
        assert inflate(raw) == body
        assert int(headers["inference-header-content-length"]) == length


# --- a generic client that knows nothing but the metadata -----------------------------------------


def _words(config: dict[str, Any]) -> dict[str, str]:
    return {key: value["string_value"] for key, value in config.get("parameters", {}).items()}


def _requests_of(metadata: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str, list[int], Any]]:
    """Every (parameters, input data type, shape, output types) the metadata says the model
    takes: first its stock fields alone (one ``datatype``, one ``shape``), then each row of its
    support table (chosen through ``support_parameter``) with each data type of the row, at the
    row's smallest rank of at least 1. Required parameters get their first choice."""
    required = {
        p["name"]: p["choices"][0] for p in metadata.get("parameters", []) if p.get("required")
    }
    first = metadata["inputs"][0]
    yield required, first["datatype"], [3 if d == -1 else d for d in first["shape"]], None
    for row in metadata["support"]:
        chosen = dict(required)
        if metadata.get("support_parameter") is not None:
            chosen[metadata["support_parameter"]] = row["since"]
        rank = max(row["min_rank"], 1)
        for datatype in row["input_types"]:
            yield chosen, datatype, [2] * rank, row.get("output_types")


def _array(datatype: str, shape: list[int]) -> np.ndarray[Any, Any]:
    """Random elements of ``datatype`` (any bits: every bitwise operator takes them all)."""
    dtype = np.dtype(triton_to_np_dtype(datatype))
    raw = RNG.integers(0, 256, int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    array: np.ndarray[Any, Any] = raw % 2 == 1 if dtype == np.bool_ else raw.view(dtype)
    return array.reshape(shape)


def test_a_client_reading_only_the_metadata_builds_valid_requests(
    client: triton.InferenceServerClient,
) -> None:
    sent = 0
    for entry in client.get_model_repository_index():
        model = entry["name"]
        metadata = client.get_model_metadata(model)
        words = _words(client.get_model_config(model))
        # What gRPC users read instead (no room in TensorMetadata): the same words in the config.
        for tensor in metadata["inputs"]:
            assert words[f"input.{tensor['name']}.datatypes"] == ",".join(tensor["datatypes"])
            assert tensor["datatype"] in tensor["datatypes"]
        for index, row in enumerate(metadata["support"]):
            assert words[f"support.{index}.input_types"] == ",".join(row["input_types"])
        for parameters, datatype, shape, output_types in _requests_of(metadata):
            inputs = []
            for tensor in metadata["inputs"]:
                item = triton.InferInput(tensor["name"], shape, datatype)
                item.set_data_from_numpy(_array(datatype, shape))
                inputs.append(item)
            result = client.infer(
                model,
                inputs,
                parameters=parameters,
                outputs=[triton.InferRequestedOutput(o["name"]) for o in metadata["outputs"]],
            )
            (output,) = result.get_response()["outputs"]
            assert output["datatype"] in (output_types or [datatype])
            assert output["shape"] == shape
            sent += 1
    assert sent > 18 * 2
