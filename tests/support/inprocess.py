"""The app in process: ``create_app`` with the settings a test gives, under Starlette's
``TestClient`` (its lifespan run, so the runtime and backend exist), and the gRPC endpoint
beside it on that runtime when the settings give it a port (``assembly.grpc_beside``, as a
served process starts it)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import StarletteDeprecationWarning

with warnings.catch_warnings():
    # Starlette 1.x asks for httpx2 under its TestClient; the workspace pins httpx 0.28, which
    # works. Import it here, once, with that one warning silenced (tests import it from here).
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from fastapi.testclient import TestClient

from tensorbits.api.deps import runtime_of_app
from tensorbits.config.settings import Settings
from tensorbits.runtime import Drain, Runtime
from tensorbits.server.app import create_app
from tensorbits.server.assembly import grpc_beside

__all__ = ["IDENTITY", "TestClient", "app_client", "runtime_of"]

IDENTITY = {"Accept-Encoding": "identity"}


@contextmanager
def app_client(
    *, drain: Drain | None = None, raise_server_exceptions: bool = True, **settings: Any
) -> Iterator[TestClient]:
    """A TestClient on an app with the NumPy backend on two threads and ``settings`` over that;
    ``drain``: the server's, as ``create_app`` takes it. ``raise_server_exceptions=False``: an
    exception the app lets out is a 500 response, as a server answers, not an error in the test.
    With ``grpc_port`` set, the gRPC endpoint serves beside the app, on the client's event loop,
    and stops before the app does."""
    app_settings = Settings(**{"backend": "numpy", "cpu_threads": 2, **settings})
    app = create_app(app_settings, drain=drain)
    # httpx asks for gzip by default, and the server honours it (api/compression.py): these
    # tests read the bytes as sent, so they ask for none (the compression tests ask per request).
    with TestClient(
        app, raise_server_exceptions=raise_server_exceptions, headers=IDENTITY
    ) as client:
        if not app_settings.grpc_port:
            yield client
            return
        assert client.portal is not None  # the client's event loop, while the client is open
        beside = grpc_beside(runtime_of(client), app.state.metrics)
        with client.portal.wrap_async_context_manager(beside):
            yield client


def runtime_of(client: TestClient) -> Runtime:
    """The runtime of the app under ``client``, as its lifespan started it."""
    app = client.app  # typed as any ASGI app: the runtime hangs off a Starlette app's state
    assert isinstance(app, Starlette), app
    return runtime_of_app(app)
