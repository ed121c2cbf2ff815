"""The allocator setting of ``tensorbits.server.memory``: what it calls, where it does nothing, and that
a live server's resident memory comes back down after large requests.

Why it exists, with the measurements: docs/reliability.md, "Memory over time"."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from support.framing import HEADER, framed
from support.live import LiveServer, serve
from support.v2 import binary_input

from tensorbits.server import memory

MiB = 1 << 20
MODEL = "onnx.BitwiseXor-18"
# Live test: 24 requests of 2 x 8 MiB in, 8 MiB out (24 MiB each), 4 at a time.
LARGE_BYTES = 8 * MiB
REQUESTS = 24
AT_ONCE = 4
ON_LINUX = Path("/proc/self/status").exists()


class FakeLibc:
    """Stands in for glibc: records mallopt calls and answers what it is told to."""

    def __init__(self, answer: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.answer = answer

    def gnu_get_libc_version(self) -> bytes:
        return b"2.36"

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return self.answer


def test_fixes_the_mmap_threshold_and_exports_it_for_workers() -> None:
    libc, environ = FakeLibc(), dict[str, str]()
    tuning = memory.tune_allocator(environ, libc)
    assert libc.calls == [(memory.M_MMAP_THRESHOLD, memory.MMAP_THRESHOLD_BYTES)]
    assert tuning.applied == {"M_MMAP_THRESHOLD": 1 << 20}
    assert tuning.skipped is None
    # uvicorn's --workers are new interpreters: their glibc reads the setting from here.
    assert environ == {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}


@pytest.mark.parametrize(
    ("environ", "reason"),
    [
        ({"TENSORBITS_MALLOC_TUNING": "0"}, "TENSORBITS_MALLOC_TUNING=0"),
        ({"TENSORBITS_MALLOC_TUNING": "off"}, "TENSORBITS_MALLOC_TUNING=off"),
        ({"MALLOC_MMAP_THRESHOLD_": "65536"}, "the mmap threshold is set in the environment"),
        (
            {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"},
            "the mmap threshold is set in the environment",
        ),
    ],
)
def test_an_operators_choice_wins(environ: dict[str, str], reason: str) -> None:
    libc = FakeLibc()
    before = dict(environ)
    tuning = memory.tune_allocator(environ, libc)
    assert libc.calls == []
    assert tuning.applied == {}
    assert tuning.skipped == reason
    assert environ == before


def test_other_glibc_tunables_do_not_stop_it() -> None:
    libc = FakeLibc()
    memory.tune_allocator({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, libc)
    assert libc.calls == [(memory.M_MMAP_THRESHOLD, memory.MMAP_THRESHOLD_BYTES)]


def test_a_refused_mallopt_is_reported_not_raised() -> None:
    environ: dict[str, str] = {}
    tuning = memory.tune_allocator(environ, FakeLibc(answer=0))
    assert tuning.skipped == "mallopt(M_MMAP_THRESHOLD) failed"
    assert environ == {}


def test_harmless_without_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    # musl and macOS have no gnu_get_libc_version: load_glibc finds nothing, nothing is called.
    class NotGlibc:
        def mallopt(self, param: int, value: int) -> int:
            raise AssertionError("mallopt called without glibc")

    monkeypatch.setattr(ctypes, "CDLL", lambda name: NotGlibc())
    assert memory.load_glibc() is None
    environ: dict[str, str] = {}
    tuning = memory.tune_allocator(environ)
    assert tuning.skipped == "the C library is not glibc"
    assert environ == {}


def test_no_c_library_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_cdll(name: object) -> None:
        raise OSError("no C library")

    monkeypatch.setattr(ctypes, "CDLL", no_cdll)
    assert memory.load_glibc() is None


@pytest.mark.skipif(memory.load_glibc() is None, reason="the C library is not glibc")
def test_the_real_mallopt_accepts_it() -> None:
    # In a child process: the setting is process-wide, and this one runs the other tests.
    code = (
        "import json; from tensorbits.server import memory; "
        "t = memory.tune_allocator({}); print(json.dumps([t.applied, t.skipped]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out) == [{"M_MMAP_THRESHOLD": 1 << 20}, None]


# --- live: resident memory after large requests ----------------------------------------------


def xor_body(seed: int, nbytes: int) -> tuple[bytes, dict[str, str], np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    a, b = (rng.integers(0, 256, nbytes, np.uint8) for _ in range(2))
    header = {
        "inputs": [binary_input("A", a), binary_input("B", b)],
        "parameters": {"binary_data_output": True},
    }
    body, headers = framed(header, a.tobytes(), b.tobytes())
    return body, headers, a ^ b


def send_large(server: LiveServer, seeds: list[int]) -> None:
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        for seed in seeds:
            body, headers, expected = xor_body(seed, LARGE_BYTES)
            response = client.post(f"/v2/models/{MODEL}/infer", content=body, headers=headers)
            assert response.status_code == 200
            offset = int(response.headers[HEADER])
            assert np.array_equal(
                np.frombuffer(response.content, np.uint8, offset=offset), expected
            )


@pytest.fixture
def live() -> Iterator[LiveServer]:
    with serve() as server:
        yield server


@pytest.mark.integration
@pytest.mark.skipif(not ON_LINUX, reason="reads /proc")
def test_rss_returns_near_baseline_after_large_requests(live: LiveServer) -> None:
    """24 MiB a request, 4 at a time from 4 threads, 24 in all: afterwards the server holds
    less than one request's bytes more than before (measured: 0-1 MiB). With
    TENSORBITS_MALLOC_TUNING=0 (glibc's dynamic mmap threshold) the freed buffers stayed in
    malloc's heaps: 48 and 64 MiB more in two runs, and this bound fails."""
    send_large(live, [0])  # warm-up: imports, thread pool, first planned header
    baseline = live.rss()
    seeds = list(range(1, REQUESTS + 1))
    with ThreadPoolExecutor(AT_ONCE) as pool:
        list(
            pool.map(
                lambda part: send_large(live, part), [seeds[i::AT_ONCE] for i in range(AT_ONCE)]
            )
        )
    after = live.rss()
    one_request = 3 * LARGE_BYTES
    assert after - baseline <= one_request, (
        f"RSS {baseline / MiB:.0f} MiB before, {after / MiB:.0f} MiB after {REQUESTS} requests"
    )
