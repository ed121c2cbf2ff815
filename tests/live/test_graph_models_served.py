"""Graph models over real sockets with the stock clients: ONNX files built here with
``onnx.helper``, loaded with Triton's load parameters (gRPC: ``tritonclient.grpc.load_model``;
HTTP: the same body ``tritonclient.http.load_model`` sends), served over both
protocols and compared with ONNX Runtime byte for byte; hostile files refused with nothing
loaded; the repository folder read at start, one broken model in it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from core.graph_models import constant, model_bytes, tensor
from onnx import TensorProto, helper
from support.grpc_live import GrpcServer, serve_grpc
from support.repository_load import http_load as send_load
from support.repository_load import load_parameters
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.integration
ort = pytest.importorskip("onnxruntime")

PROTOCOLS = ("http", "grpc")
MAX_MODEL_BYTES = 16 << 10
U8 = TensorProto.UINT8
CONFIG = json.dumps({"backend": "onnxruntime"})
MODEL_FILE = "file:1/model.onnx"


def family_model() -> bytes:
    """Every operator of the family, broadcasting (y is one row), several outputs and an
    initializer (k, one shift count per column)."""
    nodes = [
        helper.make_node("BitwiseAnd", ["x", "y"], ["and"], name="and"),
        helper.make_node("BitwiseOr", ["x", "y"], ["or"], name="or"),
        helper.make_node("BitwiseXor", ["and", "or"], ["xor"], name="xor"),
        helper.make_node("BitwiseNot", ["xor"], ["not"], name="not"),
        helper.make_node("BitShift", ["not", "k"], ["left"], name="shl", direction="LEFT"),
        helper.make_node("BitShift", ["x", "k"], ["right"], name="shr", direction="RIGHT"),
    ]
    k = constant("k", np.array([1, 2, 3, 7], np.uint8))
    return model_bytes(
        nodes,
        [tensor("x", U8, ["n", 4]), tensor("y", U8, [4])],
        [tensor("left", U8, ["n", 4]), tensor("right", U8, ["n", 4]), tensor("or", U8, ["n", 4])],
        [k],
    )


def xor_model() -> bytes:
    return model_bytes(
        [helper.make_node("BitwiseXor", ["a", "b"], ["c"])],
        [tensor("a", TensorProto.UINT32, [3]), tensor("b", TensorProto.UINT32, [3])],
        [tensor("c", TensorProto.UINT32, [3])],
    )


X = np.arange(24, dtype=np.uint8).reshape(6, 4) * 11
Y = np.array([0xF0, 0x0F, 0xAA, 0x55], np.uint8)


def expected(data: bytes, feeds: dict[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    root = tmp_path_factory.mktemp("repository")
    good = root / "folder_xor"
    (good / "1").mkdir(parents=True)
    (good / "config.json").write_text(json.dumps({"platform": "onnxruntime_onnx"}))
    (good / "1" / "model.onnx").write_bytes(xor_model())
    broken = root / "folder_broken"
    (broken / "1").mkdir(parents=True)
    (broken / "config.json").write_text(CONFIG)
    (broken / "1" / "model.onnx").write_bytes(xor_model()[:20])
    env = {
        "TENSORBITS_MODEL_REPOSITORY": str(root),
        "TENSORBITS_MAX_MODEL_BYTES": str(MAX_MODEL_BYTES),
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


def http_load(
    server: GrpcServer, name: str, config: str, data: bytes
) -> tuple[int, dict[str, Any]]:
    """The load ``tritonclient.http.load_model(name, config=..., files=...)`` means to send."""
    return send_load(server.http.base_url, name, load_parameters(config, {MODEL_FILE: data}))


def load(
    protocol: str, server: GrpcServer, grpc: Any, name: str, data: bytes, config: str = CONFIG
) -> None:
    if protocol == "http":
        status, error = http_load(server, name, config, data)
        if status != 200:
            raise InferenceServerException(error.get("error", ""), status=str(status))
        return
    grpc.load_model(name, config=config, files={MODEL_FILE: data})


def infer(
    protocol: str, http: Any, grpc: Any, name: str, feeds: dict[str, np.ndarray[Any, Any]],
    outputs: list[str] | None = None, *, binary: bool = True,
) -> dict[str, np.ndarray[Any, Any]]:  # fmt: skip
    client = triton_http if protocol == "http" else triton_grpc
    inputs = []
    for key, array in feeds.items():
        tensor_ = client.InferInput(
            key, list(array.shape), "UINT8" if array.dtype == np.uint8 else "UINT32"
        )
        if protocol == "http":
            tensor_.set_data_from_numpy(array, binary_data=binary)
        else:
            tensor_.set_data_from_numpy(array)
        inputs.append(tensor_)
    requested = None
    if outputs is not None:
        requested = [
            triton_http.InferRequestedOutput(o, binary_data=binary)
            if protocol == "http"
            else triton_grpc.InferRequestedOutput(o)
            for o in outputs
        ]
    result = (http if protocol == "http" else grpc).infer(name, inputs, outputs=requested)
    names = outputs or [
        o["name"]
        for o in result.get_response(**({"as_json": True} if protocol == "grpc" else {}))["outputs"]
    ]
    return {o: result.as_numpy(o) for o in names}


def assert_identical(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert set(got) == set(want)
    for name, array in want.items():
        assert got[name].dtype == array.dtype, name
        assert got[name].shape == array.shape, name
        assert got[name].tobytes() == array.tobytes(), name


def grpc_ready(grpc: Any, name: str) -> bool:
    """ModelReady over gRPC: an unknown model is NOT_FOUND, as any other RPC of it."""
    try:
        return bool(grpc.is_model_ready(name))
    except InferenceServerException as exc:
        if exc.status() != "StatusCode.NOT_FOUND":
            raise
        return False


def index(http: Any) -> dict[str, tuple[str, str]]:
    return {e["name"]: (e["state"], e.get("reason", "")) for e in http.get_model_repository_index()}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_load_infer_unload_as_triton_clients_do(
    protocol: str, server: GrpcServer, http: Any, grpc: Any
) -> None:
    name = f"family_{protocol}"
    data = family_model()
    load(protocol, server, grpc, name, data)
    assert http.is_model_ready(name)
    assert grpc.is_model_ready(name)
    assert index(http)[name] == ("READY", "")
    want = expected(data, {"x": X, "y": Y})
    for via in PROTOCOLS:
        assert_identical(infer(via, http, grpc, name, {"x": X, "y": Y}), want)
        subset = infer(via, http, grpc, name, {"x": X, "y": Y}, ["right", "left"])
        assert_identical(subset, {"right": want["right"], "left": want["left"]})
    json_answer = infer("http", http, grpc, name, {"x": X, "y": Y}, ["left", "or"], binary=False)
    assert_identical(json_answer, {"left": want["left"], "or": want["or"]})
    assert http.get_model_metadata(name)["platform"] == "onnxruntime_onnx"
    config = grpc.get_model_config(name).config
    assert config.platform == "onnxruntime_onnx"
    assert [i.name for i in config.input] == ["x", "y"]
    assert [list(i.dims) for i in config.input] == [[-1, 4], [4]]
    stats = http.get_inference_statistics(name)["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] >= 5
    (protocol_client := http if protocol == "http" else grpc).unload_model(name)
    assert protocol_client is not None
    assert not http.is_model_ready(name)
    assert not grpc_ready(grpc, name)
    assert name not in index(http)
    with pytest.raises(InferenceServerException):
        infer(protocol, http, grpc, name, {"x": X, "y": Y})
    load(protocol, server, grpc, name, data)  # back again, with its file
    assert_identical(infer(protocol, http, grpc, name, {"x": X, "y": Y}), want)
    grpc.unload_model(name)


def test_typed_contents_over_grpc(server: GrpcServer, grpc: Any) -> None:
    data = xor_model()
    grpc.load_model("typed_xor", config=CONFIG, files={MODEL_FILE: data})
    a = np.array([1, 0xFFFFFFFF, 12345], np.uint32)
    b = np.array([3, 0x0F0F0F0F, 54321], np.uint32)
    request = service_pb2.ModelInferRequest(model_name="typed_xor")
    for key, array in (("a", a), ("b", b)):
        entry = request.inputs.add(name=key, datatype="UINT32", shape=[3])
        entry.contents.uint_contents.extend(int(v) for v in array)
    import grpc as grpcio

    with grpcio.insecure_channel(server.grpc_url) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    got = np.frombuffer(response.raw_output_contents[0], "<u4")
    assert got.tobytes() == expected(data, {"a": a, "b": b})["c"].tobytes()
    grpc.unload_model("typed_xor")


def _unknown_operator() -> bytes:
    return model_bytes(
        [helper.make_node("Add", ["a", "b"], ["c"])],
        [tensor("a", U8, [3]), tensor("b", U8, [3])],
        [tensor("c", U8, [3])],
    )


def _too_large() -> bytes:
    nodes = [helper.make_node("BitwiseXor", ["a", "k"], ["c"])]
    k = constant("k", np.zeros(MAX_MODEL_BYTES, np.uint8))
    return model_bytes(
        nodes, [tensor("a", U8, [MAX_MODEL_BYTES])], [tensor("c", U8, [MAX_MODEL_BYTES])], [k]
    )


MISMATCHED = json.dumps(
    {"backend": "onnxruntime", "input": [{"name": "a", "data_type": "TYPE_INT32", "dims": [3]}]}
)
# name, file, config, HTTP status, gRPC status, rule
HOSTILE = [
    ("truncated", xor_model()[:-7], CONFIG, 400, "INVALID_ARGUMENT", None),
    ("unknown_op", _unknown_operator(), CONFIG, 400, "INVALID_ARGUMENT", "Add"),
    ("mismatched", xor_model(), MISMATCHED, 400, "INVALID_ARGUMENT", "TYPE_UINT32"),
    ("DML_OPERATOR_ELEMENT_WISE_BIT_NOT", xor_model(), CONFIG, 400, "INVALID_ARGUMENT", "built-in"),
    ("too_large", _too_large(), CONFIG, 413, "RESOURCE_EXHAUSTED", "TENSORBITS_MAX_MODEL_BYTES"),
    ("stats", xor_model(), CONFIG, 400, "INVALID_ARGUMENT", "a segment of the routes"),
    ("infer", xor_model(), CONFIG, 400, "INVALID_ARGUMENT", "a segment of the routes"),
    (
        "wrong_backend",
        xor_model(),
        json.dumps({"backend": "tensorflow"}),
        400,
        "INVALID_ARGUMENT",
        "onnxruntime",
    ),
]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    ("name", "data", "config", "status", "code", "words"), HOSTILE, ids=[h[0] for h in HOSTILE]
)
def test_hostile_files_are_refused_and_nothing_is_loaded(
    protocol: str, server: GrpcServer, http: Any, grpc: Any,
    name: str, data: bytes, config: str, status: int, code: str, words: str | None,
) -> None:  # fmt: skip
    before = index(http)
    with pytest.raises(InferenceServerException) as refused:
        load(protocol, server, grpc, name, data, config)
    if protocol == "http":
        assert refused.value.status() == str(status)
    else:
        assert refused.value.status() == f"StatusCode.{code}"
    if words is not None:
        assert words in refused.value.message()
    assert index(http) == before
    builtin = name.startswith("DML_")
    assert http.is_model_ready(name) is builtin
    assert grpc_ready(grpc, name) is builtin


def test_the_repository_folder_at_start(http: Any, grpc: Any) -> None:
    states = index(http)
    assert states["folder_xor"] == ("READY", "")
    state, reason = states["folder_broken"]
    assert state == "UNAVAILABLE"
    assert "folder_broken" in reason
    assert "model" in reason
    grpc_index = {m.name: (m.state, m.reason) for m in grpc.get_model_repository_index().models}
    assert grpc_index["folder_xor"] == ("READY", "")
    assert grpc_index["folder_broken"] == (state, reason)
    assert not http.is_model_ready("folder_broken")
    assert not grpc_ready(grpc, "folder_broken")
    a = np.array([1, 2, 3], np.uint32)
    b = np.array([7, 7, 7], np.uint32)
    for via in PROTOCOLS:
        got = infer(via, http, grpc, "folder_xor", {"a": a, "b": b})
        assert_identical(got, expected(xor_model(), {"a": a, "b": b}))
