"""Triton's CUDA shared-memory extension on a real server with the CuPy backend, driven as a
client drives it: device memory made and filled by stock ``tritonclient.utils.cuda_shared_memory``
(cudaMalloc + cudaIpcGetMemHandle in this process), registered and used through stock
``tritonclient.http`` and ``tritonclient.grpc``. The server is a separate process because CUDA
cannot open an IPC handle in the process that exported it.

Round trips: every model with its inputs and output in CUDA regions (HTTP and gRPC); every
placement of two inputs and an output over the body, a CUDA region and a system region; offsets
inside a region (the bytes around an output untouched); two requests sharing a region; in place
where the operator allows it; one handle under two names; a 256 MiB tensor, bit-exact. Then
status and unregister, and the hostile cases (registrations: bad, short, random or undecodable
handles, sizes past the allocation, another device, a name a system region has; uses: offsets
and sizes past the region, wrong sizes, unknown regions, partial or forbidden aliasing,
unaligned offsets), each followed by a good request on the same server.

Skipped, with the reason, where CuPy or a CUDA device is missing (gpu/devices.py) and, separately,
where ``tritonclient.utils.cuda_shared_memory`` cannot be imported (it needs the cuda-bindings
package, ``pip install 'tritonclient[cuda]'``); in GPU mode (gpu/devices.py) either fails instead.
docs/gpu.md says how the GPU check runs this.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
import tritonclient.utils.shared_memory as shm
from core.bitref import assert_bits_equal, reference
from gpu.devices import cupy_backend_or_skip, unavailable
from support.grpc_live import GrpcServer
from support.live import LiveServer, free_port, serve
from support.regions import region_input, region_inputs, region_output
from support.v2 import uint8_inputs
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tensorbits_protocol.operators import OPERATORS, OperatorSpec, get_operator

pytestmark = [pytest.mark.gpu, pytest.mark.integration]

cupy_backend_or_skip().close()  # only the check: the server builds its own backend

try:
    import tritonclient.utils.cuda_shared_memory as cudashm
except Exception as exc:  # RuntimeError (not ImportError) when cuda-bindings is missing
    unavailable(f"tritonclient.utils.cuda_shared_memory cannot be imported: {exc}")

Arr = np.ndarray[Any, Any]
RNG = np.random.default_rng(13)
DEVICE = 0  # the test's allocations and the server's TENSORBITS_DEVICE_ID
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
XOR = "onnx.BitwiseXor-18"
MiB = 1 << 20
PROTOCOLS = {"http": triton, "grpc": triton_grpc}


# --- the server and the regions -----------------------------------------------------------------


@contextlib.contextmanager
def cupy_server(shared_memory: bool = True) -> Iterator[GrpcServer]:
    """A CuPy server, HTTP and gRPC on free ports. Started as ``python -m tensorbits.server.cli`` with
    this interpreter: a GPU machine given the source tree on PYTHONPATH has no ``tensorbits``
    script beside it."""
    grpc_port = free_port()
    env = {
        "TENSORBITS_BACKEND": "cupy",
        "TENSORBITS_DEVICE_ID": str(DEVICE),
        "TENSORBITS_SHARED_MEMORY": str(shared_memory).lower(),
        "TENSORBITS_GRPC_PORT": str(grpc_port),
    }
    with serve(env, argv=[sys.executable, "-m", "tensorbits.server.cli", "serve"]) as http:
        yield GrpcServer(http, grpc_port)


class CudaRegion:
    """Device memory from tritonclient's helper, with a host image of its bytes: ``put`` writes
    arrays at offsets (the helper writes whole buffers from the start only), ``get`` reads back."""

    def __init__(self, name: str, byte_size: int) -> None:
        self.name = name
        self.byte_size = byte_size
        self.handle = cudashm.create_shared_memory_region(name, byte_size, DEVICE)
        self.raw_handle: bytes = cudashm.get_raw_handle(self.handle)  # base64, as clients send
        self.image = RNG.integers(0, 256, byte_size, dtype=np.uint8)  # not zeros: canaries
        self.flush()

    def flush(self) -> None:
        cudashm.set_shared_memory_region(self.handle, [self.image])

    def put(self, array: Arr, offset: int = 0) -> None:
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        self.image[offset : offset + data.size] = data
        self.flush()

    def contents(self) -> Arr:
        raw: Arr = cudashm.get_contents_as_numpy(self.handle, np.uint8, [self.byte_size])
        return raw

    def get(self, dtype: Any, shape: list[int], offset: int = 0) -> Arr:
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        array: Arr = self.contents()[offset : offset + nbytes].copy().view(dtype).reshape(shape)
        return array

    def close(self) -> None:
        cudashm.destroy_shared_memory_region(self.handle)
        del self.handle  # the helper frees the memory when its last reference goes


class SystemRegion:
    """A POSIX shared-memory object from tritonclient's helper (key under the default prefix)."""

    def __init__(self, name: str, byte_size: int) -> None:
        self.name = name
        self.key = f"/tensorbits_gpu_test_{os.getpid()}_{name}"
        self.byte_size = byte_size
        self.handle = shm.create_shared_memory_region(name, self.key, byte_size)

    def put(self, array: Arr, offset: int = 0) -> None:
        shm.set_shared_memory_region(self.handle, [np.ascontiguousarray(array)], offset=offset)

    def get(self, dtype: Any, shape: list[int], offset: int = 0) -> Arr:
        view: Arr = shm.get_contents_as_numpy(self.handle, dtype, shape, offset=offset)
        return view.copy()

    def close(self) -> None:
        shm.destroy_shared_memory_region(self.handle)


class Regions:
    """The regions one test makes, an HTTP and a gRPC client of the server; on close every
    region is unregistered on the server *before* its memory is freed (CUDA leaves a freed
    allocation that another process still has open undefined)."""

    counter = itertools.count()

    def __init__(self, server: GrpcServer) -> None:
        self.live = server.http
        self.http = triton.InferenceServerClient(
            server.http.url, connection_timeout=120, network_timeout=120
        )
        self.grpc = triton_grpc.InferenceServerClient(server.grpc_url)
        self.made: list[CudaRegion | SystemRegion] = []

    def client(self, protocol: str) -> Any:
        return self.http if protocol == "http" else self.grpc

    def cuda(self, byte_size: int, *, register: str | None = "http") -> CudaRegion:
        region = CudaRegion(f"cuda{next(self.counter)}", byte_size)
        self.made.append(region)
        if register is not None:
            self.client(register).register_cuda_shared_memory(
                region.name, region.raw_handle, DEVICE, byte_size
            )
        return region

    def system(self, byte_size: int, *, register: bool = True) -> SystemRegion:
        region = SystemRegion(f"sys{next(self.counter)}", byte_size)
        self.made.append(region)
        if register:
            self.http.register_system_shared_memory(region.name, region.key, byte_size)
        return region

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.http.unregister_cuda_shared_memory()
            self.http.unregister_system_shared_memory()
        finally:
            for region in self.made:
                region.close()
            self.http.close()
            self.grpc.close()


@pytest.fixture(scope="module")
def server() -> Iterator[GrpcServer]:
    """The server of every test but the ones that may break theirs."""
    with cupy_server() as running:
        yield running


@pytest.fixture
def regions(server: GrpcServer) -> Iterator[Regions]:
    with Regions(server) as made:
        yield made


@pytest.fixture(scope="module")
def expendable_server() -> Iterator[GrpcServer]:
    """A server of its own for requests that could fault its CUDA context: a fault there must
    not fail every other test with it."""
    with cupy_server() as running:
        yield running


def body_input(module: Any, name: str, array: Arr) -> Any:
    tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


def no_output_bytes(protocol: str, result: Any, output: str) -> None:
    """Nothing of an output in a region came over the socket, and the answer is shaped as
    Triton's, which its C++ client reads: over HTTP the output's name, shape and type alone (no
    parameters, which it would take for binary data's); over gRPC one empty raw entry."""
    if protocol == "http":
        assert set(result.get_output(output)) == {"name", "shape", "datatype"}
    else:
        assert list(result.get_response().raw_output_contents) == [b""]


# --- raw requests: the rule and field of a refusal ----------------------------------------------


def call(server: LiveServer, method: str, path: str, document: Any = None) -> tuple[int, Any]:
    """Status and JSON body of a request built by hand (bytes a stock client would not send)."""
    data = None if document is None else json.dumps(document).encode()
    request = urllib.request.Request(f"{server.base_url}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            body = response.read()
            return response.status, json.loads(body) if body else None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def register_raw(server: LiveServer, name: str, registration: Any) -> tuple[int, Any]:
    return call(server, "POST", f"/v2/cudasharedmemory/region/{name}/register", registration)


def handle_of(region: CudaRegion, byte_size: int, device_id: int = DEVICE) -> dict[str, Any]:
    """A registration body for ``region``'s real handle."""
    raw_handle = {"b64": region.raw_handle.decode()}
    return {"raw_handle": raw_handle, "device_id": device_id, "byte_size": byte_size}


def in_region(name: str, region: str, shape: list[int] | None = None, **at: int) -> Any:
    """An input (with ``shape``, UINT8) or a requested output (without) in ``region``."""
    parameters: dict[str, Any] = {"shared_memory_region": region}
    parameters.update({f"shared_memory_{key}": value for key, value in at.items()})
    if shape is None:
        return {"name": name, "parameters": parameters}
    return {"name": name, "shape": shape, "datatype": "UINT8", "parameters": parameters}


def infer_raw(server: LiveServer, model: str, document: Any) -> tuple[int, Any]:
    return call(server, "POST", f"/v2/models/{model}/infer", document)


def assert_refused(status: int, body: Any, rule: str, field: str | None = None) -> None:
    assert status == 400, (status, body)
    assert body["rule"] == rule, body
    if field is not None:
        assert body["field"] == field, body


def assert_serves(regions: Regions) -> None:
    """A good request with its tensors in device memory still succeeds: the server neither died
    nor lost its CUDA context (a kernel fault would poison every later request)."""
    region = regions.cuda(256)
    x = RNG.integers(0, 256, 64, dtype=np.uint8)
    region.put(x)
    regions.http.infer(
        NOT, [region_input(triton, "InputTensor", x, region)],
        outputs=[region_output(triton, "OutputTensor", region, 64, offset=128)],
    )  # fmt: skip
    assert_bits_equal(region.get(np.uint8, [64], offset=128), ~x)
    assert regions.live.get("/v2/health/ready") == 200


# --- round trips ----------------------------------------------------------------------------------


def test_extension_is_listed_and_nothing_is_registered(regions: Regions) -> None:
    extensions = regions.http.get_server_metadata()["extensions"]
    assert "cuda_shared_memory" in extensions
    assert "system_shared_memory" in extensions
    assert regions.http.get_cuda_shared_memory_status() == []
    assert not regions.grpc.get_cuda_shared_memory_status().regions


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("op", OPERATORS, ids=lambda op: op.name)
def test_every_model_in_cuda_regions(regions: Regions, op: OperatorSpec, protocol: str) -> None:
    module, client = PROTOCOLS[protocol], regions.client(protocol)
    arrays, params = uint8_inputs(op, RNG)
    want = reference(op.name, arrays, params)
    region = regions.cuda(4096, register=protocol)
    tensors = region_inputs(module, arrays, region)
    out = region_output(module, op.output, region, want.nbytes, offset=1024)
    result = client.infer(op.name, tensors, outputs=[out], parameters=params)
    no_output_bytes(protocol, result, op.output)
    assert_bits_equal(region.get(want.dtype, list(want.shape), offset=1024), want)


PLACES = ("body", "cuda", "system")
MIXES = list(itertools.product(PLACES, PLACES, PLACES))  # A, B, output


@pytest.mark.parametrize(
    ("protocol", "mix"),
    [("http", mix) for mix in MIXES]
    + [("grpc", ("body", "cuda", "system")), ("grpc", ("system", "cuda", "body"))]
    + [("grpc", ("cuda", "system", "cuda"))],
    ids=lambda value: value if isinstance(value, str) else "-".join(value),
)
def test_mixed_placements(regions: Regions, protocol: str, mix: tuple[str, str, str]) -> None:
    """Each of A, B and the output in the body, a CUDA region or a system region (UINT32)."""
    module, client = PROTOCOLS[protocol], regions.client(protocol)
    a = RNG.integers(0, 2**32, size=(4, 8), dtype=np.uint32)
    b = RNG.integers(0, 2**32, size=(4, 8), dtype=np.uint32)
    places: dict[str, CudaRegion | SystemRegion] = {
        "cuda": regions.cuda(512),
        "system": regions.system(512),
    }
    tensors = []
    for (name, array, offset), place in zip((("A", a, 0), ("B", b, 128)), mix[:2], strict=True):
        if place == "body":
            tensors.append(body_input(module, name, array))
        else:
            places[place].put(array, offset)
            tensors.append(region_input(module, name, array, places[place], offset))
    if mix[2] == "body":
        result = client.infer(XOR, tensors, outputs=[module.InferRequestedOutput("C")])
        got = result.as_numpy("C")
    else:
        out = region_output(module, "C", places[mix[2]], a.nbytes, offset=256)
        no_output_bytes(protocol, client.infer(XOR, tensors, outputs=[out]), "C")
        got = places[mix[2]].get(np.uint32, [4, 8], offset=256)
    assert_bits_equal(got, a ^ b)


def test_offsets_inside_a_region_touch_only_the_output(regions: Regions) -> None:
    region = regions.cuda(MiB)
    for in_offset, out_offset in ((0, 4096), (65536, 8192), (MiB - 256, 1024), (512, MiB - 128)):
        x = RNG.integers(0, 2**16, size=64, dtype=np.uint16)
        region.put(x, in_offset)
        before = region.contents()
        regions.http.infer(
            NOT, [region_input(triton, "InputTensor", x, region, in_offset)],
            outputs=[region_output(triton, "OutputTensor", region, x.nbytes, out_offset)],
        )  # fmt: skip
        after = region.contents()
        assert_bits_equal(after[out_offset : out_offset + x.nbytes].view(np.uint16), ~x)
        after[out_offset : out_offset + x.nbytes] = before[out_offset : out_offset + x.nbytes]
        assert np.array_equal(after, before), "bytes outside the output changed"
        region.image[:] = before
        region.put(~x, out_offset)  # the image follows the device


def test_two_requests_share_a_region_and_its_status(regions: Regions) -> None:
    region = regions.cuda(256)
    x = RNG.integers(0, 256, size=32, dtype=np.uint8)
    region.put(x)
    for offset, protocol in ((64, "http"), (128, "grpc")):  # registered over HTTP, used by both
        module = PROTOCOLS[protocol]
        regions.client(protocol).infer(
            NOT, [region_input(module, "InputTensor", x, region)],
            outputs=[region_output(module, "OutputTensor", region, 32, offset=offset)],
        )  # fmt: skip
        assert_bits_equal(region.get(np.uint8, [32], offset=offset), ~x)
    entry = {"name": region.name, "device_id": DEVICE, "byte_size": 256}
    assert regions.http.get_cuda_shared_memory_status() == [entry]
    assert regions.http.get_cuda_shared_memory_status(region.name) == [entry]
    status = regions.grpc.get_cuda_shared_memory_status().regions
    assert list(status) == [region.name]
    assert (status[region.name].device_id, status[region.name].byte_size) == (DEVICE, 256)


IN_PLACE = [op for op in OPERATORS if op.in_place]


@pytest.mark.parametrize("op", IN_PLACE, ids=lambda op: op.name)
def test_in_place_where_the_operator_allows_it(regions: Regions, op: OperatorSpec) -> None:
    arrays, params = uint8_inputs(op, RNG)
    want = reference(op.name, arrays, params)
    region = regions.cuda(1024)
    offsets = {name: index * 256 for index, (name, _) in enumerate(arrays.items())}
    for name, array in arrays.items():
        region.put(array, offsets[name])
    target = op.in_place[0]  # the output over exactly this input's bytes
    regions.http.infer(
        op.name,
        [region_input(triton, n, a, region, offsets[n]) for n, a in arrays.items()],
        outputs=[region_output(triton, op.output, region, want.nbytes, offsets[target])],
        parameters=params,
    )
    assert_bits_equal(region.get(want.dtype, list(want.shape), offsets[target]), want)


def test_one_handle_under_two_names(regions: Regions) -> None:
    """CUDA opens an allocation once per process and counts further opens: a second name for
    the same handle works, and unregistering one name leaves the other usable."""
    first = regions.cuda(512)
    regions.http.register_cuda_shared_memory("alias", first.raw_handle, DEVICE, 512)
    x = RNG.integers(0, 256, size=64, dtype=np.uint8)
    first.put(x)
    for name in (first.name, "alias"):
        tensor = triton.InferInput("InputTensor", [64], "UINT8")
        tensor.set_shared_memory(name, 64)
        output = triton.InferRequestedOutput("OutputTensor")
        output.set_shared_memory(name, 64, offset=256)
        regions.http.infer(NOT, [tensor], outputs=[output])
        assert_bits_equal(first.get(np.uint8, [64], offset=256), ~x)
        first.put(x + 1, 256)  # reset the output bytes between the two
    regions.http.unregister_cuda_shared_memory(first.name)
    tensor = triton.InferInput("InputTensor", [64], "UINT8")
    tensor.set_shared_memory("alias", 64)
    result = regions.http.infer(NOT, [tensor])
    assert_bits_equal(result.as_numpy("OutputTensor"), ~x)


def test_256_mib_round_trip_is_bit_exact(regions: Regions) -> None:
    n = 256 * MiB
    x = RNG.integers(0, 256, size=n, dtype=np.uint8)
    source = regions.cuda(n)
    target = regions.cuda(n)
    source.put(x)
    for protocol, module in PROTOCOLS.items():
        target.put(x)  # stale bytes that a skipped write would leave
        regions.client(protocol).infer(
            NOT, [region_input(module, "InputTensor", x, source)],
            outputs=[region_output(module, "OutputTensor", target, n)],
        )  # fmt: skip
        got = target.get(np.uint8, [n])
        assert np.array_equal(got, ~x), f"{protocol}: the 256 MiB result differs"
    assert np.array_equal(source.get(np.uint8, [n]), x), "the input was written"


# --- status and unregister ----------------------------------------------------------------------


def test_status_and_unregister_semantics(regions: Regions) -> None:
    a, b = regions.cuda(128), regions.cuda(256, register="grpc")
    by_name = {entry["name"]: entry for entry in regions.http.get_cuda_shared_memory_status()}
    assert by_name == {
        a.name: {"name": a.name, "device_id": DEVICE, "byte_size": 128},
        b.name: {"name": b.name, "device_id": DEVICE, "byte_size": 256},
    }
    regions.http.unregister_cuda_shared_memory(a.name)
    regions.http.unregister_cuda_shared_memory(a.name)  # not registered: nothing, as Triton
    assert [e["name"] for e in regions.http.get_cuda_shared_memory_status()] == [b.name]
    with pytest.raises(InferenceServerException) as caught:
        regions.http.get_cuda_shared_memory_status(a.name)
    assert caught.value.status() == "400"
    status, body = call(regions.live, "GET", f"/v2/cudasharedmemory/region/{a.name}/status")
    assert_refused(status, body, "unknown_region")
    assert a.name in body["error"]
    x = np.arange(16, dtype=np.uint8)
    with pytest.raises(InferenceServerException) as caught:  # a region no longer registered
        regions.http.infer(NOT, [region_input(triton, "InputTensor", x, a)])
    assert caught.value.status() == "400"
    assert a.name in str(caught.value.message())
    regions.grpc.unregister_cuda_shared_memory()  # all of them
    assert regions.http.get_cuda_shared_memory_status() == []
    assert not regions.grpc.get_cuda_shared_memory_status().regions
    with pytest.raises(InferenceServerException) as caught:
        regions.grpc.get_cuda_shared_memory_status("never-registered")
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert_serves(regions)


def test_unregister_all_leaves_system_regions_alone(regions: Regions) -> None:
    system = regions.system(64)
    regions.cuda(64)
    regions.http.unregister_cuda_shared_memory()
    assert regions.http.get_cuda_shared_memory_status() == []
    assert [e["name"] for e in regions.http.get_system_shared_memory_status()] == [system.name]


# --- hostile registrations --------------------------------------------------------------------


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize(
    "raw_handle",
    [
        pytest.param(b64(os.urandom(64)), id="random-64-bytes"),
        pytest.param(b64(bytes(64)), id="64-zero-bytes"),
        pytest.param(b64(os.urandom(10)), id="10-bytes"),
        pytest.param(b64(os.urandom(65)), id="65-bytes"),
        pytest.param("", id="empty"),
        pytest.param("!!not base64 at all**", id="not-base64"),
        pytest.param("QUJD=", id="bad-padding"),
    ],
)
def test_bad_handles(regions: Regions, raw_handle: str) -> None:
    registration = {"raw_handle": {"b64": raw_handle}, "device_id": DEVICE, "byte_size": 64}
    status, body = register_raw(regions.live, "bad", registration)
    assert_refused(status, body, "cuda_ipc_handle", "raw_handle")
    assert regions.http.get_cuda_shared_memory_status() == []
    assert_serves(regions)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_handles_through_the_stock_clients(regions: Regions, protocol: str) -> None:
    client = regions.client(protocol)
    for raw in (os.urandom(64), os.urandom(10)):
        with pytest.raises(InferenceServerException) as caught:
            client.register_cuda_shared_memory("bad", base64.b64encode(raw), DEVICE, 64)
        assert caught.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
        assert "raw_handle" in str(caught.value.message())
    assert_serves(regions)


@pytest.mark.parametrize(
    ("raw_handle", "field"),
    [
        pytest.param("AAAA", "raw_handle", id="string"),
        pytest.param({"b64": 7}, "raw_handle", id="number"),
        pytest.param({"base64": "AAAA"}, "raw_handle", id="wrong-key"),
        pytest.param({}, "raw_handle", id="empty-object"),
        pytest.param(None, "raw_handle", id="null"),
        pytest.param({"b64": ["AAAA"]}, "request body", id="list"),  # deeper than a registration
    ],
)
def test_malformed_raw_handle_fields(regions: Regions, raw_handle: Any, field: str) -> None:
    registration = {"raw_handle": raw_handle, "device_id": DEVICE, "byte_size": 64}
    status, body = register_raw(regions.live, "bad", registration)
    assert status == 400, body
    assert body["field"].startswith(field), body
    assert_serves(regions)


def test_sizes_past_the_allocation(regions: Regions) -> None:
    """byte_size is checked against the allocation as the driver knows it, not the client's
    word: one byte past it is refused, and so is anything far past it."""
    region = regions.cuda(2 * MiB, register=None)
    for byte_size in (2 * MiB + 1, 4 * MiB, 2**40):
        status, body = register_raw(regions.live, region.name, handle_of(region, byte_size))
        assert (status, body["field"]) == (400, "byte_size"), body
        if byte_size <= 4 * MiB:  # far past it, the server's bound on all regions may speak first
            assert body["rule"] == "region_bounds", body
        assert str(byte_size) in body["error"], body
    for byte_size in (-1, 2**64):
        status, body = register_raw(regions.live, region.name, handle_of(region, byte_size))
        assert (status, body["field"]) == (400, "byte_size"), body
    assert regions.http.get_cuda_shared_memory_status() == []
    # The whole allocation, and a part of it under a second name, are fine.
    regions.http.register_cuda_shared_memory(region.name, region.raw_handle, DEVICE, 2 * MiB)
    regions.http.register_cuda_shared_memory("smaller", region.raw_handle, DEVICE, MiB)
    assert_serves(regions)


@pytest.mark.parametrize("device_id", [DEVICE + 1, 2**31, -1])
def test_another_device(regions: Regions, device_id: int) -> None:
    region = regions.cuda(64, register=None)
    status, body = register_raw(regions.live, region.name, handle_of(region, 64, device_id))
    assert (status, body["field"]) == (400, "device_id"), body
    if device_id == DEVICE + 1:
        assert body["rule"] == "cuda_device", body
    with pytest.raises(InferenceServerException) as caught:
        regions.grpc.register_cuda_shared_memory(region.name, region.raw_handle, DEVICE + 1, 64)
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert regions.http.get_cuda_shared_memory_status() == []
    assert_serves(regions)


def test_names_are_one_namespace_with_system_regions(regions: Regions) -> None:
    system = regions.system(64)
    region = regions.cuda(64, register=None)
    assert_refused(*register_raw(regions.live, system.name, handle_of(region, 64)), "region_exists")
    with pytest.raises(InferenceServerException):
        regions.grpc.register_cuda_shared_memory(system.name, region.raw_handle, DEVICE, 64)
    # The other way round, and a CUDA name registered twice.
    regions.http.register_cuda_shared_memory(region.name, region.raw_handle, DEVICE, 64)
    status, body = call(
        regions.live, "POST", f"/v2/systemsharedmemory/region/{region.name}/register",
        {"key": system.key, "byte_size": 64},
    )  # fmt: skip
    assert_refused(status, body, "region_exists")
    assert_refused(*register_raw(regions.live, region.name, handle_of(region, 64)), "region_exists")
    assert [e["name"] for e in regions.http.get_cuda_shared_memory_status()] == [region.name]
    assert [e["name"] for e in regions.http.get_system_shared_memory_status()] == [system.name]
    assert_serves(regions)


# --- hostile uses -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "offset", "size", "rule"),
    [
        ("input", 60, 8, "region_bounds"),  # past the end
        ("input", 64, 8, "region_bounds"),  # starts at the end
        ("input", 2**62, 8, "region_bounds"),  # far past
        ("input", 2**63 - 4, 8, "region_bounds"),  # offset + size past 2**63
        ("input", 2**64 - 4, 8, None),  # would wrap a 64-bit sum; past the schema's bound too
        ("input", -8, 8, None),
        ("input", 0, 7, "shared_memory_byte_size"),  # not the tensor's size
        ("input", 0, 2**63 - 1, "shared_memory_byte_size"),
        ("output", 60, 8, "region_bounds"),
        ("output", 2**62, 8, "region_bounds"),
        ("output", -8, 8, None),
        ("output", 0, 4, None),  # too small for the result
    ],
)
def test_uses_past_the_region(
    regions: Regions, where: str, offset: int, size: int, rule: str | None
) -> None:
    region = regions.cuda(64)
    bad_input = in_region("InputTensor", region.name, [8], offset=offset, byte_size=size)
    document: dict[str, Any] = {"inputs": [bad_input]}
    if where == "output":
        document = {
            "inputs": [in_region("InputTensor", region.name, [8], byte_size=8)],
            "outputs": [in_region("OutputTensor", region.name, offset=offset, byte_size=size)],
        }
    before = region.contents()
    status, body = infer_raw(regions.live, NOT, document)
    assert status == 400, body
    if rule is not None:
        assert body["rule"] == rule, body
    assert np.array_equal(region.contents(), before), "a refused request wrote to the region"
    assert_serves(regions)


def test_unknown_region(regions: Regions) -> None:
    document = {"inputs": [in_region("InputTensor", "nope", [8], byte_size=8)]}
    status, body = infer_raw(regions.live, NOT, document)
    assert_refused(status, body, "unknown_region")
    assert "nope" in body["error"]
    assert_serves(regions)


@pytest.mark.parametrize(
    ("model", "output_offset"),
    [
        (NOT, 4),  # half over the input: never allowed
        (NOT, 7),
        ("DML_OPERATOR_ELEMENT_WISE_BIT_COUNT", 0),  # exactly over it: no in-place rule
        ("onnx.BitwiseNot-18", 0),
    ],
)
def test_output_overlapping_an_input(regions: Regions, model: str, output_offset: int) -> None:
    op = get_operator(model)
    assert output_offset or not op.in_place
    region = regions.cuda(256)
    before = region.contents()
    document = {
        "inputs": [in_region(op.inputs[0], region.name, [8], byte_size=8)],
        "outputs": [in_region(op.output, region.name, byte_size=8, offset=output_offset)],
    }
    assert_refused(*infer_raw(regions.live, model, document), "output_aliasing")
    assert np.array_equal(region.contents(), before), "a refused request wrote to the region"
    assert_serves(regions)


def test_extension_off_refuses_cuda_shared_memory(regions: Regions) -> None:
    """A second CuPy server with the extension off (the default): the CUDA routes and the
    tensor parameters are 400, rule shared_memory."""
    region = regions.cuda(64, register=None)
    with cupy_server(shared_memory=False) as running:
        off = running.http
        assert_refused(*register_raw(off, "r", handle_of(region, 64)), "shared_memory")
        assert_refused(*call(off, "GET", "/v2/cudasharedmemory/status"), "shared_memory")
        document = {"inputs": [in_region("InputTensor", "r", [8], byte_size=8)]}
        assert_refused(*infer_raw(off, NOT, document), "shared_memory")


@pytest.mark.parametrize("offsets", [(1, 3), (2, 0), (0, 6)], ids=["in1-out3", "in2", "out6"])
def test_unaligned_offsets_are_refused_and_never_fault_the_device(
    expendable_server: GrpcServer, offsets: tuple[int, int]
) -> None:
    """Triton lets an offset be any byte; a UINT64 kernel on an address that is not a multiple
    of 8 faults the CUDA context, and with it every later request. The server refuses such an
    offset (400, shared_memory_alignment, before any kernel runs) and keeps serving."""
    with Regions(expendable_server) as regions:
        in_offset, out_offset = offsets
        a = RNG.integers(0, 2**63, size=16, dtype=np.uint64)
        b = RNG.integers(0, 2**63, size=16, dtype=np.uint64)
        region = regions.cuda(1024)
        region.put(a, in_offset)
        region.put(b, 512 + in_offset)
        tensors = [
            region_input(triton, "A", a, region, in_offset),
            region_input(triton, "B", b, region, 512 + in_offset),
        ]
        out = region_output(triton, "C", region, a.nbytes, offset=256 + out_offset)
        with pytest.raises(InferenceServerException) as caught:
            regions.http.infer(XOR, tensors, outputs=[out])
        assert caught.value.status() == "400"
        assert "multiple of its element size" in str(caught.value.message())
        assert_serves(regions)


def test_the_readme_example_runs(server: GrpcServer) -> None:
    """The README's CUDA shared-memory example (fenced ``text``: make test has no GPU), verbatim
    but for the server's address, run in this process against the CuPy server."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (example,) = [
        block
        for block in re.findall(r"^```text\n(.*?)^```", readme, re.MULTILINE | re.DOTALL)
        if "tritonclient.utils.cuda_shared_memory" in block
    ]
    # The example dials the default address: were it spelt otherwise, the replacement below
    # would miss it and the example would reach whatever server holds port 8000 here.
    assert "localhost:8000" in example, "the example's address changed: point it at this server"
    namespace: dict[str, Any] = {}
    exec(example.replace("localhost:8000", server.http.url), namespace)
    assert_bits_equal(namespace["y"], ~namespace["x"])
    status, regions = call(server.http, "GET", "/v2/cudasharedmemory/status")
    assert (status, regions) == (200, [])  # the example unregistered what it registered
