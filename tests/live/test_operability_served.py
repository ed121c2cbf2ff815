"""The live server's operability: the start-up log line, JSON access logs, graceful SIGTERM."""

from __future__ import annotations

import json
import signal
import socket
import tempfile
import time

import numpy as np
from support.live import serve
from support.rawhttp import read_response
from support.v2 import NOT, assert_bit_not, bit_not_request


def _log_lines(raw: bytes) -> list[dict[str, object]]:
    return [json.loads(line) for line in raw.decode().splitlines() if line.startswith("{")]


def test_start_up_logs_backend_and_access_lines_in_json() -> None:
    with tempfile.TemporaryFile() as log:
        with (
            serve({"TENSORBITS_LOG_LEVEL": "info"}, stderr=log) as server,
            socket.create_connection(("127.0.0.1", server.port)) as s,
        ):
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Request-ID: probe-7\r\n\r\n")
            assert b"x-request-id: probe-7" in s.recv(4096)
        log.seek(0)
        lines = _log_lines(log.read())
    chosen = [e for e in lines if e["logger"] == "tensorbits.backend"]
    assert chosen, lines
    assert "backend selected: numpy" in str(chosen[0]["message"])
    assert "numpy backend requested" in str(chosen[0]["message"])
    access = [e for e in lines if e.get("request_id") == "probe-7"]
    assert access, lines
    assert access[0]["status"] == 200
    assert access[0]["route"] == "/v2/health/live"


def test_sigterm_lets_an_in_flight_request_finish() -> None:
    data = np.arange(1 << 20, dtype=np.uint32)
    raw = bit_not_request(data)
    half = len(raw) - data.nbytes // 2  # the head and half of the tensor's bytes
    with serve() as server, socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(raw[:half])  # the request is now in flight, half uploaded
        time.sleep(0.3)
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert server.proc.poll() is None, "the server quit with a request in flight"
        sock.sendall(raw[half:])
        assert_bit_not(read_response(sock), data)
        assert server.proc.wait(timeout=30) == 0  # a clean SIGTERM exits 0


def test_a_slow_body_gets_408_and_others_are_served() -> None:
    with serve({"TENSORBITS_TIMEOUT_BODY_READ": "1"}) as server:
        with socket.create_connection(("127.0.0.1", server.port)) as slow:
            slow.sendall(
                f"POST /v2/models/{NOT}/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
                "Inference-Header-Content-Length: 900\r\n\r\n".encode()
            )
            started = time.monotonic()
            for _ in range(5):  # a trickle, well inside the 1 s deadline each time
                slow.sendall(b" ")
                assert server.get("/v2/health/live") == 200  # others are served meanwhile
                time.sleep(0.1)
            slow.settimeout(10)
            status, _, body = read_response(slow)
            assert status == 408
            assert json.loads(body)["rule"] == "body_read_timeout"
            assert time.monotonic() - started < 5
        assert server.get("/v2/health/ready") == 200


def _closed_within(sock: socket.socket, seconds: float, trickle: bytes = b"") -> float:
    """Seconds until the server closes ``sock`` (sending ``trickle`` a byte at a time meanwhile);
    fails if it stays open for ``seconds``."""
    started = time.monotonic()
    sock.settimeout(0.2)
    sent = 0
    while time.monotonic() - started < seconds:
        if sent < len(trickle):
            try:
                sock.sendall(trickle[sent : sent + 1])
            except OSError:
                return time.monotonic() - started
            sent += 1
        try:
            if sock.recv(4096) == b"":
                return time.monotonic() - started
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - started
    raise AssertionError(f"connection still open after {seconds} s")


def test_slow_request_heads_are_closed_and_others_are_served() -> None:
    head = f"POST /v2/models/{NOT}/infer HTTP/1.1\r\nHost: x\r\nX-Padding: {'p' * 200}\r\n".encode()
    with serve({"TENSORBITS_TIMEOUT_HEADER_READ": "1"}) as server:
        with (
            socket.create_connection(("127.0.0.1", server.port)) as idle,
            socket.create_connection(("127.0.0.1", server.port)) as trickler,
        ):
            assert server.get("/v2/health/live") == 200  # served while both are held open
            assert _closed_within(trickler, 5, trickle=head) < 3
            assert _closed_within(idle, 5) < 3
        assert server.get("/v2/health/ready") == 200
        # A normal request on a keep-alive connection is not cut short by the deadline.
        with socket.create_connection(("127.0.0.1", server.port)) as kept:
            for _ in range(3):
                kept.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
                assert read_response(kept)[0] == 200
                time.sleep(0.6)
