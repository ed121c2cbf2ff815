"""A large answer written over its input in the request's body (``rest_infer.written_over``),
live: ``tensorbits serve`` on a real socket sends it as its JSON header and a view of the body's
bytes, two body messages; on one kept connection, twice over (planned afresh, then from the
header cache), a BIT_NOT and a shift are answered byte for byte, and the admission's bytes come
back to 0 once they are sent."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from support.framing import framed
from support.live import LiveServer, serve, settled_inflight_bytes
from support.rawhttp import read_response, request
from support.v2 import assert_bit_not, binary_input, bit_not_request

pytestmark = pytest.mark.integration

MIB = 1 << 20
SHIFT = "DML_OPERATOR_ELEMENT_WISE_BIT_SHIFT_RIGHT"


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with serve() as live:
        yield live


def _shift_request(x: np.ndarray[Any, Any], counts: np.ndarray[Any, Any]) -> bytes:
    header = {
        "inputs": [binary_input("ATensor", x), binary_input("BTensor", counts)],
        "parameters": {"binary_data_output": True},
    }
    body, headers = framed(header, x.tobytes(), counts.tobytes())
    return request("POST", f"/v2/models/{SHIFT}/infer", headers, body)


def test_large_answers_over_their_inputs_byte_for_byte_on_one_connection(
    server: LiveServer,
) -> None:
    rng = np.random.default_rng(5)
    data = rng.integers(0, 256, 5 * MIB + 3, dtype=np.uint8)
    x = rng.integers(0, 1 << 32, MIB + 1, dtype=np.uint32)
    counts = rng.integers(0, 40, MIB + 1).astype(np.uint32)  # past the width: 0
    shifted = np.where(counts < 32, x >> np.minimum(counts, 31), 0).astype(np.uint32)
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.settimeout(30)
        for _ in range(2):  # afresh, then from the header cache
            sock.sendall(bit_not_request(data))
            assert_bit_not(read_response(sock), data)
            sock.sendall(_shift_request(x, counts))
            status, headers, body = read_response(sock)
            assert status == 200, body[:300]
            offset = int(headers["inference-header-content-length"])
            header = json.loads(body[:offset])
            assert header["outputs"][0]["parameters"]["binary_data_size"] == x.nbytes
            assert int(headers["content-length"]) == len(body) == offset + x.nbytes
            np.testing.assert_array_equal(np.frombuffer(body[offset:], "<u4"), shifted)
        sock.sendall(request("GET", "/v2/health/live"))
        assert read_response(sock).status == 200
    assert settled_inflight_bytes(server) == 0
