"""The bounds of a model load's request, one set for both protocols.

A load carries a graph model's file (base64 in HTTP's JSON, ``bytes_param`` over gRPC), its
configuration and a few parameters. Its whole size is bounded by one number derived from
TENSORBITS_MAX_MODEL_BYTES (``max_load_bytes``): checked from HTTP's Content-Length and while the
body is read, and on the gRPC message before anything of it is read. Inside, the parameters are
counted, and each key's and value's size checked, on the bytes (HTTP's JSON text, gRPC's wire)
before anything of them is parsed or decoded, each refusal in the same words on both protocols:
``api/load_body.py`` and ``grpc/load_wire.py`` read the two forms, this module judges them.
"""

from __future__ import annotations

from tensorbits.core.graphs.triton_config import MAX_CONFIG_BYTES
from tensorbits.model_lifecycle import CONFIG, check_file_size, check_parameter_names
from tensorbits.runtime import Runtime
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge

MAX_KEY_BYTES = 4096
"""Bytes of a parameter's key (UTF-8): a load's are ``config`` and ``file:1/model.onnx``; the
bound of every string of a gRPC message (``grpc.wire.MAX_TEXT_BYTES``)."""

JSON_ESCAPE_GROWTH = 6
"""The most bytes of JSON text one byte of a string's UTF-8 takes (``\\u0001``): a string of
more JSON text than this many times its bound is past its bound whatever its escapes."""

LOAD_ALLOWANCE_BYTES = 1 << 20
"""A load's bytes beside its file's base64: 64 keys of ``MAX_KEY_BYTES`` (256 KiB), a
configuration of ``MAX_CONFIG_BYTES`` however it is escaped (384 KiB), and the JSON or protobuf
around them."""


def max_load_bytes(max_model_bytes: int) -> int:
    """The most bytes of one load request: a file of TENSORBITS_MAX_MODEL_BYTES in base64 (HTTP
    sends it so; gRPC's raw bytes are shorter) and ``LOAD_ALLOWANCE_BYTES``."""
    return 4 * -(-max_model_bytes // 3) + LOAD_ALLOWANCE_BYTES


def load_too_large(size: int | None, bound: int) -> PayloadTooLarge:
    """The refusal of a load of ``size`` bytes (None: more than ``bound``, known while read)."""
    sent = f"more than {bound}" if size is None else str(size)
    return PayloadTooLarge(
        f"the load request is {sent} bytes, more than the {bound} a load may have (a file of "
        f"TENSORBITS_MAX_MODEL_BYTES in base64 and {LOAD_ALLOWANCE_BYTES} bytes of "
        "configuration and parameters)",
        field="load",
        rule="max_load_bytes",
    )


def check_load_size(size: int, bound: int) -> None:
    if size > bound:
        raise load_too_large(size, bound)


def key_too_long(size: int) -> InvalidRequest:
    return InvalidRequest(
        f"parameters: a key of {size} bytes, more than the {MAX_KEY_BYTES} a parameter's key "
        "may have",
        field="parameters",
        rule="max_text_bytes",
    )


def config_too_long(size: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"parameters.{CONFIG}: the configuration is {size} bytes, more than the "
        f"{MAX_CONFIG_BYTES} a configuration may have",
        field=f"parameters.{CONFIG}",
        rule="max_config_bytes",
    )


def check_parameter(runtime: Runtime, name: str, key_bytes: int, value_bytes: int) -> None:
    """One parameter, judged before its value is decoded: its key's size (``key_bytes``, checked
    before ``name`` is decoded by the caller), its name (``config`` or a file), and its value's
    size: the configuration's bytes, or the file's decoded size."""
    if key_bytes > MAX_KEY_BYTES:
        raise key_too_long(key_bytes)
    check_parameter_names([name])
    if name == CONFIG:
        if value_bytes > MAX_CONFIG_BYTES:
            raise config_too_long(value_bytes)
    else:
        check_file_size(name, value_bytes, runtime)


__all__ = [
    "JSON_ESCAPE_GROWTH",
    "LOAD_ALLOWANCE_BYTES",
    "MAX_KEY_BYTES",
    "check_load_size",
    "check_parameter",
    "config_too_long",
    "key_too_long",
    "load_too_large",
    "max_load_bytes",
]
