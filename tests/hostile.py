"""Tools for the live hostile-client tests: raw HTTP/1.1 over a socket, a bystander client that
keeps checking health while a hostile request is in flight, and the server's peak memory.

Imported as ``hostile`` (pytest puts ``tests/`` on ``sys.path``), beside ``livesupport``."""

from __future__ import annotations

import contextlib
import json
import socket
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from livesupport import LiveServer


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(self.body)
        return document


def read_replies(data: bytes, methods: Sequence[str] = ()) -> list[Reply]:
    """Every complete response in ``data`` (a connection's bytes, in order); ``methods``: those
    of the requests, where one was HEAD (its response has a Content-Length but no content)."""
    replies: list[Reply] = []
    while b"\r\n\r\n" in data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
        head_request = len(replies) < len(methods) and methods[len(replies)] == "HEAD"
        length = 0 if head_request else int(headers.get("content-length", "0"))
        replies.append(Reply(int(lines[0].split()[1]), headers, rest[:length]))
        data = rest[length:]
    return replies


def read_response(sock: socket.socket) -> Reply:
    """One response from a keep-alive connection: its head, then Content-Length bytes of body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        body += chunk
    return Reply(int(lines[0].split()[1]), headers, body)


def exchange(
    server: LiveServer, data: bytes, *, chunk: int = 1 << 16, timeout: float = 30
) -> bytes:
    """Send ``data`` (in chunks, from a thread) while reading what comes back until the server
    closes: a server that refuses a request mid-upload answers before the client has finished
    sending, so reading cannot wait for the sending to end."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:

        def send() -> None:
            with contextlib.suppress(OSError):  # the server may close before it all went out
                for start in range(0, len(data), chunk):
                    sock.sendall(data[start : start + chunk])

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        received = b""
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            while piece := sock.recv(1 << 16):
                received += piece
        sender.join(timeout)
    return received


def one_reply(server: LiveServer, data: bytes, **kwargs: Any) -> Reply:
    replies = read_replies(exchange(server, data, **kwargs))
    assert len(replies) == 1, replies
    return replies[0]


def request(
    method: str, target: str, headers: dict[str, str] | None = None, body: bytes = b""
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: test"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def assert_json_error(reply: Reply, status: int, field: str, rule: str) -> dict[str, Any]:
    """The reply is ``status`` with the JSON error body every 4xx carries."""
    assert reply.status == status, (reply.status, reply.body[:300])
    assert reply.headers["content-type"].startswith("application/json"), reply.headers
    body = reply.json()
    assert isinstance(body["error"], str), body
    assert body["error"], body
    assert body["field"] == field, body
    assert body["rule"] == rule, body
    return body


@dataclass
class Bystander:
    """Another client, checking ``/v2/health/live`` over its own keep-alive connection."""

    server: LiveServer
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        probe = request("GET", "/v2/health/live")
        try:
            with socket.create_connection(("127.0.0.1", self.server.port), timeout=10) as sock:
                while not self._stop.is_set():
                    began = time.perf_counter()
                    sock.sendall(probe)
                    data = b""
                    while not read_replies(data):
                        data += sock.recv(4096)
                    self.latencies.append(time.perf_counter() - began)
                    if read_replies(data)[0].status != 200:
                        self.failures.append(data.decode("latin-1")[:200])
                    time.sleep(0.005)
        except OSError as exc:
            self.failures.append(repr(exc))

    @property
    def median(self) -> float:
        return statistics.median(self.latencies)


@contextlib.contextmanager
def bystander(server: LiveServer) -> Iterator[Bystander]:
    """A ``Bystander`` checking health for as long as the block runs (warmed up first). After
    the block: it was served, without failures, in a median of under 100 ms."""
    watcher = Bystander(server)
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not watcher.latencies and time.monotonic() < deadline:
        time.sleep(0.01)
    watcher.latencies.clear()
    yield watcher
    watcher._stop.set()
    thread.join(10)
    assert not watcher.failures, watcher.failures
    assert watcher.latencies, "no health check was answered while the hostile request ran"
    assert watcher.median < 0.1, sorted(watcher.latencies)[-5:]


def repeatedly(server: LiveServer, action: Any, seconds: float = 0.5) -> list[Any]:
    """Run ``action()`` over and over for ``seconds`` (at least once) while a ``bystander``
    checks health: a hostile request answered in a millisecond still overlaps some checks."""
    results = []
    with bystander(server):
        deadline = time.monotonic() + seconds
        while not results or time.monotonic() < deadline:
            results.append(action())
    return results


def reset_peak_rss(server: LiveServer) -> int:
    """Reset the server's peak resident memory (Linux ``clear_refs``); its RSS now, in bytes."""
    Path(f"/proc/{server.proc.pid}/clear_refs").write_text("5")
    return _status_kib(server, "VmRSS") * 1024


def peak_rss(server: LiveServer) -> int:
    """The server's peak resident memory since the last ``reset_peak_rss``, in bytes."""
    return _status_kib(server, "VmHWM") * 1024


def _status_kib(server: LiveServer, key: str) -> int:
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise AssertionError(f"{key} not in /proc/{server.proc.pid}/status")
