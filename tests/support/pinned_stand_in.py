"""What ``tensorbits.core.backends.pinned_pool`` calls of CuPy, on the host, and what CuPy does with
the buffers it lends: so the pool itself (its bound, its fallback, its reuse, the bytes given
back) runs on every machine; only CUDA's pinned memory is stood in for.

The parts of CuPy (14) stood in:

- ``cuda.PinnedMemory(size, flags)``: a "pinned" allocation, page-aligned anonymous memory here,
  counted while it lives (``pinned``) and freed when unreferenced, as CuPy's is by cudaFreeHost;
  past ``host_limit`` it raises ``CUDARuntimeError(errorMemoryAllocation)`` as cudaHostAlloc does
  on a host out of pinned memory;
- ``cuda.PinnedMemoryPointer(mem, offset)``, ``cuda.runtime`` (the error, its status, the flag),
  ``cuda.set_pinned_memory_allocator``, ``get_default_pinned_memory_pool``;
- ``asarray(host)``, staging as ``cupy._core``'s ``_array_default`` does: asks the allocator for
  a buffer (after releasing buffers whose copies have passed, as ``alloc_pinned_memory`` does), on
  ``errorMemoryAllocation`` warns (CuPy's PerformanceWarning, its words) and copies from the host
  array, pageable; otherwise copies the array into the buffer and holds the buffer until the
  copy's "event" has passed. The device copy itself lands at ``synchronize()`` (the event), so a
  buffer lent twice before its copy ran would show in the values copied.
"""

from __future__ import annotations

import ctypes
import mmap
import warnings
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation
HOST_ALLOC_PORTABLE = 1  # cudaHostAllocPortable


class PerformanceWarning(RuntimeWarning):
    """cupy._util.PerformanceWarning."""


class CUDARuntimeError(RuntimeError):
    def __init__(self, status: int) -> None:
        self.status = status
        super().__init__(f"cudaError {status}")


class PinnedStandIn:
    """One process's pinned host memory and CuPy's use of it (``cupy``)."""

    def __init__(self, host_limit: int | None = None) -> None:
        self.host_limit = host_limit
        self.pinned = 0  # bytes "pinned" now
        self.allocations = 0  # cudaHostAlloc calls that succeeded
        self.flags: set[int] = set()
        self.pinned_copies = 0
        self.pageable_copies = 0
        self.allocator: Callable[[int], Any] | None = None
        # Copies not yet run: (buffer held, where it lands, what it holds, event passed).
        self._pending: list[list[Any]] = []
        self.cupy = self._cupy()

    # --- CuPy ----------------------------------------------------------------------------------

    def _cupy(self) -> Any:
        stand_in = self

        class PinnedMemory:
            def __init__(self, size: int, flags: int = 0) -> None:
                self.size, self.ptr = size, 0
                self._map: mmap.mmap | None = None
                if size > 0:
                    limit = stand_in.host_limit
                    if limit is not None and stand_in.pinned + size > limit:
                        raise CUDARuntimeError(ERROR_MEMORY_ALLOCATION)
                    self._map = mmap.mmap(-1, size)
                    self.ptr = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
                    stand_in.pinned += size
                    stand_in.allocations += 1
                    stand_in.flags.add(flags)

            def __del__(self) -> None:
                if self._map is not None:
                    stand_in.pinned -= self.size
                    self.ptr = 0
                    # The map closes with its last reference (the address's buffer export).

        class PinnedMemoryPointer:
            def __init__(self, mem: Any, offset: int) -> None:
                self.mem = mem
                self.ptr: int = mem.ptr + offset

            def size(self) -> int:
                size: int = self.mem.size - (self.ptr - self.mem.ptr)
                return size

        def set_allocator(allocator: Callable[[int], Any] | None = None) -> None:
            stand_in.allocator = allocator

        def default_pool() -> Any:
            return SimpleNamespace(free_all_blocks=lambda: None)

        runtime = SimpleNamespace(
            CUDARuntimeError=CUDARuntimeError,
            errorMemoryAllocation=ERROR_MEMORY_ALLOCATION,
            hostAllocPortable=HOST_ALLOC_PORTABLE,
        )
        cuda = SimpleNamespace(
            PinnedMemory=PinnedMemory,
            PinnedMemoryPointer=PinnedMemoryPointer,
            runtime=runtime,
            set_pinned_memory_allocator=set_allocator,
        )
        return SimpleNamespace(
            cuda=cuda,
            asarray=self.asarray,
            get_default_pinned_memory_pool=default_pool,
            get_default_memory_pool=default_pool,  # the device's (CupyBackend.close frees it)
        )

    def _release_passed(self) -> None:
        self._pending = [entry for entry in self._pending if not entry[3]]

    def asarray(self, host: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """``cupy.asarray`` of a host array: the "device" array (a host one here), filled once
        the copy has run (``synchronize``)."""
        assert self.allocator is not None, "no pinned memory allocator installed"
        device = np.zeros_like(host)
        nbytes = host.nbytes
        self._release_passed()
        try:
            buffer = self.allocator(nbytes)
        except CUDARuntimeError as exc:
            if exc.status != ERROR_MEMORY_ALLOCATION:
                raise
            warnings.warn(
                f"Using synchronous transfer as pinned memory ({nbytes} bytes) could not be "
                f"allocated. This generally occurs because of insufficient host memory. The "
                f"original error was: {exc}",
                PerformanceWarning,
                stacklevel=2,
            )
            np.copyto(device, host)  # synchronous, from the pageable array
            self.pageable_copies += 1
            return device
        assert buffer.size() >= nbytes, (buffer.size(), nbytes)
        staged = self._view(buffer.ptr, nbytes)
        staged[:] = np.ascontiguousarray(host).view(np.uint8).ravel()
        self._pending.append([buffer, device, staged, False])
        self.pinned_copies += 1
        return device

    @staticmethod
    def _view(address: int, nbytes: int) -> np.ndarray[Any, Any]:
        return np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(address))

    def synchronize(self) -> None:
        """The stream: every copy staged so far runs, from its buffer as it is now; its event
        passes (the buffer is released at the next allocation, as CuPy's watcher does)."""
        for entry in self._pending:
            if not entry[3]:
                _, device, staged, _ = entry
                device.reshape(-1).view(np.uint8)[:] = staged
                entry[3] = True

    @property
    def buffers_held(self) -> int:
        """Buffers CuPy holds now (copies pending, or passed and not yet released)."""
        return len(self._pending)
