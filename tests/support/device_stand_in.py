"""A stand-in for CUDA IPC on the host, so the CUDA shared-memory bookkeeping (registration,
namespaces, bounds, aliasing, release, planning and running on "device" arrays) is tested on
every machine. It replaces the one part that needs a GPU, ``shared_memory.DeviceMemory``
(cuda_ipc.py on CuPy), nothing else; tests/gpu runs the real one.

A test ``export``s a NumPy buffer and gets a 64-byte handle for it; ``open`` answers that
buffer's address and size, ``view`` a NumPy array over it. ``view`` refuses any range outside
one exported buffer, so code that would reach outside a client's allocation on a GPU fails here
instead of reading host memory."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from tensorbits.shared_memory import DeviceAllocation
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.v2 import CUDA_IPC_HANDLE_BYTES

Arr = np.ndarray[Any, Any]


class HostDeviceMemory:
    """``shared_memory.DeviceMemory`` over host buffers, counting opens and closes."""

    def __init__(self, device_id: int = 0) -> None:
        self.device_id = device_id
        self.exported: dict[bytes, Arr] = {}
        self.opened = 0
        self.closed = 0

    def export(self, nbytes: int) -> tuple[bytes, Arr]:
        """A new exported allocation of ``nbytes`` zero bytes, and its handle."""
        handle = os.urandom(CUDA_IPC_HANDLE_BYTES)
        buffer = np.zeros(nbytes, np.uint8)
        self.exported[handle] = buffer
        return handle, buffer

    @property
    def open_now(self) -> int:
        return self.opened - self.closed

    def open(self, raw_handle: bytes) -> DeviceAllocation:
        buffer = self.exported.get(raw_handle)
        if buffer is None:
            raise InvalidRequest(
                "raw_handle: no such exported allocation (stand-in)",
                field="raw_handle",
                rule="cuda_ipc_handle",
            )
        self.opened += 1
        return DeviceAllocation(buffer.ctypes.data, buffer.nbytes)

    def view(self, pointer: int, nbytes: int) -> Arr:
        for buffer in self.exported.values():
            start = pointer - buffer.ctypes.data
            if start >= 0 and start + nbytes <= buffer.nbytes:
                return buffer[start : start + nbytes]
        raise AssertionError(f"{nbytes} bytes at {pointer:#x} are outside every exported buffer")

    def close(self, allocation: DeviceAllocation) -> None:
        assert self.open_now > 0, "closed more often than opened"
        self.closed += 1


__all__ = ["HostDeviceMemory"]
