"""The ``live_server`` fixture: the real ``tensorbits serve`` (uvicorn, uvloop, httptools) as a
subprocess on a free loopback port, NumPy backend, up once per session."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class LiveServer:
    host: str
    port: int

    @property
    def url(self) -> str:
        """``host:port``, the form tritonclient takes."""
        return f"{self.host}:{self.port}"

    def get(self, path: str) -> int:
        """The status of a GET, for "is it still answering" checks."""
        try:
            with urllib.request.urlopen(f"http://{self.url}{path}", timeout=10) as response:
                status: int = response.status
                return status
        except urllib.error.HTTPError as exc:
            return exc.code


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_ready(server: LiveServer, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"tensorbits serve exited with {proc.returncode} before it was ready"
            )
        try:
            if server.get("/v2/health/ready") == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"tensorbits serve was not ready in {START_TIMEOUT_S} s")


@pytest.fixture(scope="session")
def live_server() -> Iterator[LiveServer]:
    server = LiveServer("127.0.0.1", _free_port())
    executable = Path(sys.executable).parent / "tensorbits"
    env = {
        **os.environ,
        "TENSORBITS_BACKEND": "numpy",
        "TENSORBITS_LOG_LEVEL": "warning",
        "TENSORBITS_CPU_THREADS": "2",
    }
    proc = subprocess.Popen(
        [str(executable), "serve", "--host", server.host, "--port", str(server.port)],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    try:
        _wait_ready(server, proc)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
