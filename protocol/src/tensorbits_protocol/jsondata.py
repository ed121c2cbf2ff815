"""JSON documents and JSON tensor ``data``: strict parsing, and the checked conversion of
``data`` to and from NumPy arrays.

Parsing follows RFC 8259 and nothing more: UTF-8 only, no ``NaN``/``Infinity`` literals (Python's
``json`` and pydantic's parser both accept them), no duplicate object keys (which would let two
readers of one body see different requests). ``parse_json`` is the one reader of both APIs (the
v2 documents and the /v1 batch header). Before the parser runs, one pass over the bytes
bounds the nesting depth and the number of values, so a hostile document is refused before it
can exhaust the stack or memory.

Tensor data is checked in bulk (C-speed passes over the flattened list), never element by
element in Python: its nesting or length against the shape, the JSON type of every element
against the data type (integers only for integer types, ``true``/``false`` only for BOOL), and
the range of the values. FP16 has no JSON form (the protocol says so): it travels as binary.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from typing import Any, Literal

import jiter
import numpy as np

from tensorbits_protocol.dtypes import DataType, numpy_dtype
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge, TensorbitsError
from tensorbits_protocol.integers import shown

# --- parsing ------------------------------------------------------------------------------------

# Scanning works on the document's structure: brackets (``{}`` folded onto ``[]``), commas and
# colons outside strings, and a marker byte (1, 2, ...) in place of each string equal to a
# counted member's name. C-speed byte passes make it (``bytes.replace``, ``bytes.translate``),
# then NumPy runs over it, a block of the document at a time: no step holds the interpreter's
# lock for more than a block's few milliseconds, whatever the document's length.
_QUOTE, _COMMA, _COLON = ord('"'), ord(","), ord(":")
_FOLD = np.arange(256, dtype=np.uint8)
_FOLD[ord("{")], _FOLD[ord("}")] = ord("["), ord("]")
_STEP = np.zeros(256, np.int8)
_STEP[ord("[")], _STEP[ord("]")] = 1, -1
# The document is scanned this many bytes at a time: memory stays bounded (about 10 bytes per
# byte of a block) whatever its length, a limit stops the scan at the block that passes it, and
# each block's passes are short (other threads, the event loop's, run between blocks).
_SCAN_BLOCK = 1 << 20
_SMALL_DOCUMENT = 8192  # bytes: below, raw counts may spare the scan
_MAX_COUNTED = 31  # markers are the bytes 1 to 31: never structure
_MARKERS = bytes(range(1, _MAX_COUNTED + 1))
# The markers are bytes a valid document never holds outside strings, so a marker before a
# colon of depth 1 is a counted name. A hostile document holding raw control bytes is invalid
# JSON (its parser refuses it where the byte stands), and such a byte can only make the scan
# count more: never hide a counted member, which would need a byte between its name and its
# colon, where the parser stops before reading the member's value.


@dataclass(frozen=True, slots=True)
class MemberLimit:
    """A bound on the elements of top-level array members (``inputs`` + ``outputs``, say), counted
    on the raw bytes before anything is parsed."""

    names: tuple[str, ...]
    limit: int
    setting: str  # the environment variable that sets ``limit``
    rule: str
    noun: str  # what the elements are, for the message: "inputs and outputs"

    def count(self, document: object) -> int:
        """The elements of these members in a parsed document (or a request's plain dicts)."""
        if not isinstance(document, dict):
            return 0
        return sum(len(v) for n in self.names if isinstance(v := document.get(n), list))

    def refusal(self, what: str, count: int, *, exact: bool = True) -> PayloadTooLarge:
        found = (
            f"{count} {self.noun} listed" if exact else f"more than {self.limit} {self.noun} listed"
        )
        return PayloadTooLarge(
            f"{what}: {found}, more than the limit of {self.limit} ({self.setting})",
            field=self.names[0],
            rule=self.rule,
        )


@dataclass(frozen=True, slots=True)
class JsonLimits:
    """Bounds on a JSON document, checked on its bytes before it is parsed into any object: its
    length, its nesting depth, its values (array elements and object members), and the elements
    of named top-level members."""

    max_depth: int
    max_values: int
    max_bytes: int | None = None
    bytes_setting: str = ""
    members: tuple[MemberLimit, ...] = ()
    # A document of fewer raw commas and fewer brackets than this has its counted members
    # counted once it is parsed (``check_members``, exact), not on its bytes: counting them
    # doubles the scan, and what the parser builds for so few values is small. Its depth and
    # values are judged on the bytes like any other's. 0: count members on the bytes too.
    members_parsed_below: int = 0
    # The keys of every object of the document together (None: only ``max_values`` bounds them).
    # Arrays of data may be long; a document's objects are few and small, but a parser builds a
    # dict entry per key, so a flood of keys in one object costs far more than its bytes.
    max_keys: int | None = None
    keys_words: str = ""  # what ``max_keys`` and ``max_object_keys`` allow, for the refusal
    # The keys of any one object (None: unbounded but for the above): a document of many small
    # objects may have many keys in all, never one object of thousands.
    max_object_keys: int | None = None
    # Derived once (every document is checked against them): the tightest count bound.
    fewest_values: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.names) > _MAX_COUNTED or not all(n.isascii() for n in self.names):
            raise ValueError(f"at most {_MAX_COUNTED} counted member names, in ASCII")
        smallest = min((m.limit for m in self.members), default=self.max_values)
        object.__setattr__(self, "fewest_values", min(self.max_values, smallest))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for member in self.members for name in member.names)


@dataclass(frozen=True, slots=True)
class Structure:
    """What ``scan`` found so far: the nesting depth, an upper bound on the number of values
    (each value after the first of an array or object needs a comma: commas + 1), the keys of
    every object together (each needs a colon), and the elements of each counted member (exact
    for a valid document; an empty array counts 1); and the keys of the object that has the most
    (exact for a valid document)."""

    depth: int
    values: int
    members: dict[str, int]
    keys: int = 0
    widest: int = 0  # the most keys of any one object


@dataclass(slots=True)
class _Carry:
    """What one block of the scan hands the next."""

    in_string: int = 0  # 1: the last block ended inside a string
    level: int = 0  # nesting depth at the end of the last block
    owner: int = 0  # marker of the top-level member open at its end (0: an uncounted one)
    last: int = 0  # the last byte of its structure
    # Keys so far of the object open at each depth at its end (depths with none open left out).
    open_keys: dict[int, int] = field(default_factory=dict)


@lru_cache(maxsize=16)
def _deletions(count: int) -> bytes:
    """What ``translate`` deletes: all but quotes, structure and the first ``count`` markers."""
    keep = set(b'"[]{},:') | set(_MARKERS[:count])
    return bytes(sorted(set(range(256)) - keep))


def blanked_blocks(
    doc: bytes, avoid: tuple[bytes, ...] = (), block: int | None = None
) -> Iterator[tuple[int, bytes]]:
    """``doc`` a block of ``block`` (default ``_SCAN_BLOCK``) bytes at a time, each with where
    it starts and its escapes blanked: every ``\\`` pair and then every ``\"`` replaced by two
    other bytes (same length, nothing structural), so the quotes left are exactly those that
    begin or end a string. A run of backslashes pairs up from its start, as a JSON reader reads
    it, across blocks too (an unpaired one at a block's end escapes the next block's first
    byte). A block is made longer where it would cut one of ``avoid`` (a counted name between
    its quotes, which holds no quote: a string's quotes in a valid document never overlap)."""
    size = _SCAN_BLOCK if block is None else block
    length, start, escaped = len(doc), 0, False
    while start < length:
        end = min(start + size, length)
        for pattern in avoid:
            at = doc.find(pattern, max(start, end - len(pattern) + 1), end + len(pattern) - 1)
            if at != -1:
                end = max(end, at + len(pattern))
        piece = bytes(doc[start:end])
        head = b"_" if escaped else b""
        rest = piece[1:] if escaped else piece
        escaped = False
        if b"\\" in rest:
            escaped = (len(rest) - len(rest.rstrip(b"\\"))) % 2 == 1
            rest = rest.replace(b"\\\\", b"__").replace(b'\\"', b"__")
            if escaped:  # its pair is the next block's first byte: blanked as one
                rest = rest[:-1] + b"_"
        yield start, head + rest
        start = end


def _structure(skeleton: np.ndarray[Any, Any], carry: _Carry) -> np.ndarray[Any, Any]:
    """One block of the skeleton without what lies inside strings, braces folded."""
    quotes = skeleton == _QUOTE
    inside = (np.cumsum(quotes, dtype=np.int32) + carry.in_string) & 1  # counting the byte
    carry.in_string = int(inside[-1])
    structure: np.ndarray[Any, Any] = _FOLD[skeleton[(inside == 0) & ~quotes]]
    return structure


def _count_members(
    structure: np.ndarray[Any, Any], level: np.ndarray[Any, Any], carry: _Carry, n: int
) -> np.ndarray[Any, Any]:
    """Per marker, the elements of counted members within one block's ``structure``.

    A top-level member begins at a colon of depth 1, its name's marker just before it; its
    elements are that one plus each comma of depth 2 until the next member."""
    colons = np.flatnonzero((structure == _COLON) & (level == 1))
    previous = structure[np.maximum(colons - 1, 0)]
    if colons.size and colons[0] == 0:
        previous[0] = carry.last
    owners = np.where(previous <= n, previous, 0).astype(np.intp)
    commas = np.flatnonzero((structure == _COMMA) & (level == 2))
    if colons.size:
        latest = np.searchsorted(colons, commas) - 1  # -1: the member open from an earlier block
        comma_owners = np.where(latest >= 0, owners[np.maximum(latest, 0)], carry.owner)
        carry.owner = int(owners[-1])
    else:
        comma_owners = np.full(commas.size, carry.owner, np.intp)
    counts: np.ndarray[Any, Any] = np.bincount(comma_owners, minlength=n + 1)
    counts += np.bincount(owners, minlength=n + 1)
    return counts


def _widest_object(
    structure: np.ndarray[Any, Any], level: np.ndarray[Any, Any], carry: _Carry
) -> int:
    """The most keys of one object in this block's ``structure`` (its keys in earlier blocks
    counted too, ``carry.open_keys``), and what is open at its end carried on.

    A key is a colon, and a colon at depth ``d`` belongs to the object of depth ``d`` it stands
    in: two colons at depth ``d`` are keys of one object exactly when no byte between them is of
    a lower depth (the object's closing brace is, and so is whatever precedes the opening brace
    of the next one). So the keys of each object are the colons at ``d`` between two bytes of a
    lower depth: a ``searchsorted`` of each colon among those bytes names its object."""
    colons = np.flatnonzero(structure == _COLON)
    colon_depths = level[colons]
    depths = set(np.unique(colon_depths).tolist()) | set(carry.open_keys)
    widest, open_keys = 0, {}
    for depth in depths:
        lower = np.flatnonzero(level < depth)
        here = colons[colon_depths == depth]
        counts = np.bincount(np.searchsorted(lower, here), minlength=lower.size + 1)
        counts[0] += carry.open_keys.get(depth, 0)  # before any lower byte: the object goes on
        widest = max(widest, int(counts.max()))
        if counts[lower.size]:  # the object open at the block's end
            open_keys[depth] = int(counts[lower.size])
    carry.open_keys = open_keys
    return widest


def scan_blocks(doc: bytes, names: tuple[str, ...] = ()) -> Iterator[Structure]:
    """The structure of ``doc`` so far, after each block: byte passes and vectorised NumPy, no
    recursion, no per-byte or per-string Python, no object built for anything in the document.
    A malformed document may scan oddly; the parser then refuses it anyway."""
    patterns = tuple(b'"' + name.encode() + b'"' for name in names)
    deletions = _deletions(len(names))
    counts = np.zeros(len(names) + 1, np.int64)
    carry = _Carry()
    depth, values, keys, widest = 0, 1, 0, 0
    for _, piece in blanked_blocks(doc, patterns):
        # A string equal to a counted name is that name between two of the quotes left: its
        # marker. Then all but quotes, structure and markers deleted.
        for marker, pattern in enumerate(patterns, 1):
            piece = piece.replace(pattern, bytes((marker,)))
        skeleton = np.frombuffer(piece.translate(None, deletions), np.uint8)
        structure = _structure(skeleton, carry) if skeleton.size else skeleton
        if structure.size:
            level = np.cumsum(_STEP[structure], dtype=np.int32)
            level += carry.level
            carry.level = int(level[-1])
            depth = max(depth, int(level.max()))
            values += int(np.count_nonzero(structure == _COMMA))
            keys += int(np.count_nonzero(structure == _COLON))
            widest = max(widest, _widest_object(structure, level, carry))
            if names:
                counts += _count_members(structure, level, carry, len(names))
            carry.last = int(structure[-1])
        members = {name: int(counts[i]) for i, name in enumerate(names, 1)}
        yield Structure(depth, values, members, keys, widest)


def scan(doc: bytes, names: tuple[str, ...] = ()) -> Structure:
    """The structure of the whole of ``doc``."""
    found = Structure(0, 1, dict.fromkeys(names, 0))
    for found in scan_blocks(doc, names):  # noqa: B007 (the last one is the answer)
        pass
    return found


def check_length(length: int, limits: JsonLimits, what: str = "body") -> None:
    """Refuse a document of ``length`` bytes past ``limits.max_bytes`` (413)."""
    if limits.max_bytes is not None and length > limits.max_bytes:
        raise PayloadTooLarge(
            f"{what}: JSON document of {length} bytes is past the limit of {limits.max_bytes} "
            f"bytes ({limits.bytes_setting})",
            field=what,
            rule="max_header_bytes",
        )


def check_structure(doc: bytes, limits: JsonLimits, what: str = "body") -> None:
    """Refuse ``doc`` past ``limits`` (413, or 400 for depth) before anything is parsed; the scan
    stops at the block where a limit is passed, so a refusal costs in proportion to the limit."""
    check_length(len(doc), limits, what)
    counted = True  # members counted on the bytes (False: once parsed)
    # Raw counts bound the true ones from above (strings can only add brackets and commas): when
    # they are within the limits, as for every small header, the exact scan can be skipped. (A
    # larger document goes straight to the scan: three passes over it would cost a third of it.)
    if len(doc) <= _SMALL_DOCUMENT or limits.members_parsed_below:
        opens, commas = doc.count(b"[") + doc.count(b"{"), doc.count(b",")
        colons = doc.count(b":")
        few_keys = (limits.max_keys is None or colons <= limits.max_keys) and (
            limits.max_object_keys is None or colons <= limits.max_object_keys
        )
        if opens <= limits.max_depth and commas + 1 <= limits.fewest_values and few_keys:
            return
        counted = max(commas, opens) >= limits.members_parsed_below
    for found in scan_blocks(doc, limits.names if counted else ()):
        # Raised where it is made, never held in a local here: a local would tie the traceback to
        # this frame, and the frame to ``doc`` (a whole refused body), in a cycle that only the
        # garbage collector breaks (seen as a sawtooth of RSS under abusive load).
        _raise_past_limits(found, limits, what)


def check_members(document: object, limits: JsonLimits, what: str = "body") -> None:
    """The exact member counts of a parsed ``document`` against ``limits``."""
    for member in limits.members:
        count = member.count(document)
        if count > member.limit:
            raise member.refusal(what, count)


# What a document past each limit of the scan is told: a template over the count, the limit and
# the words naming the settings of the key limits.
_PAST_LIMIT = {
    "max_json_elements": "JSON document has more than {limit} values; send large tensors as "
    "binary data (TENSORBITS_MAX_JSON_ELEMENTS)",
    "max_object_keys": "a JSON object has more than {limit} keys ({keys_words})",
    "max_json_keys": "JSON document has more than {limit} keys in its objects ({keys_words})",
    "max_json_depth": "JSON nesting depth {count} exceeds the limit of {limit} "
    "(TENSORBITS_MAX_JSON_DEPTH)",
}


def _raise_past_limits(found: Structure, limits: JsonLimits, what: str) -> None:
    _refuse_past(
        PayloadTooLarge, "max_json_elements", found.values, limits.max_values, limits, what
    )
    for member in limits.members:
        # The scan counts an empty array as one element: past the limit by more than that, the
        # count is surely too many; at the edge, ``check_members`` decides on the parsed document.
        count = sum(found.members.get(name, 0) for name in member.names)
        if count > member.limit + len(member.names):
            raise member.refusal(what, count, exact=False)
    # After the members: a list of too many tensors is refused as that, though its objects'
    # keys are too many too.
    _refuse_past(
        PayloadTooLarge, "max_object_keys", found.widest, limits.max_object_keys, limits, what
    )
    _refuse_past(PayloadTooLarge, "max_json_keys", found.keys, limits.max_keys, limits, what)
    _refuse_past(InvalidRequest, "max_json_depth", found.depth, limits.max_depth, limits, what)


def _refuse_past(
    error: type[TensorbitsError],
    rule: str,
    count: int,
    limit: int | None,
    limits: JsonLimits,
    what: str,
) -> None:
    """Raises ``error`` naming ``what`` and ``rule`` where ``count`` passes ``limit`` (None: no
    limit)."""
    if limit is not None and count > limit:
        words = limits.keys_words
        message = _PAST_LIMIT[rule].format(count=count, limit=limit, keys_words=words)
        raise error(f"{what}: {message}", field=what, rule=rule)


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


# Documents up to this size are parsed by jiter; a larger one by Python's json. jiter collects an
# array's values before it builds the list of them (two pointer arrays at once), which raised the
# peak memory of a refused 8 MB JSON tensor by about 10 MB; Python's json grows its list in place.
# Past this size a parse takes milliseconds anyway, and jiter's gain is no longer what matters.
JITER_MAX_BYTES = 1 << 20


def parse_json(doc: bytes | bytearray | memoryview, limits: JsonLimits, what: str = "body") -> Any:
    """Parse one JSON document under ``limits``; every failure is a 400 (413 past a size).

    The one reader of every JSON document both APIs take, with one policy: Python's strict
    ``json`` (RFC 8259: UTF-8, no NaN/Infinity, no duplicate keys). A document of up to
    ``JITER_MAX_BYTES`` is parsed by jiter first (in Rust, duplicate keys and NaN refused as it
    reads: about twice as fast as Python's ``json`` with its duplicate-key hook); jiter accepts
    no document Python's reading refuses, and reads every one it accepts to the same values (a
    property test holds it to that), so a document it refuses is read by Python's ``json``,
    whose verdict stands: its words for a refusal, or its value where jiter is stricter (a lone
    surrogate escape such as ``"\\ud800"``)."""
    raw = bytes(doc)
    check_structure(raw, limits, what)
    document = _PYTHONS_VERDICT
    if len(raw) <= JITER_MAX_BYTES:
        with contextlib.suppress(ValueError):
            document = jiter.from_json(
                raw, allow_inf_nan=False, catch_duplicate_keys=True, cache_mode="keys"
            )
    if document is _PYTHONS_VERDICT:
        document = _decode(raw, what)
    check_members(document, limits, what)
    return document


_PYTHONS_VERDICT: Any = object()  # jiter had none: Python's json decides


def _decode(raw: bytes, what: str) -> Any:
    """Python's strict reading of ``raw``; every refusal a 400 in its words."""
    try:
        text = raw.decode("utf-8")
        return _DECODER.decode(text)
    except UnicodeDecodeError as exc:
        message = f"JSON must be UTF-8 ({exc.reason} at byte {exc.start})"
    except json.JSONDecodeError as exc:
        message = f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    except (_NotRfc8259, ValueError, RecursionError) as exc:
        # ValueError: also an integer of more than sys.get_int_max_str_digits() digits, whose
        # message would tell the client how to raise a limit of the server's interpreter.
        text = str(exc)
        if "integer string conversion" in text:
            text = f"an integer of more than {sys.get_int_max_str_digits()} digits"
        message = f"invalid JSON: {text[:200]}"
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


def _tensor_refusal(
    name: str, rule: str, message: str, direction: Direction = "input"
) -> InvalidRequest:
    """A refusal of the tensor ``name`` (its field), the message prefixed with whose it is."""
    return InvalidRequest(f"{direction} '{name}': {message}", field=name, rule=rule)


def _no_json_form(name: str, datatype: DataType, direction: Direction) -> InvalidRequest:
    way_out = "parameters.binary_data_size" if direction == "input" else "binary_data: true"
    message = f"{datatype} has no JSON representation; send it as binary data ({way_out})"
    return _tensor_refusal(name, "typed_datatype", message, direction)


_JSON_TYPE_NAMES = {dict: "an object", str: "a string", int: "a number", float: "a number",
                    bool: "a boolean", type(None): "null"}  # fmt: skip


def _flatten(name: str, shape: Sequence[int], data: object) -> list[Any]:
    """The elements of ``data``, row-major, after checking its layout against ``shape``.

    Flat (``[1, 2, 3, 4]``) or nested in the shape (``[[1, 2], [3, 4]]``), as the HTTP spec allows.
    One level at a time, with the lists of a level joined by ``itertools.chain`` (C), so the cost
    is one Python step per innermost list, not per element."""
    count = math.prod(shape)
    if not isinstance(data, list):
        raise _tensor_refusal(
            name, "data", f"data must be a JSON array, not {_JSON_TYPE_NAMES.get(type(data))}"
        )
    if not data or not isinstance(data[0], list) or len(shape) < 2:
        if len(data) != count:
            raise _tensor_refusal(
                name,
                "data_size",
                f"data has {len(data)} elements, shape {list(shape)} needs {count}",
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
                raise _tensor_refusal(
                    name,
                    "data_size",
                    f"nested data does not match shape {list(shape)}: "
                    f"dimension {axis} needs arrays of length {size}, found {got}",
                )
        level = list(chain.from_iterable(level))
    return level


def _out_of_range(name: str, datatype: DataType, value: object) -> InvalidRequest:
    return _tensor_refusal(
        name,
        "data_range",
        f"value {shown(value)} is out of range for {datatype} "
        f"(allowed: {_JSON_FORMS[datatype].allowed})",
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


def _beyond_float64(value: int | float) -> bool:
    """Whether ``value`` is an integer that float64 cannot hold (Python refuses the conversion:
    from 2^1024 - 2^970 on, where rounding would reach 2^1024)."""
    if not isinstance(value, int):
        return False
    try:
        float(value)
    except OverflowError:
        return True
    return False


def _floats(name: str, datatype: DataType, flat: list[int | float]) -> np.ndarray[Any, Any]:
    try:
        wide = np.array(flat, dtype=np.float64)
    except OverflowError:  # an integer that rounds past float64's largest finite value
        raise _out_of_range(name, datatype, next(filter(_beyond_float64, flat))) from None
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
        raise _tensor_refusal(
            name,
            "data_type",
            f"{json.dumps(bad)[:40]} is not a valid {datatype} element (allowed: {form.allowed})",
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
        raise _tensor_refusal(
            name,
            "json_nonfinite",
            "the result holds NaN or infinity, which JSON cannot represent; "
            "request it as binary data (binary_data: true)",
            "output",
        )
    flat: list[Any] = array.reshape(-1).tolist()
    return flat
