"""CUDA shared-memory regions, everything but the GPU: registration as tritonclient sends it
(HTTP and gRPC), one namespace with system regions, the bounds on registration and on every use,
planning and running with inputs and outputs in device regions (mixed with the body and system
regions), in-place and partial aliasing, per-kind status and unregister, release once the last
use ends. The device part is ``support.device_stand_in`` (host buffers behind the same
``DeviceMemory`` interface); tests/gpu/test_cuda_shared_memory.py runs CUDA IPC for real."""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.utils.shared_memory as system_shm
from core.bitref import assert_bits_equal, reference
from support.device_stand_in import HostDeviceMemory
from support.inprocess import TestClient, app_client, runtime_of
from support.v2 import uint8_inputs

from tensorbits.core.shared_memory import Kind, SharedMemoryRegions
from tensorbits.grpc import inference_pb2 as pb
from tensorbits.grpc.service import InferenceService
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.infer import SharedMemoryRef
from tensorbits_protocol.operators import OPERATORS, OperatorSpec

RNG = np.random.default_rng(13)
PREFIX = f"/tensorbits_cuda_test_{os.getpid()}"
MAX_REGIONS = 8
MAX_BYTES = 1 << 20
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
Arr = np.ndarray[Any, Any]


@pytest.fixture
def regions(device: HostDeviceMemory) -> Iterator[SharedMemoryRegions]:
    made = SharedMemoryRegions(PREFIX, MAX_REGIONS, MAX_BYTES, device, "the stand-in")
    yield made
    made.close()
    assert device.open_now == 0  # every handle opened was closed


@pytest.fixture
def client(regions: SharedMemoryRegions) -> Iterator[TestClient]:
    with app_client(shared_memory=True, shared_memory_prefix=PREFIX) as made:
        runtime_of(made).plane.regions = regions
        yield made


def register(
    client: TestClient, name: str, handle: bytes, byte_size: int, device_id: int = 0
) -> Any:
    """The register call exactly as tritonclient.http sends it (base64 text under b64)."""
    body = {
        "raw_handle": {"b64": base64.b64encode(handle).decode()},
        "device_id": device_id,
        "byte_size": byte_size,
    }
    return client.post(f"/v2/cudasharedmemory/region/{name}/register", json=body)


def shared(region: str, nbytes: int, offset: int = 0) -> dict[str, Any]:
    return {
        "shared_memory_region": region,
        "shared_memory_byte_size": nbytes,
        "shared_memory_offset": offset,
    }


def tensor_in(name: str, array: Arr, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "shape": list(array.shape), "datatype": "UINT8"}
    if parameters is None:
        entry["data"] = array.reshape(-1).tolist()
    else:
        entry["parameters"] = parameters
    return entry


def put(buffer: Arr, array: Arr, offset: int) -> None:
    buffer[offset : offset + array.nbytes] = array.reshape(-1).view(np.uint8)


def get(buffer: Arr, like: Arr, offset: int) -> Arr:
    return buffer[offset : offset + like.nbytes].view(like.dtype).reshape(like.shape)


def refused(response: Any, rule: str, field: str | None = None) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    body: dict[str, Any] = response.json()
    assert body["rule"] == rule, body
    if field is not None:
        assert body["field"] == field, body
    return body


# --- round trips -------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPERATORS, ids=lambda op: op.name)
def test_every_model_with_inputs_and_output_on_the_device(
    client: TestClient, device: HostDeviceMemory, op: OperatorSpec
) -> None:
    arrays, params = uint8_inputs(op, RNG)
    want = reference(op.name, arrays, params)
    handle, buffer = device.export(4096)
    assert register(client, "gpu", handle, 4096).status_code == 200
    inputs = []
    for index, (name, array) in enumerate(arrays.items()):
        put(buffer, array, index * 64)
        inputs.append(tensor_in(name, array, shared("gpu", array.nbytes, index * 64)))
    body = {
        "inputs": inputs,
        "outputs": [{"name": op.output, "parameters": shared("gpu", want.nbytes, 1024)}],
        "parameters": params,
    }
    response = client.post(f"/v2/models/{op.name}/infer", json=body)
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    # Name, type and shape only, as Triton answers: no data, and no parameters (its C++ client
    # would read them as binary data's).
    assert set(output) == {"name", "shape", "datatype"}
    assert (output["name"], output["shape"]) == (op.output, list(want.shape))
    assert_bits_equal(get(buffer, want, 1024), want)
    for index, (_, array) in enumerate(arrays.items()):  # the inputs are as they were
        assert_bits_equal(get(buffer, array, index * 64), array)


def test_mixed_body_system_and_device(client: TestClient, device: HostDeviceMemory) -> None:
    a = RNG.integers(0, 256, size=(4, 8), dtype=np.uint8)
    b = RNG.integers(0, 256, size=(4, 8), dtype=np.uint8)
    handle, buffer = device.export(256)
    put(buffer, b, 32)
    assert register(client, "gpu", handle, 256).status_code == 200
    key = f"{PREFIX}_sys"
    system = system_shm.create_shared_memory_region("sys", key, 64)
    try:
        system_shm.set_shared_memory_region(system, [a])
        registration = {"key": key, "offset": 0, "byte_size": 64}
        assert client.post("/v2/systemsharedmemory/region/sys/register", json=registration)
        # A from a system region, B from the device, C into the body.
        body = {
            "inputs": [
                tensor_in("A", a, shared("sys", a.nbytes)),
                tensor_in("B", b, shared("gpu", b.nbytes, 32)),
            ],
            "outputs": [{"name": "C"}],
        }
        response = client.post("/v2/models/onnx.BitwiseXor-18/infer", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == (a ^ b).reshape(-1).tolist()
        # A from the body, B from the device, C onto the device; then C into the system region.
        for out_region, read in (
            ("gpu", lambda: get(buffer, a, 128)),
            ("sys", lambda: system_shm.get_contents_as_numpy(system, np.uint8, [4, 8])),
        ):
            offset = 128 if out_region == "gpu" else 0
            body = {
                "inputs": [tensor_in("A", a), tensor_in("B", b, shared("gpu", b.nbytes, 32))],
                "outputs": [{"name": "C", "parameters": shared(out_region, a.nbytes, offset)}],
            }
            response = client.post("/v2/models/onnx.BitwiseOr-18/infer", json=body)
            assert response.status_code == 200, response.text
            assert_bits_equal(np.array(read()), a | b)
    finally:
        client.post("/v2/systemsharedmemory/unregister")
        system_shm.destroy_shared_memory_region(system)


def test_two_requests_share_a_region(client: TestClient, device: HostDeviceMemory) -> None:
    x = RNG.integers(0, 256, size=32, dtype=np.uint8)
    handle, buffer = device.export(128)
    put(buffer, x, 0)
    assert register(client, "gpu", handle, 128).status_code == 200
    for offset in (32, 64):
        body = {
            "inputs": [tensor_in("InputTensor", x, shared("gpu", 32))],
            "outputs": [{"name": "OutputTensor", "parameters": shared("gpu", 32, offset)}],
        }
        assert client.post(f"/v2/models/{NOT}/infer", json=body).status_code == 200
        assert_bits_equal(get(buffer, x, offset), ~x)


def test_in_place_as_the_operator_allows(client: TestClient, device: HostDeviceMemory) -> None:
    x = RNG.integers(0, 256, size=16, dtype=np.uint8)
    handle, buffer = device.export(64)
    put(buffer, x, 0)
    assert register(client, "gpu", handle, 64).status_code == 200

    def infer(model: str, output: str, inp: str, offset: int) -> Any:
        body = {
            "inputs": [tensor_in(inp, x, shared("gpu", 16))],
            "outputs": [{"name": output, "parameters": shared("gpu", 16, offset)}],
        }
        return client.post(f"/v2/models/{model}/infer", json=body)

    # DML BIT_NOT may write over exactly its input's bytes.
    assert infer(NOT, "OutputTensor", "InputTensor", 0).status_code == 200
    assert_bits_equal(get(buffer, x, 0), ~x)
    # Partly overlapping bytes, or an operator without an in-place rule: refused, untouched.
    before = buffer.copy()
    refused(infer(NOT, "OutputTensor", "InputTensor", 8), "output_aliasing", "OutputTensor")
    refused(infer("onnx.BitwiseNot-18", "Y", "X", 0), "output_aliasing", "Y")
    assert_bits_equal(buffer, before)


# --- registration ------------------------------------------------------------------------------


def test_registration_refusals(
    client: TestClient, device: HostDeviceMemory, regions: SharedMemoryRegions
) -> None:
    handle, _ = device.export(256)
    url = "/v2/cudasharedmemory/region/r/register"
    cases: list[tuple[Any, str, str | None]] = [
        ({"raw_handle": {"b64": "not base64!"}, "device_id": 0, "byte_size": 8},
         "cuda_ipc_handle", "raw_handle"),
        ({"raw_handle": {"b64": base64.b64encode(b"ten bytes!").decode()}, "device_id": 0,
          "byte_size": 8}, "cuda_ipc_handle", "raw_handle"),
        ({"raw_handle": {"b64": "A" * 1000}, "device_id": 0, "byte_size": 8},
         "string_too_long", None),
    ]  # fmt: skip
    for body, rule, field in cases:
        refused(client.post(url, json=body), rule, field)
    refused(register(client, "r", os.urandom(64), 8), "cuda_ipc_handle", "raw_handle")
    body = refused(register(client, "r", handle, 8, device_id=1), "cuda_device", "device_id")
    assert "device_id 1" in body["error"]
    body = refused(register(client, "r", handle, 257), "region_bounds", "byte_size")
    assert "byte_size 257" in body["error"]
    assert "(256 bytes)" in body["error"]
    assert device.open_now == 0  # the refused registration closed what it opened
    refused(register(client, "r", handle, 2**63), "less_than_equal", "byte_size")
    refused(register(client, "r", handle, 2**63 - 1), "max_shared_memory_bytes", "byte_size")
    refused(register(client, "r", handle, -1), "greater_than_equal", None)
    refused(register(client, "x" * 300, handle, 8), "region_name", "name")
    assert regions.status(None, Kind.CUDA) == []
    # The server still registers a good one.
    assert register(client, "r", handle, 256).status_code == 200
    assert device.open_now == 1


def test_one_namespace_with_system_regions_and_shared_limits(
    client: TestClient, device: HostDeviceMemory
) -> None:
    key = f"{PREFIX}_names"
    system = system_shm.create_shared_memory_region("same", key, 64)
    try:
        registration = {"key": key, "offset": 0, "byte_size": 64}
        assert client.post("/v2/systemsharedmemory/region/same/register", json=registration)
        handle, _ = device.export(64)
        body = refused(register(client, "same", handle, 64), "region_exists", "name")
        assert "system region" in body["error"]
        assert register(client, "gpu", handle, 64).status_code == 200
        clash = client.post("/v2/systemsharedmemory/region/gpu/register", json=registration)
        assert "CUDA region" in refused(clash, "region_exists", "name")["error"]
        for index in range(MAX_REGIONS - 2):  # both kinds count towards one limit
            assert register(client, f"more{index}", handle, 64).status_code == 200
        refused(register(client, "one_too_many", handle, 64), "max_shared_memory_regions")
        # The same handle registered many times is opened once per registration (CUDA counts).
        assert device.open_now == MAX_REGIONS - 1
    finally:
        client.post("/v2/systemsharedmemory/unregister")
        system_shm.destroy_shared_memory_region(system)


def test_status_and_unregister_are_per_kind(client: TestClient, device: HostDeviceMemory) -> None:
    handle, _ = device.export(64)
    assert register(client, "gpu", handle, 48).status_code == 200
    entry = {"name": "gpu", "device_id": 0, "byte_size": 48}
    assert client.get("/v2/cudasharedmemory/status").json() == [entry]
    assert client.get("/v2/cudasharedmemory/region/gpu/status").json() == [entry]
    assert client.get("/v2/systemsharedmemory/status").json() == []
    refused(client.get("/v2/systemsharedmemory/region/gpu/status"), "unknown_region")
    refused(client.get("/v2/cudasharedmemory/region/nope/status"), "unknown_region")
    assert "cuda_shared_memory" in client.get("/v2").json()["extensions"]
    # The system routes do not unregister a CUDA region of the same name.
    assert client.post("/v2/systemsharedmemory/region/gpu/unregister").status_code == 200
    assert client.post("/v2/systemsharedmemory/unregister").status_code == 200
    assert device.open_now == 1
    assert client.post("/v2/cudasharedmemory/region/gpu/unregister").status_code == 200
    assert device.open_now == 0
    assert client.get("/v2/cudasharedmemory/status").json() == []
    assert register(client, "a", handle, 8).status_code == 200
    assert register(client, "b", handle, 8).status_code == 200
    assert client.post("/v2/cudasharedmemory/unregister").status_code == 200
    assert device.open_now == 0


# --- use ---------------------------------------------------------------------------------------


def test_use_refusals_leave_the_server_serving(
    client: TestClient, device: HostDeviceMemory
) -> None:
    x = RNG.integers(0, 256, size=16, dtype=np.uint8)
    handle, buffer = device.export(64)
    assert register(client, "gpu", handle, 32).status_code == 200  # 32 of the 64 bytes

    def infer(inp: dict[str, Any], out: dict[str, Any] | None = None) -> Any:
        outputs = [{"name": "OutputTensor", **({"parameters": out} if out else {})}]
        body = {"inputs": [tensor_in("InputTensor", x, inp)], "outputs": outputs}
        return client.post(f"/v2/models/{NOT}/infer", json=body)

    refused(infer(shared("gpu", 16, 17)), "region_bounds", "InputTensor")  # 17 + 16 > 32
    refused(infer(shared("gpu", 16, 2**63 - 1)), "region_bounds", "InputTensor")
    refused(infer(shared("gpu", 15)), "shared_memory_byte_size", "InputTensor")
    refused(infer(shared("nope", 16)), "unknown_region")
    refused(infer(shared("gpu", 16), shared("gpu", 8, 16)), "shared_memory_byte_size")
    refused(infer(shared("gpu", 16), shared("gpu", 16, 24)), "region_bounds", "OutputTensor")
    assert not buffer[32:].any()  # nothing was written past the region
    put(buffer, x, 0)
    assert infer(shared("gpu", 16), shared("gpu", 16, 16)).status_code == 200
    assert_bits_equal(get(buffer, x, 16), ~x)


def test_a_region_in_use_is_released_when_its_last_use_ends(
    regions: SharedMemoryRegions, device: HostDeviceMemory
) -> None:
    handle, _ = device.export(64)
    regions.register_cuda("gpu", handle, 0, 64)
    ref = SharedMemoryRef("gpu", 16, 0)
    with regions.device_bytes(ref, 16, "X", "input") as held:
        regions.unregister("gpu", Kind.CUDA)
        assert device.open_now == 1  # still open under the use
        held[:] = 7  # and still the client's memory
        with pytest.raises(InvalidRequest, match="not registered"):
            regions.locate(ref, 16, "X", "input")
    assert device.open_now == 0


def test_a_region_registered_again_as_the_other_kind_is_refused_at_use(
    regions: SharedMemoryRegions, device: HostDeviceMemory
) -> None:
    """A request planned against a CUDA region whose name became a system region before it
    ran: a 400, never a system read of device addresses (or the reverse)."""
    handle, _ = device.export(64)
    regions.register_cuda("r", handle, 0, 64)
    ref = SharedMemoryRef("r", 16, 0)
    assert regions.locate(ref, 16, "X", "input").on_device
    regions.unregister("r", Kind.CUDA)
    key = f"{PREFIX}_again"
    system = system_shm.create_shared_memory_region("r", key, 64)
    try:
        regions.register_system("r", key, 0, 64)
        with pytest.raises(InvalidRequest) as caught, regions.device_bytes(ref, 16, "X", "input"):
            pass
        assert caught.value.rule == "region_changed"
        regions.unregister("r")
    finally:
        system_shm.destroy_shared_memory_region(system)


# --- gRPC --------------------------------------------------------------------------------------


def test_grpc_register_infer_status_unregister(
    client: TestClient, device: HostDeviceMemory
) -> None:
    """The RPCs as tritonclient.grpc sends them (raw_handle as bytes), on the same regions."""
    service = InferenceService(runtime_of(client))
    x = RNG.integers(0, 2**16, size=8, dtype=np.uint16)
    handle, buffer = device.export(64)
    put(buffer, x, 0)

    def call(rpc: str, message: Any) -> bytes:
        answer: bytes = asyncio.run(getattr(service, rpc)(message.SerializeToString()))
        return answer

    call("cuda_shared_memory_register",
         pb.CudaSharedMemoryRegisterRequest(name="g", raw_handle=handle, device_id=0, byte_size=64))  # fmt: skip
    with pytest.raises(InvalidRequest) as caught:
        call("cuda_shared_memory_register",
             pb.CudaSharedMemoryRegisterRequest(name="h", raw_handle=handle[:10], byte_size=8))  # fmt: skip
    assert caught.value.rule == "cuda_ipc_handle"
    status = pb.CudaSharedMemoryStatusResponse.FromString(
        call("cuda_shared_memory_status", pb.CudaSharedMemoryStatusRequest())
    )
    assert {name: (r.device_id, r.byte_size) for name, r in status.regions.items()} == {
        "g": (0, 64)
    }
    request = pb.ModelInferRequest(model_name="onnx.BitwiseNot-18")
    tensor = request.inputs.add(name="X", datatype="UINT16", shape=[8])
    tensor.parameters["shared_memory_region"].string_param = "g"
    tensor.parameters["shared_memory_byte_size"].int64_param = 16
    output = request.outputs.add(name="Y")
    output.parameters["shared_memory_region"].string_param = "g"
    output.parameters["shared_memory_byte_size"].int64_param = 16
    output.parameters["shared_memory_offset"].int64_param = 32
    response = pb.ModelInferResponse.FromString(call("model_infer", request))
    assert list(response.raw_output_contents) == [b""]  # one per output, empty, as Triton's
    assert not response.outputs[0].parameters
    assert_bits_equal(get(buffer, x, 32), ~x)
    call("cuda_shared_memory_unregister", pb.CudaSharedMemoryUnregisterRequest(name="g"))
    assert device.open_now == 0


def test_a_device_tensor_starts_on_a_multiple_of_its_element_size(
    client: TestClient, device: HostDeviceMemory
) -> None:
    """A misaligned element faults a CUDA kernel (and the device context with it): refused
    before anything runs, for inputs and outputs; aligned offsets are served."""
    x = RNG.integers(0, 2**63, size=4, dtype=np.uint64)
    handle, buffer = device.export(256)
    assert register(client, "gpu", handle, 256).status_code == 200

    def infer(in_offset: int, out_offset: int) -> Any:
        tensor = {"name": "X", "shape": [4], "datatype": "UINT64",
                  "parameters": shared("gpu", 32, in_offset)}  # fmt: skip
        body = {"inputs": [tensor],
                "outputs": [{"name": "Y", "parameters": shared("gpu", 32, out_offset)}]}  # fmt: skip
        return client.post("/v2/models/onnx.BitwiseNot-18/infer", json=body)

    for in_offset, out_offset, field in ((1, 128, "X"), (4, 128, "X"), (0, 129, "Y")):
        body = refused(infer(in_offset, out_offset), "shared_memory_alignment", field)
        assert "8 bytes" in body["error"]
    put(buffer, x, 8)
    assert infer(8, 136).status_code == 200
    assert_bits_equal(get(buffer, x, 136), ~x)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param({"device_id": 0, "byte_size": 8}, "raw_handle", id="no-raw-handle"),
        pytest.param({"raw_handle": {"b64": "AA=="}, "byte_size": 8}, "device_id", id="no-device"),
        pytest.param({"raw_handle": {"b64": "AA=="}, "device_id": 0}, "byte_size", id="no-size"),
        pytest.param(
            {"raw_handle": {"b64": "AA=="}, "device_id": "0", "byte_size": 8},
            "device_id",
            id="device-as-text",
        ),
        pytest.param(
            {"raw_handle": {"b64": "AA=="}, "device_id": 0, "byte_size": 8.0},
            "byte_size",
            id="size-as-float",
        ),
        pytest.param(
            {"raw_handle": {"b64": "AA=="}, "device_id": 2**64, "byte_size": 8},
            "device_id",
            id="device-past-int64",
        ),
        pytest.param(
            {"raw_handle": {"b64": "AA=="}, "device_id": 0, "byte_size": 8, "x": 1},
            "x",
            id="unknown-field",
        ),
    ],
)
def test_malformed_registrations_name_the_field(
    client: TestClient, device: HostDeviceMemory, body: dict[str, Any], field: str
) -> None:
    """A registration missing a field, of the wrong type or past int64: a 400 naming it, before
    any handle is opened; the server still registers a good one."""
    response = client.post("/v2/cudasharedmemory/region/r/register", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["field"] == field, response.json()
    assert device.opened == 0
    handle, _ = device.export(64)
    assert register(client, "r", handle, 64).status_code == 200
