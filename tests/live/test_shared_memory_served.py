"""The system shared-memory extension on a real server, driven by stock tritonclient (HTTP and
gRPC) and ``tritonclient.utils.shared_memory``: every model with its tensors in shared memory,
mixed requests, offsets, shared regions, status and unregister; then the hostile cases: offsets
and sizes past the region, unknown regions, keys outside the prefix, a region shrunk or unlinked
after registration (the server answers 4xx and keeps serving, many times over), too many
regions, partial aliasing."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
import tritonclient.utils.shared_memory as shm
from core.bitref import assert_bits_equal, reference
from support.grpc_live import GrpcServer, serve_grpc
from support.regions import region_input, region_inputs, region_output
from support.v2 import uint8_inputs
from tritonclient.utils import InferenceServerException

from tensorbits_protocol.operators import OPERATORS, OperatorSpec

pytestmark = pytest.mark.integration

RNG = np.random.default_rng(5)
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
Arr = np.ndarray[Any, Any]
MAX_REGIONS = 8


@pytest.fixture(scope="module")
def server() -> Iterator[GrpcServer]:
    env = {
        "TENSORBITS_SHARED_MEMORY": "true",
        "TENSORBITS_MAX_SHARED_MEMORY_REGIONS": str(MAX_REGIONS),
    }
    with serve_grpc(env) as running:
        yield running


@pytest.fixture
def client(server: GrpcServer) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(server.http.url)
    yield c
    c.unregister_system_shared_memory()  # every test leaves no region behind
    c.close()


class Region:
    """A POSIX shared-memory object made by tritonclient's own helper, registered or not."""

    counter = 0

    def __init__(self, byte_size: int) -> None:
        Region.counter += 1
        self.name = f"region{Region.counter}"
        self.key = f"/tensorbits_test_{os.getpid()}_{Region.counter}"
        self.byte_size = byte_size
        self.handle = shm.create_shared_memory_region(self.name, self.key, byte_size)

    def put(self, array: Arr, offset: int = 0) -> None:
        shm.set_shared_memory_region(self.handle, [np.ascontiguousarray(array)], offset=offset)

    def get(self, dtype: Any, shape: list[int], offset: int = 0) -> Arr:
        return np.array(shm.get_contents_as_numpy(self.handle, dtype, shape, offset=offset))

    def close(self) -> None:
        shm.destroy_shared_memory_region(self.handle)


@pytest.fixture
def regions() -> Iterator[list[Region]]:
    made: list[Region] = []
    yield made
    for region in made:
        region.close()


def make(regions: list[Region], byte_size: int) -> Region:
    region = Region(byte_size)
    regions.append(region)
    return region


# --- round trips ----------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPERATORS, ids=lambda op: op.name)
def test_every_model_in_shared_memory(
    client: triton.InferenceServerClient, regions: list[Region], op: OperatorSpec
) -> None:
    arrays, params = uint8_inputs(op, RNG)
    want = reference(op.name, arrays, params)
    region = make(regions, 4096)
    client.register_system_shared_memory(region.name, region.key, region.byte_size)
    tensors = region_inputs(triton, arrays, region)
    out = region_output(triton, op.output, region, want.nbytes, offset=1024)
    result = client.infer(op.name, tensors, outputs=[out], parameters=params)
    output = result.get_output(op.output)
    # No byte of the output came over the socket, and no parameters either, as Triton answers
    # (test_triton_cpp_parsing_live.py reads such answers as Triton's C++ client does).
    assert set(output) == {"name", "shape", "datatype"}
    got = region.get(want.dtype, list(want.shape), offset=1024)
    assert_bits_equal(got, want)


def test_mixed_body_and_shared_memory(
    client: triton.InferenceServerClient, regions: list[Region]
) -> None:
    a = RNG.integers(0, 2**32, size=16, dtype=np.uint32)
    b = RNG.integers(0, 2**32, size=16, dtype=np.uint32)
    region = make(regions, 64)
    region.put(b)
    client.register_system_shared_memory(region.name, region.key, 64)
    in_body = triton.InferInput("A", [16], "UINT32")
    in_body.set_data_from_numpy(a)
    result = client.infer(
        "onnx.BitwiseAnd-18",
        [in_body, region_input(triton, "B", b, region)],
        outputs=[triton.InferRequestedOutput("C")],
    )
    assert_bits_equal(result.as_numpy("C"), a & b)


def test_two_requests_share_a_region_and_status(
    client: triton.InferenceServerClient, regions: list[Region]
) -> None:
    region = make(regions, 256)
    x = RNG.integers(0, 256, size=32, dtype=np.uint8)
    region.put(x)
    client.register_system_shared_memory(region.name, region.key, 256)
    for offset in (64, 128):  # both read the same input, write their own output
        client.infer(
            NOT, [region_input(triton, "InputTensor", x, region)],
            outputs=[region_output(triton, "OutputTensor", region, 32, offset=offset)],
        )  # fmt: skip
        assert_bits_equal(region.get(np.uint8, [32], offset=offset), ~x)
    status = client.get_system_shared_memory_status()
    assert status == [{"name": region.name, "key": region.key, "offset": 0, "byte_size": 256}]
    assert client.get_system_shared_memory_status(region.name) == status
    assert "system_shared_memory" in client.get_server_metadata()["extensions"]


def test_over_grpc(server: GrpcServer, regions: list[Region]) -> None:
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    region = make(regions, 128)
    x = RNG.integers(0, 2**16, size=8, dtype=np.uint16)
    region.put(x)
    client.register_system_shared_memory(region.name, region.key, 128)
    try:
        status = client.get_system_shared_memory_status()
        assert status.regions[region.name].byte_size == 128
        result = client.infer(
            NOT, [region_input(triton_grpc, "InputTensor", x, region)],
            outputs=[region_output(triton_grpc, "OutputTensor", region, 16, offset=64)],
        )  # fmt: skip
        assert list(result.get_response().raw_output_contents) == [b""]  # one per output
        assert_bits_equal(region.get(np.uint16, [8], offset=64), ~x)
    finally:
        client.unregister_system_shared_memory()
    assert not client.get_system_shared_memory_status().regions


def test_unregister_semantics(client: triton.InferenceServerClient, regions: list[Region]) -> None:
    region = make(regions, 64)
    x = np.arange(8, dtype=np.uint8)
    region.put(x)
    client.register_system_shared_memory(region.name, region.key, 64)
    with pytest.raises(InferenceServerException) as caught:  # a name registered twice
        client.register_system_shared_memory(region.name, region.key, 64)
    assert "already registered" in str(caught.value.message())
    client.unregister_system_shared_memory(region.name)
    client.unregister_system_shared_memory(region.name)  # not registered: nothing, as Triton
    with pytest.raises(InferenceServerException) as caught:
        client.infer(NOT, [region_input(triton, "InputTensor", x, region)])
    assert caught.value.status() == "400"
    assert f"region '{region.name}' is not registered" in str(caught.value.message())
    assert client.get_system_shared_memory_status() == []


# --- hostile ------------------------------------------------------------------------------------


def post(server: GrpcServer, path: str, document: Any) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{server.http.base_url}{path}", data=json.dumps(document).encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, {}
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize(
    ("registration", "rule"),
    [
        ({"key": "/other_program", "byte_size": 8}, "shared_memory_prefix"),
        ({"key": "/tensorbits_missing_object", "byte_size": 8}, "shared_memory_key"),
        ({"key": "/tensorbits/../etc", "byte_size": 8}, "shared_memory_key"),
        ({"key": "/tensorbits_x", "byte_size": -1}, "greater_than_equal"),
        ({"key": "/tensorbits_x", "byte_size": 2**64}, "less_than_equal"),
        ({"key": "/tensorbits_x", "byte_size": 8, "offset": 2**63}, "less_than_equal"),
        ({"key": 7, "byte_size": 8}, "string_type"),
    ],
)
def test_bad_registrations(
    server: GrpcServer, client: triton.InferenceServerClient, registration: Any, rule: str
) -> None:
    status, body = post(server, "/v2/systemsharedmemory/region/bad/register", registration)
    assert status == 400
    assert body["rule"] == rule, body
    assert client.get_system_shared_memory_status() == []


def test_registration_past_the_object(
    server: GrpcServer, client: triton.InferenceServerClient, regions: list[Region]
) -> None:
    region = make(regions, 64)
    for offset, size, rule in (
        (0, 65, "region_bounds"),
        (60, 8, "region_bounds"),
        (2**62, 8, "region_bounds"),
        (0, 2**62, "max_shared_memory_bytes"),  # past the server's bound before the object's
    ):
        status, body = post(
            server, f"/v2/systemsharedmemory/region/{region.name}/register",
            {"key": region.key, "offset": offset, "byte_size": size},
        )  # fmt: skip
        assert (status, body["rule"]) == (400, rule), body


@pytest.mark.parametrize(
    ("offset", "size", "rule"),
    [
        (60, 8, "region_bounds"),  # past the region's end
        (2**62, 8, "region_bounds"),  # far past
        (0, 7, "shared_memory_byte_size"),  # not the tensor's size
        (0, 2**63 - 1, "shared_memory_byte_size"),
    ],
)
def test_uses_past_the_region(
    client: triton.InferenceServerClient,
    regions: list[Region],
    offset: int,
    size: int,
    rule: str,
) -> None:
    region = make(regions, 64)
    client.register_system_shared_memory(region.name, region.key, 64)
    tensor = triton.InferInput("InputTensor", [8], "UINT8")
    tensor.set_shared_memory(region.name, size, offset=offset)
    with pytest.raises(InferenceServerException) as caught:
        client.infer(NOT, [tensor])
    assert caught.value.status() == "400"
    assert client.is_server_live()


def test_unknown_region_and_partial_aliasing(
    client: triton.InferenceServerClient, regions: list[Region]
) -> None:
    tensor = triton.InferInput("InputTensor", [8], "UINT8")
    tensor.set_shared_memory("nope", 8)
    with pytest.raises(InferenceServerException) as caught:
        client.infer(NOT, [tensor])
    assert "region 'nope' is not registered" in str(caught.value.message())
    region = make(regions, 64)
    region.put(np.arange(8, dtype=np.uint8))
    client.register_system_shared_memory(region.name, region.key, 64)
    x = np.arange(8, dtype=np.uint8)
    with pytest.raises(InferenceServerException) as caught:  # output overlaps the input by half
        client.infer(
            NOT, [region_input(triton, "InputTensor", x, region)],
            outputs=[region_output(triton, "OutputTensor", region, 8, offset=4)],
        )  # fmt: skip
    assert "overlap" in str(caught.value.message())


def test_in_place_over_exactly_the_input(
    client: triton.InferenceServerClient, regions: list[Region]
) -> None:
    op = next(op for op in OPERATORS if op.name == NOT)
    assert op.in_place == ("InputTensor",)
    region = make(regions, 64)
    x = np.arange(8, dtype=np.uint8)
    region.put(x)
    client.register_system_shared_memory(region.name, region.key, 64)
    client.infer(
        NOT, [region_input(triton, "InputTensor", x, region)],
        outputs=[region_output(triton, "OutputTensor", region, 8)],
    )  # fmt: skip
    assert_bits_equal(region.get(np.uint8, [8]), ~x)


def test_shrunk_and_unlinked_regions(
    server: GrpcServer, client: triton.InferenceServerClient, regions: list[Region]
) -> None:
    """A client that truncates its object after registering it, then asks the server to read
    or write it: a SIGBUS for a server that maps the object; a 400 here, every time."""
    region = make(regions, 1 << 16)
    x = np.arange(4096, dtype=np.uint8)
    region.put(x)
    client.register_system_shared_memory(region.name, region.key, 1 << 16)
    path = Path("/dev/shm") / region.key[1:]
    for _ in range(50):
        os.truncate(path, 16)  # shrink it under the server
        for output_offset in (None, 8192):
            outputs = None
            if output_offset is not None:
                outputs = [region_output(triton, "OutputTensor", region, 4096, output_offset)]
            with pytest.raises(InferenceServerException) as caught:
                client.infer(NOT, [region_input(triton, "InputTensor", x, region)], outputs=outputs)
            assert caught.value.status() == "400"
            assert "smaller than when it was registered" in str(caught.value.message())
        os.truncate(path, 1 << 16)  # and back: the registration works again
        region.put(x)
        result = client.infer(NOT, [region_input(triton, "InputTensor", x, region)])
        assert_bits_equal(result.as_numpy("OutputTensor"), ~x)
    # Unlinked after registration: the server still holds the object it registered.
    os.unlink(path)
    result = client.infer(NOT, [region_input(triton, "InputTensor", x, region)])
    assert_bits_equal(result.as_numpy("OutputTensor"), ~x)
    assert server.http.get("/v2/health/live") == 200
    regions.remove(region)  # its key is gone already


def test_too_many_regions(client: triton.InferenceServerClient, regions: list[Region]) -> None:
    made = [make(regions, 8) for _ in range(MAX_REGIONS + 1)]
    for region in made[:MAX_REGIONS]:
        client.register_system_shared_memory(region.name, region.key, 8)
    with pytest.raises(InferenceServerException) as caught:
        client.register_system_shared_memory(made[-1].name, made[-1].key, 8)
    assert "TENSORBITS_MAX_SHARED_MEMORY_REGIONS" in str(caught.value.message())


def test_cuda_shared_memory_is_refused_without_cupy(server: GrpcServer) -> None:
    """The NumPy backend has no device memory to share: registering a CUDA IPC handle (as
    tritonclient.utils.cuda_shared_memory sends it) is a clear 400 / INVALID_ARGUMENT."""
    registration = {"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 64}
    status, body = post(server, "/v2/cudasharedmemory/region/gpu/register", registration)
    assert (status, body["rule"]) == (400, "cuda_shared_memory")
    assert "needs the CuPy backend; this server runs numpy" in body["error"]
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as caught:
        client.register_cuda_shared_memory("gpu", b"\0" * 64, 0, 64)
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "needs the CuPy backend" in str(caught.value.message())
    assert not client.get_cuda_shared_memory_status().regions
    http = triton.InferenceServerClient(server.http.url)
    assert http.get_cuda_shared_memory_status() == []


def test_oversized_region_names(server: GrpcServer, client: triton.InferenceServerClient) -> None:
    name = "r" * 10_000
    status, body = post(
        server, f"/v2/systemsharedmemory/region/{name}/register",
        {"key": "/tensorbits_x", "byte_size": 8},
    )  # fmt: skip
    assert (status, body["rule"]) == (400, "region_name")
    assert len(body["error"]) < 400
    with pytest.raises(InferenceServerException) as caught:
        client.get_system_shared_memory_status(name)
    assert caught.value.status() == "400"
    assert len(str(caught.value.message())) < 400
    grpc_client = triton_grpc.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as caught:
        grpc_client.register_system_shared_memory(name, "/tensorbits_x", 8)
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert server.http.get("/v2/health/live") == 200
