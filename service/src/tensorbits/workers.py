"""Several worker processes on one port: ``tensorbits serve --workers N`` (``TENSORBITS_WORKERS``).

Each worker is the single-process server in full: the guarded HTTP protocol (the request head
bounded in bytes and time), the app and its lifespan (so the gRPC endpoint too, where it is on),
and the readiness-first drain on SIGTERM (``cli.draining_server``). What the workers share:

- **The port.** Each worker listens on a socket of its own with ``SO_REUSEPORT``, and the kernel
  spreads new connections over them by their addresses. (One socket shared by every worker lets
  whichever worker wakes first accept them all: under a burst of new connections, one worker.)
  The supervisor binds the port first without listening: that resolves port 0, holds the port
  while workers come and go, and takes no connections itself.
- **The limits.** Each worker admits 1/N of ``TENSORBITS_MAX_INFLIGHT_BYTES`` and of
  ``TENSORBITS_MAX_INFLIGHT_REQUESTS`` (``Settings.worker_inflight_bytes``), so both hold for
  the whole server; ``Settings`` refuses N for which one worker's share could not admit a
  maximal body. A request is refused by its worker's share: with uneven load, one worker may
  answer 503 while another has room; the client's retry lands on a new connection, usually
  elsewhere.
- **The metrics.** Every worker publishes its figures in a folder the supervisor made
  (``observability.WorkerShare``); ``/metrics``, from whichever worker, adds them all up.

The supervisor starts the workers (spawned: new interpreters, as uvicorn's workers are), passes
SIGTERM and SIGINT on to each (each drains, then exits), starts a new worker in the place of one
that died, and stops them all, exiting 1, if a worker fails while starting (a bad setting, a port
taken): the same failure would repeat in every new one.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType

from tensorbits.config import Settings

logger = logging.getLogger("tensorbits.workers")

STARTUP_FAILURE = 3  # uvicorn's exit code for a server that failed during start-up
POLL_S = 0.2


def port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` with ``SO_REUSEPORT`` (and ``SO_REUSEADDR``, as
    asyncio's servers bind), not listening yet."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock


def run_worker(index: int, port: int, folder: str) -> None:
    """One worker process: its settings from the environment (the supervisor's, with the port it
    resolved), its share of the metrics in ``folder``, its own listening socket, the drain."""
    import uvicorn  # the worker's imports: after the spawn, not in the supervisor

    from tensorbits import cli, observability
    from tensorbits.app import create_app
    from tensorbits.logs import configure_logging
    from tensorbits.runtime import Drain

    settings = Settings(port=port)
    configure_logging(settings.log_level, settings.log_json)
    try:
        observability.share_with_workers(Path(folder))
        drain = Drain()
        app = create_app(settings, drain=drain)
        config = uvicorn.Config(**cli._uvicorn_kwargs(settings, drain, app))
        sock = port_socket(settings.host, port)
    except Exception:
        # Before serving: the next worker would fail the same way. The supervisor stops.
        logger.exception("worker %d could not start", index)
        sys.exit(STARTUP_FAILURE)
    server = cli.draining_server(config, drain)
    try:
        server.run(sockets=[sock])  # a failed lifespan start-up exits STARTUP_FAILURE too
    finally:
        app.state.metrics.publish()  # the final counts, for the workers still serving
        logger.debug("worker %d (pid %d) stopped", index, os.getpid())


class Supervisor:
    """Starts ``settings.workers`` workers on one port and keeps them running until told to stop."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.context = multiprocessing.get_context("spawn")
        self.workers: list[BaseProcess] = []
        self.stopping = False
        self.failed = False

    def run(self) -> int:
        settings = self.settings
        holder = port_socket(settings.host, settings.port)  # never listens: takes no connection
        port = holder.getsockname()[1]
        folder = Path(tempfile.mkdtemp(prefix="tensorbits-workers-"))
        previous = {sig: signal.signal(sig, self._stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            logger.info(
                "starting %d worker processes on port %d", settings.workers, port,
                extra={"workers": settings.workers, "port": port},
            )  # fmt: skip
            self.workers = [self._start(i, port, folder) for i in range(settings.workers)]
            while not self.stopping:
                time.sleep(POLL_S)
                self._replace_the_dead(port, folder)
            self._stop_all()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            holder.close()
            shutil.rmtree(folder, ignore_errors=True)
        return 1 if self.failed else 0

    def _start(self, index: int, port: int, folder: Path) -> BaseProcess:
        process = self.context.Process(
            target=run_worker, args=(index, port, str(folder)), name=f"tensorbits-worker-{index}"
        )
        process.start()
        return process

    def _stop(self, sig: int, frame: FrameType | None) -> None:
        self.stopping = True

    def _replace_the_dead(self, port: int, folder: Path) -> None:
        for index, process in enumerate(self.workers):
            if process.is_alive() or self.stopping:
                continue
            if process.exitcode == STARTUP_FAILURE:
                logger.error(
                    "worker %d failed while starting (exit code %d): stopping the server",
                    index, STARTUP_FAILURE,
                )  # fmt: skip
                self.failed = self.stopping = True
                return
            logger.warning(
                "worker %d (pid %s) exited with code %s: starting a new one",
                index, process.pid, process.exitcode,
            )  # fmt: skip
            self.workers[index] = self._start(index, port, folder)

    def _stop_all(self) -> None:
        """SIGTERM to every worker (each turns not ready, finishes what is in flight, exits),
        then wait for them: the graceful timeout and a margin, then SIGKILL."""
        for process in self.workers:
            if process.pid is not None and process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.settings.timeout_graceful_shutdown + 10
        for process in self.workers:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                logger.error("worker pid %s did not stop in time: killed", process.pid)
                process.kill()
                process.join()
