"""Run tests/gpu/test_cuda_shared_memory.py on a machine without a GPU, against the host
stand-in for CUDA IPC (support/device_stand_in.py), so that module and the server's CUDA
shared-memory paths over HTTP and gRPC are exercised by the suite on every machine, GPU or not
(tests/live/test_gpu_tests_on_stand_in.py runs it)::

    PYTHONPATH=tests python -m pytest -p gpu.stand_in.plugin tests/gpu/test_cuda_shared_memory.py

What stands in: the client's ``tritonclient.utils.cuda_shared_memory`` (regions made by the
stand-in's ``export``, with its API: create, raw handle, set, get, destroy), the test module's
check for a CuPy device, and the server's backend (NumPy, whose ``device_memory`` becomes the
server's own CUDA IPC code over a stand-in for CuPy and the driver: sitecustomize.py beside
this). What does not: everything of the server but CuPy and the driver, the stock tritonclient
HTTP and gRPC clients, the sockets. CUDA itself, its IPC and the CuPy kernels run only on a GPU
(docs/gpu.md)."""

from __future__ import annotations

import base64
import os
import sys
import types
from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, cast

import gpu.devices as devices
import numpy as np
import support.live
from support.device_stand_in import HostDeviceMemory

from tensorbits.core.backends import Backend

HERE = Path(__file__).resolve().parent
TESTS = HERE.parents[1]
_exports = HostDeviceMemory()


class _Region:
    """What ``create_shared_memory_region`` returns: an exported allocation and its view."""

    def __init__(self, name: str, byte_size: int) -> None:
        self.name = name
        self.handle, self.view = _exports.export(byte_size)


def _create(name: str, byte_size: int, device_id: int) -> _Region:
    return _Region(name, byte_size)


def _raw_handle(region: _Region) -> bytes:
    return base64.b64encode(region.handle)


def _set(region: _Region, arrays: list[Any]) -> None:
    offset = 0
    for array in arrays:
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        region.view[offset : offset + data.size] = data
        offset += data.size


def _get(region: _Region, dtype: Any, shape: list[int]) -> Any:
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return region.view[:nbytes].copy().view(dtype).reshape(shape)


def _destroy(region: _Region) -> None:
    region.view = np.empty(0, np.uint8)


cuda_shared_memory = types.ModuleType("tritonclient.utils.cuda_shared_memory")
cuda_shared_memory.create_shared_memory_region = _create  # type: ignore[attr-defined]
cuda_shared_memory.get_raw_handle = _raw_handle  # type: ignore[attr-defined]
cuda_shared_memory.set_shared_memory_region = _set  # type: ignore[attr-defined]
cuda_shared_memory.get_contents_as_numpy = _get  # type: ignore[attr-defined]
cuda_shared_memory.destroy_shared_memory_region = _destroy  # type: ignore[attr-defined]
sys.modules[cuda_shared_memory.__name__] = cuda_shared_memory


class _NoDevice:
    def close(self) -> None:
        pass


def _no_device() -> Backend:
    return cast("Backend", _NoDevice())


devices.cupy_backend_or_skip = _no_device
_serve = support.live.serve


def _serve_on_stand_in(
    env: Mapping[str, str] | None = None, **kwargs: Any
) -> AbstractContextManager[support.live.LiveServer]:
    path = os.pathsep.join(filter(None, (str(HERE), str(TESTS), os.environ.get("PYTHONPATH"))))
    return _serve({**(env or {}), "TENSORBITS_BACKEND": "numpy", "PYTHONPATH": path}, **kwargs)


support.live.serve = _serve_on_stand_in  # type: ignore[assignment]


def pytest_unconfigure() -> None:
    _exports.close_exports()
