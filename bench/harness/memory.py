"""A process's resident memory, sampled from ``/proc`` (``vm``: ``VmRSS``, ``VmHWM``, ...;
``RssSampler``: a series on a thread of its own, summed up per minute): the server's, over a
load test (``bench/load.py``)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

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
