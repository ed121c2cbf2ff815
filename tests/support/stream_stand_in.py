"""CUDA streams on the host, as the CuPy backend uses them (``cupy_backend.ThreadStreams``): a
stand-in for ``cupy.cuda``'s ``Stream`` and current stream, recording the stream current at each
launch and each stream synchronized."""

from __future__ import annotations

import threading
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


class StandInCuda:
    """``cupy.cuda``: its streams, a per-thread current stream (the legacy one until a stream
    is used), and what was launched and synchronized where."""

    def __init__(self) -> None:
        self.legacy = StandInStream(self)
        self.current = threading.local()
        self.made: list[StandInStream] = []
        self.launched: list[tuple[int, StandInStream]] = []  # (thread, stream current then)
        self.synchronized: list[tuple[int, StandInStream]] = []

    def Stream(self, non_blocking: bool = False) -> StandInStream:  # noqa: N802 (CuPy's name)
        stream = StandInStream(self, non_blocking)
        self.made.append(stream)
        return stream

    def get_current_stream(self) -> StandInStream:
        stream: StandInStream = getattr(self.current, "stream", self.legacy)
        return stream

    def launch(self) -> None:
        """A kernel or copy, issued as CuPy issues it: on the thread's current stream."""
        self.launched.append((threading.get_ident(), self.get_current_stream()))


def stand_in_streams() -> ThreadStreams:
    """The backend's streams over a stand-in ``cupy.cuda`` (for a backend built without its
    constructor, which proves a real device)."""
    cupy: Any = SimpleNamespace(cuda=StandInCuda())
    return ThreadStreams(cupy)
