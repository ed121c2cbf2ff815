"""The benchmarks' harness: servers started on free loopback ports, a plain-socket HTTP/1.1 client
that reads a response into one preallocated buffer, and best-of-N timing in interleaved rounds.
Its other modules (baselines, memory, grpc_load, abuse, charts) are listed in bench/README.md."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import TypeVar

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
MiB = 1 << 20
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
K = TypeVar("K", bound=Hashable)  # what timings are named by: a string, a tuple
START_TIMEOUT_S = 180.0  # at most; a server that exits first is reported at once


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def server(
    argv: list[str], health_url: str, env: dict[str, str] | None = None, timeout: float = 30.0
) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` started from the repository root and waited for until ``health_url`` answers (a
    process that exits first is an error at once: its stderr, inherited, says why); stopped with
    SIGTERM (killed after 30 s), so that its exit status can be read after."""
    proc = subprocess.Popen(
        argv, env={**os.environ, **(env or {})}, cwd=ROOT, stdout=subprocess.DEVNULL
    )
    deadline = time.monotonic() + timeout
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{argv!r} exited with {proc.returncode} before it was ready")
            if time.monotonic() > deadline:
                raise RuntimeError(f"server at {health_url} did not come up in {timeout} s")
            try:
                with urllib.request.urlopen(health_url, timeout=1):
                    break
            except OSError:
                time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def tensorbits_server(**env: str) -> Iterator[int]:
    """``tensorbits serve`` on a free port (its gRPC endpoint on another: the default one may be
    taken), NumPy backend unless ``env`` says otherwise. Started with this interpreter: a GPU
    machine given the source tree on PYTHONPATH has no ``tensorbits`` script, and a CuPy server
    there may compile its probe kernels first (START_TIMEOUT_S)."""
    port = free_port()
    settings = {"TENSORBITS_BACKEND": "numpy", "TENSORBITS_LOG_LEVEL": "warning",
                "TENSORBITS_GRPC_PORT": str(free_port()), **env}  # fmt: skip
    argv = [sys.executable, "-m", "tensorbits.server.cli", "serve", "--port", str(port)]
    with server(argv, f"http://127.0.0.1:{port}/v2/health/ready", settings, START_TIMEOUT_S):
        yield port


def v2_binary_request(
    inputs: dict[str, np.ndarray], output: str
) -> tuple[bytes, list[bytes | memoryview]]:
    """The v2 binary-extension body: JSON header, then each input's bytes; returns (header, parts)."""
    header = {
        "inputs": [
            {"name": name, "shape": list(a.shape), "datatype": "UINT8",
             "parameters": {"binary_data_size": a.nbytes}}
            for name, a in inputs.items()
        ],
        "outputs": [{"name": output, "parameters": {"binary_data": True}}],
    }  # fmt: skip
    head = json.dumps(header).encode()
    return head, [head, *(a.data.cast("B") for a in inputs.values())]


class PlainClient:
    """HTTP/1.1 over one keep-alive socket, with no parsing beyond what the benchmark needs.
    An answer's buffer is reused by the next answer of the same length, as the raw TCP echo's
    client reuses its own (a fresh 64 MiB buffer costs the client ~25 ms of page faults): read
    an answer before the next request."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.port = port
        self._buffer = bytearray()
        self._answer = bytearray()
        self.after_last_s = self._head_at = 0.0

    def request(
        self, method: str, path: str, body: list[bytes | memoryview], headers: dict[str, str],
        hold_s: float = 0.0,
    ) -> tuple[int, dict[str, str], bytearray]:  # fmt: skip
        """``hold_s``: the body's last MiB sent that long after the rest; the seconds from then to
        the answer's head in ``after_last_s`` (what is left to do once a body is in)."""
        length = sum(len(part) for part in body)
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nContent-Length: {length}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        self.sock.sendall(head.encode())
        last = memoryview(body[-1] if body else b"")
        held = last[len(last) - MiB :] if hold_s else last[len(last) :]
        for part in body[:-1]:
            self.sock.sendall(part)
        self.sock.sendall(last[: len(last) - len(held)])
        time.sleep(hold_s)  # (0: none; a round trip is milliseconds)
        start = time.perf_counter()
        self.sock.sendall(held)
        answer = self._read_response()
        self.after_last_s = self._head_at - start
        return answer

    def _read_response(self) -> tuple[int, dict[str, str], bytearray]:
        while b"\r\n\r\n" not in self._buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the connection")
            self._buffer += chunk
        self._head_at = time.perf_counter()
        head, _, rest = bytes(self._buffer).partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        length = int(headers["content-length"])
        body = self._answer if len(self._answer) == length else bytearray(length)
        self._answer = body
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


def rotated(names: list[K], round_: int) -> list[K]:
    """Round ``round_``'s order: each name first in turn, so none always runs after the same one."""
    k = round_ % len(names) if names else 0
    return names[k:] + names[:k]


def wall(fn: Callable[[], object]) -> Callable[[], float]:
    """``fn``'s perf_counter seconds, as a timer for ``interleaved_times``."""

    def timer() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return timer


def interleaved_times(timers: dict[K, Callable[[], float]], repeat: int) -> dict[K, list[float]]:
    """Each timer's ``repeat`` seconds after one warm-up call of each, measured round-robin in a
    rotated order so drift in the machine, and what ran just before, hit all of them alike."""
    for timer in timers.values():
        timer()
    times: dict[K, list[float]] = {name: [] for name in timers}
    for round_ in range(repeat):
        for name in rotated(list(timers), round_):
            times[name].append(timers[name]())
    return times


def interleaved_best(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Best wall-clock time of each (``interleaved_times``)."""
    times = interleaved_times({name: wall(fn) for name, fn in fns.items()}, repeat)
    return {name: min(seconds) for name, seconds in times.items()}


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
