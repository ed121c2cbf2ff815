"""A rolling restart, for real: N replicas of ``tensorbits serve`` on loopback ports behind a real
haproxy (HTTP/1.1 and gRPC, HTTP/2 cleartext, to the replicas), replaced one at a time while
clients keep sending inference requests through haproxy on both protocols.

Each replica is replaced as an orchestrator does it: SIGTERM (the replica turns not ready and
keeps accepting for ``TENSORBITS_DRAIN_DELAY``), haproxy's health check (``GET
/v2/health/ready``, for both backends) takes it out of rotation, the replica closes its
listeners and finishes what it has in flight, exits; a new one starts on the same ports and
haproxy puts it back once its readiness answers 200. haproxy is told not to retry (``retries
0``): a request that reaches a closed port is a failure the clients see, not one hidden by a
retry. The figures: requests sent and failed per protocol, latency quantiles during the roll.

Used by tests/deploy/test_rolling_restart.py (in ``make test``) and bench/load.py rolling-restart
(more runs, other delays, the figures printed)."""

from __future__ import annotations

import contextlib
import csv
import http.client
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from support.live import TENSORBITS, free_port

NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
WAIT_S = 30.0  # the most any one step may take: a bound on a hang, not a measurement
CHECK_INTER_MS = 100  # haproxy's health-check period


def haproxy() -> str | None:
    """haproxy's path, or None where it is not installed."""
    return shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if os.access(p, os.X_OK)),
        None,
    )


@dataclass
class Replica:
    index: int
    http_port: int
    grpc_port: int
    proc: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [str(TENSORBITS), "serve", "--host", "127.0.0.1", "--port", str(self.http_port)],
            env={**env, "TENSORBITS_GRPC_PORT": str(self.grpc_port)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _config(replicas: list[Replica], http_port: int, grpc_port: int, stats_port: int) -> str:
    """haproxy's configuration: one frontend per protocol, each backend health-checked on the
    replica's HTTP readiness (the gRPC backend too: ``check port``, over HTTP/1.1)."""
    check = (
        "    option httpchk\n"
        "    http-check send meth GET uri /v2/health/ready\n"
        "    http-check expect status 200\n"
        # One failed check takes a replica out (readiness 503 is no flap: it is a drain); one
        # passed check puts it back.
        f"    default-server inter {CHECK_INTER_MS}ms fall 1 rise 1\n"
    )
    http_servers = "".join(
        f"    server r{r.index} 127.0.0.1:{r.http_port} check\n" for r in replicas
    )
    grpc_servers = "".join(
        f"    server r{r.index} 127.0.0.1:{r.grpc_port} proto h2 check port {r.http_port} "
        "check-proto h1\n"
        for r in replicas
    )
    return (
        "global\n"
        "    maxconn 2000\n"
        "defaults\n"
        "    mode http\n"
        "    timeout connect 5s\n"
        "    timeout client 60s\n"
        "    timeout server 60s\n"
        "    timeout check 2s\n"
        "    retries 0\n"
        "frontend http_in\n"
        f"    bind 127.0.0.1:{http_port}\n"
        "    default_backend http_replicas\n"
        "frontend grpc_in\n"
        f"    bind 127.0.0.1:{grpc_port} proto h2\n"
        "    default_backend grpc_replicas\n"
        "frontend stats\n"
        f"    bind 127.0.0.1:{stats_port}\n"
        "    stats enable\n"
        "    stats uri /stats\n"
        "backend http_replicas\n"
        "    balance roundrobin\n"
        f"{check}{http_servers}"
        "backend grpc_replicas\n"
        "    balance roundrobin\n"
        f"{check}{grpc_servers}"
    )


@dataclass
class Tally:
    """One protocol's clients: requests sent, failures (with their reasons), latencies."""

    sent: int = 0
    failed: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, seconds: float, failure: str | None) -> None:
        with self.lock:
            self.sent += 1
            self.latencies.append(seconds)
            if failure is not None:
                self.failed += 1
                self.reasons[failure] = self.reasons.get(failure, 0) + 1

    def quantile(self, q: float) -> float:
        with self.lock:
            return float(np.quantile(self.latencies, q)) if self.latencies else 0.0


@dataclass
class Figures:
    replicas: int
    drain_delay_s: float
    roll_s: float
    http: Tally
    grpc: Tally

    @property
    def sent(self) -> int:
        return self.http.sent + self.grpc.sent

    @property
    def failed(self) -> int:
        return self.http.failed + self.grpc.failed

    def summary(self) -> dict[str, Any]:
        return {
            "replicas": self.replicas,
            "drain_delay_s": self.drain_delay_s,
            "roll_s": round(self.roll_s, 2),
            "http_sent": self.http.sent,
            "http_failed": self.http.failed,
            "http_p50_ms": round(self.http.quantile(0.5) * 1000, 2),
            "http_p99_ms": round(self.http.quantile(0.99) * 1000, 2),
            "grpc_sent": self.grpc.sent,
            "grpc_failed": self.grpc.failed,
            "grpc_p50_ms": round(self.grpc.quantile(0.5) * 1000, 2),
            "grpc_p99_ms": round(self.grpc.quantile(0.99) * 1000, 2),
            "failures": {**self.http.reasons, **self.grpc.reasons},
        }


class Cluster:
    """The replicas and haproxy in front of them; ``roll`` replaces every replica once."""

    def __init__(self, replicas: int, drain_delay_s: float, workdir: Path) -> None:
        binary = haproxy()
        if binary is None:
            raise RuntimeError("haproxy is not installed")
        self.binary = binary
        self.drain_delay_s = drain_delay_s
        self.workdir = workdir
        self.replicas = [Replica(i, free_port(), free_port()) for i in range(replicas)]
        self.http_port, self.grpc_port, self.stats_port = free_port(), free_port(), free_port()
        self.env = {
            **os.environ,
            "TENSORBITS_BACKEND": "numpy",
            "TENSORBITS_LOG_LEVEL": "warning",
            "TENSORBITS_CPU_THREADS": "1",
            "TENSORBITS_DRAIN_DELAY": str(drain_delay_s),
            "TENSORBITS_TIMEOUT_GRACEFUL_SHUTDOWN": "10",
        }
        self.proxy: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Cluster:
        try:
            for replica in self.replicas:
                replica.start(self.env)
            config = self.workdir / "haproxy.cfg"
            config.write_text(
                _config(self.replicas, self.http_port, self.grpc_port, self.stats_port)
            )
            check = subprocess.run(
                [self.binary, "-c", "-q", "-f", str(config)], capture_output=True, text=True
            )
            if check.returncode != 0:
                raise RuntimeError(f"haproxy refused its configuration: {check.stderr}")
            self.proxy = subprocess.Popen(
                [self.binary, "-db", "-f", str(config)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self._until(lambda: all(self.states(r) == ("UP", "UP") for r in self.replicas))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        # Every replica told at once, then told again (which ends its drain delay): the
        # teardown waits for one drain, not one per replica in turn.
        for _ in range(2):
            for replica in self.replicas:
                if replica.proc is not None and replica.proc.poll() is None:
                    replica.proc.send_signal(signal.SIGTERM)
        for replica in self.replicas:
            replica.stop()
        if self.proxy is not None and self.proxy.poll() is None:
            self.proxy.terminate()
            self.proxy.wait(WAIT_S)

    def _until(self, check: Callable[[], bool], what: str = "haproxy's view") -> None:
        deadline = time.monotonic() + WAIT_S

        def holds() -> bool:
            try:
                return check()
            except OSError:  # haproxy's stats port not listening yet
                return False

        while not holds():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not come in {WAIT_S} s")
            if self.proxy is not None and self.proxy.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self.proxy.returncode}")
            time.sleep(0.02)

    def all_states(self) -> dict[tuple[str, str], str]:
        """haproxy's status of every server, ``(backend, server) -> UP/DOWN/...``."""
        url = f"http://127.0.0.1:{self.stats_port}/stats;csv"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode().lstrip("# ")
        return {
            (row["pxname"], row["svname"]): row["status"].split()[0]
            for row in csv.DictReader(io.StringIO(text))
            if row["svname"] not in ("FRONTEND", "BACKEND")
        }

    def states(self, replica: Replica) -> tuple[str, str]:
        states = self.all_states()
        name = f"r{replica.index}"
        return states[("http_replicas", name)], states[("grpc_replicas", name)]

    def replace(self, replica: Replica) -> None:
        """One replica replaced: out of haproxy's rotation, exited, a new one in."""
        assert replica.proc is not None
        replica.proc.send_signal(signal.SIGTERM)
        self._until(lambda: self.states(replica) == ("DOWN", "DOWN"), "the replica out")
        code = replica.proc.wait(WAIT_S)
        if code != 0:  # a clean SIGTERM exits 0
            raise RuntimeError(f"replica r{replica.index} exited with {code}")
        replica.start(self.env)
        self._until(lambda: self.states(replica) == ("UP", "UP"), "the new replica in")

    def roll(self, clients: int = 1) -> Figures:
        """Every replica replaced in turn while ``clients`` HTTP and ``clients`` gRPC clients
        send requests through haproxy, from before the first SIGTERM until the last replica is
        back."""
        http, grpc_tally = Tally(), Tally()
        stop = threading.Event()
        threads = [
            threading.Thread(target=_http_client, args=(self.http_port, http, stop, i))
            for i in range(clients)
        ] + [
            threading.Thread(target=_grpc_client, args=(self.grpc_port, grpc_tally, stop, i))
            for i in range(clients)
        ]
        for thread in threads:
            thread.start()
        started = time.monotonic()
        try:
            # Traffic on every replica first: the roll starts with connections in use.
            self._until(lambda: http.sent > 20 and grpc_tally.sent > 20, "the first answers")
            for replica in self.replicas:
                self.replace(replica)
        finally:
            stop.set()
            for thread in threads:
                thread.join(WAIT_S)
        return Figures(
            len(self.replicas),
            self.drain_delay_s,
            time.monotonic() - started,
            http,
            grpc_tally,
        )


def _http_client(port: int, tally: Tally, stop: threading.Event, seed: int) -> None:
    """Inference over one keep-alive connection to haproxy (a new one after a failure)."""
    rng = np.random.default_rng(seed)
    connection: http.client.HTTPConnection | None = None
    while not stop.is_set():
        data = rng.integers(0, 256, 64, dtype=np.uint8)
        tensor = {"name": "InputTensor", "shape": [64], "datatype": "UINT8"}
        body = json.dumps({"inputs": [{**tensor, "data": data.tolist()}]})
        began = time.perf_counter()
        failure: str | None = None
        try:
            if connection is None:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
            connection.request(
                "POST",
                f"/v2/models/{NOT}/infer",
                body,
                {"Content-Type": "application/json"},
            )
            response = connection.getresponse()
            answer = response.read()
            if response.status != 200:
                failure = f"http {response.status}"
            else:
                output = json.loads(answer)["outputs"][0]["data"]
                if output != (~data).tolist():
                    failure = "http wrong answer"
        except (OSError, http.client.HTTPException) as exc:
            failure = f"http {type(exc).__name__}"
        if failure is not None and connection is not None:
            connection.close()
            connection = None
        tally.add(time.perf_counter() - began, failure)
    if connection is not None:
        connection.close()


def _grpc_client(port: int, tally: Tally, stop: threading.Event, seed: int) -> None:
    """ModelInfer over one channel to haproxy (HTTP/2 cleartext), as tritonclient sends it."""
    import tritonclient.grpc as triton
    from tritonclient.utils import InferenceServerException

    rng = np.random.default_rng(1000 + seed)
    client = triton.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        while not stop.is_set():
            data = rng.integers(0, 256, 64, dtype=np.uint8)
            tensor = triton.InferInput("InputTensor", [64], "UINT8")
            tensor.set_data_from_numpy(data)
            began = time.perf_counter()
            failure: str | None = None
            try:
                result = client.infer(NOT, [tensor], client_timeout=WAIT_S)
                if not np.array_equal(result.as_numpy("OutputTensor"), ~data):
                    failure = "grpc wrong answer"
            except InferenceServerException as exc:
                failure = f"grpc {exc.status()}"
            tally.add(time.perf_counter() - began, failure)
    finally:
        client.close()


@contextlib.contextmanager
def cluster(replicas: int = 3, drain_delay_s: float = 2.0) -> Iterator[Cluster]:
    with (
        tempfile.TemporaryDirectory(prefix="tensorbits-roll-") as workdir,
        Cluster(replicas, drain_delay_s, Path(workdir)) as running,
    ):
        yield running


def main(argv: list[str] | None = None) -> int:
    """Print each run's figures as a JSON line."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--drain-delay", type=float, default=2.0)
    parser.add_argument("--clients", type=int, default=1, help="per protocol")
    args = parser.parse_args(argv)
    failed = 0
    with cluster(args.replicas, args.drain_delay) as running:
        for run in range(1, args.runs + 1):
            figures = running.roll(args.clients)
            print(json.dumps({"run": run, **figures.summary()}), flush=True)
            failed += figures.failed
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
