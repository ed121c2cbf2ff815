"""The protocol-neutral core around every request, in process: the API key check
(``auth.KeyRing.check``), the count and access-log line (``observability.record_call``), the read
deadline (``deadlines.within_read_deadline``) and what an exception is answered with
(``refusals.answer_for``, which HTTP's exception handlers use as the gRPC calls do). The same
over both protocols is checked live in tests/live/test_calls_parity.py."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from pydantic import SecretStr
from starlette.requests import Request
from starlette.responses import Response

from tensorbits import auth, deadlines, refusals
from tensorbits.api import errors
from tensorbits.config.settings import Settings
from tensorbits.logs import begin_call, note_refusal
from tensorbits.observability import Metrics, record_call
from tensorbits_protocol.errors import BackendFailure, RequestTimeout, TensorbitsError, Unauthorized

KEY = "tb-core-key-0123456789abcdefgh"


def _ring() -> auth.KeyRing:
    return auth.KeyRing([SecretStr(KEY)], open_paths=("/v2/health/live",))


# --- API keys -----------------------------------------------------------------------------------
def test_a_right_key_passes_and_asks_nothing_of_the_client() -> None:
    def client() -> str:
        raise AssertionError("the client's address is read only for a refusal")

    ring = _ring()
    ring.check([(b"authorization", f"Bearer {KEY}".encode())], "GET", "/v2", client)
    ring.check([(b"x-api-key", KEY.encode())], "gRPC", "/svc/ServerMetadata", client)


@pytest.mark.parametrize(
    ("headers", "words", "credential"),
    [
        ([], auth.MISSING, None),
        # A key without the Bearer scheme is told so, the key itself neither echoed nor logged.
        ([(b"authorization", b"nope")], auth.NO_SCHEME, None),
        ([(b"authorization", b"Basic nope")], auth.NO_SCHEME, None),
        ([(b"authorization", b"Bearer nope")], auth.NOT_VALID, "Authorization"),
        ([(b"x-api-key", b"nope")], auth.NOT_VALID, "X-API-Key"),
    ],
)
def test_a_refusal_has_one_set_of_words_and_one_log_line(
    caplog: pytest.LogCaptureFixture,
    headers: list[tuple[bytes, bytes]],
    words: str,
    credential: str | None,
) -> None:
    with (
        caplog.at_level(logging.WARNING, logger="tensorbits.auth"),
        pytest.raises(Unauthorized) as caught,
    ):
        _ring().check(headers, "gRPC", "/svc/ModelMetadata", lambda: "ipv4:127.0.0.1:5")
    assert (caught.value.message, caught.value.field, caught.value.rule) == (
        words,
        auth.FIELD,
        auth.RULE,
    )
    (record,) = [r for r in caplog.records if r.name == "tensorbits.auth"]
    assert record.getMessage().startswith("refused gRPC /svc/ModelMetadata: ")
    assert getattr(record, "credential_header", "absent") == credential
    assert getattr(record, "client", None) == "ipv4:127.0.0.1:5"
    assert getattr(record, "status", None) == Unauthorized.status_code
    assert "nope" not in record.getMessage() + json.dumps(record.__dict__, default=str)


def test_the_ring_reads_the_settings_keys_and_open_paths() -> None:
    assert auth.KeyRing.of(Settings(backend="numpy")) is None  # no keys: nothing to check
    ring = auth.KeyRing.of(Settings(backend="numpy", api_keys=KEY))
    assert ring is not None
    assert not ring.needs_key("/v2/health/live")
    assert not ring.needs_key("/v2/health/ready")
    assert ring.needs_key("/v2")
    assert ring.needs_key(None)  # a call that mirrors no open path


# --- counts and the access log ------------------------------------------------------------------
def test_one_call_is_counted_and_logged_once_whatever_the_protocol(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics.create()
    with caplog.at_level(logging.INFO, logger="tensorbits.access"):
        record_call(metrics, "http", "GET", "/v2", "/v2", "", 200, 0.002, 0, 10)
        end = begin_call("id-1", "ipv4:127.0.0.1:1")
        note_refusal("unauthorized", "UNAUTHENTICATED", "api_key", "authorization")
        record_call(metrics, "grpc", "gRPC", "/svc/X", "/svc/X", "", 401, 0.001, 0, 0)
        end()
    assert metrics.tally.requests[("/v2", "", 200, "http", "")] == [1, 0, 10]
    assert metrics.tally.requests[("/svc/X", "", 401, "grpc", "")] == [1, 0, 0]
    # The refused call counted by its rule too; the answered one is no refusal.
    assert metrics.tally.refusals == {("grpc", "", 401, "api_key", ""): 1}
    lines = [r for r in caplog.records if r.name == "tensorbits.access"]
    # Each status as its protocol says it: HTTP's code, gRPC's code name.
    assert [r.getMessage() for r in lines] == ["GET /v2 200", "gRPC /svc/X UNAUTHENTICATED"]
    assert [getattr(r, "protocol", None) for r in lines] == ["http", "grpc"]
    assert [getattr(r, "route", None) for r in lines] == ["/v2", "/svc/X"]


def test_no_metrics_yet_still_logs_and_a_quiet_log_builds_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="tensorbits.access"):
        record_call(None, "grpc", "gRPC", "/svc/X", "/svc/X", "", 200, 0.0, 1, 1)
    assert [r.getMessage() for r in caplog.records] == ["gRPC /svc/X OK"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tensorbits.access"):
        record_call(None, "http", "GET", "/", "/", "", 200, 0.0, 0, 0)
    assert caplog.records == []


# --- the read deadline --------------------------------------------------------------------------
async def _value(delay: float) -> str:
    await asyncio.sleep(delay)
    return "arrived"


def test_the_read_deadline_passes_what_arrives_and_refuses_what_does_not() -> None:
    async def scenario() -> None:
        assert await deadlines.within_read_deadline(_value(0), 1.0, "the body") == "arrived"
        assert await deadlines.within_read_deadline(_value(0.01), None, "the body") == "arrived"
        with pytest.raises(RequestTimeout) as caught:
            await deadlines.within_read_deadline(_value(5), 0.05, "the request body")
        assert caught.value.message == (
            "the request body did not arrive within 0.05 s (TENSORBITS_TIMEOUT_BODY_READ)"
        )
        assert (caught.value.field, caught.value.rule) == (deadlines.FIELD, deadlines.RULE)

        async def own() -> None:
            raise TimeoutError("a timeout of what was awaited, not the deadline")

        with pytest.raises(TimeoutError, match="not the deadline"):
            await deadlines.within_read_deadline(own(), 5.0, "the body")

    asyncio.run(scenario())


def test_the_deadline_names_whole_seconds_without_a_fraction() -> None:
    refusal = deadlines.read_deadline_passed("the ServerLive request message", 1.0)
    assert refusal.message == (
        "the ServerLive request message did not arrive within 1 s (TENSORBITS_TIMEOUT_BODY_READ)"
    )


# --- what an exception is answered with ---------------------------------------------------------
def test_out_of_memory_is_a_warning_and_a_bug_an_error(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("tensorbits.test")
    with caplog.at_level(logging.WARNING, logger="tensorbits.test"):
        answer = refusals.answer_for(MemoryError("device"), logger, "GET /x")
        assert isinstance(answer, BackendFailure)
        assert answer.rule == "out_of_memory"
        bug = refusals.answer_for(KeyError("secret internals"), logger, "gRPC /svc/X")
        assert (type(bug), bug.message, bug.status_code) == (
            TensorbitsError,
            refusals.INTERNAL,
            500,
        )
    levels = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert levels == [
        (logging.WARNING, "backend out of memory in GET /x"),
        (logging.ERROR, "unexpected error in gRPC /svc/X"),
    ]


def _request() -> Request:
    return Request({"type": "http", "method": "POST", "path": "/v1/batch", "headers": []})


@pytest.mark.parametrize(
    ("exc", "status", "body"),
    [
        (MemoryError(), 503, {"error": refusals.OUT_OF_MEMORY, "code": "backend_failure",
                              "rule": "out_of_memory"}),
        (RuntimeError("secret internals"), 500, {"error": refusals.INTERNAL, "code": "internal"}),
    ],
)  # fmt: skip
def test_http_answers_what_is_not_a_refusal_through_the_one_table(
    exc: Exception, status: int, body: dict[str, str]
) -> None:
    handler = errors.handler_for(exc) or errors.HANDLERS[Exception]

    async def answer() -> Response:
        return await handler(_request(), exc)

    response = asyncio.run(answer())
    assert response.status_code == status
    assert json.loads(bytes(response.body)) == body
