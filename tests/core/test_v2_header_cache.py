"""The v2 header cache (header_cache.HeaderCache): a repeated all-binary header is planned once,
and nothing but the plan is remembered: every request computes on its own bytes, and anything
that differs (model, body length, JSON data, a failed check) takes the full path."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from core.bitref import assert_bits_equal
from support.framing import HEADER, framed
from support.inprocess import TestClient
from support.planes import data_plane
from support.v2 import NOT, binary_input, error_of, json_input, output_array, v2_client

from tensorbits.api import rest_infer
from tensorbits.config.settings import Settings
from tensorbits.core import header_cache
from tensorbits.core.header_cache import HeaderCache
from tensorbits.core.plan import PlanTemplate
from tensorbits_protocol.operators import get_operator

XOR = "onnx.BitwiseXor-18"


def _cache(client: TestClient) -> HeaderCache[Any]:
    cache = client.app.state.runtime.plane.plans  # type: ignore[attr-defined]
    assert isinstance(cache, HeaderCache)
    return cache


def _post(client: TestClient, model: str, header: dict[str, Any], *buffers: bytes) -> Any:
    body, headers = framed(header, *buffers)
    return client.post(f"/v2/models/{model}/infer", content=body, headers=headers)


def _xor_header(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> dict[str, Any]:
    return {
        "id": "same-every-time",
        "inputs": [binary_input("A", a), binary_input("B", b)],
        "outputs": [{"name": "C", "parameters": {"binary_data": True}}],
    }


def test_a_repeated_header_is_planned_once_and_computes_on_each_bodys_bytes() -> None:
    rng = np.random.default_rng(7)
    with v2_client() as client:
        cache = _cache(client)
        for _ in range(5):
            a = rng.integers(0, 2**32, (3, 4), dtype=np.uint32)
            b = rng.integers(0, 2**32, (3, 4), dtype=np.uint32)
            response = _post(client, XOR, _xor_header(a, b), a.tobytes(), b.tobytes())
            assert_bits_equal(output_array(response), a ^ b)
            assert HEADER in response.headers  # binary output, as the header asked
            assert len(cache) == 1
        assert '"id":"same-every-time"' in response.content.decode("latin-1")


def test_inputs_listed_in_another_order_than_the_operators_are_placed_by_name() -> None:
    a = np.arange(8, dtype=np.uint8)
    b = np.full(8, 0x0F, np.uint8)
    header = {"inputs": [binary_input("B", b), binary_input("A", a)]}
    with v2_client() as client:
        for _ in range(3):  # first planned, then from the cache
            response = _post(client, XOR, header, b.tobytes(), a.tobytes())
            assert_bits_equal(output_array(response), a ^ b)
        assert len(_cache(client)) == 1


def test_what_differs_from_a_cached_header_is_checked_in_full() -> None:
    x = np.arange(16, dtype=np.uint8)
    header = {"inputs": [binary_input("InputTensor", x)]}
    with v2_client() as client:
        assert_bits_equal(output_array(_post(client, NOT, header, x.tobytes())), ~x)
        # The same header with a byte too many or too few: not the cached plan.
        assert "unexpected additional input data" in error_of(
            _post(client, NOT, header, x.tobytes() + b"\x00"), 400
        )
        assert "expecting 1 additional bytes" in error_of(
            _post(client, NOT, header, x.tobytes()[:-1]), 400
        )
        # The same header for another model: its own input names apply.
        other = error_of(_post(client, "onnx.BitwiseNot-18", header, x.tobytes()), 400)
        assert "X: missing input of onnx.BitwiseNot-18" in other
        assert len(_cache(client)) == 1


def test_failed_and_json_headers_are_not_remembered() -> None:
    x = np.arange(4, dtype=np.uint8)
    bad = {"inputs": [{**binary_input("InputTensor", x), "shape": [5]}]}
    with v2_client() as client:
        for _ in range(2):
            assert "input byte size mismatch" in error_of(_post(client, NOT, bad, x.tobytes()), 400)
        json_header = {"inputs": [{**json_input("InputTensor", x)}]}
        for _ in range(2):
            body, headers = framed(json_header)
            response = client.post(f"/v2/models/{NOT}/infer", content=body, headers=headers)
            assert_bits_equal(output_array(response), ~x)
        assert len(_cache(client)) == 0


def test_the_cache_holds_at_most_its_budget_oldest_dropped_first() -> None:
    # Each entry is charged its header's bytes and ENTRY_BYTES for what keeps it.
    entry = header_cache.ENTRY_BYTES
    cache: HeaderCache[str] = HeaderCache(budget=2 * entry + 100, max_header_bytes=60)
    cache.put("a", "plan a", 40)
    cache.put("b", "plan b", 40)
    assert (len(cache), cache.held) == (2, 2 * entry + 80)
    cache.put("c", "plan c", 30)  # 3 entries do not fit: "a" goes
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (None, "plan b", "plan c")
    assert cache.held == 2 * entry + 70
    cache.put("d", "plan d", 61)  # longer than any header kept
    assert cache.get("d") is None
    assert not cache.keeps(b"x" * 61)
    assert cache.keeps(b"x" * 60)
    cache.put("b", "another plan", 40)  # a key kept once keeps its first plan
    assert cache.get("b") == "plan b"
    assert cache.held == 2 * entry + 70


def test_many_small_headers_fit_the_budget_with_what_keeps_them() -> None:
    # 4 MiB of budget, 250-byte headers: about 2,400 entries, not the 16,000 the header bytes
    # alone would allow (whose plans took about 20 MiB).
    cache: HeaderCache[str] = HeaderCache(budget=4 << 20, max_header_bytes=4096)
    for i in range(20_000):
        cache.put(i, "plan", 250)
    assert len(cache) == (4 << 20) // (250 + header_cache.ENTRY_BYTES)


def test_the_cache_can_be_switched_off() -> None:
    with v2_client(header_cache_bytes=0) as client:
        runtime = client.app.state.runtime  # type: ignore[attr-defined]
        assert runtime.plane.plans is None
        assert runtime.plane.batch_plans is None
        x = np.arange(3, dtype=np.uint8)
        header = {"inputs": [binary_input("InputTensor", x)]}
        for _ in range(2):
            assert_bits_equal(output_array(_post(client, NOT, header, x.tobytes())), ~x)


@pytest.mark.parametrize("header_length", [200, 4096, 4097])
def test_only_headers_up_to_the_bound_are_remembered(header_length: int) -> None:
    cache: HeaderCache[PlanTemplate] = HeaderCache(1 << 20, max_header_bytes=4096)
    x = np.arange(4, dtype=np.uint8)
    head = json.dumps({"inputs": [binary_input("InputTensor", x)]}).encode()
    head += b" " * (header_length - len(head))  # JSON whitespace, part of the header
    for _ in range(2):
        body = bytearray(head + x.tobytes())
        planned = rest_infer.plan(
            data_plane(Settings(), plans=cache), get_operator(NOT), body, header_length
        )
        assert_bits_equal(planned.inputs[0], x)
    assert len(cache) == (1 if header_length <= 4096 else 0)
