"""``GuardedHttpProtocol`` writes a small response's head and body in one ``transport.write``
(``guarded_protocol.OneWriteCycle``), a large body apart from its head and uncopied, and keeps
uvicorn's framing: the bytes on the wire are the ones uvicorn's own protocol writes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from tensorbits.api.guarded_protocol import BODY_RECEIVED, JOINED_BODY_MAX_BYTES, guarded_protocol
from tensorbits.config.settings import Settings


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[Any] = []
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1), "sockname": ("127.0.0.1", 2)}.get(name, default)

    def write(self, data: Any) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _app(body: bytes, *, chunks: int = 1, length: bool = True) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = [(b"content-type", b"application/octet-stream")]
        if length:
            headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        step = max(1, len(body) // chunks)
        parts = [body[i : i + step] for i in range(0, len(body), step)] or [b""]
        for part in parts[:-1]:
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": parts[-1]})

    return app


def _serve(
    protocol_class: Callable[..., HttpToolsProtocol], app: Any, request: bytes
) -> _Transport:
    loop = asyncio.new_event_loop()
    try:
        config = Config(app=app, loop="none", log_config=None, access_log=False)
        config.load()
        state = ServerState()
        state.default_headers = [(b"server", b"test")]
        protocol = protocol_class(config=config, server_state=state, app_state={}, _loop=loop)
        transport = _Transport()
        protocol.connection_made(transport)
        protocol.data_received(request)
        loop.run_until_complete(asyncio.gather(*protocol.tasks))
        protocol.connection_lost(None)
        return transport
    finally:
        loop.close()


GUARDED = guarded_protocol(Settings(_env_file=None))
GET = b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n"


@pytest.mark.parametrize("size", [0, 16, JOINED_BODY_MAX_BYTES])
def test_a_small_response_is_one_write_of_uvicorns_bytes(size: int) -> None:
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    ours = _serve(GUARDED, _app(body), GET)
    theirs = _serve(HttpToolsProtocol, _app(body), GET)
    assert len(ours.writes) == 1
    assert len(theirs.writes) == 2
    assert ours.writes[0] == b"".join(theirs.writes)
    assert ours.writes[0].endswith(b"\r\n\r\n" + body)


def test_a_large_body_is_written_apart_and_not_copied() -> None:
    body = b"y" * (JOINED_BODY_MAX_BYTES + 1)
    ours = _serve(GUARDED, _app(body), GET)
    assert len(ours.writes) == 2
    assert ours.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert ours.writes[1] is body


def test_a_streamed_body_joins_its_head_to_the_first_part_only() -> None:
    body = b"abcdefgh"
    ours = _serve(GUARDED, _app(body, chunks=4), GET)
    theirs = _serve(HttpToolsProtocol, _app(body, chunks=4), GET)
    assert len(ours.writes) == len(theirs.writes) - 1 == 4
    assert ours.writes[0] == theirs.writes[0] + theirs.writes[1]
    assert b"".join(ours.writes) == b"".join(theirs.writes)


def test_chunked_and_head_responses_are_framed_as_uvicorn_frames_them() -> None:
    for request, app in (
        (GET, _app(b"chunk me", chunks=2, length=False)),
        (b"HEAD /x HTTP/1.1\r\nHost: a\r\n\r\n", _app(b"", length=False)),
        (b"GET /x HTTP/1.0\r\n\r\n", _app(b"closing")),
    ):
        ours = _serve(GUARDED, app, request)
        theirs = _serve(HttpToolsProtocol, app, request)
        assert b"".join(ours.writes) == b"".join(theirs.writes)
        assert ours.closed == theirs.closed


def test_a_bad_header_from_the_app_is_refused_as_uvicorn_refuses_it() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"x-bad", b"a\r\nb: c")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})

    ours = _serve(GUARDED, app, GET)
    theirs = _serve(HttpToolsProtocol, app, GET)
    # The head was begun (no 500 can follow it): nothing is written, the connection is closed.
    assert ours.writes == theirs.writes == []
    assert ours.closed
    assert theirs.closed


def _recording_app(seen: list[bool]) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope.get(BODY_RECEIVED, False))  # as the app finds it before it reads
        while (await receive()).get("more_body"):
            pass
        await _app(b"ok")(scope, receive, send)

    return app


def test_a_body_read_whole_before_the_app_runs_is_marked() -> None:
    seen: list[bool] = []
    post = b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"
    _serve(GUARDED, _recording_app(seen), post)
    assert seen == [True]


def test_a_body_still_arriving_is_not_marked() -> None:
    """The app starts on the head; the body comes later: it must be read under its deadline."""
    seen: list[bool] = []
    loop = asyncio.new_event_loop()
    try:
        config = Config(app=_recording_app(seen), loop="none", log_config=None)
        config.load()
        protocol = GUARDED(config=config, server_state=ServerState(), app_state={}, _loop=loop)
        protocol.connection_made(_Transport())
        protocol.data_received(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n")
        loop.run_until_complete(asyncio.sleep(0))  # the app runs and waits for the body
        assert seen == [False]
        protocol.data_received(b"hello")
        loop.run_until_complete(asyncio.gather(*protocol.tasks))
        protocol.connection_lost(None)
    finally:
        loop.close()
