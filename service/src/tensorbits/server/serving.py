"""One server process assembled: uvicorn's arguments for the app (``uvicorn_kwargs``), the
server that drains before it stops (``draining_server``), the signals that stop it
(``StopSignals``), and the process served (``serve``: HTTP and gRPC side by side on one runtime,
``assembly.side_by_side``).

``tensorbits serve`` runs one such process (cli.py); ``--workers N`` runs N (workers.py). Both
take them from here, so the command and the workers' supervisor need not import each other.
Every import past the standard library happens inside the function that needs it, as in cli.py:
``tensorbits --help`` imports this module and loads no uvicorn or FastAPI.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI

    from tensorbits.config.settings import Settings
    from tensorbits.runtime import Drain


def uvicorn_kwargs(
    settings: Settings, drain: Drain | None = None, app: Any = None
) -> dict[str, Any]:
    """uvicorn's arguments for one server process (the only one, or one of ``--workers N``,
    workers.py): its app built from ``settings`` (or ``app``, built already), reporting not
    ready once ``drain`` begins (None: a drain of its own, never begun)."""
    from tensorbits.api.guarded_protocol import guarded_protocol
    from tensorbits.config import tls
    from tensorbits.runtime import Drain

    drain = drain or Drain()
    if app is None:
        from tensorbits.server.app import (
            create_app,  # here: `tensorbits operators` needs no FastAPI
        )

        # A factory, so that uvicorn builds the app as it loads (and reports a failure).
        app = functools.partial(create_app, settings, drain=drain)
    return {
        "app": app,
        "factory": isinstance(app, functools.partial),
        "host": settings.host,
        "port": settings.port,
        "loop": "uvloop",
        "http": guarded_protocol(settings),  # httptools, the request head bounded (its module)
        "ws": "none",  # no WebSocket routes: an upgrade request is an ordinary HTTP request
        "log_config": None,  # configure_logging did it: JSON lines through one handler
        "log_level": settings.log_level,
        "access_log": False,  # the middleware logs each request, with its request id
        "timeout_keep_alive": settings.timeout_keep_alive,
        "timeout_graceful_shutdown": settings.timeout_graceful_shutdown,
        **tls.uvicorn_options(settings),  # HTTPS when a certificate and key are configured
    }


def serve(
    server: uvicorn.Server,
    app: FastAPI,
    settings: Settings,
    drain: Drain,
    sockets: list[socket.socket] | None = None,
) -> None:
    """Serve this process until it is stopped: ``server`` (a ``draining_server`` serving
    ``app``, built with ``runtime_by_process``) and the gRPC endpoint side by side on one
    runtime, on the event loop uvicorn's configuration asks for (uvloop).
    ``assembly.StartFailure`` when one of them cannot start, the other stopped."""
    import asyncio

    from tensorbits.server import assembly

    with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
        runner.run(assembly.side_by_side(server, app, settings, drain, sockets))


class StopSignals:
    """SIGTERM and SIGINT in a server process, held from before its server exists: remembered
    while there is no server yet, the server's drain once there is (``hand_to``). In a worker
    (workers.py) a signal during the start-up (the supervisor dying while its workers start) would
    otherwise kill it on the spot, before it could leave the workers' folder. And once uvicorn has
    served, it restores the handler it found and raises the signal it caught again: with the
    default handler there, a process that drained and finished cleanly would die of that signal
    (exit 143 for SIGTERM, a KeyboardInterrupt for SIGINT), and a worker before its last
    ``publish`` and ``leave``. This handler shrugs it off (the server has stopped already), so a
    clean stop exits 0. Held from construction; as a context manager, the handlers found are
    put back on leaving (a worker, whose process ends with its server, need not)."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.server: uvicorn.Server | None = None
        self.previous = {sig: signal.signal(sig, self) for sig in (signal.SIGTERM, signal.SIGINT)}

    def __enter__(self) -> StopSignals:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def __call__(self, sig: int, frame: FrameType | None) -> None:
        if self.server is None:
            self.received.append(sig)
        else:
            self.server.handle_exit(sig, frame)

    def hand_to(self, server: uvicorn.Server) -> bool:
        """From now on, a signal is ``server``'s; False if one came before (do not serve)."""
        self.server = server
        return not self.received


def draining_server(config: uvicorn.Config, drain: Drain, delay_s: float = 0.0) -> uvicorn.Server:
    """A uvicorn server that stops in the order load balancers route. On SIGTERM/SIGINT:
    readiness false at once (``drain``, which the app's runtime was given); for ``delay_s``
    (``TENSORBITS_DRAIN_DELAY``) every listener still accepts and serves, so that whatever
    routes here stops before a connection is refused; then the listeners close (HTTP here, gRPC
    through ``drain``'s hooks) and uvicorn finishes the requests in flight within its graceful
    timeout. A second signal during the delay ends it; SIGINT once stopping forces the exit, as
    in uvicorn. The class is made here, not at import, because subclassing uvicorn.Server
    imports uvicorn."""
    import asyncio
    import contextvars
    import logging
    import signal

    import uvicorn

    logger = logging.getLogger("tensorbits")

    def log(message: str, **fields: Any) -> None:
        # One line per process (each of --workers N drains its own requests), in a context of
        # its own: a signal handler runs in whatever task the signal interrupted, and that
        # request's id is not this line's.
        contextvars.Context().run(logger.info, message, extra={"pid": os.getpid(), **fields})

    class DrainingServer(uvicorn.Server):
        delay_cut = False

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if not drain.begun:
                drain.begin()
                if delay_s > 0:
                    log(
                        f"draining: not ready from now on; still accepting for {delay_s:g} s, "
                        "then finishing the requests in flight",
                        signal=signal.Signals(sig).name,
                        drain_delay=delay_s,
                    )
                else:
                    log(
                        "draining: not ready from now on; finishing the requests in flight",
                        signal=signal.Signals(sig).name,
                    )
            elif not self.delay_cut:
                self.delay_cut = True  # told twice: stop accepting now
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            if drain.begun and delay_s > 0:
                # The main loop has ended: keep its tick (the Date header) while the listeners,
                # still open, serve whatever the load balancers have not yet routed elsewhere.
                loop = asyncio.get_running_loop()
                deadline = loop.time() + delay_s
                counter = 0
                while not (self.delay_cut or self.force_exit):
                    left = deadline - loop.time()
                    if left <= 0:
                        break
                    await asyncio.sleep(min(left, 0.1))
                    counter += 1
                    await self.on_tick(counter)
                log("draining: no longer accepting; finishing the requests in flight")
            drain.stop_accepting()
            await super().shutdown(sockets)

    return DrainingServer(config)
