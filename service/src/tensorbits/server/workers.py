"""Several worker processes on one port: ``tensorbits serve --workers N`` (``TENSORBITS_WORKERS``).

Each worker is the single-process server in full: the guarded HTTP protocol (the request head
bounded in bytes and time), the app, the gRPC endpoint beside it where it is on
(``serving.serve``), and the readiness-first drain on SIGTERM (``serving.draining_server``).
What the workers share:

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
- **The models.** The repository extension's loads and unloads, each written by the worker that
  took it to a model store in that folder (``model_store.py``, its ``models/``) and applied by
  every other worker: an unload at its next lookup of the model, a load before it is answered.
  A worker started in the place of one that died applies the store before it serves.
  (Shared-memory registrations stay a process's own: those extensions need one worker.)

The supervisor starts the workers (spawned: new interpreters, as uvicorn's workers are), passes
SIGTERM and SIGINT on to each (each drains, then exits), starts a new worker in the place of one
that died, and stops them all, exiting 1, if a worker fails while starting (a bad setting, a port
taken): the same failure would repeat in every new one.

No worker outlives its supervisor. However the supervisor dies (SIGKILL from the OOM killer
included), each worker gets SIGTERM (Linux: the parent-death signal, ``follow_supervisor``) and
drains as it would on the supervisor's SIGTERM: not ready, the requests in flight finished, then
it exits and its listening socket with it; the port is free once the last worker is gone. The
last process out of the workers' folder removes it (``WorkersFolder``): the supervisor on a normal
stop, the last worker to exit when the supervisor died first. Only workers killed outright too
(SIGKILL to every process) leave the folder behind, in the temporary directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType

from tensorbits.config.settings import Settings
from tensorbits.server.serving import StopSignals, draining_server, serve, uvicorn_kwargs

logger = logging.getLogger("tensorbits.workers")

STARTUP_FAILURE = 3  # uvicorn's exit code for a server that failed during start-up
POLL_S = 0.2
PR_SET_PDEATHSIG = 1  # linux/prctl.h
WATCH_EVERY_S = 1.0  # where there is no parent-death signal: how often a worker looks


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


class WorkersFolder:
    """The folder the workers share (their metrics, the model store), and who removes it.

    The supervisor and every worker hold a shared ``flock`` on it while they use it. Whoever
    leaves takes it exclusively if it can, which only the last holder can, and then removes it.
    While the supervisor lives it holds its lock, so a worker that exits (or is replaced) never
    removes the folder; once the supervisor is gone, however it went, the last worker out does.
    A lock, not a count of workers: the kernel drops a dead process's lock, so a worker killed
    outright cannot leave a count wrong, and a worker the supervisor started just before it died
    either joins in time (and is waited for) or finds the folder gone."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # The lock is on the directory itself: no lock file among the workers' figures.
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            # Blocks only while a last worker removes the folder: then this joins a removed one.
            fcntl.flock(self.fd, fcntl.LOCK_SH)
        except BaseException:
            os.close(self.fd)
            raise

    @classmethod
    def create(cls) -> WorkersFolder:
        return cls(Path(tempfile.mkdtemp(prefix="tensorbits-workers-")))

    @property
    def removed(self) -> bool:
        """Whether the folder was removed (by the last worker out) before this process joined."""
        return os.fstat(self.fd).st_nlink == 0

    def leave(self) -> None:
        """Drop this process's hold on the folder; remove it if no other process holds it."""
        try:
            # Unlock first, then try: of several processes leaving at once, the last to try
            # finds no other lock, whatever the order (two may both succeed: rmtree tolerates
            # a folder already gone).
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # the supervisor, or a worker still draining: it removes the folder
            shutil.rmtree(self.path, ignore_errors=True)
        finally:
            os.close(self.fd)


def follow_supervisor(supervisor: int) -> None:
    """SIGTERM to this worker when its supervisor, process ``supervisor``, dies, however it dies.

    Linux: the parent-death signal (``prctl(PR_SET_PDEATHSIG)``), sent by the kernel as the
    parent exits, even by SIGKILL; it costs nothing while the parent lives. It is tied to the
    parent *thread* that forked this process: the supervisor spawns from its main thread, which
    lives as long as the process (``Supervisor.run``). Elsewhere: a thread that looks at
    ``getppid`` once a second (an orphan is handed to another parent), a second late at worst
    for a drain that takes as long as its requests. Not both: one death, one SIGTERM. (A pipe
    the supervisor holds open would also tell, but would have to be handed through the spawn to
    every worker; the parent's pid already is.)"""
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
        # The supervisor may have died before the prctl: then no signal ever comes.
        if os.getppid() != supervisor:
            signal.raise_signal(signal.SIGTERM)
    else:

        def watch() -> None:
            while os.getppid() == supervisor:
                time.sleep(WATCH_EVERY_S)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, name="tensorbits-supervisor-watch", daemon=True).start()


def run_worker(index: int, port: int, folder: str, supervisor: int) -> None:
    """One worker process: its settings from the environment (the supervisor's, with the port it
    resolved), its share of the metrics in ``folder``, its own listening socket, the drain; and
    ``supervisor``, the supervisor's pid, followed: the worker drains when that process dies."""
    stop = StopSignals()  # first, then: from here on a SIGTERM is a drain, never sudden death
    follow_supervisor(supervisor)

    import uvicorn  # the worker's imports: after the spawn, not in the supervisor

    from tensorbits import observability
    from tensorbits.logs import configure_logging
    from tensorbits.runtime import Drain
    from tensorbits.server.app import create_app
    from tensorbits.server.assembly import StartFailure

    settings = Settings(port=port)
    configure_logging(settings.log_level, settings.log_json)
    try:
        shared = WorkersFolder(Path(folder))
    except FileNotFoundError:  # removed by the last worker out: the supervisor is gone
        logger.warning(
            "worker %d: the supervisor (pid %d) is gone: not starting", index, supervisor
        )
        return
    except OSError:
        logger.exception("worker %d could not open the workers' folder %s", index, folder)
        sys.exit(STARTUP_FAILURE)  # as for any failure before serving: every worker would fail
    try:
        if stop.received or shared.removed:  # not worth building the app: it would only drain
            logger.info("worker %d: stopped before it started serving", index)
            return
        try:
            observability.share_with_workers(Path(folder))
            drain = Drain()
            app = create_app(settings, drain=drain, runtime_by_process=True)
            config = uvicorn.Config(**uvicorn_kwargs(settings, drain, app))
            sock = port_socket(settings.host, port)
        except Exception:
            # Before serving: the next worker would fail the same way. The supervisor stops.
            logger.exception("worker %d could not start", index)
            sys.exit(STARTUP_FAILURE)
        server = draining_server(config, drain, settings.drain_delay)
        if not stop.hand_to(server):
            sock.close()
            logger.info("worker %d: stopped before it started serving", index)
            return
        try:
            serve(server, app, settings, drain, sockets=[sock])
        except StartFailure as failure:
            # Logged with the worker's number; the supervisor stops: every worker would fail.
            logger.error("worker %d could not start: %s", index, failure)
            sys.exit(STARTUP_FAILURE)
        finally:
            app.state.metrics.publish()  # the final counts, for the workers still serving
            logger.debug("worker %d (pid %d) stopped", index, os.getpid())
    finally:
        shared.leave()


class Supervisor:
    """Starts ``settings.workers`` workers on one port and keeps them running until told to stop."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.context = multiprocessing.get_context("spawn")
        self.workers: list[BaseProcess] = []
        self.stopping = False
        self.failed = False

    def run(self) -> int:
        # The main thread only: a spawn forks in the thread that starts the process, and a
        # worker's parent-death signal (follow_supervisor) fires when that thread ends. The main
        # thread ends with the process; another could end while the workers serve.
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("the workers' supervisor must run in the main thread")
        settings = self.settings
        holder = port_socket(settings.host, settings.port)  # never listens: takes no connection
        port = holder.getsockname()[1]
        folder = WorkersFolder.create()
        previous = {sig: signal.signal(sig, self._stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            logger.info(
                "starting %d worker processes on port %d", settings.workers, port,
                extra={"workers": settings.workers, "port": port, "folder": str(folder.path)},
            )  # fmt: skip
            self.workers = [self._start(i, port, folder.path) for i in range(settings.workers)]
            while not self.stopping:
                time.sleep(POLL_S)
                self._replace_the_dead(port, folder.path)
            self._stop_all()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            holder.close()
            # Removed now unless a worker still runs (an exception before _stop_all): then the
            # workers, told of this process's end, drain and the last one out removes it.
            folder.leave()
        return 1 if self.failed else 0

    def _start(self, index: int, port: int, folder: Path) -> BaseProcess:
        process = self.context.Process(
            target=run_worker,
            args=(index, port, str(folder), os.getpid()),
            name=f"tensorbits-worker-{index}",
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
        """SIGTERM to every worker (each turns not ready, keeps accepting for the drain delay,
        finishes what is in flight, exits), then wait for them: the delay, the graceful timeout
        and a margin, then SIGKILL."""
        for process in self.workers:
            if process.pid is not None and process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
        settings = self.settings
        deadline = time.monotonic() + settings.drain_delay + settings.timeout_graceful_shutdown + 10
        for process in self.workers:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                logger.error("worker pid %s did not stop in time: killed", process.pid)
                process.kill()
                process.join()
