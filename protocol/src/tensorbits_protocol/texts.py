"""The bound of a request's strings, the same on every protocol, and its one refusal.

Every string of an inference request is the caller's words, echoed or looked up, never computed
on: the model's name and version, the request's ``id``, each tensor's name and data type, each
parameter's key and string value. The server holds each to ``MAX_TEXT_BYTES`` of UTF-8, over
HTTP (the model and version of the URL's path before anything is looked up: ``check_model``;
the rest on the parsed document, before the REST model reads it: ``check_document``) and over
gRPC (on the wire, before protobuf builds the string: ``grpc/wire.py``), refused alike by
``too_long`` at the same field: ``model_name`` and ``model_version`` (gRPC's fields; HTTP's path
and body name them so too), ``id``, ``inputs[i].name``, ``inputs[i].datatype``,
``outputs[i].name``. A parameter's key and its value are named by the key (``shown_key``), as
every other parameter refusal is. A URL past ``TENSORBITS_MAX_HEAD_BYTES`` is refused before
its path is read (414).
"""

from __future__ import annotations

from collections.abc import Mapping

from tensorbits_protocol.errors import InvalidRequest

MAX_TEXT_BYTES = 4096
"""Bytes (UTF-8) of any one string of a request: a model or tensor name, a data type, the
request's ``id``, a parameter's key or string value. Every real one is under 300 (a shared-memory
region's name, the longest); Triton's clients send a request id of a few dozen."""

RULE = "max_text_bytes"
_SHOWN_KEY_CHARS = 100


def shown_key(key: str) -> str:
    """A parameter's key as a refusal's field names it: bounded, whatever the caller sent (the
    field travels in a header or trailing metadata, where it is escaped)."""
    return key if len(key) <= _SHOWN_KEY_CHARS else key[:_SHOWN_KEY_CHARS] + "..."


def too_long(field: str, nbytes: int) -> InvalidRequest:
    """The refusal of a string at ``field`` of ``nbytes`` bytes, past ``MAX_TEXT_BYTES``."""
    return InvalidRequest(
        f"{field} is {nbytes} bytes long, more than {MAX_TEXT_BYTES} (MAX_TEXT_BYTES)",
        field=field,
        rule=RULE,
    )


def utf8_length(text: str) -> int:
    """``len(text.encode())``, without encoding an ASCII string (CPython knows it is one)."""
    return len(text) if text.isascii() else len(text.encode(errors="replace"))


def check_text(field: str, text: object) -> None:
    """Refuse ``text`` at ``field`` when it is a string past ``MAX_TEXT_BYTES``."""
    if isinstance(text, str) and len(text) * 4 > MAX_TEXT_BYTES:  # else surely within
        nbytes = utf8_length(text)
        if nbytes > MAX_TEXT_BYTES:
            raise too_long(field, nbytes)


def check_model(name: str, version: str | None) -> None:
    """The model's name and version a request names outside its document (HTTP's URL path),
    held to ``MAX_TEXT_BYTES`` as gRPC's ``model_name`` and ``model_version`` are."""
    check_text("model_name", name)
    check_text("model_version", version)


def _check_parameters(at: str, parameters: object) -> None:
    if isinstance(parameters, Mapping):
        for key, value in parameters.items():
            field = f"{at}parameters.{shown_key(str(key))}"
            check_text(field, key)
            check_text(field, value)


# The strings of each kind of tensor entry, in the order of their fields on the gRPC wire.
_TENSOR_TEXTS = {"inputs": ("name", "datatype"), "outputs": ("name",)}


def check_document(document: object) -> None:
    """The strings of a parsed v2 request document (HTTP) against ``MAX_TEXT_BYTES``, in the
    order the gRPC wire meets them in a message a client wrote (the model and version, the id,
    the request's parameters, each input's name, data type and parameters, each output's name
    and parameters). What is not the document's shape is left to the REST model's refusals."""
    if not isinstance(document, Mapping):
        return
    for name in ("model_name", "model_version", "id"):
        check_text(name, document.get(name))
    _check_parameters("", document.get("parameters"))
    for items, names in _TENSOR_TEXTS.items():
        tensors = document.get(items)
        if isinstance(tensors, list):
            for index, tensor in enumerate(tensors):
                if isinstance(tensor, Mapping):
                    for name in names:
                        check_text(f"{items}[{index}].{name}", tensor.get(name))
                    _check_parameters(f"{items}[{index}].", tensor.get("parameters"))


__all__ = [
    "MAX_TEXT_BYTES",
    "RULE",
    "check_document",
    "check_model",
    "check_text",
    "shown_key",
    "too_long",
]
