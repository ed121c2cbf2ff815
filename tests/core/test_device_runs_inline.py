"""A run whose inputs and output are all in CUDA regions touches no host byte (``work_bytes``
0), so the data plane launches it inline on the event loop, whatever its size; a run of the
same size whose bytes are the request's and the answer's still goes to a worker thread
(``COMPUTE_INLINE_MAX_BYTES``). The device is ``support.device_stand_in``'s host buffers."""

from __future__ import annotations

import base64
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from core.bitref import assert_bits_equal
from support.device_stand_in import HostDeviceMemory
from support.framing import framed
from support.inprocess import TestClient, app_client, runtime_of
from support.v2 import binary_input, output_array

from tensorbits.api import rest_infer
from tensorbits.core.offload import COMPUTE_INLINE_MAX_BYTES
from tensorbits.core.shared_memory import SharedMemoryRegions

PREFIX = f"/tensorbits_device_inline_{os.getpid()}"
NOT = "onnx.BitwiseNot-18"
SIZE = COMPUTE_INLINE_MAX_BYTES  # as large as a host run that goes to a worker thread
RNG = np.random.default_rng(31)


@pytest.fixture
def client(device: HostDeviceMemory) -> Iterator[TestClient]:
    regions = SharedMemoryRegions(PREFIX, 8, 4 * SIZE, device, "the stand-in")
    with app_client(shared_memory=True, shared_memory_prefix=PREFIX) as made:
        runtime_of(made).plane.regions = regions
        yield made
    regions.close()


@pytest.fixture
def threads(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[threading.Thread]]:
    """The thread that planned each request and the one that ran it (the front end's codec)."""
    seen: dict[str, list[threading.Thread]] = {"plan": [], "encode": []}

    def recorded(phase: str, step: Callable[..., Any]) -> Callable[..., Any]:
        def recording(*args: Any, **kwargs: Any) -> Any:
            seen[phase].append(threading.current_thread())
            return step(*args, **kwargs)

        return recording

    monkeypatch.setattr(rest_infer, "plan", recorded("plan", rest_infer.plan))
    monkeypatch.setattr(rest_infer, "encode", recorded("encode", rest_infer.encode))
    return seen


def _in_region(nbytes: int, offset: int) -> dict[str, Any]:
    return {
        "shared_memory_region": "gpu",
        "shared_memory_byte_size": nbytes,
        "shared_memory_offset": offset,
    }


def test_a_run_all_on_the_device_is_launched_inline(
    client: TestClient, device: HostDeviceMemory, threads: dict[str, list[threading.Thread]]
) -> None:
    x = RNG.integers(0, 256, size=SIZE, dtype=np.uint8)
    handle, buffer = device.export(2 * SIZE)
    buffer[:SIZE] = x
    handle_text = base64.b64encode(handle).decode()
    body = {"raw_handle": {"b64": handle_text}, "device_id": 0, "byte_size": 2 * SIZE}
    assert client.post("/v2/cudasharedmemory/region/gpu/register", json=body).status_code == 200
    request = {
        "inputs": [
            {"name": "X", "datatype": "UINT8", "shape": [SIZE], "parameters": _in_region(SIZE, 0)}
        ],
        "outputs": [{"name": "Y", "parameters": _in_region(SIZE, SIZE)}],
    }
    for _ in range(2):  # planned anew, then from its template: inline both times
        response = client.post(f"/v2/models/{NOT}/infer", json=request)
        assert response.status_code == 200, response.text
        assert_bits_equal(buffer[SIZE:], ~x)
    assert threads["encode"] == threads["plan"]  # each run on the loop that planned it


def test_a_host_run_of_the_same_size_goes_to_a_worker_thread(
    client: TestClient, threads: dict[str, list[threading.Thread]]
) -> None:
    x = RNG.integers(0, 256, size=SIZE, dtype=np.uint8)
    header = {
        "inputs": [binary_input("X", x)],
        "outputs": [{"name": "Y", "parameters": {"binary_data": True}}],
    }
    content, headers = framed(header, x.tobytes())
    response = client.post(f"/v2/models/{NOT}/infer", content=content, headers=headers)
    assert response.status_code == 200, response.text
    assert_bits_equal(output_array(response), ~x)
    ((planned_on,), (ran_on,)) = threads["plan"], threads["encode"]
    assert ran_on is not planned_on  # the loop planned it (a short header), a worker ran it
