"""CUDA streams on the host, as the CuPy backend uses them (``cupy_backend.ThreadStreams``): a
stand-in for ``cupy.cuda``'s ``Stream`` and current stream, recording the stream current at each
launch and each stream synchronized, and a stream's host callbacks (``add_callback``), fired from
a thread of their own as the driver fires them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from tensorbits.core.backends.cupy_backend import ThreadStreams


class StandInStream:
    """A CUDA stream as CuPy's ``Stream`` is used: ``use`` makes it the calling thread's current
    stream; ``synchronize`` is recorded."""

    def __init__(self, cuda: StandInCuda, non_blocking: bool = False) -> None:
        self.cuda = cuda
        self.non_blocking = non_blocking

    def use(self) -> StandInStream:
        self.cuda.current.stream = self
        return self

    def synchronize(self) -> None:
        self.cuda.synchronized.append((threading.get_ident(), self))

    def add_callback(self, callback: Callable[[Any, int, Any], None], arg: Any) -> None:
        """``callback(stream, status, arg)`` once the stream's work so far is done: queued
        here until ``StandInCuda.fire``."""
        self.cuda.callbacks.append((self, callback, arg))


class StandInRuntimeError(RuntimeError):
    """``cupy.cuda.runtime.CUDARuntimeError``: a CUDA error status."""

    def __init__(self, status: int) -> None:
        self.status = status
        super().__init__(f"cudaError {status}")


class StandInCuda:
    """``cupy.cuda``: its streams, a per-thread current stream (the legacy one until a stream
    is used), and what was launched and synchronized where."""

    def __init__(self) -> None:
        self.legacy = StandInStream(self)
        self.current = threading.local()
        self.made: list[StandInStream] = []
        self.launched: list[tuple[int, StandInStream]] = []  # (thread, stream current then)
        self.synchronized: list[tuple[int, StandInStream]] = []
        self.callbacks: list[tuple[StandInStream, Callable[[Any, int, Any], None], Any]] = []
        self.runtime = SimpleNamespace(CUDARuntimeError=StandInRuntimeError)

    def Stream(self, non_blocking: bool = False) -> StandInStream:  # noqa: N802 (CuPy's name)
        stream = StandInStream(self, non_blocking)
        self.made.append(stream)
        return stream

    def get_current_stream(self) -> StandInStream:
        stream: StandInStream = getattr(self.current, "stream", self.legacy)
        return stream

    def fire(self, status: int = 0) -> list[int]:
        """Fire every queued callback with ``status`` from a thread of its own, as the driver
        does; the thread's id, once per callback."""
        callbacks, self.callbacks = self.callbacks, []
        fired: list[int] = []

        def driver() -> None:
            for stream, callback, arg in callbacks:
                fired.append(threading.get_ident())
                callback(stream, status, arg)

        thread = threading.Thread(target=driver)
        thread.start()
        thread.join()
        return fired

    def launch(self) -> None:
        """A kernel or copy, issued as CuPy issues it: on the thread's current stream."""
        self.launched.append((threading.get_ident(), self.get_current_stream()))


def stand_in_streams() -> ThreadStreams:
    """The backend's streams over a stand-in ``cupy.cuda`` (for a backend built without its
    constructor, which proves a real device)."""
    cupy: Any = SimpleNamespace(cuda=StandInCuda())
    return ThreadStreams(cupy)
