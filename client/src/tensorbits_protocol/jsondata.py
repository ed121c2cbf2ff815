"""JSON documents and JSON tensor ``data``: strict parsing, and the checked conversion of
``data`` to and from NumPy arrays.

Parsing follows RFC 8259 and nothing more: UTF-8 only, no ``NaN``/``Infinity`` literals (Python's
``json`` and pydantic's parser both accept them), no duplicate object keys (which would let two
readers of one body see different requests). Before the parser runs, one pass over the bytes
bounds the nesting depth and the number of values, so a hostile document is refused before it
can exhaust the stack or memory.

Tensor data is checked in bulk (C-speed passes over the flattened list), never element by
element in Python: its nesting or length against the shape, the JSON type of every element
against the data type (integers only for integer types, ``true``/``false`` only for BOOL), and
the range of the values. FP16 has no JSON form (the protocol says so): it travels as binary.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, Literal

import numpy as np

from tensorbits_protocol.dtypes import DataType, numpy_dtype
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge

# --- parsing ------------------------------------------------------------------------------------

# A JSON string, escapes included; unrolled so that long strings match without backtracking.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# ``bytes.translate`` tables: keep only brackets, with ``{}`` folded onto ``[]``.
_FOLD_BRACES = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_OPEN = ord("[")


@dataclass(frozen=True, slots=True)
class JsonLimits:
    """Bounds on a JSON document: nesting depth, and values (array elements and object members)."""

    max_depth: int
    max_values: int


def _scan(doc: bytes) -> tuple[int, int]:
    """The nesting depth and an upper bound on the number of values of ``doc``.

    Strings are blanked first (a ``[`` inside a string is not nesting), then only the brackets are
    kept and their running depth is summed by NumPy: C-speed passes, no recursion, no per-byte
    Python. Each value after the first of an array or object needs a comma, so commas + 1 bounds
    the values. A malformed document may scan oddly; the parser then refuses it anyway."""
    bare = _STRING.sub(b'""', doc)
    values = bare.count(b",") + 1
    brackets = np.frombuffer(bare.translate(_FOLD_BRACES, _NOT_BRACKETS), np.uint8)
    if brackets.size == 0:
        return 0, values
    steps = np.where(brackets == _OPEN, np.int32(1), np.int32(-1))
    return int(np.cumsum(steps).max()), values


class _NotRfc8259(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NotRfc8259(f"{name} is not a JSON value (RFC 8259 has no NaN or Infinity)")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        duplicate = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise _NotRfc8259(f"duplicate key {duplicate[:100]!r} in a JSON object")
    return document


# One decoder for every document: json.loads() with options builds a new one per call.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)


def parse_json(doc: bytes | bytearray | memoryview, limits: JsonLimits, what: str = "body") -> Any:
    """Parse one JSON document under ``limits``; every failure is a 400 (413 past the size)."""
    raw = bytes(doc)
    # Raw counts bound the true ones from above (strings can only add brackets and commas): when
    # they are within the limits, as for every small header, the exact scan can be skipped.
    opens, commas = raw.count(b"[") + raw.count(b"{"), raw.count(b",")
    if opens <= limits.max_depth and commas + 1 <= limits.max_values:
        depth, values = opens, commas + 1
    else:
        depth, values = _scan(raw)
    if values > limits.max_values:
        raise PayloadTooLarge(
            f"{what}: JSON document has more than {limits.max_values} values (at most "
            f"{values}); send large tensors as binary data (TENSORBITS_MAX_JSON_ELEMENTS)",
            field=what,
            rule="max_json_elements",
        )
    if depth > limits.max_depth:
        raise InvalidRequest(
            f"{what}: JSON nesting depth {depth} exceeds the limit of {limits.max_depth} "
            "(TENSORBITS_MAX_JSON_DEPTH)",
            field=what,
            rule="max_json_depth",
        )
    try:
        text = raw.decode("utf-8")
        return _DECODER.decode(text)
    except UnicodeDecodeError as exc:
        message = f"JSON must be UTF-8 ({exc.reason} at byte {exc.start})"
    except json.JSONDecodeError as exc:
        message = f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    except (_NotRfc8259, ValueError, RecursionError) as exc:
        # ValueError: also an integer of more than sys.get_int_max_str_digits() digits.
        message = f"invalid JSON: {str(exc)[:200]}"
    raise InvalidRequest(f"{what}: {message}", field=what, rule="json")


# --- tensor data --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JsonForm:
    """How one data type is written as JSON: the Python types ``json`` yields for its elements,
    and the range of values it holds."""

    types: frozenset[type]
    lo: int | float
    hi: int | float

    @property
    def allowed(self) -> str:
        if self.types == {bool}:
            return "true or false"
        if self.types == {int}:
            return f"integers {self.lo} to {self.hi}"
        return f"finite numbers within ±{self.hi:.8g}"


def _integer_form(name: str) -> JsonForm:
    info = np.iinfo(name)
    return JsonForm(frozenset({int}), int(info.min), int(info.max))


def _float_form(name: str) -> JsonForm:
    # JSON has one number type: 1 is as good an FP32 element as 1.0.
    info = np.finfo(name)
    return JsonForm(frozenset({int, float}), -float(info.max), float(info.max))


_JSON_FORMS: dict[DataType, JsonForm] = {
    DataType.BOOL: JsonForm(frozenset({bool}), 0, 1),
    **{
        t: _integer_form(numpy_dtype(t).name)
        for t in (
            DataType.UINT8, DataType.UINT16, DataType.UINT32, DataType.UINT64,
            DataType.INT8, DataType.INT16, DataType.INT32, DataType.INT64,
        )
    },
    DataType.FP32: _float_form("float32"),
    DataType.FP64: _float_form("float64"),
}  # fmt: skip


Direction = Literal["input", "output"]


def _no_json_form(name: str, datatype: DataType, direction: Direction) -> InvalidRequest:
    return InvalidRequest(
        f"{direction} '{name}': {datatype} has no JSON representation; send it as binary data "
        f"({'parameters.binary_data_size' if direction == 'input' else 'binary_data: true'})",
        field=name,
        rule="json_datatype",
    )


_JSON_TYPE_NAMES = {dict: "an object", str: "a string", int: "a number", float: "a number",
                    bool: "a boolean", type(None): "null"}  # fmt: skip


def _flatten(name: str, shape: Sequence[int], data: object) -> list[Any]:
    """The elements of ``data``, row-major, after checking its layout against ``shape``.

    Flat (``[1, 2, 3, 4]``) or nested in the shape (``[[1, 2], [3, 4]]``), as the HTTP spec allows.
    One level at a time, with the lists of a level joined by ``itertools.chain`` (C), so the cost
    is one Python step per innermost list, not per element."""
    count = math.prod(shape)
    if not isinstance(data, list):
        raise InvalidRequest(
            f"input '{name}': data must be a JSON array, not {_JSON_TYPE_NAMES.get(type(data))}",
            field=name,
            rule="data",
        )
    if not data or not isinstance(data[0], list) or len(shape) < 2:
        if len(data) != count:
            raise InvalidRequest(
                f"input '{name}': data has {len(data)} elements, shape {list(shape)} needs {count}",
                field=name,
                rule="data_size",
            )
        return data
    level: list[Any] = [data]
    for axis, size in enumerate(shape):
        for item in level:
            if not isinstance(item, list) or len(item) != size:
                got = (
                    f"length {len(item)}"
                    if isinstance(item, list)
                    else _JSON_TYPE_NAMES.get(type(item))
                )
                raise InvalidRequest(
                    f"input '{name}': nested data does not match shape {list(shape)}: "
                    f"dimension {axis} needs arrays of length {size}, found {got}",
                    field=name,
                    rule="data_size",
                )
        level = list(chain.from_iterable(level))
    return level


def _out_of_range(name: str, datatype: DataType, value: object) -> InvalidRequest:
    return InvalidRequest(
        f"input '{name}': value {value} is out of range for {datatype} "
        f"(allowed: {_JSON_FORMS[datatype].allowed})",
        field=name,
        rule="data_range",
    )


def _integers(name: str, datatype: DataType, flat: list[int]) -> np.ndarray[Any, Any]:
    lo, hi = _JSON_FORMS[datatype].lo, _JSON_FORMS[datatype].hi
    if flat:
        # Built-in min/max on a list of ints run in C, and Python ints do not overflow.
        smallest, largest = min(flat), max(flat)
        if smallest < lo:
            raise _out_of_range(name, datatype, smallest)
        if largest > hi:
            raise _out_of_range(name, datatype, largest)
    return np.array(flat, dtype=numpy_dtype(datatype))


def _floats(name: str, datatype: DataType, flat: list[int | float]) -> np.ndarray[Any, Any]:
    try:
        wide = np.array(flat, dtype=np.float64)
    except OverflowError:  # an integer beyond float64's range
        culprit = next(v for v in flat if isinstance(v, int) and abs(v) > 2**1024)
        raise _out_of_range(name, datatype, culprit) from None
    # 1e999 parses to inf; a value past FP32's range would round to inf. Both are refused: a
    # JSON number stands for a finite value.
    with np.errstate(over="ignore"):  # overflow is what the check below looks for
        array = wide.astype(numpy_dtype(datatype))
    finite = np.isfinite(array)
    if not finite.all():
        raise _out_of_range(name, datatype, wide[np.argmin(finite)])
    return array


def decode_data(
    name: str, datatype: DataType, shape: Sequence[int], data: object
) -> np.ndarray[Any, Any]:
    """A JSON ``data`` array as a C-contiguous NumPy array of ``datatype`` and ``shape``."""
    form = _JSON_FORMS.get(datatype)
    if form is None:
        raise _no_json_form(name, datatype, "input")
    flat = _flatten(name, shape, data)
    wrong = set(map(type, flat)) - form.types
    if wrong:
        bad = next(v for v in flat if type(v) in wrong)
        raise InvalidRequest(
            f"input '{name}': {json.dumps(bad)[:40]} is not a valid {datatype} element "
            f"(allowed: {form.allowed})",
            field=name,
            rule="data_type",
        )
    kind = numpy_dtype(datatype).kind
    if kind == "b":
        array = np.array(flat, dtype=np.bool_)
    elif kind == "f":
        array = _floats(name, datatype, flat)
    else:
        array = _integers(name, datatype, flat)
    return array.reshape(tuple(shape))


def require_json_form(name: str, datatype: DataType, direction: Direction) -> None:
    """Refuse, before any work, a tensor whose type has no JSON form (FP16)."""
    if datatype not in _JSON_FORMS:
        raise _no_json_form(name, datatype, direction)


def encode_data(name: str, array: np.ndarray[Any, Any]) -> list[Any]:
    """An output's elements as a flat JSON-ready list (Triton returns ``data`` flat).

    Float outputs of bit operations can hold NaN or infinity, which JSON cannot carry: that is a
    400 naming the way out (binary output), never a silently altered value."""
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise InvalidRequest(
            f"output '{name}': the result holds NaN or infinity, which JSON cannot represent; "
            "request it as binary data (binary_data: true)",
            field=name,
            rule="json_nonfinite",
        )
    flat: list[Any] = array.reshape(-1).tolist()
    return flat
