"""Hostile ModelInfer messages, hand-made protobuf bytes, against the live server's gRPC port.

Each class of message that once stalled the server or took gigabytes (floods of empty fields at
the top level, huge shapes, parameter maps of millions of entries, typed values past the bound,
unpacked repeated values) is sent while two bystanders probe the server: gRPC ServerLive and HTTP
health must keep answering in a median under 100 ms, never failing. The refusal names the field
and the rule in its trailing metadata, and the server's peak memory grows by less than
4 x the message + 48 MiB: the bound the HTTP side's hostile suites hold to. The worst message
measured prints its figures (``-s`` shows them)."""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple, TypeAlias, cast

import grpc
import pytest
from google.protobuf.message import DecodeError
from support.grpc_live import GrpcServer, serve_grpc
from support.protobuf_wire import group, nested_groups, tag
from support.rawhttp import bystander, start_warmed_up

from tensorbits.grpc import inference_pb2 as pb
from tensorbits.grpc import wire
from tensorbits.grpc.pools import CONTROL_SLOTS, connection_share
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge
from tensorbits_protocol.parameters import MAX_PARAMETERS

MiB = 1 << 20
Unary: TypeAlias = "grpc.UnaryUnaryMultiCallable[bytes, bytes]"
INFER = "/inference.GRPCInferenceService/ModelInfer"
LIVE = "/inference.GRPCInferenceService/ServerLive"
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"


@pytest.fixture(scope="module")
def server() -> Iterator[GrpcServer]:
    """A server of this module's own rather than the session's ``grpc_server``: what the floods
    sent here leave in its memory stays with it, not with the other modules' server."""
    with serve_grpc() as live:
        yield live


@pytest.fixture(scope="module")
def channel(server: GrpcServer) -> Iterator[grpc.Channel]:
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(server.grpc_url, options=options) as c:
        yield c


class GrpcBystander:
    """Calls ServerLive on a channel of its own, over and over, timing each answer."""

    def __init__(self, server: GrpcServer) -> None:
        self.channel = grpc.insecure_channel(server.grpc_url)
        self.live: Unary = self.channel.unary_unary(LIVE)
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            began = time.perf_counter()
            try:
                answer = pb.ServerLiveResponse.FromString(self.live(b"", timeout=10))
                if not answer.live:
                    self.failures.append("ServerLive answered live=false")
            except grpc.RpcError as error:
                self.failures.append(f"{error.code()}: {error.details()}")
            self.latencies.append(time.perf_counter() - began)
            time.sleep(0.005)


@contextlib.contextmanager
def bystanders(server: GrpcServer) -> Iterator[GrpcBystander]:
    """gRPC ServerLive and HTTP health probed for as long as the block runs: after it, both
    were answered, never failing, in a median under 100 ms."""
    watcher = GrpcBystander(server)
    thread = start_warmed_up(watcher)
    try:
        with bystander(server.http):
            yield watcher
    finally:
        watcher.stop.set()
        thread.join(10)
        watcher.channel.close()
    assert not watcher.failures, watcher.failures[:5]
    assert watcher.latencies, "no ServerLive call was answered while the hostile call ran"
    assert statistics.median(watcher.latencies) < 0.1, sorted(watcher.latencies)[-5:]


field, scalar = wire.len_field, wire.varint_field


HEAD = field(1, NOT.encode())
ENTRY = field(4, field(1, b"k") + field(2, scalar(1, 1)))  # one parameters entry: k = true


def tensor(*parts: bytes) -> bytes:
    """An input named InputTensor, UINT8, with ``parts`` after its name and type."""
    return field(5, field(1, b"InputTensor") + field(2, b"UINT8") + b"".join(parts))


def repeated(unit: bytes, size: int) -> bytes:
    return unit * (size // len(unit))


# name -> (message of about ``size`` bytes, code, field, rule)
Case = Callable[[int], bytes]
CASES: dict[str, tuple[Case, grpc.StatusCode, str, str]] = {
    "empty raw contents": (
        lambda size: HEAD + repeated(field(7, b""), size),
        grpc.StatusCode.RESOURCE_EXHAUSTED, "raw_input_contents", "max_tensors",
    ),
    "empty inputs": (
        lambda size: HEAD + repeated(field(5, b""), size),
        grpc.StatusCode.RESOURCE_EXHAUSTED, "inputs", "max_tensors",
    ),
    "unknown fields": (
        lambda size: HEAD + repeated(scalar(9, 0), size),
        grpc.StatusCode.RESOURCE_EXHAUSTED, "ModelInferRequest", "max_fields",
    ),
    "unknown fields in a group": (
        lambda size: HEAD + group(99, repeated(scalar(9, 0), size)),
        grpc.StatusCode.RESOURCE_EXHAUSTED, "ModelInferRequest", "max_fields",
    ),
    "unknown groups nested deep": (
        lambda size: HEAD + nested_groups(size // 4),
        grpc.StatusCode.INVALID_ARGUMENT, "ModelInferRequest", "max_group_depth",
    ),
    "a singular field again and again": (
        lambda size: repeated(field(1, b""), size),
        grpc.StatusCode.INVALID_ARGUMENT, "model_name", "single_field",
    ),
    "request parameters": (
        lambda size: HEAD + repeated(ENTRY, size),
        grpc.StatusCode.RESOURCE_EXHAUSTED, "parameters", "max_parameters",
    ),
    "an input's parameters": (
        lambda size: HEAD + tensor(field(3, b"\x01"), repeated(ENTRY, size)),
        grpc.StatusCode.RESOURCE_EXHAUSTED, "inputs[0].parameters", "max_parameters",
    ),
    "a packed shape": (
        lambda size: HEAD + tensor(field(3, repeated(b"\x01", size))),
        grpc.StatusCode.INVALID_ARGUMENT, "inputs[0].shape", "max_rank",
    ),
    "an unpacked shape": (
        lambda size: HEAD + tensor(repeated(scalar(3, 1), size)),
        grpc.StatusCode.INVALID_ARGUMENT, "inputs[0].shape", "max_rank",
    ),
    "packed typed values": (
        lambda size: HEAD + tensor(field(3, b"\x01"), field(5, field(4, repeated(b"\x00", size)))),
        grpc.StatusCode.RESOURCE_EXHAUSTED, "inputs[0].contents.uint_contents", "max_json_elements",
    ),
    "unpacked typed values": (
        lambda size: HEAD + tensor(field(3, b"\x01"), field(5, repeated(scalar(4, 0), size))),
        grpc.StatusCode.RESOURCE_EXHAUSTED, "inputs[0].contents", "max_fields",
    ),
    "nested empty entries": (
        lambda size: HEAD + tensor(field(5, repeated(field(8, b""), size))),
        grpc.StatusCode.RESOURCE_EXHAUSTED, "inputs[0].contents", "max_fields",
    ),
}  # fmt: skip


class Refusal(NamedTuple):
    code: grpc.StatusCode
    details: str
    metadata: dict[str, str]


def _refusal(error: BaseException | None) -> Refusal:
    assert isinstance(error, grpc.RpcError), error
    call = cast(grpc.Call, error)  # what grpcio raises is both
    trailing = {str(k): str(v) for k, v in call.trailing_metadata() or ()}
    return Refusal(call.code(), str(call.details()), trailing)


def refuse(channel: grpc.Channel, message: bytes) -> Refusal:
    call: Unary = channel.unary_unary(INFER)
    with pytest.raises(grpc.RpcError) as caught:
        call(message, timeout=60)
    return _refusal(caught.value)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("size", [8 * MiB, 32 * MiB])
def test_floods_are_refused_at_their_bound(
    server: GrpcServer, channel: grpc.Channel, case: str, size: int
) -> None:
    build, code, where, rule = CASES[case]
    message = build(size)
    baseline = server.http.reset_peak_rss()
    with bystanders(server):
        began = time.perf_counter()
        error = refuse(channel, message)
        seconds = time.perf_counter() - began
    grown = server.http.peak_rss() - baseline
    assert error.code == code, error
    metadata = error.metadata
    assert (metadata["tensorbits-error-field"], metadata["tensorbits-error-rule"]) == (
        where,
        rule,
    ), error.details
    assert grown < 4 * len(message) + 48 * MiB, (grown, len(message))
    print(f"{case} {len(message) / MiB:.0f} MiB: {seconds * 1e3:.0f} ms, +{grown / MiB:.0f} MiB")


def test_the_bounds_leave_room_for_every_real_request(channel: grpc.Channel) -> None:
    # The largest request a client sends within the bounds: 64 inputs and outputs, 63 parameters
    # each, rank 8 shapes; refused by the operator, never by the walk.
    request = pb.ModelInferRequest(model_name=NOT, id="x" * 256)
    for index in range(32):
        tensor = request.inputs.add(name=f"t{index}", datatype="UINT8", shape=[1] * 8)
        for key in range(MAX_PARAMETERS):
            tensor.parameters[f"key{key}"].string_param = "v" * 100
        request.outputs.add(name=f"o{index}")
    error = refuse(channel, request.SerializeToString())
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    rule = error.metadata["tensorbits-error-rule"]
    assert rule not in ("max_parameters", "max_fields", "max_rank", "unknown_field"), rule


# --- fields of a newer inference.proto: skipped, as proto3 says, and counted ------------------------

LIMITS = wire.WireLimits.of(64, 1 << 20)
# One unknown field of each wire type (numbers no message here has), and groups holding fields.
UNKNOWN: dict[str, bytes] = {
    "varint": scalar(100, 1 << 60),
    "fixed64": tag(101, wire.I64) + b"\x01" * 8,
    "length-delimited": field(102, b"a newer field's bytes"),
    "fixed32": tag(103, wire.I32) + b"\x02" * 4,
    "group": group(104, scalar(1, 5) + field(2, b"x") + group(3, tag(4, wire.I32) + b"\0" * 4)),
    "groups nested to the bound": nested_groups(wire.MAX_GROUP_DEPTH),
}


def newer_request(extra: bytes) -> tuple[bytes, pb.ModelInferRequest]:
    """A request as a client of a newer inference.proto writes it: ``extra`` (unknown fields)
    at its top, in its input, its output, each parameter's value and the typed contents; and
    the request without them. Not in a map's entry: a map's entry never gains a field (protobuf
    drops an entry that has one)."""
    known = pb.ModelInferRequest(model_name=NOT, id="newer")
    known.parameters["triton_x"].string_param = "v"
    entry = known.inputs.add(name="InputTensor", datatype="UINT8", shape=[2])
    entry.parameters["triton_y"].int64_param = 3
    entry.contents.uint_contents.extend([1, 2])
    known.outputs.add(name="OutputTensor")

    def parameters(key: bytes, value: bytes) -> bytes:
        return field(1, key) + field(2, extra + value)

    tensor = (
        field(1, b"InputTensor") + extra + field(2, b"UINT8") + field(3, b"\x02")
        + field(4, parameters(b"triton_y", scalar(2, 3)))
        + field(5, extra + field(4, b"\x01\x02"))
    )  # fmt: skip
    data = (
        extra + field(1, NOT.encode()) + field(3, b"newer") + extra
        + field(4, parameters(b"triton_x", field(3, b"v")))
        + field(5, tensor) + field(6, field(1, b"OutputTensor") + extra) + extra
    )  # fmt: skip
    return data, known


def walked(data: bytes) -> pb.ModelInferRequest:
    """``data`` split and walked as the server does, then parsed by protobuf."""
    split = wire.split_infer_request(data, LIMITS)
    wire.check_nested(split.message, LIMITS)
    message = pb.ModelInferRequest.FromString(split.message)
    message.raw_input_contents.extend(bytes(raw) for raw in split.raw_contents)
    message.DiscardUnknownFields()  # type: ignore[attr-defined]  # not in protobuf's stubs
    return message


@pytest.mark.parametrize("kind", UNKNOWN)
def test_unknown_fields_of_every_wire_type_are_skipped(kind: str) -> None:
    data, known = newer_request(UNKNOWN[kind])
    assert walked(data) == known
    parsed = pb.ModelInferRequest.FromString(data)  # protobuf skips them too
    parsed.DiscardUnknownFields()  # type: ignore[attr-defined]
    assert parsed == known


def test_an_unknown_field_is_not_kept_for_protobuf() -> None:
    # Raw contents make the split copy what protobuf parses: a large unknown field is not in it.
    data = HEAD + field(102, b"\0" * MiB) + field(7, b"\1\2")
    split = wire.split_infer_request(data, LIMITS)
    assert split.message == HEAD
    assert [bytes(raw) for raw in split.raw_contents] == [b"\1\2"]


@pytest.mark.parametrize(
    ("data", "rule"),
    [
        (HEAD + scalar(100, 0) * wire.MAX_FIELDS, "max_fields"),
        (HEAD + group(104, scalar(1, 0) * wire.MAX_FIELDS), "max_fields"),
        (HEAD + tensor(scalar(100, 0) * wire.MAX_FIELDS), "max_fields"),
        (HEAD + nested_groups(wire.MAX_GROUP_DEPTH + 1), "max_group_depth"),
        (HEAD + tag(104, wire.START_GROUP) + scalar(1, 0), "protobuf"),  # never closed
        (HEAD + tag(104, wire.START_GROUP) + tag(105, wire.END_GROUP), "protobuf"),  # not its end
        (HEAD + tag(104, wire.END_GROUP), "protobuf"),  # an end with no group open
        (HEAD + tag(104, 6), "protobuf"),  # wire types 6 and 7 do not exist
        (HEAD + tag(104, 7), "protobuf"),
        (HEAD + tag(102, wire.LEN) + wire.encode_varint(100) + b"short", "protobuf"),
        (HEAD + tag(101, wire.I64) + b"\0" * 7, "protobuf"),
    ],
    ids=[
        "unknown fields past the field bound",
        "fields in a group past the field bound",
        "unknown fields in an input past the field bound",
        "groups nested past the depth bound",
        "a group never closed",
        "a group closed by another's end",
        "an end of no group",
        "wire type 6",
        "wire type 7",
        "a length past the end",
        "a fixed64 cut short",
    ],
)
def test_unknown_fields_are_bounded_and_checked(data: bytes, rule: str) -> None:
    with pytest.raises((InvalidRequest, PayloadTooLarge)) as caught:
        walked(data)
    refused = caught.value
    assert isinstance(refused, InvalidRequest | PayloadTooLarge)
    assert refused.rule == rule, refused.message
    if rule == "max_group_depth":
        assert isinstance(refused, InvalidRequest)
        assert "malformed ModelInferRequest" in refused.message
        assert f"more than {wire.MAX_GROUP_DEPTH} deep" in refused.message
    if rule == "protobuf":  # malformed for protobuf too
        with pytest.raises(DecodeError):
            pb.ModelInferRequest.FromString(data)


@pytest.mark.parametrize("kind", UNKNOWN)
def test_a_newer_client_is_answered_as_an_older_one(channel: grpc.Channel, kind: str) -> None:
    data, known = newer_request(UNKNOWN[kind])
    call: Unary = channel.unary_unary(INFER)
    answer = pb.ModelInferResponse.FromString(call(data, timeout=60))
    assert answer == pb.ModelInferResponse.FromString(call(known.SerializeToString(), timeout=60))
    assert (answer.id, list(answer.raw_output_contents)) == ("newer", [b"\xfe\xfd"])


# --- calls that open and never send their message ------------------------------------------------

INFLIGHT = 8  # the server's inference pool: TENSORBITS_MAX_INFLIGHT_REQUESTS
READ_TIMEOUT_S = 3.0


class Stalled:
    """``count`` calls of ``method`` that open and then send nothing until ``release``."""

    def __init__(self, channel: grpc.Channel, method: str, count: int) -> None:
        self.gate = threading.Event()
        call: grpc.StreamUnaryMultiCallable[bytes, bytes] = channel.stream_unary(method)
        self.futures = [call.future(self._never(), timeout=60) for _ in range(count)]

    def _never(self) -> Iterator[bytes]:
        """No message: the call ends, once released, without one."""
        self.gate.wait(60)
        yield from ()

    def codes(self) -> list[grpc.StatusCode]:
        """Each call's status, once it ended."""
        return [_refusal(future.exception(timeout=60)).code for future in self.futures]

    def release(self) -> list[grpc.StatusCode]:
        self.gate.set()
        return self.codes()


@pytest.fixture(scope="module")
def small_server() -> Iterator[GrpcServer]:
    env = {
        "TENSORBITS_MAX_INFLIGHT_REQUESTS": str(INFLIGHT),
        "TENSORBITS_TIMEOUT_BODY_READ": str(READ_TIMEOUT_S),
    }
    with serve_grpc(env) as live:
        yield live


def _probes_answer(server: GrpcServer) -> None:
    """ServerLive, ServerReady, ModelReady and the health service answer, on a new channel."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(server.grpc_url) as probe:
        for rpc, message, reply in (
            ("ServerLive", b"", pb.ServerLiveResponse),
            ("ServerReady", b"", pb.ServerReadyResponse),
            (
                "ModelReady",
                pb.ModelReadyRequest(name=NOT).SerializeToString(),
                pb.ModelReadyResponse,
            ),
        ):
            call: Unary = probe.unary_unary(f"/inference.GRPCInferenceService/{rpc}")
            answer = reply.FromString(call(message, timeout=5))
            assert answer.ListFields()[0][1] is True, rpc
        health = health_pb2_grpc.HealthStub(probe)
        status = health.Check(health_pb2.HealthCheckRequest(), timeout=5).status  # type: ignore[attr-defined]
        assert status == health_pb2.HealthCheckResponse.SERVING
    assert server.http.get("/v2/health/live") == 200


def test_stalled_calls_never_lock_out_the_probes(small_server: GrpcServer) -> None:
    # Two connections of their own (no shared subchannel): each holds at most half the pool.
    own = [("grpc.use_local_subchannel_pool", 1)]
    with (
        grpc.insecure_channel(small_server.grpc_url, options=own) as attacker,
        grpc.insecure_channel(small_server.grpc_url, options=own) as second,
    ):
        # 80 calls: 10 times the pool, 40 on each connection.
        halves = [Stalled(channel, INFER, 5 * INFLIGHT) for channel in (attacker, second)]
        metadata = Stalled(attacker, "/inference.GRPCInferenceService/ModelConfig", 40)
        assert CONTROL_SLOTS < 40
        stalled_probes = Stalled(attacker, LIVE, 40)  # probes held open cost no capacity either
        time.sleep(0.5)  # every call opened
        with bystanders(small_server):
            for _ in range(5):
                _probes_answer(small_server)
        # A new inference call past the pool is told to come back, at once.
        with grpc.insecure_channel(small_server.grpc_url) as other:
            began = time.monotonic()
            error = refuse(other, b"")
            assert time.monotonic() - began < 2
        assert error.code == grpc.StatusCode.UNAVAILABLE, error
        assert "TENSORBITS_MAX_INFLIGHT_REQUESTS" in error.details
        infer_codes = [code for half in halves for code in half.release()]
        assert infer_codes.count(grpc.StatusCode.UNAVAILABLE) == 9 * INFLIGHT
        # The pool's calls waited for a message until the call ended without one.
        assert infer_codes.count(grpc.StatusCode.INVALID_ARGUMENT) == INFLIGHT
        control_codes = metadata.release()  # past the connection's share of the control pool
        share = connection_share(CONTROL_SLOTS)
        assert control_codes.count(grpc.StatusCode.INVALID_ARGUMENT) == share
        assert control_codes.count(grpc.StatusCode.UNAVAILABLE) == 40 - share
        assert set(stalled_probes.release()) == {grpc.StatusCode.INVALID_ARGUMENT}


def test_a_stalled_call_is_closed_at_the_read_deadline(small_server: GrpcServer) -> None:
    with grpc.insecure_channel(small_server.grpc_url) as attacker:
        stalled = Stalled(attacker, INFER, INFLIGHT // 2)  # a connection's share of the pool
        began = time.monotonic()
        codes = stalled.codes()
        waited = time.monotonic() - began
        stalled.gate.set()
    assert set(codes) == {grpc.StatusCode.DEADLINE_EXCEEDED}
    assert READ_TIMEOUT_S - 0.5 < waited < READ_TIMEOUT_S + 10
    # The slots are free again: an inference is answered.
    with grpc.insecure_channel(small_server.grpc_url) as client:
        request = pb.ModelInferRequest(model_name=NOT)
        request.inputs.add(name="InputTensor", datatype="UINT8", shape=[2])
        request.raw_input_contents.append(b"\x00\xff")
        infer: Unary = client.unary_unary(INFER)
        reply = pb.ModelInferResponse.FromString(infer(request.SerializeToString(), timeout=10))
    assert reply.raw_output_contents[0] == b"\xff\x00"


# --- metadata: the call's head, bounded as HTTP's ----------------------------------------------


@pytest.mark.parametrize("size", [70_000, 1 << 20])
def test_metadata_past_the_head_limit_is_refused(server: GrpcServer, size: int) -> None:
    """Past TENSORBITS_MAX_HEAD_BYTES (64 KiB) every time, not at random up to 1.25 times it
    (grpcio's soft limit); within it, served; the server answers the next call."""
    with grpc.insecure_channel(server.grpc_url) as probe:
        live: Unary = probe.unary_unary(LIVE)
        assert pb.ServerLiveResponse.FromString(
            live(b"", metadata=(("x-within", "a" * 60_000),), timeout=10)
        ).live
        for _ in range(5):
            with pytest.raises(grpc.RpcError) as caught:
                live(b"", metadata=(("x-big", "a" * size),), timeout=10)
            refused = _refusal(caught.value)
            assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED, refused
            assert "metadata size exceeds" in refused.details
        assert pb.ServerLiveResponse.FromString(live(b"", timeout=10)).live
