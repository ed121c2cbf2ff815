"""The CuPy backend's streams on a real device (tests/core/test_cupy_streams.py runs the same on
a stand-in): two threads launch on two streams, neither the legacy default stream, each run is
right, and a synchronize leaves the thread's own stream idle. Skipped, with the reason, where
CuPy or a working CUDA device is missing (in GPU mode, failed: gpu/devices.py)."""

from __future__ import annotations

import importlib
import threading
from typing import Any

import numpy as np
import pytest
from gpu.devices import cupy_backend_or_skip, module_backend

from tensorbits.core.backends import Backend
from tensorbits.core.engine import run_into
from tensorbits_protocol.dtypes import DataType
from tensorbits_protocol.operators import get_operator
from tensorbits_protocol.validation import TensorSpec, validate_call

pytestmark = pytest.mark.gpu

cupy_backend = module_backend(cupy_backend_or_skip())
NOT = "onnx.BitwiseNot-18"
SIZE = 64 << 20  # long enough a kernel that two threads' runs are in flight together


def _not_on_device(backend: Backend, seen: dict[int, tuple[int, bool]]) -> None:
    """BIT_NOT of a device array into another, synchronized; records the thread's current
    stream then and whether it is idle after the synchronize."""
    cupy = importlib.import_module("cupy")  # the backend is CuPy's: present where it runs
    x = np.random.default_rng(threading.get_ident() % 1000).integers(0, 256, SIZE, np.uint8)
    op = get_operator(NOT)
    call = validate_call(op, {"X": TensorSpec(DataType.UINT8, (SIZE,))}, {})
    on_device = backend.asarray(x)
    out = backend.empty((SIZE,), np.dtype(np.uint8))
    run_into(backend, call, [on_device], out)  # launched and synchronized
    stream: Any = cupy.cuda.get_current_stream()
    seen[threading.get_ident()] = (int(stream.ptr), bool(stream.done))
    np.testing.assert_array_equal(backend.to_host(out), ~x)


def test_two_threads_run_on_two_streams_not_the_legacy_one(cupy_backend: Backend) -> None:
    seen: dict[int, tuple[int, bool]] = {}
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def request() -> None:
        try:
            barrier.wait()
            _not_on_device(cupy_backend, seen)
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=request) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    (first, first_done), (second, second_done) = seen.values()
    assert first != second
    assert 0 not in (first, second)  # 0: the legacy default stream
    assert first_done, seen  # each synchronize waited on its own stream
    assert second_done, seen
