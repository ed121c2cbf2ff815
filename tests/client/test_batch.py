"""The /v1 batch builder: what it sends (offline), and chains run by the real server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest

from tensorbits_client import (
    AsyncClient,
    BadRequestError,
    Client,
    async_hamming_distances,
    hamming_distances,
)
from tensorbits_protocol import codec
from tensorbits_protocol.v1 import BatchRequest

XOR = "DML_OPERATOR_ELEMENT_WISE_BIT_XOR"
rng = np.random.default_rng(11)


def _header(client: Client, build: Any) -> tuple[BatchRequest, bytes]:
    batch = client.batch("b-1")
    build(batch)
    body = batch.plan().body
    header_length = int(body.headers[codec.HEADER_LENGTH])
    raw = b"".join(bytes(p) for p in body.parts)
    assert len(raw) == body.content_length
    return BatchRequest.model_validate_json(raw[:header_length]), raw[header_length:]


# --- offline: what the builder sends ------------------------------------------------------------
def test_builder_declares_buffers_and_sends_only_data() -> None:
    a = np.arange(5, dtype=np.uint8)  # 5 bytes: padded to 8, as DirectML sizes buffers

    def build(batch: Any) -> None:
        x = batch.input("a", a)
        batch.buffer("scratch", 64)
        out = batch.bit_not(x)
        batch.output(out)

    with Client("http://t.test") as client:
        request, data = _header(client, build)
    assert request.id == "b-1"
    assert [(b.name, b.byte_size, b.init) for b in request.buffers] == [
        ("a", 8, None),
        ("scratch", 64, "zeros"),
        ("bit_not0", 8, "zeros"),
    ]
    assert data == a.tobytes() + b"\0\0\0"
    (dispatch,) = request.dispatches
    assert dispatch.operator == "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
    assert dispatch.parameters == {"feature_level": "6_4"}
    assert dispatch.bindings["InputTensor"].desc.sizes == [5]
    assert dispatch.bindings["OutputTensor"].buffer == "bit_not0"
    assert request.outputs == ["bit_not0"]


def test_tensor_descriptions_carry_strides_offsets_and_sizes() -> None:
    def build(batch: Any) -> None:
        buf = batch.input("m", np.zeros((4, 8), np.uint32))
        view = buf.tensor("UINT32", (4, 4), strides=(8, 2), offset=16, total_size=128, alignment=16)
        batch.dispatch(XOR, ATensor=view, BTensor=view, OutputTensor=view)

    with Client("http://t.test") as client:
        request, _ = _header(client, build)
    binding = request.dispatches[0].bindings["ATensor"]
    assert binding.offset == 16
    assert binding.desc.strides == [8, 2]
    assert binding.desc.total_size == 128
    assert binding.desc.alignment == 16
    assert request.outputs == ["m"]  # the last dispatch's output by default


def test_header_omits_what_is_not_set() -> None:
    def build(batch: Any) -> None:
        batch.bit_not(batch.input("a", np.zeros(4, np.uint8)), in_place=True)

    with Client("http://t.test") as client:
        request, _ = _header(client, build)
    document = json.loads(request.model_dump_json(exclude_none=True))
    assert "strides" not in json.dumps(document)
    assert (
        request.dispatches[0].bindings["OutputTensor"]
        == request.dispatches[0].bindings["InputTensor"]
    )


def test_builder_refuses_what_it_can_tell_is_wrong() -> None:
    with Client("http://t.test") as client:
        batch = client.batch()
        a = batch.input("a", np.zeros(4, np.uint8))
        with pytest.raises(ValueError, match="already has a buffer named 'a'"):
            batch.input("a", np.zeros(4, np.uint8))
        with pytest.raises(ValueError, match="no data type"):
            batch.buffer("raw", 16).tensor()
        with pytest.raises(ValueError, match="either out= or in_place"):
            batch.bit_not(a, out="x", in_place=True)
        with pytest.raises(ValueError, match="no buffer named 'ghost'"):
            batch.output("ghost")
        with pytest.raises(ValueError, match="nothing to return"):
            batch.plan()
        other = client.batch().input("elsewhere", np.zeros(4, np.uint8))
        with pytest.raises(ValueError, match="no buffer named 'elsewhere'"):
            batch.bit_not(other)


# --- live: chains run by the server -------------------------------------------------------------
def test_chain_xor_then_count_keeps_the_intermediate_remote(live: Client) -> None:
    a, b = (
        rng.integers(0, 2**32, (3, 16), dtype=np.uint32),
        rng.integers(0, 2**32, (3, 16), dtype=np.uint32),
    )
    batch = live.batch()
    counts = batch.bit_count(batch.bit_xor(batch.input("a", a), batch.input("b", b)))
    results = batch.run()
    assert list(results) == [counts.buffer]  # only the counts come back
    np.testing.assert_array_equal(results[counts.buffer], np.bitwise_count(a ^ b))


def test_in_place_chain(live: Client) -> None:
    a = rng.integers(0, 256, 40, dtype=np.uint8)
    b = rng.integers(0, 256, 40, dtype=np.uint8)
    batch = live.batch()
    x, y = batch.input("x", a), batch.input("y", b)
    batch.bit_xor(x, y, in_place=True)  # x ^= y
    batch.bit_not(x, in_place=True)  # x = ~x
    batch.bit_and(x, y, out=x)  # x &= y, bound through out=
    batch.output(x)
    results = batch.run()
    np.testing.assert_array_equal(results["x"], ~(a ^ b) & b)
    assert results["x"].dtype == np.uint8
    assert results["x"].shape == (40,)


def test_strided_and_offset_bindings(live: Client) -> None:
    m = np.arange(64, dtype=np.uint16).reshape(8, 8)
    batch = live.batch()
    src = batch.input("m", m)
    out = batch.empty("out", (4, 8), "UINT16")
    # Every other row of m (stride 16 elements), against rows 4..7 (a 64-byte offset: 16-aligned).
    even_rows = src.tensor("UINT16", (4, 8), strides=(16, 1))
    low_rows = src.tensor("UINT16", (4, 8), offset=4 * 8 * 2)
    batch.bit_or(even_rows, low_rows, out=out)
    # Broadcast row 0 over 4 rows with a stride of 0, into the top of a bigger buffer.
    wide = batch.empty("wide", (8, 8), "UINT16")
    first_row = src.tensor("UINT16", (4, 8), strides=(0, 1))
    batch.bit_not(first_row, out=wide.tensor("UINT16", (4, 8)))
    batch.output(out)
    # A strided view of what comes back: the transpose of the 4x8 block.
    batch.output(wide.tensor("UINT16", (8, 4), strides=(1, 8)))
    results = batch.run()
    np.testing.assert_array_equal(results["out"], m[::2] | m[4:])
    expected_wide = np.zeros((8, 8), np.uint16)
    expected_wide[:4] = ~m[0]
    assert results["wide"].shape == (8, 4)
    np.testing.assert_array_equal(results["wide"], expected_wide[:4].T)


def test_typed_views_of_outputs(live: Client) -> None:
    a = rng.integers(0, 2**16, 8, dtype=np.uint16)
    batch = live.batch()
    x = batch.input("x", a)
    batch.bit_not(x, in_place=True)
    batch.output(x, "UINT8", (16,))
    results = batch.run()
    np.testing.assert_array_equal(results["x"], (~a).view(np.uint8))


def test_planner_errors_are_mapped_with_the_field_path(live: Client) -> None:
    batch = live.batch()
    src = batch.input("m", np.zeros(64, np.uint8))
    misaligned = src.tensor("UINT8", (8,), offset=4)
    batch.bit_not(misaligned, out="o")
    with pytest.raises(BadRequestError) as caught:
        batch.run()
    assert caught.value.field is not None
    assert caught.value.field.startswith("dispatches[0].bindings.InputTensor")
    assert "multiple of 16" in caught.value.message


@pytest.mark.parametrize(("bits", "n", "m"), [(256, 9, 13), (100, 5, 7), (24, 3, 4), (8, 1, 1)])
def test_hamming_distances(live: Client, bits: int, n: int, m: int) -> None:
    a = np.packbits(rng.random((n, bits)) > 0.5, axis=1)
    b = np.packbits(rng.random((m, bits)) > 0.5, axis=1)
    expected = np.unpackbits(a[:, None, :] ^ b[None, :, :], axis=2).sum(axis=2)
    got = hamming_distances(live, a, b)
    assert got.dtype == np.uint32
    np.testing.assert_array_equal(got, expected)
    # In several batches, and with the widest word DirectML allows at feature level 3_0.
    small = hamming_distances(live, a, b, max_intermediate_bytes=1, feature_level="3_0")
    np.testing.assert_array_equal(small, expected)


def test_hamming_refuses_unpacked_codes(live: Client) -> None:
    with pytest.raises(ValueError, match="packed codes"):
        hamming_distances(live, np.zeros((2, 8), np.float32), np.zeros((2, 8), np.uint8))
    with pytest.raises(ValueError, match="differ in length"):
        hamming_distances(live, np.zeros((2, 8), np.uint8), np.zeros((2, 4), np.uint8))


def test_async_batch_and_hamming(server_url: str) -> None:
    a = np.packbits(rng.random((4, 64)) > 0.5, axis=1)
    b = np.packbits(rng.random((6, 64)) > 0.5, axis=1)

    async def main() -> tuple[dict[str, Any], Any]:
        async with AsyncClient(server_url) as client:
            batch = client.batch()
            batch.bit_xor(batch.input("a", a[:1]), batch.input("b", b[:1]))
            return await batch.run(), await async_hamming_distances(client, a, b)

    results, distances = asyncio.run(main())
    (xored,) = results.values()
    np.testing.assert_array_equal(xored, a[:1] ^ b[:1])
    expected = np.unpackbits(a[:, None, :] ^ b[None, :, :], axis=2).sum(axis=2)
    np.testing.assert_array_equal(distances, expected)
