"""Fixtures of the client tests: a real server on a free loopback port (session-wide), clients
bound to it, and a fake server over ``httpx.MockTransport`` for the offline tests."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import pytest
from support.live import serve

from tensorbits_client import Client


@pytest.fixture(scope="session")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``http://127.0.0.1:<port>`` of ``tensorbits serve`` with the NumPy backend."""
    argv = [sys.executable, "-m", "tensorbits.server.cli", "serve"]
    stderr_path = tmp_path_factory.mktemp("server") / "stderr.log"
    with stderr_path.open("wb") as stderr, contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(
                serve(
                    {"TENSORBITS_CPU_THREADS": "1"},
                    argv=argv,
                    stderr=stderr,
                    ready="/v2/health/live",
                )
            )
        except RuntimeError:
            tail = stderr_path.read_text(errors="replace")[-2000:]
            pytest.fail(f"tensorbits serve did not come up:\n{tail}")
        missing = [p for p in ("/v2", "/v1/operators") if server.get(p, timeout=2) == 404]
        if missing:
            pytest.skip(f"the server has no {', '.join(missing)} route yet")
        yield server.base_url


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
