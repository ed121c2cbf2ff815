"""The /v1 batch messages in their one encoding: the request's encoder (the client's) and
decoder (the server's), and the response's encoder (the server's) and decoder (the client's).

The models of ``tensorbits_protocol.v1`` are the schema; this module reads and writes it.

Encoding the request: building the wire models for every binding and dispatch cost about 15 µs a
dispatch, half the SDK's time on a batch of 100 small dispatches. Here each dispatch is written
straight to JSON as it is added, and what repeats is written once: a description's JSON
(validated and dumped by its wire model the first time it is seen) and each name's JSON string.
The text is exactly what ``BatchRequest.model_dump_json(exclude_none=True)`` writes, and the
wire models stay the contract: whatever this fast path does not cover (a NumPy integer for an
offset, a parameter that is a float, a non-ASCII name, a name of the wrong length) goes through
the models as before, so their checks and ``ValidationError`` messages are unchanged. The tests
compare both writers on every kind of batch.

Decoding the request: the one JSON reader both APIs use (``jsondata.parse_json``: strict
RFC 8259, bounded before it is parsed), then the models' schema read into plain dicts
(``plain.dict_reader``), the planner's fast input.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any, Protocol

from pydantic import ValidationError
from pydantic_core import to_json

from tensorbits_protocol import codec
from tensorbits_protocol.dml import TensorDesc
from tensorbits_protocol.dtypes import DataType
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.jsondata import JsonLimits, parse_json
from tensorbits_protocol.plain import PlainDict, dict_reader
from tensorbits_protocol.schema_errors import at_field
from tensorbits_protocol.v1 import (
    BatchRequest,
    BatchResponse,
    BufferBinding,
    BufferDeclaration,
    Dispatch,
    TensorDescription,
)

# Values written by the fast path as JSON: exactly these types (bool before int: a bool is an int).
_LITERALS: dict[type, Callable[[Any], str]] = {bool: lambda v: "true" if v else "false", int: str}
# Types a description's fields may have for its JSON to be remembered: an int that is a bool or a
# NumPy integer compares equal to a plain int, yet its model refuses it (strict), so it must not
# find the plain int's cached text.
_INT_TYPES = frozenset({int})
_DATATYPE_TYPES = frozenset({DataType, str})
# Plain descriptions' JSON by the description object itself: ``Buffer.tensor`` hands out one
# object per distinct description, so the usual lookup costs an ``id``. Each entry holds its
# object, so that id cannot be reused while the entry exists.
_JSON_OF: dict[int, tuple[TensorDesc, str]] = {}
_JSON_OF_MAX = 4096


def tensor_description(desc: TensorDesc) -> TensorDescription:
    """The wire model of a description (pydantic's ValidationError when it breaks its schema)."""
    return TensorDescription(
        datatype=str(desc.datatype),  # type: ignore[arg-type]  # a DataTypeName
        sizes=list(desc.sizes),
        strides=None if desc.strides is None else list(desc.strides),
        total_size=desc.total_size,
        alignment=desc.alignment,
    )


def buffer_binding(binding: BindingLike) -> BufferBinding:
    """The wire model of a binding (pydantic's ValidationError when it breaks its schema)."""
    return BufferBinding(
        buffer=binding.buffer,
        offset=binding.offset,
        size=binding.size,
        desc=tensor_description(binding.desc),
    )


class BindingLike(Protocol):
    """What a binding is written from (``Binding`` in ``_batch``)."""

    @property
    def buffer(self) -> str: ...
    @property
    def desc(self) -> TensorDesc: ...
    @property
    def offset(self) -> int: ...
    @property
    def size(self) -> int | None: ...


def _lengths_json(lengths: range) -> Callable[[str], str | None]:
    @lru_cache(maxsize=4096)  # names and string values repeat across dispatches
    def plain(text: str) -> str | None:
        # ASCII only: every ASCII string is written the same by any JSON writer, and a string
        # that cannot be written at all (a lone surrogate) fails where it always did, in the
        # models. None: no plain form (the models take it).
        if text.isascii() and len(text) in lengths:
            return to_json(text).decode()
        return None

    return plain


# A name's JSON string (v1.Name: 1 to 128 characters), an operator's (v1.OperatorName), a string
# value's; None where there is no plain form. Callers check for an exact ``str`` first. A value
# may be of any length, but one longer than a name is rare: it goes through the models rather
# than into the cache.
_name_json = _lengths_json(range(1, 129))
_operator_json = _lengths_json(range(1, 257))
_string_json = _lengths_json(range(0, 257))


@lru_cache(maxsize=4096)
def _remembered_desc(desc: TensorDesc) -> str:
    return tensor_description(desc).model_dump_json(exclude_none=True)


def _plain_ints(values: object) -> bool:
    return type(values) is tuple and _INT_TYPES.issuperset(map(type, values))


def _plain_desc(desc: TensorDesc) -> bool:
    return (
        type(desc.datatype) in _DATATYPE_TYPES
        and _plain_ints(desc.sizes)
        and (desc.strides is None or _plain_ints(desc.strides))
        and (desc.total_size is None or type(desc.total_size) is int)
        and type(desc.alignment) is int
    )


def desc_json(desc: TensorDesc) -> str:
    """A description's JSON; its wire model checks it (raising as it always did)."""
    entry = _JSON_OF.get(id(desc))
    if entry is not None and entry[0] is desc:
        return entry[1]
    if not _plain_desc(desc):
        return tensor_description(desc).model_dump_json(exclude_none=True)
    text = _remembered_desc(desc)
    if len(_JSON_OF) >= _JSON_OF_MAX:
        _JSON_OF.clear()
    _JSON_OF[id(desc)] = (desc, text)
    return text


def binding_json(binding: BindingLike) -> str:
    """A binding's JSON: ``{"buffer", "offset", "size" (when given), "desc"}``."""
    buffer, offset, size = binding.buffer, binding.offset, binding.size
    name = _name_json(buffer) if type(buffer) is str else None
    if name is None or type(offset) is not int or (size is not None and type(size) is not int):
        return buffer_binding(binding).model_dump_json(exclude_none=True)
    desc = binding.desc
    entry = _JSON_OF.get(id(desc))  # desc_json's first step, inline: this runs for every binding
    described = entry[1] if entry is not None and entry[0] is desc else desc_json(desc)
    if size is None:
        return f'{{"buffer":{name},"offset":{offset},"desc":{described}}}'
    return f'{{"buffer":{name},"offset":{offset},"size":{size},"desc":{described}}}'


def _parameters_json(parameters: Mapping[str, object]) -> str | None:
    """``{"name": value, ...}`` when every name and value has the plain form; else None."""
    items = []
    for name, value in parameters.items():
        key = _name_json(name) if type(name) is str else None
        if type(value) is str:
            text = _string_json(value)
        elif type(value) in _LITERALS:
            text = _LITERALS[type(value)](value)
        else:
            text = None
        if key is None or text is None:
            return None
        items.append(f"{key}:{text}")
    return "{" + ",".join(items) + "}"


def encode_dispatch(
    operator: str, parameters: Mapping[str, object], bindings: Mapping[str, BindingLike]
) -> str | Dispatch:
    """One dispatch as JSON text, or as its wire model where it has no plain form; checked where
    the wire models checked it: each binding in order first, then the rest."""
    plain = True
    bound = []
    for name, binding in bindings.items():
        text = binding_json(binding)
        key = _name_json(name) if type(name) is str else None
        plain = plain and key is not None
        bound.append(f"{key}:{text}")
    params = _parameters_json(parameters)
    op = _operator_json(operator) if type(operator) is str else None
    if plain and params is not None and op is not None:
        return f'{{"operator":{op},"parameters":{params},"bindings":{{{",".join(bound)}}}}}'
    return Dispatch(
        operator=operator,
        parameters=dict(parameters),  # type: ignore[arg-type]  # the model checks the values
        bindings={name: buffer_binding(binding) for name, binding in bindings.items()},
    )


_DISPATCHES = '"dispatches":[]'


def encode_header(
    request_id: str | None,
    buffers: list[BufferDeclaration],
    dispatches: list[str | Dispatch],
    outputs: list[str],
) -> bytes:
    """The whole header. The model writes (and checks) everything but the dispatches, which are
    spliced into its empty list: no string before it can hold that text unescaped."""
    shell = BatchRequest(id=request_id, buffers=buffers, dispatches=[], outputs=outputs)
    head, found, tail = shell.model_dump_json(exclude_none=True).partition(_DISPATCHES)
    assert found, "BatchRequest writes its dispatches after the id and buffers"
    written = ",".join(
        d if isinstance(d, str) else d.model_dump_json(exclude_none=True) for d in dispatches
    )
    return f'{head}"dispatches":[{written}]{tail}'.encode()


# --- the request, decoded ----------------------------------------------------------------------
BATCH_REQUEST_DATA = dict_reader(BatchRequest)


def decode_request(header: bytes, limits: JsonLimits) -> PlainDict:
    """The batch header as plain dicts (``BatchRequest``'s schema, defaults filled in); malformed
    JSON or fields are a 400 naming the first bad field.

    A header the dict reader refuses is read again by the models, so the error is the
    documented one, and what the models accept is planned whatever the dict reader thought."""
    document = parse_json(header, limits, "header")
    try:
        return BATCH_REQUEST_DATA.validate_python(document)
    except ValidationError:
        pass
    try:
        request = BatchRequest.model_validate(document)
    except ValidationError as exc:
        raise at_field(exc.errors(include_url=False), BatchRequest, "header") from None
    return request.model_dump()


# --- the response -------------------------------------------------------------------------------
def encode_response(request_id: str | None, outputs: Sequence[tuple[str, int]]) -> codec.BodyLayout:
    """The response laid out before its buffers are filled: the JSON header (padded so the first
    output starts aligned, as in a v2 response), then room for each ``(name, byte_size)``."""
    document: dict[str, Any] = {} if request_id is None else {"id": request_id}
    document["outputs"] = [{"name": name, "byte_size": size} for name, size in outputs]
    return codec.BodyLayout(codec.dump_header(document), tuple(size for _, size in outputs))


def decode_response(header: bytes, tail_length: int) -> tuple[str | None, dict[str, int]]:
    """The response's id and where each output buffer starts in the tail (``codec.spans``).
    Raises InvalidRequest (or pydantic's ValidationError) when the framing is off."""
    document = BatchResponse.model_validate_json(header)
    places = codec.spans(max(output.byte_size, 0) for output in document.outputs)
    starts: dict[str, int] = {}
    for index, (output, place) in enumerate(zip(document.outputs, places, strict=True)):
        assert place is not None  # every output has a size
        if output.byte_size < 0 or place[1] > tail_length:
            raise InvalidRequest(
                f"outputs[{index}] ({output.name[:100]}): body ends short",
                field=f"outputs[{index}]",
                rule="truncated",
            )
        starts[output.name] = place[0]
    used = codec.end_of(places)
    if used != tail_length:
        raise InvalidRequest(
            f"{tail_length - used} unexpected bytes after the last output",
            field="body",
            rule="leftover",
        )
    return document.id, starts


__all__ = [
    "BATCH_REQUEST_DATA",
    "BindingLike",
    "binding_json",
    "buffer_binding",
    "decode_request",
    "decode_response",
    "desc_json",
    "encode_dispatch",
    "encode_header",
    "encode_response",
    "tensor_description",
]
