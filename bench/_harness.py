"""Shared by the HTTP benchmarks: start servers on free loopback ports, a plain-socket HTTP/1.1
client that reads a response into one preallocated buffer, and best-of-N timing."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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
    with this interpreter (``-m tensorbits.cli``): a GPU machine given the source tree on
    PYTHONPATH has no .venv and no ``tensorbits`` script; a CuPy server there may compile its
    probe kernels first (START_TIMEOUT_S)."""
    port = free_port()
    settings = {"TENSORBITS_BACKEND": "numpy", "TENSORBITS_LOG_LEVEL": "warning", **env}
    argv = [sys.executable, "-m", "tensorbits.cli", "serve", "--port", str(port)]
    with server(argv, f"http://127.0.0.1:{port}/v2/health/live", settings, START_TIMEOUT_S):
        yield port


@contextlib.contextmanager
def baseline_server() -> Iterator[int]:
    port = free_port()
    argv = [str(BIN / "uvicorn"), "bench._baseline_app:app", "--port", str(port), *UVICORN_FLAGS]
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


class RawEcho:
    """A loopback TCP server that sends back exactly the bytes it got: the floor for a round trip."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            conn, _ = self.listener.accept()
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn: socket.socket) -> None:
        with conn:
            buf = bytearray(1 << 27)
            view = memoryview(buf)
            while True:
                header = conn.recv(8)
                if len(header) < 8:
                    return
                size = int.from_bytes(header, "little")
                filled = 0
                while filled < size:
                    filled += conn.recv_into(view[filled:size])
                conn.sendall(view[:size])

    def round_trip_fn(self, size: int) -> Callable[[], None]:
        sock = socket.create_connection(("127.0.0.1", self.port))
        payload = bytearray(size)
        back = bytearray(size)
        view = memoryview(back)

        def once() -> None:
            sock.sendall(size.to_bytes(8, "little"))
            sock.sendall(payload)
            filled = 0
            while filled < size:
                filled += sock.recv_into(view[filled:], size - filled)

        return once


def best_of(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up: connections, allocator, page faults
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


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


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
