"""The retry policy: what is retried, how long it waits, when it gives up. No test sleeps: the
clients' ``_sleep`` is replaced by a recorder."""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import pytest
from fake_server import FakeServer, json_error

from tensorbits_client import (
    APIConnectionError,
    AsyncClient,
    BadRequestError,
    Client,
    InternalServerError,
    OverloadedError,
    RateLimitError,
)
from tensorbits_client import _constants as constants
from tensorbits_client._base import BaseClient

X = np.arange(4, dtype=np.uint8)


def ok_response() -> httpx.Response:
    body = {
        "model_name": "onnx.BitwiseNot-18",
        "outputs": [{"name": "Y", "shape": [4], "datatype": "UINT8", "data": [255, 254, 253, 252]}],
    }
    return httpx.Response(200, json=body)


def script(*steps: httpx.Response | type[Exception]) -> Callable[[httpx.Request], httpx.Response]:
    """A handler answering each request with the next step (an exception class is raised)."""
    pending: Iterator[httpx.Response | type[Exception]] = iter(steps)

    def handler(request: httpx.Request) -> httpx.Response:
        step = next(pending)
        if isinstance(step, type):
            raise step("scripted failure")
        return step

    return handler


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    recorded: list[float] = []

    def record(self: object, seconds: float) -> None:
        recorded.append(seconds)

    async def arecord(self: object, seconds: float) -> None:
        recorded.append(seconds)

    monkeypatch.setattr(Client, "_sleep", record)
    monkeypatch.setattr(AsyncClient, "_sleep", arecord)
    return recorded


def _call(server: FakeServer, **options: object) -> np.ndarray:
    with server.client(**options) as client:
        return client.onnx.bitwise_not(X)


def test_fails_twice_then_succeeds(sleeps: list[float]) -> None:
    server = FakeServer(script(json_error(503, "busy"), json_error(503, "busy"), ok_response()))
    np.testing.assert_array_equal(_call(server), ~X)
    assert len(server.requests) == 3
    assert len(sleeps) == 2
    # Exponential backoff with jitter: 0.5 s then 1 s, each less at most a quarter.
    assert 0.375 <= sleeps[0] <= 0.5
    assert 0.75 <= sleeps[1] <= 1.0


def test_every_attempt_sends_the_whole_body(sleeps: list[float]) -> None:
    server = FakeServer(script(json_error(503, "busy"), ok_response()))
    _call(server)
    first, second = server.requests
    assert first.content == second.content
    assert len(first.content) == int(first.headers["Content-Length"])


def test_gives_up_after_the_limit(sleeps: list[float]) -> None:
    server = FakeServer(script(*[json_error(503, "still busy", code="overloaded")] * 3))
    with pytest.raises(OverloadedError) as caught:
        _call(server)
    assert caught.value.message == "still busy"
    assert caught.value.code == "overloaded"
    assert len(server.requests) == 3  # one try + max_retries=2
    assert len(sleeps) == 2


def test_zero_disables_retries(sleeps: list[float]) -> None:
    server = FakeServer(script(json_error(429, "slow down", retry_after="1")))
    with pytest.raises(RateLimitError):
        _call(server, max_retries=0)
    assert len(server.requests) == 1
    assert sleeps == []


def test_per_call_max_retries_override(sleeps: list[float]) -> None:
    server = FakeServer(script(*[json_error(503, "busy")] * 5, ok_response()))
    with server.client(max_retries=0) as client:
        result = client.infer("onnx.BitwiseNot-18", [X], max_retries=5)
    np.testing.assert_array_equal(result.output, ~X)
    assert len(sleeps) == 5


def test_honours_retry_after_seconds(sleeps: list[float]) -> None:
    server = FakeServer(script(json_error(429, "slow", retry_after="3"), ok_response()))
    _call(server)
    assert sleeps == [3.0]


def test_honours_retry_after_http_date(sleeps: list[float]) -> None:
    when = email.utils.formatdate(time.time() + 10, usegmt=True)
    server = FakeServer(script(json_error(503, "busy", retry_after=when), ok_response()))
    _call(server)
    assert len(sleeps) == 1
    assert 8.0 <= sleeps[0] <= 10.0


def test_retry_after_is_capped(sleeps: list[float]) -> None:
    server = FakeServer(script(json_error(503, "busy", retry_after="86400"), ok_response()))
    _call(server)
    assert sleeps == [constants.MAX_RETRY_AFTER]


def test_connection_errors_are_retried(sleeps: list[float]) -> None:
    server = FakeServer(script(httpx.ConnectError, httpx.ReadTimeout, ok_response()))
    np.testing.assert_array_equal(_call(server), ~X)
    assert len(sleeps) == 2


def test_connection_errors_give_up(sleeps: list[float]) -> None:
    server = FakeServer(script(httpx.ConnectError, httpx.ConnectError, httpx.ConnectError))
    with pytest.raises(APIConnectionError):
        _call(server)


@pytest.mark.parametrize("status", [400, 404, 413, 500])
def test_other_statuses_are_not_retried(sleeps: list[float], status: int) -> None:
    server = FakeServer(script(json_error(status, "no")))
    with pytest.raises((BadRequestError, InternalServerError, Exception)):
        _call(server)
    assert len(server.requests) == 1
    assert sleeps == []


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("2", 2.0),
        ("0.5", 0.5),
        ("-3", 0.0),
        ("", None),
        ("soon", None),
        ("nan", None),
        ("inf", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # in the past: retry now
    ],
)
def test_parse_retry_after(value: str, seconds: float | None) -> None:
    assert BaseClient._parse_retry_after(value) == seconds


def test_parse_retry_after_date_relative_to_now() -> None:
    assert BaseClient._parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now=1445412480.0) == 30.0


def test_backoff_grows_and_is_capped() -> None:
    with Client("http://tensorbits.test") as client:
        error = APIConnectionError(httpx.Request("GET", "http://tensorbits.test"))
        delays = [client._retry_delay(n, error) for n in range(10)]
    assert all(d <= constants.MAX_RETRY_DELAY for d in delays)
    assert delays[-1] >= constants.MAX_RETRY_DELAY * (1 - constants.JITTER)
    assert delays[0] <= constants.INITIAL_RETRY_DELAY


def test_async_retries_the_same_way(sleeps: list[float]) -> None:
    server = FakeServer(
        script(json_error(503, "busy", retry_after="2"), httpx.ConnectError, ok_response())
    )

    async def main() -> np.ndarray:
        async with server.async_client() as client:
            return await client.onnx.bitwise_not(X)

    np.testing.assert_array_equal(asyncio.run(main()), ~X)
    assert sleeps[0] == 2.0
    assert len(sleeps) == 2
