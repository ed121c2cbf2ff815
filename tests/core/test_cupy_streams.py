"""The CuPy backend's streams (``cupy_backend.ThreadStreams``), on a stand-in for the part of
CuPy they use (support/stream_stand_in.py, which records the stream current at each launch and
each stream synchronized): each thread launches on a stream of its own, made its current stream,
and a synchronize waits on that stream, never on the legacy default stream; tests/gpu/test_device_streams.py
runs the same on a device."""

from __future__ import annotations

import contextlib
import threading
from types import SimpleNamespace
from typing import Any

from support.stream_stand_in import StandInCuda, StandInRuntimeError, StandInStream

from tensorbits.core.backends.cupy_backend import CupyBackend, ThreadStreams


def _in_threads(count: int, work: Any) -> None:
    threads = [threading.Thread(target=work) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_two_threads_launch_on_two_streams_and_wait_on_their_own() -> None:
    cuda = StandInCuda()
    streams = ThreadStreams(SimpleNamespace(cuda=cuda))
    barrier = threading.Barrier(2)  # both threads alive at once: two threads, not one reused

    def request() -> None:
        barrier.wait()
        streams.current()
        cuda.launch()
        cuda.launch()
        streams.synchronize()

    _in_threads(2, request)
    by_thread: dict[int, set[StandInStream]] = {}
    for thread, stream in cuda.launched:
        by_thread.setdefault(thread, set()).add(stream)
    assert len(by_thread) == 2
    (first,), (second,) = by_thread.values()  # each thread: one stream for all its launches
    assert first is not second
    assert cuda.legacy not in (first, second)
    assert not any(stream.non_blocking for stream in cuda.made)  # ordered with the legacy one
    # Each thread waited on the stream it launched on, and on nothing else.
    assert len(cuda.synchronized) == 2
    assert set(cuda.synchronized) == {
        (thread, stream) for thread, streams_of in by_thread.items() for stream in streams_of
    }


def test_a_thread_keeps_its_stream_and_streams_are_bounded() -> None:
    cuda = StandInCuda()
    streams = ThreadStreams(SimpleNamespace(cuda=cuda), count=2)
    assert streams.current() is streams.current()  # the same thread, the same stream
    seen: list[Any] = []
    _in_threads(3, lambda: seen.append(streams.current()))
    assert len(cuda.made) == 2  # three more threads, no more than two streams
    assert set(seen) <= set(cuda.made)


def _backend(cuda: StandInCuda) -> CupyBackend:
    """A CuPy backend over the stand-in: its own methods, with what they call stood in for (its
    constructor proves a real device, so it is not run)."""

    def fused(*_: Any) -> bool:
        cuda.launch()
        return True

    backend = object.__new__(CupyBackend)
    cupy = SimpleNamespace(cuda=cuda, empty=lambda shape, dtype: cuda.launch())
    vars(backend).update(
        _cupy=cupy,
        _device=contextlib.nullcontext(),
        streams=ThreadStreams(cupy),
        graphs=SimpleNamespace(run=fused),
    )
    return backend


def test_the_backend_launches_and_waits_on_the_thread_stream() -> None:
    cuda = StandInCuda()
    backend = _backend(cuda)
    ran: list[bool] = []

    def request() -> None:
        backend.empty((4,), None)  # type: ignore[arg-type]  # the stand-in allocates anything
        ran.append(backend.run_fused(None, {}))  # type: ignore[arg-type]
        backend.synchronize()

    _in_threads(1, request)
    request()
    assert ran == [True, True]
    launches = {(thread, stream) for thread, stream in cuda.launched}
    assert len(launches) == 2  # two threads, a stream each for both their launches
    assert {stream for _, stream in launches}.isdisjoint({cuda.legacy})
    assert set(cuda.synchronized) == launches  # each waited on its launches' stream alone


def test_when_done_calls_back_from_the_driver_thread_with_the_streams_outcome() -> None:
    cuda = StandInCuda()
    backend = _backend(cuda)
    outcomes: list[BaseException | None] = []
    backend.empty((4,), None)  # type: ignore[arg-type]  # a launch on the thread's stream
    backend.when_done(outcomes.append)
    ((stream, _, _),) = cuda.callbacks
    assert stream is cuda.get_current_stream()  # the thread's own stream, not the legacy one
    assert stream is not cuda.legacy
    assert outcomes == []  # not before the stream gets there
    assert threading.get_ident() not in cuda.fire()
    assert outcomes == [None]
    backend.when_done(outcomes.append)
    cuda.fire(status=700)  # cudaErrorIllegalAddress
    error = outcomes[-1]
    assert isinstance(error, StandInRuntimeError)
    assert error.status == 700
    assert not cuda.synchronized  # never blocked on
