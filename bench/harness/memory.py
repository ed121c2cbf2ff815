"""A process's memory, measured two ways.

From outside: the resident memory of a process (the server's, over a load test) sampled from
``/proc`` (``vm``: ``VmRSS``, ``VmHWM``, ...; ``RssSampler``: a series on a thread of its own,
summed up per minute).

The probe: ``tensorbits serve`` with its memory watched from inside (``bench/load.py --probe``
runs the server as ``python -m bench.harness.memory serve ...``).

A thread writes one JSON line every ``TENSORBITS_PROBE_INTERVAL`` seconds (default 5) to
``TENSORBITS_PROBE_OUT``: the process's RSS, what glibc malloc holds (``mallinfo2``: bytes in
use, bytes free inside its heaps, bytes in mmapped chunks; ``malloc_info``: the arenas and each
one's size), the objects the garbage collector tracks, the header caches' entries and the
metrics tallies' rows. With ``TENSORBITS_PROBE_TRACEMALLOC=1`` it also records the bytes Python
and NumPy have allocated and still hold (NumPy reports its data buffers to tracemalloc), and every
``GROWTH_EVERY`` samples the 15 source lines whose live bytes grew most since the first sample
after ``TENSORBITS_PROBE_SNAPSHOT_AFTER`` seconds (default 10).

With ``TENSORBITS_PROBE_COLLECT=1`` it runs the cycle collector (``gc.collect()``) before each
sample and records the RSS before it and what it found: memory that only a collection frees is
held by reference cycles (an exception whose traceback holds the frame that holds it, say), and
lives until the collector's next full pass, which can be minutes apart.

These tell a leak from allocator slack: in a leak, the bytes in use (tracemalloc, mallinfo2's
``in_use``) grow with the run; with slack, RSS grows while they stay flat and the allocator's
free bytes, or its arenas, grow instead.

    .venv/bin/python -m bench.harness.memory serve --host 127.0.0.1 --port 8000   # as tensorbits serve
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import json
import os
import re
import sys
import tempfile
import threading
import time
import tracemalloc
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensorbits import observability
from tensorbits.core.header_cache import HeaderCache
from tensorbits.server import cli

MiB = 1 << 20
# A sample taken up to this many seconds after its time still counts as taken at that time.
LATE = 0.5


def vm(pid: int | str, key: str) -> int:
    """``VmRSS``, ``VmHWM``, ... of ``pid`` (or ``"self"``) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key}")


@dataclass(frozen=True, slots=True)
class Sample:
    t: float  # seconds since the sampler started
    rss: int  # VmRSS
    hwm: int  # VmHWM: the peak RSS so far (the kernel's own, not limited to sample times)


class RssSampler:
    """Samples a process's RSS and peak every ``every`` seconds on a thread of its own (the
    load's event loop can be busy checking answers; a thread keeps the spacing even)."""

    def __init__(self, pid: int, every: float) -> None:
        self.pid = pid
        self.every = every
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._start = time.monotonic()
        self._take()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._take()

    def _take(self) -> None:
        try:
            rss, hwm = vm(self.pid, "VmRSS"), vm(self.pid, "VmHWM")
        except (OSError, RuntimeError):
            return  # the process is gone; the load test reports that
        self.samples.append(Sample(time.monotonic() - self._start, rss, hwm))

    def _run(self) -> None:
        next_at = self._start + self.every
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            self._take()
            next_at += self.every

    def peak_at(self, t: float) -> int:
        """VmHWM at the last sample no later than ``t`` seconds: the peak up to then."""
        before = [s.hwm for s in self.samples if s.t <= t + LATE]
        return before[-1] if before else 0

    def per_minute(self) -> list[tuple[int, int, int]]:
        """(minute, highest sampled RSS in it, VmHWM at its last sample) for each minute."""
        rows: dict[int, tuple[int, int]] = {}
        for s in self.samples:
            minute = max(0, int((s.t - LATE) // 60))  # a sample at 60 s closes minute 0
            top, _ = rows.get(minute, (0, 0))
            rows[minute] = (max(top, s.rss), s.hwm)
        return [(m, top, hwm) for m, (top, hwm) in sorted(rows.items())]

    def series(self, per_line: int = 10) -> list[str]:
        """The samples as ``t:RSS`` pairs in MiB, ``per_line`` to a line."""
        cells = [f"{s.t:5.0f}s {s.rss / MiB:4.0f}" for s in self.samples]
        return ["  " + " |".join(cells[i : i + per_line]) for i in range(0, len(cells), per_line)]


# --- the probe, inside the server ------------------------------------------------------------

_MALLINFO2_FIELDS = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _MALLINFO2_FIELDS.split()]


def _libc() -> Any:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


LIBC = _libc()
# Samples between two reports of tracemalloc's growth (a snapshot costs a moment of the server).
GROWTH_EVERY = 6
CACHES: weakref.WeakSet[HeaderCache[Any]] = weakref.WeakSet()
TALLIES: weakref.WeakSet[observability.RequestTally] = weakref.WeakSet()


def _track_instances() -> None:
    """Remember every header cache and request tally the app makes (they are per app)."""
    cache_init = HeaderCache.__init__
    tally_init = observability.RequestTally.__init__

    def cache_init_tracked(self: HeaderCache[Any], *args: Any, **kwargs: Any) -> None:
        cache_init(self, *args, **kwargs)
        CACHES.add(self)

    def tally_init_tracked(self: observability.RequestTally, *args: Any, **kwargs: Any) -> None:
        tally_init(self, *args, **kwargs)
        TALLIES.add(self)

    HeaderCache.__init__ = cache_init_tracked  # type: ignore[method-assign]
    observability.RequestTally.__init__ = tally_init_tracked  # type: ignore[method-assign]


def mallinfo() -> dict[str, int]:
    if LIBC is None or not hasattr(LIBC, "mallinfo2"):
        return {}
    LIBC.mallinfo2.restype = _Mallinfo2
    info = LIBC.mallinfo2()
    return {
        "heap": info.arena,  # bytes the arenas got from the system (sbrk and heap mmaps)
        "in_use": info.uordblks,  # of which allocated
        "free": info.fordblks,  # of which free, kept by malloc
        "releasable": info.keepcost,  # free at the top of the main heap
        "mmapped": info.hblkhd,  # chunks mmapped on their own (above the mmap threshold)
        "mmapped_chunks": info.hblks,
    }


def arenas() -> list[int]:
    """Each arena's current size in bytes, from ``malloc_info`` (an XML report)."""
    if LIBC is None or not hasattr(LIBC, "malloc_info"):
        return []
    LIBC.fopen.restype = ctypes.c_void_p
    LIBC.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    LIBC.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    LIBC.fclose.argtypes = [ctypes.c_void_p]
    with tempfile.NamedTemporaryFile(suffix=".xml") as file:
        stream = LIBC.fopen(file.name.encode(), b"w")
        LIBC.malloc_info(0, stream)
        LIBC.fclose(stream)
        xml = Path(file.name).read_text()
    sizes = []
    for heap in re.findall(r'<heap nr="\d+">(.*?)</heap>', xml, re.S):
        found = re.search(r'<system type="current" size="(\d+)"/>', heap)
        sizes.append(int(found.group(1)) if found else 0)
    return sizes


def rss() -> int:
    return vm("self", "VmRSS")


def sample(start: float, collect: bool = False) -> dict[str, Any]:
    record: dict[str, Any] = {"t": round(time.monotonic() - start, 1)}
    if collect:
        # What only the cycle collector frees: the RSS before and the objects it found.
        record["rss_before_collect"] = rss()
        record["collected"] = gc.collect()
    record["rss"] = rss()
    record["malloc"] = mallinfo()
    record["arenas"] = arenas()
    record["gc_objects"] = len(gc.get_objects())
    record["threads"] = threading.active_count()
    record["cache_entries"] = sorted(len(c) for c in CACHES)
    record["cache_header_bytes"] = sorted(c.held for c in CACHES)
    record["tally_rows"] = sorted(len(t.requests) for t in TALLIES)
    if tracemalloc.is_tracing():
        record["traced"] = tracemalloc.get_traced_memory()[0]
    return record


def watch(
    out: Path, interval: float, snapshot_after: float, collect: bool, stop: threading.Event
) -> None:
    start = time.monotonic()
    first: tracemalloc.Snapshot | None = None
    taken = 0
    with out.open("a") as file:
        while not stop.wait(interval):
            file.write(json.dumps(sample(start, collect)) + "\n")
            taken += 1
            if tracemalloc.is_tracing():
                if first is None and time.monotonic() - start >= snapshot_after:
                    first = tracemalloc.take_snapshot()
                elif first is not None and taken % GROWTH_EVERY == 0:
                    # Written as the run goes: uvicorn ends the process by re-raising SIGTERM,
                    # so nothing after cli.main would run. The load test prints the last one.
                    file.write(json.dumps({"tracemalloc_growth": growth(first)}) + "\n")
            file.flush()


def growth(first: tracemalloc.Snapshot) -> list[dict[str, Any]]:
    """The source lines whose live bytes grew most since ``first``."""
    grown = tracemalloc.take_snapshot().compare_to(first, "lineno")[:15]
    return [
        {"where": str(stat.traceback), "grown": stat.size_diff, "count": stat.count_diff}
        for stat in grown
    ]


def main(argv: list[str]) -> int:
    out = Path(os.environ["TENSORBITS_PROBE_OUT"])
    interval = float(os.environ.get("TENSORBITS_PROBE_INTERVAL", "5"))
    snapshot_after = float(os.environ.get("TENSORBITS_PROBE_SNAPSHOT_AFTER", "10"))
    if os.environ.get("TENSORBITS_PROBE_TRACEMALLOC") == "1":
        tracemalloc.start()
    _track_instances()
    stop = threading.Event()
    collect = os.environ.get("TENSORBITS_PROBE_COLLECT") == "1"
    thread = threading.Thread(
        target=watch, args=(out, interval, snapshot_after, collect, stop), daemon=True
    )
    thread.start()
    try:
        return cli.main(argv)
    finally:
        stop.set()
        thread.join(30)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
