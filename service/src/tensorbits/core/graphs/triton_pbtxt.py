"""``config.pbtxt``, Triton's usual form of a model's configuration (the protobuf text format of
its ``ModelConfig``), as the document a JSON configuration is, so that one set of checks
(``triton_config.read_config``, then ``check_config``) holds both forms.

The text is bounded (``MAX_CONFIG_BYTES``) before it is parsed, then parsed by protobuf's own
``text_format`` into Triton's ``ModelConfig`` (``model_config_pb2``, the one schema: the whole of
``model_config.proto``, which the gRPC front end answers with too) and written as its protobuf
JSON (``triton_config.as_document``: field names as written, enums by name, 64-bit integers as
numbers, as a Triton user writes them in JSON). A field at its default value (``max_batch_size:
0``, an empty ``dims``) is as if left out: protobuf does not tell them apart. A field the schema
lacks (a typo) is refused as ``unsupported_config`` with protobuf's words, which name the field
and its line and column, and the closest field of that message.

Refused: past ``MAX_CONFIG_BYTES`` (``PayloadTooLarge``, ``max_config_bytes``), text that is not
UTF-8 or not the text format (``text_format``), a field the schema lacks (``unsupported_config``);
every refusal names the field ``config.pbtxt``. What each field of the schema does here is
``config_fields``' table, applied by ``read_config`` to both forms."""

from __future__ import annotations

import json
import re
import warnings
from typing import Any

from google.protobuf import text_format

from tensorbits.core.graphs.model_config_pb2 import DESCRIPTOR as SCHEMA
from tensorbits.core.graphs.model_config_pb2 import ModelConfig
from tensorbits.core.graphs.refusals import invalid
from tensorbits.core.graphs.triton_config import MAX_CONFIG_BYTES, as_document
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge
from tensorbits_protocol.operators import did_you_mean

FIELD = "config.pbtxt"
PACKAGE = SCHEMA.package
MODEL_CONFIG = ModelConfig
# Protobuf's message quotes the line it refused: cut to this many characters.
MAX_MESSAGE_CHARS = 300
# How protobuf's words tell of a field the message lacks: the message's type and the field.
_UNKNOWN_FIELD = re.compile(rf'"{re.escape(PACKAGE)}\.([\w.]+)" has no field named "([^"]*)"')


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
    return as_document(message)


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
    unknown = _UNKNOWN_FIELD.search(words)
    if unknown:
        message, named = unknown.groups()
        fields = _message_fields(message)
        return invalid(
            FIELD,
            "unsupported_config",
            f"{cut}: not a field of Triton's ModelConfig{did_you_mean(named, fields)}",
        )
    return invalid(FIELD, "text_format", f"not protobuf's text format of ModelConfig: {cut}")


def _message_fields(name: str) -> list[str]:
    """The fields of the schema's message ``name`` (``ModelInput``, ``ModelConfig.Foo``)."""
    parts = name.split(".")
    descriptor = SCHEMA.message_types_by_name.get(parts[0])
    for part in parts[1:]:
        descriptor = None if descriptor is None else descriptor.nested_types_by_name.get(part)
    return [] if descriptor is None else [f.name for f in descriptor.fields]


__all__ = ["FIELD", "MODEL_CONFIG", "pbtxt_as_json", "read_pbtxt"]
