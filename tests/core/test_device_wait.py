"""Device work launched inline on the event loop is awaited by a stream callback, not blocked on
(core/device_wait.py): while a run wholly in CUDA regions is pending the loop serves other
requests, the region stays held and the admission grant stays taken, and the answer goes, the
hold and the grant released, only once the callback, fired from another thread, has come; an
error the callback reports is the request's. The device is a host stand-in whose kernels run
only when its callback fires (as a GPU's finish only then), so an answer sent before the
callback would show the region's old bytes."""

from __future__ import annotations

import asyncio
import base64
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from typing import Any

import numpy as np
import pytest
from core.bitref import assert_bits_equal
from support.device_backend import StandInDevice, StandInDeviceMemory
from support.framing import framed
from support.inprocess import TestClient, app_client, runtime_of
from support.planes import data_plane
from support.v2 import binary_input, output_array

from tensorbits.core.dataplane import HoldWords, Needs
from tensorbits.core.device_wait import Done, finish, hold
from tensorbits.core.shared_memory import SharedMemoryRegions
from tensorbits_protocol.validation import ResolvedCall

PREFIX = f"/tensorbits_device_wait_{os.getpid()}"
NOT = "onnx.BitwiseNot-18"
SIZE = 1 << 16
RNG = np.random.default_rng(5)
WORDS = HoldWords("request", "its tensors", "inputs")


class CallbackDevice(StandInDevice):
    """A device backend whose kernels run when its stream callbacks fire (``fire``, from a
    thread of its own), as a GPU's work is done only by then; ``synchronize`` counted."""

    def __init__(self) -> None:
        super().__init__(fused=False)
        self.queued: list[Callable[[], None]] = []
        self.pending: list[Done] = []
        self.asked = threading.Event()
        self.synchronized = 0
        self.fired_on: list[int] = []

    def run(self, call: ResolvedCall, inputs: Sequence[Any], out: Any) -> None:
        self.queued.append(lambda: StandInDevice.run(self, call, inputs, out))

    def _drain(self) -> None:
        queued, self.queued = self.queued, []
        for kernel in queued:
            kernel()

    def synchronize(self) -> None:
        self.synchronized += 1
        self._drain()

    def to_host(self, array: Any, out: Any = None) -> Any:
        self._drain()  # a copy out waits for the stream's work, as CuPy's get does
        return super().to_host(array, out)

    def when_done(self, done: Done) -> None:
        self.pending.append(done)
        self.asked.set()

    def fire(self, error: BaseException | None = None) -> None:
        def driver() -> None:
            self._drain()
            pending, self.pending = self.pending, []
            for done in pending:
                self.fired_on.append(threading.get_ident())
                done(error)

        thread = threading.Thread(target=driver)
        thread.start()
        thread.join()


class Held:
    """A hold that records when it is let go."""

    def __init__(self) -> None:
        self.entered = self.released = 0

    def __enter__(self) -> Held:
        self.entered += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self.released += 1


async def _serve_launched(
    device: CallbackDevice, error: BaseException | None
) -> tuple[Held, list[str], Any]:
    """One call whose encode holds something and launches device work inline; while it is
    pending another coroutine runs; then the callback fires with ``error``."""
    plane = data_plane(backend=device)
    held = Held()
    steps: list[str] = []
    loop_thread = threading.get_ident()

    def encode(plan: str) -> str:
        assert threading.get_ident() == loop_thread  # inline, on the loop
        with ExitStack() as stack:
            hold(held, stack)
            finish(device)
        steps.append("encoded")
        return f"answer to {plan}"

    async def other_work() -> None:
        for _ in range(20):
            steps.append("other")
            await asyncio.sleep(0)

    outcome: Any = None
    async with plane.call() as call:
        call.admit(100)
        serving = asyncio.ensure_future(
            call.serve(lambda: "plan", 0, lambda _: Needs(held=200, work=0), WORDS, encode)
        )
        await other_work()
        assert device.asked.is_set()
        assert not serving.done()  # waiting for the callback, not blocking the loop
        assert steps == ["other", "encoded", *["other"] * 19]
        assert held.entered == 1
        assert held.released == 0
        assert plane.admission.bytes_in_flight == 200
        await asyncio.to_thread(device.fire, error)
        try:
            outcome = await serving
        except BaseException as exc:  # the test reads it
            outcome = exc
        assert held.released == 1
        assert device.fired_on
        assert loop_thread not in device.fired_on
        assert plane.admission.bytes_in_flight == 200  # until the call's block ends
    assert plane.admission.bytes_in_flight == 0
    assert device.synchronized == 0  # never blocked on
    return held, steps, outcome


def test_an_inline_run_is_awaited_while_the_loop_works_on() -> None:
    device = CallbackDevice()
    try:
        _, _, outcome = asyncio.run(_serve_launched(device, None))
    finally:
        device.close()
    assert outcome == "answer to plan"


def test_an_error_the_callback_reports_is_the_requests() -> None:
    device = CallbackDevice()
    fault = RuntimeError("cudaErrorIllegalAddress")
    try:
        _, _, outcome = asyncio.run(_serve_launched(device, fault))
    finally:
        device.close()
    assert outcome is fault


def test_off_the_loop_a_run_is_synchronized() -> None:
    device = CallbackDevice()
    held = Held()
    try:
        with ExitStack() as stack:
            hold(held, stack)
            finish(device)  # no inline run around it: blocks, as before
            assert held.released == 0
        assert held.released == 1
        assert device.synchronized == 1
        assert not device.pending
    finally:
        device.close()


@pytest.fixture
def backend() -> Iterator[CallbackDevice]:
    made = CallbackDevice()
    yield made
    made.close()


@pytest.fixture
def client(backend: CallbackDevice) -> Iterator[tuple[TestClient, SharedMemoryRegions]]:
    memory = backend.device_memory
    assert isinstance(memory, StandInDeviceMemory)
    regions = SharedMemoryRegions(PREFIX, 8, 4 * SIZE, memory, "the stand-in")
    with app_client(shared_memory=True, shared_memory_prefix=PREFIX) as made:
        plane = runtime_of(made).plane
        plane.regions = regions
        plane.backend = backend
        yield made, regions
    regions.close()
    memory.close_exports()


def _in_region(nbytes: int, offset: int) -> dict[str, Any]:
    return {
        "shared_memory_region": "gpu",
        "shared_memory_byte_size": nbytes,
        "shared_memory_offset": offset,
    }


def test_the_server_answers_others_while_a_cuda_region_run_is_pending(
    client: tuple[TestClient, SharedMemoryRegions], backend: CallbackDevice
) -> None:
    http, regions = client
    memory = backend.device_memory
    assert isinstance(memory, StandInDeviceMemory)
    x = RNG.integers(0, 256, size=SIZE, dtype=np.uint8)
    handle, buffer = memory.export(2 * SIZE)
    buffer[:SIZE] = x
    body = {
        "raw_handle": {"b64": base64.b64encode(handle).decode()},
        "device_id": 0,
        "byte_size": 2 * SIZE,
    }
    assert http.post("/v2/cudasharedmemory/region/gpu/register", json=body).status_code == 200
    request = {
        "inputs": [
            {"name": "X", "datatype": "UINT8", "shape": [SIZE], "parameters": _in_region(SIZE, 0)}
        ],
        "outputs": [{"name": "Y", "parameters": _in_region(SIZE, SIZE)}],
    }
    answers: dict[str, Any] = {}
    launched = threading.Thread(
        target=lambda: answers.update(a=http.post(f"/v2/models/{NOT}/infer", json=request))
    )
    launched.start()
    try:
        assert backend.asked.wait(30)
        assert not buffer[SIZE:].any()  # launched, not run yet
        # Pending: the loop answers another request (whose copy out waits for the thread's
        # stream, the launched kernel with it), the region stays held, the bytes taken.
        y = RNG.integers(0, 256, size=16, dtype=np.uint8)
        header = {
            "inputs": [binary_input("X", y)],
            "outputs": [{"name": "Y", "parameters": {"binary_data": True}}],
        }
        content, headers = framed(header, y.tobytes())
        other = http.post(f"/v2/models/{NOT}/infer", content=content, headers=headers)
        assert other.status_code == 200, other.text
        assert_bits_equal(output_array(other), ~y)
        assert launched.is_alive()  # its callback has not come: no answer
        assert regions._regions["gpu"].uses == 2  # held for its input and its output
        assert runtime_of(http).plane.admission.bytes_in_flight > 0
    finally:
        backend.fire()
        launched.join(30)
    response = answers["a"]
    assert response.status_code == 200, response.text
    assert_bits_equal(buffer[SIZE:], ~x)
    assert regions._regions["gpu"].uses == 0
    assert runtime_of(http).plane.admission.bytes_in_flight == 0
    assert backend.synchronized == 0
