"""Start the real ``tensorbits serve`` (uvicorn, uvloop, httptools) on a free loopback port.

One helper for every test that needs a live server: the integration, client, deployment and
reliability suites; and the server process's resident memory, read from ``/proc`` (Linux)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

START_TIMEOUT_S = 60.0
TENSORBITS = Path(sys.executable).parent / "tensorbits"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class LiveServer:
    host: str
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        """``host:port``, the form tritonclient takes."""
        return f"{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"http://{self.url}"

    def get(self, path: str, timeout: float = 10) -> int:
        """The status of a GET, for "is it still answering" checks."""
        try:
            with urllib.request.urlopen(f"{self.base_url}{path}", timeout=timeout) as response:
                status: int = response.status
                return status
        except urllib.error.HTTPError as exc:
            return exc.code

    def rss(self) -> int:
        """The server process's resident memory now, in bytes."""
        return self._status_kib("VmRSS") * 1024

    def reset_peak_rss(self) -> int:
        """Reset the process's peak resident memory (Linux ``clear_refs``); its RSS now, in
        bytes."""
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")
        return self.rss()

    def peak_rss(self) -> int:
        """The process's peak resident memory since it started or the last ``reset_peak_rss``,
        in bytes."""
        return self._status_kib("VmHWM") * 1024

    def _status_kib(self, key: str) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
        raise AssertionError(f"{key} not in /proc/{self.proc.pid}/status")


def metric_samples(base_url: str) -> dict[str, float]:
    """Every sample ``/metrics`` at ``base_url`` answers (a 200 in the text format), by its
    name with its labels."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as response:
        assert response.status == 200
        assert response.headers["content-type"].startswith("text/plain")
        text = response.read().decode()
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


def settled_metric_samples(
    base_url: str, done: Callable[[dict[str, float]], bool], seconds: float
) -> dict[str, float]:
    """``metric_samples`` once ``done`` holds of them, or the last read after ``seconds``: with
    several workers, each publishes its counts to the sum only once a second."""
    deadline = time.monotonic() + seconds
    samples = metric_samples(base_url)
    while not done(samples) and time.monotonic() < deadline:
        time.sleep(0.2)
        samples = metric_samples(base_url)
    return samples


def settled_inflight_bytes(server: LiveServer, seconds: float = 10) -> float:
    """``tensorbits_inflight_bytes`` once it is back to 0, or its last value after ``seconds``."""
    name = "tensorbits_inflight_bytes"
    return settled_metric_samples(server.base_url, lambda s: s[name] == 0, seconds)[name]


def wait_ready(server: LiveServer, path: str = "/v2/health/ready") -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(
                f"tensorbits serve exited with {server.proc.returncode} before it was ready"
            )
        with contextlib.suppress(OSError):
            if server.get(path, timeout=2) == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"tensorbits serve was not ready in {START_TIMEOUT_S} s")


@contextlib.contextmanager
def serve(
    env: Mapping[str, str] | None = None,
    *,
    argv: Sequence[str] | None = None,
    stderr: IO[bytes] | int | None = None,
    stdout: IO[bytes] | int | None = subprocess.DEVNULL,
    ready: str | None = "/v2/health/ready",
    port: int | None = None,
    exact_env: bool = False,
    cwd: Path | None = None,
) -> Iterator[LiveServer]:
    """A server with the NumPy backend and quiet logs unless ``env`` says otherwise; stopped
    (SIGTERM, then SIGKILL after 30 s) on exit unless the test stopped it already.

    ``ready``: the path that has to answer 200 before the server is handed over (None: hand it
    over at once, the caller waits). ``exact_env``: ``env`` is the whole environment and ``argv``
    runs as given, without ``--host``/``--port`` (the address comes from ``env``, for ``port``)."""
    port = free_port() if port is None else port
    command = list(argv) if argv is not None else [str(TENSORBITS), "serve"]
    if exact_env:
        environment = dict(env or {})
    else:
        command += ["--host", "127.0.0.1", "--port", str(port)]
        environment = {
            **os.environ,
            "TENSORBITS_BACKEND": "numpy",
            "TENSORBITS_LOG_LEVEL": "warning",
            "TENSORBITS_CPU_THREADS": "2",
            **(env or {}),
        }
    proc = subprocess.Popen(command, env=environment, cwd=cwd, stdout=stdout, stderr=stderr)
    server = LiveServer("127.0.0.1", port, proc)
    try:
        if ready is not None:
            wait_ready(server, ready)
        yield server
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
