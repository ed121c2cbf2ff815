"""``tensorbits serve --workers 2`` live (``workers.py``): both workers serve one port, each with
the guarded protocol and its share of the in-flight limits, ``/metrics`` adds them up, and SIGTERM
drains every worker (readiness false, requests in flight finished) before the server exits; so
does the supervisor's death, even by SIGKILL, after which no worker, port or metrics folder is
left."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.live import LiveServer, metric_samples, serve, settled_metric_samples
from support.rawhttp import ask, assert_json_error, read_response, request
from support.v2 import NOT, assert_bit_not, bit_not_request

from tensorbits.config.settings import Settings

MiB = 1 << 20
WORKERS = {"TENSORBITS_WORKERS": "2", "TENSORBITS_GRPC_PORT": "0"}


@contextlib.contextmanager
def _half_uploaded(server: LiveServer, data: np.ndarray[Any, Any]) -> Iterator[None]:
    """Eight connections, each with half of a NOT request for ``data`` sent (in flight on
    whichever worker took it) while the block runs; after it, each sends the rest and gets its
    correct 200."""
    raw = bit_not_request(data)
    half = len(raw) // 2
    socks: list[socket.socket] = []
    try:
        for _ in range(8):
            sock = socket.create_connection((server.host, server.port), timeout=30)
            socks.append(sock)
            sock.sendall(raw[:half])
        yield
        for sock in socks:
            sock.sendall(raw[half:])
        for sock in socks:
            assert_bit_not(read_response(sock), data)
    finally:
        for sock in socks:
            sock.close()


@pytest.fixture(scope="module")
def workers() -> Iterator[LiveServer]:
    # 2 MiB in flight for the server: 1 MiB for each worker (the largest body allowed).
    env = {
        **WORKERS,
        "TENSORBITS_MAX_INFLIGHT_BYTES": str(2 * MiB),
        "TENSORBITS_MAX_BODY_BYTES": str(MiB),
        "TENSORBITS_MAX_HEAD_BYTES": "4096",
        "TENSORBITS_TIMEOUT_HEADER_READ": "1",
    }
    with serve(env) as server:
        yield server


def _worker_of(server: LiveServer) -> str:
    """The worker that answered a request on a new connection: the per-process half of the
    request id it made (observability._RequestIds)."""
    reply = ask(server, request("GET", "/v2/health/live"))
    assert reply.status == 200
    return reply.headers["x-request-id"][:16]


def _seen_workers(server: LiveServer, seconds: float = 60) -> set[str]:
    """The workers that answer new connections, until both have (the second may still be
    starting when the first is ready) or ``seconds`` have passed."""
    seen: set[str] = set()
    deadline = time.monotonic() + seconds
    while len(seen) < 2 and time.monotonic() < deadline:
        seen.add(_worker_of(server))
    return seen


def test_both_workers_serve_the_port(workers: LiveServer) -> None:
    assert len(_seen_workers(workers)) == 2


def test_every_worker_bounds_the_request_head(workers: LiveServer) -> None:
    assert len(_seen_workers(workers)) == 2
    answered_by = set()
    for _ in range(40):
        with socket.create_connection((workers.host, workers.port), timeout=10) as sock:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            answered_by.add(read_response(sock).headers["x-request-id"][:16])
            sock.sendall(request("GET", "/v2/health/live", {"X-Big": "a" * 5000}))
            assert_json_error(read_response(sock), 431, "headers", "max_head_bytes")
        if len(answered_by) == 2:
            break
    assert len(answered_by) == 2


def test_every_worker_closes_a_head_that_does_not_arrive_in_time(workers: LiveServer) -> None:
    socks = [socket.create_connection((workers.host, workers.port), timeout=10) for _ in range(8)]
    try:
        for sock in socks:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")  # never finished
        started = time.monotonic()
        for sock in socks:
            assert sock.recv(1) == b""  # closed by whichever worker holds it
        assert time.monotonic() - started < 5
    finally:
        for sock in socks:
            sock.close()


def test_each_worker_admits_its_share_of_the_inflight_bytes(workers: LiveServer) -> None:
    # 600 KiB in and 600 KiB out: within the server's 2 MiB, past one worker's 1 MiB.
    large = np.arange(600 << 10, dtype=np.uint8)
    for _ in range(6):  # whichever worker takes it
        reply = ask(workers, bit_not_request(large))
        body = assert_json_error(reply, 413, "body", "max_inflight_bytes")
        assert f"this worker's limit of {MiB}" in body["error"], body
        assert "shared by 2 workers" in body["error"], body
    small = np.arange(300 << 10, dtype=np.uint8)  # 600 KiB in all: within a share
    assert_bit_not(ask(workers, bit_not_request(small)), small)


def test_metrics_add_up_across_the_workers() -> None:
    # A server of its own: no other test's requests in its counts.
    with serve(WORKERS) as server:
        assert len(_seen_workers(server)) == 2
        data = np.arange(16, dtype=np.uint8)
        served_by = set()
        for _ in range(40):  # a new connection each: both workers get some
            reply = ask(server, bit_not_request(data))
            assert_bit_not(reply, data)
            served_by.add(reply.headers["x-request-id"][:16])
        assert len(served_by) == 2, "one worker served every connection"
        key = (
            'tensorbits_requests_total{model="DML_OPERATOR_ELEMENT_WISE_BIT_NOT",'
            'protocol="http",route="/v2/models/{model}/infer",status="200",version="1"}'
        )
        # Triton's per-model series too, from the workers' inference statistics.
        triton = f'nv_inference_request_success{{model="{NOT}",version="1"}}'
        samples = settled_metric_samples(
            server.base_url, lambda s: (s.get(key), s.get(triton)) == (40, 40), 10
        )
        assert samples.get(key) == 40, {k: v for k, v in samples.items() if "requests" in k}
        assert samples.get(triton) == 40, {k: v for k, v in samples.items() if "nv_" in k}
        assert samples[f'nv_inference_exec_count{{model="{NOT}",version="1"}}'] == 40
        assert samples["tensorbits_worker_processes"] == 2
        latency = 'tensorbits_request_duration_seconds_count{route="/v2/models/{model}/infer"}'
        assert samples[latency] == 40
        assert samples["tensorbits_inflight_requests"] == 0
        # The admission bounds: each worker's share, summed as the in-flight figures are.
        assert samples["tensorbits_inflight_bytes_limit"] == 2048 * MiB  # the default
        assert samples["tensorbits_inflight_requests_limit"] == 64


def test_sigterm_drains_every_worker() -> None:
    """SIGTERM to the server while requests are half uploaded on connections to both workers:
    each worker turns not ready and logs it, every request still gets its correct 200, and the
    server exits 0."""
    env = {**WORKERS, "TENSORBITS_LOG_LEVEL": "info", "TENSORBITS_LOG_JSON": "true"}
    data = np.arange(MiB // 4, dtype=np.uint32)
    with tempfile.TemporaryFile() as log:
        with serve(env, stderr=log) as server:
            assert len(_seen_workers(server)) == 2
            with _half_uploaded(server, data):
                time.sleep(0.5)
                server.proc.send_signal(signal.SIGTERM)
                time.sleep(0.5)
                assert server.proc.poll() is None, "the server quit with requests in flight"
            assert server.proc.wait(timeout=30) == 0
        log.seek(0)
        records = [json.loads(line) for line in log.read().decode().splitlines() if line[:1] == "{"]
    drained = {r["pid"] for r in records if str(r["message"]).startswith("draining:")}
    assert len(drained) == 2, [r["message"] for r in records]


def _stat(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` from its third field (the state) on: the command name before it may
    hold spaces and parentheses. Field n of proc(5) is at index n - 3."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()


def _children(parent: int) -> dict[int, str]:
    """The processes whose parent is ``parent`` (its workers, and multiprocessing's resource
    tracker), each with its start time: a pid taken again later is not one of them."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # a process that ended while listed
                fields = _stat(int(entry.name))
                if int(fields[1]) == parent:
                    found[int(entry.name)] = fields[19]
    return found


def _running(processes: dict[int, str]) -> list[int]:
    """Those of ``processes`` still running: a zombie (exited, not yet reaped by whichever
    process adopted it) holds no socket and no lock any more."""
    running = []
    for pid, started in processes.items():
        with contextlib.suppress(OSError):
            fields = _stat(pid)
            if fields[19] == started and fields[0] not in "ZX":
                running.append(pid)
    return running


def _port_is_free(port: int) -> bool:
    """Whether a new server could listen on ``port``: bound as asyncio binds (SO_REUSEADDR: the
    drained connections' TIME_WAIT does not count), without SO_REUSEPORT, so that any socket a
    worker still holds on the port refuses it."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
            probe.listen()
        except OSError:
            return False
    return True


def _within(seconds: float, done: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _assert_nothing_left(processes: dict[int, str], port: int, temporary: Path) -> None:
    """Within a few seconds of the supervisor's death: every process it started gone, the port
    free, the workers' metrics folder (made in ``temporary``, its TMPDIR) removed."""
    assert _within(10, lambda: not _running(processes)), f"still running: {_running(processes)}"
    assert _within(5, lambda: _port_is_free(port)), f"port {port} still taken"
    assert not list(temporary.iterdir()), list(temporary.iterdir())


def test_killing_the_supervisor_stops_its_workers(tmp_path: Path) -> None:
    """SIGKILL to the supervisor (as the OOM killer sends): its workers exit, the port is free,
    its metrics folder is gone, and a new server starts on the same port."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    with serve({**WORKERS, "TMPDIR": str(temporary)}) as server:
        assert len(_seen_workers(server)) == 2
        processes = _children(server.proc.pid)
        assert len(processes) >= 2, processes  # both workers (and the resource tracker)
        assert [p.name[:19] for p in temporary.iterdir()] == ["tensorbits-workers-"]
        server.proc.kill()
        server.proc.wait()
        _assert_nothing_left(processes, server.port, temporary)
    with serve(WORKERS, port=server.port) as again:  # before: "address already in use"
        assert len(_seen_workers(again)) == 2


def test_killing_the_supervisor_drains_the_requests_in_flight(tmp_path: Path) -> None:
    """Requests half uploaded on connections to the workers when the supervisor is SIGKILLed:
    each worker begins its drain (and logs it), each request still gets its correct 200, and
    then nothing is left."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    log_path = tmp_path / "server.log"
    env = {
        **WORKERS,
        "TMPDIR": str(temporary),
        "TENSORBITS_LOG_LEVEL": "info",
        "TENSORBITS_LOG_JSON": "true",
    }
    data = np.arange(MiB // 4, dtype=np.uint32)

    def draining() -> set[int]:
        pids = set()
        for line in log_path.read_text().splitlines():
            with contextlib.suppress(ValueError):  # the line a worker is writing now
                record = json.loads(line)
                if str(record.get("message")).startswith("draining:"):
                    pids.add(record["pid"])
        return pids

    with log_path.open("wb") as log, serve(env, stderr=log) as server:
        assert len(_seen_workers(server)) == 2
        processes = _children(server.proc.pid)
        with _half_uploaded(server, data):
            # In flight once admitted (at the declared length, before the body is read):
            # each worker's figure reaches /metrics within a second.
            samples = partial(metric_samples, server.base_url)
            assert _within(10, lambda: samples()["tensorbits_inflight_requests"] == 8), samples()
            server.proc.kill()
            server.proc.wait()
            assert _within(10, lambda: len(draining()) == 2), draining()
        _assert_nothing_left(processes, server.port, temporary)


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"workers": 4, "max_inflight_bytes": 512 * MiB, "max_body_bytes": 256 * MiB}, "workers"),
        ({"workers": 8, "max_inflight_requests": 4}, "max_inflight_requests"),
    ],
)
def test_a_worker_count_whose_share_is_too_small_is_refused(
    settings: dict[str, int], words: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        Settings(**settings)  # type: ignore[arg-type]


def test_a_worker_admits_its_share() -> None:
    settings = Settings(workers=4, max_inflight_bytes=2048 * MiB, max_inflight_requests=64)
    assert (settings.worker_inflight_bytes, settings.worker_inflight_requests) == (512 * MiB, 16)
