"""The bounded body reader: limits from Content-Length, while streaming, and after inflation."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from tensorbits.api.body import inflate, read_body
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
