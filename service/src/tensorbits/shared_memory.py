"""Triton's system shared-memory extension: tensors passed by reference to POSIX shared memory.

A client on the same host creates a POSIX shared-memory object (``shm_open``), registers a
*region* of it under a name (``POST /v2/systemsharedmemory/region/{name}/register`` with
``key``, ``offset``, ``byte_size``; the gRPC SystemSharedMemoryRegister), then names that region
in an input's or a requested output's ``shared_memory_*`` parameters instead of sending bytes.

The extension is off unless ``TENSORBITS_SHARED_MEMORY=true``, and a key must start with
``TENSORBITS_SHARED_MEMORY_PREFIX`` (default ``/tensorbits``): a client cannot make the server
open another program's memory. The threat model (docs/reliability.md) is a client that lies:

* **Offsets and sizes** are checked against the region on every use, in Python integers (no
  overflow), not only at registration; an input's size must be exactly its tensor's.
* **The object changing under us.** A client may shrink (``ftruncate``), unlink or re-create the
  object after registering it. A *mapping* of a file that shrank raises SIGBUS on access, which
  would kill the server (it killed a real Triton, tried here), and no check before the access
  closes the race. So the server never maps client memory: it keeps the object's file
  descriptor, opened at registration, and moves bytes with ``preadv``/``pwritev``, which return
  short or extend instead of faulting. A shrunk object gives a 400 naming the region; an
  unlinked or re-created one is still the object that was registered (its descriptor holds it).
  The cost is one copy in and one out, at memory speed (docs/benchmarks.md).
* **Counts**: at most ``TENSORBITS_MAX_SHARED_MEMORY_REGIONS`` regions and
  ``TENSORBITS_MAX_SHARED_MEMORY_BYTES`` bytes registered at once.
* **Unregister during a request**: each read and write holds the region (a use count); an
  unregistered region's descriptor is closed once its last use ends, never under one. A request
  whose region went away between its reads and its write gets a 400.

Regions are released at shutdown (``close``).
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from tensorbits.backends.base import Backend
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.infer import SharedMemoryRef

# Where Linux's shm_open puts its objects (glibc opens /dev/shm/<name without the slash>).
SHM_DIR = Path("/dev/shm")
MAX_KEY_CHARS = 255  # NAME_MAX
MAX_NAME_CHARS = 256
# preadv/pwritev move at most this many bytes per call on Linux (MAX_RW_COUNT).
_CHUNK = 0x7FFFF000
# Input buffers of at least this size are kept for the next request of the same size (fresh
# memory of that size comes from mmap, and its first touch faults every page: a 64 MiB input
# read into new memory took 2.5x the time of one read into memory touched before, measured),
# up to POOL_BYTES held idle in all.
POOLED_MIN_BYTES = 1 << 20
POOL_BYTES = 256 << 20


class Location(NamedTuple):
    """Where a tensor's bytes are: which object (device, inode) and which byte range of it."""

    object_id: tuple[int, int]
    start: int
    end: int

    def overlaps(self, other: Location) -> bool:
        return (
            self.object_id == other.object_id and self.start < other.end and other.start < self.end
        )


@dataclass
class Region:
    """One registered region: ``byte_size`` bytes from ``offset`` of the object ``key``."""

    name: str
    key: str
    offset: int
    byte_size: int
    fd: int
    object_id: tuple[int, int]
    uses: int = 0
    registered: bool = True

    def status(self) -> dict[str, Any]:
        """The region as the status endpoints describe it (Triton's fields)."""
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }


def _refused(message: str, field: str, rule: str) -> InvalidRequest:
    return InvalidRequest(message, field=field, rule=rule)


def _printable(text: str, limit: int) -> str:
    return text[:limit] if text[:limit].isprintable() else repr(text[:limit])


class BufferPool:
    """Buffers that inputs are read into, kept for reuse by size (``POOLED_MIN_BYTES`` and
    larger, ``max_bytes`` held idle at most). A buffer is given back once its request is done
    with it (``inference.shared_loaded``); one taken is never another request's."""

    def __init__(self, max_bytes: int = POOL_BYTES) -> None:
        self.max_bytes = max_bytes
        self.held = 0
        self._free: dict[int, list[bytearray]] = {}
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> bytearray:
        if nbytes >= POOLED_MIN_BYTES:
            with self._lock:
                free = self._free.get(nbytes)
                if free:
                    self.held -= nbytes
                    return free.pop()
        return bytearray(nbytes)

    def give(self, buffer: bytearray) -> None:
        nbytes = len(buffer)
        if nbytes < POOLED_MIN_BYTES:
            return
        with self._lock:
            if self.held + nbytes <= self.max_bytes:
                self._free.setdefault(nbytes, []).append(buffer)
                self.held += nbytes


class SystemSharedMemory:
    """The registered regions of one server, and every read and write of their bytes."""

    def __init__(self, prefix: str, max_regions: int, max_bytes: int) -> None:
        self.prefix = prefix
        self.max_regions = max_regions
        self.max_bytes = max_bytes
        self.pool = BufferPool()
        self._lock = threading.Lock()
        self._regions: dict[str, Region] = {}

    # --- registration ------------------------------------------------------------------------

    def _check_key(self, key: str) -> None:
        shown = _printable(key, 100)
        if not key.startswith(self.prefix):
            raise _refused(
                f"key '{shown}': shared-memory keys must start with '{self.prefix}' "
                "(TENSORBITS_SHARED_MEMORY_PREFIX)",
                "key",
                "shared_memory_prefix",
            )
        name = key[1:]
        if (
            not key.startswith("/")
            or not name
            or "/" in name
            or name in (".", "..")
            or "\0" in name
            or len(key) > MAX_KEY_CHARS
        ):
            raise _refused(
                f"key '{shown}' is not a POSIX shared-memory name ('/' then up to "
                f"{MAX_KEY_CHARS - 1} characters, no other '/')",
                "key",
                "shared_memory_key",
            )

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Register ``byte_size`` bytes from ``offset`` of the object ``key`` as ``name``."""
        if not name or len(name) > MAX_NAME_CHARS or not name.isprintable():
            raise _refused(
                f"region name '{_printable(name, 100)}': 1 to {MAX_NAME_CHARS} printable characters",
                "name",
                "region_name",
            )
        self._check_key(key)
        with self._lock:
            if name in self._regions:
                raise _refused(
                    f"shared-memory region '{name}' is already registered; unregister it first",
                    "name",
                    "region_exists",
                )
            if len(self._regions) >= self.max_regions:
                raise _refused(
                    f"{len(self._regions)} shared-memory regions are registered, the limit "
                    f"(TENSORBITS_MAX_SHARED_MEMORY_REGIONS); unregister one first",
                    "name",
                    "max_shared_memory_regions",
                )
            total = sum(r.byte_size for r in self._regions.values())
            if total + byte_size > self.max_bytes:
                raise _refused(
                    f"registering {byte_size} bytes would make {total + byte_size} bytes of "
                    f"shared memory registered, more than {self.max_bytes} "
                    "(TENSORBITS_MAX_SHARED_MEMORY_BYTES)",
                    "byte_size",
                    "max_shared_memory_bytes",
                )
            fd = self._open(key)
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    raise _refused(
                        f"key '{key}' is not a shared-memory object", "key", "shared_memory_key"
                    )
                if offset + byte_size > info.st_size:
                    raise _refused(
                        f"region '{name}': offset {offset} + byte_size {byte_size} is past the end "
                        f"of '{key}' ({info.st_size} bytes)",
                        "byte_size",
                        "region_bounds",
                    )
            except BaseException:
                os.close(fd)
                raise
            self._regions[name] = Region(
                name, key, offset, byte_size, fd, (info.st_dev, info.st_ino)
            )

    @staticmethod
    def _open(key: str) -> int:
        # O_NOFOLLOW: a symbolic link put in /dev/shm by someone else is not followed.
        flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            return os.open(SHM_DIR / key[1:], flags)
        except FileNotFoundError:
            raise _refused(
                f"no shared-memory object '{key}' (create it with shm_open before registering)",
                "key",
                "shared_memory_key",
            ) from None
        except OSError as exc:
            raise _refused(
                f"cannot open shared-memory object '{key}': {exc.strerror or type(exc).__name__}",
                "key",
                "shared_memory_key",
            ) from None

    def unregister(self, name: str | None = None) -> None:
        """Unregister ``name`` (None: every region). A region in use is closed when its last
        use ends. Unregistering a name that is not registered does nothing, as in Triton."""
        with self._lock:
            names = list(self._regions) if name is None else [name]
            for each in names:
                region = self._regions.pop(each, None)
                if region is not None:
                    region.registered = False
                    if region.uses == 0:
                        os.close(region.fd)

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every region's status, or ``name``'s (400 when it is not registered)."""
        with self._lock:
            if name is None:
                return [region.status() for region in self._regions.values()]
            region = self._regions.get(name)
            if region is None:
                raise self._unknown(name)
            return [region.status()]

    def close(self) -> None:
        """Unregister everything (the server is stopping; no request runs any more)."""
        self.unregister()

    @staticmethod
    def _unknown(name: str) -> InvalidRequest:
        return _refused(
            f"shared-memory region '{_printable(name, 100)}' is not registered",
            "shared_memory_region",
            "unknown_region",
        )

    # --- use ---------------------------------------------------------------------------------

    @contextmanager
    def _use(self, name: str) -> Iterator[Region]:
        with self._lock:
            region = self._regions.get(name)
            if region is None:
                raise self._unknown(name)
            region.uses += 1
        try:
            yield region
        finally:
            with self._lock:
                region.uses -= 1
                if not region.registered and region.uses == 0:
                    os.close(region.fd)

    def locate(self, ref: SharedMemoryRef, nbytes: int, tensor: str, direction: str) -> Location:
        """Check that ``ref`` names a registered region and lies inside it, with room for
        ``nbytes`` (exactly ``nbytes`` for an input); where its bytes are."""
        if direction == "input" and ref.byte_size != nbytes:
            raise _refused(
                f"input '{tensor}': shared_memory_byte_size is {ref.byte_size}, the tensor has "
                f"{nbytes} bytes",
                tensor,
                "shared_memory_byte_size",
            )
        if direction == "output" and ref.byte_size < nbytes:
            raise _refused(
                f"output '{tensor}': shared_memory_byte_size is {ref.byte_size}, the output needs "
                f"{nbytes} bytes",
                tensor,
                "shared_memory_byte_size",
            )
        with self._use(ref.region) as region:
            if ref.offset + ref.byte_size > region.byte_size:
                raise _refused(
                    f"{direction} '{tensor}': shared_memory_offset {ref.offset} + "
                    f"shared_memory_byte_size {ref.byte_size} is past the end of region "
                    f"'{region.name}' ({region.byte_size} bytes)",
                    tensor,
                    "region_bounds",
                )
            start = region.offset + ref.offset
            return Location(region.object_id, start, start + ref.byte_size)

    def read(self, ref: SharedMemoryRef, nbytes: int, tensor: str) -> bytearray:
        """The ``nbytes`` bytes of an input (checked by ``locate`` before, checked again), in a
        buffer of the pool: give it back with ``recycle`` when done with it."""
        buffer = self.pool.take(nbytes)
        try:
            with self._use(ref.region) as region:
                self._check_bounds(region, ref, nbytes, tensor, "input")
                view = memoryview(buffer)
                done = 0
                while done < nbytes:
                    count = os.preadv(
                        region.fd, [view[done : done + _CHUNK]], region.offset + ref.offset + done
                    )
                    if count == 0:
                        raise self._shrunk(region, tensor)
                    done += count
        except BaseException:
            self.pool.give(buffer)
            raise
        return buffer

    def recycle(self, buffers: list[bytearray]) -> None:
        """Give back buffers ``read`` returned, once nothing uses them any more."""
        for buffer in buffers:
            self.pool.give(buffer)

    def write(self, ref: SharedMemoryRef, data: memoryview, tensor: str) -> None:
        """Write an output's bytes into its region."""
        nbytes = data.nbytes
        with self._use(ref.region) as region:
            self._check_bounds(region, ref, nbytes, tensor, "output")
            end = region.offset + ref.offset + nbytes
            # A write past the end would grow the object back: refuse it as a read would fail.
            if os.fstat(region.fd).st_size < end:
                raise self._shrunk(region, tensor)
            source = data.cast("B")
            done = 0
            while done < nbytes:
                done += os.pwritev(
                    region.fd, [source[done : done + _CHUNK]], region.offset + ref.offset + done
                )

    @staticmethod
    def _check_bounds(
        region: Region, ref: SharedMemoryRef, nbytes: int, tensor: str, direction: str
    ) -> None:
        if ref.offset + nbytes > region.byte_size or nbytes > ref.byte_size:
            raise _refused(
                f"{direction} '{tensor}': {nbytes} bytes from shared_memory_offset {ref.offset} "
                f"do not fit region '{region.name}' ({region.byte_size} bytes)",
                tensor,
                "region_bounds",
            )

    @staticmethod
    def _shrunk(region: Region, tensor: str) -> InvalidRequest:
        return _refused(
            f"'{tensor}': shared-memory object '{region.key}' of region '{region.name}' is "
            "smaller than when it was registered (it was truncated); re-create and re-register it",
            tensor,
            "region_shrunk",
        )


def switched_on(
    regions: SystemSharedMemory | None, tensor: str | None = None, direction: str = "input"
) -> SystemSharedMemory:
    """The server's regions, or the 400 that every use of the switched-off extension gets: a
    route or RPC of it, or (``tensor``, an input's or an output's name) a tensor's shared-memory
    parameters."""
    if regions is None:
        words = (
            "Client shared memory is disabled on this server (the system shared-memory "
            "extension is off; TENSORBITS_SHARED_MEMORY=true turns it on)"
        )
        if tensor is None:
            raise _refused(words, "shared_memory", "shared_memory")
        raise _refused(
            f"{direction} '{tensor[:100]}': {words}; send the tensor as binary data or JSON data",
            tensor[:100],
            "shared_memory",
        )
    return regions


def cuda_refusal(regions: SystemSharedMemory | None, backend: Backend) -> InvalidRequest:
    """Why a CUDA shared-memory region cannot be registered here: the extension is off, the
    backend is not CuPy (device memory needs a device), or, with CuPy, that this version does
    not serve it yet (issue 13's CUDA part waits for a GPU to be tested on)."""
    switched_on(regions)  # the extension's switch first, as for system regions
    if backend.name != "cupy":
        return _refused(
            f"CUDA shared memory needs the CuPy backend; this server runs {backend.name} on "
            f"{backend.device} (TENSORBITS_BACKEND); use system shared memory instead",
            "raw_handle",
            "cuda_shared_memory",
        )
    return _refused(
        "CUDA shared memory is not served by this version; use system shared memory instead",
        "raw_handle",
        "cuda_shared_memory",
    )


__all__ = [
    "BufferPool",
    "Location",
    "Region",
    "SystemSharedMemory",
    "cuda_refusal",
    "switched_on",
]
