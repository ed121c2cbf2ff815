"""``tensorbits.grpc.wire`` against protobuf itself: the split of a request gives back exactly
what protobuf parses out of it, the response's hand-framed raw contents are what protobuf reads,
and no sequence of bytes makes the walk do anything but answer or refuse (InvalidRequest 400,
PayloadTooLarge 413)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorbits.grpc import inference_pb2 as pb
from tensorbits.grpc import wire
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge
from tensorbits_protocol.parameters import MAX_PARAMETERS

MAX_TENSORS = 8
LIMITS = wire.WireLimits.of(MAX_TENSORS, 4096)

names = st.text(max_size=12)
parameters = st.dictionaries(
    names,
    st.one_of(
        st.builds(lambda v: pb.InferParameter(bool_param=v), st.booleans()),
        st.builds(lambda v: pb.InferParameter(int64_param=v), st.integers(-(2**63), 2**63 - 1)),
        st.builds(lambda v: pb.InferParameter(string_param=v), names),
    ),
    max_size=3,
)


@st.composite
def requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(
        model_name=draw(names), model_version=draw(names), id=draw(names)
    )
    for key, value in draw(parameters).items():
        request.parameters[key].CopyFrom(value)
    for _ in range(draw(st.integers(0, MAX_TENSORS - 2))):  # inputs and outputs together
        tensor = request.inputs.add(
            name=draw(names),
            datatype=draw(st.sampled_from(["UINT8", "INT32", "FP16"])),
            shape=draw(st.lists(st.integers(0, 2**40), max_size=4)),
        )
        tensor.contents.uint_contents.extend(draw(st.lists(st.integers(0, 2**32 - 1), max_size=4)))
    for _ in range(draw(st.integers(0, 2))):
        request.outputs.add(name=draw(names))
    request.raw_input_contents.extend(draw(st.lists(st.binary(max_size=300), max_size=MAX_TENSORS)))
    return request


@settings(max_examples=300, deadline=None)
@given(requests())
def test_split_gives_back_what_protobuf_parses(request: pb.ModelInferRequest) -> None:
    data = request.SerializeToString()
    split = wire.split_infer_request(data, LIMITS)
    assert [bytes(raw) for raw in split.raw_contents] == list(request.raw_input_contents)
    rest = pb.ModelInferRequest.FromString(split.message)
    assert not rest.raw_input_contents
    rest.raw_input_contents.extend(bytes(raw) for raw in split.raw_contents)
    assert rest == request
    for raw in split.raw_contents:  # views of the received bytes, not copies
        assert raw.obj is data


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_are_answered_or_refused(data: bytes) -> None:
    try:
        split = wire.split_infer_request(data, LIMITS)
    except (InvalidRequest, PayloadTooLarge):
        return
    assert sum(raw.nbytes for raw in split.raw_contents) + len(split.message) <= len(data)


@settings(max_examples=200, deadline=None)
@given(requests(), st.integers(1, 40))
def test_truncated_messages_are_refused_as_protobuf_refuses_them(
    request: pb.ModelInferRequest, cut: int
) -> None:
    data = request.SerializeToString()[:-cut]
    try:
        pb.ModelInferRequest.FromString(data)
    except Exception:
        protobuf_refuses = True
    else:
        protobuf_refuses = False
    try:
        split = wire.split_infer_request(data, LIMITS)
        pb.ModelInferRequest.FromString(split.message)
    except Exception:  # ours (400, 413) or protobuf's DecodeError on the rest
        we_refuse = True
    else:
        we_refuse = False
    assert we_refuse == protobuf_refuses


def test_counts_are_bounded_while_walking() -> None:
    request = pb.ModelInferRequest(raw_input_contents=[b""] * (MAX_TENSORS + 1))
    with pytest.raises(PayloadTooLarge) as caught:
        wire.split_infer_request(request.SerializeToString(), LIMITS)
    assert caught.value.field == "raw_input_contents"
    request = pb.ModelInferRequest()
    for _ in range(MAX_TENSORS + 1):
        request.inputs.add(name="x")
    with pytest.raises(PayloadTooLarge) as caught:
        wire.split_infer_request(request.SerializeToString(), LIMITS)
    assert caught.value.field == "inputs"
    request = pb.ModelInferRequest()
    for index in range(MAX_PARAMETERS + 1):
        request.parameters[str(index)].bool_param = True
    with pytest.raises(PayloadTooLarge) as caught:
        wire.split_infer_request(request.SerializeToString(), LIMITS)
    assert caught.value.rule == "max_parameters"


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"\x3a\x05ab", "declares 5 bytes, 2 remain"),
        (b"\x80" * 11, "longer than 10 bytes"),
        (b"\x3a", "runs past the end"),
        (b"\x00\x00", "field number 0"),
        (b"\x0b", "wire type 3"),
        (b"\x09\x00", "has wire type 1"),
        (b"\x15\x00", "has wire type 5"),
    ],
)
def test_malformed_words(data: bytes, words: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        wire.split_infer_request(data, LIMITS)
    assert words in caught.value.message
    assert (caught.value.field, caught.value.rule) == ("ModelInferRequest", "protobuf")


@pytest.mark.parametrize("size", [0, 1, 127, 128, 300, 16384, 1 << 21])
def test_raw_field_is_protobufs_framing(size: int) -> None:
    head = pb.ModelInferResponse(model_name="m", id="i").SerializeToString()
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    data = head + wire.raw_field(wire.RAW_OUTPUT_CONTENTS, size) + payload
    response = pb.ModelInferResponse.FromString(data)
    assert list(response.raw_output_contents) == [payload]
    assert (response.model_name, response.id) == ("m", "i")


# --- the nested walk ---------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(requests())
def test_the_nested_walk_passes_what_protobuf_serializes(request: pb.ModelInferRequest) -> None:
    split = wire.split_infer_request(request.SerializeToString(), LIMITS)
    wire.check_nested(split.message, LIMITS)


def _nested_refusal(request: pb.ModelInferRequest) -> InvalidRequest | PayloadTooLarge:
    split = wire.split_infer_request(request.SerializeToString(), LIMITS)
    with pytest.raises((InvalidRequest, PayloadTooLarge)) as caught:
        wire.check_nested(split.message, LIMITS)
    assert isinstance(caught.value, InvalidRequest | PayloadTooLarge)
    return caught.value


def _one_input(**fields: object) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="UINT8", **fields)
    return request


def test_every_nested_count_is_bounded() -> None:
    request = _one_input()
    for key in range(MAX_PARAMETERS + 1):
        request.inputs[0].parameters[f"k{key}"].bool_param = True
    refused = _nested_refusal(request)
    assert (refused.field, refused.rule) == ("inputs[0].parameters", "max_parameters")

    request = pb.ModelInferRequest(model_name="m")
    request.outputs.add(name="a")
    request.outputs.add(name="b")
    for key in range(MAX_PARAMETERS + 1):
        request.outputs[1].parameters[f"k{key}"].bool_param = True
    refused = _nested_refusal(request)
    assert (refused.field, refused.rule) == ("outputs[1].parameters", "max_parameters")

    refused = _nested_refusal(_one_input(shape=[1] * 33))
    assert (refused.field, refused.rule) == ("inputs[0].shape", "max_rank")
    assert "32" in refused.message
    wire.check_nested(
        wire.split_infer_request(_one_input(shape=[1] * 32).SerializeToString(), LIMITS).message,
        LIMITS,
    )  # 32 dimensions: within the bound

    request = _one_input(shape=[4097])
    request.inputs[0].contents.uint_contents.extend([1] * 4097)  # past the 4096 of LIMITS
    refused = _nested_refusal(request)
    assert (refused.field, refused.rule) == (
        "inputs[0].contents.uint_contents",
        "max_json_elements",
    )
    assert isinstance(refused, PayloadTooLarge)


def test_values_are_counted_over_every_tensor() -> None:
    request = pb.ModelInferRequest(model_name="m")
    for index in range(2):
        tensor = request.inputs.add(name=f"x{index}", datatype="FP64", shape=[2048])
        tensor.contents.fp64_contents.extend([0.5] * 2048)
    wire.check_nested(
        wire.split_infer_request(request.SerializeToString(), LIMITS).message, LIMITS
    )  # 4096 together: the bound
    request.inputs[1].contents.fp64_contents.append(1.0)
    refused = _nested_refusal(request)
    assert refused.rule == "max_json_elements"


@pytest.mark.parametrize(
    ("build", "field", "rule"),
    [
        (lambda r: setattr(r.inputs[0], "name", "n" * 4097), "inputs[0].name", "max_text_bytes"),
        (
            lambda r: (
                r.inputs[0].parameters["k"].CopyFrom(pb.InferParameter(string_param="v" * 5000))
            ),
            "inputs[0].parameters.k",  # named by its key, as HTTP names it
            "max_text_bytes",
        ),
    ],
    ids=["a long name", "a long string value"],
)
def test_strings_are_bounded(
    build: Callable[[pb.ModelInferRequest], None], field: str, rule: str
) -> None:
    request = _one_input()
    build(request)
    refused = _nested_refusal(request)
    assert (refused.field, refused.rule) == (field, rule)


def _input_bytes(payload: bytes) -> bytes:
    """A request whose one input is ``payload`` (its fields as bytes)."""
    return b"\x0a\x01m" + wire.raw_field(5, len(payload)) + payload


@pytest.mark.parametrize(
    ("payload", "field", "rule"),
    [
        (b"\x0a\x01a\x0a\x01b", "inputs[0].name", "single_field"),
        (
            b"\x22\x0b\x0a\x01k\x12\x06\x08\x01\x10\x02\x18\x00",
            "inputs[0].parameters.k",  # named by its key, as HTTP names it
            "parameter_value",
        ),
        (b"\x2a\x03\x22\x01\x01" + b"\x2a\x00", "inputs[0].contents", "single_field"),
        (b"\x1a\x01\x80", "ModelInferRequest", "protobuf"),  # a packed varint cut short
        (b"\x2a\x03\x35\x00\x00", "ModelInferRequest", "protobuf"),  # a float cut short
    ],
    ids=[
        "a name twice",
        "two values",
        "contents twice",
        "cut varint",
        "cut float",
    ],
)
def test_nested_refusals_name_the_field(payload: bytes, field: str, rule: str) -> None:
    data = _input_bytes(payload)
    split = wire.split_infer_request(data, LIMITS)
    with pytest.raises((InvalidRequest, PayloadTooLarge)) as caught:
        wire.check_nested(split.message, LIMITS)
    refused = caught.value
    assert isinstance(refused, InvalidRequest | PayloadTooLarge)
    assert (refused.field, refused.rule) == (field, rule), refused.message


def test_the_field_budget_bounds_unpacked_values() -> None:
    values = b"\x20\x00" * (wire.MAX_FIELDS + 1)  # uint_contents, one tag per value
    data = _input_bytes(wire.raw_field(5, len(values)) + values)
    split = wire.split_infer_request(data, wire.WireLimits.of(MAX_TENSORS, 1 << 20))
    with pytest.raises(PayloadTooLarge) as caught:
        wire.check_nested(split.message, wire.WireLimits.of(MAX_TENSORS, 1 << 20))
    assert (caught.value.field, caught.value.rule) == ("inputs[0].contents", "max_fields")
    # Packed, the same values are one field.
    packed = wire.raw_field(4, wire.MAX_FIELDS + 1) + b"\x00" * (wire.MAX_FIELDS + 1)
    data = _input_bytes(wire.raw_field(5, len(packed)) + packed)
    limits = wire.WireLimits.of(MAX_TENSORS, 1 << 20)
    wire.check_nested(wire.split_infer_request(data, limits).message, limits)
