"""A device for ``backends.pieces`` on the host, asynchronous as CUDA is: every copy and kernel
is queued on its stream and runs only when something waits for it, so a schedule that forgets
an event shows in its answer, not only in a log.

- Streams are queues. ``wait(stream, event)`` queues a wait; ``record(stream)`` an event that
  passes once everything queued before it on the stream has run. Nothing runs when issued:
  ``host_wait(event)`` runs the event's stream up to it, and a queued wait first runs the
  awaited stream up to its event (as late as CUDA may run anything). A kernel queued without
  waiting for its upload reads device memory that holds a fill pattern; a download queued
  without waiting for its kernel copies that pattern out; answer bytes copied out of staging
  before the download's event are the staging's own fill pattern.
- Device buffers are ``support.device_backend.StandInArray``s (kernels refuse anything else)
  filled with ``DEVICE_FILL``; kernels are the NumPy backend's.
- Staging is lent by a real ``PinnedPool`` over support/pinned_stand_in.py's pinned memory,
  filled with ``STAGING_FILL`` when lent; ``staging_peak`` is the most lent at once.
- ``issued`` is every operation in the order the schedule issued it, ``ran`` in the order it
  ran: (what, stream, piece). An operation's piece is the number of events recorded on its
  stream before it (the schedule records one event a piece on each of its streams).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from support.device_backend import StandInArray, Transfers
from support.pinned_stand_in import CUDARuntimeError, PinnedStandIn
from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.backends.pinned_pool import PinnedPool
from tensorbits_protocol.validation import ResolvedCall

Arr = np.ndarray[Any, Any]
DEVICE_FILL = 0x5A
STAGING_FILL = 0xA5
Step = tuple[str, str, int]  # (what, stream, piece)


@dataclass
class QueuedStream:
    name: str
    queue: list[tuple[Step, Callable[[], None]]] = field(default_factory=list)
    done: int = 0  # how many of ``queue`` have run
    events: int = 0  # events recorded on it so far


@dataclass(frozen=True)
class QueuedEvent:
    stream: QueuedStream
    position: int  # passed once this many of the stream's operations have run
    number: int  # its place among the stream's events


class PieceStandIn:
    """``pieces.PieceDevice`` on the host (the module's docstring)."""

    def __init__(self, pool_bytes: int = 64 << 20) -> None:
        self.pinned = PinnedStandIn()
        self.pool = PinnedPool(self.pinned.cupy, pool_bytes)
        self.numpy = NumpyBackend(1)
        self.counts = Transfers()
        self.thread = QueuedStream("thread")
        self.made: list[QueuedStream] = []
        self.issued: list[Step] = []
        self.ran: list[Step] = []
        self.staging_lent = 0
        self.staging_peak = 0
        self.refused = 0
        self._lent: dict[int, tuple[Arr, Any]] = {}
        self._streams: tuple[QueuedStream, QueuedStream, QueuedStream] | None = None

    # --- the schedule's device ---------------------------------------------------------------

    def streams(self) -> tuple[Any, Any, Any]:
        if self._streams is None:
            self._streams = (
                QueuedStream("upload"),
                QueuedStream("compute"),
                QueuedStream("download"),
            )
            self.made.extend(self._streams)
        return self._streams

    def _queue(self, stream: QueuedStream, what: str, run: Callable[[], None]) -> None:
        step = (what, stream.name, stream.events)
        self.issued.append(step)
        stream.queue.append((step, run))

    def record(self, stream: Any) -> QueuedEvent:
        queued: QueuedStream = self.thread if stream is None else stream
        event = QueuedEvent(queued, len(queued.queue) + 1, queued.events)
        self._queue(queued, "record", lambda: None)
        queued.events += 1
        return event

    def wait(self, stream: Any, event: Any) -> None:
        assert isinstance(event, QueuedEvent)
        self._queue(stream, f"wait {event.stream.name}", lambda: self._run_until(event))

    def host_wait(self, event: Any) -> None:
        assert isinstance(event, QueuedEvent)
        self.issued.append(("host_wait", event.stream.name, event.number))
        self._run_until(event)

    def _run_until(self, event: QueuedEvent) -> None:
        stream = event.stream
        while stream.done < event.position:
            step, run = stream.queue[stream.done]
            stream.done += 1  # first: a wait runs other streams, never this one again
            run()
            self.ran.append(step)

    def staging(self, nbytes: int) -> Arr | None:
        try:
            pointer = self.pool.malloc(nbytes)
        except CUDARuntimeError:
            self.refused += 1
            return None
        array = np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(pointer.ptr))
        array[:] = STAGING_FILL
        self._lent[id(array)] = (array, pointer)
        self.staging_lent += nbytes
        self.staging_peak = max(self.staging_peak, self.staging_lent)
        return array

    def release(self, staging: Arr) -> None:
        array, _ = self._lent.pop(id(staging))
        self.staging_lent -= array.nbytes  # the pointer goes: the pool has its buffer back

    def empty(self, nbytes: int) -> StandInArray:
        return StandInArray(np.full(nbytes, DEVICE_FILL, np.uint8), self.counts)

    def upload(self, stream: Any, device: Any, host: Arr) -> None:
        assert isinstance(device, StandInArray)
        assert isinstance(host, np.ndarray)
        self._assert_staging(host)
        self.counts.bytes_to_device += host.nbytes

        def copy() -> None:
            device.memory[...] = host  # the staging as it is when the copy runs

        self._queue(stream, "upload", copy)

    def download(self, stream: Any, host: Arr, device: Any) -> None:
        assert isinstance(device, StandInArray)
        assert isinstance(host, np.ndarray)
        self._assert_staging(host)
        self.counts.bytes_to_host += host.nbytes

        def copy() -> None:
            host[...] = device.memory

        self._queue(stream, "download", copy)

    def launch(self, stream: Any, call: ResolvedCall, inputs: Sequence[Any], out: Any) -> None:
        for array in (*inputs, out):
            assert isinstance(array, StandInArray), "a host array given to a device kernel"

        def kernel() -> None:
            self.numpy.run(call, [x.memory for x in inputs], out.memory)

        self._queue(stream, "kernel", kernel)

    def _assert_staging(self, host: Arr) -> None:
        """Asynchronous copies are from and to pinned staging only, never the caller's arrays."""
        start = host.ctypes.data
        assert any(
            array.ctypes.data <= start and start + host.nbytes <= array.ctypes.data + array.nbytes
            for array, _ in self._lent.values()
        ), "an asynchronous copy from or to memory the pool did not lend"

    # --- what a test reads ---------------------------------------------------------------------

    def idle(self) -> bool:
        """Every queued operation has run."""
        return all(s.done == len(s.queue) for s in (self.thread, *self.made))

    def close(self) -> None:
        self.numpy.close()


class Unordered(PieceStandIn):
    """The stand-in with every stream-side wait dropped: a schedule run on it must come out
    wrong, or the stand-in could not tell a right schedule from a wrong one."""

    def wait(self, stream: Any, event: Any) -> None:
        pass


__all__ = [
    "DEVICE_FILL",
    "STAGING_FILL",
    "PieceStandIn",
    "QueuedEvent",
    "QueuedStream",
    "Unordered",
]
