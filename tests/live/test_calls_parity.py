"""What happens around a request answers alike on HTTP and gRPC: the API key check (a missing key,
a wrong one, a right one in either header, the open probes), the read deadline, and the count of
a refusal in /metrics. Each is one implementation with a thin hook per protocol (``auth.py``,
``deadlines.py``, ``observability.record_call``): the same error class through the one status
table, the same field, rule and words over both.

One real server of its own, with keys and a 1 s read deadline: the suite's shared server has
neither."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.grpc_live import GrpcServer, serve_grpc
from support.rawhttp import read_response
from support.wires import SERVICE, TIMEOUT_S, Refused, Wires, message_json

from tensorbits import auth, deadlines
from tensorbits.grpc import inference_pb2 as pb
from tensorbits_protocol.errors import RequestTimeout, Unauthorized

pytestmark = pytest.mark.integration

KEY = "tb-parity-key-0123456789abcdef"
WRONG = "tb-parity-key-not-configured-xx"
READ_S = 1
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"

MISSING = Refused(Unauthorized, auth.FIELD, auth.RULE, auth.MISSING)
NOT_VALID = Refused(Unauthorized, auth.FIELD, auth.RULE, auth.NOT_VALID)
NO_SCHEME = Refused(Unauthorized, auth.FIELD, auth.RULE, auth.NO_SCHEME)
# The words that follow what each protocol waited for ("the request body", "the ServerLive
# request message"): the rest of a read deadline's refusal, the same on both.
DEADLINE_WORDS = f" did not arrive within {READ_S} s ({deadlines.SETTING})"


@pytest.fixture(scope="module")
def keyed() -> Iterator[GrpcServer]:
    env = {"TENSORBITS_API_KEYS": KEY, "TENSORBITS_TIMEOUT_BODY_READ": str(READ_S)}
    with serve_grpc(env) as server:
        yield server


@pytest.fixture(scope="module")
def wires(keyed: GrpcServer) -> Iterator[Wires]:
    with (
        httpx.Client(base_url=keyed.http.base_url, timeout=TIMEOUT_S) as http,
        grpc.insecure_channel(keyed.grpc_url) as channel,
    ):
        yield Wires(http, channel)


def _grpc(
    wires: Wires, rpc: str, request: Any, response: type[Any], metadata: dict[str, str]
) -> Any:
    method: grpc.UnaryUnaryMultiCallable[Any, Any] = wires.channel.unary_unary(
        f"/{SERVICE}/{rpc}",
        request_serializer=lambda message: message.SerializeToString(),
        response_deserializer=response.FromString,
    )
    return wires.grpc_outcome(
        lambda: method(request, timeout=TIMEOUT_S, metadata=tuple(metadata.items()))
    )


def _http(wires: Wires, path: str, headers: dict[str, str]) -> httpx.Response | Refused:
    response = wires.http.get(path, headers=headers)
    return response if response.status_code == 200 else wires.http_refused(response)


# (HTTP headers, gRPC metadata, the refusal both must give): names in gRPC metadata are lower case.
CREDENTIALS = [
    pytest.param({}, {}, MISSING, id="no-key"),
    pytest.param(
        {"Authorization": f"Bearer {WRONG}"}, {"authorization": f"Bearer {WRONG}"}, NOT_VALID,
        id="wrong-bearer",
    ),
    pytest.param({"X-API-Key": WRONG}, {"x-api-key": WRONG}, NOT_VALID, id="wrong-x-api-key"),
    # A key without the Bearer scheme is told that it lacks the scheme.
    pytest.param({"Authorization": KEY}, {"authorization": KEY}, NO_SCHEME, id="bare-key"),
    pytest.param({"Authorization": f"Basic {KEY}"}, {"authorization": f"Basic {KEY}"}, NO_SCHEME,
                 id="not-bearer"),
    # A Bearer token is the credential when there is one: a right X-API-Key does not rescue it.
    pytest.param(
        {"Authorization": f"Bearer {WRONG}", "X-API-Key": KEY},
        {"authorization": f"Bearer {WRONG}", "x-api-key": KEY}, NOT_VALID, id="bearer-wins",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("headers", "metadata", "refusal"), CREDENTIALS)
def test_a_call_without_a_right_key_is_refused_alike(
    wires: Wires, headers: dict[str, str], metadata: dict[str, str], refusal: Refused
) -> None:
    over_http = _http(wires, f"/v2/models/{NOT}", headers)
    over_grpc = _grpc(
        wires, "ModelMetadata", pb.ModelMetadataRequest(name=NOT), pb.ModelMetadataResponse,
        metadata,
    )  # fmt: skip
    assert over_http == refusal
    assert over_grpc == refusal


@pytest.mark.parametrize(
    ("headers", "metadata"),
    [
        pytest.param({"Authorization": f"Bearer {KEY}"}, {"authorization": f"Bearer {KEY}"},
                     id="bearer"),
        pytest.param({"X-API-Key": KEY}, {"x-api-key": KEY}, id="x-api-key"),
    ],
)  # fmt: skip
def test_a_right_key_in_either_header_is_served_alike(
    wires: Wires, headers: dict[str, str], metadata: dict[str, str]
) -> None:
    over_http = _http(wires, f"/v2/models/{NOT}", headers)
    over_grpc = _grpc(
        wires, "ModelMetadata", pb.ModelMetadataRequest(name=NOT), pb.ModelMetadataResponse,
        metadata,
    )  # fmt: skip
    assert isinstance(over_http, httpx.Response), over_http
    assert isinstance(over_grpc, pb.ModelMetadataResponse), over_grpc
    assert over_http.json()["name"] == message_json(over_grpc)["name"] == NOT


@pytest.mark.parametrize(
    ("path", "rpc", "request_type", "response_type", "open_"),
    [
        ("/v2/health/live", "ServerLive", pb.ServerLiveRequest, pb.ServerLiveResponse, True),
        ("/v2/health/ready", "ServerReady", pb.ServerReadyRequest, pb.ServerReadyResponse, True),
        (f"/v2/models/{NOT}/ready", "ModelReady", pb.ModelReadyRequest, pb.ModelReadyResponse,
         False),
    ],
)  # fmt: skip
def test_the_probes_open_on_one_are_open_on_the_other(
    wires: Wires,
    path: str,
    rpc: str,
    request_type: type[Any],
    response_type: type[Any],
    open_: bool,
) -> None:
    """The open paths (TENSORBITS_AUTH_OPEN_PATHS, the health routes by default) open their RPC
    twins too; a probe that is not open needs the key on both."""
    request = request_type(name=NOT) if rpc == "ModelReady" else request_type()
    over_http = _http(wires, path, {})
    over_grpc = _grpc(wires, rpc, request, response_type, {})
    if open_:
        assert isinstance(over_http, httpx.Response), over_http
        assert isinstance(over_grpc, response_type), over_grpc
    else:
        assert over_http == over_grpc == MISSING


def _http_read_deadline(server: GrpcServer) -> Refused:
    """An inference whose body never comes: its head and a few bytes, then nothing."""
    with socket.create_connection((server.http.host, server.http.port), timeout=30) as sock:
        sock.sendall(
            f"POST /v2/models/{NOT}/infer HTTP/1.1\r\nHost: x\r\nX-API-Key: {KEY}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{".encode()
        )
        reply = read_response(sock)
    assert reply.headers["content-type"].startswith("application/json"), reply
    body = reply.json()
    assert (reply.status, body["code"]) == (RequestTimeout.status_code, RequestTimeout.code)
    return Refused(RequestTimeout, body.get("field"), body.get("rule"), body["error"])


def _grpc_read_deadline(wires: Wires) -> Refused:
    """A ModelMetadata call whose message never comes: the call opened, then nothing."""

    stalled: grpc.StreamUnaryMultiCallable[bytes, pb.ModelMetadataResponse] = (
        wires.channel.stream_unary(
            f"/{SERVICE}/ModelMetadata", response_deserializer=pb.ModelMetadataResponse.FromString
        )
    )
    release = threading.Event()

    def held() -> Iterator[bytes]:
        release.wait(30)  # holds the call open with no message
        yield b""

    try:
        outcome = wires.grpc_outcome(
            lambda: stalled(held(), timeout=30, metadata=(("x-api-key", KEY),))
        )
    finally:
        release.set()
    assert isinstance(outcome, Refused), outcome
    return outcome


def test_a_body_that_never_comes_is_refused_alike(keyed: GrpcServer, wires: Wires) -> None:
    over_http = _http_read_deadline(keyed)
    over_grpc = _grpc_read_deadline(wires)
    for refused, what in ((over_http, "the request body"),
                          (over_grpc, "the ModelMetadata request message")):  # fmt: skip
        assert refused.error is RequestTimeout
        assert (refused.field, refused.rule) == (deadlines.FIELD, deadlines.RULE)
        assert refused.message == what + DEADLINE_WORDS


def _refused_count(wires: Wires, route: str) -> float:
    """The refusals for want of a key /metrics counts under ``route``."""
    text = wires.http.get("/metrics", headers={"X-API-Key": KEY}).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "tensorbits_requests_total"
        and sample.labels["route"] == route
        and sample.labels["status"] == "401"
    )


def test_a_refusal_is_counted_alike(wires: Wires) -> None:
    """A refused call is counted in /metrics as a refused request is: under its route, status
    401 (one ``observability.record_call`` for both)."""
    route = f"/{SERVICE}/ServerMetadata"
    before = (_refused_count(wires, "unmatched"), _refused_count(wires, route))
    assert _http(wires, "/v2", {}) == MISSING
    assert _grpc(wires, "ServerMetadata", pb.ServerMetadataRequest(),
                 pb.ServerMetadataResponse, {}) == MISSING  # fmt: skip
    after = (_refused_count(wires, "unmatched"), _refused_count(wires, route))
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)
