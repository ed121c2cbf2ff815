"""The HTTP layer against hostile clients, live (``tensorbits serve``, raw sockets).

What happens below the application (``service/src/tensorbits/api/guarded_protocol.py``): request heads
bounded in bytes, the parser's refusals answered as JSON, pipelined requests answered in order
before a refusal, and HEAD wherever GET is served (``api/head.py``). Each class of defect is
driven by many cases; each case checks the status, the JSON body naming the field and the
rule, that the server still answers, and that another client was served meanwhile."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support.framing import framed
from support.live import LiveServer, serve
from support.rawhttp import (
    assert_json_error,
    exchange,
    one_reply,
    read_replies,
    repeatedly,
    request,
)
from support.v2 import NOT, binary_input

HEAD_LIMIT = 8192
OPENAPI = json.loads((Path(__file__).parents[2] / "openapi" / "openapi.json").read_text())


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with serve({"TENSORBITS_MAX_HEAD_BYTES": str(HEAD_LIMIT)}) as live:
        yield live


def _still_serves(server: LiveServer) -> None:
    assert server.get("/v2/health/live") == 200
    assert server.proc.poll() is None


def _infer_request(values: np.ndarray[tuple[int], np.dtype[np.uint8]]) -> bytes:
    header = {
        "inputs": [binary_input("InputTensor", values)],
        "outputs": [{"name": "OutputTensor", "parameters": {"binary_data": True}}],
    }
    body, headers = framed(header, values.tobytes())
    return request("POST", f"/v2/models/{NOT}/infer", headers, body)


# --- 1. request heads past the limit ---------------------------------------------------------
# (what is made too long, its size, how it is sent): one header, many headers, the target.
HEAD_CASES = [
    pytest.param(kind, size, chunk, id=f"{kind}-{size}-chunk{chunk}")
    for kind in ("header", "headers", "url")
    for size, chunk in (
        (HEAD_LIMIT + 1, 1 << 16),
        (2 * HEAD_LIMIT, 1000),
        (1 << 20, 1 << 16),
        (16 << 20, 1 << 16),
    )
]


def _long_head(kind: str, size: int) -> bytes:
    if kind == "header":
        return request("GET", "/v2/health/live", {"X-Long": "a" * size})
    if kind == "headers":
        many = {f"X-{i:07d}": "b" * 40 for i in range(size // 50 + 1)}
        return request("GET", "/v2/health/live", many)
    return request("GET", "/v2/health/live?q=" + "c" * size)


@pytest.mark.parametrize(("kind", "size", "chunk"), HEAD_CASES)
def test_a_head_past_the_limit_is_refused_as_json(
    server: LiveServer, kind: str, size: int, chunk: int
) -> None:
    data = _long_head(kind, size)
    replies = repeatedly(server, lambda: one_reply(server, data, chunk=chunk), seconds=0.3)
    for reply in replies:
        if kind == "url":
            body = assert_json_error(reply, 414, "url", "max_head_bytes")
        else:
            body = assert_json_error(reply, 431, "headers", "max_head_bytes")
        assert body["code"] in ("uri_too_long", "request_header_fields_too_large")
        assert "TENSORBITS_MAX_HEAD_BYTES" in body["error"]
        assert reply.headers["connection"] == "close"
    _still_serves(server)


@pytest.mark.parametrize("kind", ["header", "headers", "url"])
def test_a_refused_head_costs_memory_by_the_limit_not_by_its_size(
    server: LiveServer, kind: str
) -> None:
    data = _long_head(kind, 16 << 20)
    baseline = server.reset_peak_rss()
    replies = repeatedly(server, lambda: one_reply(server, data), seconds=0.3)
    grown = server.peak_rss() - baseline
    assert {reply.status for reply in replies} <= {414, 431}
    # Read and dropped a chunk at a time, never accumulated: far less than the 16 MiB sent.
    assert grown < 4 << 20, grown


@pytest.mark.parametrize("kind", ["header", "headers", "url"])
def test_a_head_just_within_the_limit_is_served(server: LiveServer, kind: str) -> None:
    size = HEAD_LIMIT
    while len(data := _long_head(kind, size)) > HEAD_LIMIT - 64:
        size -= 32
    data = data.replace(b"Host: test", b"Host: test\r\nConnection: close")
    for reply in repeatedly(server, lambda: one_reply(server, data)):
        assert reply.status == 200


def test_a_head_trickled_past_the_limit_is_refused_once_it_passes(server: LiveServer) -> None:
    # Sent 100 bytes at a time: refused as soon as the limit is passed, not after the 1 MiB.
    data = request("GET", "/v2/health/live", {"X-Slow": "d" * (1 << 20)})
    for reply in repeatedly(server, lambda: one_reply(server, data[: 4 * HEAD_LIMIT], chunk=100)):
        assert_json_error(reply, 431, "headers", "max_head_bytes")


# --- 4. the parser's refusals ---------------------------------------------------------------
PARSER_CASES = {
    "garbage request line": (b"GARBAGE\r\n\r\n", "method"),
    "unknown method": (b"FETCH /v2 HTTP/1.1\r\nHost: x\r\n\r\n", "method"),
    "bad version": (b"GET /v2 HTTP/9.9\r\nHost: x\r\n\r\n", "version"),
    "no version": (b"GET /v2 XTTP/1.1\r\nHost: x\r\n\r\n", "version"),
    "space in target": (b"GET /a b HTTP/1.1\r\nHost: x\r\n\r\n", "version"),
    "control byte in target": (b"GET /\x01 HTTP/1.1\r\nHost: x\r\n\r\n", "url"),
    "bad header name": (b"GET /v2 HTTP/1.1\r\nBad Header: x\r\n\r\n", "headers"),
    "control byte in header value": (b"GET /v2 HTTP/1.1\r\nX: a\x01b\r\n\r\n", "headers"),
    "duplicate Content-Length": (
        b"POST /v2/repository/index HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        "Content-Length",
    ),
    "Content-Length not a number": (
        b"POST /v2/repository/index HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n",
        "Content-Length",
    ),
    "Content-Length with Transfer-Encoding": (
        b"POST /v2/repository/index HTTP/1.1\r\nContent-Length: 2\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        "Transfer-Encoding",
    ),
    "invalid chunk size": (
        b"POST /v2/repository/index HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n",
        "body",
    ),
    "chunk size past 64 bits": (
        b"POST /v2/repository/index HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"f" * 40
        + b"\r\n{}\r\n",
        "body",
    ),
}


@pytest.mark.parametrize("case", PARSER_CASES, ids=str)
def test_a_malformed_request_gets_a_json_400(server: LiveServer, case: str) -> None:
    data, field = PARSER_CASES[case]
    replies = repeatedly(server, lambda: one_reply(server, data), seconds=0.2)
    for reply in replies:
        body = assert_json_error(reply, 400, field, "http_syntax")
        assert body["code"] == "invalid_request"
        assert body["error"].startswith("malformed HTTP request: ")
        assert reply.headers["connection"] == "close"
    _still_serves(server)


# --- 5. answers in order ------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["unknown method", "bad header name", "invalid chunk size"])
@pytest.mark.parametrize("valid_first", [1, 3])
def test_valid_requests_are_answered_before_the_refusal_that_follows(
    server: LiveServer, case: str, valid_first: int
) -> None:
    values = np.arange(64, dtype=np.uint8)
    valid = _infer_request(values) + request("GET", "/v2/health/ready")
    data = valid * valid_first + PARSER_CASES[case][0]
    replies = read_replies(exchange(server, data))
    assert [r.status for r in replies] == [200, 200] * valid_first + [400], replies
    for reply in replies[: 2 * valid_first : 2]:
        header_length = int(reply.headers["inference-header-content-length"])
        assert reply.body[header_length:] == (~values).tobytes()
    assert_json_error(replies[-1], 400, PARSER_CASES[case][1], "http_syntax")
    _still_serves(server)


def test_a_refusal_inside_a_body_answers_for_that_request(server: LiveServer) -> None:
    # The second request's chunked body is malformed: the first gets its 200, the second the 400.
    data = request("GET", "/v2/health/live") + (
        b"POST /v2/repository/index HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\nzz\r\n"
    )
    replies = read_replies(exchange(server, data))
    assert [r.status for r in replies] == [200, 400], replies
    assert_json_error(replies[1], 400, "body", "http_syntax")


def test_a_head_past_the_limit_after_a_valid_request_is_refused_in_order(
    server: LiveServer,
) -> None:
    data = request("GET", "/v2/health/live") + _long_head("header", 4 * HEAD_LIMIT)
    replies = read_replies(exchange(server, data))
    assert [r.status for r in replies] == [200, 431], replies


# --- 6. HEAD wherever GET is served -------------------------------------------------------------
def _get_targets() -> list[str]:
    params = {"{model}": NOT, "{name}": NOT, "{version}": "1", "{region_name}": "r"}
    targets = ["/docs", "/redoc", "/openapi.json"]
    for path, operations in OPENAPI["paths"].items():
        if "get" in operations:
            for placeholder, value in params.items():
                path = path.replace(placeholder, value)
            targets.append(path)
    return targets


@pytest.mark.parametrize("target", _get_targets())
def test_head_answers_as_get_without_a_body(server: LiveServer, target: str) -> None:
    get, head, after = read_replies(
        exchange(
            server,
            request("GET", target)
            + request("HEAD", target)
            + request("GET", "/v2/health/live", {"Connection": "close"}),
        ),
        ["GET", "HEAD", "GET"],
    )
    # The shared-memory extension is off on this server: its routes answer 400 (saying so).
    assert get.status == (400 if "sharedmemory" in target else 200), get
    assert head.status == get.status
    assert head.body == b""
    assert head.headers.get("content-type") == get.headers.get("content-type")
    if target != "/metrics":  # a scrape's length changes with every request counted
        assert head.headers["content-length"] == str(len(get.body))
    assert after.status == 200  # nothing of a body came between the HEAD and the next answer


def test_head_on_a_post_only_route_is_405_like_get(server: LiveServer) -> None:
    (reply,) = read_replies(
        exchange(server, request("HEAD", "/v1/batch", {"Connection": "close"})), ["HEAD"]
    )
    assert reply.status == 405
    assert "POST" in reply.headers["allow"]


def test_curl_i_on_health_live(server: LiveServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"HEAD /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert data.endswith(b"\r\n\r\n")


# --- what the fuzzers found ---------------------------------------------------------------------
def test_a_refused_head_request_gets_no_content(server: LiveServer) -> None:
    data = _long_head("header", 2 * HEAD_LIMIT).replace(b"GET ", b"HEAD ", 1)
    raw = exchange(server, data)
    (reply,) = read_replies(raw, ["HEAD"])
    assert reply.status == 431
    assert raw.endswith(b"\r\n\r\n")  # a Content-Length, and nothing after the head
    assert int(reply.headers["content-length"]) > 0


@pytest.mark.parametrize("target", ["http://test", "http://test?x=1", "https://test:8000"])
def test_the_absolute_form_without_a_path_is_the_root(server: LiveServer, target: str) -> None:
    reply = one_reply(server, request("GET", target, {"Connection": "close"}))
    assert reply.status == 404  # "/" serves nothing: the app's JSON 404, not a parser error
    assert reply.json()["field"] == "path"
    assert (
        one_reply(
            server, request("GET", "http://test/v2/health/live", {"Connection": "close"})
        ).status
        == 200
    )


def test_a_websocket_upgrade_is_an_ordinary_request(server: LiveServer) -> None:
    headers = {
        "Connection": "Upgrade, close",
        "Upgrade": "websocket",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version": "13",
    }
    reply = one_reply(server, request("GET", "/v2/health/live", headers))
    assert reply.status == 200
