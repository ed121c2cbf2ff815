"""The structural scan of JSON documents (``jsondata.scan``/``check_structure``): what the server
counts on a request's bytes before it parses them, held to what a parser finds."""

from __future__ import annotations

import gc
import json
import string
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorbits.config.settings import Settings
from tensorbits.core.batch import BatchLimits
from tensorbits_protocol import jsondata
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge
from tensorbits_protocol.jsondata import JsonLimits, MemberLimit, check_structure, scan
from tensorbits_protocol.operators import OPERATORS

NAMES = ("dispatches", "outputs")
# Strings made of what confuses a scanner: quotes, backslashes, brackets, commas, colons, and
# the counted names themselves.
TRICKY = st.text(alphabet='"\\[]{},: ab', max_size=8) | st.sampled_from([*NAMES, '"outputs"'])
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TRICKY
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TRICKY, inner, max_size=3),
    max_leaves=20,
)
DOCUMENTS = st.dictionaries(st.sampled_from([*NAMES, "id", "x"]) | TRICKY, VALUES, max_size=5)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


@settings(max_examples=400, deadline=None)
@given(DOCUMENTS, st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " :\t")]))
def test_the_scan_finds_what_a_parser_finds(document: dict[str, Any], separators: Any) -> None:
    raw = json.dumps(document, separators=separators).encode()
    found = scan(raw, NAMES)
    assert found.depth == _depth(document)
    assert found.values == raw.count(b",") + 1 - sum(  # commas inside strings are not values
        s.count(",") for s in _strings(document)
    )
    for name in NAMES:
        value = document.get(name)
        if isinstance(value, list) and value:
            assert found.members[name] == len(value)
        elif isinstance(value, dict):
            assert found.members[name] == max(len(value), 1)  # an object's members, as a bound
        else:
            assert found.members[name] <= 1  # an empty array or a scalar: at most 1


def _widest(value: Any) -> int:
    """The most keys of any one object in ``value``."""
    if isinstance(value, list):
        return max(map(_widest, value), default=0)
    if isinstance(value, dict):
        return max([len(value), *map(_widest, value.values())])
    return 0


@settings(max_examples=300, deadline=None)
@given(DOCUMENTS, st.sampled_from([(",", ":"), (", ", ": ")]))
def test_the_scan_finds_the_widest_object(document: dict[str, Any], separators: Any) -> None:
    raw = json.dumps(document, separators=separators).encode()
    assert scan(raw, NAMES).widest == _widest(document)


@pytest.mark.parametrize("offset", range(0, 6))
def test_an_object_is_counted_across_blocks(offset: int) -> None:
    # Two objects of 70,000 keys each, one crossing the first block boundary at each offset,
    # among shallower and deeper ones: each counted whole, never the two as one.
    keys = {f"k{i}": [1, {"x": 2}] for i in range(70_000)}
    pad = "p" * ((offset * 7) % 13)
    document = {pad: {"a": 1}, "one": keys, "two": dict(keys), "three": {"b": {"c": 3}}}
    raw = json.dumps(document, separators=(",", ":")).encode()
    assert len(raw) > jsondata._SCAN_BLOCK
    assert scan(raw).widest == 70_000


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [*_strings(k), *_strings(v)]]
    return []


@pytest.mark.parametrize("text", ["a,[", 'q\\"{', "\\\\", "dispatches"])
@pytest.mark.parametrize("offset", range(0, 10))
def test_the_scan_carries_strings_and_escapes_across_blocks(offset: int, text: str) -> None:
    # A long array of strings holding structure, escaped quotes and backslashes, or a counted
    # name: its skeleton crosses the first block boundary at each offset, inside and between
    # strings; the counted members after it are still found.
    count = (jsondata._SCAN_BLOCK + offset) // 3 + 1
    document = {"id": [text] * count, "dispatches": [1, [2, 3], {"x": 4}], "outputs": [5]}
    raw = json.dumps(document, separators=(",", ":")).encode()
    found = scan(raw, NAMES)
    assert found.members == {"dispatches": 3, "outputs": 1}
    assert found.depth == 3
    assert found.values == count + 5  # commas + 1


@settings(max_examples=300, deadline=None)
@given(DOCUMENTS, st.integers(1, 9))
def test_the_scan_is_the_same_in_blocks_of_any_size(document: dict[str, Any], block: int) -> None:
    # Block boundaries fall everywhere: inside escapes, runs of backslashes, counted names.
    raw = json.dumps(document).encode()
    whole = scan(raw, NAMES)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(jsondata, "_SCAN_BLOCK", block)
        assert scan(raw, NAMES) == whole


@pytest.mark.parametrize("offset", range(0, 4))
@pytest.mark.parametrize("text", ["\\" * 5, 'a\\"b', "x" * 7])
def test_escapes_are_blanked_across_blocks(offset: int, text: str) -> None:
    # A string of backslashes and escaped quotes crossing each block boundary: the quotes left
    # are the ones that begin and end strings, wherever the blocks cut.
    raw = json.dumps(["p" * offset, text] * 20).encode()
    whole = b"".join(block for _, block in jsondata.blanked_blocks(raw))
    for size in range(1, 12):
        blocks = list(jsondata.blanked_blocks(raw, block=size))
        assert [at for at, _ in blocks] == list(range(0, len(raw), size))
        assert b"".join(block for _, block in blocks) == whole
    assert whole.count(b'"') == 4 * 20
    assert b"\\" not in whole


def test_a_long_document_is_scanned_a_block_at_a_time() -> None:
    # One long string and little structure: read a block at a time (each a few milliseconds of
    # the interpreter's lock), not transformed whole first.
    raw = json.dumps({"config": '{"a": 1}', "file": "x" * (8 * jsondata._SCAN_BLOCK)}).encode()
    assert sum(1 for _ in jsondata.scan_blocks(raw)) >= 8
    assert scan(raw).keys == 2


@pytest.mark.parametrize("doc", [b"1" * 9000, b" " * 9000, b""])
def test_a_document_of_no_structure_is_scanned(doc: bytes) -> None:
    assert scan(doc) == jsondata.Structure(0, 1, {})


LIMITS = JsonLimits(
    max_depth=8,
    max_values=10_000,
    members=(MemberLimit(("inputs", "outputs"), 4, "TENSORBITS_MAX_TENSORS", "max_tensors", "t"),),
)


def test_counts_past_a_limit_are_refused_before_parsing() -> None:
    # Past the limit (4) by more than the scan's slack (one per counted name).
    raw = json.dumps({"inputs": [{}] * 4, "outputs": [{}] * 3}).encode()
    with pytest.raises(PayloadTooLarge) as info:
        check_structure(raw, LIMITS)
    assert info.value.rule == "max_tensors"
    assert info.value.field == "inputs"


def test_at_the_edge_the_parsed_document_decides() -> None:
    # An empty array scans as one element; the exact count after parsing is what decides.
    jsondata.parse_json(json.dumps({"inputs": [], "outputs": [{}] * 4}).encode(), LIMITS)
    with pytest.raises(PayloadTooLarge):
        jsondata.parse_json(json.dumps({"inputs": [{}], "outputs": [{}] * 4}).encode(), LIMITS)


def test_depth_and_values_are_refused_on_the_bytes() -> None:
    with pytest.raises(InvalidRequest) as depth:
        check_structure(b"[" * 9 + b"]" * 9, LIMITS)
    assert depth.value.rule == "max_json_depth"
    with pytest.raises(PayloadTooLarge) as values:
        check_structure(b"[" + b"0," * 10_000 + b"0]", LIMITS)
    assert values.value.rule == "max_json_elements"


def test_strings_do_not_count() -> None:
    raw = json.dumps({"inputs": ["[,,,]" * 1000], "x": "{" * 100}).encode()
    check_structure(raw, LIMITS)  # one input, depth 2: within every limit


def test_the_largest_batch_header_the_limits_allow_fits_the_defaults() -> None:
    """TENSORBITS_MAX_BATCH_HEADER_BYTES and the header's value bound: a compact header with the
    most dispatches, each of the operator with the most tensors and parameters, names of the
    longest length, rank-8 sizes and strides of the largest values, and the most buffers."""
    settings = Settings()
    name = (string.ascii_letters * 3)[:128]
    assert len(name) == 128
    op = max(OPERATORS, key=lambda o: (len(o.inputs), len(o.parameters)))
    desc = {
        "datatype": "FLOAT16",
        "sizes": [2**32 - 1] * 8,
        "strides": [2**32 - 1] * 8,
        "total_size": 2**64 - 1,
        "alignment": 2**32 - 1,
    }
    binding = {"buffer": name, "offset": 2**64 - 1, "size": 2**64 - 1, "desc": desc}
    dispatch = {
        "operator": op.name,
        "parameters": {p.name + "x" * 100: "y" * 128 for p in op.parameters},
        "bindings": {t + "x" * (128 - len(t)): binding for t in (*op.inputs, op.output)},
    }
    header = {
        "id": "i" * 256,
        "buffers": [
            {"name": f"{i:04d}" + name[4:], "byte_size": 2**64 - 1, "init": "zeros"}
            for i in range(settings.max_buffers)
        ],
        "dispatches": [dispatch] * settings.max_dispatches,
        "outputs": [name] * settings.max_buffers,
    }
    raw = json.dumps(header, separators=(",", ":")).encode()
    assert len(raw) <= settings.max_batch_header_bytes
    check_structure(
        raw, BatchLimits.of(settings.core_limits).header, "header"
    )  # nor past the value bound


def test_a_small_batch_header_has_its_members_counted_once_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Fewer commas and brackets than MEMBERS_PARSED_BELOW: its depth and values are scanned on
    # the bytes (one JSON policy with v2), its counts are checked exactly once it is parsed; one
    # more comma and the members are counted on the bytes too.
    from tensorbits.core import batch

    limits = BatchLimits.of(Settings().core_limits).header
    scanned: list[tuple[bytes, tuple[str, ...]]] = []

    def scan_blocks(doc: bytes, names: tuple[str, ...] = ()) -> Iterator[jsondata.Structure]:
        scanned.append((doc, names))
        return iter(())

    monkeypatch.setattr(jsondata, "scan_blocks", scan_blocks)
    small = b'{"outputs": [' + b'"a",' * (batch.MEMBERS_PARSED_BELOW - 1) + b'"a"]}'
    check_structure(small, limits, "header")
    assert scanned == [(small, ())]
    large = small.replace(b"[", b'["a",', 1)
    check_structure(large, limits, "header")
    assert scanned[1:] == [(large, limits.names)]


@pytest.mark.parametrize(
    "doc",
    [
        b'{"inputs": [' + b"{}," * 1000 + b"{}]}",  # past the member limit
        b"[" * 100 + b"]" * 100 + b"," * 9000,  # too deep
        b"[" + b"0," * 20_000 + b"0]",  # too many values
    ],
)
def test_a_refusal_leaves_no_reference_cycle_holding_the_document(doc: bytes) -> None:
    # A refused body must be freed when its request ends, not at the next garbage collection.
    before = sys.getrefcount(doc)
    gc.disable()
    try:
        with pytest.raises((PayloadTooLarge, InvalidRequest)):
            check_structure(doc, LIMITS)
        assert sys.getrefcount(doc) == before
    finally:
        gc.enable()
