"""A large body read straight into its admitted buffer, live (``tensorbits serve``, raw sockets).

Once the app has admitted a request and allocated its body's buffer, the server's protocol reads
the rest of the body into that buffer, around the parser (``api/guarded_protocol.py``,
``BODY_INTO``). These cases send the body in parts, with pauses, so the app is waiting on it when
the rest comes, and check that every rule of the body holds there as on the parser's path: the
answer byte for byte, the read deadline, a client gone mid-body, pipelining, a body longer than
its Content-Length, compressed bodies, and many clients declaring the largest body."""

from __future__ import annotations

import gzip
import socket
import threading
import time
import zlib
from collections.abc import Iterator

import numpy as np
import pytest
from support.framing import framed
from support.live import LiveServer, metric_samples, serve, settled_inflight_bytes
from support.rawhttp import assert_json_error, read_replies, read_response, request
from support.v2 import NOT, assert_bit_not, binary_input, bit_not_request

pytestmark = pytest.mark.integration

BODY_LIMIT = 32 << 20
READ_S = 2
ENV = {
    "TENSORBITS_MAX_BODY_BYTES": str(BODY_LIMIT),
    "TENSORBITS_MAX_INFLIGHT_BYTES": str(4 * BODY_LIMIT),
    "TENSORBITS_TIMEOUT_BODY_READ": str(READ_S),
}


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with serve(ENV) as live:
        yield live


def _data(mib: int, seed: int = 0) -> np.ndarray[tuple[int], np.dtype[np.uint8]]:
    return np.random.default_rng(seed).integers(0, 256, mib << 20, dtype=np.uint8)


def _connect(server: LiveServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.settimeout(30)
    return sock


def _send_in_parts(sock: socket.socket, raw: bytes, parts: int = 4, pause: float = 0.05) -> None:
    """``raw`` in ``parts`` pieces with a pause after each: the app is waiting on the body by
    the time the rest of it comes, so the rest is read into its buffer."""
    step = -(-len(raw) // parts)
    for start in range(0, len(raw), step):
        sock.sendall(raw[start : start + step])
        time.sleep(pause)


def _refusals(server: LiveServer, rule: str) -> float:
    return sum(
        value
        for name, value in metric_samples(server.base_url).items()
        if name.startswith("tensorbits_refusals_total{") and f'rule="{rule}"' in name
    )


def test_a_body_read_in_place_is_answered_byte_for_byte(server: LiveServer) -> None:
    data = _data(8)
    with _connect(server) as sock:
        for parts in (2, 5):  # twice on one kept connection: the parser is resynchronised
            _send_in_parts(sock, bit_not_request(data), parts)
            assert_bit_not(read_response(sock), data)
        sock.sendall(request("GET", "/v2/health/live"))
        assert read_response(sock).status == 200
    assert settled_inflight_bytes(server) == 0


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_a_compressed_body_read_in_place_is_inflated(server: LiveServer, coding: str) -> None:
    data = _data(4, seed=1)
    header = {
        "inputs": [binary_input("InputTensor", data)],
        "parameters": {"binary_data_output": True},
    }
    body, headers = framed(header, data.tobytes())
    packed = gzip.compress(body, 1) if coding == "gzip" else zlib.compress(body, 1)
    headers["Content-Encoding"] = coding
    with _connect(server) as sock:
        _send_in_parts(sock, request("POST", f"/v2/models/{NOT}/infer", headers, packed), 3)
        assert_bit_not(read_response(sock), data)


def test_a_large_body_trickled_past_the_deadline_gets_408_and_the_connection_goes_on(
    server: LiveServer,
) -> None:
    data = _data(8, seed=2)
    raw = bit_not_request(data)
    half = len(raw) // 2
    with _connect(server) as sock:
        sock.sendall(raw[:half])  # read in place from here on, then a trickle
        started = time.monotonic()
        sock.settimeout(0.2)
        reply = None
        sent = half
        while reply is None and time.monotonic() - started < 4 * READ_S:
            sock.sendall(raw[sent : sent + 1])
            sent += 1
            try:
                reply = read_response(sock)
            except TimeoutError:
                continue
        assert reply is not None, "no answer to a trickled body"
        body = assert_json_error(reply, 408, "body", "body_read_timeout")
        assert "TENSORBITS_TIMEOUT_BODY_READ" in body["error"]
        assert time.monotonic() - started < 2 * READ_S + 1
        # The rest of the declared body is skipped (within the body limit: the connection is
        # kept), then the next request on it is parsed from its first byte.
        sock.settimeout(30)
        sock.sendall(raw[sent:] + request("GET", "/v2/health/live"))
        assert read_response(sock).status == 200
    assert settled_inflight_bytes(server) == 0


def test_a_client_gone_mid_body_is_refused_truncated_and_its_admission_released(
    server: LiveServer,
) -> None:
    before = _refusals(server, "truncated")
    raw = bit_not_request(_data(16, seed=3))
    with _connect(server) as sock:
        sock.sendall(raw[: len(raw) // 4])
        time.sleep(0.2)  # admitted, its buffer allocated, the body read in place
        assert metric_samples(server.base_url)["tensorbits_inflight_bytes"] >= len(raw) // 2
        sock.sendall(raw[len(raw) // 4 : len(raw) // 2])
        time.sleep(0.1)
    assert settled_inflight_bytes(server) == 0
    deadline = time.monotonic() + 10
    while _refusals(server, "truncated") <= before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _refusals(server, "truncated") == before + 1
    assert server.get("/v2/health/ready") == 200


def test_two_pipelined_large_requests_are_answered_in_order(server: LiveServer) -> None:
    first, second = _data(6, seed=4), _data(5, seed=5)
    raw = bit_not_request(first) + bit_not_request(second) + request("GET", "/v2/health/live")
    with _connect(server) as sock:
        # Sent by a thread: the first answer comes while the second request is still sending.
        sender = threading.Thread(target=_send_in_parts, args=(sock, raw, 7, 0.02))
        sender.start()
        try:
            assert_bit_not(read_response(sock), first)
            assert_bit_not(read_response(sock), second)
            assert read_response(sock).status == 200
        finally:
            sender.join(30)
    assert settled_inflight_bytes(server) == 0


def test_a_body_longer_than_its_content_length_ends_at_its_length(server: LiveServer) -> None:
    data = _data(4, seed=6)
    raw = bit_not_request(data)
    with _connect(server) as sock:
        _send_in_parts(sock, raw[:-1000], 2)
        # The rest of the body and more: what passes its length is the next request, malformed.
        sock.sendall(raw[-1000:] + b"EXTRA BYTES\r\n\r\n")
        chunks = []
        while chunk := sock.recv(1 << 20):
            chunks.append(chunk)
    answer, refusal = read_replies(b"".join(chunks))
    assert_bit_not(answer, data)
    assert_json_error(refusal, 400, "method", "http_syntax")
    assert refusal.headers["connection"] == "close"


def test_many_clients_declaring_the_largest_body_cost_only_their_admission() -> None:
    # Admission holds two largest bodies: the others are refused before anything is allocated.
    env = {
        **ENV,
        "TENSORBITS_MAX_INFLIGHT_BYTES": str(2 * BODY_LIMIT),
        "TENSORBITS_TIMEOUT_BODY_READ": "60",  # the admitted ones wait for their bodies meanwhile
    }
    head = (
        f"POST /v2/models/{NOT}/infer HTTP/1.1\r\nHost: test\r\nContent-Length: {BODY_LIMIT}\r\n"
        "Inference-Header-Content-Length: 100\r\n\r\n"
    ).encode()
    with serve(env) as server:
        baseline = server.reset_peak_rss()
        socks = [_connect(server) for _ in range(24)]
        try:
            for sock in socks:
                sock.sendall(head)
            statuses: list[int | None] = []
            for sock in socks:
                sock.settimeout(2)  # an admitted one waits for its body: no answer
                try:
                    statuses.append(read_response(sock).status)
                except (TimeoutError, ConnectionError):
                    statuses.append(None)
            assert statuses.count(None) == 2, statuses
            assert statuses.count(503) == len(socks) - 2, statuses
            held = metric_samples(server.base_url)["tensorbits_inflight_bytes"]
            assert held == 2 * BODY_LIMIT
            grown = server.peak_rss() - baseline
            assert grown < held + (8 << 20), grown  # nothing beyond what admission holds
        finally:
            for sock in socks:
                sock.close()
        assert settled_inflight_bytes(server) == 0
