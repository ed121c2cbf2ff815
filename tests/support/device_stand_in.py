"""A stand-in for CUDA IPC on the host, so the CUDA shared-memory paths (registration,
namespaces, bounds, aliasing, release, planning and running on "device" arrays, over HTTP and
gRPC) are tested on every machine. It replaces the one part that needs a GPU,
``shared_memory.DeviceMemory`` (cuda_ipc.py on CuPy), nothing else; on a GPU tests/gpu runs the
real one.

"Device memory" is a POSIX shared-memory object: ``export`` makes one and maps it for the test,
and its 64-byte "IPC handle" is the object's name; ``open`` (the server's side, in this process
or another) maps it again, as ``cudaIpcOpenMemHandle`` maps an allocation into the importing
process. ``view`` refuses any range outside one open mapping, so code that would reach outside
a client's allocation on a GPU fails here instead of touching host memory. Used in process
(tests/core/test_cuda_regions.py, the fuzz target) and across processes (tests/gpu/stand_in:
the GPU tests against a server whose CUDA IPC is this)."""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import mmap
import os
from typing import Any

import numpy as np

from tensorbits.core.shared_memory import SHM_DIR, DeviceAllocation
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.v2 import CUDA_IPC_HANDLE_BYTES

Arr = np.ndarray[Any, Any]
# The objects' names: never under the server's system-region prefix (/tensorbits...).
KEY_PREFIX = "/standin_cuda_"
_numbers = itertools.count()


def _address(mapping: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(mapping))


class HostDeviceMemory:
    """``shared_memory.DeviceMemory`` over POSIX shared memory, counting opens and closes."""

    def __init__(self, device_id: int = 0) -> None:
        self.device_id = device_id
        self.opened = 0
        self.closed = 0
        self._open: dict[int, mmap.mmap] = {}  # address of an open mapping -> the mapping
        self._exported: list[tuple[str, mmap.mmap]] = []

    # --- the client's side -------------------------------------------------------------------

    def export(self, nbytes: int) -> tuple[bytes, Arr]:
        """A new allocation of ``nbytes`` zero bytes: its handle, and the exporter's view."""
        key = f"{KEY_PREFIX}{os.getpid()}_{next(_numbers)}"
        fd = os.open(SHM_DIR / key[1:], os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, max(nbytes, 1))
            mapping = mmap.mmap(fd, max(nbytes, 1))
        finally:
            os.close(fd)
        self._exported.append((key, mapping))
        return key.encode().ljust(CUDA_IPC_HANDLE_BYTES, b"\0"), np.frombuffer(
            mapping, np.uint8, count=nbytes
        )

    def close_exports(self) -> None:
        """Unlink every object ``export`` made (mappings still viewed stay until unviewed)."""
        for key, mapping in self._exported:
            (SHM_DIR / key[1:]).unlink(missing_ok=True)
            with contextlib.suppress(BufferError):  # a view of it is still alive
                mapping.close()
        self._exported.clear()

    # --- the server's side (DeviceMemory) ----------------------------------------------------

    @property
    def open_now(self) -> int:
        return self.opened - self.closed

    def open(self, raw_handle: bytes) -> DeviceAllocation:
        key = raw_handle.rstrip(b"\0").decode("ascii", "replace")
        if not key.startswith(KEY_PREFIX) or "/" in key[1:]:
            raise self._unopenable()
        try:
            fd = os.open(SHM_DIR / key[1:], os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            raise self._unopenable() from None
        try:
            mapping = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        address = _address(mapping)
        self._open[address] = mapping
        self.opened += 1
        return DeviceAllocation(address, len(mapping))

    @staticmethod
    def _unopenable() -> InvalidRequest:
        return InvalidRequest(
            "raw_handle: no such exported allocation (stand-in)",
            field="raw_handle",
            rule="cuda_ipc_handle",
        )

    def view(self, pointer: int, nbytes: int) -> Arr:
        for address, mapping in self._open.items():
            start = pointer - address
            if start >= 0 and start + nbytes <= len(mapping):
                return np.frombuffer(mapping, np.uint8, count=nbytes, offset=start)
        raise AssertionError(f"{nbytes} bytes at {pointer:#x} are outside every open allocation")

    def close(self, allocation: DeviceAllocation) -> None:
        # Dropped, not closed: a view the server still holds keeps the mapping until it goes.
        if self._open.pop(allocation.pointer, None) is None:
            raise AssertionError("closed an allocation that is not open")
        self.closed += 1


__all__ = ["KEY_PREFIX", "HostDeviceMemory"]
