"""A refusal sent while the client is still sending reaches the client (lingering close).

A server that answers before it has read a request's body (a 413 for a declared length, a 431
mid-head) and then closes its socket with bytes unread makes Linux send RST: the client, still
sending, gets a broken pipe or a reset instead of the answer. Here the client does what makes
that certain: it sends the head, waits until the answer has arrived (reading none of it), then
sends the rest, far more than its socket buffers hold, and only then reads. The server must
have kept reading and discarding: the client reads the whole answer, then an orderly EOF.

The discarding is bounded as nginx bounds its lingering close: in bytes by what a legal request
could be (``TENSORBITS_MAX_BODY_BYTES`` and ``TENSORBITS_MAX_HEAD_BYTES``: a client that sends on
and on is cut off), in idle time between reads, and in total time (both derived from the
server's timeouts: ``guarded_protocol.linger_bounds``). A declared body within the body limit is
read past instead, and the connection kept, under the same time bounds.

Clients that send a whole large body before reading (``http.client``, as ``requests`` and
``tritonclient.http`` do) read the 503 of a full admission and the 413 of a body past the limit,
not a reset."""

from __future__ import annotations

import contextlib
import http.client
import json
import select
import socket
import time
from collections.abc import Iterator

import numpy as np
import pytest
from support.framing import framed
from support.live import LiveServer, serve
from support.rawhttp import ask, assert_json_error, read_response, request
from support.v2 import NOT, binary_input, bit_not_request

pytestmark = pytest.mark.integration

MiB = 1 << 20
HEAD_LIMIT = 8192
BODY_LIMIT = 8 * MiB
SEND_BUFFER = 64 << 10  # the client's socket buffer: what it sends after the answer is far more
REST = 1 << 20  # sent after the answer: sixteen times what the client's socket buffer holds
REGISTER = "/v2/systemsharedmemory/region/r/register"  # its body limit is 4 KiB


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    env = {
        "TENSORBITS_SHARED_MEMORY": "true",
        "TENSORBITS_MAX_HEAD_BYTES": str(HEAD_LIMIT),
        "TENSORBITS_MAX_BODY_BYTES": str(BODY_LIMIT),
    }
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
    """Kept alive, a declared body within the body limit is read past, and the next request on
    the connection is served."""
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
    """Kept alive, the rest of a body past the body limit would all be read: the refusal closes
    instead, and the discarding is bounded in bytes (the body limit and the head's: far less
    than is sent), the answer there to read before. The client is cut off once the server has
    discarded the bound, not before."""
    endless = 8 * BODY_LIMIT
    with _connect(server) as sock:
        sock.sendall(_register_head(endless, None))
        reply = read_response(sock)
        assert_json_error(reply, 413, "body", "max_body_bytes")
        assert reply.headers["connection"] == "close"
        sent = _send_until_cut(sock, endless)
    assert BODY_LIMIT <= sent < endless  # all the server discards had been sent, not all of it
    assert server.get("/v2/health/live") == 200


def _send_until_cut(sock: socket.socket, size: int) -> int:
    """Bytes sent of ``size`` before the server cut the connection (``size``: never cut)."""
    sent = 0
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        while sent < size:
            sent += sock.send(b"x" * (1 << 16))
    return sent


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


# --- clients that send a whole large body before reading --------------------------------------

ADMISSION_BODY_LIMIT = 32 * MiB
Request = tuple[str, bytes, dict[str, str]]  # path, body, headers
XOR = "DML_OPERATOR_ELEMENT_WISE_BIT_XOR"


@pytest.fixture(scope="module")
def admission() -> Iterator[LiveServer]:
    """One inference in flight at a time (``held`` takes it), a 32 MiB body limit."""
    env = {
        "TENSORBITS_MAX_BODY_BYTES": str(ADMISSION_BODY_LIMIT),
        "TENSORBITS_MAX_INFLIGHT_BYTES": str(ADMISSION_BODY_LIMIT),
        "TENSORBITS_MAX_INFLIGHT_REQUESTS": "1",
    }
    with serve(env) as live:
        yield live


@contextlib.contextmanager
def held(server: LiveServer) -> Iterator[None]:
    """Admission full: a request admitted for its declared body, which never comes, holds the
    one slot until the block ends (its client goes away; the grant is released)."""
    data = np.zeros(16, dtype=np.uint8)
    body, headers = framed({"inputs": [binary_input("InputTensor", data)]}, data.tobytes())
    head = request("POST", f"/v2/models/{NOT}/infer", headers, body)[: -len(body)]
    with socket.create_connection((server.host, server.port), timeout=30) as holder:
        holder.sendall(head)
        deadline = time.monotonic() + 30
        while ask(server, bit_not_request(data)).status != 503:  # the holder admitted yet?
            assert time.monotonic() < deadline, "the holding request was never admitted"
            time.sleep(0.05)
        yield


def _xor_16m() -> Request:
    """A valid XOR of two 8 MiB inputs: 16 MiB of body, within the limit."""
    large = np.zeros(8 * MiB, dtype=np.uint8)
    header = {"inputs": [binary_input("ATensor", large), binary_input("BTensor", large)]}
    body, headers = framed(header, large.tobytes(), large.tobytes())
    return f"/v2/models/{XOR}/infer", body, headers


def _past_the_limit() -> Request:
    """33 MiB of body, 1 MiB past the limit: refused on its declared length."""
    return f"/v2/models/{NOT}/infer", b"\0" * (ADMISSION_BODY_LIMIT + MiB), {}


def _http_client_whole(server: LiveServer, made: Request) -> tuple[int, dict[str, str], bytes]:
    """POST with http.client (the whole body written before the answer is read), then a GET of
    liveness on the same client: it reuses the connection when the answer kept it."""
    path, body, headers = made
    connection = http.client.HTTPConnection(server.host, server.port, timeout=60)
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        answer = response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        connection.request("GET", "/v2/health/live")
        assert connection.getresponse().status == 200
        return answer
    finally:
        connection.close()


def _assert_503_retry_after(status: int, headers: dict[str, str], body: bytes) -> None:
    assert status == 503, (status, body[:300])
    assert int(headers["retry-after"]) >= 1
    assert "retry later" in json.loads(body)["error"]


def _assert_413_names_the_bound(status: int, headers: dict[str, str], body: bytes) -> None:
    assert status == 413, (status, body[:300])
    error = json.loads(body)
    assert (error["field"], error["rule"]) == ("body", "max_body_bytes"), error
    assert str(ADMISSION_BODY_LIMIT) in error["error"], error
    assert headers["connection"] == "close"


def test_http_client_sending_16_mib_whole_reads_the_503(admission: LiveServer) -> None:
    with held(admission):
        _assert_503_retry_after(*_http_client_whole(admission, _xor_16m()))


def test_http_client_sending_33_mib_whole_reads_the_413(admission: LiveServer) -> None:
    _assert_413_names_the_bound(*_http_client_whole(admission, _past_the_limit()))


def test_raw_client_sending_16_mib_whole_reads_the_503_and_keeps_the_connection(
    admission: LiveServer,
) -> None:
    path, body, headers = _xor_16m()
    address = (admission.host, admission.port)
    with held(admission), socket.create_connection(address, timeout=30) as sock:
        sock.sendall(request("POST", path, headers, body))
        reply = read_response(sock)
        _assert_503_retry_after(*reply)
        assert reply.headers.get("connection") != "close"
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\n\r\n")
        assert read_response(sock).status == 200


def test_raw_client_sending_33_mib_whole_reads_the_413(admission: LiveServer) -> None:
    path, body, headers = _past_the_limit()
    with socket.create_connection((admission.host, admission.port), timeout=30) as sock:
        sock.sendall(request("POST", path, headers, body))
        _assert_413_names_the_bound(*read_response(sock))
        _assert_closed_in_order(sock)


# --- the time bounds ---------------------------------------------------------------------------

# The linger's idle bound is nginx's 5 s, or the keep-alive timeout when shorter; its total bound
# nginx's 30 s, or the body read deadline when shorter. Here: 1 s idle, 8 s in all.
IDLE_S = 1
TOTAL_S = 8.0
TIMED_ENV = {
    "TENSORBITS_SHARED_MEMORY": "true",
    "TENSORBITS_MAX_BODY_BYTES": str(BODY_LIMIT),
    "TENSORBITS_TIMEOUT_KEEP_ALIVE": str(IDLE_S),
    "TENSORBITS_TIMEOUT_BODY_READ": str(TOTAL_S),
}
KEPT, CLOSED = None, "close"  # the refused request's Connection: kept alive (skipped), or not


@pytest.fixture(scope="module")
def timed() -> Iterator[LiveServer]:
    with serve(TIMED_ENV) as live:
        yield live


def _refused_mid_body(server: LiveServer, connection: str | None) -> socket.socket:
    """A register request declaring 1 MiB (its route's limit is 4 KiB): the 413 comes before a
    byte of the body, and 64 KiB of the body is sent after it. Kept alive (``KEPT``), the server
    skips the rest of the body; ``CLOSED``, it closes and lingers."""
    sock = _connect(server)
    sock.sendall(_register_head(REST, connection))
    _await_answer(sock)
    sock.sendall(b"x" * (64 << 10))
    reply = read_response(sock)
    assert_json_error(reply, 413, "body", "max_body_bytes")
    assert (reply.headers.get("connection") == "close") == (connection == CLOSED)
    return sock


def _closed_now(sock: socket.socket, connection: str | None) -> bool:
    """Whether the server has closed the connection: kept alive, its close is an EOF to read;
    lingering (its sending side shut already), a closed socket resets what is sent to it."""
    try:
        if connection is KEPT:
            with contextlib.suppress(TimeoutError):
                return sock.recv(1) == b""
            return False
        sock.send(b"x")  # to a closed socket: a reset comes back, and the next send fails
        time.sleep(0.05)
        sock.send(b"x")
    except (BrokenPipeError, ConnectionResetError):
        return True
    return False


@pytest.mark.parametrize("connection", [KEPT, CLOSED], ids=["kept", "lingering"])
def test_a_client_that_stops_mid_body_is_closed_once_idle(
    timed: LiveServer, connection: str | None
) -> None:
    with _refused_mid_body(timed, connection) as sock:
        started = time.monotonic()
        if connection is KEPT:
            sock.settimeout(TOTAL_S * 4)
        else:
            time.sleep(IDLE_S + 1)  # sending nothing, past the idle bound
        assert _closed_now(sock, connection)
        assert time.monotonic() - started < TOTAL_S / 2  # the idle bound ended it, not the total
    assert timed.get("/v2/health/live") == 200


@pytest.mark.parametrize("connection", [KEPT, CLOSED], ids=["kept", "lingering"])
def test_a_client_that_trickles_is_closed_at_the_total_bound(
    timed: LiveServer, connection: str | None
) -> None:
    """A byte every quarter second is never idle for the idle bound: the total bound ends it."""
    with _refused_mid_body(timed, connection) as sock:
        started = time.monotonic()
        sock.settimeout(0.25)
        while not _closed_now(sock, connection):
            assert time.monotonic() - started < TOTAL_S * 4, "never closed"
            if connection is KEPT:
                sock.send(b"x")
            time.sleep(0.2)
        assert time.monotonic() - started > TOTAL_S - 1  # not the idle bound's doing
    assert timed.get("/v2/health/live") == 200
