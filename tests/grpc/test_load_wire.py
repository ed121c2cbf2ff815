"""``tensorbits.grpc.load_wire`` against protobuf itself: the walk of a ``RepositoryModelLoad``
finds what protobuf parses out of it, skips a newer inference.proto's fields as the inference
walk does (``wire``'s skip, counted against ``MAX_FIELDS``, groups to ``MAX_GROUP_DEPTH``), and
refuses what breaks a bound or the encoding."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from support.protobuf_wire import group, nested_groups, tag
from support.repository_load import load_runtime

from tensorbits.grpc import inference_pb2 as pb
from tensorbits.grpc import load_wire, wire
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge

RUNTIME = load_runtime(1 << 20)
FILE = "file:1/model.onnx"
field = wire.len_field


# One unknown field of each wire type, groups holding fields, groups nested to the bound.
UNKNOWN: dict[str, bytes] = {
    "varint": wire.varint_field(100, 1 << 60),
    "fixed64": tag(101, wire.I64) + b"\x01" * 8,
    "length-delimited": field(102, b"a newer field's bytes"),
    "fixed32": tag(103, wire.I32) + b"\x02" * 4,
    "group": group(104, wire.varint_field(1, 5) + field(2, b"x") + group(3, tag(4, 5) + b"\0" * 4)),
    "groups nested to the bound": nested_groups(wire.MAX_GROUP_DEPTH),
}


def newer_load(extra: bytes) -> tuple[bytes, pb.RepositoryModelLoadRequest]:
    """A load as a client of a newer inference.proto writes it: ``extra`` at its top and in each
    parameter's value; and the load without them."""
    known = pb.RepositoryModelLoadRequest(model_name="m")
    known.parameters["config"].string_param = "{}"
    known.parameters[FILE].bytes_param = b"\0onnx"
    data = (
        extra + field(2, b"m") + extra
        + field(3, field(1, b"config") + field(2, extra + field(3, b"{}") + extra))
        + field(3, field(1, FILE.encode()) + field(2, field(4, b"\0onnx") + extra)) + extra
    )  # fmt: skip
    return data, known


def walked(data: bytes) -> dict[str, object]:
    walk = load_wire.walk_load_request(data, RUNTIME)
    parameters = {k: load_wire.value_of(data, span) for k, span in walk.parameters.items()}
    return {"repository": walk.repository_name, "model": walk.model_name, **parameters}


@pytest.mark.parametrize("kind", UNKNOWN)
def test_unknown_fields_of_every_wire_type_are_skipped(kind: str) -> None:
    data, known = newer_load(UNKNOWN[kind])
    assert walked(data) == walked(known.SerializeToString()) == {
        "repository": "", "model": "m", "config": "{}", FILE: b"\0onnx"
    }  # fmt: skip
    parsed = pb.RepositoryModelLoadRequest.FromString(data)  # protobuf skips them too
    parsed.DiscardUnknownFields()  # type: ignore[attr-defined]  # not in protobuf's stubs
    assert parsed == known


HEAD = field(2, b"m")


@pytest.mark.parametrize(
    ("data", "field_name", "rule"),
    [
        (HEAD + wire.varint_field(100, 0) * wire.MAX_FIELDS, load_wire.MESSAGE, "max_fields"),
        (HEAD + group(104, wire.varint_field(1, 0) * wire.MAX_FIELDS), load_wire.MESSAGE,
         "max_fields"),
        (HEAD + field(3, field(1, b"config") + field(2, wire.varint_field(9, 0) * wire.MAX_FIELDS)),
         "parameters[0].value", "max_fields"),
        (HEAD + nested_groups(wire.MAX_GROUP_DEPTH + 1), load_wire.MESSAGE, "max_group_depth"),
        (HEAD + tag(104, wire.START_GROUP) + wire.varint_field(1, 0), load_wire.MESSAGE,
         "protobuf"),
        (HEAD + tag(104, wire.END_GROUP), load_wire.MESSAGE, "protobuf"),
        (HEAD + tag(104, 6), load_wire.MESSAGE, "protobuf"),
        (HEAD + tag(102, wire.LEN) + wire.encode_varint(100) + b"short", load_wire.MESSAGE,
         "protobuf"),
        (HEAD + tag(101, wire.I64) + b"\0" * 7, load_wire.MESSAGE, "protobuf"),
    ],
    ids=[
        "unknown fields past the field bound",
        "fields in a group past the field bound",
        "unknown fields in a value past the field bound",
        "groups nested past the depth bound",
        "a group never closed",
        "an end of no group",
        "wire type 6",
        "a length past the end",
        "a fixed64 cut short",
    ],
)  # fmt: skip
def test_unknown_fields_are_bounded_and_checked(data: bytes, field_name: str, rule: str) -> None:
    with pytest.raises((InvalidRequest, PayloadTooLarge)) as caught:
        load_wire.walk_load_request(data, RUNTIME)
    refused = caught.value
    assert isinstance(refused, InvalidRequest | PayloadTooLarge)
    assert (refused.field, refused.rule) == (field_name, rule), refused.message
    if rule == "protobuf":  # malformed for protobuf too, and named as the load's
        assert f"malformed {load_wire.MESSAGE}" in refused.message
        with pytest.raises(DecodeError):
            pb.RepositoryModelLoadRequest.FromString(data)


def test_a_flood_of_parameters_is_refused_at_their_bound_not_the_fields() -> None:
    entry = field(3, field(1, b"k") + field(2, b""))
    with pytest.raises(PayloadTooLarge) as caught:
        load_wire.walk_load_request(HEAD + entry * wire.MAX_FIELDS, RUNTIME)
    assert (caught.value.field, caught.value.rule) == ("parameters", "max_parameters")
