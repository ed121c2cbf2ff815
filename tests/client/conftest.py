"""Fixtures of the client tests: a real server on a free loopback port (session-wide), clients
bound to it, and a fake server over ``httpx.MockTransport`` for the offline tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tensorbits_client import Client


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """``http://127.0.0.1:<port>`` of ``tensorbits serve`` with the NumPy backend."""
    port = _free_port()
    env = {
        **os.environ,
        "TENSORBITS_BACKEND": "numpy",
        "TENSORBITS_LOG_LEVEL": "warning",
        "TENSORBITS_CPU_THREADS": "1",
    }
    argv = [sys.executable, "-m", "tensorbits.cli", "serve", "--port", str(port)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if _status(f"{url}/v2/health/live") == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                pytest.fail(f"tensorbits serve did not come up:\n{stderr[-2000:]}")
            time.sleep(0.1)
        missing = [p for p in ("/v2", "/v1/operators") if _status(url + p) == 404]
        if missing:
            pytest.skip(f"the server has no {', '.join(missing)} route yet")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


@pytest.fixture(scope="session")
def live(server_url: str) -> Iterator[Client]:
    """One long-lived client of the live server (as the README recommends)."""
    with Client(server_url) as client:
        yield client


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Whatever needs the live server is an integration test, as the marker says.
    for item in items:
        if "server_url" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.integration)
