"""A Triton user's model repository served as Triton reads it, over HTTP and gRPC with the stock
``tritonclient``: a ``config.pbtxt`` with ``max_batch_size: 8``, ``dynamic_batching``,
``instance_group`` and the rest of what Triton users write, and version folders 1 and 2, beside
a folder holding only ``1/model.onnx`` (its configuration completed from the file), both READY;
the batch dimension as Triton means it (a batch of 3 answered by version 2, of 9 refused naming
max_batch_size, the same over both protocols; statistics and ``nv_inference_*`` name version 2);
and the server's own configuration answer, from either protocol (gRPC's as ``MessageToJson``
writes it: camelCase, 64-bit integers as strings), loading back unchanged over either protocol,
with the stock clients' ``load_model(config=..., files=...)``."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from core.graph_models import masked_model
from google.protobuf import json_format
from support.grpc_live import GrpcServer, serve_grpc
from support.repository_load import http_load, load_parameters
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.integration

MODEL_FILE = "file:1/model.onnx"
MASK = np.array([1, 3, 7, 15], np.uint8)  # masked_model's constant: z = x AND k
BATCHED_PBTXT = """\
name: "batched"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: { latest: { num_versions: 1 } }
input [ { name: "x" data_type: TYPE_UINT8 format: FORMAT_NONE dims: [ 4 ] } ]
output [ { name: "z" data_type: TYPE_UINT8 dims: [ 4 ] } ]
dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 100 }
instance_group [ { count: 2 kind: KIND_CPU } ]
optimization { graph { level: 1 } }
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
model_warmup [ { name: "w" batch_size: 1 inputs { key: "x" value: {
  data_type: TYPE_UINT8 dims: [ 4 ] zero_data: true } } } ]
response_cache { enable: true }
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    root = tmp_path_factory.mktemp("triton_repository")
    for folder in ("batched/1", "batched/2", "plain/1"):
        (root / folder).mkdir(parents=True)
        (root / folder / "model.onnx").write_bytes(masked_model())
    (root / "batched" / "config.pbtxt").write_text(BATCHED_PBTXT)
    with serve_grpc({"TENSORBITS_MODEL_REPOSITORY": str(root)}) as live:
        yield live


@pytest.fixture(scope="module")
def http(server: GrpcServer) -> Iterator[Any]:
    client = triton_http.InferenceServerClient(server.http.url, network_timeout=30)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(server: GrpcServer) -> Iterator[Any]:
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def _configs(http: Any, grpc: Any, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model's configuration as each protocol answers it: HTTP's JSON, and gRPC's message as
    ``MessageToJson`` writes it."""
    over_grpc = json.loads(json_format.MessageToJson(grpc.get_model_config(name).config))
    return http.get_model_config(name), over_grpc


def test_the_repository_is_served_ready_over_both_protocols(http: Any, grpc: Any) -> None:
    index = {e["name"]: e for e in http.get_model_repository_index()}
    over_grpc = {m.name: m for m in grpc.get_model_repository_index().models}
    for name in ("batched", "plain"):
        assert index[name]["state"] == over_grpc[name].state == "READY", index[name]
        assert http.is_model_ready(name)
        assert grpc.is_model_ready(name)


def test_the_batch_dimension_is_triton_s(server: GrpcServer, http: Any, grpc: Any) -> None:
    from_http, from_grpc = _configs(http, grpc, "batched")
    assert from_http["max_batch_size"] == from_grpc["maxBatchSize"] == 8
    assert from_http["input"] == [{"name": "x", "data_type": "TYPE_UINT8", "dims": [4]}]
    assert from_grpc["input"] == [{"name": "x", "dataType": "TYPE_UINT8", "dims": ["4"]}]
    assert http.get_model_metadata("batched")["inputs"][0]["shape"] == [-1, 4]
    metadata = grpc.get_model_metadata("batched")
    assert [list(t.shape) for t in (*metadata.inputs, *metadata.outputs)] == [[-1, 4], [-1, 4]]

    x = np.arange(12, dtype=np.uint8).reshape(3, 4) * 17
    for module, client in ((triton_http, http), (triton_grpc, grpc)):
        tensor = module.InferInput("x", [3, 4], "UINT8")
        tensor.set_data_from_numpy(x)
        result = client.infer("batched", [tensor])
        assert result.as_numpy("z").tobytes() == (x & MASK).tobytes()
        answer = result.get_response()
        assert (answer["model_version"] if module is triton_http else answer.model_version) == "2"
        nine = np.zeros((9, 4), np.uint8)
        tensor = module.InferInput("x", [9, 4], "UINT8")
        tensor.set_data_from_numpy(nine)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("batched", [tensor])
        assert "max_batch_size" in caught.value.message(), caught.value.message()
        assert "8" in caught.value.message()
        assert caught.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    # Statistics and Triton's metrics name the version served, as the answers do.
    (over_http,) = http.get_inference_statistics("batched")["model_stats"]
    (over_grpc,) = grpc.get_inference_statistics("batched").model_stats
    assert over_http["version"] == over_grpc.version == "2"
    assert over_http["inference_stats"]["success"]["count"] == 2  # a batch of 3 on each protocol
    with urllib.request.urlopen(f"{server.http.base_url}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    assert 'nv_inference_request_success{model="batched",version="2"} 2' in metrics


def test_a_folder_with_only_the_onnx_file_is_completed_from_it(http: Any, grpc: Any) -> None:
    from_http, from_grpc = _configs(http, grpc, "plain")
    assert from_http["platform"] == from_grpc["platform"] == "onnxruntime_onnx"
    assert from_http["backend"] == "onnxruntime"
    assert from_http.get("max_batch_size", 0) == 0
    assert from_http["input"] == [{"name": "x", "data_type": "TYPE_UINT8", "dims": [-1, 4]}]
    assert from_http["output"] == [{"name": "z", "data_type": "TYPE_UINT8", "dims": [-1, 4]}]
    x = np.arange(8, dtype=np.uint8).reshape(2, 4)
    tensor = triton_grpc.InferInput("x", [2, 4], "UINT8")
    tensor.set_data_from_numpy(x)
    assert grpc.infer("plain", [tensor]).as_numpy("z").tobytes() == (x & MASK).tobytes()


@pytest.mark.parametrize("answered_by", ["http", "grpc"])
@pytest.mark.parametrize("loaded_by", ["http", "grpc"])
def test_the_configuration_answered_loads_back_unchanged(
    server: GrpcServer, http: Any, grpc: Any, answered_by: str, loaded_by: str
) -> None:
    for name in ("batched", "plain"):
        before = _configs(http, grpc, name)
        config = json.dumps(before[0] if answered_by == "http" else before[1])
        # The stock clients' own load calls (tritonclient.http sends the file as base64).
        (grpc if loaded_by == "grpc" else http).load_model(
            name, config=config, files={MODEL_FILE: masked_model()}
        )
        assert _configs(http, grpc, name) == before
        assert grpc.is_model_ready(name)


def test_the_configuration_refuses_what_it_cannot_honour_with_why(
    server: GrpcServer, grpc: Any
) -> None:
    for setting in (
        {"sequence_batching": {"control_input": [{"name": "START"}]}},
        {"input": [{"name": "x", "reshape": {"shape": ["4"]}}]},
    ):
        config = json.dumps({"backend": "onnxruntime", **setting})
        status, error = http_load(
            server.http.base_url, "refused", load_parameters(config, {MODEL_FILE: masked_model()})
        )
        assert status == 400, error
        assert "unsupported_config" in json.dumps(error) or "refused" in error["error"], error
        with pytest.raises(InferenceServerException) as caught:
            grpc.load_model("refused", config=config, files={MODEL_FILE: masked_model()})
        assert caught.value.message() == error["error"]
