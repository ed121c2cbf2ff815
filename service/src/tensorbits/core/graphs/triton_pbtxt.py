"""``config.pbtxt``, Triton's usual form of a model's configuration (the protobuf text format of
its ``ModelConfig``), as the document a JSON configuration is, so that one set of checks
(``triton_config.read_config``, then ``check_config``) holds both forms.

The text is bounded (``MAX_CONFIG_BYTES``) before it is parsed, then parsed by protobuf's own
``text_format`` into a ``ModelConfig`` message and written as its protobuf JSON with
``json_format.MessageToDict`` (field names as written, enums by name). Proto3 JSON writes 64-bit
integers as strings (``"dims": ["-1", "4"]``): they are made numbers again here, as a Triton user
writes them in JSON, so the JSON checks stay as strict as they are. A field at its default value
(``max_batch_size: 0``, an empty ``dims``) is as if left out: protobuf does not tell them apart.

The message class. The gRPC front end's generated ``ModelConfig`` (``tensorbits.grpc``) sits above
this layer: the core imports no front end, and the repository folder's reader (which calls this)
sits below both front ends. So the schema is here, as data: the part of Triton's ``ModelConfig``
a graph model's configuration may hold (``triton_config.ACCEPTED_KEYS`` and ``IGNORED_KEYS``, an
input's and an output's ``TENSOR_KEYS``), with Triton's names and field numbers, built into a
descriptor pool of its own (no name shared with any other message of the process). A field it
lacks, whether Triton has it (``dynamic_batching``, ``optimization``) or not (a typo), is refused
as ``unsupported_config`` with protobuf's words, which name the field and its line and column,
as the JSON form refuses a key it does not take.

Refused: past ``MAX_CONFIG_BYTES`` (``PayloadTooLarge``, ``max_config_bytes``), text that is not
UTF-8 or not the text format (``text_format``), a field the schema lacks (``unsupported_config``);
every refusal names the field ``config.pbtxt``."""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Mapping
from typing import Any

from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    json_format,
    message_factory,
    text_format,
)
from google.protobuf.message import Message

from tensorbits.core.graphs.refusals import invalid
from tensorbits.core.graphs.triton_config import MAX_CONFIG_BYTES, TENSOR_KEYS, keys_taken
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge

FIELD = "config.pbtxt"
PACKAGE = "inference"  # Triton's: protobuf's messages name "inference.ModelConfig" as Triton's do
# Protobuf's message quotes the line it refused: cut to this many characters.
MAX_MESSAGE_CHARS = 300

# The enums, each value numbered by its place (as Triton numbers them).
ENUMS: Mapping[str, tuple[str, ...]] = {
    "DataType": (
        "TYPE_INVALID", "TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64",
        "TYPE_INT8", "TYPE_INT16", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32",
        "TYPE_FP64", "TYPE_STRING", "TYPE_BF16",
    ),
    "Kind": ("KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL"),  # ModelInstanceGroup.Kind
}  # fmt: skip

# The messages: (field, number, type), a type "repeated T" for a list; T a scalar, an enum above
# or a message here.
MESSAGES: Mapping[str, tuple[tuple[str, int, str], ...]] = {
    "ModelConfig": (
        ("name", 1, "string"),
        ("platform", 2, "string"),
        ("backend", 17, "string"),
        ("max_batch_size", 4, "int32"),
        ("input", 5, "repeated ModelInput"),
        ("output", 6, "repeated ModelOutput"),
        ("instance_group", 7, "repeated ModelInstanceGroup"),
    ),
    "ModelInput": (("name", 1, "string"), ("data_type", 2, "DataType"), ("dims", 4, "repeated int64")),
    "ModelOutput": (("name", 1, "string"), ("data_type", 2, "DataType"), ("dims", 3, "repeated int64")),
    "ModelInstanceGroup": (
        ("name", 1, "string"),
        ("kind", 4, "Kind"),
        ("count", 2, "int32"),
        ("gpus", 3, "repeated int32"),
        ("profile", 5, "repeated string"),
        ("passive", 7, "bool"),
        ("host_policy", 9, "string"),
    ),
}  # fmt: skip

_FIELD = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "string": _FIELD.TYPE_STRING,
    "bool": _FIELD.TYPE_BOOL,
    "int32": _FIELD.TYPE_INT32,
    "int64": _FIELD.TYPE_INT64,
}
_INT64 = frozenset(
    {
        _FIELD.TYPE_INT64,
        _FIELD.TYPE_UINT64,
        _FIELD.TYPE_SINT64,
        _FIELD.TYPE_FIXED64,
        _FIELD.TYPE_SFIXED64,
    }
)
# How protobuf's words begin to tell of a field the message lacks.
_UNKNOWN_FIELD = re.compile(r'has no field named "')


def _schema() -> descriptor_pb2.FileDescriptorProto:
    """``ENUMS`` and ``MESSAGES`` as the descriptor of one proto3 file."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="tensorbits/model_config.proto", package=PACKAGE, syntax="proto3"
    )
    for enum_name, values in ENUMS.items():
        enum = proto.enum_type.add(name=enum_name)
        for number, value in enumerate(values):
            enum.value.add(name=value, number=number)
    for message_name, fields in MESSAGES.items():
        message = proto.message_type.add(name=message_name)
        for field_name, number, kind in fields:
            repeated, _, type_name = kind.rpartition(" ")
            field = message.field.add(name=field_name, number=number)
            field.label = _FIELD.LABEL_REPEATED if repeated else _FIELD.LABEL_OPTIONAL
            if type_name in _SCALARS:
                field.type = _SCALARS[type_name]
            else:
                field.type = _FIELD.TYPE_ENUM if type_name in ENUMS else _FIELD.TYPE_MESSAGE
                field.type_name = f".{PACKAGE}.{type_name}"
    return proto


# The schema's messages, in a pool of their own; ModelConfig is what config.pbtxt holds.
MESSAGE_CLASSES = message_factory.GetMessages([_schema()], descriptor_pool.DescriptorPool())
MODEL_CONFIG = MESSAGE_CLASSES[f"{PACKAGE}.ModelConfig"]


def read_pbtxt(text: str | bytes) -> dict[str, Any]:
    """``config.pbtxt``'s text as the document its JSON form is (Triton's protobuf JSON of
    ``ModelConfig``), bounded before it is parsed; refused naming ``config.pbtxt``, the rule and
    protobuf's line:column words. Its keys, values and agreement with the file are checked as a
    JSON configuration's are (``read_config``, ``check_config``), not here."""
    # surrogatepass: a text holding a lone surrogate is refused below as not UTF-8, not raised
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if len(raw) > MAX_CONFIG_BYTES:
        raise PayloadTooLarge(
            f"{FIELD}: {len(raw)} bytes, more than the {MAX_CONFIG_BYTES} a configuration may have",
            field=FIELD,
            rule="max_config_bytes",
        )
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid(
            FIELD, "text_format", f"not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    message = MODEL_CONFIG()
    try:
        # A string's unknown escape ("\m") is only warned of by protobuf's unescaping (Python's
        # codec); Triton's parser refuses it, and so does this one. (The filter is the process's
        # while it lasts: the folder is read at start, before any request.)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            text_format.Parse(decoded, message)
    except text_format.ParseError as exc:
        raise _refusal(str(exc)) from None
    except Warning as exc:
        raise _refusal(f"in a string: {exc}") from None
    except ValueError as exc:  # an enum's number past int32 is refused by the message, unplaced
        raise _refusal(str(exc)) from None
    document = json_format.MessageToDict(message, preserving_proto_field_name=True)
    _integers(message, document)
    return document


def pbtxt_as_json(text: str | bytes) -> str:
    """``config.pbtxt``'s text as the JSON text of the same configuration (``read_pbtxt``),
    which a graph model's load reads as any JSON configuration is read, under the same bounds
    (a text can grow as JSON: ``data_type: 2`` is ``"data_type":"TYPE_UINT8"``)."""
    converted = json.dumps(read_pbtxt(text), separators=(",", ":"))
    if len(converted) > MAX_CONFIG_BYTES:
        raise PayloadTooLarge(
            f"{FIELD}: {len(converted)} bytes as JSON, more than the {MAX_CONFIG_BYTES} a "
            "configuration may have",
            field=FIELD,
            rule="max_config_bytes",
        )
    return converted


def _refusal(words: str) -> InvalidRequest:
    words = words.removesuffix(".")
    cut = words if len(words) <= MAX_MESSAGE_CHARS else words[:MAX_MESSAGE_CHARS] + "..."
    if _UNKNOWN_FIELD.search(words):
        return invalid(
            FIELD,
            "unsupported_config",
            f"{cut}: not a setting this server takes for a graph model "
            f"({keys_taken()}; an input or output takes: {', '.join(sorted(TENSOR_KEYS))})",
        )
    return invalid(FIELD, "text_format", f"not protobuf's text format of ModelConfig: {cut}")


def _integers(message: Message, document: dict[str, Any]) -> None:
    """Each 64-bit integer field of ``message``, which ``document`` (its ``MessageToDict``) holds
    as a string, made a number again, in place, at every depth."""
    for field, value in message.ListFields():
        if field.type in _INT64:
            given = document[field.name]
            document[field.name] = [int(v) for v in given] if field.is_repeated else int(given)
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
            entries = document[field.name]
            for sub, entry in zip(
                value if field.is_repeated else [value],
                entries if field.is_repeated else [entries],
                strict=True,
            ):
                _integers(sub, entry)


__all__ = ["FIELD", "MODEL_CONFIG", "pbtxt_as_json", "read_pbtxt"]
