"""Compressed responses (api/compression.py, api/admitted.py): gzip or deflate exactly when
``Accept-Encoding`` asks, the JSON header's length still the uncompressed one, the compressed
size within its bound, and the compressed copy admitted or not made at all."""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from support.framing import HEADER, framed
from support.inprocess import TestClient, runtime_of
from support.v2 import NOT, binary_input, v2_client

from tensorbits.api.compression import accepted_coding, compress, compressed_bound

DECOMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.decompress,
    "deflate": zlib.decompress,
}


@pytest.mark.parametrize(
    ("header", "coding"),
    [
        (None, None),
        ("", None),
        ("identity", None),
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("GZIP", "gzip"),
        ("x-gzip", "gzip"),
        ("gzip, deflate", "gzip"),
        ("deflate, gzip", "gzip"),  # equal weights: the server's preference
        ("gzip;q=0.5, deflate", "deflate"),
        ("gzip;q=0, deflate;q=0", None),
        ("br, zstd", None),
        ("*", "gzip"),
        ("*;q=0.2, deflate;q=0.1", "gzip"),
        ("gzip;q=oops", None),  # a malformed weight accepts nothing
        ("gzip;q=2", None),
        ("deflate ; q=0.9 , identity", "deflate"),
    ],
)
def test_accepted_coding(header: str | None, coding: str | None) -> None:
    assert accepted_coding(header) == coding


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
@pytest.mark.parametrize("size", [0, 1, 100, 65536, (1 << 20) + 7])
def test_incompressible_data_stays_within_the_bound(coding: str, size: int) -> None:
    data = os.urandom(size)
    halves = (data[: size // 3], memoryview(data)[size // 3 :])
    pieces = compress(halves, coding)
    assert sum(map(len, pieces)) <= compressed_bound(size)
    assert DECOMPRESS[coding](b"".join(pieces)) == data


def _infer(
    client: TestClient, array: np.ndarray[Any, Any], accept: str, binary_output: bool = True
) -> tuple[dict[str, str], bytes]:
    """Headers and the raw (still compressed) body of a BIT_NOT inference."""
    header = {
        "inputs": [binary_input("InputTensor", array)],
        "parameters": {"binary_data_output": binary_output},
    }
    body, headers = framed(header, array.tobytes())
    with client.stream(
        "POST",
        f"/v2/models/{NOT}/infer",
        content=body,
        headers={**headers, "Accept-Encoding": accept},
    ) as response:
        assert response.status_code == 200
        return dict(response.headers), b"".join(response.iter_raw())


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
@pytest.mark.parametrize("size", [16, 3 << 20])  # inline, and off the event loop
def test_binary_response_compressed_when_asked(v2: TestClient, coding: str, size: int) -> None:
    array = (np.arange(size) % 7).astype(np.uint8)
    headers, raw = _infer(v2, array, coding)
    assert headers["content-encoding"] == coding
    assert int(headers["content-length"]) == len(raw)
    body = DECOMPRESS[coding](raw)
    length = int(headers[HEADER.lower()])  # the uncompressed JSON header's length
    assert json.loads(body[:length])["outputs"][0]["parameters"]["binary_data_size"] == size
    np.testing.assert_array_equal(np.frombuffer(body[length:], np.uint8), ~array)
    if size > 1 << 20:
        assert len(raw) < size // 10  # it did compress


def test_json_response_compressed(v2: TestClient) -> None:
    array = np.arange(8, dtype=np.uint8)
    headers, raw = _infer(v2, array, "gzip", binary_output=False)
    assert headers["content-type"] == "application/json"
    assert HEADER.lower() not in headers
    assert json.loads(gzip.decompress(raw))["outputs"][0]["data"] == (~array).tolist()


@pytest.mark.parametrize("accept", ["identity", "br", "gzip;q=0"])
def test_never_compressed_unless_asked(v2: TestClient, accept: str) -> None:
    array = np.zeros(1024, dtype=np.uint8)
    headers, raw = _infer(v2, array, accept)
    assert "content-encoding" not in headers
    assert int(headers["content-length"]) == len(raw) == int(headers[HEADER.lower()]) + 1024


def test_errors_and_other_routes_are_not_compressed(v2: TestClient) -> None:
    response = v2.post(f"/v2/models/{NOT}/infer", content=b"{", headers={"Accept-Encoding": "gzip"})
    assert response.status_code == 400
    assert "content-encoding" not in response.headers


def test_compressed_copy_not_admitted_goes_uncompressed() -> None:
    # Room for the body and the response, not for a compressed copy of a 4 MiB response.
    size = 4 << 20
    with v2_client(max_body_bytes=size + 4096, max_inflight_bytes=2 * size + (1 << 20)) as client:
        array = np.ones(size, dtype=np.uint8)
        headers, raw = _infer(client, array, "gzip")
        assert "content-encoding" not in headers
        assert len(raw) == int(headers[HEADER.lower()]) + size
        runtime = runtime_of(client)
        assert runtime.plane.admission.bytes_in_flight == 0  # every grant given back
        small = np.ones(1024, dtype=np.uint8)
        headers, _ = _infer(client, small, "gzip")
        assert headers["content-encoding"] == "gzip"
        assert runtime.plane.admission.bytes_in_flight == 0


def test_batch_response_compressed(v1: TestClient) -> None:
    from support.v1 import bind, data

    decl, raw_a = data("a", np.arange(64, dtype=np.uint8))
    t = bind("a", "UINT8", [64])
    header = {
        "buffers": [decl],
        "dispatches": [
            {
                "operator": "DML_OPERATOR_ELEMENT_WISE_BIT_NOT",
                "bindings": {"InputTensor": t, "OutputTensor": t},
            }
        ],
        "outputs": ["a"],
    }
    body, headers = framed(header, raw_a, binary=True)
    with v1.stream(
        "POST", "/v1/batch", content=body, headers={**headers, "Accept-Encoding": "deflate"}
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-encoding"] == "deflate"
        plain = zlib.decompress(b"".join(response.iter_raw()))
    length = int(response.headers[HEADER.lower()])
    np.testing.assert_array_equal(
        np.frombuffer(plain[length:], np.uint8), ~np.arange(64, dtype=np.uint8)
    )
