"""The SDK's shared-memory region (``client.shared_memory``): offline against a fake server (what
is sent, when nothing is, cleanup on every path), then live against ``tensorbits serve`` with
``TENSORBITS_SHARED_MEMORY=true`` (every operator through a region, results as views of it,
nothing left behind, the async twin) and against one with the extension off (refused)."""

from __future__ import annotations

import asyncio
import gc
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from core.bitref import assert_bits_equal, reference
from fake_server import FakeServer, json_error
from support.live import serve
from support.v2 import uint8_inputs

from tensorbits_client import (
    APIConnectionError,
    APIResponseValidationError,
    AsyncClient,
    AsyncSharedMemoryRegion,
    BadRequestError,
    Client,
    LocalValidationError,
    SharedMemoryRegion,
)
from tensorbits_protocol.operators import OPERATORS, OperatorSpec

Arr = np.ndarray[Any, Any]
SHM = Path("/dev/shm")
NOT = "onnx.BitwiseNot-18"
RNG = np.random.default_rng(13)


def objects(region: SharedMemoryRegion | AsyncSharedMemoryRegion) -> bool:
    """Whether the region's object is in /dev/shm."""
    return (SHM / region.name).exists()


# --- offline: a fake server that does what the real one does to the region ----------------------


class FakeShm:
    """Registers regions and runs onnx.BitwiseNot-18 through them, reading and writing the
    object by its key as the server does (so the client's offsets are checked for real)."""

    def __init__(self) -> None:
        self.regions: dict[str, str] = {}
        self.documents: list[dict[str, Any]] = []
        self.infer_status = 200
        self.output_as_data = False

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/register"):
            document = json.loads(request.content)
            name = path.split("/")[-2]
            self.regions[name] = document["key"]
            self.documents.append(document)
            return httpx.Response(200)
        if path.endswith("/unregister"):
            self.regions.pop(path.split("/")[-2], None)
            return httpx.Response(200)
        document = json.loads(request.content)
        self.documents.append(document)
        if self.infer_status != 200:
            return json_error(self.infer_status, "refused", field="X", rule="test")
        (tensor,) = document["inputs"]
        where = tensor["parameters"]
        path_of = SHM / self.regions[where["shared_memory_region"]][1:]
        raw = path_of.read_bytes()
        start = where.get("shared_memory_offset", 0)
        x = np.frombuffer(raw[start : start + where["shared_memory_byte_size"]], np.uint8)
        (out,) = document["outputs"]
        dest = out["parameters"]
        entry: dict[str, Any] = {"name": "Y", "datatype": "UINT8", "shape": tensor["shape"]}
        if self.output_as_data:
            entry["data"] = (~x).tolist()
        else:
            with path_of.open("r+b") as f:
                f.seek(dest.get("shared_memory_offset", 0))
                f.write((~x).tobytes())
            entry["parameters"] = dest
        return httpx.Response(200, json={"model_name": NOT, "outputs": [entry]})


@pytest.fixture
def fake() -> FakeShm:
    return FakeShm()


@pytest.fixture
def offline(fake: FakeShm) -> Iterator[tuple[Client, FakeServer]]:
    server = FakeServer(fake)
    with server.client(max_retries=0) as client:
        yield client, server


def test_what_is_sent_and_the_result_is_a_view_of_the_region(
    offline: tuple[Client, FakeServer], fake: FakeShm
) -> None:
    client, server = offline
    with client.shared_memory(4096) as region:
        assert objects(region)
        x = region.array(np.uint8, (3, 5))
        x[:] = RNG.integers(0, 256, (3, 5), dtype=np.uint8)
        y = region.infer(NOT, {"X": x}).output
        assert_bits_equal(y, ~x)
        assert np.shares_memory(y, region.buffer)
        assert not np.shares_memory(y, x)
    register, infer = fake.documents
    assert register == {"key": f"/{region.name}", "offset": 0, "byte_size": 4096}
    assert region.key.startswith("/tensorbits_")
    # JSON only: no byte of a tensor in the body, both tensors named by region and offset.
    request = server.requests[1]
    assert request.headers["content-type"] == "application/json"
    assert "inference-header-content-length" not in request.headers
    (tensor,) = infer["inputs"]
    assert tensor["parameters"] == {
        "shared_memory_region": region.name,
        "shared_memory_byte_size": 15,
    }  # x is the first block: offset 0, left out
    assert infer["outputs"] == [
        {
            "name": "Y",
            "parameters": {
                "shared_memory_region": region.name,
                "shared_memory_byte_size": 15,
                "shared_memory_offset": 64,
            },
        }
    ]
    assert [r.url.path for r in server.requests] == [
        f"/v2/systemsharedmemory/region/{region.name}/register",
        f"/v2/models/{NOT}/infer",
        f"/v2/systemsharedmemory/region/{region.name}/unregister",
    ]
    assert not objects(region)
    assert region.closed
    assert_bits_equal(y, ~x)  # still readable: the views keep the mapping


def test_every_block_starts_aligned_and_is_reused_once_dropped(
    offline: tuple[Client, FakeServer],
) -> None:
    client, _ = offline
    with client.shared_memory(1024, alignment=128) as region:
        base = int(region.buffer.__array_interface__["data"][0])

        def offset(a: Arr) -> int:
            return int(a.__array_interface__["data"][0]) - base

        a = region.array(np.uint8, 1)
        b = region.array(np.uint32, (2, 3))
        c = region.put(np.arange(5, dtype=np.uint16))
        assert [offset(a), offset(b), offset(c)] == [0, 128, 256]
        assert region.offset_of(b) == 128
        assert region.offset_of(c[1:]) == 258
        assert region.offset_of(np.zeros(3)) is None
        assert region.offset_of(b[:, ::2]) is None
        assert region.offset_of(region.buffer[:8]) is None  # no array's bytes: copied if sent
        part = b[1]  # a view of b's block keeps it taken
        del b
        gc.collect()
        assert offset(region.array(np.uint8, 1)) == 384
        del part
        gc.collect()
        assert offset(region.array(np.uint8, 100)) == 128  # b's block, given back
        with pytest.raises(LocalValidationError, match="arrays still referenced") as caught:
            region.array(np.uint8, 1024)
        assert caught.value.rule == "region_size"


def test_inputs_outside_the_region_are_copied_in(
    offline: tuple[Client, FakeServer], fake: FakeShm
) -> None:
    client, _ = offline
    x = np.arange(100, dtype=np.uint8)[::2]  # not contiguous, not in the region
    with client.shared_memory(4096) as region:
        y = region.onnx.bitwise_not(x)
        assert_bits_equal(y, ~x)
        assert np.shares_memory(y, region.buffer)
        (tensor,) = fake.documents[-1]["inputs"]
        assert tensor["parameters"]["shared_memory_byte_size"] == 50
        out = region.array(np.uint8, 50)
        assert region.infer(NOT, [x], out=out).output is out
        assert_bits_equal(out, ~x)


def test_a_region_too_small_fails_before_anything_is_sent(
    offline: tuple[Client, FakeServer],
) -> None:
    client, server = offline
    with client.shared_memory(1000) as region:
        x = region.array(np.uint8, 600)
        with pytest.raises(LocalValidationError) as caught:
            region.infer(NOT, {"X": x})
        message = str(caught.value)
        assert "no room for output 'Y' (600 bytes)" in message
        assert "smaller than the 1240 bytes" in message
        assert "nothing was sent" in message
        with pytest.raises(LocalValidationError, match="is not what the call produces"):
            region.infer(NOT, {"X": x}, out=region.array(np.uint8, 10))
        with pytest.raises(LocalValidationError, match="not a C-contiguous array of this region"):
            region.infer(NOT, {"X": x}, out=np.empty(600, np.uint8))
        with pytest.raises(LocalValidationError) as wrong:  # the operator's rules, locally
            region.infer(NOT, {"X": region.array(np.float32, 4)})
        assert wrong.value.field == "X"
    assert [r.url.path.rsplit("/", 1)[-1] for r in server.requests] == ["register", "unregister"]


def test_cleanup_when_the_body_raises(offline: tuple[Client, FakeServer]) -> None:
    client, server = offline
    region = client.shared_memory(4096)

    def body() -> None:
        with region:
            region.array(np.uint8, 8)
            raise KeyError("the body failed")

    with pytest.raises(KeyError):
        body()
    assert not objects(region)
    assert region.closed
    assert server.requests[-1].url.path.endswith("/unregister")
    with pytest.raises(ValueError, match="closed"):
        region.array(np.uint8, 8)


def test_an_object_unlinked_by_someone_else_still_closes(
    offline: tuple[Client, FakeServer],
) -> None:
    client, server = offline
    with client.shared_memory(64) as region:
        (SHM / region.name).unlink()
    assert region.closed
    assert server.requests[-1].url.path.endswith("/unregister")


def test_a_failed_unregister_is_raised_or_noted(fake: FakeShm) -> None:
    def failing(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/unregister"):
            raise httpx.ConnectError("gone")
        return fake(request)

    with FakeServer(failing).client(max_retries=0) as client:
        with pytest.raises(APIConnectionError), client.shared_memory(64) as region:
            pass
        assert not objects(region)  # closed and unlinked all the same
        with pytest.raises(KeyError) as caught, client.shared_memory(64) as region:
            raise KeyError("the body failed")
        assert "unregistering the shared-memory region failed" in caught.value.__notes__[0]
        assert not objects(region)


def test_a_refused_registration_leaves_nothing(fake: FakeShm) -> None:
    def refusing(request: httpx.Request) -> httpx.Response:
        return json_error(400, "Client shared memory is disabled", field="shared_memory")

    made: list[SharedMemoryRegion] = []
    with FakeServer(refusing).client(max_retries=0) as client:
        region = client.shared_memory(64)
        made.append(region)
        with pytest.raises(BadRequestError, match="disabled"), region:
            pytest.fail("entered")
    assert not objects(made[0])
    assert made[0].closed


def test_an_answer_that_is_not_in_the_region_is_refused(
    offline: tuple[Client, FakeServer], fake: FakeShm
) -> None:
    client, _ = offline
    fake.output_as_data = True
    with (
        client.shared_memory(4096) as region,
        pytest.raises(APIResponseValidationError, match="asked in shared memory"),
    ):
        region.onnx.bitwise_not(region.put(np.arange(4, dtype=np.uint8)))


def test_arguments_are_checked(offline: tuple[Client, FakeServer]) -> None:
    client, server = offline
    for bad in (0, -1):
        with pytest.raises(ValueError, match="positive"):
            client.shared_memory(bad)
    with pytest.raises(ValueError, match="POSIX"):
        client.shared_memory(64, prefix="tensorbits")
    with pytest.raises(ValueError, match="power of two"):
        client.shared_memory(64, alignment=48)
    region = client.shared_memory(64)
    with pytest.raises(ValueError, match="new, not open"):
        region.array(np.uint8, 1)
    assert not server.requests
    assert not objects(region)


def test_the_async_region_offline(fake: FakeShm) -> None:
    async def main() -> None:
        async with FakeServer(fake).async_client() as client:
            async with client.shared_memory(4096) as region:
                x = region.put(np.arange(10, dtype=np.uint8))
                y = await region.onnx.bitwise_not(x)
                assert_bits_equal(y, ~x)
                assert np.shares_memory(y, region.buffer)
            assert not objects(region)

    asyncio.run(main())


# --- live ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shm_url() -> Iterator[str]:
    with serve({"TENSORBITS_SHARED_MEMORY": "true", "TENSORBITS_CPU_THREADS": "1"}) as server:
        yield server.base_url


@pytest.fixture
def shm_client(shm_url: str) -> Iterator[Client]:
    with Client(shm_url) as client:
        yield client
    assert status(shm_url) == []  # every test leaves no region registered


def status(url: str) -> Any:
    with urllib.request.urlopen(f"{url}/v2/systemsharedmemory/status", timeout=10) as response:
        return json.loads(response.read())


@pytest.mark.integration
@pytest.mark.parametrize("op", OPERATORS, ids=lambda op: op.name)
def test_every_operator_through_a_region(
    shm_url: str, shm_client: Client, op: OperatorSpec
) -> None:
    arrays, params = uint8_inputs(op, RNG, (4, 8))
    want = reference(op.name, arrays, params)
    with shm_client.shared_memory(1 << 16) as region:
        placed = {name: region.put(array) for name, array in arrays.items()}
        got = region.infer(op.name, placed, params).outputs[op.output]
        assert_bits_equal(got, want)
        assert np.shares_memory(got, region.buffer)  # written there by the server, not sent
        assert status(shm_url) == [
            {"name": region.name, "key": region.key, "offset": 0, "byte_size": 1 << 16}
        ]
    assert not objects(region)


@pytest.mark.integration
def test_each_family_and_the_zero_copy_property(shm_client: Client) -> None:
    a = RNG.integers(0, 2**32, size=(64, 64), dtype=np.uint32)
    b = RNG.integers(0, 2**32, size=(64, 64), dtype=np.uint32)
    with shm_client.shared_memory(1 << 20) as region:
        ra, rb = region.put(a), region.put(b)
        results = {
            "dml": (region.dml.bit_xor(ra, rb), a ^ b),
            "openvino": (region.openvino.bitwise_and(ra, rb[:1]), a & b[:1]),
            "onnx": (region.onnx.bitwise_or(ra, rb), a | b),
            "count": (region.dml.bit_count(ra, output_datatype="UINT32"), None),
        }
        buffer = region.buffer
        for name, (got, want) in results.items():
            # A view of the region itself: its memory is the region's, and it owns none.
            assert np.shares_memory(got, buffer), name
            assert not got.flags.owndata
            if want is not None:
                assert_bits_equal(got, want)
        counts = results["count"][0]
        assert counts.dtype == np.uint32
        assert (counts == np.unpackbits(a.view(np.uint8)).reshape(64, 64, 32).sum(-1)).all()
        # The server writes where the view points: a second call into the same out.
        out = results["dml"][0]
        region.infer("DML_OPERATOR_ELEMENT_WISE_BIT_NOT", [ra], out=out)
        assert_bits_equal(out, ~a)


@pytest.mark.integration
def test_cleanup_on_the_server_and_in_dev_shm(shm_url: str, shm_client: Client) -> None:
    region = shm_client.shared_memory(4096)
    held: list[Arr] = []

    def body() -> None:
        with region:
            held.append(region.put(np.arange(16, dtype=np.uint8)))
            held.append(region.onnx.bitwise_not(held[0]))
            assert len(status(shm_url)) == 1
            raise RuntimeError("the body failed")

    with pytest.raises(RuntimeError):
        body()
    x, y = held
    assert not objects(region)
    assert status(shm_url) == []
    assert_bits_equal(y, ~np.arange(16, dtype=np.uint8))  # held views stay readable
    with pytest.raises(ValueError, match="closed"):
        region.onnx.bitwise_not(x)


@pytest.mark.integration
def test_a_large_tensor_and_reuse_in_a_loop(shm_client: Client) -> None:
    n = 8 << 20
    with shm_client.shared_memory(3 * n) as region:  # in, out, and the previous out
        x = region.array(np.uint8, n)
        x[:] = RNG.integers(0, 256, n, dtype=np.uint8)
        for _ in range(4):
            y = region.dml.bit_not(x)  # the previous y's block is given back when rebound
        assert_bits_equal(y, ~x)


@pytest.mark.integration
def test_the_async_region_live(shm_url: str) -> None:
    async def main() -> None:
        async with AsyncClient(shm_url) as client:
            async with client.shared_memory(1 << 16) as region:
                a = region.put(RNG.integers(0, 2**16, 100, dtype=np.uint16))
                xor, inverted = await asyncio.gather(
                    region.onnx.bitwise_xor(a, a[::-1]),
                    region.infer("DML_OPERATOR_ELEMENT_WISE_BIT_NOT", {"InputTensor": a}),
                )
                assert_bits_equal(xor, a ^ a[::-1])
                assert_bits_equal(inverted.output, ~a)
                assert np.shares_memory(xor, region.buffer)
            assert not objects(region)

    asyncio.run(main())
    assert status(shm_url) == []


@pytest.mark.integration
def test_refused_by_a_server_with_the_extension_off(live: Client) -> None:
    region = live.shared_memory(4096)
    with pytest.raises(BadRequestError) as caught, region:
        pytest.fail("entered")
    assert "TENSORBITS_SHARED_MEMORY=true" in str(caught.value)
    assert caught.value.status_code == 400
    assert not objects(region)
    assert region.closed
