"""One JSON policy for both APIs: the v2 inference document, its binary header, and the /v1
batch header are read by the same reader (``jsondata.parse_json``) and refused alike.

Two readers of one body must never see two requests (a proxy that keeps the first of two
duplicate keys and a server that keeps the last would), so every document is strict RFC 8259,
bounded on its bytes before it is parsed. Each case here is sent to the three places a JSON
document enters, and each must be refused with the same status, rule and message (but for the
name of the document: "request body", "inference header", "header").
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jiter
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorbits.config.settings import Settings
from tensorbits.server.app import create_app
from tensorbits_protocol import jsondata
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.infer import HEADER_LENGTH_HINT

HEADER = "Inference-Header-Content-Length"
MODEL = "/v2/models/DML_OPERATOR_ELEMENT_WISE_BIT_NOT/infer"

CASES = [
    pytest.param(b'{"inputs": [], "inputs": []}', "json", "duplicate key 'inputs'", id="dup"),
    pytest.param(b'{"a": {"b": 1, "b": 2}}', "json", "duplicate key 'b'", id="dup-nested"),
    pytest.param(b'{"a": NaN}', "json", "NaN is not a JSON value", id="nan"),
    pytest.param(b'{"a": [-Infinity]}', "json", "-Infinity is not a JSON value", id="inf"),
    pytest.param(b'{"a": 1' + b"0" * 5000 + b"}", "json", "more than 4300 digits", id="huge-int"),
    pytest.param(b'{"a": "\xff"}', "json", "JSON must be UTF-8", id="utf8"),
    pytest.param(b'{"a": tru}', "json", "malformed JSON", id="syntax"),
    pytest.param(b"[" * 40 + b"]" * 40, "max_json_depth", "nesting depth 40", id="depth"),
    pytest.param(b"[" * 5000 + b"]" * 5000, "max_json_depth", "nesting depth 5000", id="depth-5k"),
]


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(backend="numpy", cpu_threads=1, max_json_depth=32)
    with TestClient(create_app(settings)) as c:
        yield c


def refusals(client: TestClient, document: bytes) -> dict[str, dict[str, str]]:
    """The error body of each place a JSON document enters, for ``document``."""
    framed = {HEADER: str(len(document))}
    answers = {
        "request body": client.post(MODEL, content=document),
        "inference header": client.post(MODEL, content=document, headers=framed),
        "header": client.post("/v1/batch", content=document, headers=framed),
    }
    bodies = {}
    for what, response in answers.items():
        assert response.status_code == 400, (what, response.text)
        bodies[what] = response.json()
    return bodies


@pytest.mark.parametrize(("document", "rule", "phrase"), CASES)
def test_both_apis_refuse_a_document_alike(
    client: TestClient, document: bytes, rule: str, phrase: str
) -> None:
    bodies = refusals(client, document)
    messages = set()
    for what, body in bodies.items():
        assert body["rule"] == rule, (what, body)
        assert body["field"] == what, (what, body)
        assert body["error"].startswith(f"{what}: "), (what, body)
        # A whole v2 body that is not JSON is also told about the header length it may lack.
        message = body["error"].removeprefix(f"{what}: ")
        messages.add(
            message.removesuffix(HEADER_LENGTH_HINT) if what == "request body" else message
        )
    (message,) = messages  # one policy, one message
    assert phrase in message


def test_the_batch_header_keeps_no_duplicate_the_old_reader_took() -> None:
    # pydantic's own JSON parser, which read the /v1 header before, keeps the last of duplicate
    # keys: this header would have run with byte_size 4.
    header = (
        b'{"buffers": [{"name": "a", "byte_size": 8, "byte_size": 4}], '
        b'"dispatches": [], "outputs": ["a"]}'
    )
    with TestClient(create_app(Settings(backend="numpy", cpu_threads=1))) as client:
        reply = client.post(
            "/v1/batch", content=header + bytes(4), headers={HEADER: str(len(header))}
        )
    assert reply.status_code == 400
    assert reply.json()["error"] == (
        "header: invalid JSON: duplicate key 'byte_size' in a JSON object"
    )


# --- the reader against Python's json -------------------------------------------------------------
LIMITS = jsondata.JsonLimits(max_depth=64, max_values=10_000)  # never reached here
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=values, cut=st.integers(0, 64), junk=st.binary(max_size=3))
def test_the_reader_accepts_what_pythons_strict_json_accepts(
    value: object, cut: int, junk: bytes
) -> None:
    # A valid document and a mangled one: the reader (jiter first) gives Python's strict json's
    # verdict on every one, value for value, with the same words for a refusal.
    raw = json.dumps(value).encode()
    for document in (raw, raw[: len(raw) - cut] + junk):
        expected = _python_reading(document)
        got = _reading(document)
        assert got == expected or (got != got and expected != expected), document


@pytest.mark.parametrize(
    "document",
    [b'["\\ud800"]', b'{"a": "\\udc00x"}', b'["\\ud83d\\ude00"]', b'{"a": 1' + b"0" * 4299 + b"}"],
    ids=["lone-high", "lone-low", "pair", "4300-digits"],
)
def test_where_jiter_is_stricter_pythons_json_decides(document: bytes) -> None:
    got = _reading(document)
    assert got == _python_reading(document)
    assert not isinstance(got, tuple)  # accepted


def test_a_large_document_is_read_by_pythons_json_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # Past JITER_MAX_BYTES jiter is not asked (its peak memory on a long array is higher).
    calls: list[int] = []
    # jsondata calls jiter.from_json through the module, so patching the module reaches it.
    monkeypatch.setattr(jiter, "from_json", lambda raw, **_: calls.append(len(raw)))
    large = b"[" + b"1," * (jsondata.JITER_MAX_BYTES // 2) + b"1]"
    assert len(jsondata.parse_json(large, jsondata.JsonLimits(4, 10**6))) > 1000
    assert calls == []


def _reading(raw: bytes) -> Any:
    """The reader's value, or its refusal: (rule, message)."""
    try:
        return jsondata.parse_json(raw, LIMITS)
    except InvalidRequest as exc:
        return (exc.rule, exc.message)


def _python_reading(raw: bytes) -> Any:
    """Python's strict reading, or its refusal: (rule, message)."""
    try:
        return jsondata._decode(raw, "body")
    except InvalidRequest as exc:
        return (exc.rule, exc.message)
