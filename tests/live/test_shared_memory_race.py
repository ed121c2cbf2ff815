"""A system shared-memory output written while the client truncates its object, for real.

The server checks the object's size, then writes with ``pwritev``: a truncate that lands between
the two lets the write extend the object again, and nothing the server can do to a client's
object stops that (``SystemBytes.write``). What must hold, and is checked here against a thread
that truncates the object to zero over and over while the server writes outputs into it: the
object never grows past the end of the bytes the server writes, which lie inside the registered
range (and short of the object's size at registration); nothing outside that range is written;
every answer is a success or a 400 naming the region; the server keeps serving."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
import tritonclient.utils.shared_memory as shm
from support.live import LiveServer, serve
from support.v2 import AND, NOT
from tritonclient.utils import InferenceServerException

from tensorbits.core.plan import STREAM_PIECE_BYTES

pytestmark = pytest.mark.integration

Arr = np.ndarray[Any, Any]
REQUESTS = 500
# The registered range is [REGION_OFFSET, REGION_OFFSET + REGION_BYTES) of an object larger than
# its end, so a size the client's own re-growing never gives (the range's end) is visible.
REGION_OFFSET = 64 << 10
OUTPUT_OFFSET = 4096  # within the region
SLACK = 64 << 10  # registered bytes after the output's, and object bytes after the region's


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with serve({"TENSORBITS_SHARED_MEMORY": "true"}) as running:
        yield running


@dataclass
class Truncator:
    """A client truncating its object to zero over and over, re-growing it between (else the
    server's size check would refuse every write, and no write could race a truncate). After
    each truncate it looks: any size now is the server's doing."""

    fd: int
    full_size: int
    grown: list[int] = field(default_factory=list)  # sizes the server's writes grew it back to
    contents: list[bytes] = field(default_factory=list)  # the object's bytes then
    failures: list[BaseException] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        mode = stat.S_IMODE(os.fstat(self.fd).st_mode)
        try:
            while not self.stop.is_set():
                os.ftruncate(self.fd, self.full_size)
                os.ftruncate(self.fd, 0)
                # A write the server began just after the truncate is still copying when a bare
                # look comes, and the next re-growing would hide it. fchmod waits for the
                # inode's lock, which a write holds (tmpfs): once it returns, a write under way
                # is done and the size it left is there to read.
                os.fchmod(self.fd, mode)
                size = os.fstat(self.fd).st_size
                if size:
                    self.grown.append(size)
                    self.contents.append(os.pread(self.fd, size, 0))
        except BaseException as exc:  # seen by the test, not lost with the thread
            self.failures.append(exc)


def _request(op: str, nbytes: int) -> tuple[list[Any], Arr]:
    """The inputs (in the body) and the output they give. x stays below 255, so NOT's output has
    no zero byte: its bytes are told apart from the zeros a truncated object reads as."""
    x = (np.arange(nbytes) % 255).astype(np.uint8)
    first = triton.InferInput("InputTensor" if op == NOT else "A", [nbytes], "UINT8")
    first.set_data_from_numpy(x)
    if op == NOT:
        return [first], ~x
    mask = np.array([0x7F], dtype=np.uint8)  # broadcast: the output is written whole, not streamed
    second = triton.InferInput("B", [1], "UINT8")
    second.set_data_from_numpy(mask)
    return [first, second], x & mask


def _infer(
    client: triton.InferenceServerClient, op: str, inputs: list[Any], output: Any
) -> InferenceServerException | None:
    """One request; what refused it, if anything did."""
    try:
        client.infer(op, inputs, outputs=[output])
    except InferenceServerException as exc:
        return exc
    return None


@pytest.mark.parametrize(
    ("op", "nbytes"),
    [
        (NOT, 64 << 10),  # streamed, one piece
        (NOT, STREAM_PIECE_BYTES + (64 << 10)),  # streamed, two pieces, each checked and written
        (AND, 64 << 10),  # broadcasting: computed whole, then written whole
    ],
    ids=["streamed", "streamed-pieces", "whole"],
)
def test_a_write_racing_a_truncate_stays_inside_the_registered_range(
    server: LiveServer, op: str, nbytes: int
) -> None:
    name = f"race{nbytes}{op[-2:]}"
    key = f"/tensorbits_race_{os.getpid()}_{nbytes}_{op[-2:]}"
    region_bytes = OUTPUT_OFFSET + nbytes + SLACK
    range_end = REGION_OFFSET + region_bytes
    object_size = range_end + SLACK
    write_start, write_end = REGION_OFFSET + OUTPUT_OFFSET, REGION_OFFSET + OUTPUT_OFFSET + nbytes
    inputs, want = _request(op, nbytes)
    output = triton.InferRequestedOutput("OutputTensor" if op == NOT else "C")
    output.set_shared_memory(name, nbytes, offset=OUTPUT_OFFSET)

    handle = shm.create_shared_memory_region(name, key, object_size)
    client = triton.InferenceServerClient(server.url)
    fd = os.open(Path("/dev/shm") / key[1:], os.O_RDWR)
    try:
        client.register_system_shared_memory(name, key, region_bytes, offset=REGION_OFFSET)
        truncator = Truncator(fd, object_size)
        thread = threading.Thread(target=truncator.run, daemon=True)
        thread.start()
        refusals: list[InferenceServerException] = []
        try:
            for _ in range(REQUESTS):
                refusal = _infer(client, op, inputs, output)
                if refusal is not None:
                    refusals.append(refusal)
        finally:
            truncator.stop.set()
            thread.join(10)
        assert not truncator.failures, truncator.failures
        assert refusals, "no truncate overlapped a request"
        for refusal in refusals:  # the rest were answered
            message = str(refusal.message())
            assert refusal.status() == "400", message
            assert f"region '{name}'" in message, message
            assert "smaller than when it was registered" in message, message

        # Whenever a write grew the object back, it grew to the end of its own bytes at most:
        # inside the registered range, short of the size the object was registered at.
        assert all(size <= write_end for size in truncator.grown), truncator.grown
        assert write_end < range_end < object_size
        for content in truncator.contents:
            data = np.frombuffer(content, np.uint8)
            assert not data[:write_start].any(), "bytes before the output's range were written"
            written = data[write_start:]
            expected = want[: written.size]
            assert np.all((written == expected) | (written == 0)), "bytes not the output's"

        # The server keeps serving, and the region works again once the object is whole.
        os.ftruncate(fd, object_size)
        client.infer(op, inputs, outputs=[output])
        got = np.frombuffer(os.pread(fd, nbytes, write_start), np.uint8)
        assert np.array_equal(got, want)
        assert server.get("/v2/health/live") == 200
    finally:
        os.close(fd)
        client.unregister_system_shared_memory(name)
        client.close()
        shm.destroy_shared_memory_region(handle)
