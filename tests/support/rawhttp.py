"""HTTP/1.1 by hand over a socket, for the live tests: requests written byte by byte, responses
read from a connection (one at a time on a keep-alive connection, or all of a connection's), and
a bystander client that keeps checking health while a hostile request is in flight."""

from __future__ import annotations

import contextlib
import json
import socket
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from support.live import LiveServer


class Reply(NamedTuple):
    """A response: its status, its headers (names in lower case) and its body. A tuple, so
    ``status, headers, body = read_response(sock)`` reads as well."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(self.body)
        return document


def _head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
    return int(lines[0].split()[1]), headers


def read_replies(data: bytes, methods: Sequence[str] = ()) -> list[Reply]:
    """Every complete response in ``data`` (a connection's bytes, in order); ``methods``: those
    of the requests, where one was HEAD (its response has a Content-Length but no content)."""
    replies: list[Reply] = []
    while b"\r\n\r\n" in data:
        head, _, rest = data.partition(b"\r\n\r\n")
        status, headers = _head(head)
        head_request = len(replies) < len(methods) and methods[len(replies)] == "HEAD"
        length = 0 if head_request else int(headers.get("content-length", "0"))
        replies.append(Reply(status, headers, rest[:length]))
        data = rest[length:]
    return replies


def read_response(sock: socket.socket) -> Reply:
    """One response from a keep-alive connection: its head, then Content-Length bytes of body
    (none without one), and not a byte more. ConnectionError if the server closes first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response head: {data[:200]!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status, headers = _head(head)
    length = int(headers.get("content-length", "0"))
    body = bytearray(rest)
    while len(body) < length:
        chunk = sock.recv(min(1 << 20, length - len(body)))
        if not chunk:
            raise ConnectionError(f"closed {length - len(body)} bytes before the body's end")
        body += chunk
    return Reply(status, headers, bytes(body))


def ask(
    server: LiveServer, data: bytes, *, timeout: float = 10, close_write: bool = False
) -> Reply:
    """Send ``data`` on a new connection and read one response (``close_write``: shut the
    sending side once it is sent, as a client that is gone)."""
    with socket.create_connection((server.host, server.port), timeout=timeout) as sock:
        sock.sendall(data)
        if close_write:
            sock.shutdown(socket.SHUT_WR)
        return read_response(sock)


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


class Prober(Protocol):
    """A client probing the server over and over in ``run``, timing each answer."""

    latencies: list[float]

    def run(self) -> None: ...


def start_warmed_up(prober: Prober) -> threading.Thread:
    """``prober.run`` on a thread of its own, once its first answer came (or 10 s went by). The
    warm-up's timings (connecting, the first answer) are dropped: only the answers given while
    the hostile request runs are to be judged."""
    thread = threading.Thread(target=prober.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not prober.latencies and time.monotonic() < deadline:
        time.sleep(0.01)
    prober.latencies.clear()
    return thread


@contextlib.contextmanager
def bystander(server: LiveServer) -> Iterator[Bystander]:
    """A ``Bystander`` checking health for as long as the block runs (warmed up first). After
    the block: it was served, without failures, in a median of under 100 ms."""
    watcher = Bystander(server)
    thread = start_warmed_up(watcher)
    yield watcher
    watcher._stop.set()
    thread.join(10)
    assert not watcher.failures, watcher.failures
    assert watcher.latencies, "no health check was answered while the hostile request ran"
    assert watcher.median < 0.1, sorted(watcher.latencies)[-5:]


def repeatedly(server: LiveServer, action: Any, seconds: float = 0.5) -> list[Any]:
    """Run ``action()`` over and over for ``seconds`` (at least once) while a ``bystander``
    checks health: a hostile request answered in a millisecond still overlaps some checks."""
    results: list[Any] = []
    with bystander(server):
        deadline = time.monotonic() + seconds
        while not results or time.monotonic() < deadline:
            results.append(action())
    return results
