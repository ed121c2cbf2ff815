"""glibc malloc settings for a server whose large buffers come and go on many threads.

Without them the server's resident memory grows with the length of a run under steady traffic,
and passes the bound admission is meant to keep (docs/reliability.md, "Memory over time"): the
bytes in use stay flat, the bytes malloc keeps free inside its heaps grow. glibc's threshold for
giving a large allocation its own ``mmap`` is dynamic: it starts at 128 KiB and, each time such a
mapping is freed, rises to its size (up to 32 MiB). After the first large request, every later
request body and response buffer of up to 32 MiB is carved out of malloc's heaps instead, in the
arena of whichever thread allocates it (the event loop, the worker threads: up to 8 arenas per
core). A freed buffer stays there as free space that a later buffer of another size, or on
another arena, often cannot reuse, and the heaps only shrink from their top.

``tune_allocator`` fixes the threshold at ``MMAP_THRESHOLD_BYTES`` (``mallopt(M_MMAP_THRESHOLD)``,
which also turns the dynamic rise off): every buffer of 1 MiB or more is a mapping of its own,
returned to the kernel the moment it is freed, so resident memory follows the bytes in flight
(which admission bounds). Smaller allocations still come from the heaps, where reuse is cheap
and fragmentation is bounded by their size. The cost is a fresh mapping, and its page faults,
per large buffer (measured on a 2-core VM: a 2 x 8 MiB round trip 1.39x the
time of heap reuse; 1.14x with transparent huge pages for malloc's mappings,
``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``, which the images and ``make serve`` set and which only
an environment variable read at start can; buffers over 32 MiB were mappings anyway).

Where the C library is not glibc (musl, macOS) nothing is done. An operator's own choice wins:
with ``MALLOC_MMAP_THRESHOLD_`` or ``GLIBC_TUNABLES=glibc.malloc.mmap_threshold=...`` in the
environment glibc has already applied it, and ``TENSORBITS_MALLOC_TUNING=0`` turns this off
(to measure without it, or under another allocator).
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("tensorbits.memory")

# mallopt's parameter number for the mmap threshold, from glibc's <malloc.h>.
M_MMAP_THRESHOLD = -3
# Request bodies and response buffers of large tensors are far above it; JSON and small tensors
# below. It is also where v2 work leaves the event loop (api/v2_infer.py).
MMAP_THRESHOLD_BYTES = 1 << 20
OFF_SWITCH = "TENSORBITS_MALLOC_TUNING"
THRESHOLD_ENV = "MALLOC_MMAP_THRESHOLD_"
THRESHOLD_TUNABLE = "glibc.malloc.mmap_threshold"


@dataclass(frozen=True)
class Tuning:
    """What ``tune_allocator`` did: the mallopt settings it made, or why it made none."""

    applied: dict[str, int] = field(default_factory=dict)
    skipped: str | None = None


def load_glibc() -> Any | None:
    """The process's C library when it is glibc (it has ``gnu_get_libc_version``), else None."""
    try:
        libc = ctypes.CDLL(None)  # the symbols already loaded: the C library Python runs on
    except (OSError, TypeError):  # TypeError: Windows, where CDLL needs a name
        return None
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    return libc


def tune_allocator(
    environ: MutableMapping[str, str] | None = None, libc: Any | None = None
) -> Tuning:
    """Fix glibc's mmap threshold at ``MMAP_THRESHOLD_BYTES`` for this process, and export it
    as ``MALLOC_MMAP_THRESHOLD_`` for the worker processes uvicorn spawns (``--workers``: new
    interpreters, whose glibc reads it at start). Harmless where glibc is absent. Call once, at
    start-up, before the server allocates large buffers."""
    environ = os.environ if environ is None else environ
    tuning = _tune(environ, libc if libc is not None else load_glibc())
    if tuning.skipped is None:
        logger.debug("malloc: %s", tuning.applied)  # the expected case: not worth a start line
    else:
        logger.info("malloc tuning skipped: %s", tuning.skipped)
    return tuning


def _tune(environ: MutableMapping[str, str], libc: Any | None) -> Tuning:
    if environ.get(OFF_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return Tuning(skipped=f"{OFF_SWITCH}={environ[OFF_SWITCH]}")
    if THRESHOLD_ENV in environ or THRESHOLD_TUNABLE in environ.get("GLIBC_TUNABLES", ""):
        return Tuning(skipped="the mmap threshold is set in the environment")
    if libc is None:
        return Tuning(skipped="the C library is not glibc")
    if libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) != 1:
        return Tuning(skipped="mallopt(M_MMAP_THRESHOLD) failed")
    environ[THRESHOLD_ENV] = str(MMAP_THRESHOLD_BYTES)
    return Tuning(applied={"M_MMAP_THRESHOLD": MMAP_THRESHOLD_BYTES})
