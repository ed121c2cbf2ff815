"""Hypothesis fuzz of the request head against the real ``tensorbits serve`` (uvicorn, uvloop,
httptools, ``GuardedHttpProtocol``), over a raw socket.

Each example sends one request, or a pipelined pair, on a fresh connection: request lines and
headers built valid and then sized around the head limit or broken in one known way (an invalid
method, version, target or header byte; duplicate or conflicting Content-Length and
Transfer-Encoding; a bad chunk), or made of odd bytes whose fate is not predicted. The last
request says ``Connection: close``, so the server closes once it has answered.

Properties, of every example: the bytes that come back are well-formed HTTP/1.1 responses, at
most one per request; none is a 5xx; a 4xx is JSON with a string ``error`` and ``code``; one the
HTTP layer writes itself (no ``x-request-id``: the application never saw the request) also names
its ``field`` and ``rule``, says ``Connection: close`` and is the last; the server still answers
``/v2/health/live`` afterwards. And per request, what was predicted: a valid request is answered
by the application (its response before any refusal of the request after it); a head whose
target and headers count past the limit is refused with 414 (the target alone is past it) or
431, never forwarded; a request broken in a known way is refused with 400 naming that part.

The server runs with ``TENSORBITS_MAX_HEAD_BYTES=4096`` and one-second head, body and keep-alive
timeouts, so a request the predictions got wrong ends in seconds, not minutes.
``TENSORBITS_FUZZ_EXAMPLES`` sets the number of examples (default 200).
"""

from __future__ import annotations

import json
import re
import socket
import string
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import given, note
from hypothesis import strategies as st
from support.live import LiveServer, serve
from support.reliability import FUZZ

pytestmark = pytest.mark.integration

LIMIT = 4096
READ_TIMEOUT_S = 10.0
ANSWER, REFUSE, ANSWER_OR_431, ANY = "answer", "refuse", "answer or 431", "any"

_STATUS_LINE = re.compile(rb"HTTP/1\.1 ([1-5][0-9][0-9]) [\x20-\x7e]*\r\n")
_HEADER_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+): ([\t\x20-\x7e\x80-\xff]*)\r\n")
TCHAR = string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"
VCHAR = "".join(map(chr, range(0x21, 0x7F))) + "\xe9\xff"  # visible, and obs-text


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    env = {
        "TENSORBITS_MAX_HEAD_BYTES": str(LIMIT),
        "TENSORBITS_TIMEOUT_HEADER_READ": "1",
        "TENSORBITS_TIMEOUT_BODY_READ": "1",
        "TENSORBITS_TIMEOUT_KEEP_ALIVE": "1",
    }
    with serve(env, stderr=subprocess.DEVNULL) as live:
        yield live


# --- requests -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    method: bytes
    target: bytes
    version: bytes  # empty: an HTTP/0.9-style request line
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    expect: str = ANSWER
    status: int = 0  # a predicted refusal's status
    fields: frozenset[str] = frozenset()  # and the fields it may name

    def __repr__(self) -> str:
        def short(part: bytes) -> str:
            return repr(part) if len(part) <= 80 else f"{part[:60]!r}... ({len(part)} bytes)"

        headers = ", ".join(f"{short(n)}: {short(v)}" for n, v in self.headers)
        return (
            f"Request({short(self.method)} {short(self.target)} {short(self.version)} "
            f"[{headers}] body={short(self.body)} expect={self.expect!r} {self.status or ''})"
        )

    def encode(self) -> bytes:
        line = self.method + b" " + self.target + (b" " + self.version if self.version else b"")
        head = b"".join(n + b": " + v + b"\r\n" for n, v in self.headers)
        return line + b"\r\n" + head + b"\r\n" + self.body

    @property
    def counted(self) -> int:
        """The head as the server counts it: the target, and each header as name + value + 4."""
        return len(self.target) + sum(len(n) + len(v) + 4 for n, v in self.headers)

    @property
    def head_size(self) -> int:
        return len(self.encode()) - len(self.body)


VALID_METHODS = [b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH"]
VALID_TARGETS = [
    b"/v2/health/live",
    b"/v2/health/ready",
    b"/v2",
    b"/v2/models/onnx.BitwiseNot-18",
    b"/v2/models/onnx.BitwiseNot-18/ready",
    b"/v2/models/onnx.BitwiseNot-18/infer",
    b"/v1/operators",
    b"/v1/batch",
    b"/metrics",
    b"/nope",
    b"*",
    b"/v2/health/live#fragment",
    b"http://example/v2/health/live?x=1",
    b"/%7e/..%2f..%2f/%00",
]
HEADER_NAMES = [
    b"Host",
    b"Accept",
    b"User-Agent",
    b"X-Request-Id",
    b"X-Forwarded-For",
    b"X-Forwarded-Proto",
    b"Authorization",
    b"Content-Type",
    b"Content-Encoding",
    b"Cookie",
    b"Expect",
]

header_names = st.one_of(
    st.sampled_from(HEADER_NAMES),
    st.text(TCHAR, min_size=1, max_size=16).map(lambda s: b"X-" + s.encode()),
)
# Values as sent; leading and trailing blanks are trimmed so the server counts what is sent.
header_values = st.one_of(
    st.sampled_from([b"100-continue", b"gzip", b"application/json", b"10.0.0.1, ::1", b"https"]),
    st.text(VCHAR + " \t", max_size=40).map(lambda s: s.encode("latin-1").strip(b" \t")),
)
targets = st.one_of(
    st.sampled_from(VALID_TARGETS),
    st.text(string.ascii_letters + string.digits + "/-._~%?=&", max_size=40).map(
        lambda s: b"/" + s.encode()
    ),
)


@st.composite
def framed_bodies(draw: st.DrawFn) -> tuple[tuple[tuple[bytes, bytes], ...], bytes]:
    """Framing headers and the body they frame, well-formed."""
    kind = draw(st.sampled_from(["none", "length", "chunked"]))
    if kind == "none":
        return (), b""
    data = draw(st.binary(max_size=64))
    if kind == "length":
        value = b"%d" % len(data)
        if draw(st.booleans()):
            value = b"  " + value + b"  "  # blanks around it are allowed (and trimmed)
        return ((b"Content-Length", value.strip()),), data
    coding = draw(st.sampled_from([b"chunked", b"Chunked", b"gzip, chunked"]))
    pieces = []
    rest = data
    while rest:
        size = draw(st.integers(1, len(rest)))
        extension = draw(st.sampled_from([b"", b";a=b", b";x"]))
        pieces.append(b"%x%s\r\n%s\r\n" % (size, extension, rest[:size]))
        rest = rest[size:]
    trailer = draw(st.sampled_from([b"", b"X-Trailer: t\r\n"]))
    return ((b"Transfer-Encoding", coding),), b"".join(pieces) + b"0\r\n" + trailer + b"\r\n"


@st.composite
def valid_requests(draw: st.DrawFn) -> Request:
    framing, body = draw(framed_bodies())
    headers = draw(st.lists(st.tuples(header_names, header_values), max_size=6))
    at = draw(st.integers(0, len(headers)))
    headers[at:at] = framing
    return Request(
        draw(st.sampled_from(VALID_METHODS)), draw(targets), b"HTTP/1.1", tuple(headers), body
    )


def _with_header(request: Request, name: bytes, value: bytes) -> Request:
    return replace(request, headers=(*request.headers, (name, value)))


# Broken in one known way: the field the 400 names, and the ways.
BROKEN_METHODS = [b"FOO", b"get", b"G\x00T", b"BREW", b"GETT", b""]
BROKEN_VERSIONS = [b"HTTP/1.2", b"HTTP/9.9", b"http/1.1", b"HTTP/1.1x", b"HTTP/"]
BROKEN_TARGETS = [b"/a\x00b", b"/a\x7fb", b"/\xff", b"/a\x01", b"/a\tb", b""]
BROKEN_NAMES = [b"x y", b"x\x00", b"", b"x\x7f", b"(x)", b"x\xe9", b"x\t"]
BROKEN_VALUES = [b"a\x00b", b"a\x7f", b"a\rb", b"a\x01", b"a\nb: c", b"a\r\n folded"]
CL, TE = b"Content-Length", b"Transfer-Encoding"
BROKEN_FRAMING: list[tuple[tuple[tuple[bytes, bytes], ...], bytes, frozenset[str]]] = [
    (((CL, b"5"), (CL, b"5")), b"hello", frozenset({"Content-Length"})),
    (((CL, b"1"), (CL, b"2")), b"ab", frozenset({"Content-Length"})),
    # Which of the two a conflict names is the server's choice.
    (((CL, b"5"), (TE, b"chunked")), b"0\r\n\r\n", frozenset({"Content-Length", TE.decode()})),
    (((TE, b"chunked"), (CL, b"5")), b"0\r\n\r\n", frozenset({"Content-Length", TE.decode()})),
    *(
        (((CL, value),), b"hello", frozenset({"Content-Length"}))
        for value in (b"+5", b"0x10", b"5,5", b"", b"-1", b"1 2", b"9" * 30)
    ),
    *(
        (((TE, value),), b"0\r\n\r\n", frozenset({"Transfer-Encoding"}))
        for value in (b"chunked, gzip", b"identity", b"gzip", b"chunked, chunked")
    ),
    (((TE, b"chunked"), (TE, b"chunked")), b"0\r\n\r\n", frozenset({"Transfer-Encoding"})),
    *(
        (((TE, b"chunked"),), body, frozenset({"body"}))
        for body in (b"zz\r\n\r\n", b"f" * 20 + b"\r\n", b"5;\x00\r\nhello\r\n", b"2\r\nabc\r\n")
    ),
]


@st.composite
def broken_requests(draw: st.DrawFn) -> Request:
    base = draw(valid_requests())
    way = draw(st.sampled_from(["method", "version", "url", "name", "value", "framing"]))
    if way == "method":
        broken = replace(base, method=draw(st.sampled_from(BROKEN_METHODS)))
    elif way == "version":
        broken = replace(base, version=draw(st.sampled_from(BROKEN_VERSIONS)))
    elif way == "url":
        broken = replace(base, target=draw(st.sampled_from(BROKEN_TARGETS)))
    elif way == "name":
        broken = _with_header(base, draw(st.sampled_from(BROKEN_NAMES)), b"v")
        way = "headers"
    elif way == "value":
        broken = _with_header(base, b"X-Broken", draw(st.sampled_from(BROKEN_VALUES)))
        way = "headers"
    else:
        framing, body, fields = draw(st.sampled_from(BROKEN_FRAMING))
        plain = tuple(h for h in base.headers if h[0] not in (CL, TE))
        broken = replace(base, method=b"POST", headers=plain + framing, body=body)
        return replace(broken, expect=REFUSE, status=400, fields=fields)
    return replace(broken, expect=REFUSE, status=400, fields=frozenset({way}))


# Odd bytes in any part of the head, whatever the server makes of them (no CR or LF: a line
# break inside a part would make a new line whose fate is a guess too far).
odd_bytes = st.binary(max_size=24).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))


@st.composite
def odd_requests(draw: st.DrawFn) -> Request:
    base = draw(valid_requests())
    part = draw(st.sampled_from(["method", "target", "version", "name", "value", "line"]))
    if part == "method":
        request = replace(
            base,
            method=draw(
                odd_bytes | st.sampled_from([b"CONNECT", b"PRI", b"PROPFIND", b"M-SEARCH"])
            ),
        )
    elif part == "target":
        request = replace(base, target=draw(odd_bytes))
    elif part == "version":
        request = replace(base, version=draw(odd_bytes | st.sampled_from([b"HTTP/11", b""])))
    elif part == "name":
        request = _with_header(base, draw(odd_bytes), draw(header_values))
    elif part == "value":
        request = _with_header(base, b"X-Odd", draw(odd_bytes))
    else:
        request = replace(base, method=b"CONNECT", target=draw(odd_bytes | st.just(b"h:443")))
    return replace(request, expect=ANY)


def finish(requests: list[Request], last_version: bytes) -> list[Request]:
    """The last request closes the connection (and may be HTTP/1.0)."""
    last = requests[-1]
    if last.expect == ANSWER:
        last = replace(last, version=last_version)
    return [*requests[:-1], _with_header(last, b"Connection", b"close")]


def sized(request: Request, mode: str, delta: int) -> Request:
    """``request`` grown so its counted head (or, in mode "target", its target) is LIMIT + delta
    bytes, and what that predicts."""
    if mode == "target":
        base = b"/v2/health/live?pad="
        request = replace(request, target=base + b"p" * max(0, LIMIT + delta - len(base)))
    else:
        pad = LIMIT + delta - request.counted - len(b"X-Pad") - 4
        if pad >= 0:
            request = _with_header(request, b"X-Pad", b"v" * pad)
    if len(request.target) > LIMIT:
        return replace(request, expect=REFUSE, status=414, fields=frozenset({"url"}))
    if request.counted > LIMIT:
        return replace(request, expect=REFUSE, status=431, fields=frozenset({"headers"}))
    if request.head_size > LIMIT:  # counted within, the bytes past it: either is right
        return replace(request, expect=ANSWER_OR_431)
    return request


@st.composite
def connections(draw: st.DrawFn) -> list[Request]:
    """One request, or a pipelined pair whose first is valid or broken in a known way (so its
    end, and where the second begins, is known)."""
    pair = draw(st.booleans())
    first_kinds = [valid_requests(), broken_requests()]
    kinds = [*first_kinds, odd_requests()]
    requests = [draw(st.one_of(first_kinds if pair else kinds))]
    if pair:
        requests.append(draw(st.one_of(kinds)))
    requests = finish(requests, draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.0"])))
    if draw(st.integers(0, 2)) == 0:  # a third of the examples: a head sized around the limit
        index = draw(st.integers(0, len(requests) - 1))
        if requests[index].expect == ANSWER:
            delta = draw(st.integers(-40, 40) | st.sampled_from([0, 1, LIMIT]))
            mode = draw(st.sampled_from(["headers", "target"]))
            requests[index] = sized(requests[index], mode, delta)
    return requests


# --- responses ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[bytes, bytes]
    body: bytes

    @property
    def from_app(self) -> bool:
        """The application's responses carry a request id; the HTTP layer's refusals do not."""
        return b"x-request-id" in self.headers


def read_responses(data: bytes, requests: list[Request]) -> list[Response]:
    """The final responses in ``data``, which must be whole, well-formed HTTP/1.1 responses and
    nothing else; 100 Continue is skipped. The i-th answers the i-th request."""
    responses: list[Response] = []
    pos = 0
    while pos < len(data):
        status_line = _STATUS_LINE.match(data, pos)
        assert status_line, f"no status line at byte {pos}: {data[pos : pos + 120]!r}"
        pos = status_line.end()
        headers: dict[bytes, bytes] = {}
        while not data.startswith(b"\r\n", pos):
            line = _HEADER_LINE.match(data, pos)
            assert line, f"malformed header line: {data[pos : pos + 120]!r}"
            name = line[1].lower()
            assert name not in headers, f"header {name!r} twice"
            headers[name] = line[2]
            pos = line.end()
        pos += 2
        status = int(status_line[1])
        if status == 100:
            assert not headers, headers
            continue
        assert len(responses) < len(requests), f"more responses than requests: {data!r}"
        # A response to HEAD has no content: the app's, and the refusal of a head too large.
        head_only = requests[len(responses)].method == b"HEAD" and (
            b"x-request-id" in headers or status in (414, 431)
        )
        if status in (204, 304) or head_only:
            length = 0
        else:
            assert b"transfer-encoding" not in headers, headers
            assert headers.get(b"content-length", b"").isdigit(), headers
            length = int(headers[b"content-length"])
        assert pos + length <= len(data), f"a body cut short: {data[pos:]!r}"
        responses.append(Response(status, headers, data[pos : pos + length]))
        pos += length
    return responses


def exchange(server: LiveServer, data: bytes) -> bytes:
    """Send ``data``, then read until the server closes (it must, within READ_TIMEOUT_S)."""
    received = bytearray()
    with socket.create_connection((server.host, server.port), timeout=READ_TIMEOUT_S) as sock:
        sock.sendall(data)
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                pytest.fail(f"no close within {READ_TIMEOUT_S} s; got {bytes(received)[:300]!r}")
            if not chunk:
                return bytes(received)
            received += chunk


def check_response(response: Response, request: Request, is_last: bool) -> None:
    assert response.status < 500, response
    document: dict[str, Any] = {}
    if response.status >= 400:
        assert response.headers.get(b"content-type", b"").startswith(b"application/json")
        if request.method == b"HEAD" and (response.from_app or response.status in (414, 431)):
            return  # a response to HEAD has no body
        document = json.loads(response.body)
        for key in ("error", "code"):
            assert isinstance(document.get(key), str), document
    if response.from_app:
        assert request.expect != REFUSE, f"the application got a request to refuse: {request}"
        return
    # The HTTP layer's own refusal.
    assert response.status in (400, 414, 431), response
    assert response.headers.get(b"connection") == b"close", response
    assert is_last, "a response after the HTTP layer's refusal"
    for key in ("field", "rule"):
        assert isinstance(document.get(key), str), document
    rule = "http_syntax" if response.status == 400 else "max_head_bytes"
    assert document["rule"] == rule, document
    if request.expect == REFUSE:
        assert response.status == request.status, (request, document)
        assert document["field"] in request.fields, (request, document)
    elif request.expect == ANSWER_OR_431:
        assert (response.status, document["field"]) == (431, "headers"), document
    else:
        assert request.expect == ANY, f"a valid request was refused: {request}, {document}"


@FUZZ
@given(requests=connections())
def test_rel_fuzz_head(server: LiveServer, requests: list[Request]) -> None:
    sent = b"".join(r.encode() for r in requests)
    note(f"sent: {sent!r}")
    data = exchange(server, sent)
    note(f"received: {data!r}")
    responses = read_responses(data, requests)
    for index, response in enumerate(responses):
        check_response(response, requests[index], index == len(responses) - 1)
    for index, request in enumerate(requests):
        if index > 0:
            before = responses[index - 1 : index]
            if (
                not before
                or not before[0].from_app
                or before[0].headers.get(b"connection") == b"close"
            ):
                break  # the one before went unanswered, was refused or closed the connection
        if request.expect != ANY:
            assert index < len(responses), f"no response to {request} ({len(responses)} came)"
        if request.expect == ANSWER:
            assert responses[index].from_app, responses[index]
    assert server.get("/v2/health/live") == 200
