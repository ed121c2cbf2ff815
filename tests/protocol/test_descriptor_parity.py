"""The rules of descriptors and parameter values (``tensorbits_protocol.descriptors``) answer alike
over HTTP and gRPC: for every rule of the table, a request that breaks it is refused with the same
error class, field, rule and words on both protocols. HTTP checks a request by the REST model
(pydantic, through ``schema_errors``), gRPC by the table on the parsed message
(``tensorbits.grpc.decode``); a shape past the rank bound is refused over gRPC by the wire walk
(``grpc/wire.py``) before the message is parsed, in the same words.

Each case is sent twice: to the real server of the suite (``wires``), and to the two decoders in
process (``InferRequest.from_rest`` and the gRPC walk and ``decode.infer_request``), so that a
difference is seen with or without a server. Every case is refused before any operator is
consulted, in the order the REST model checks a document (the first mistake is the one named)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from live.test_parity import check_refusal
from support.parity_cases import DML_NOT, NOT_X, VALUES, Infer, Pair, Refusal, infer, u8
from support.wires import (
    DOCUMENT,
    Form,
    Output,
    Refused,
    Tensor,
    Wires,
    error_class,
    grpc_message,
    http_body,
)

from tensorbits.grpc import wire
from tensorbits.grpc.decode import infer_request
from tensorbits_protocol.codec import HEADER_LENGTH
from tensorbits_protocol.descriptors import RANK_WORDS
from tensorbits_protocol.errors import InvalidRequest, TensorbitsError
from tensorbits_protocol.infer import InferRequest, RequestLimits
from tensorbits_protocol.integers import INT64_MAX, INT64_MIN
from tensorbits_protocol.jsondata import JsonLimits
from tensorbits_protocol.v2 import MAX_REGION_NAME, MAX_WIRE_RANK

LONG_REGION = "r" * (MAX_REGION_NAME + 1)
ABOUT_REGION = f"a string of {MAX_REGION_NAME + 1} characters"


def refused(field: str, rule: str, *words: str) -> Refusal:
    return Refusal(InvalidRequest, field, rule, words)


def x_with(**parameters: Any) -> Tensor:
    """BIT_NOT's input, with these parameters."""
    return Tensor("InputTensor", u8(1, 2, 3, 4), parameters=parameters)


def out_with(**parameters: Any) -> tuple[Output, ...]:
    return (Output("OutputTensor", parameters),)


def shm(**parameters: Any) -> dict[str, Any]:
    """Shared-memory parameters that break only what ``parameters`` changes."""
    return {"shared_memory_region": "r", "shared_memory_byte_size": 4, **parameters}


CASES: tuple[Infer, ...] = (
    # A data type the protocol has not (v2.Datatype): the types there are, and the closest.
    infer("datatype-lowercase", DML_NOT, Tensor("InputTensor", u8(1, 2), datatype="uint8"),
          expect=refused("inputs[0].datatype", "literal_error",
                         "Input should be 'BOOL', 'UINT8'", "(got 'uint8'; did you mean 'UINT8'?)")),
    infer("datatype-bf16", DML_NOT, Tensor("InputTensor", u8(1, 2), datatype="BF16"),
          expect=refused("inputs[0].datatype", "literal_error", "did you mean 'FP16'")),
    infer("datatype-long", DML_NOT, Tensor("InputTensor", u8(1, 2), datatype="X" * 300),
          expect=refused("inputs[0].datatype", "literal_error", "(a string of 300 characters)")),
    # A dimension out of int64's non-negative range; a shape past MAX_WIRE_RANK.
    infer("negative-dimension-inner", DML_NOT, Tensor("InputTensor", u8(1, 2), shape=(2, -3)),
          expect=refused("inputs[0].shape[1]", "greater_than_equal",
                         "Input should be greater than or equal to 0 (got -3)")),
    infer("int64-min-dimension", DML_NOT, Tensor("InputTensor", u8(1, 2), shape=(INT64_MIN,)),
          expect=refused("inputs[0].shape[0]", "greater_than_equal", f"(got {INT64_MIN})")),
    infer("rank-33", DML_NOT, Tensor("InputTensor", u8(1), shape=(1,) * (MAX_WIRE_RANK + 1)),
          expect=refused("inputs[0].shape", "max_rank", RANK_WORDS)),
    infer("rank-33-negative", DML_NOT, Tensor("InputTensor", u8(1), shape=(-1,) * 33),
          expect=refused("inputs[0].shape", "max_rank", "more than 32 dimensions")),
    # Shared-memory parameters: the region's name a bounded string, the sizes int64 and >= 0.
    infer("region-name-too-long", DML_NOT, x_with(**shm(shared_memory_region=LONG_REGION)),
          expect=refused("inputs[0].parameters.shared_memory_region", "string_too_long",
                         "input 'InputTensor': ", f"at most {MAX_REGION_NAME} characters",
                         ABOUT_REGION)),
    infer("output-region-name-too-long", DML_NOT, NOT_X,
          outputs=out_with(**shm(shared_memory_region=LONG_REGION)),
          expect=refused("outputs[0].parameters.shared_memory_region", "string_too_long",
                         "output 'OutputTensor': ", ABOUT_REGION)),
    infer("region-name-not-a-string", DML_NOT, x_with(**shm(shared_memory_region=3)),
          expect=refused("inputs[0].parameters.shared_memory_region", "string_type",
                         "Input should be a valid string (got 3)")),
    infer("byte-size-negative", DML_NOT, x_with(**shm(shared_memory_byte_size=-1)),
          expect=refused("inputs[0].parameters.shared_memory_byte_size", "greater_than_equal",
                         "(got -1)")),
    infer("byte-size-past-int64", DML_NOT, x_with(**shm(shared_memory_byte_size=INT64_MAX + 1)),
          expect=refused("inputs[0].parameters.shared_memory_byte_size", "less_than_equal",
                         f"less than or equal to {INT64_MAX} (got {INT64_MAX + 1})")),
    infer("output-byte-size-negative", DML_NOT, NOT_X,
          outputs=out_with(**shm(shared_memory_byte_size=INT64_MIN)),
          expect=refused("outputs[0].parameters.shared_memory_byte_size", "greater_than_equal",
                         f"(got {INT64_MIN})")),
    infer("offset-negative", DML_NOT, x_with(**shm(shared_memory_offset=-5)),
          expect=refused("inputs[0].parameters.shared_memory_offset", "greater_than_equal",
                         "(got -5)")),
    infer("byte-size-a-string", DML_NOT, x_with(**shm(shared_memory_byte_size="4")),
          expect=refused("inputs[0].parameters.shared_memory_byte_size", "int_type",
                         "Input should be a valid integer (got '4')")),
    infer("byte-size-a-bool", DML_NOT, x_with(**shm(shared_memory_byte_size=True)),
          expect=refused("inputs[0].parameters.shared_memory_byte_size", "int_type", "(got true)")),
    infer("byte-size-a-double", DML_NOT, x_with(**shm(shared_memory_byte_size=4.0)),
          expect=refused("inputs[0].parameters.shared_memory_byte_size", "int_type", "(got 4.0)")),
    # The binary data extension's keys: booleans, and a uint64 (ignored over gRPC, but of their
    # type on both). HTTP's binary form sets binary_data_size and binary_data_output itself:
    # those cases travel as values only.
    infer("binary-data-size-a-string", DML_NOT, x_with(binary_data_size="4"), pairs=(VALUES,),
          expect=refused("inputs[0].parameters.binary_data_size", "int_type", "(got '4')")),
    infer("binary-data-size-negative", DML_NOT, x_with(binary_data_size=-1), pairs=(VALUES,),
          expect=refused("inputs[0].parameters.binary_data_size", "greater_than_equal",
                         "(got -1)")),
    infer("binary-data-size-a-double", DML_NOT, x_with(binary_data_size=1.5), pairs=(VALUES,),
          expect=refused("inputs[0].parameters.binary_data_size", "int_type", "(got 1.5)")),
    infer("binary-data-output-a-string", DML_NOT, NOT_X, pairs=(VALUES,),
          parameters={"binary_data_output": "true"},
          expect=refused("parameters.binary_data_output", "bool_type",
                         "Input should be a valid boolean (got 'true')")),
    infer("binary-data-output-an-int", DML_NOT, NOT_X, pairs=(VALUES,),
          parameters={"binary_data_output": 1},
          expect=refused("parameters.binary_data_output", "bool_type", "(got 1)")),
    infer("binary-data-a-string", DML_NOT, NOT_X, outputs=out_with(binary_data="yes"),
          expect=refused("outputs[0].parameters.binary_data", "bool_type",
                         "output 'OutputTensor': ", "(got 'yes')")),
    infer("binary-data-a-double", DML_NOT, NOT_X, outputs=out_with(binary_data=1.0),
          expect=refused("outputs[0].parameters.binary_data", "bool_type", "(got 1.0)")),
    # Any other key takes any string, number or boolean: a reserved one is then ignored.
    infer("reserved-key-a-double", DML_NOT, x_with(triton_hint=0.5),
          parameters={"triton_weight": 1.5}, outputs=out_with(triton_other=2.5)),
    # The first mistake in the REST model's order is the one named: the request's parameters,
    # then each input's shape, data type, parameters (the table's keys in its order), then the
    # outputs'; a value's type before any key's policy.
    infer("request-parameters-first", DML_NOT,
          Tensor("InputTensor", u8(1, 2), shape=(-1,), datatype="X"), pairs=(VALUES,),
          parameters={"binary_data_output": "no"},
          expect=refused("parameters.binary_data_output", "bool_type")),
    infer("shape-before-datatype", DML_NOT,
          Tensor("InputTensor", u8(1, 2), shape=(-1,), datatype="X"),
          expect=refused("inputs[0].shape[0]", "greater_than_equal")),
    infer("datatype-before-parameters", DML_NOT,
          Tensor("InputTensor", u8(1, 2), datatype="X", parameters=shm(shared_memory_offset=-1)),
          expect=refused("inputs[0].datatype", "literal_error")),
    infer("parameters-in-the-tables-order", DML_NOT,
          x_with(bogus=1, **shm(shared_memory_offset=-3, shared_memory_byte_size=-2)),
          expect=refused("inputs[0].parameters.shared_memory_byte_size", "greater_than_equal")),
    infer("a-value-before-a-key", DML_NOT, x_with(bogus=1),
          outputs=out_with(binary_data="yes"),
          expect=refused("outputs[0].parameters.binary_data", "bool_type")),
    infer("then-the-key", DML_NOT, x_with(bogus=1), outputs=out_with(binary_data=True),
          expect=refused("inputs[0].parameters.bogus", "unknown_parameter")),
)  # fmt: skip


def params() -> list[Any]:
    return [
        pytest.param(case, pair, id=f"{case.id}-{pair.name}")
        for case in CASES
        for pair in case.pairs
    ]


@pytest.mark.integration
@pytest.mark.parametrize(("case", "pair"), params())
def test_over_both_protocols(wires: Wires, case: Infer, pair: Pair) -> None:
    over_http = wires.infer(case.request, pair.http)
    over_grpc = wires.infer(case.request, pair.grpc)
    if isinstance(case.expect, Refusal):
        check_refusal(over_http, case.expect)
        assert over_grpc == over_http
    else:
        assert not isinstance(over_http, Refused), over_http
        assert not isinstance(over_grpc, Refused), over_grpc


# --- the two decoders in process ------------------------------------------------------------

LIMITS = RequestLimits(64, 1 << 26, 1 << 20, JsonLimits(64, 1 << 21))
WIRE_LIMITS = wire.WireLimits.of(64, 1 << 20)


def _refused(error: TensorbitsError, form: Form) -> Refused:
    """A refusal as ``wires`` reads one off either protocol: class, field, rule, words."""
    return Refused(
        error_class(error.code, status=error.status_code),
        error.field,
        error.rule,
        error.message.removeprefix(DOCUMENT[form]),
    )


def decode_http(case: Infer, form: Form) -> Refused | InferRequest:
    body, headers = http_body(case.request, form)
    length = int(headers.get(HEADER_LENGTH, len(body)))
    try:
        return InferRequest.from_rest(
            body[:length],
            memoryview(body)[length:],
            model=case.request.model,
            header_given=HEADER_LENGTH in headers,
            limits=LIMITS,
        )
    except TensorbitsError as error:
        return _refused(error, form)


def decode_grpc(case: Infer, form: Form) -> Refused | InferRequest:
    """The server's steps before planning: the wire walk, protobuf's parse, the decoder."""
    data = grpc_message(case.request, form).SerializeToString()
    try:
        split = wire.split_infer_request(data, WIRE_LIMITS)
        wire.check_nested(split.message, WIRE_LIMITS)
        message = type(grpc_message(case.request, form)).FromString(split.message)
        return infer_request(message, split.raw_contents, LIMITS)
    except TensorbitsError as error:
        return _refused(error, form)


@pytest.mark.parametrize(("case", "pair"), params())
def test_by_the_decoders_in_process(case: Infer, pair: Pair) -> None:
    over_http = decode_http(case, pair.http)
    over_grpc = decode_grpc(case, pair.grpc)
    if isinstance(case.expect, Refusal):
        check_refusal(over_http, case.expect)
        assert over_grpc == over_http
    else:
        assert isinstance(over_http, InferRequest), over_http
        assert isinstance(over_grpc, InferRequest), over_grpc


def test_the_rank_bound_in_the_decoder_is_the_wire_walks() -> None:
    """A message that skipped the wire walk (one built in process) meets the same bound in the
    decoder, in the same words after the document's name."""
    case = replace(CASES[0], request=replace(CASES[0].request, inputs=(
        Tensor("InputTensor", u8(1), shape=(1,) * (MAX_WIRE_RANK + 1)),
    )))  # fmt: skip
    message = grpc_message(case.request, Form.GRPC_RAW)
    raw = [memoryview(bytes(message.raw_input_contents[0]))]
    del message.raw_input_contents[:]
    with pytest.raises(InvalidRequest) as decoded:
        infer_request(message, raw, LIMITS)
    walked = decode_grpc(case, Form.GRPC_RAW)
    assert walked == _refused(decoded.value, Form.GRPC_RAW)
    assert isinstance(walked, Refused)
    assert walked.message == f"inputs[0].shape {RANK_WORDS}"
