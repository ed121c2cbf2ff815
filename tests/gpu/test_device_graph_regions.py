"""Graph models on CUDA regions on a real device: inputs read and outputs written in the
regions' memory, no host<->device copy (the backend's transfers counted), the fused kernel
given the region's addresses, the NumPy backend's bytes; and the time it saves at 64 MiB a
tensor against the same graph with its tensors in the body (printed: the figures of bench/results/gpu.md).

The regions are allocations of this process standing for another's (CUDA IPC cannot open an
allocation in the process that made it): ``LocalDeviceMemory`` hands their addresses to
``SharedMemoryRegions`` as ``cuda_ipc.CupyDeviceMemory`` hands an opened handle's, and views
them the same way. The host stand-in of all of this is tests/core/test_graph_device_regions.py.
Skipped without CuPy and a device (in GPU mode, failed: gpu/devices.py)."""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple, cast

import numpy as np
import pytest
from core.graph_models import BATCH_LIMITS, binding_example, pair_model_bytes
from gpu.devices import cupy_backend_or_skip, module_backend

from tensorbits.core.backends import Backend
from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.graphs import read_onnx
from tensorbits.core.graphs.binding_graph import read_binding_graph
from tensorbits.core.graphs.models import GraphModel
from tensorbits.core.graphs.program import GraphProgram, OnnxGraph
from tensorbits.core.graphs.request import plan_request, run_request
from tensorbits.core.shared_memory import DeviceAllocation, SharedMemoryRegions
from tensorbits_protocol.dtypes import from_numpy
from tensorbits_protocol.infer import (
    InferRequest,
    RequestedOutput,
    RequestLimits,
    SharedMemoryRef,
    Tensor,
)
from tensorbits_protocol.jsondata import JsonLimits
from tensorbits_protocol.v2 import CUDA_IPC_HANDLE_BYTES

pytestmark = pytest.mark.gpu

BACKEND = cupy_backend_or_skip()
cupy_backend = module_backend(BACKEND)
Arr = np.ndarray[Any, Any]
LARGE = 16 << 20  # UINT32 elements: 64 MiB a tensor, the figures' size
LIMITS = RequestLimits(16, 1 << 26, 1 << 16, JsonLimits(64, 1 << 16))
PREFIX = f"/tensorbits_gpu_graph_test_{os.getpid()}"
_handles = itertools.count()


class LocalDeviceMemory:
    """``shared_memory.DeviceMemory`` over this process's own allocations (see the module's
    docstring): ``export`` makes one and its handle, ``open`` gives its address back."""

    def __init__(self, cupy: Any, device_id: int = 0) -> None:
        self.device_id = device_id
        self._cupy = cupy
        self._allocations: dict[bytes, Any] = {}

    def export(self, nbytes: int) -> tuple[bytes, Any]:
        handle = f"local{next(_handles)}".encode().ljust(CUDA_IPC_HANDLE_BYTES, b"\0")
        self._allocations[handle] = self._cupy.zeros(nbytes, np.uint8)
        return handle, self._allocations[handle]

    def open(self, raw_handle: bytes) -> DeviceAllocation:
        allocation = self._allocations[raw_handle]
        return DeviceAllocation(int(allocation.data.ptr), int(allocation.nbytes))

    def view(self, pointer: int, nbytes: int) -> Any:
        cuda = self._cupy.cuda
        memory = cuda.UnownedMemory(pointer, nbytes, self, self.device_id)
        return self._cupy.ndarray((nbytes,), np.uint8, cuda.MemoryPointer(memory, 0))

    def close(self, allocation: DeviceAllocation) -> None:
        """Nothing to close: the allocations are this process's own."""


class Counted(NamedTuple):
    to_device: list[int]
    to_host: list[int]


@pytest.fixture
def counted(cupy_backend: Backend, monkeypatch: pytest.MonkeyPatch) -> Counted:
    """The backend's host<->device copies, counted (in bytes) while the test runs."""
    counts = Counted([], [])
    asarray, to_host = cupy_backend.asarray, cupy_backend.to_host

    def counted_asarray(host: Arr) -> Any:
        counts.to_device.append(host.nbytes)
        return asarray(host)

    def counted_to_host(array: Any, out: Arr | None = None) -> Arr:
        counts.to_host.append(int(array.nbytes))
        return to_host(array, out)

    monkeypatch.setattr(cupy_backend, "asarray", counted_asarray)
    monkeypatch.setattr(cupy_backend, "to_host", counted_to_host)
    return counts


class Placed(NamedTuple):
    regions: SharedMemoryRegions
    memory: Any  # the region's bytes, a CuPy array


@pytest.fixture
def region(cupy_backend: Backend) -> Iterator[Callable[[int], Placed]]:
    made: list[SharedMemoryRegions] = []

    def make(nbytes: int) -> Placed:
        device = LocalDeviceMemory(cupy_backend.xp)
        regions = SharedMemoryRegions(PREFIX, 8, 1 << 31, device, "this process")
        handle, memory = device.export(nbytes)
        regions.register_cuda("gpu", handle, 0, nbytes)
        made.append(regions)
        return Placed(regions, memory)

    yield make
    for regions in made:
        regions.close()


def pair_model() -> GraphModel:
    """XOR and NAND of two UINT32 inputs, one fused chain (``pair_model_bytes``)."""
    return GraphModel("pair", OnnxGraph(read_onnx(pair_model_bytes())), {})


def body_request(inputs: Mapping[str, Arr]) -> InferRequest:
    """Every input in the body, every output asked back as binary data."""
    return InferRequest(
        tuple(
            Tensor(n, from_numpy(a.dtype), a.shape, raw=memoryview(a.tobytes()))
            for n, a in inputs.items()
        ),
        parameters={"binary_data_output": True},
    )


def region_request(
    placed: Placed, inputs: Mapping[str, Arr], like: Mapping[str, Arr]
) -> tuple[InferRequest, dict[str, SharedMemoryRef]]:
    """Every input copied into the region (as the client does), one after the other, then
    room for every output (shaped as ``like``)."""
    offset, tensors = 0, []
    for name, array in inputs.items():
        flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        placed.memory[offset : offset + flat.size].set(flat)
        ref = SharedMemoryRef("gpu", flat.size, offset)
        tensors.append(Tensor(name, from_numpy(array.dtype), array.shape, shared_memory=ref))
        offset += -(-flat.size // 256) * 256
    refs = {}
    for name, array in like.items():
        refs[name] = SharedMemoryRef("gpu", array.nbytes, offset)
        offset += -(-array.nbytes // 256) * 256
    outputs = tuple(RequestedOutput(n, shared_memory=r) for n, r in refs.items())
    return InferRequest(tuple(tensors), outputs=outputs), refs


def read_back(placed: Placed, like: Arr, ref: SharedMemoryRef) -> Arr:
    raw = placed.memory[ref.offset : ref.offset + like.nbytes].get()
    return np.asarray(raw).view(like.dtype).reshape(like.shape)


def pair_inputs(count: int) -> dict[str, Arr]:
    rng = np.random.default_rng(8)
    return {n: rng.integers(0, 1 << 32, count, dtype=np.uint32) for n in ("x", "y")}


def test_a_fused_graph_on_regions_copies_nothing_to_or_from_the_host(
    cupy_backend: Backend,
    counted: Counted,
    region: Callable[[int], Placed],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One fused kernel, given the regions' views (its outputs among them: nothing new made
    for them), and no copy to or from the host."""
    fused = cast(Any, cupy_backend).run_fused  # the CuPy backend's (not in Backend)
    given: list[tuple[bool, list[int]]] = []

    def recorded(plan: Any, values: Any, into: Any = None) -> bool:
        ran = bool(fused(plan, values, into))
        given.append((ran, [int(values[slot].data.ptr) for slot in (into or {})]))
        return ran

    monkeypatch.setattr(cupy_backend, "run_fused", recorded)
    model, inputs = pair_model(), pair_inputs(LARGE + 13)
    want = run_request(plan_request(model, body_request(inputs), LIMITS), NumpyBackend())
    placed = region(4 * (LARGE + 13) * 4 + 1024)
    request, refs = region_request(placed, inputs, want)
    counted.to_device.clear()
    planned = plan_request(model, request, LIMITS, placed.regions)
    assert run_request(planned, cupy_backend) == {}
    assert (counted.to_device, counted.to_host) == ([], [])
    for name, ref in refs.items():
        assert read_back(placed, want[name], ref).tobytes() == want[name].tobytes(), name
    # The kernel ran, and wrote each output's value at its place in the region.
    base = int(placed.memory.data.ptr)
    assert given == [(True, [base + refs["xor"].offset, base + refs["nand"].offset])]


def test_a_binding_graph_on_regions_copies_nothing_and_leaves_its_input(
    cupy_backend: Backend, counted: Counted, region: Callable[[int], Placed]
) -> None:
    program: GraphProgram = read_binding_graph(json.dumps(binding_example()).encode(), BATCH_LIMITS)
    model = GraphModel("binding", program, {})
    rng = np.random.default_rng(9)
    inputs = {
        "codes": rng.integers(0, 1 << 32, (4, 8), dtype=np.uint32),
        "query": rng.integers(0, 1 << 32, (8,), dtype=np.uint32),
    }
    want = run_request(plan_request(model, body_request(inputs), LIMITS), NumpyBackend())
    placed = region(4096)
    request, refs = region_request(placed, inputs, want)
    planned = plan_request(model, request, LIMITS, placed.regions)
    run_request(planned, cupy_backend)
    assert (counted.to_device, counted.to_host) == ([], [])
    assert read_back(placed, want["distance"], refs["distance"]).tobytes() == (
        want["distance"].tobytes()
    )
    codes = read_back(placed, inputs["codes"], SharedMemoryRef("gpu", 128, 0))
    assert codes.tobytes() == inputs["codes"].tobytes()  # XOR'ed in a device copy, not here


def best_of(runs: int, work: Callable[[], object]) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        work()
        BACKEND.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def test_in_place_on_regions_is_faster_than_through_the_host(
    cupy_backend: Backend, region: Callable[[int], Placed]
) -> None:
    """The 64 MiB pair graph: tensors in CUDA regions against the same in the body on the CuPy
    backend (four PCIe copies) and on the NumPy backend. The figures are printed (bench/results/gpu.md);
    the regions' run must beat the body's on the same device."""
    model, inputs = pair_model(), pair_inputs(LARGE)
    host = NumpyBackend()
    want = run_request(plan_request(model, body_request(inputs), LIMITS), host)
    placed = region(4 * LARGE * 4 + 1024)
    request, _ = region_request(placed, inputs, want)
    on_regions = plan_request(model, request, LIMITS, placed.regions)
    in_body = plan_request(model, body_request(inputs), LIMITS)
    run_request(on_regions, cupy_backend)  # the kernel compiled before the clock starts
    regions_s = best_of(7, lambda: run_request(on_regions, cupy_backend))
    body_s = best_of(7, lambda: run_request(in_body, cupy_backend))
    host_s = best_of(7, lambda: run_request(in_body, host))
    print(
        f"pair graph, 64 MiB a tensor: CUDA regions {regions_s * 1e3:.2f} ms, body on the "
        f"device {body_s * 1e3:.2f} ms, body on the host {host_s * 1e3:.2f} ms"
    )
    assert regions_s < body_s
