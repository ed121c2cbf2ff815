"""Plans of requests whose tensors are in shared-memory regions (system and CUDA), cached like
any other on both protocols: the second identical request is planned from its template, its
regions located again at each use, so a region unregistered or registered again smaller in
between is refused exactly as an uncached request is, and every answer is byte for byte the
uncached server's. The device is ``support.device_stand_in``'s host buffers."""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.utils.shared_memory as system_shm
from core.bitref import assert_bits_equal
from support.device_stand_in import HostDeviceMemory
from support.inprocess import TestClient, app_client, runtime_of

from tensorbits.api import rest_infer
from tensorbits.core.plan import plan as core_plan
from tensorbits.core.shared_memory import SharedMemoryRegions
from tensorbits.grpc import inference_pb2 as pb
from tensorbits.grpc import messages
from tensorbits.grpc.service import InferenceService
from tensorbits_protocol.errors import TensorbitsError

RNG = np.random.default_rng(29)
PREFIX = f"/tensorbits_region_cache_{os.getpid()}"
NOT = "onnx.BitwiseNot-18"
SIZE = 32  # the input's bytes; the output goes OUT_OFFSET bytes into the same region
OUT_OFFSET = 64
REGION_BYTES = 128
Arr = np.ndarray[Any, Any]


class Region:
    """One region named "r" of either kind, registered through the HTTP routes, and its bytes."""

    def __init__(self, kind: str, client: TestClient, device: HostDeviceMemory) -> None:
        self.kind, self.client, self.device = kind, client, device
        self.system: Any = None
        self.buffer: Arr = np.zeros(0, np.uint8)  # a CUDA region's (the stand-in's host bytes)

    def register(self, nbytes: int) -> None:
        if self.kind == "cuda":
            handle, self.buffer = self.device.export(nbytes)
            body: dict[str, Any] = {"raw_handle": {"b64": _b64(handle)}, "device_id": 0}
            route = "/v2/cudasharedmemory/region/r/register"
        else:
            key = f"{PREFIX}_{nbytes}"
            self.system = system_shm.create_shared_memory_region("r", key, nbytes)
            body = {"key": key, "offset": 0}
            route = "/v2/systemsharedmemory/region/r/register"
        response = self.client.post(route, json={**body, "byte_size": nbytes})
        assert response.status_code == 200, response.text

    def put(self, array: Arr) -> None:
        if self.kind == "cuda":
            self.buffer[: array.nbytes] = array.view(np.uint8)
        else:
            system_shm.set_shared_memory_region(self.system, [array])

    def output(self) -> Arr:
        if self.kind == "cuda":
            return np.array(self.buffer[OUT_OFFSET : OUT_OFFSET + SIZE])
        got: Arr = system_shm.get_contents_as_numpy(self.system, np.uint8, [SIZE], OUT_OFFSET)
        return np.array(got)

    def unregister(self) -> None:
        kind = "cudasharedmemory" if self.kind == "cuda" else "systemsharedmemory"
        assert self.client.post(f"/v2/{kind}/region/r/unregister").status_code == 200
        if self.system is not None:
            system_shm.destroy_shared_memory_region(self.system)
            self.system = None


def _b64(handle: bytes) -> str:
    return base64.b64encode(handle).decode()


@pytest.fixture
def clients(device: HostDeviceMemory) -> Iterator[tuple[TestClient, TestClient]]:
    """A server with the plan cache and one without, on the same regions."""
    regions = SharedMemoryRegions(PREFIX, 8, 1 << 20, device, "the stand-in")
    with (
        app_client(shared_memory=True, shared_memory_prefix=PREFIX) as cached,
        app_client(
            shared_memory=True, shared_memory_prefix=PREFIX, header_cache_bytes=0
        ) as uncached,
    ):
        runtime_of(cached).plane.regions = regions
        runtime_of(uncached).plane.regions = regions
        assert runtime_of(uncached).plane.plans is None
        yield cached, uncached
    regions.close()


@pytest.fixture(params=["cuda", "system"])
def region(
    request: pytest.FixtureRequest,
    clients: tuple[TestClient, TestClient],
    device: HostDeviceMemory,
) -> Iterator[Region]:
    made = Region(request.param, clients[0], device)
    made.register(REGION_BYTES)
    yield made
    if made.system is not None:
        made.unregister()


@pytest.fixture
def planned(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each request planned anew (not from a template), by front end."""
    counted: list[str] = []

    def counting(front: str, plan: Callable[..., Any]) -> Callable[..., Any]:
        def planning(*args: Any, **kwargs: Any) -> Any:
            counted.append(front)
            return plan(*args, **kwargs)

        return planning

    for front, module in (("rest", rest_infer), ("grpc", messages)):  # each calls the core's
        monkeypatch.setattr(module, "plan_request", counting(front, core_plan))
    return counted


# --- the two front ends' calls -----------------------------------------------------------------

HTTP_BODY = {
    "inputs": [
        {
            "name": "X",
            "datatype": "UINT8",
            "shape": [SIZE],
            "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": SIZE},
        }
    ],
    "outputs": [
        {
            "name": "Y",
            "parameters": {
                "shared_memory_region": "r",
                "shared_memory_byte_size": SIZE,
                "shared_memory_offset": OUT_OFFSET,
            },
        }
    ],
}


def _http(client: TestClient) -> tuple[int, bytes]:
    """The status and bytes of the answer to the one JSON body, as tritonclient sends it."""
    response = client.post(f"/v2/models/{NOT}/infer", json=HTTP_BODY)
    return response.status_code, response.content


def _grpc_message() -> bytes:
    request = pb.ModelInferRequest(model_name=NOT, id="same")
    tensor = request.inputs.add(name="X", datatype="UINT8", shape=[SIZE])
    tensor.parameters["shared_memory_region"].string_param = "r"
    tensor.parameters["shared_memory_byte_size"].int64_param = SIZE
    output = request.outputs.add(name="Y")
    output.parameters["shared_memory_region"].string_param = "r"
    output.parameters["shared_memory_byte_size"].int64_param = SIZE
    output.parameters["shared_memory_offset"].int64_param = OUT_OFFSET
    data: bytes = request.SerializeToString()
    return data


def _grpc(client: TestClient) -> tuple[int, bytes]:
    """The answer's bytes (status 200), or the refusal's status and words, as gRPC sends them."""
    service = InferenceService(runtime_of(client))
    try:
        return 200, asyncio.run(service.model_infer(_grpc_message()))
    except TensorbitsError as refusal:
        words = f"{refusal.message}|{refusal.field}|{refusal.rule}".encode()
        return refusal.status_code, words


CALLS = {"rest": _http, "grpc": _grpc}


@pytest.mark.parametrize("front", CALLS)
def test_the_second_request_is_planned_from_its_template(
    clients: tuple[TestClient, TestClient], region: Region, planned: list[str], front: str
) -> None:
    cached, uncached = clients
    call = CALLS[front]
    planned_by_cached = 0
    for _ in range(3):
        x = RNG.integers(0, 256, size=SIZE, dtype=np.uint8)
        region.put(x)
        before = planned.count(front)
        answer = call(cached)
        planned_by_cached += planned.count(front) - before
        assert answer[0] == 200, answer
        assert_bits_equal(region.output(), ~x)
        region.put(x)
        assert call(uncached) == answer  # byte for byte
        assert_bits_equal(region.output(), ~x)
    assert planned_by_cached == 1  # the first one only
    assert planned.count(front) == 4  # the uncached server planned each of its three


@pytest.mark.parametrize("front", CALLS)
def test_a_region_unregistered_or_shrunk_since_is_refused_as_uncached(
    clients: tuple[TestClient, TestClient], region: Region, planned: list[str], front: str
) -> None:
    cached, uncached = clients
    call = CALLS[front]
    assert call(cached)[0] == 200  # the template kept
    region.unregister()
    refused = call(cached)
    assert refused[0] == 400, refused
    assert refused == call(uncached)
    assert b"shared_memory_region" in refused[1]
    region.register(OUT_OFFSET)  # the same name, too small for the output now
    refused = call(cached)
    assert refused[0] == 400, refused
    assert refused == call(uncached)
    assert b"region_bounds" in refused[1]
    assert planned.count(front) == 3  # the cached server planned only its first (a refusal
    # of the uncached server's plan counts as planned)
    region.unregister()
    region.register(REGION_BYTES)  # as large again: answered from the template
    x = RNG.integers(0, 256, size=SIZE, dtype=np.uint8)
    region.put(x)
    assert call(cached)[0] == 200
    assert_bits_equal(region.output(), ~x)
    assert planned.count(front) == 3
