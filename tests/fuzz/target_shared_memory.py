"""Coverage-guided fuzz target: the shared-memory extensions' register and use parameters.

One real POSIX shared-memory object of ``OBJECT_BYTES`` (``/dev/shm``, under the target's own
prefix) is made once. Each input is a program of steps, one control byte each, then integers
(each an edge-biased value: a control byte c and (1, 2, 4, 8)[c & 3] little-endian bytes v, the
family c >> 4: 15: 2**63 - 1 + (v % 5 - 2), 14: 2**64 + v, 13: OBJECT_BYTES + (v % 5 - 2),
12: -v, otherwise v)::

    step & 7 == 0: register region (step >> 3) % 4 at (offset, byte_size); the key is the
                   object's, or (step & 0x80) another one (outside the prefix, missing, '..')
    step & 7 == 1: unregister region (step >> 3) % 4 (or all, when step & 0x80)
    step & 7 == 2: read (offset, byte_size, nbytes) from region (step >> 3) % 4
    step & 7 == 3: write (offset, byte_size, nbytes) into region (step >> 3) % 4
    step & 7 == 4: truncate the object to an integer % (2 * OBJECT_BYTES), then restore it
    step & 7 == 5: status of region (step >> 3) % 4
    step & 7 == 6: register CUDA region (step >> 3) % 4 of byte_size on device (step >> 5) & 1;
                   the handle is the one exported allocation's (DEVICE_BYTES, through the host
                   stand-in for CUDA IPC, support/device_stand_in.py), or (step & 0x80) 64
                   bytes that name none
    step & 7 == 7: use (offset, byte_size, nbytes) of CUDA region (step >> 3) % 4 as an input
                   or an output, writing into it; or (step & 0x80) unregister it

The properties: every step raises ``InvalidRequest`` or succeeds; a successful read returns
exactly the bytes asked for, equal to what lies in the object at that place; a successful write
changes only the bytes of its range and never grows the object; the object never becomes larger
than it was made (the server never writes past a region); nothing else is raised (no OSError,
no crash: the server never maps the object). On the device side: a registration succeeds only
for the exported handle, device 0 and a size inside the allocation; a use touches only bytes of
its region (the stand-in refuses a view outside the allocation); every handle opened is closed
once its regions are unregistered.

By hand::

    .venv/bin/python tests/fuzz/target_shared_memory.py -max_total_time=600 tests/fuzz/corpus_shared_memory
"""

from __future__ import annotations

import contextlib
import os
import struct
import sys
from collections.abc import Callable
from pathlib import Path

from harness import Reader, fuzz, instrumented

# The host stand-in for CUDA IPC lives with the other test helpers (a target run by hand has
# only tests/fuzz on sys.path).
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from support.device_stand_in import HostDeviceMemory

with instrumented(__name__, "tensorbits", "tensorbits_protocol"):
    from tensorbits.core.shared_memory import SHM_DIR, Kind, SharedMemoryRegions
    from tensorbits_protocol.errors import InvalidRequest
    from tensorbits_protocol.infer import SharedMemoryRef

OBJECT_BYTES = 4096
PREFIX = f"/tensorbits_fuzz_{os.getpid()}"
KEY = f"{PREFIX}_object"
OTHER_KEYS = ("/not_ours", f"{PREFIX}_missing", f"{PREFIX}/..", "/")
PATH = SHM_DIR / KEY[1:]
PATTERN = bytes(range(256)) * (OBJECT_BYTES // 256)
DEVICE_BYTES = 2048


def _object() -> Path:
    PATH.write_bytes(PATTERN)
    return PATH


def _integer(reader: Reader) -> int:
    control = reader.byte()
    width = (1, 2, 4, 8)[control & 3]
    value = int.from_bytes(reader.raw(width).ljust(width, b"\0"), "little")
    family = control >> 4
    if family == 15:
        return 2**63 - 1 + (value % 5 - 2)
    if family == 14:
        return 2**64 + value
    if family == 13:
        return OBJECT_BYTES + (value % 5 - 2)
    if family == 12:
        return -value
    return value


def _refusal(action: Callable[[], object]) -> str | None:
    """The rule of the ``InvalidRequest`` that ``action`` raises (None: it names none); it must
    raise one."""
    try:
        action()
    except InvalidRequest as refusal:
        return refusal.rule
    raise AssertionError("served where a refusal was due")


def _in_range(value: int) -> bool:
    # The wire models bound every byte count to [0, 2**63 - 1] before the registry sees it.
    return 0 <= value <= 2**63 - 1


def TestOneInput(data: bytes) -> None:  # noqa: N802 (the name atheris and libFuzzer use)
    path = _object()
    device = HostDeviceMemory()
    handle, allocation = device.export(DEVICE_BYTES)
    regions = SharedMemoryRegions(PREFIX, max_regions=3, max_bytes=2 * OBJECT_BYTES, device=device)
    reader = Reader(data)
    try:
        for _ in range(16):
            if reader.pos >= len(data):
                break
            step = reader.byte()
            name = f"r{(step >> 3) % 4}"
            with contextlib.suppress(InvalidRequest):  # a refusal is an answer
                if step & 7 >= 6:
                    _device_step(regions, reader, step, name, handle)
                else:
                    _step(regions, reader, step, name, path)
            assert os.stat(path).st_size <= OBJECT_BYTES
            registered = regions.status(None, Kind.CUDA)
            assert device.open_now == len(registered)
            assert all(entry["byte_size"] <= allocation.nbytes for entry in registered)
    finally:
        regions.close()
        device.close_exports()
        path.unlink(missing_ok=True)
    assert device.open_now == 0


def _device_step(
    regions: SharedMemoryRegions, reader: Reader, step: int, name: str, handle: bytes
) -> None:
    if step & 7 == 6:
        byte_size = _integer(reader)
        if not _in_range(byte_size):
            return
        raw = os.urandom(64) if step & 0x80 else handle
        regions.register_cuda(name, raw, (step >> 5) & 1, byte_size)
        assert raw == handle
        assert (step >> 5) & 1 == 0
        assert byte_size <= DEVICE_BYTES
        return
    if step & 0x80:
        regions.unregister(name, Kind.CUDA)
        return
    offset, byte_size, nbytes = _integer(reader), _integer(reader), _integer(reader) % 4096
    if not (_in_range(offset) and _in_range(byte_size)):
        return
    ref = SharedMemoryRef(name, byte_size, offset)
    direction = "input" if step & 0x40 else "output"
    place = regions.locate(ref, nbytes, "t", direction)
    if not place.on_device:  # a system region of that name: never used as device memory

        def as_device_memory() -> None:
            with regions.device_bytes(ref, nbytes, "t", direction):
                pass

        assert _refusal(as_device_memory) == "region_changed"
        return
    with regions.device_bytes(ref, nbytes, "t", direction) as view:
        assert view.nbytes == nbytes  # inside the allocation, or the stand-in raised
        (status,) = regions.status(name, Kind.CUDA)
        assert offset + nbytes <= status["byte_size"]
        view[:] = step


def _step(regions: SharedMemoryRegions, reader: Reader, step: int, name: str, path: Path) -> None:
    kind = step & 7
    if kind == 0:
        offset, byte_size = _integer(reader), _integer(reader)
        if not (_in_range(offset) and _in_range(byte_size)):
            return
        key = OTHER_KEYS[(step >> 3) % len(OTHER_KEYS)] if step & 0x80 else KEY
        regions.register_system(name, key, offset, byte_size)
        assert key == KEY
        assert offset + byte_size <= OBJECT_BYTES
    elif kind == 1:
        regions.unregister(None if step & 0x80 else name)
    elif kind in (2, 3):
        offset, byte_size, nbytes = _integer(reader), _integer(reader), _integer(reader) % 8192
        if not (_in_range(offset) and _in_range(byte_size)):
            return
        ref = SharedMemoryRef(name, byte_size, offset)
        direction = "input" if kind == 2 else "output"
        place = regions.locate(ref, nbytes, "t", direction)
        assert place.end - place.start == byte_size
        if place.on_device:  # a CUDA region of that name: never read or written as a file
            assert _refusal(lambda: regions.read(ref, nbytes, "t")) == "region_changed"
            return
        assert place.end <= OBJECT_BYTES
        if kind == 2:
            got = regions.read(ref, nbytes, "t")
            assert len(got) == nbytes
            assert bytes(got) == path.read_bytes()[place.start : place.start + nbytes]
        else:
            before = path.read_bytes()
            payload = struct.pack("<Q", step) * (nbytes // 8) + b"\xab" * (nbytes % 8)
            regions.write(ref, memoryview(payload), "t")
            after = path.read_bytes()
            assert len(after) == len(before)
            start = place.start
            assert after[:start] == before[:start]
            assert after[start : start + nbytes] == payload
            assert after[start + nbytes :] == before[start + nbytes :]
    elif kind == 4:
        size = _integer(reader) % (2 * OBJECT_BYTES)
        os.truncate(path, min(size, OBJECT_BYTES))
        try:
            ref = SharedMemoryRef(name, 64, 0)
            regions.read(ref, 64, "t")
        finally:
            os.truncate(path, OBJECT_BYTES)
    elif kind == 5:
        for entry in regions.status(name):
            assert entry["offset"] + entry["byte_size"] <= OBJECT_BYTES


if __name__ == "__main__":
    fuzz(TestOneInput)
