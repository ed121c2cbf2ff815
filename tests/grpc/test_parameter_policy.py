"""The parameter policy (``tensorbits_protocol.parameters.POLICY``), over HTTP and gRPC alike, at
every level (the request's ``parameters``, an input's, a requested output's): every key of the
table with its disposition (honoured, ignored, refused as unsupported), Triton's reserved
``triton_`` keys (ignored), and any other key (a 400 / INVALID_ARGUMENT naming the field, rule
``unknown_parameter``, with what is allowed and the closest allowed key). Each case is sent as an
HTTP request and as a ``ModelInferRequest`` to one app in process (HTTP through Starlette's
client, gRPC over a loopback channel), and both must give the same answer: the same output, or
the same refusal in the same words. Then what stock clients send (``tritonclient.http`` and
``tritonclient.grpc``, Triton's C++ client's reserved key, KServe's SDK's forms) against a real
server."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from pydantic import BaseModel
from support.framing import framed
from support.grpc_live import GrpcServer
from support.inprocess import TestClient, app_client
from support.live import free_port
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from tensorbits_protocol.errors import STATUSES
from tensorbits_protocol.infer import InferResponse
from tensorbits_protocol.parameters import (
    MAX_PARAMETERS,
    POLICY,
    RESERVED_PREFIX,
    Disposition,
    Level,
    Protocol,
    rule,
)
from tensorbits_protocol.v2 import (
    InferenceRequestParameters,
    RequestInputParameters,
    RequestOutputParameters,
)

NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
# An error code's answer on each protocol (HTTP status, gRPC code), from the one status table.
STATUS_OF = {cls.code: statuses for cls, statuses in STATUSES.items()}
INFER = "/inference.GRPCInferenceService/ModelInfer"
X = np.array([0, 1, 254, 255], np.uint8)
EXPECTED = (~X).tolist()
Value = bool | int | float | str
Parameters = Mapping[str, Value]

# A value of the type each key of the table takes, as Triton's clients send it. Every key of the
# table has one (tested), so a key added to the table is covered here at once.
SAMPLES: dict[str, Value] = {
    "binary_data_output": True,
    "sequence_id": 7,
    "sequence_start": True,
    "sequence_end": False,
    "priority": 1,
    "timeout": 1000,
    "headers": "x-request-id",
    "triton_enable_empty_final_response": True,
    "binary_data_size": X.nbytes,
    "binary_data": True,
    "shared_memory_region": "r",
    "shared_memory_byte_size": X.nbytes,
    "shared_memory_offset": 0,
    "classification": 2,
}
MODELS: dict[Level, type[BaseModel]] = {
    Level.REQUEST: InferenceRequestParameters,
    Level.INPUT: RequestInputParameters,
    Level.OUTPUT: RequestOutputParameters,
}
FIELD = {Level.REQUEST: "parameters", Level.INPUT: "inputs[0]", Level.OUTPUT: "outputs[0]"}


@dataclass(frozen=True)
class Call:
    """One BIT_NOT of ``X``, with these parameters at each level; ``output`` None: no
    ``outputs`` list (every output, by default)."""

    request: Parameters = field(default_factory=dict)
    input: Parameters = field(default_factory=dict)
    output: Parameters | None = None

    @classmethod
    def at(cls, level: Level, parameters: Parameters) -> Call:
        if level is Level.REQUEST:
            return cls(request=parameters)
        if level is Level.INPUT:
            return cls(input=parameters)
        return cls(output=parameters)


@dataclass(frozen=True)
class Answer:
    """What a protocol answered: the output's values, or the refusal's field, rule and words
    (the HTTP body's, or the gRPC details and trailing metadata)."""

    values: list[int] | None = None
    binary: bool | None = None  # HTTP only: whether the output came back as binary data
    field: str | None = None
    rule: str | None = None
    message: str | None = None
    code: str | None = None  # the error class's code: its statuses are the table's (STATUS_OF)


def over_http(client: TestClient, call: Call) -> Answer:
    tensor: dict[str, Any] = {"name": "InputTensor", "shape": [4], "datatype": "UINT8"}
    buffers: tuple[bytes, ...] = ()
    if call.input:
        tensor["parameters"] = dict(call.input)
    if "binary_data_size" in call.input:
        buffers = (X.tobytes(),)
    elif "shared_memory_region" not in call.input:
        tensor["data"] = X.tolist()
    document: dict[str, Any] = {"inputs": [tensor]}
    if call.request:
        document["parameters"] = dict(call.request)
    if call.output is not None:
        document["outputs"] = [{"name": "OutputTensor", "parameters": dict(call.output)}]
    body, headers = framed(document, *buffers)
    response = client.post(f"/v2/models/{NOT}/infer", content=body, headers=headers)
    if response.status_code != 200:
        error = response.json()
        assert response.status_code == STATUS_OF[error["code"]][0], response.text
        return Answer(
            field=error.get("field"),
            rule=error.get("rule"),
            message=error["error"],
            code=error["code"],
        )
    length = response.headers.get("Inference-Header-Content-Length")
    cut = len(response.content) if length is None else int(length)
    answer = InferResponse.from_rest(
        response.content[:cut], memoryview(response.content)[cut:], header_given=length is not None
    )
    output = answer.outputs[0]
    return Answer(values=output.array("output").tolist(), binary=output.data is None)


def set_parameters(target: Any, parameters: Parameters) -> None:
    """``parameters`` into a protobuf map of ``InferParameter``, each in the member of its type
    (as tritonclient.grpc fills them)."""
    for key, value in parameters.items():
        if isinstance(value, bool):
            target[key].bool_param = value
        elif isinstance(value, int):
            target[key].int64_param = value
        elif isinstance(value, float):
            target[key].double_param = value
        else:
            target[key].string_param = value


def grpc_request(call: Call) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=NOT)
    tensor = request.inputs.add(name="InputTensor", datatype="UINT8", shape=[4])
    set_parameters(tensor.parameters, call.input)
    if "shared_memory_region" not in call.input:
        request.raw_input_contents.append(X.tobytes())
    set_parameters(request.parameters, call.request)
    if call.output is not None:
        output = request.outputs.add(name="OutputTensor")
        set_parameters(output.parameters, call.output)
    return request


def over_grpc(channel: grpc.Channel, call: Call) -> Answer:
    infer: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(INFER)
    try:
        reply = infer(grpc_request(call).SerializeToString(), timeout=10)
    except grpc.RpcError as error:
        refusal: Any = error  # a grpc.Call too: its code, details and trailing metadata
    else:
        response = service_pb2.ModelInferResponse.FromString(reply)
        return Answer(values=np.frombuffer(response.raw_output_contents[0], np.uint8).tolist())
    metadata = dict(refusal.trailing_metadata() or ())
    code = metadata["tensorbits-error-code"]
    assert refusal.code() == grpc.StatusCode[STATUS_OF[code][1]], refusal
    return Answer(
        field=metadata.get("tensorbits-error-field"),
        rule=metadata.get("tensorbits-error-rule"),
        message=refusal.details(),
        code=code,
    )


@dataclass(frozen=True)
class Both:
    client: TestClient
    channel: grpc.Channel

    def answers(self, call: Call) -> tuple[Answer, Answer]:
        return over_http(self.client, call), over_grpc(self.channel, call)

    def same(self, call: Call) -> Answer:
        """The one answer both protocols give (``binary`` aside: gRPC has no choice)."""
        http, grpc_answer = self.answers(call)
        assert (http.values, http.field, http.rule, http.message, http.code) == (
            grpc_answer.values,
            grpc_answer.field,
            grpc_answer.rule,
            grpc_answer.message,
            grpc_answer.code,
        )
        return http


@pytest.fixture(scope="module")
def both() -> Iterator[Both]:
    port = free_port()
    with (
        app_client(grpc_port=port) as client,
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        yield Both(client, channel)


def _keys(*dispositions: tuple[Disposition, Disposition]) -> list[Any]:
    return [
        pytest.param(level, key, id=f"{level}-{key}")
        for level, keys in POLICY.items()
        for key, found in keys.items()
        if (found.http, found.grpc) in dispositions
    ]


# --- the table ----------------------------------------------------------------------------------


def test_every_key_of_the_table_is_covered_here() -> None:
    assert {key for keys in POLICY.values() for key in keys} == set(SAMPLES)


@pytest.mark.parametrize("level", list(Level))
def test_the_models_declare_exactly_the_keys_honoured_over_http(level: Level) -> None:
    # The decoders look up only the keys a model does not declare (model_extra): so each model's
    # fields must be the table's honoured keys at its level, no more, no fewer.
    honoured = {k for k, r in POLICY[level].items() if r.http is Disposition.HONOURED}
    assert set(MODELS[level].model_fields) == honoured


def test_the_reserved_prefix_is_ignored_at_every_level() -> None:
    for level in Level:
        found = rule(level, f"{RESERVED_PREFIX}anything")
        assert found is not None
        assert (found.on(Protocol.HTTP), found.on(Protocol.GRPC)) == (
            Disposition.IGNORED,
            Disposition.IGNORED,
        )
        assert rule(level, "tritonx") is None  # the prefix is "triton_", underscore included


# --- ignored: answered as if absent, on both protocols ---------------------------------------


@pytest.mark.parametrize(("level", "key"), _keys((Disposition.IGNORED, Disposition.IGNORED)))
def test_an_ignored_key_is_answered_as_without_it(both: Both, level: Level, key: str) -> None:
    assert both.same(Call.at(level, {key: SAMPLES[key]})).values == EXPECTED


@pytest.mark.parametrize("level", list(Level))
def test_a_reserved_key_is_ignored(both: Both, level: Level) -> None:
    for value in (True, 3, "x", 1.5):
        call = Call.at(level, {"triton_not_yet_invented": value})
        assert both.same(call).values == EXPECTED


def test_triton_enable_empty_final_response_with_every_reserved_request_key(both: Both) -> None:
    # What Triton's clients may send at once: the C++ client's key and the sequence, priority
    # and timeout ones tritonclient sets from its keyword arguments.
    request = {
        key: SAMPLES[key]
        for key, found in POLICY[Level.REQUEST].items()
        if found.on(Protocol.GRPC) is Disposition.IGNORED
    }
    assert "triton_enable_empty_final_response" in request
    assert both.same(Call(request=request)).values == EXPECTED


# --- honoured over HTTP, ignored over gRPC: the binary tensor data extension ----------------------


@pytest.mark.parametrize(("level", "key"), _keys((Disposition.HONOURED, Disposition.IGNORED)))
def test_binary_extension_keys_are_accepted_on_both(both: Both, level: Level, key: str) -> None:
    assert both.same(Call.at(level, {key: SAMPLES[key]})).values == EXPECTED


def test_binary_data_output_is_honoured_over_http_only(both: Both) -> None:
    for value in (True, False):
        http, grpc_answer = both.answers(Call(request={"binary_data_output": value}))
        assert http.values == grpc_answer.values == EXPECTED
        assert http.binary is value  # over gRPC, raw_output_contents either way


def test_binary_data_is_honoured_over_http_only(both: Both) -> None:
    for default in (True, False):
        call = Call(request={"binary_data_output": default}, output={"binary_data": not default})
        http, grpc_answer = both.answers(call)
        assert http.values == grpc_answer.values == EXPECTED
        assert http.binary is (not default)


def test_binary_data_size_is_honoured_over_http_only(both: Both) -> None:
    # HTTP: it says the bytes follow the JSON (over_http frames them); a size that is not the
    # shape's is refused. gRPC: the raw contents carry the bytes, with their own length, as
    # KServe's SDK sends them (binary_data_size beside raw_input_contents): the size is ignored.
    http, grpc_answer = both.answers(Call(input={"binary_data_size": X.nbytes}))
    assert http.values == grpc_answer.values == EXPECTED
    wrong = Call(input={"binary_data_size": X.nbytes + 1})
    assert over_http(both.client, wrong).rule == "binary_data_size"
    assert over_grpc(both.channel, wrong).values == EXPECTED


# --- honoured on both: the shared-memory keys, the operator's own --------------------------------


@pytest.mark.parametrize("level", [Level.INPUT, Level.OUTPUT])
def test_shared_memory_keys_reach_the_extension(both: Both, level: Level) -> None:
    # Honoured, so they go to the extension, which is off here: its refusal, not an unknown key.
    keys = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
    answer = both.same(Call.at(level, {key: SAMPLES[key] for key in keys}))
    assert answer.rule == "shared_memory"
    assert answer.message is not None
    assert "Client shared memory is disabled on this server" in answer.message


def test_the_operators_own_parameters_are_honoured(both: Both) -> None:
    assert both.same(Call(request={"feature_level": "3_0"})).values == EXPECTED
    answer = both.same(Call(request={"feature_level": "2_0"}))  # BIT_NOT is younger
    assert (answer.field, answer.rule) == ("parameters.feature_level", "feature_level")


# --- refused as unsupported ----------------------------------------------------------------------


@pytest.mark.parametrize(("level", "key"), _keys((Disposition.REFUSED, Disposition.REFUSED)))
def test_a_refused_key_is_unsupported(both: Both, level: Level, key: str) -> None:
    answer = both.same(Call.at(level, {key: SAMPLES[key]}))
    assert (answer.field, answer.rule) == (
        f"{FIELD[level]}.parameters.{key}",
        "unsupported_parameter",
    )
    assert answer.message is not None
    assert "is not supported" in answer.message


def test_classification_is_refused_in_words(both: Both) -> None:
    answer = both.same(Call(output={"classification": 2, "binary_data": True}))
    assert answer.message == (
        "output 'OutputTensor': outputs[0].parameters.classification: the classification "
        "extension is not supported (it changes what the output means, to its top classes as "
        "strings: ignoring it would answer another question)"
    )


# --- anything else: unknown ---------------------------------------------------------------------

UNKNOWN = [
    pytest.param(
        Level.REQUEST,
        "parameters.foo",
        "parameters.foo: unknown parameter for DML_OPERATOR_ELEMENT_WISE_BIT_NOT (allowed: "
        "feature_level; the protocol's: binary_data_output, sequence_id, sequence_start, "
        "sequence_end, priority, timeout, headers, triton_*)",
        id="request",
    ),
    pytest.param(
        Level.INPUT,
        "inputs[0].parameters.foo",
        "input 'InputTensor': inputs[0].parameters.foo: unknown parameter (allowed: "
        "binary_data_size, shared_memory_region, shared_memory_byte_size, shared_memory_offset, "
        "triton_*)",
        id="input",
    ),
    pytest.param(
        Level.OUTPUT,
        "outputs[0].parameters.foo",
        "output 'OutputTensor': outputs[0].parameters.foo: unknown parameter (allowed: "
        "binary_data, shared_memory_region, shared_memory_byte_size, shared_memory_offset, "
        "triton_*)",
        id="output",
    ),
]


@pytest.mark.parametrize(("level", "where", "message"), UNKNOWN)
def test_an_unknown_key_is_refused_by_name(
    both: Both, level: Level, where: str, message: str
) -> None:
    answer = both.same(Call.at(level, {"foo": 1}))
    assert (answer.field, answer.rule, answer.message) == (where, "unknown_parameter", message)


@pytest.mark.parametrize("level", [Level.INPUT, Level.OUTPUT])
def test_a_misspelt_shared_memory_key_gets_a_suggestion(both: Both, level: Level) -> None:
    answer = both.same(Call.at(level, {"shared_memory_ofset": 64}))
    assert (answer.field, answer.rule) == (
        f"{FIELD[level]}.parameters.shared_memory_ofset",
        "unknown_parameter",
    )
    assert answer.message is not None
    assert answer.message.endswith("; did you mean 'shared_memory_offset'?")


def test_a_misspelt_protocol_key_gets_a_suggestion(both: Both) -> None:
    answer = both.same(Call(request={"sequence_ids": 1}))
    assert answer.message is not None
    assert answer.message.endswith("; did you mean 'sequence_id'?")
    answer = both.same(Call(output={"binary_dat": True}))
    assert answer.message is not None
    assert answer.message.endswith("; did you mean 'binary_data'?")


def test_a_binary_key_at_the_wrong_level_is_unknown(both: Both) -> None:
    # binary_data belongs to outputs, binary_data_size to inputs, binary_data_output to the
    # request: each elsewhere is a mistake worth saying.
    assert both.same(Call(input={"binary_data": True})).rule == "unknown_parameter"
    assert both.same(Call(output={"binary_data_size": 4})).rule == "unknown_parameter"
    assert both.same(Call(input={"binary_data_output": True})).rule == "unknown_parameter"


def test_a_long_unknown_key_is_cut(both: Both) -> None:
    key = "k" * 300
    answer = both.same(Call(input={key: 1}))
    assert answer.field == f"inputs[0].parameters.{'k' * 100}"
    assert answer.message is not None
    assert "k" * 101 not in answer.message


# --- what stock clients send, against a real server ------------------------------------------------


@pytest.fixture(scope="module")
def http_client(grpc_server: GrpcServer) -> Iterator[triton_http.InferenceServerClient]:
    client = triton_http.InferenceServerClient(grpc_server.http.url)
    yield client
    client.close()


def _inputs(module: Any) -> list[Any]:
    tensor = module.InferInput("InputTensor", [4], "UINT8")
    tensor.set_data_from_numpy(X)
    return [tensor]


RESERVED_KWARGS = {
    "sequence_id": 9,
    "sequence_start": True,
    "sequence_end": True,
    "priority": 2,
    "timeout": 5_000_000,
}


@pytest.mark.integration
def test_triton_cpp_clients_reserved_key_over_grpc(
    grpc_client: triton_grpc.InferenceServerClient,
) -> None:
    # Triton's C++ client library (perf_analyzer, every C++ gRPC client) sets this on every
    # request; tritonclient.grpc refuses to send a triton_ key itself, so it goes by its stub.
    request = grpc_request(Call(request={"triton_enable_empty_final_response": True}))
    response = grpc_client._client_stub.ModelInfer(request)
    assert triton_grpc.InferResult(response).as_numpy("OutputTensor").tolist() == EXPECTED


@pytest.mark.integration
@pytest.mark.parametrize("module", [triton_grpc, triton_http], ids=["grpc", "http"])
def test_stock_clients_reserved_keywords(
    grpc_client: triton_grpc.InferenceServerClient,
    http_client: triton_http.InferenceServerClient,
    module: Any,
) -> None:
    client = grpc_client if module is triton_grpc else http_client
    outputs = [module.InferRequestedOutput("OutputTensor")]
    result = client.infer(NOT, _inputs(module), outputs=outputs, **RESERVED_KWARGS)
    assert result.as_numpy("OutputTensor").tolist() == EXPECTED
    result = client.infer(NOT, _inputs(module), parameters={"feature_level": "6_4"})
    assert result.as_numpy("OutputTensor").tolist() == EXPECTED


@pytest.mark.integration
@pytest.mark.parametrize("module", [triton_grpc, triton_http], ids=["grpc", "http"])
def test_stock_clients_classification_is_refused(
    grpc_client: triton_grpc.InferenceServerClient,
    http_client: triton_http.InferenceServerClient,
    module: Any,
) -> None:
    client = grpc_client if module is triton_grpc else http_client
    outputs = [module.InferRequestedOutput("OutputTensor", class_count=2)]
    with pytest.raises(InferenceServerException) as caught:
        client.infer(NOT, _inputs(module), outputs=outputs)
    assert "the classification extension is not supported" in str(caught.value.message())
    if module is triton_grpc:
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    else:
        assert caught.value.status() == "400"


@pytest.mark.integration
def test_kserve_sdk_grpc_form(grpc_client: triton_grpc.InferenceServerClient) -> None:
    # KServe's InferInput.set_data_from_numpy puts binary_data_size in the input's parameters,
    # and its to_grpc sends them beside the raw contents; a RequestedOutput may carry
    # binary_data. Both are the binary extension's, ignored over gRPC.
    call = Call(input={"binary_data_size": X.nbytes}, output={"binary_data": True})
    response = grpc_client._client_stub.ModelInfer(grpc_request(call))
    assert triton_grpc.InferResult(response).as_numpy("OutputTensor").tolist() == EXPECTED


@pytest.mark.integration
def test_unknown_input_key_over_grpc_names_the_field(grpc_server: GrpcServer) -> None:
    with grpc.insecure_channel(grpc_server.grpc_url) as channel:
        answer = over_grpc(channel, Call(input={"shared_memory_ofset": 0}))
    assert (answer.field, answer.rule) == (
        "inputs[0].parameters.shared_memory_ofset",
        "unknown_parameter",
    )


# --- how many: one bound per map, on both protocols ----------------------------------------------


@pytest.mark.parametrize("level", list(Level))
def test_a_map_past_its_entries_is_refused_alike(both: Both, level: Level) -> None:
    """A map near the bound passes (reserved keys, ignored; the harness adds one of its own at
    some levels); past it, a 413 / RESOURCE_EXHAUSTED naming the map, counted over HTTP on the
    parsed document (the JSON scan bounds every map together first) and over gRPC on the wire."""
    near = {f"{RESERVED_PREFIX}{i}": i for i in range(MAX_PARAMETERS - 2)}
    assert both.same(Call.at(level, near)).values == EXPECTED
    past = {f"{RESERVED_PREFIX}{i}": i for i in range(MAX_PARAMETERS + 1)}
    http = both.same(Call.at(level, past))
    assert http.code == "payload_too_large"
    where = FIELD[level] + (".parameters" if level is not Level.REQUEST else "")
    assert (http.field, http.rule) == (where, "max_parameters")
