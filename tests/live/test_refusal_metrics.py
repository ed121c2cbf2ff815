"""Refusals as an operator reads them, on a live server: ``tensorbits_refusals_total`` by
protocol, model, status and rule, alike for the same refused calls over HTTP and gRPC; the
admission bounds exported beside the in-flight gauges; ``tensorbits_requests_total`` by
protocol; and the requests the HTTP layer refuses before the app (a malformed request line, a
head past its byte limit, a head that never ends, a body that never comes after its answer)
logged and counted as the app's refusals are."""

from __future__ import annotations

import json
import socket
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import IO, Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from support.grpc_live import GrpcServer
from support.live import LiveServer, free_port, serve
from support.rawhttp import exchange, one_reply, read_replies, request
from support.v2 import NOT
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.integration

MAX_HEAD = 4096
BODY_LIMIT = 64 * 1024
# The fields of every access-log line of a refused request, whoever refused it.
ACCESS_FIELDS = {
    "request_id", "client", "protocol", "route", "status", "refusal", "rule", "field",
    "bytes_in", "bytes_out", "duration_ms", "pid",
}  # fmt: skip


def _lines(log: IO[bytes]) -> list[dict[str, Any]]:
    log.seek(0)
    return [json.loads(line) for line in log.read().decode().splitlines() if line.startswith("{")]


def _access_once(
    log: IO[bytes], done: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    """The access-log lines once ``done`` holds of them, or after 10 s, whatever they are."""
    deadline = time.monotonic() + 10
    while True:
        access = [line for line in _lines(log) if line["logger"] == "tensorbits.access"]
        if done(access) or time.monotonic() > deadline:
            return access
        time.sleep(0.05)


def _samples(port: int, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """``name``'s samples on the server at ``port``: labels to value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            series, _, value = line.rpartition(" ")
            body = series[len(name) + 1 : -1] if "{" in series else ""
            labels = frozenset(
                (pair.split("=", 1)[0], json.loads(pair.split("=", 1)[1]))
                for pair in body.split(",")
                if pair
            )
            found[labels] = float(value)
    return found


def _without(labels: frozenset[tuple[str, str]], name: str) -> frozenset[tuple[str, str]]:
    return frozenset(pair for pair in labels if pair[0] != name)


@pytest.fixture(scope="module")
def logged() -> Iterator[tuple[GrpcServer, IO[bytes]]]:
    """A server with gRPC, small head and body limits, a short head deadline and keep-alive
    (the lingering close's idle bound), JSON logs at info level to a file."""
    grpc_port = free_port()
    env = {
        "TENSORBITS_GRPC_PORT": str(grpc_port),
        "TENSORBITS_LOG_JSON": "true",
        "TENSORBITS_LOG_LEVEL": "info",
        "TENSORBITS_MAX_HEAD_BYTES": str(MAX_HEAD),
        "TENSORBITS_MAX_BODY_BYTES": str(BODY_LIMIT),
        "TENSORBITS_MAX_INFLIGHT_BYTES": str(1 << 20),
        "TENSORBITS_MAX_INFLIGHT_REQUESTS": "7",
        "TENSORBITS_TIMEOUT_HEADER_READ": "1",
        "TENSORBITS_TIMEOUT_KEEP_ALIVE": "1",
    }
    with tempfile.TemporaryFile() as log, serve(env, stderr=log) as server:
        yield GrpcServer(server, grpc_port), log


def _refused_calls(module: Any, url: str) -> None:
    """Three refused calls: an input of the wrong type, a model not served, a parameter no
    feature level has."""
    client = module.InferenceServerClient(url)
    tensor = module.InferInput("InputTensor", [4], "BOOL")
    tensor.set_data_from_numpy(np.zeros(4, dtype=np.bool_))
    with pytest.raises(InferenceServerException):
        client.infer(NOT, [tensor])
    numbers = module.InferInput("InputTensor", [4], "UINT8")
    numbers.set_data_from_numpy(np.arange(4, dtype=np.uint8))
    with pytest.raises(InferenceServerException):
        client.infer("NO_SUCH_MODEL", [numbers])
    with pytest.raises(InferenceServerException):
        client.infer(NOT, [numbers], parameters={"feature_level": "2_0"})
    client.infer(NOT, [numbers])  # and one answered: no refusal


def test_the_same_refusals_count_under_the_same_labels_on_both_protocols(
    logged: tuple[GrpcServer, IO[bytes]],
) -> None:
    server, _ = logged
    before = _samples(server.http.port, "tensorbits_refusals_total")
    _refused_calls(triton_http, server.http.url)
    middle = _samples(server.http.port, "tensorbits_refusals_total")
    _refused_calls(triton_grpc, server.grpc_url)
    after = _samples(server.http.port, "tensorbits_refusals_total")

    def added(
        old: dict[frozenset[tuple[str, str]], float], new: dict[frozenset[tuple[str, str]], float]
    ) -> dict[frozenset[tuple[str, str]], float]:
        return {k: v - old.get(k, 0.0) for k, v in new.items() if v != old.get(k, 0.0)}

    http, grpc = added(before, middle), added(middle, after)
    assert {dict(k)["protocol"] for k in http} == {"http"}
    assert {dict(k)["protocol"] for k in grpc} == {"grpc"}
    http_labels = {_without(k, "protocol"): v for k, v in http.items()}
    grpc_labels = {_without(k, "protocol"): v for k, v in grpc.items()}
    assert http_labels == grpc_labels, (http, grpc)
    assert sum(http_labels.values()) == 3
    models = {dict(k)["model"] for k in http_labels}
    assert models == {NOT, "unknown"}  # a name not served is no label value of its own
    assert all(dict(k)["rule"] for k in http_labels), http_labels
    statuses = {dict(k)["status"] for k in http_labels}
    assert statuses == {"400", "404"}, statuses


def test_requests_count_by_protocol(logged: tuple[GrpcServer, IO[bytes]]) -> None:
    server, _ = logged
    _refused_calls(triton_http, server.http.url)
    _refused_calls(triton_grpc, server.grpc_url)
    series = _samples(server.http.port, "tensorbits_requests_total")
    protocols = {dict(labels)["route"]: dict(labels)["protocol"] for labels in series}
    assert protocols["/v2/models/{model}/infer"] == "http"
    assert protocols["/inference.GRPCInferenceService/ModelInfer"] == "grpc"
    assert set(protocols.values()) == {"http", "grpc"}


def test_the_admission_bounds_are_exported(logged: tuple[GrpcServer, IO[bytes]]) -> None:
    server, _ = logged
    bytes_limit = _samples(server.http.port, "tensorbits_inflight_bytes_limit")
    requests_limit = _samples(server.http.port, "tensorbits_inflight_requests_limit")
    assert bytes_limit == {frozenset(): float(1 << 20)}
    assert requests_limit == {frozenset(): 7.0}


def _layer_line(
    log: IO[bytes], server: LiveServer, send: Callable[[], None], rule: str
) -> tuple[dict[str, Any], float]:
    """The one new access-log line ``send`` leaves with ``rule``, and what it added to the
    refusals counted under that rule."""

    def counted() -> float:
        series = _samples(server.port, "tensorbits_refusals_total")
        return sum(v for k, v in series.items() if dict(k)["rule"] == rule)

    count_before = counted()
    seen = len(_access_once(log, lambda _: True))
    send()
    access = _access_once(log, lambda lines: any(x.get("rule") == rule for x in lines[seen:]))
    (line,) = [x for x in access[seen:] if x.get("rule") == rule]
    deadline = time.monotonic() + 10
    while counted() == count_before and time.monotonic() < deadline:
        time.sleep(0.05)
    return line, counted() - count_before


def _assert_http_layer_line(line: dict[str, Any], status: int, refusal: str, field: str) -> None:
    assert set(line) >= ACCESS_FIELDS, ACCESS_FIELDS - set(line)
    assert line["protocol"] == "http"
    assert line["status"] == status, line
    assert line["refusal"] == refusal, line
    assert line["field"] == field, line
    assert line["client"].rpartition(":")[0] == "127.0.0.1", line
    assert len(line["request_id"]) == 32, line
    assert isinstance(line["pid"], int)
    assert line["duration_ms"] >= 0


@pytest.mark.parametrize(
    ("data", "status", "refusal", "field", "rule"),
    [
        (b"GET /v2 HTTP/1.1 extra\r\n\r\n", 400, "invalid_request", "version", "http_syntax"),
        (
            request("GET", "/v2/health/live", {"X-Big": "x" * MAX_HEAD}),
            431,
            "request_header_fields_too_large",
            "headers",
            "max_head_bytes",
        ),
        (
            request("GET", "/v2/" + "x" * (2 * MAX_HEAD)),
            414,
            "uri_too_long",
            "url",
            "max_head_bytes",
        ),
    ],
)
def test_a_refusal_of_the_http_layer_has_an_access_line_and_is_counted(
    logged: tuple[GrpcServer, IO[bytes]],
    data: bytes,
    status: int,
    refusal: str,
    field: str,
    rule: str,
) -> None:
    server, log = logged
    replies: list[Any] = []

    def send() -> None:
        replies.append(one_reply(server.http, data))

    line, added = _layer_line(log, server.http, send, rule)
    assert replies[0].status == status
    _assert_http_layer_line(line, status, refusal, field)
    assert line["rule"] == rule
    assert line["bytes_out"] > 0
    assert line["bytes_in"] > 0
    assert added >= 1


def test_a_head_that_never_ends_has_an_access_line_and_is_counted(
    logged: tuple[GrpcServer, IO[bytes]],
) -> None:
    server, log = logged

    def send() -> None:
        partial = b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\n"
        assert exchange(server.http, partial, timeout=10) == b""  # closed unanswered

    line, added = _layer_line(log, server.http, send, "header_read_timeout")
    _assert_http_layer_line(line, 408, "request_timeout", "headers")
    assert line["message"].startswith("GET /v2/health/live ")
    assert line["bytes_out"] == 0
    assert line["duration_ms"] >= 900
    assert added == 1


def test_an_idle_connection_that_sent_nothing_is_no_request(
    logged: tuple[GrpcServer, IO[bytes]],
) -> None:
    server, log = logged
    seen = len(_access_once(log, lambda _: True))
    with socket.create_connection(("127.0.0.1", server.http.port), timeout=10) as sock:
        assert sock.recv(1) == b""  # closed at the head deadline, nothing said
    time.sleep(0.2)
    assert not [x for x in _access_once(log, lambda _: True)[seen:] if x["status"] == 408]


def test_a_body_that_never_comes_after_its_refusal_has_an_access_line(
    logged: tuple[GrpcServer, IO[bytes]],
) -> None:
    """A 413 for the declared length, then the body never sent: the lingering close ends at its
    idle bound (the keep-alive timeout here), logged under its request's route."""
    server, log = logged
    replies: list[Any] = []
    head = request("POST", f"/v2/models/{NOT}/infer", {"Content-Length": str(BODY_LIMIT * 2)})

    def send() -> None:
        with socket.create_connection(("127.0.0.1", server.http.port), timeout=10) as sock:
            sock.sendall(head.replace(b"Content-Length: 0\r\n", b""))
            received = b""
            while piece := sock.recv(65536):  # the answer, then the server's end of sending
                received += piece
            time.sleep(2)  # the socket kept open, sending nothing: past the idle bound
        replies.extend(read_replies(received))

    line, added = _layer_line(log, server.http, send, "linger_idle")
    assert [reply.status for reply in replies] == [413]
    _assert_http_layer_line(line, 408, "request_timeout", "body")
    assert line["route"] == "/v2/models/{model}/infer"
    assert added == 1
