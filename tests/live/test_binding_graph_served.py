"""Graph models in the /v1 binding model over real sockets with the stock clients: loaded with
Triton's load parameters (``{"backend": "tensorbits"}`` and ``file:1/model.json``; gRPC through
``tritonclient.grpc.load_model``, HTTP with the body ``tritonclient.http.load_model`` means to
send), inferred over both protocols with the same answers as the same buffers and dispatches
sent as a /v1 batch, refused with the field and the rule, and read from the repository folder
at start (``config.pbtxt`` and ``1/model.json``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from core.graph_models import binding_example
from support.grpc_live import GrpcServer, serve_grpc
from support.repository_load import http_load, load_parameters
from tritonclient.utils import InferenceServerException

from tensorbits_client import Client

pytestmark = pytest.mark.integration

PROTOCOLS = ("http", "grpc")
CONFIG = json.dumps({"backend": "tensorbits"})
MODEL_FILE = "file:1/model.json"
RNG = np.random.default_rng(11)
MAX_DISPATCHES = 8
PBTXT = 'platform: "tensorbits_graph"\ninstance_group [ { kind: KIND_CPU } ]\n'


def model_json(document: dict[str, Any] | None = None) -> bytes:
    return json.dumps(document if document is not None else binding_example()).encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    root = tmp_path_factory.mktemp("repository")
    folder = root / "folder_hamming"
    (folder / "2").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(PBTXT)
    (folder / "2" / "model.json").write_bytes(model_json())
    wrong = root / "folder_wrong_file"  # the binding backend, an ONNX file's name
    (wrong / "1").mkdir(parents=True)
    (wrong / "config.json").write_text(CONFIG)
    (wrong / "1" / "model.onnx").write_bytes(model_json())
    env = {
        "TENSORBITS_MODEL_REPOSITORY": str(root),
        "TENSORBITS_MAX_DISPATCHES": str(MAX_DISPATCHES),
    }
    with serve_grpc(env) as live:
        yield live


@pytest.fixture(scope="module")
def http(server: GrpcServer) -> Iterator[triton_http.InferenceServerClient]:
    client = triton_http.InferenceServerClient(server.http.url, network_timeout=30)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(server: GrpcServer) -> Iterator[triton_grpc.InferenceServerClient]:
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def load(
    protocol: str,
    server: GrpcServer,
    grpc: Any,
    name: str,
    data: bytes,
    config: str = CONFIG,
    file: str = MODEL_FILE,
) -> None:
    """Triton's load with the file, as each stock client sends it (a refusal raised as the
    clients raise it, with the status)."""
    if protocol == "http":
        status, error = http_load(server.http.base_url, name, load_parameters(config, {file: data}))
        if status != 200:
            raise InferenceServerException(error.get("error", ""), status=str(status))
        return
    grpc.load_model(name, config=config, files={file: data})


def infer(
    protocol: str, http: Any, grpc: Any, name: str, feeds: dict[str, np.ndarray[Any, Any]]
) -> np.ndarray[Any, Any]:
    client = triton_http if protocol == "http" else triton_grpc
    inputs = []
    for key, array in feeds.items():
        tensor = client.InferInput(key, list(array.shape), "UINT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    result = (http if protocol == "http" else grpc).infer(name, inputs)
    answer: np.ndarray[Any, Any] = result.as_numpy("distance")
    return answer


def feeds() -> dict[str, np.ndarray[Any, Any]]:
    return {
        "codes": RNG.integers(0, 1 << 32, (4, 8), dtype=np.uint32),
        "query": RNG.integers(0, 1 << 32, (8,), dtype=np.uint32),
    }


def as_v1_batch(server: GrpcServer, given: dict[str, np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    """The same buffers and dispatches, sent as a /v1 batch with the SDK."""
    with Client(server.http.base_url) as client:
        batch = client.batch()
        codes = batch.input("codes", given["codes"])
        query = batch.input("query", given["query"])
        counts = batch.buffer("counts", 32)
        document = binding_example()
        xor, count = document["dispatches"]
        batch.dispatch(
            xor["operator"],
            ATensor=codes.tensor("UINT32", (4, 8)),
            BTensor=query.tensor("UINT32", (4, 8), strides=(0, 1)),
            OutputTensor=codes.tensor("UINT32", (4, 8)),
        )
        batch.dispatch(
            count["operator"],
            count["parameters"],
            InputTensor=codes.tensor("UINT32", (4, 8)),
            OutputTensor=counts.tensor("UINT8", (4, 8)),
        )
        batch.output(counts, "UINT8", (4, 8))
        result: np.ndarray[Any, Any] = batch.run()["counts"]
    return result


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_load_infer_unload_with_triton_clients(
    protocol: str, server: GrpcServer, http: Any, grpc: Any
) -> None:
    name = f"hamming_{protocol}"
    load(protocol, server, grpc, name, model_json())
    try:
        assert http.is_model_ready(name)
        assert grpc.is_model_ready(name)
        given = feeds()
        want = np.bitwise_count(given["codes"] ^ given["query"]).astype(np.uint8)
        for other in PROTOCOLS:  # loaded over one protocol, served over both
            got = infer(other, http, grpc, name, given)
            assert got.dtype == np.uint8
            assert got.shape == (4, 8)
            assert got.tobytes() == want.tobytes()
        assert got.tobytes() == as_v1_batch(server, given).tobytes()
        metadata = http.get_model_metadata(name)
        assert metadata["platform"] == "tensorbits_graph"
        assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [
            ("codes", "UINT32", [4, 8]),
            ("query", "UINT32", [8]),
        ]
        config = grpc.get_model_config(name).config
        assert (config.platform, config.backend) == ("tensorbits_graph", "tensorbits")
        assert [(o.name, list(o.dims)) for o in config.output] == [("distance", [4, 8])]
    finally:
        http.unload_model(name)
    assert not http.is_model_ready(name)


def test_the_repository_folder_serves_a_binding_graph_from_its_pbtxt(http: Any, grpc: Any) -> None:
    given = feeds()
    got = infer("grpc", http, grpc, "folder_hamming", given)
    assert got.tolist() == np.bitwise_count(given["codes"] ^ given["query"]).tolist()
    assert http.get_model_metadata("folder_hamming")["versions"] == ["2"]
    index = {e["name"]: e for e in http.get_model_repository_index()}
    assert index["folder_hamming"]["state"] == "READY"
    assert index["folder_wrong_file"]["state"] == "UNAVAILABLE"
    assert "1/model.json" in index["folder_wrong_file"]["reason"]


def test_a_request_of_other_shapes_is_refused_naming_the_input(
    server: GrpcServer, http: Any, grpc: Any
) -> None:
    wrong = {"codes": np.zeros((8, 4), np.uint32), "query": np.zeros(8, np.uint32)}
    for protocol in PROTOCOLS:
        with pytest.raises(InferenceServerException) as caught:
            infer(protocol, http, grpc, "folder_hamming", wrong)
        assert "codes" in caught.value.message()
        assert "dimension 0 of size 8; the model declares 4" in caught.value.message()


def _broken_dispatch() -> dict[str, Any]:
    document = binding_example()
    document["dispatches"][0]["bindings"]["BTensor"]["desc"]["strides"] = [0, 2]
    return document


def _old_feature_level() -> dict[str, Any]:
    document = binding_example()
    document["dispatches"][1]["parameters"] = {"feature_level": "1_0"}
    return document


REFUSED = [
    # (what, config, file parameter, file bytes, rule, words in the message)
    ("a dispatch's view past its buffer", CONFIG, MODEL_FILE, model_json(_broken_dispatch()),
     "buffer_bounds", "dispatches[0].bindings.BTensor"),
    ("an operator not yet at the feature level", CONFIG, MODEL_FILE,
     model_json(_old_feature_level()), "feature_level", "dispatches[1].parameters.feature_level"),
    ("the ONNX file's name for a binding graph", CONFIG, "file:1/model.onnx", model_json(),
     "unsupported_file", "file:1/model.json"),
    ("a binding graph named an ONNX file", json.dumps({"backend": "onnxruntime"}), MODEL_FILE,
     model_json(), "unsupported_file", "file:1/model.onnx"),
    ("backend and platform of two formats", json.dumps(
        {"backend": "tensorbits", "platform": "onnxruntime_onnx"}), MODEL_FILE, model_json(),
     "unsupported_backend", "config.platform"),
    ("not JSON", CONFIG, MODEL_FILE, b"\x08\x01onnx?", "json", "model.json"),
    ("a config entry that disagrees with the file",
     json.dumps({"backend": "tensorbits", "input": [{"name": "codes", "data_type": "TYPE_UINT8"}]}),
     MODEL_FILE, model_json(), "datatype", "config.input[0].data_type"),
]  # fmt: skip


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    ("config", "file", "data", "rule", "words"),
    [case[1:] for case in REFUSED],
    ids=[case[0] for case in REFUSED],
)
def test_a_refused_load_names_the_field_and_rule_and_loads_nothing(
    protocol: str,
    server: GrpcServer,
    http: Any,
    grpc: Any,
    config: str,
    file: str,
    data: bytes,
    rule: str,
    words: str,
) -> None:
    name = f"refused_{protocol}"
    with pytest.raises(InferenceServerException) as caught:
        load(protocol, server, grpc, name, data, config, file)
    message = caught.value.message()
    assert words in message
    status = caught.value.status()
    assert status in ("400", "StatusCode.INVALID_ARGUMENT"), status
    if protocol == "http":
        code, body = http_load(server.http.base_url, name, load_parameters(config, {file: data}))
        assert code == 400
        assert body["rule"] == rule
    assert name not in {e["name"] for e in http.get_model_repository_index()}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_flooded_or_deep_file_is_refused_by_its_bounds_and_the_server_serves_on(
    protocol: str, server: GrpcServer, http: Any, grpc: Any
) -> None:
    """Past the batch header's bounds (more dispatches than TENSORBITS_MAX_DISPATCHES, JSON
    nested past its depth): refused naming the bound, nothing loaded, the server serving."""
    flooded = binding_example()
    flooded["dispatches"] = flooded["dispatches"] * (MAX_DISPATCHES // 2 + 1)
    deep = b'{"inputs": ' + b"[" * 4096 + b"]" * 4096 + b"}"
    for data, status, code, words, rule in (
        (
            model_json(flooded), "413", "StatusCode.RESOURCE_EXHAUSTED",
            f"model.json: 10 dispatches listed, more than the limit of {MAX_DISPATCHES}",
            "max_dispatches",
        ),
        (deep, "400", "StatusCode.INVALID_ARGUMENT", "model.json", "max_json_depth"),
    ):  # fmt: skip
        with pytest.raises(InferenceServerException) as caught:
            load(protocol, server, grpc, "flooded", data)
        assert caught.value.status() in (status, code), caught.value.status()
        assert words in caught.value.message()
        if protocol == "http":
            parameters = load_parameters(CONFIG, {MODEL_FILE: data})
            assert http_load(server.http.base_url, "flooded", parameters)[1]["rule"] == rule
        assert "flooded" not in {e["name"] for e in http.get_model_repository_index()}
        assert http.is_server_live()
        given = feeds()
        got = infer(protocol, http, grpc, "folder_hamming", given)
        assert got.tolist() == np.bitwise_count(given["codes"] ^ given["query"]).tolist()
