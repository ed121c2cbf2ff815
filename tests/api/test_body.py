"""The bounded body reader: limits from Content-Length, while streaming, and after inflation."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient
from starlette.types import Message, Receive

from tensorbits.api.body import (
    HUGE_PAGE_MIN_BYTES,
    allocate_body,
    inflate,
    read_body,
    receive_body,
)
from tensorbits.observability import BodyInto
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge, TensorbitsError

LIMIT = 4096


async def _echo_length(request: Request) -> Response:
    try:
        body = await read_body(request, LIMIT)
    except TensorbitsError as exc:
        return JSONResponse(exc.to_dict(), status_code=exc.status_code)
    return JSONResponse({"length": len(body), "head": bytes(body[:8]).hex()})


@pytest.fixture
def client() -> Iterator[TestClient]:
    app = Starlette(routes=[Route("/", _echo_length, methods=["POST"])])
    with TestClient(app) as c:
        yield c


def test_body_within_limit_is_read_whole(client: TestClient) -> None:
    response = client.post("/", content=b"\x01\x02" * 100)
    assert response.json() == {"length": 200, "head": "0102010201020102"}


def test_declared_length_over_limit_is_refused_before_reading(client: TestClient) -> None:
    response = client.post("/", content=b"x" * (LIMIT + 1))
    assert response.status_code == 413
    assert response.json()["rule"] == "max_body_bytes"
    assert f"{LIMIT + 1} bytes exceeds the limit of {LIMIT}" in response.json()["error"]


def test_non_numeric_content_length_is_a_400(client: TestClient) -> None:
    response = client.post("/", content=b"abc", headers={"Content-Length": "3x"})
    assert response.status_code == 400
    assert response.json()["field"] == "Content-Length"


def test_chunked_body_is_bounded_while_streaming(client: TestClient) -> None:
    sent: list[int] = []

    def chunks() -> Iterator[bytes]:
        for _ in range(100):
            sent.append(1)
            yield b"y" * 1024

    response = client.post("/", content=chunks())
    assert response.status_code == 413
    assert "chunked request body" in response.json()["error"]


def test_chunked_body_within_limit(client: TestClient) -> None:
    response = client.post("/", content=iter([b"ab", b"cd", b"ef"]))
    assert response.json()["length"] == 6


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [("gzip", gzip.compress), ("deflate", zlib.compress)],
)
def test_compressed_body_is_inflated(client: TestClient, encoding: str, compress: object) -> None:
    assert callable(compress)
    payload = bytes(range(256)) * 8
    response = client.post("/", content=compress(payload), headers={"Content-Encoding": encoding})
    assert response.json() == {"length": 2048, "head": payload[:8].hex()}


def test_decompression_bomb_stops_at_the_limit() -> None:
    bomb = gzip.compress(b"\0" * (64 << 20))  # 64 MiB of zeros in about 64 KiB
    with pytest.raises(PayloadTooLarge, match="decompressed request body"):
        inflate(bomb, "gzip", LIMIT)


def test_decompression_bomb_over_http_is_413(client: TestClient) -> None:
    bomb = gzip.compress(b"\0" * (1 << 20))
    assert len(bomb) < LIMIT
    response = client.post("/", content=bomb, headers={"Content-Encoding": "gzip"})
    assert response.status_code == 413


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not gzip at all", "not valid gzip data"),
        # mtime=0: the same bytes, so the same test ids, in every process that collects them
        (gzip.compress(b"hello", mtime=0)[:-6], "truncated"),
        (gzip.compress(b"hello", mtime=0) + b"trailing", "follow the end of the gzip stream"),
    ],
)
def test_broken_gzip_is_a_400(data: bytes, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        inflate(data, "gzip", LIMIT)


def test_unknown_content_encoding_is_a_400(client: TestClient) -> None:
    response = client.post("/", content=b"abc", headers={"Content-Encoding": "br"})
    assert response.status_code == 400
    assert "allowed: gzip, deflate, identity" in response.json()["error"]


# --- a declared body: the server's hook (BODY_INTO) and ASGI receive, checked alike ------------
def _messages(*chunks: bytes | None) -> Receive:
    """``receive`` giving ``chunks`` as body messages (None: a disconnect)."""
    queue = list(chunks)

    async def receive() -> Message:
        chunk = queue.pop(0)
        if chunk is None:
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": chunk, "more_body": bool(queue)}

    return receive


def _hook(*chunks: bytes | None) -> BodyInto:
    """A ``BODY_INTO`` filling the buffer with ``chunks`` as the server's does (None: the client
    went before the body ended): bytes past the buffer counted, not written; the whole body
    read at once, whatever ``until`` asks (at least that much is in)."""

    async def into(view: memoryview, until: int | None = None) -> tuple[int, bool]:
        filled = 0
        for chunk in chunks:
            if chunk is None:
                return filled, False
            end = filled + len(chunk)
            if end <= len(view):
                view[filled:end] = chunk
            filled = end
        return filled, True

    return into


@pytest.mark.parametrize(
    ("chunks", "rule", "words"),
    [
        ((b"abc", b"defg"), "body_length", "longer than its Content-Length 6"),
        ((b"abc", None), "truncated", "client disconnected before the request body was complete"),
        ((b"abc",), "truncated", "ended after 3 of its 6 declared bytes"),
    ],
    ids=["longer", "disconnected", "shorter"],
)
@pytest.mark.parametrize("path", ["hook", "receive"])
def test_a_declared_body_is_refused_in_the_same_words_either_way(
    chunks: tuple[bytes | None, ...], rule: str, words: str, path: str
) -> None:
    into = _hook(*chunks) if path == "hook" else None
    receive = _messages(*chunks) if path == "receive" else _messages()
    with pytest.raises(InvalidRequest, match=words) as caught:
        asyncio.run(receive_body(receive, 6, None, LIMIT, None, into))
    assert caught.value.rule == rule


@pytest.mark.parametrize("path", ["hook", "receive"])
def test_a_declared_body_is_read_whole_either_way(path: str) -> None:
    chunks = (b"ab", b"cdef")
    into = _hook(*chunks) if path == "hook" else None
    receive = _messages(*chunks) if path == "receive" else _messages()
    assert asyncio.run(receive_body(receive, 6, None, LIMIT, None, into)) == b"abcdef"


@pytest.mark.parametrize("length", [0, 100, HUGE_PAGE_MIN_BYTES, HUGE_PAGE_MIN_BYTES + 4097])
def test_a_body_buffer_is_a_bytearray_of_its_declared_length(length: int) -> None:
    buffer = allocate_body(length)
    assert type(buffer) is bytearray
    assert len(buffer) == length
    if length < HUGE_PAGE_MIN_BYTES:
        assert not any(buffer)  # small ones zero-filled, as bytearray(n)
    pattern = bytes(range(256)) * (length // 256) + bytes(length % 256)
    buffer[:] = pattern  # written whole (a large one's contents before that are not defined)
    assert buffer == pattern
