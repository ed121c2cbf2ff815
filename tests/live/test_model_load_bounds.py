"""Model loads bounded and walked before parsing, over both protocols, against a live server.

A load's size is bounded by one number derived from TENSORBITS_MAX_MODEL_BYTES (HTTP: from its
Content-Length, before a byte is read; gRPC: the message, before anything of it is read); its
parameters are counted and its keys measured on the bytes. Each refusal is the same on both
protocols (413 / RESOURCE_EXHAUSTED or 400 / INVALID_ARGUMENT, the same field and rule). A
maximal load is decoded off the event loop: both ports' probes answer meanwhile, and a refused
one grows the server's peak memory by less than 4 x the request + 48 MiB (docs/reliability.md).
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any, cast

import grpc
import numpy as np
import pytest
from core.graph_models import chain_model
from grpc_health.v1 import health_pb2
from support.grpc_live import GrpcServer, health_check, serve_grpc
from support.live import LiveServer

from tensorbits.grpc import inference_pb2 as pb
from tensorbits.grpc import wire
from tensorbits.load_bounds import max_load_bytes

MiB = 1 << 20
MODEL_BYTES = 64 * MiB  # TENSORBITS_MAX_MODEL_BYTES's default
LOAD = "/inference.GRPCInferenceService/RepositoryModelLoad"
FILE = "file:1/model.onnx"
CONFIG = json.dumps({"backend": "onnxruntime"})


@pytest.fixture(scope="module")
def server() -> Iterator[GrpcServer]:
    with serve_grpc() as live:
        yield live


@pytest.fixture(scope="module")
def load(server: GrpcServer) -> Iterator[grpc.UnaryUnaryMultiCallable[bytes, bytes]]:
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(server.grpc_url, options=options) as channel:
        yield channel.unary_unary(LOAD)


def http_raw(server: LiveServer, body: bytes, length: int | None = None) -> tuple[int, Any]:
    """POST a load of ``body`` (declaring ``length``, its own by default) over a plain socket:
    the status and the JSON error (a refusal from Content-Length comes before the body)."""
    declared = len(body) if length is None else length
    head = (
        f"POST /v2/repository/models/chained/load HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: application/json\r\nContent-Length: {declared}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((server.host, server.port), timeout=120) as sock:
        sock.sendall(head)
        with contextlib.suppress(OSError):  # refused before the body: it may close first
            sock.sendall(body)
        answer = b""
        while chunk := sock.recv(1 << 16):
            answer += chunk
    head_bytes, _, rest = answer.partition(b"\r\n\r\n")
    status = int(head_bytes.split(b" ", 2)[1])
    return status, json.loads(rest or b"{}")


def grpc_call(
    call: grpc.UnaryUnaryMultiCallable[bytes, bytes], message: bytes
) -> tuple[Any, dict[str, str]]:
    try:
        call(message, timeout=120)
    except grpc.RpcError as error:
        answer = cast(grpc.Call, error)  # what grpcio raises is both
        metadata = {str(k): str(v) for k, v in answer.trailing_metadata() or ()}
        details = {
            "field": metadata.get("tensorbits-error-field", ""),
            "rule": metadata.get("tensorbits-error-rule", ""),
            "error": str(answer.details()),
        }
        return answer.code(), details
    return grpc.StatusCode.OK, {}


def http_body(parameters: dict[str, str]) -> bytes:
    return json.dumps({"parameters": parameters}).encode()


def grpc_message(parameters: dict[str, str | bytes]) -> bytes:
    request = pb.RepositoryModelLoadRequest(model_name="chained")
    for key, value in parameters.items():
        if isinstance(value, bytes):
            request.parameters[key].bytes_param = value
        else:
            request.parameters[key].string_param = value
    data: bytes = request.SerializeToString()
    return data


class Probes:
    """HTTP health and gRPC health checked over and over while the block runs; the slowest
    answer of each, and every failure."""

    def __init__(self, server: GrpcServer) -> None:
        self.server = server
        self.slowest = {"http": 0.0, "grpc": 0.0}
        self.answers = {"http": 0, "grpc": 0}
        self.failures: list[str] = []
        self.stop = threading.Event()

    def _run(self, which: str) -> None:
        channel = grpc.insecure_channel(self.server.grpc_url)
        check = health_check(channel)
        while not self.stop.is_set():
            began = time.perf_counter()
            try:
                if which == "http":
                    ok = self.server.http.get("/v2/health/live", timeout=10) == 200
                else:
                    reply = check(health_pb2.HealthCheckRequest(), timeout=10)
                    ok = reply.status == health_pb2.HealthCheckResponse.SERVING
                if not ok:
                    self.failures.append(which)
            except (grpc.RpcError, OSError) as exc:
                self.failures.append(f"{which}: {exc}")
            self.slowest[which] = max(self.slowest[which], time.perf_counter() - began)
            self.answers[which] += 1
            time.sleep(0.01)
        channel.close()

    def __enter__(self) -> Probes:
        self.threads = [threading.Thread(target=self._run, args=(w,)) for w in ("http", "grpc")]
        for thread in self.threads:
            thread.start()
        time.sleep(0.5)  # connected and answered once: only what follows is judged
        self.slowest = {"http": 0.0, "grpc": 0.0}
        self.answers = {"http": 0, "grpc": 0}
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(20)


SCHEDULING_SLACK_S = 0.25


def quiet_probes(server: GrpcServer, seconds: float) -> float:
    """The slowest probe answer of either port over ``seconds`` with no load running: what the
    machine's own load does to a probe now, the baseline a load's probes are judged against."""
    with Probes(server) as probes:
        time.sleep(seconds)
    assert not probes.failures, probes.failures[:5]
    return max(probes.slowest.values())


def assert_answered_meanwhile(probes: Probes, took: float, quiet: float) -> None:
    """The probes answered while a load of ``took`` seconds ran, none waiting for the whole of
    it: had its decoding held the event loop (or the interpreter's lock), the slowest probe
    would have waited most of ``took``. Judged against the load's own duration, beyond what a
    quiet moment of the same run made a probe wait (twice it, and a quarter second of the
    scheduler's slack on a loaded machine: a load refused in a fraction of a second judges
    little; a maximal one, seconds long, is what this catches)."""
    assert not probes.failures, probes.failures[:5]
    bar = took / 2 + 2 * quiet + SCHEDULING_SLACK_S
    assert max(probes.slowest.values()) < bar, (probes.slowest, took, quiet)


BOUND = max_load_bytes(MODEL_BYTES)
# A file of the largest size, not an ONNX model: read, decoded, then refused by the ONNX reader.
MAXIMAL_FILE = bytes(range(256)) * (MODEL_BYTES // 256)


def sent_under_probes(
    server: GrpcServer,
    load: grpc.UnaryUnaryMultiCallable[bytes, bytes],
    body: bytes,
    message: bytes,
    *,
    probes_answered: bool = False,
) -> list[Any]:
    """The same load sent as HTTP ``body`` then as gRPC ``message``, each while both ports are
    probed: the answers, each load's memory held within 4 x its size + 48 MiB, and the probes
    answered meanwhile (``probes_answered``: at least once on each port, during a long load)."""
    answers = []
    for send, size in (
        (lambda: http_raw(server.http, body), len(body)),
        (lambda: grpc_call(load, message), len(message)),
    ):
        quiet = quiet_probes(server, 2)
        before = server.http.reset_peak_rss()
        with Probes(server) as probes:
            began = time.perf_counter()
            answers.append(send())
            took = time.perf_counter() - began
        grew = server.http.peak_rss() - before
        assert grew < 4 * size + 48 * MiB, (grew / MiB, size / MiB)
        if probes_answered:
            assert min(probes.answers.values()) > 0, probes.answers
        assert_answered_meanwhile(probes, took, quiet)
    return answers


def test_a_load_past_the_bound_is_refused_alike_before_it_is_read(
    server: GrpcServer, load: grpc.UnaryUnaryMultiCallable[bytes, bytes]
) -> None:
    status, error = http_raw(server.http, b"", length=BOUND + 1)
    assert status == 413, error
    code, details = grpc_call(load, grpc_message({FILE: b"\0" * (BOUND + 1)}))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    for refusal in (error, details):
        assert (refusal["field"], refusal["rule"]) == ("load", "max_load_bytes"), refusal
        assert "TENSORBITS_MAX_MODEL_BYTES" in refusal["error"], refusal
        assert "TENSORBITS_MAX_BODY_BYTES" not in refusal["error"], refusal


def test_a_maximal_load_is_decoded_off_the_loop_and_refused_within_the_memory_bound(
    server: GrpcServer, load: grpc.UnaryUnaryMultiCallable[bytes, bytes]
) -> None:
    body = http_body({"config": CONFIG, FILE: base64.b64encode(MAXIMAL_FILE).decode()})
    assert len(body) <= BOUND
    message = grpc_message({"config": CONFIG, FILE: MAXIMAL_FILE})
    answers = sent_under_probes(server, load, body, message, probes_answered=True)
    (status, error), (code, details) = answers
    assert status == 400, error
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert (error["field"], error["rule"]) == (details["field"], details["rule"])


# One unknown field of each wire type (a newer inference.proto's), and a group holding fields.
UNKNOWN: dict[str, bytes] = {
    "varint": wire.varint_field(100, 1 << 60),
    "fixed64": wire.encode_varint(101 << 3 | wire.I64) + b"\x01" * 8,
    "length-delimited": wire.len_field(102, b"a newer field's bytes"),
    "fixed32": wire.encode_varint(103 << 3 | wire.I32) + b"\x02" * 4,
    "group": wire.encode_varint(104 << 3 | wire.START_GROUP)
    + wire.varint_field(1, 5)
    + wire.encode_varint(104 << 3 | wire.END_GROUP),
}


@pytest.mark.parametrize("kind", UNKNOWN)
def test_a_load_with_a_newer_clients_fields_loads(
    server: GrpcServer, load: grpc.UnaryUnaryMultiCallable[bytes, bytes], kind: str
) -> None:
    extra, field = UNKNOWN[kind], wire.len_field
    name = f"newer_{kind.replace('-', '_')}"
    model = chain_model(np.dtype(np.uint8))
    message = (
        extra + field(2, name.encode()) + extra
        + field(3, field(1, b"config") + field(2, extra + field(3, CONFIG.encode()) + extra))
        + field(3, field(1, FILE.encode()) + extra + field(2, field(4, model))) + extra
    )  # fmt: skip
    code, details = grpc_call(load, message)
    assert code == grpc.StatusCode.OK, details
    assert server.http.get(f"/v2/models/{name}/ready") == 200
    unload = f"{server.http.base_url}/v2/repository/models/{name}/unload"
    with urllib.request.urlopen(urllib.request.Request(unload, method="POST"), timeout=30) as done:
        assert done.status == 200


# 1.5 million distinct keys: 16 MiB of entries ("k" + a number, each k = "").
FLOOD_KEYS = 1_500_000


def test_a_flood_of_parameters_is_refused_alike_on_the_bytes(
    server: GrpcServer, load: grpc.UnaryUnaryMultiCallable[bytes, bytes]
) -> None:
    field = wire.len_field
    entries = b"".join(field(3, field(1, b"k%d" % i) + field(2, b"")) for i in range(FLOOD_KEYS))
    message = field(2, b"chained") + entries
    body = b'{"parameters": {' + b",".join(b'"k%d": ""' % i for i in range(FLOOD_KEYS)) + b"}}"
    answers = sent_under_probes(server, load, body, message)
    (status, error), (code, details) = answers
    assert status == 413, error
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    for refusal in (error, details):
        assert (refusal["field"], refusal["rule"]) == ("parameters", "max_parameters"), refusal


@pytest.mark.parametrize(
    ("parameters", "status", "code", "rule"),
    [
        ({"k" * 5000: "x"}, 400, grpc.StatusCode.INVALID_ARGUMENT, "max_text_bytes"),
        ({"k" * 100_000: "x"}, 400, grpc.StatusCode.INVALID_ARGUMENT, "max_text_bytes"),
        ({"config": " " * (65 << 10)}, 413, grpc.StatusCode.RESOURCE_EXHAUSTED, "max_config_bytes"),
        ({"config": " " * (1 << 20)}, 413, grpc.StatusCode.RESOURCE_EXHAUSTED, "max_config_bytes"),
        (
            {f"p{i}": "" for i in range(65)},
            413,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "max_parameters",
        ),
    ],
    ids=["long key", "key cut out", "long config", "config cut out", "65 parameters"],
)
def test_keys_values_and_counts_are_refused_alike(
    server: GrpcServer,
    load: grpc.UnaryUnaryMultiCallable[bytes, bytes],
    parameters: dict[str, str],
    status: int,
    code: grpc.StatusCode,
    rule: str,
) -> None:
    got_status, error = http_raw(server.http, http_body(parameters))
    got_code, details = grpc_call(load, grpc_message(dict(parameters)))
    assert (got_status, got_code) == (status, code), (error, details)
    assert error["rule"] == details["rule"] == rule, (error, details)
    assert error["field"] == details["field"], (error, details)
