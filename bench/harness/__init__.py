"""The benchmarks' harness: servers started on free loopback ports, a plain-socket HTTP/1.1 client
that reads a response into one preallocated buffer, and best-of-N timing in interleaved rounds.

Its modules, one concept each:

* ``bench.harness`` (this one): ``free_port``, ``server``/``tensorbits_server``/``baseline_server``
  (a process started, waited for until its health URL answers, stopped), ``PlainClient``,
  ``best_of``, ``best_per_call`` and ``interleaved_best`` (every contestant once per round, so
  drift in a shared machine hits all of them alike), ``in_process_rounds``, ``note``;
* ``bench.harness.baselines``: the floors measured beside the service: a bare FastAPI app
  (``/echo``, ``/ping``), a raw loopback TCP echo, a bare grpc.aio server;
* ``bench.harness.memory``: a process's resident memory from ``/proc`` (``vm``, ``RssSampler``),
  and ``tensorbits serve`` with its memory watched from inside (the probe);
* ``bench.harness.grpc_load``: bounded gRPC load generators (grpc.aio, h2load);
* ``bench.harness.abuse``: abusive HTTP clients in a process of their own.

The real Triton peer is ``bench/peers.py``."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
START_TIMEOUT_S = 180.0  # at most; a server that exits first is reported at once
UVICORN_FLAGS = [
    "--loop",
    "uvloop",
    "--http",
    "httptools",
    "--no-access-log",
    "--log-level",
    "warning",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_until_up(
    url: str, timeout: float = 30.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Until ``url`` answers; with ``proc`` (the server's process), an error at once when it
    exits first (its stderr, inherited, says why: e.g. a CuPy backend that cannot start)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{proc.args!r} exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"server at {url} did not come up in {timeout} s")


@contextlib.contextmanager
def server(
    argv: list[str], health_url: str, env: dict[str, str] | None = None, timeout: float = 30.0
) -> Iterator[None]:
    proc = subprocess.Popen(
        argv, env={**os.environ, **(env or {})}, cwd=ROOT, stdout=subprocess.DEVNULL
    )
    try:
        wait_until_up(health_url, timeout, proc)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextlib.contextmanager
def tensorbits_server(**env: str) -> Iterator[int]:
    """``tensorbits serve`` on a free port, NumPy backend unless ``env`` says otherwise. Started
    with this interpreter (``-m tensorbits.server.cli``): a GPU machine given the source tree on
    PYTHONPATH has no .venv and no ``tensorbits`` script; a CuPy server there may compile its
    probe kernels first (START_TIMEOUT_S). Its gRPC endpoint gets a free port too (the default
    one may be taken by another server on the machine)."""
    port = free_port()
    settings = {
        "TENSORBITS_BACKEND": "numpy",
        "TENSORBITS_LOG_LEVEL": "warning",
        "TENSORBITS_GRPC_PORT": str(free_port()),
        **env,
    }
    argv = [sys.executable, "-m", "tensorbits.server.cli", "serve", "--port", str(port)]
    with server(argv, f"http://127.0.0.1:{port}/v2/health/live", settings, START_TIMEOUT_S):
        yield port


@contextlib.contextmanager
def baseline_server() -> Iterator[int]:
    port = free_port()
    argv = [
        str(BIN / "uvicorn"),
        "bench.harness.baselines:app",
        "--port",
        str(port),
        *UVICORN_FLAGS,
    ]
    with server(argv, f"http://127.0.0.1:{port}/ping"):
        yield port


class PlainClient:
    """HTTP/1.1 over one keep-alive socket, with no parsing beyond what the benchmark needs."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.port = port
        self._buffer = bytearray()

    def request(
        self, method: str, path: str, body: list[bytes | memoryview], headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytearray]:
        length = sum(len(part) for part in body)
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nContent-Length: {length}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        self.sock.sendall(head.encode())
        for part in body:
            self.sock.sendall(part)
        return self._read_response()

    def _read_response(self) -> tuple[int, dict[str, str], bytearray]:
        while b"\r\n\r\n" not in self._buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the connection")
            self._buffer += chunk
        head, _, rest = bytes(self._buffer).partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        length = int(headers["content-length"])
        body = bytearray(length)
        view = memoryview(body)
        take = min(len(rest), length)
        view[:take] = rest[:take]
        self._buffer = bytearray(rest[take:])
        filled = take
        while filled < length:
            got = self.sock.recv_into(view[filled:], min(length - filled, 1 << 22))
            if not got:
                raise ConnectionError("server closed the connection mid-body")
            filled += got
        return status, headers, body

    def close(self) -> None:
        self.sock.close()


def best_of(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up: connections, allocator, page faults
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def best_per_call(fn: Callable[[], object], rounds: int, calls: int) -> float:
    """Seconds per call of the best of ``rounds`` rounds of ``calls`` calls each: for calls too
    quick to time one by one."""
    fn()  # warm-up, as in best_of
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def interleaved_best(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Best time of each, measured round-robin so drift in the machine hits all of them alike."""
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def in_process_rounds(doc: str | None, default: int) -> int:
    """``--rounds`` of a benchmark that runs the app in this process (its docstring is the
    help). The app's logging is set to warnings, as a server's is: its info lines would land
    among the figures."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=default)
    rounds: int = parser.parse_args().rounds
    logging.getLogger().setLevel(logging.WARNING)
    return rounds


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
