"""Shared helpers of the reliability tests: an in-process app under small limits, hostile
integers, and the property every answer must satisfy.

Run longer by hand: ``TENSORBITS_FUZZ_EXAMPLES=5000 .venv/bin/pytest tests/live -k fuzz``.
"""

from __future__ import annotations

import json
import os
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from support.inprocess import TestClient, app_client
from tensorbits_protocol.integers import INT64_MAX, INT64_MIN, UINT64_MAX

KiB = 1 << 10
MiB = 1 << 20

# Small limits, so the fuzzer reaches every bound with small inputs.
SMALL_LIMITS: dict[str, Any] = {
    "max_body_bytes": 64 * KiB,
    "max_tensor_elements": 4096,
    "max_tensors": 8,
    "max_buffers": 8,
    "max_dispatches": 8,
    "max_json_depth": 16,
    "max_json_elements": 4096,
    "max_inflight_bytes": MiB,
    "max_inflight_requests": 8,
}

FUZZ_EXAMPLES = int(os.environ.get("TENSORBITS_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)


# --- hostile integers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LongInt:
    """A JSON integer of ``digits`` digits: past 4,300 of them Python will not turn it into text
    (``json.dumps`` raises), so ``dumps`` writes it into the document as raw text."""

    digits: int
    negative: bool = False
    nines: bool = False  # 99...9 (10**digits - 1) rather than 10...0 (10**(digits - 1))

    @property
    def text(self) -> str:
        body = "9" * self.digits if self.nines else "1" + "0" * (self.digits - 1)
        return "-" + body if self.negative else body


def dumps(document: Any) -> bytes:
    """``json.dumps``, with each ``LongInt`` written as its digits."""
    texts: list[str] = []

    def placeholder(value: object) -> str:
        if not isinstance(value, LongInt):
            raise TypeError(f"{type(value).__name__} is not JSON serialisable")
        texts.append(value.text)
        return f"\x00long-int-{len(texts) - 1}\x00"

    encoded = json.dumps(document, default=placeholder)
    for index, text in enumerate(texts):
        encoded = encoded.replace(json.dumps(f"\x00long-int-{index}\x00"), text, 1)
    return encoded.encode()


# The edges of the 64-bit formats every integer field is bounded by, and just past them.
EDGES_64 = [
    INT64_MAX - 1,
    INT64_MAX,
    INT64_MAX + 1,
    UINT64_MAX - 1,
    UINT64_MAX,
    UINT64_MAX + 1,
    INT64_MIN,
    INT64_MIN + 1,
    INT64_MIN - 1,
    -UINT64_MAX,
    -(2**64),
]

# Integers no 64-bit field holds, for every integer field of both APIs.
OUTSIDE_64_BITS = [
    UINT64_MAX + 1,
    UINT64_MAX + 7,
    INT64_MIN - 1,
    -(2**64),
    10**4299,  # 4,300 digits: the longest Python writes
    LongInt(4301),
    LongInt(4301, negative=True, nines=True),
    LongInt(20000),
]
# Digits of 2**64- and 2**128-sized integers, float64's range, and around the 4,300 past which
# Python refuses to convert an integer to or from text.
LONG_DIGITS = [20, 39, 309, 310, 4299, 4300, 4301, 20000]

hostile_ints: st.SearchStrategy[int | LongInt] = st.one_of(
    st.sampled_from(EDGES_64),
    st.integers(0, 2**32).map(lambda k: 2**64 + k),
    st.integers(1, 2**32).map(lambda k: INT64_MIN - k),
    st.integers(-(2**70), -(2**63)) | st.integers(2**63, 2**70),
    st.just(10**4299),  # 4,300 digits: the longest json.dumps still writes
    st.builds(LongInt, st.sampled_from(LONG_DIGITS), negative=st.booleans(), nines=st.booleans()),
)
"""Integers at and past the edges of the 64-bit formats: 2**63 to 2**70 and their negatives,
2**64 + k, -(2**63) - k, and long ones (as ``LongInt`` past 4,300 digits)."""


def small_client(**overrides: Any) -> AbstractContextManager[TestClient]:
    """``app_client`` under ``SMALL_LIMITS`` (and ``overrides``): an exception the app lets out
    is a 500 answer, which the reliability property refuses."""
    return app_client(raise_server_exceptions=False, **{**SMALL_LIMITS, **overrides})


def assert_not_server_error(
    status: int, body: bytes, content_type: str, *, names_field: bool = False
) -> None:
    """The reliability property: a 2xx, or a 4xx whose JSON body has a string ``error`` (and,
    with ``names_field``, a string ``field``: the part of the request it is about; the router's
    404/405 for a path or method it does not serve, code ``http_error``, names none)."""
    assert status < 500, f"server error {status}: {body[:300]!r}"
    if status >= 400:
        assert content_type.startswith("application/json"), content_type
        document = json.loads(body)
        assert isinstance(document.get("error"), str), document
        assert document["error"], document
        if names_field and not (status in (404, 405) and document.get("code") == "http_error"):
            # A string, maybe empty: a tensor's errors name the tensor as the client named it.
            assert isinstance(document.get("field"), str), document
