"""Triton's shared-memory extensions: tensors passed by reference to memory the client shares.

A client on the same host registers a *region* under a name, then names that region in an
input's or a requested output's ``shared_memory_*`` parameters instead of sending bytes. Two
kinds share one namespace of names (as in Triton):

* **System** regions (``POST /v2/systemsharedmemory/region/{name}/register`` with ``key``,
  ``offset``, ``byte_size``; the gRPC SystemSharedMemoryRegister): bytes of a POSIX
  shared-memory object (``shm_open``).
* **CUDA** regions (``POST /v2/cudasharedmemory/region/{name}/register`` with ``raw_handle``,
  ``device_id``, ``byte_size``; the gRPC CudaSharedMemoryRegister), on the CuPy backend only:
  device memory another process exported (``cudaIpcGetMemHandle``), opened here
  (``DeviceMemory``: cuda_ipc.py) and computed on in place, never copied to the host.

The extensions are off unless ``TENSORBITS_SHARED_MEMORY=true``, and a system key must start with
``TENSORBITS_SHARED_MEMORY_PREFIX`` (default ``/tensorbits``): a client cannot make the server
open another program's memory. The threat model (docs/reliability.md) is a client that lies:

* **Offsets and sizes** are checked against the region on every use, in Python integers (no
  overflow), not only at registration; an input's size must be exactly its tensor's. A CUDA
  region's ``byte_size`` is checked against the size of the allocation the driver reports, not
  the client's word.
* **The object changing under us.** A client may shrink (``ftruncate``), unlink or re-create a
  system object after registering it. A *mapping* of a file that shrank raises SIGBUS on access,
  which would kill the server (it killed a real Triton, tried here), and no check before the
  access closes the race. So the server never maps client host memory: it keeps the object's file
  descriptor, opened at registration, and moves bytes with ``preadv``/``pwritev``, which return
  short or extend instead of faulting. A shrunk object gives a 400 naming the region; an
  unlinked or re-created one is still the object that was registered (its descriptor holds it).
  A write racing a truncate can grow the object back, never past the end of the bytes it writes,
  which lie inside the registered range (``SystemBytes.write``). The cost is one copy in and one
  out, at memory speed (docs/benchmarks.md).
* **Counts**: at most ``TENSORBITS_MAX_SHARED_MEMORY_REGIONS`` regions and
  ``TENSORBITS_MAX_SHARED_MEMORY_BYTES`` bytes registered at once, both kinds together.
* **Unregister during a request**: each use holds the region (a use count); an unregistered
  region is released (descriptor closed, device mapping closed) once its last use ends, never
  under one. A streamed run (``inference``) holds its regions from its first piece to its last;
  a run that reads whole inputs and then writes, and whose region went away in between, gets a
  400.

Regions are released at shutdown (``close``).
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, Protocol, TypeVar

from tensorbits.core.kernels import DeviceArray
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.infer import SharedMemoryRef
from tensorbits_protocol.v2 import CUDA_IPC_HANDLE_BYTES

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
# Location.object_id of device memory: (DEVICE_OBJECT, device id); a file's is (st_dev, st_ino).
DEVICE_OBJECT = -1


class Kind(Enum):
    """The two kinds of region; each has its own routes and RPCs, and one namespace of names."""

    SYSTEM = "system"
    CUDA = "CUDA"


class Location(NamedTuple):
    """Where a tensor's bytes are: which object (a file's (device, inode), or device memory's
    (DEVICE_OBJECT, device id) with device addresses) and which byte range of it."""

    object_id: tuple[int, int]
    start: int
    end: int

    @property
    def on_device(self) -> bool:
        return self.object_id[0] == DEVICE_OBJECT

    def overlaps(self, other: Location) -> bool:
        return (
            self.object_id == other.object_id and self.start < other.end and other.start < self.end
        )


class DeviceAllocation(NamedTuple):
    """Device memory another process exported, opened in this one."""

    pointer: int  # this process's device address of the region's first byte
    nbytes: int  # bytes from ``pointer`` to the end of the allocation, as the driver says


class DeviceMemory(Protocol):
    """How a backend opens device memory that another process exported (cuda_ipc.py for CuPy)."""

    device_id: int

    def open(self, raw_handle: bytes) -> DeviceAllocation:
        """Open a ``cudaIpcMemHandle_t``; raise ``InvalidRequest`` when it cannot be opened."""
        ...

    def view(self, pointer: int, nbytes: int) -> DeviceArray:
        """The ``nbytes`` bytes at ``pointer`` (inside an open allocation) as a flat uint8
        array of the backend's, no copy."""
        ...

    def close(self, allocation: DeviceAllocation) -> None:
        """Close what ``open`` opened (once per ``open``)."""
        ...


@dataclass
class Region:
    """One registered region of ``byte_size`` bytes; ``uses`` counts the requests using it."""

    name: str
    byte_size: int
    uses: int = 0
    registered: bool = True

    kind: ClassVar[Kind]

    def status(self) -> dict[str, Any]:
        raise NotImplementedError

    def location(self, start: int, nbytes: int) -> Location:
        """Where ``nbytes`` bytes from ``start`` of the region are."""
        raise NotImplementedError

    def release(self) -> None:
        """Let go of what registration opened (called once, with no use left)."""
        raise NotImplementedError


@dataclass(kw_only=True)
class SystemRegion(Region):
    """``byte_size`` bytes from ``offset`` of the POSIX shared-memory object ``key``."""

    key: str
    offset: int
    fd: int
    object_id: tuple[int, int]

    kind: ClassVar[Kind] = Kind.SYSTEM

    def status(self) -> dict[str, Any]:
        """The region as the status endpoints describe it (Triton's fields)."""
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }

    def location(self, start: int, nbytes: int) -> Location:
        return Location(self.object_id, self.offset + start, self.offset + start + nbytes)

    def release(self) -> None:
        os.close(self.fd)


@dataclass(kw_only=True)
class CudaRegion(Region):
    """``byte_size`` bytes of device memory on ``device_id`` another process exported."""

    device_id: int
    allocation: DeviceAllocation
    device: DeviceMemory

    kind: ClassVar[Kind] = Kind.CUDA

    def status(self) -> dict[str, Any]:
        """The region as the status endpoints describe it (Triton's fields)."""
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def location(self, start: int, nbytes: int) -> Location:
        first = self.allocation.pointer + start
        return Location((DEVICE_OBJECT, self.device_id), first, first + nbytes)

    def release(self) -> None:
        self.device.close(self.allocation)


_R = TypeVar("_R", bound=Region)


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


class SystemBytes(NamedTuple):
    """A tensor's ``nbytes`` bytes at ``first`` of a system region's object, checked against the
    region (``SharedMemoryRegions.system_bytes``): read and written with ``preadv``/``pwritev``
    on the descriptor, never mapped, so an object truncated meanwhile is a short read (400), or
    a write that grows it back no further than these bytes (``write``)."""

    region: SystemRegion
    first: int
    nbytes: int
    tensor: str

    def _check(self, start: int, nbytes: int) -> int:
        if start < 0 or start + nbytes > self.nbytes:
            raise AssertionError(f"bytes [{start}, {start + nbytes}) of {self.nbytes}")
        return self.first + start

    def read_into(self, start: int, into: memoryview) -> None:
        """Fill ``into`` with the tensor's bytes from its ``start``th byte on."""
        nbytes = into.nbytes
        first = self._check(start, nbytes)
        done = 0
        while done < nbytes:
            try:
                count = os.preadv(self.region.fd, [into[done : done + _CHUNK]], first + done)
            except OSError as exc:
                raise self._failed("read", exc) from None
            if count == 0:
                raise self._shrunk()
            done += count

    def write(self, start: int, data: memoryview) -> None:
        """Write ``data`` as the tensor's bytes from its ``start``th byte on."""
        nbytes = data.nbytes
        first = self._check(start, nbytes)
        # An object already truncated is refused, as a read of it would be, rather than grown
        # back. A truncate landing between this check and the write cannot be kept out: the
        # write then extends the object again, to first + nbytes at most, inside the registered
        # range (checked on this use against the region's offset and byte_size, which the object
        # had at registration). Nothing outside that range is written, nothing else is touched,
        # nothing faults. The alternatives fail: a mapping would not extend but would SIGBUS;
        # seals (F_ADD_SEALS) apply to memfd objects, not to a client's shm_open one; checking
        # after the write and truncating back races the client the same way, and would cut
        # bytes the client itself wrote there meanwhile.
        if os.fstat(self.region.fd).st_size < first + nbytes:
            raise self._shrunk()
        source = data.cast("B")
        done = 0
        while done < nbytes:
            try:
                done += os.pwritev(self.region.fd, [source[done : done + _CHUNK]], first + done)
            except OSError as exc:
                raise self._failed("written", exc) from None

    def _failed(self, what: str, exc: OSError) -> InvalidRequest:
        # The object is the client's, and so is its backing store: a write past what /dev/shm
        # can still hold (ENOSPC: the object was made sparse, its pages are taken as they are
        # written) or an I/O error is the region's failure, answered naming it, not a 500.
        region = self.region
        return _refused(
            f"'{self.tensor}': shared-memory object '{region.key}' of region '{region.name}' "
            f"could not be {what}: {exc.strerror or exc}",
            self.tensor,
            "shared_memory_io",
        )

    def _shrunk(self) -> InvalidRequest:
        region = self.region
        return _refused(
            f"'{self.tensor}': shared-memory object '{region.key}' of region '{region.name}' is "
            "smaller than when it was registered (it was truncated); re-create and re-register it",
            self.tensor,
            "region_shrunk",
        )


class SharedMemoryRegions:
    """The registered regions of one server, both kinds, and every use of their bytes.

    ``device``: how the backend opens CUDA IPC handles (None: not CuPy; ``backend`` then says
    what runs instead, for the refusal)."""

    def __init__(
        self,
        prefix: str,
        max_regions: int,
        max_bytes: int,
        device: DeviceMemory | None = None,
        backend: str = "numpy",
    ) -> None:
        self.prefix = prefix
        self.max_regions = max_regions
        self.max_bytes = max_bytes
        self.device = device
        self.backend = backend
        self.pool = BufferPool()
        self._lock = threading.Lock()
        self._regions: dict[str, Region] = {}

    @property
    def extensions(self) -> tuple[str, ...]:
        """The v2 extensions these regions serve (``GET /v2``)."""
        if self.device is None:
            return ("system_shared_memory",)
        return ("system_shared_memory", "cuda_shared_memory")

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

    @staticmethod
    def _check_name(name: str) -> None:
        if not name or len(name) > MAX_NAME_CHARS or not name.isprintable():
            raise _refused(
                f"region name '{_printable(name, 100)}': 1 to {MAX_NAME_CHARS} printable characters",
                "name",
                "region_name",
            )

    def _check_room(self, name: str, byte_size: int) -> None:
        """The name is free and the limits leave room for ``byte_size`` more (lock held)."""
        existing = self._regions.get(name)
        if existing is not None:
            raise _refused(
                f"shared-memory region '{name}' is already registered (a {existing.kind.value} "
                "region); unregister it first",
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

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Register ``byte_size`` bytes from ``offset`` of the object ``key`` as ``name``."""
        self._check_name(name)
        self._check_key(key)
        with self._lock:
            self._check_room(name, byte_size)
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
            self._regions[name] = SystemRegion(
                name, byte_size, key=key, offset=offset, fd=fd,
                object_id=(info.st_dev, info.st_ino),
            )  # fmt: skip

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

    def cuda_device(self) -> DeviceMemory:
        """How CUDA IPC handles are opened here, or the 400 a server without a device (not the
        CuPy backend) answers every CUDA registration with."""
        if self.device is None:
            raise _refused(
                f"CUDA shared memory needs the CuPy backend; this server runs {self.backend} "
                "(TENSORBITS_BACKEND); use system shared memory instead",
                "raw_handle",
                "cuda_shared_memory",
            )
        return self.device

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Register ``byte_size`` bytes of the device memory ``raw_handle`` (a
        ``cudaIpcMemHandle_t``) exported on device ``device_id`` as ``name``."""
        device = self.cuda_device()
        self._check_name(name)
        if len(raw_handle) != CUDA_IPC_HANDLE_BYTES:
            raise _refused(
                f"raw_handle has {len(raw_handle)} bytes; a cudaIpcMemHandle_t has "
                f"{CUDA_IPC_HANDLE_BYTES}",
                "raw_handle",
                "cuda_ipc_handle",
            )
        if device_id != device.device_id:
            raise _refused(
                f"device_id {device_id}: this server computes on CUDA device "
                f"{device.device_id} only; register memory of that device",
                "device_id",
                "cuda_device",
            )
        with self._lock:
            self._check_room(name, byte_size)
        # Opened without the lock (mapping device memory takes a while; uses of other regions
        # must not wait for it), so the room is checked again once it is taken back.
        allocation = device.open(raw_handle)
        try:
            if byte_size > allocation.nbytes:
                raise _refused(
                    f"region '{name}': byte_size {byte_size} is past the end of the device "
                    f"allocation the handle names ({allocation.nbytes} bytes)",
                    "byte_size",
                    "region_bounds",
                )
            with self._lock:
                self._check_room(name, byte_size)
                self._regions[name] = CudaRegion(
                    name, byte_size, device_id=device_id, allocation=allocation, device=device
                )
        except BaseException:
            device.close(allocation)
            raise

    def unregister(self, name: str | None = None, kind: Kind = Kind.SYSTEM) -> None:
        """Unregister the region ``name`` of ``kind`` (None: every region of ``kind``). A
        region in use is released when its last use ends. Unregistering a name that no region
        of that kind has does nothing, as in Triton."""
        idle: list[Region] = []
        with self._lock:
            names = list(self._regions) if name is None else [name]
            for each in names:
                region = self._regions.get(each)
                if region is None or region.kind is not kind:
                    continue
                del self._regions[each]
                region.registered = False
                if region.uses == 0:
                    idle.append(region)
        for region in idle:  # outside the lock: closing device memory takes a while
            region.release()

    def status(self, name: str | None = None, kind: Kind = Kind.SYSTEM) -> list[dict[str, Any]]:
        """Every region of ``kind``'s status, or ``name``'s (400 when no region of ``kind``
        has that name)."""
        with self._lock:
            if name is None:
                return [r.status() for r in self._regions.values() if r.kind is kind]
            region = self._regions.get(name)
            if region is None or region.kind is not kind:
                raise self._unknown(name, kind)
            return [region.status()]

    def close(self) -> None:
        """Unregister everything (the server is stopping; no request runs any more)."""
        for kind in Kind:
            self.unregister(None, kind)

    @staticmethod
    def _unknown(name: str, kind: Kind | None = None) -> InvalidRequest:
        what = "shared-memory" if kind is None else f"{kind.value} shared-memory"
        return _refused(
            f"{what} region '{_printable(name, 100)}' is not registered",
            "shared_memory_region",
            "unknown_region",
        )

    # --- use ---------------------------------------------------------------------------------

    @contextmanager
    def _use(self, name: str, kind: type[_R]) -> Iterator[_R]:
        """Hold the region ``name`` for the block, which must be of the class ``kind``: one
        unregistered and registered again as the other kind since the request was planned is
        refused."""
        with self._lock:
            region = self._regions.get(name)
            if region is None:
                raise self._unknown(name)
            if not isinstance(region, kind):
                raise _refused(
                    f"shared-memory region '{_printable(name, 100)}' was registered again, as a "
                    f"{region.kind.value} region, while the request was under way",
                    "shared_memory_region",
                    "region_changed",
                )
            region.uses += 1
        try:
            yield region
        finally:
            with self._lock:
                region.uses -= 1
                last = not region.registered and region.uses == 0
            if last:
                region.release()

    def locate(self, ref: SharedMemoryRef, nbytes: int, tensor: str, direction: str) -> Location:
        """Check that ``ref`` names a registered region and lies inside it, with room for
        ``nbytes`` (exactly ``nbytes`` for an input); where its bytes are (``on_device``: in a
        CUDA region)."""
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
        with self._use(ref.region, Region) as region:
            if ref.offset + ref.byte_size > region.byte_size:
                raise _refused(
                    f"{direction} '{tensor}': shared_memory_offset {ref.offset} + "
                    f"shared_memory_byte_size {ref.byte_size} is past the end of region "
                    f"'{region.name}' ({region.byte_size} bytes)",
                    tensor,
                    "region_bounds",
                )
            return region.location(ref.offset, ref.byte_size)

    def read(self, ref: SharedMemoryRef, nbytes: int, tensor: str) -> bytearray:
        """The ``nbytes`` bytes of an input in a system region (checked by ``locate`` before,
        checked again), in a buffer of the pool: give it back with ``recycle`` when done."""
        buffer = self.pool.take(nbytes)
        try:
            with self.system_bytes(ref, nbytes, tensor, "input") as held:
                held.read_into(0, memoryview(buffer))
        except BaseException:
            self.pool.give(buffer)
            raise
        return buffer

    def recycle(self, buffers: list[bytearray]) -> None:
        """Give back buffers ``read`` returned, once nothing uses them any more."""
        for buffer in buffers:
            self.pool.give(buffer)

    def write(self, ref: SharedMemoryRef, data: memoryview, tensor: str) -> None:
        """Write an output's bytes into its system region."""
        with self.system_bytes(ref, data.nbytes, tensor, "output") as held:
            held.write(0, data)

    @contextmanager
    def system_bytes(
        self, ref: SharedMemoryRef, nbytes: int, tensor: str, direction: str
    ) -> Iterator[SystemBytes]:
        """The ``nbytes`` bytes of a tensor in a system region, checked again, to read or write
        in pieces (``inference``'s streamed runs); the region is held for the block, so a
        request uses the object it started with even if the name is unregistered meanwhile."""
        with self._use(ref.region, SystemRegion) as region:
            self._check_bounds(region, ref, nbytes, tensor, direction)
            yield SystemBytes(region, region.offset + ref.offset, nbytes, tensor)

    @contextmanager
    def device_bytes(
        self, ref: SharedMemoryRef, nbytes: int, tensor: str, direction: str
    ) -> Iterator[DeviceArray]:
        """The ``nbytes`` bytes of a tensor in a CUDA region, as a flat uint8 device array (the
        client's memory itself, no copy), checked again; the region is held for the block, so
        the block must finish every kernel that touches the array (synchronize) before it ends."""
        with self._use(ref.region, CudaRegion) as region:
            self._check_bounds(region, ref, nbytes, tensor, direction)
            yield region.device.view(region.allocation.pointer + ref.offset, nbytes)

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


def switched_on(
    regions: SharedMemoryRegions | None, tensor: str | None = None, direction: str = "input"
) -> SharedMemoryRegions:
    """The server's regions, or the 400 that every use of the switched-off extensions gets: a
    route or RPC of them, or (``tensor``, an input's or an output's name) a tensor's
    shared-memory parameters."""
    if regions is None:
        words = (
            "Client shared memory is disabled on this server (the shared-memory extensions "
            "are off; TENSORBITS_SHARED_MEMORY=true turns them on)"
        )
        if tensor is None:
            raise _refused(words, "shared_memory", "shared_memory")
        raise _refused(
            f"{direction} '{tensor[:100]}': {words}; send the tensor as binary data or JSON data",
            tensor[:100],
            "shared_memory",
        )
    return regions


__all__ = [
    "BufferPool",
    "CudaRegion",
    "DeviceAllocation",
    "DeviceMemory",
    "Kind",
    "Location",
    "Region",
    "SharedMemoryRegions",
    "SystemBytes",
    "SystemRegion",
    "switched_on",
]
