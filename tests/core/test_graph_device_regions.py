"""A graph model whose tensors lie in CUDA shared-memory regions runs on the device where they
are: its inputs read in place, its outputs written into their regions in place, no byte copied
between the host and the device, and the fused kernel given the client's memory itself. Proved
on the host with a device backend that counts every transfer (support/device_backend.py) and
CUDA IPC over host memory (support/device_stand_in.py); every answer is compared byte for byte
with the same request on the NumPy backend with its tensors in the body. Each region is held
and its bounds checked again when the request runs, as an operator's are."""

from __future__ import annotations

import itertools
import json
import os
import shutil
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np
import pytest
from core.graph_models import (
    BATCH_LIMITS,
    binding_example,
    broadcast_model,
    pair_model_bytes,
)
from support.device_backend import StandInDevice
from support.device_stand_in import HostDeviceMemory

from tensorbits.core.backends.base import Backend
from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.graphs import read_onnx
from tensorbits.core.graphs.binding_graph import read_binding_graph
from tensorbits.core.graphs.models import GraphModel
from tensorbits.core.graphs.program import GraphProgram, OnnxGraph
from tensorbits.core.graphs.request import plan_request, run_request
from tensorbits.core.shared_memory import Kind, SharedMemoryRegions
from tensorbits_protocol.dtypes import from_numpy
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.infer import (
    InferRequest,
    RequestedOutput,
    RequestLimits,
    SharedMemoryRef,
    Tensor,
)
from tensorbits_protocol.jsondata import JsonLimits

Arr = np.ndarray[Any, Any]
LIMITS = RequestLimits(16, 1 << 20, 1 << 16, JsonLimits(64, 1 << 16))
HOST = NumpyBackend(1)
PREFIX = f"/tensorbits_graph_device_test_{os.getpid()}"
REGION_BYTES = 1 << 16
SLOT_BYTES = 4096  # each tensor's place in the region: 4 KiB apart, 16-byte aligned
RNG = np.random.default_rng(41)
COUNT = 1000  # elements of the pair model's tensors
_names = itertools.count()
needs_compiler = pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("clang++") is None,
    reason="no C++ compiler to build the fused kernel for the host",
)


def pair_model() -> GraphModel:
    """XOR and NAND of two UINT32 inputs, one fused chain (``pair_model_bytes``)."""
    return GraphModel("pair", OnnxGraph(read_onnx(pair_model_bytes())), {})


def binding_model() -> GraphModel:
    program: GraphProgram = read_binding_graph(json.dumps(binding_example()).encode(), BATCH_LIMITS)
    return GraphModel("binding", program, {})


class Device(NamedTuple):
    backend: StandInDevice
    regions: SharedMemoryRegions
    region: str
    memory: Arr  # the client's view of the region's bytes


@pytest.fixture
def device() -> Iterator[Device]:
    backend = StandInDevice()
    memory = backend.device_memory
    assert isinstance(memory, HostDeviceMemory)
    regions = SharedMemoryRegions(PREFIX, 8, 1 << 20, memory, "the stand-in")
    handle, view = memory.export(REGION_BYTES)
    name = f"gpu{next(_names)}"
    regions.register_cuda(name, handle, 0, REGION_BYTES)
    try:
        yield Device(backend, regions, name, view)
    finally:
        regions.close()
        memory.close_exports()
        backend.close()
        assert memory.open_now == 0


def put(device: Device, array: Arr, slot: int) -> SharedMemoryRef:
    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    device.memory[slot * SLOT_BYTES : slot * SLOT_BYTES + data.size] = data
    return SharedMemoryRef(device.region, data.size, slot * SLOT_BYTES)


def get(device: Device, like: Arr, ref: SharedMemoryRef) -> Arr:
    raw = device.memory[ref.offset : ref.offset + like.nbytes].copy()
    return raw.view(like.dtype).reshape(like.shape)


def body_tensor(name: str, array: Arr) -> Tensor:
    data = np.ascontiguousarray(array)
    return Tensor(name, from_numpy(data.dtype), data.shape, raw=memoryview(data.tobytes()))


def region_tensor(name: str, array: Arr, ref: SharedMemoryRef) -> Tensor:
    return Tensor(name, from_numpy(array.dtype), array.shape, shared_memory=ref)


def on_host(model: GraphModel, inputs: Mapping[str, Arr]) -> dict[str, Arr]:
    """The reference: the NumPy backend, every tensor in the request's body."""
    request = InferRequest(
        tuple(body_tensor(n, a) for n, a in inputs.items()),
        parameters={"binary_data_output": True},
    )
    return run_request(plan_request(model, request, LIMITS), HOST)


def all_in_regions(
    device: Device,
    model: GraphModel,
    inputs: Mapping[str, Arr],
    like: Mapping[str, Arr],
    backend: Backend | None = None,
) -> dict[str, Arr]:
    """``model`` run on the device (or ``backend``, one that places work there) with every
    input and every output (shaped as ``like``) in the region; the outputs read back from it,
    as the client reads them."""
    tensors = tuple(
        region_tensor(n, a, put(device, a, slot)) for slot, (n, a) in enumerate(inputs.items())
    )
    refs = {
        name: SharedMemoryRef(device.region, array.nbytes, (len(inputs) + i) * SLOT_BYTES)
        for i, (name, array) in enumerate(like.items())
    }
    outputs = tuple(RequestedOutput(name, shared_memory=ref) for name, ref in refs.items())
    request = plan_request(model, InferRequest(tensors, outputs=outputs), LIMITS, device.regions)
    answered = run_request(request, backend or device.backend)
    assert answered == {}, "an output in a CUDA region came back to the caller"
    return {name: get(device, like[name], ref) for name, ref in refs.items()}


def assert_same_bytes(got: Mapping[str, Arr], want: Mapping[str, Arr]) -> None:
    assert set(got) == set(want)
    for name, array in want.items():
        assert got[name].dtype == array.dtype, name
        assert got[name].tobytes() == array.tobytes(), name


def pair_inputs() -> dict[str, Arr]:
    return {
        "x": RNG.integers(0, 1 << 32, COUNT, dtype=np.uint32),
        "y": RNG.integers(0, 1 << 32, COUNT, dtype=np.uint32),
    }


@needs_compiler
def test_a_fused_graph_on_regions_runs_in_place_with_no_host_copy(device: Device) -> None:
    model, inputs = pair_model(), pair_inputs()
    want = on_host(model, inputs)
    got = all_in_regions(device, model, inputs, want)
    assert_same_bytes(got, want)
    counts = device.backend.counts
    assert (counts.to_device, counts.to_host) == (0, 0), counts
    assert counts.on_device == 0  # each output written by the kernel itself, not copied after
    # One kernel, given the client's memory (the server's mapping of the region): x and y
    # read, xor and nand written, each at its place.
    start = SharedMemoryRef(device.region, 16)
    with device.regions.device_bytes(start, 16, "x", "input") as region:
        base = region.data.ptr
    (launch,) = counts.launches
    assert list(launch) == [base + slot * SLOT_BYTES for slot in range(4)]


def test_a_graph_that_does_not_fuse_runs_node_by_node_on_the_device(device: Device) -> None:
    """Broadcasting: node by node, each step on the device, the last one writing the output's
    region; its intermediate a device array; nothing crosses to the host."""
    model = GraphModel("broadcast", OnnxGraph(read_onnx(broadcast_model())), {})
    shapes = {"a": (3, 1, 5), "b": (4, 1), "d": (5,)}
    inputs = {n: RNG.integers(-(1 << 15), 1 << 15, s, dtype=np.int16) for n, s in shapes.items()}
    want = on_host(model, inputs)
    got = all_in_regions(device, model, inputs, want)
    assert_same_bytes(got, want)
    counts = device.backend.counts
    assert (counts.to_device, counts.to_host, counts.on_device) == (0, 0, 0), counts
    assert not counts.launches


def test_without_a_fused_kernel_the_chain_still_stays_on_the_device(device: Device) -> None:
    """No fused kernel (none compiled, or a plan past its bounds): node by node, every step
    reading and writing device arrays, the last ones the output regions."""
    device.backend.graphs = None
    model, inputs = pair_model(), pair_inputs()
    want = on_host(model, inputs)
    got = all_in_regions(device, model, inputs, want)
    assert_same_bytes(got, want)
    counts = device.backend.counts
    assert (counts.to_device, counts.to_host, counts.on_device) == (0, 0, 0), counts
    assert not counts.launches


def test_a_binding_graph_on_regions_leaves_the_clients_input_unwritten(device: Device) -> None:
    """The example XORs in place in codes' buffer: on the device that buffer is a device copy
    of the client's input (its region never written), the output written into its region."""
    model = binding_model()
    inputs = {
        "codes": RNG.integers(0, 1 << 32, (4, 8), dtype=np.uint32),
        "query": RNG.integers(0, 1 << 32, (8,), dtype=np.uint32),
    }
    want = on_host(model, inputs)
    got = all_in_regions(device, model, inputs, want)
    assert_same_bytes(got, want)
    counts = device.backend.counts
    assert (counts.to_device, counts.to_host) == (0, 0), counts
    assert counts.on_device == 1  # codes' bytes copied on the device, once
    assert get(device, inputs["codes"], SharedMemoryRef(device.region, 128, 0)).tobytes() == (
        inputs["codes"].tobytes()
    )


@needs_compiler
def test_body_and_region_tensors_mixed_cross_once_each(device: Device) -> None:
    """x in the body, y in a region; xor to the body, nand into a region: x is copied to the
    device once, xor back once, and nothing else crosses."""
    model, inputs = pair_model(), pair_inputs()
    want = on_host(model, inputs)
    y_ref = put(device, inputs["y"], 1)
    nand_ref = SharedMemoryRef(device.region, want["nand"].nbytes, 3 * SLOT_BYTES)
    request = InferRequest(
        (body_tensor("x", inputs["x"]), region_tensor("y", inputs["y"], y_ref)),
        outputs=(
            RequestedOutput("xor", binary=True),
            RequestedOutput("nand", shared_memory=nand_ref),
        ),
    )
    planned = plan_request(model, request, LIMITS, device.regions)
    answered = run_request(planned, device.backend)
    assert answered["xor"].tobytes() == want["xor"].tobytes()
    assert get(device, want["nand"], nand_ref).tobytes() == want["nand"].tobytes()
    counts = device.backend.counts
    assert (counts.to_device, counts.to_host) == (1, 1), counts
    assert counts.bytes_to_device == counts.bytes_to_host == COUNT * 4


@needs_compiler
def test_an_output_the_vector_stores_cannot_take_is_copied_on_the_device(device: Device) -> None:
    """An output 4 bytes past a 16-byte boundary (a whole UINT32, so allowed): the kernel
    writes a device array of its own and the region gets it by a device-to-device copy."""
    model, inputs = pair_model(), pair_inputs()
    want = on_host(model, inputs)
    x_ref, y_ref = put(device, inputs["x"], 0), put(device, inputs["y"], 1)
    xor_ref = SharedMemoryRef(device.region, want["xor"].nbytes, 2 * SLOT_BYTES + 4)
    nand_ref = SharedMemoryRef(device.region, want["nand"].nbytes, 3 * SLOT_BYTES)
    request = InferRequest(
        (region_tensor("x", inputs["x"], x_ref), region_tensor("y", inputs["y"], y_ref)),
        outputs=(
            RequestedOutput("xor", shared_memory=xor_ref),
            RequestedOutput("nand", shared_memory=nand_ref),
        ),
    )
    run_request(plan_request(model, request, LIMITS, device.regions), device.backend)
    assert get(device, want["xor"], xor_ref).tobytes() == want["xor"].tobytes()
    assert get(device, want["nand"], nand_ref).tobytes() == want["nand"].tobytes()
    counts = device.backend.counts
    assert (counts.to_device, counts.to_host, counts.on_device) == (0, 0, 1), counts


def test_regions_are_checked_again_when_the_graph_runs(device: Device) -> None:
    """Planned against the region, then the region unregistered and registered again smaller
    before the run: the run is refused (``region_bounds``), nothing is written, nothing is
    computed; an unregistered output region likewise (``unknown_region``)."""
    model, inputs = pair_model(), pair_inputs()
    x_ref, y_ref = put(device, inputs["x"], 0), put(device, inputs["y"], 1)
    out_ref = SharedMemoryRef(device.region, COUNT * 4, 2 * SLOT_BYTES)
    request = InferRequest(
        (region_tensor("x", inputs["x"], x_ref), region_tensor("y", inputs["y"], y_ref)),
        outputs=(RequestedOutput("xor", shared_memory=out_ref),),
    )
    planned = plan_request(model, request, LIMITS, device.regions)
    memory = device.backend.device_memory
    assert isinstance(memory, HostDeviceMemory)
    handle, _ = memory.export(2 * SLOT_BYTES)
    device.regions.unregister(device.region, Kind.CUDA)
    device.regions.register_cuda(device.region, handle, 0, 2 * SLOT_BYTES)
    with pytest.raises(InvalidRequest) as refused:
        run_request(planned, device.backend)
    assert (refused.value.field, refused.value.rule) == ("xor", "region_bounds")
    device.regions.unregister(device.region, Kind.CUDA)
    with pytest.raises(InvalidRequest) as unknown:
        run_request(planned, device.backend)
    assert unknown.value.rule == "unknown_region"
    assert not device.memory[2 * SLOT_BYTES :].any()  # the first region: nothing written
    assert device.backend.counts.host_crossings == 0
