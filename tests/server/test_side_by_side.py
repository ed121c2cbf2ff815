"""HTTP and gRPC as siblings under one owner (``assembly.side_by_side``, run by
``serving.serve``): one that cannot start stops the other, with a message naming which and why,
and a stop told before they start ends both cleanly. Served in this process, as ``tensorbits
serve`` serves (its SIGTERM drain is tested live)."""

from __future__ import annotations

import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import uvicorn
from support.live import free_port

from tensorbits.config.settings import Settings
from tensorbits.runtime import Drain
from tensorbits.server.app import create_app
from tensorbits.server.assembly import StartFailure
from tensorbits.server.serving import StopSignals, draining_server, serve, uvicorn_kwargs


@contextmanager
def _taken_port() -> Iterator[int]:
    """A loopback port another socket listens on while the block runs."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _serve(settings: Settings, drain: Drain) -> uvicorn.Server:
    """``serve`` as the command runs it: the app on the runtime its process starts."""
    app = create_app(settings, drain=drain, runtime_by_process=True)
    server = draining_server(uvicorn.Config(**uvicorn_kwargs(settings, drain, app)), drain)
    serve(server, app, settings, drain)
    return server


def _settings(port: int, grpc_port: int) -> Settings:
    return Settings(
        backend="numpy", cpu_threads=1, host="127.0.0.1", port=port, grpc_port=grpc_port
    )


def test_a_grpc_port_taken_stops_the_server_before_http_serves() -> None:
    http_port = free_port()
    with _taken_port() as grpc_port, pytest.raises(StartFailure) as failed:
        _serve(_settings(port=http_port, grpc_port=grpc_port), Drain())
    assert str(failed.value).startswith(f"the gRPC endpoint could not start on port {grpc_port}:")
    assert _bindable(http_port)  # HTTP never listened


def test_an_http_port_taken_stops_the_grpc_endpoint_started_beside_it() -> None:
    grpc_port = free_port()
    with _taken_port() as http_port, pytest.raises(StartFailure) as failed:
        _serve(_settings(port=http_port, grpc_port=grpc_port), Drain())
    assert str(failed.value) == (
        f"the HTTP server could not start on port {http_port} (the error above); "
        "the gRPC endpoint is stopped with it"
    )
    assert _bindable(grpc_port)  # gRPC stopped, its port given back


def test_a_stop_told_before_the_start_ends_both_cleanly() -> None:
    """SIGTERM while the process starts: both start, then drain and stop at once, no error."""
    http_port, grpc_port = free_port(), free_port()
    drain = Drain()
    settings = _settings(port=http_port, grpc_port=grpc_port)
    app = create_app(settings, drain=drain, runtime_by_process=True)
    server = draining_server(uvicorn.Config(**uvicorn_kwargs(settings, drain, app)), drain)
    # As the command holds the signals: uvicorn raises the one it caught again once stopped.
    with StopSignals() as stop:
        assert stop.hand_to(server)
        signal.raise_signal(signal.SIGTERM)
        serve(server, app, settings, drain)
    assert drain.begun
    assert not app.state.runtime.started  # closed once both listeners stopped
    assert _bindable(http_port)
    assert _bindable(grpc_port)
