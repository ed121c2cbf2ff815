"""A refusal sent while the client is still sending reaches the client (lingering close).

A server that answers before it has read a request's body (a 413 for a declared length, a 431
mid-head) and then closes its socket with bytes unread makes Linux send RST: the client, still
sending, gets a broken pipe or a reset instead of the answer. Here the client does what makes
that certain: it sends the head, waits until the answer has arrived (reading none of it), then
sends the rest, far more than its socket buffers hold, and only then reads. The server must
have kept reading and discarding: the client reads the whole answer, then an orderly EOF. And
the discarding is bounded: a client that sends on and on is cut off (``LINGER_MAX_BYTES``). A
body short of that bound is read past instead, and the connection kept."""

from __future__ import annotations

import select
import socket
from collections.abc import Iterator

import pytest
from support.live import LiveServer, serve
from support.rawhttp import assert_json_error, read_response

from tensorbits.guarded_protocol import LINGER_MAX_BYTES

pytestmark = pytest.mark.integration

HEAD_LIMIT = 8192
SEND_BUFFER = 64 << 10  # the client's socket buffer: what it sends after the answer is far more
REST = 1 << 20  # sent after the answer: sixteen times what the client's socket buffer holds
REGISTER = "/v2/systemsharedmemory/region/r/register"  # its body limit is 4 KiB


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    env = {"TENSORBITS_SHARED_MEMORY": "true", "TENSORBITS_MAX_HEAD_BYTES": str(HEAD_LIMIT)}
    with serve(env) as live:
        yield live


def _connect(server: LiveServer) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
    return sock


def _await_answer(sock: socket.socket) -> None:
    """Wait until the server's answer is in the socket, reading none of it."""
    readable, _, _ = select.select([sock], [], [], 30)
    assert readable, "no answer before the rest was sent"


def _register_head(length: int, connection: str | None) -> bytes:
    lines = [f"POST {REGISTER} HTTP/1.1", "Host: test", "Content-Type: application/json"]
    if connection is not None:
        lines.append(f"Connection: {connection}")
    lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _assert_closed_in_order(sock: socket.socket) -> None:
    """After the answer: EOF, not a reset (a reset would have raised in read_response already,
    or here)."""
    assert sock.recv(1 << 16) == b""


def test_a_413_before_the_body_reaches_a_client_still_sending(server: LiveServer) -> None:
    with _connect(server) as sock:
        sock.sendall(_register_head(REST, "close"))
        _await_answer(sock)  # refused on the declared length, before a byte of the body
        sock.sendall(b"x" * REST)
        reply = read_response(sock)
        assert_json_error(reply, 413, "body", "max_body_bytes")
        assert reply.headers["connection"] == "close"
        _assert_closed_in_order(sock)
    assert server.get("/v2/health/live") == 200


def test_a_413_before_a_small_body_keeps_the_connection(server: LiveServer) -> None:
    """Kept alive, a declared rest of at most ``LINGER_MAX_BYTES`` is read past, and the next
    request on the connection is served."""
    with _connect(server) as sock:
        sock.sendall(_register_head(REST, None))
        _await_answer(sock)
        sock.sendall(b"x" * REST)
        reply = read_response(sock)
        assert_json_error(reply, 413, "body", "max_body_bytes")
        assert reply.headers.get("connection") != "close"
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\n\r\n")
        assert read_response(sock).status == 200


def test_a_413_before_a_large_body_closes_and_cuts_the_client_off(server: LiveServer) -> None:
    """Kept alive, the rest of a longer body would all be read: the refusal closes instead, and
    the discarding is bounded in bytes (far more than ``LINGER_MAX_BYTES`` and the socket
    buffers on both sides is never all taken), the answer there to read before."""
    endless = 16 * LINGER_MAX_BYTES
    with _connect(server) as sock:
        sock.sendall(_register_head(endless, None))
        reply = read_response(sock)
        assert_json_error(reply, 413, "body", "max_body_bytes")
        assert reply.headers["connection"] == "close"
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            sock.sendall(b"x" * endless)
    assert server.get("/v2/health/live") == 200


def test_a_431_mid_head_reaches_a_client_still_sending(server: LiveServer) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\nX-Long: " + b"a" * HEAD_LIMIT)
        _await_answer(sock)  # refused at the HTTP layer once the head passed its limit
        sock.sendall(b"a" * REST)  # the rest of the same header
        reply = read_response(sock)
        assert_json_error(reply, 431, "headers", "max_head_bytes")
        assert reply.headers["connection"] == "close"
        _assert_closed_in_order(sock)
    assert server.get("/v2/health/live") == 200
