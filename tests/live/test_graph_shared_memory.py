"""A graph model's tensors in shared memory on a real server, driven by stock tritonclient (HTTP
and gRPC) and ``tritonclient.utils.shared_memory``: every input and output in a system region,
then a mix of regions and the body, each compared with ONNX Runtime byte for byte; the refusals
an operator gives (a region too small, an output over an input, the extensions off) with the
same field, rule and words over both protocols; admission counting the inputs read from regions.
CUDA regions, which only the CuPy backend serves, run in process with the device stand-in
(``support.device_stand_in``), as the operators' CUDA paths are tested without a GPU."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any, NamedTuple

import grpc as grpcio
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
import tritonclient.utils.shared_memory as shm
from core.graph_models import model_bytes, pair_model_bytes, tensor
from live.test_graph_models_served import CONFIG, MODEL_FILE, expected, load
from onnx import TensorProto, helper
from support.device_stand_in import HostDeviceMemory
from support.grpc_live import GrpcServer, serve_grpc
from support.inprocess import app_client, runtime_of
from support.regions import region_input, region_output
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tensorbits.core.shared_memory import SharedMemoryRegions
from tensorbits.grpc import inference_pb2 as pb
from tensorbits.grpc.service import InferenceService

pytestmark = pytest.mark.integration

PROTOCOLS = ("http", "grpc")
Arr = np.ndarray[Any, Any]
RNG = np.random.default_rng(29)
COUNT = 1000  # elements of each tensor: 4000 bytes of UINT32
X = RNG.integers(0, 2**32, COUNT, dtype=np.uint32)
Y = RNG.integers(0, 2**32, COUNT, dtype=np.uint32)
# Where each tensor lies in the one region a test registers (4 KiB apart).
PLACES = {"x": 0, "y": 4096, "xor": 8192, "nand": 12288}
REGION_BYTES = 16384
_keys = itertools.count()


MODEL = pair_model_bytes()  # xor and nand of two UINT32 inputs of one length
WANT = expected(MODEL, {"x": X, "y": Y})


class Region(NamedTuple):
    """A POSIX shared-memory object made by tritonclient's helper, under a region name."""

    name: str
    key: str
    handle: Any

    def put(self, array: Arr, offset: int = 0) -> None:
        shm.set_shared_memory_region(self.handle, [np.ascontiguousarray(array)], offset=offset)

    def get(self, like: Arr, offset: int) -> Arr:
        got = shm.get_contents_as_numpy(self.handle, like.dtype, list(like.shape), offset=offset)
        return np.array(got)


@pytest.fixture
def make_region() -> Iterator[Callable[[int], Region]]:
    """Regions of a given size, destroyed once the test ends."""
    with ExitStack() as made:

        def make(byte_size: int) -> Region:
            number = next(_keys)
            key = f"/tensorbits_graph_test_{os.getpid()}_{number}"
            handle = shm.create_shared_memory_region(f"graph{number}", key, byte_size)
            made.callback(shm.destroy_shared_memory_region, handle)
            return Region(f"graph{number}", key, handle)

        yield make


class Live(NamedTuple):
    """The server, shared memory on, and a stock client of each protocol."""

    server: GrpcServer
    http: triton_http.InferenceServerClient
    grpc: triton_grpc.InferenceServerClient


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    with (
        serve_grpc({"TENSORBITS_SHARED_MEMORY": "true"}) as server,
        triton_http.InferenceServerClient(server.http.url, network_timeout=30) as http,
        triton_grpc.InferenceServerClient(server.grpc_url) as grpc,
    ):
        yield Live(server, http, grpc)


class Loaded(NamedTuple):
    """The pair model as ``loaded`` serves it: its name, the protocol's client and module, and
    a region registered over it, holding X and Y at their ``PLACES``."""

    model: str
    client: Any
    module: Any
    region: Region


@pytest.fixture
def loaded(
    request: pytest.FixtureRequest, live: Live, make_region: Callable[[int], Region]
) -> Iterator[Loaded]:
    """The pair model loaded over the protocol the test is parametrized with, and a region
    registered over it; every region unregistered and the model unloaded after."""
    protocol: str = request.param
    name = f"pair_{protocol}"
    load(protocol, live.server, live.grpc, name, MODEL)
    client = live.http if protocol == "http" else live.grpc
    region = make_region(REGION_BYTES)
    region.put(X, PLACES["x"])
    region.put(Y, PLACES["y"])
    client.register_system_shared_memory(region.name, region.key, REGION_BYTES)
    yield Loaded(name, client, triton_http if protocol == "http" else triton_grpc, region)
    client.unregister_system_shared_memory()
    live.grpc.unload_model(name)


def assert_same_bytes(got: Arr, want: Arr) -> None:
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    assert got.tobytes() == want.tobytes()


# --- round trips ----------------------------------------------------------------------------------


@pytest.mark.parametrize("loaded", PROTOCOLS, indirect=True)
def test_every_tensor_in_shared_memory(loaded: Loaded) -> None:
    module, region = loaded.module, loaded.region
    inputs = [
        region_input(module, "x", X, region, PLACES["x"]),
        region_input(module, "y", Y, region, PLACES["y"]),
    ]
    outputs = [region_output(module, o, region, X.nbytes, PLACES[o]) for o in ("nand", "xor")]
    result = loaded.client.infer(loaded.model, inputs, outputs=outputs)
    for name in ("xor", "nand"):
        assert_same_bytes(region.get(WANT[name], PLACES[name]), WANT[name])
    assert_same_bytes(region.get(X, PLACES["x"]), X)  # the inputs are as they were
    assert_same_bytes(region.get(Y, PLACES["y"]), Y)
    if module is triton_http:
        # Name, type and shape alone, no data and no parameters, as an operator's is answered.
        answered = result.get_response()["outputs"]
        assert answered == [
            {"name": o, "datatype": "UINT32", "shape": [COUNT]} for o in ("nand", "xor")
        ]
    else:
        response = result.get_response()
        assert [o.name for o in response.outputs] == ["nand", "xor"]
        assert not any(o.parameters for o in response.outputs)
        assert list(response.raw_output_contents) == [b"", b""]  # one per output, empty


@pytest.mark.parametrize("loaded", PROTOCOLS, indirect=True)
def test_a_mix_of_shared_memory_and_the_body(loaded: Loaded) -> None:
    """x from a region, y in the body; xor into the region, nand in the response."""
    module, region = loaded.module, loaded.region
    in_body = module.InferInput("y", [COUNT], "UINT32")
    in_body.set_data_from_numpy(Y)
    outputs = [
        region_output(module, "xor", region, X.nbytes, PLACES["xor"]),
        module.InferRequestedOutput("nand"),
    ]
    inputs = [region_input(module, "x", X, region, PLACES["x"]), in_body]
    result = loaded.client.infer(loaded.model, inputs, outputs=outputs)
    assert_same_bytes(region.get(WANT["xor"], PLACES["xor"]), WANT["xor"])
    assert_same_bytes(result.as_numpy("nand"), WANT["nand"])
    assert not region.get(X, PLACES["nand"]).any()  # nand was not written into the region


# --- refusals, as an operator's and alike over both protocols ------------------------------------

Ref = tuple[str, int, int]  # region, byte size, offset


class Refusal(NamedTuple):
    status: str
    field: str | None
    rule: str | None
    words: str


def _parameters(ref: Ref) -> dict[str, Any]:
    region, byte_size, offset = ref
    return {
        "shared_memory_region": region,
        "shared_memory_byte_size": byte_size,
        "shared_memory_offset": offset,
    }


def refused_over_http(
    server: GrpcServer, model: str, inputs: dict[str, Arr | Ref], outputs: dict[str, Ref]
) -> Refusal:
    """The refusal of the request over HTTP: inputs as JSON data or in regions (``Ref``)."""
    body = {
        "inputs": [
            {"name": name, "shape": [COUNT], "datatype": "UINT32"}
            | (
                {"parameters": _parameters(value)}
                if isinstance(value, tuple)
                else {"data": value.tolist()}
            )
            for name, value in inputs.items()
        ],
        "outputs": [
            {"name": name, "parameters": _parameters(ref)} for name, ref in outputs.items()
        ],
    }
    request = urllib.request.Request(
        f"{server.http.base_url}/v2/models/{model}/infer",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    error = json.loads(caught.value.read())
    return Refusal(str(caught.value.code), error.get("field"), error.get("rule"), error["error"])


def refused_over_grpc(
    server: GrpcServer, model: str, inputs: dict[str, Arr | Ref], outputs: dict[str, Ref]
) -> Refusal:
    """The refusal of the request over gRPC: inputs as raw contents or in regions (``Ref``);
    the field and the rule from the trailing metadata."""
    request = service_pb2.ModelInferRequest(model_name=model)
    for name, value in inputs.items():
        entry = request.inputs.add(name=name, datatype="UINT32", shape=[COUNT])
        if not isinstance(value, tuple):
            request.raw_input_contents.append(value.tobytes())
            continue
        region, byte_size, offset = value
        entry.parameters["shared_memory_region"].string_param = region
        entry.parameters["shared_memory_byte_size"].int64_param = byte_size
        entry.parameters["shared_memory_offset"].int64_param = offset
    for name, (region, byte_size, offset) in outputs.items():
        output = request.outputs.add(name=name)
        output.parameters["shared_memory_region"].string_param = region
        output.parameters["shared_memory_byte_size"].int64_param = byte_size
        output.parameters["shared_memory_offset"].int64_param = offset
    with grpcio.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpcio.RpcError) as caught:
            stub.ModelInfer(request, timeout=30)
    error: Any = caught.value
    metadata = {item.key: item.value for item in error.trailing_metadata() or ()}
    return Refusal(
        error.code().name,
        metadata.get("tensorbits-error-field"),
        metadata.get("tensorbits-error-rule"),
        error.details(),
    )


def refused_alike(
    server: GrpcServer, model: str, inputs: dict[str, Arr | Ref], outputs: dict[str, Ref]
) -> Refusal:
    """The request refused over both protocols with the same field, rule and words (400 and
    INVALID_ARGUMENT); the HTTP refusal."""
    over_http = refused_over_http(server, model, inputs, outputs)
    over_grpc = refused_over_grpc(server, model, inputs, outputs)
    assert (over_http.status, over_grpc.status) == ("400", "INVALID_ARGUMENT")
    assert over_http._replace(status="") == over_grpc._replace(status="")
    return over_http


SIZE = X.nbytes
# case: inputs, outputs (region "r" of REGION_BYTES), field, rule, words
REFUSALS = [
    pytest.param(
        {"x": ("r", SIZE, REGION_BYTES - 8), "y": Y}, {}, "x", "region_bounds",
        "is past the end of region", id="input-past-the-region",
    ),
    pytest.param(
        {"x": ("r", SIZE - 4, 0), "y": Y}, {}, "x", "shared_memory_byte_size",
        "the tensor has 4000 bytes", id="input-size-not-the-tensors",
    ),
    pytest.param(
        {"x": X, "y": Y}, {"xor": ("r", SIZE - 4, 0)}, "xor", "shared_memory_byte_size",
        "the output needs 4000 bytes", id="output-region-too-small",
    ),
    pytest.param(
        {"x": X, "y": Y}, {"nand": ("r", SIZE, REGION_BYTES - SIZE + 4)}, "nand",
        "region_bounds", "is past the end of region", id="output-past-the-region",
    ),
    pytest.param(
        {"x": ("r", SIZE, 0), "y": Y}, {"xor": ("r", SIZE, 0)}, "xor", "output_aliasing",
        "its shared-memory bytes overlap input 'x''s; pair_grpc may write its output over "
        "exactly the bytes of an input among: none", id="output-over-an-input",
    ),
    pytest.param(
        {"x": X, "y": ("r", SIZE, 0)}, {"nand": ("r", SIZE, SIZE // 2)}, "nand",
        "output_aliasing", "overlap input 'y''s", id="output-over-half-an-input",
    ),
    pytest.param(
        {"x": X, "y": Y}, {"xor": ("r", SIZE, 0), "nand": ("r", SIZE, SIZE - 4)}, "nand",
        "output_overlap", "overlap output 'xor''s; each output of pair_grpc needs bytes of its",
        id="two-outputs-over-each-other",
    ),
    pytest.param(
        {"x": ("nowhere", SIZE, 0), "y": Y}, {}, "shared_memory_region", "unknown_region",
        "region 'nowhere' is not registered", id="unknown-region",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("inputs", "outputs", "field", "rule", "words"), REFUSALS)
def test_refusals_are_the_operators_over_both_protocols(
    live: Live,
    make_region: Callable[[int], Region],
    inputs: dict[str, Arr | Ref],
    outputs: dict[str, Ref],
    field: str,
    rule: str,
    words: str,
) -> None:
    live.grpc.load_model("pair_grpc", config=CONFIG, files={MODEL_FILE: MODEL})
    live.grpc.register_system_shared_memory("r", make_region(REGION_BYTES).key, REGION_BYTES)
    try:
        refusal = refused_alike(live.server, "pair_grpc", inputs, outputs)
        assert (refusal.field, refusal.rule) == (field, rule), refusal
        assert words in refusal.words, refusal
    finally:
        live.grpc.unregister_system_shared_memory()
        live.grpc.unload_model("pair_grpc")


def test_shared_memory_switched_off_is_refused_as_for_an_operator() -> None:
    """Without TENSORBITS_SHARED_MEMORY: the tensor named, rule ``shared_memory``, the words an
    operator's tensor gets, over both protocols; an input and an output alike."""
    with serve_grpc() as off:
        client = triton_grpc.InferenceServerClient(off.grpc_url)
        client.load_model("pair_off", config=CONFIG, files={MODEL_FILE: MODEL})
        as_input = refused_alike(off, "pair_off", {"x": ("r", SIZE, 0), "y": Y}, {})
        as_output = refused_alike(off, "pair_off", {"x": X, "y": Y}, {"nand": ("r", SIZE, 0)})
        operator = refused_alike(off, "onnx.BitwiseXor-18", {"A": ("r", SIZE, 0), "B": Y}, {})
        client.close()
    assert (as_input.field, as_input.rule) == ("x", "shared_memory")
    assert (as_output.field, as_output.rule) == ("nand", "shared_memory")
    assert as_input.words.replace("'x'", "'A'") == operator.words
    assert as_output.words.startswith("output 'nand': Client shared memory is disabled")
    assert "TENSORBITS_SHARED_MEMORY=true" in as_output.words


# --- admission ------------------------------------------------------------------------------------

MiB = 1 << 20


def test_admission_counts_the_inputs_read_from_regions(
    make_region: Callable[[int], Region],
) -> None:
    """A server that holds 1 MiB in flight: 600 KB in a region and 600 KB out into it is more
    than that (the input is read into host memory), though the request itself is small; half
    as much is served."""
    env = {
        "TENSORBITS_SHARED_MEMORY": "true",
        "TENSORBITS_MAX_BODY_BYTES": str(MiB),
        "TENSORBITS_MAX_INFLIGHT_BYTES": str(MiB),
    }
    count = 150_000  # 600 KB of UINT32
    big = RNG.integers(0, 2**32, count, dtype=np.uint32)
    model = model_bytes(
        [helper.make_node("BitwiseNot", ["x"], ["y"])],
        [tensor("x", TensorProto.UINT32, ["n"])],
        [tensor("y", TensorProto.UINT32, ["n"])],
    )
    region = make_region(2 * big.nbytes)
    region.put(big)
    with (
        serve_grpc(env) as small,
        triton_grpc.InferenceServerClient(small.grpc_url) as grpc_client,
        triton_http.InferenceServerClient(small.http.url) as http_client,
    ):
        grpc_client.load_model("not", config=CONFIG, files={MODEL_FILE: model})
        grpc_client.register_system_shared_memory(region.name, region.key, 2 * big.nbytes)
        for module, client in ((triton_http, http_client), (triton_grpc, grpc_client)):
            for elements in (count, count // 2):
                part = big[:elements]
                inputs = [region_input(module, "x", part, region)]
                outputs = [region_output(module, "y", region, part.nbytes, big.nbytes)]
                if elements < count:
                    client.infer("not", inputs, outputs=outputs)
                    assert_same_bytes(region.get(part, big.nbytes), ~part)
                    continue
                with pytest.raises(InferenceServerException) as caught:
                    client.infer("not", inputs, outputs=outputs)
                status = "413" if module is triton_http else "StatusCode.RESOURCE_EXHAUSTED"
                assert caught.value.status() == status
                assert "TENSORBITS_MAX_INFLIGHT_BYTES" in str(caught.value.message())
        grpc_client.unregister_system_shared_memory()


# --- CUDA regions, in process with the device stand-in ---------------------------------------------

PREFIX = f"/tensorbits_graph_cuda_test_{os.getpid()}"


def _shared_json(name: str, array: Arr, ref: Ref) -> dict[str, Any]:
    return {
        "name": name,
        "shape": list(array.shape),
        "datatype": "UINT32",
        "parameters": _parameters(ref),
    }


def test_cuda_regions_in_process_over_both_protocols() -> None:
    """x in a CUDA region, y in a system region; xor onto the device, nand into the system
    region; then a misaligned device tensor refused (``shared_memory_alignment``)."""
    device = HostDeviceMemory()
    regions = SharedMemoryRegions(PREFIX, 8, 1 << 20, device, "the stand-in")
    system = shm.create_shared_memory_region("sys", f"{PREFIX}_sys", REGION_BYTES)
    try:
        with app_client(shared_memory=True, shared_memory_prefix=PREFIX) as client:
            runtime_of(client).plane.regions = regions
            body = {"parameters": {"config": CONFIG, MODEL_FILE: base64.b64encode(MODEL).decode()}}
            assert client.post("/v2/repository/models/pair/load", json=body).status_code == 200
            handle, buffer = device.export(REGION_BYTES)
            buffer[: X.nbytes] = X.view(np.uint8)
            registration = {
                "raw_handle": {"b64": base64.b64encode(handle).decode()},
                "device_id": 0,
                "byte_size": REGION_BYTES,
            }
            answer = client.post("/v2/cudasharedmemory/region/gpu/register", json=registration)
            assert answer.status_code == 200, answer.text
            shm.set_shared_memory_region(system, [Y], offset=PLACES["y"])
            sys_registration = {"key": f"{PREFIX}_sys", "offset": 0, "byte_size": REGION_BYTES}
            answer = client.post(
                "/v2/systemsharedmemory/region/sys/register", json=sys_registration
            )
            assert answer.status_code == 200, answer.text

            def device_bytes(name: str) -> Arr:
                start = PLACES[name]
                return buffer[start : start + SIZE].view(np.uint32).copy()

            def system_bytes(name: str) -> Arr:
                got = shm.get_contents_as_numpy(system, np.uint32, [COUNT], offset=PLACES[name])
                return np.array(got)

            request = {
                "inputs": [
                    _shared_json("x", X, ("gpu", SIZE, PLACES["x"])),
                    _shared_json("y", Y, ("sys", SIZE, PLACES["y"])),
                ],
                "outputs": [
                    {"name": "xor", "parameters": _parameters(("gpu", SIZE, PLACES["xor"]))},
                    {"name": "nand", "parameters": _parameters(("sys", SIZE, PLACES["nand"]))},
                ],
            }
            response = client.post("/v2/models/pair/infer", json=request)
            assert response.status_code == 200, response.text
            assert [set(o) for o in response.json()["outputs"]] == [
                {"name", "shape", "datatype"}
            ] * 2
            assert_same_bytes(device_bytes("xor"), WANT["xor"])
            assert_same_bytes(system_bytes("nand"), WANT["nand"])

            # gRPC, the same request: the outputs the other way round.
            buffer[PLACES["xor"] : PLACES["xor"] + SIZE] = 0
            message = pb.ModelInferRequest(model_name="pair")
            for name, array, region in (("x", X, "gpu"), ("y", Y, "sys")):
                entry = message.inputs.add(name=name, datatype="UINT32", shape=[COUNT])
                entry.parameters["shared_memory_region"].string_param = region
                entry.parameters["shared_memory_byte_size"].int64_param = array.nbytes
                entry.parameters["shared_memory_offset"].int64_param = PLACES[name]
            for name, region in (("nand", "gpu"), ("xor", "sys")):
                output = message.outputs.add(name=name)
                output.parameters["shared_memory_region"].string_param = region
                output.parameters["shared_memory_byte_size"].int64_param = SIZE
                output.parameters["shared_memory_offset"].int64_param = PLACES[name]
            service = InferenceService(runtime_of(client))
            answer = asyncio.run(service.model_infer(message.SerializeToString()))
            assert list(pb.ModelInferResponse.FromString(answer).raw_output_contents) == [b""] * 2
            assert_same_bytes(device_bytes("nand"), WANT["nand"])
            assert_same_bytes(system_bytes("xor"), WANT["xor"])

            request["inputs"][0]["parameters"]["shared_memory_offset"] = 2  # not on a UINT32
            response = client.post("/v2/models/pair/infer", json=request)
            assert response.status_code == 400, response.text
            assert (response.json()["field"], response.json()["rule"]) == (
                "x",
                "shared_memory_alignment",
            )
            client.post("/v2/systemsharedmemory/unregister")
            client.post("/v2/cudasharedmemory/unregister")
    finally:
        regions.close()
        shm.destroy_shared_memory_region(system)
        device.close_exports()
    assert device.open_now == 0
