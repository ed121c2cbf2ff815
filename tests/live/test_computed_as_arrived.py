"""A large binary body planned from its JSON header and computed as its tensors arrive
(``AdmittedRequest.receive_planned``, ``core/arrival.py``), on a real socket.

The server runs in this process (uvicorn on a thread, as ``tensorbits serve`` configures it), so
the pieces its ``Arrival`` computes are recorded as they run. Each case holds back part of the
body and waits for pieces computed from what was sent: that can only pass when the operator runs
before the last byte arrives (beside a broadcast input too, whole rows a piece). The answer is
checked byte for byte; a deadline, a client gone and a refused header mid-body keep their
refusals, and the admission's bytes come back to 0."""

from __future__ import annotations

import base64
import itertools
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import uvicorn
from core.graph_models import chain_model
from support.framing import framed
from support.live import free_port
from support.rawhttp import assert_json_error, read_response, request
from support.v2 import AND, NOT, assert_bit_not, binary_input, bit_not_request

from tensorbits.config.settings import Settings
from tensorbits.core.admission import Admission
from tensorbits.core.arrival import Arrival
from tensorbits.runtime import Runtime
from tensorbits.server.app import create_app
from tensorbits.server.serving import uvicorn_kwargs

pytestmark = pytest.mark.integration

MIB = 1 << 20
READ_S = 3
XOR = "DML_OPERATOR_ELEMENT_WISE_BIT_XOR"
XOR_BROADCASTING = "onnx.BitwiseXor-18"
CHAIN = chain_model(np.dtype(np.uint32))


class Served:
    """The server's port, its admission, and the pieces its arrivals ran: (first, end) each."""

    def __init__(self, port: int, admission: Admission) -> None:
        self.port = port
        self.admission = admission
        self.runs: list[tuple[int, int]] = []

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.settimeout(30)
        return sock

    def wait_for(self, done: Callable[[], bool], seconds: float = 10) -> None:
        ends = time.monotonic() + seconds
        while not done():
            assert time.monotonic() < ends, f"not within {seconds} s; runs {self.runs}"
            time.sleep(0.01)

    def settled(self) -> None:
        """The admission's bytes and requests back to 0 (the last response's end is handed on
        just after its bytes are written)."""
        self.wait_for(lambda: self.admission.bytes_in_flight == 0)
        assert self.admission.requests_in_flight == 0


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    port = free_port()
    settings = Settings(
        backend="numpy", host="127.0.0.1", port=port, grpc_port=0, metrics_port=0,
        timeout_body_read=READ_S,
    )  # fmt: skip
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(**uvicorn_kwargs(settings, app=app)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    ends = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "the server stopped before it started"
        assert time.monotonic() < ends, "the server did not start within 30 s"
        time.sleep(0.01)
    runtime: Runtime = app.state.runtime
    try:
        yield Served(port, runtime.plane.admission)
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture
def recorded(served: Served, monkeypatch: pytest.MonkeyPatch) -> Served:
    """``served`` with every piece its arrivals run recorded, from none."""
    run = Arrival._to

    def recording(arrival: Arrival, end: int) -> None:
        if end > arrival.done:
            served.runs.append((arrival.done, end))
        run(arrival, end)

    monkeypatch.setattr(Arrival, "_to", recording)
    served.runs = []
    return served


def _request(model: str, arrays: dict[str, np.ndarray[Any, Any]]) -> bytes:
    header = {
        "inputs": [binary_input(name, x) for name, x in arrays.items()],
        "parameters": {"binary_data_output": True},
    }
    body, headers = framed(header, *(x.tobytes() for x in arrays.values()))
    return request("POST", f"/v2/models/{model}/infer", headers, body)


def _covered(runs: list[tuple[int, int]], total: int) -> None:
    """The pieces ran in order, back to back, from the first element to the last."""
    assert runs, "no piece ran"
    assert runs[0][0] == 0, runs
    assert runs[-1][1] == total, runs
    assert all(a[1] == b[0] for a, b in itertools.pairwise(runs)), runs


def test_a_not_is_computed_before_its_last_bytes_are_sent(recorded: Served) -> None:
    data = np.random.default_rng(1).integers(0, 256, 24 * MIB + 3, dtype=np.uint8)
    raw = bit_not_request(data)
    held_back = 4 * MIB
    with recorded.connect() as sock:
        sock.sendall(raw[:-held_back])
        # Pieces of what was sent, computed while the rest is not. Of the 20 MiB sent, at least
        # all but a piece (4 MiB) and a look (1 MiB) is computed: 12 MiB whatever the timing.
        recorded.wait_for(lambda: bool(recorded.runs) and recorded.runs[-1][1] >= 12 * MIB)
        sock.sendall(raw[-held_back:])
        assert_bit_not(read_response(sock), data)
    _covered(recorded.runs, data.size)
    assert len(recorded.runs) >= 3, recorded.runs  # pieces, then what was left at the end
    recorded.settled()


def test_a_binary_operator_waits_for_its_second_input(recorded: Served) -> None:
    rng = np.random.default_rng(2)
    a = rng.integers(0, 1 << 32, 3 * MIB + 1, dtype=np.uint32)
    b = rng.integers(0, 1 << 32, 3 * MIB + 1, dtype=np.uint32)
    raw = _request(XOR, {"ATensor": a, "BTensor": b})
    b_starts = len(raw) - b.nbytes
    with recorded.connect() as sock:
        sock.sendall(raw[:b_starts])  # the head, the JSON header and all of A
        time.sleep(0.3)
        assert recorded.runs == [], "a piece ran before any of its second input arrived"
        sock.sendall(raw[b_starts : b_starts + b.nbytes // 2])
        recorded.wait_for(lambda: bool(recorded.runs))
        assert recorded.runs[-1][1] <= b.size // 2, recorded.runs  # never past what arrived
        sock.sendall(raw[b_starts + b.nbytes // 2 :])
        reply = read_response(sock)
    assert reply.status == 200, reply.body[:300]
    offset = int(reply.headers["inference-header-content-length"])
    np.testing.assert_array_equal(np.frombuffer(reply.body[offset:], np.uint32), a ^ b)
    _covered(recorded.runs, a.size)
    recorded.settled()


def test_a_broadcast_xor_is_computed_before_its_last_bytes_are_sent(recorded: Served) -> None:
    """A row XORed into every row of A, the row sent first: A's rows computed as they come,
    whole rows a piece, while its last 4 MiB are held back."""
    rng = np.random.default_rng(3)
    row = 4096
    a = rng.integers(0, 256, (6 * 1024, row), dtype=np.uint8)  # 24 MiB
    b = rng.integers(0, 256, row, dtype=np.uint8)
    raw = _request(XOR_BROADCASTING, {"B": b, "A": a})
    with recorded.connect() as sock:
        sock.sendall(raw[: -4 * MIB])
        # Of A's 20 MiB sent, all but a piece (4 MiB) and a look (1 MiB): 12 MiB at least.
        recorded.wait_for(lambda: bool(recorded.runs) and recorded.runs[-1][1] >= 12 * MIB)
        sock.sendall(raw[-4 * MIB :])
        reply = read_response(sock)
    assert reply.status == 200, reply.body[:300]
    offset = int(reply.headers["inference-header-content-length"])
    answer = np.frombuffer(reply.body[offset:], np.uint8)
    assert answer.tobytes() == (a ^ b).tobytes()
    _covered(recorded.runs, a.size)
    assert all(end % row == 0 for _, end in recorded.runs), recorded.runs  # whole rows
    recorded.settled()


def test_a_broadcast_without_an_input_to_write_over_is_computed_once_its_body_is_in(
    recorded: Served,
) -> None:
    """A column against a row: neither input has the output's shape, so nothing is written
    over and nothing computed as the body arrives; the answer comes from a new buffer."""
    rng = np.random.default_rng(9)
    a = rng.integers(0, 256, (2, 1, 4 * MIB), dtype=np.uint8)
    b = rng.integers(0, 256, (1, 2, 4 * MIB), dtype=np.uint8)
    with recorded.connect() as sock:
        sock.sendall(_request(AND, {"A": a, "B": b}))
        reply = read_response(sock)
    assert reply.status == 200, reply.body[:300]
    offset = int(reply.headers["inference-header-content-length"])
    np.testing.assert_array_equal(
        np.frombuffer(reply.body[offset:], np.uint8).reshape(2, 2, -1), a & b
    )
    assert recorded.runs == []  # no arrival
    recorded.settled()


def test_a_body_past_the_deadline_with_pieces_computed_gets_408(recorded: Served) -> None:
    data = np.random.default_rng(4).integers(0, 256, 16 * MIB, dtype=np.uint8)
    raw = bit_not_request(data)
    with recorded.connect() as sock:
        started = time.monotonic()
        sock.sendall(raw[:-MIB])
        recorded.wait_for(lambda: bool(recorded.runs))
        body = assert_json_error(read_response(sock), 408, "body", "body_read_timeout")
        assert "TENSORBITS_TIMEOUT_BODY_READ" in body["error"]
        assert READ_S <= time.monotonic() - started < READ_S + 2
        # The rest is skipped and the connection goes on, as for any body past its deadline.
        sock.sendall(raw[-MIB:] + request("GET", "/v2/health/live"))
        assert read_response(sock).status == 200
    recorded.settled()


def test_a_client_gone_after_pieces_were_computed_releases_its_admission(
    recorded: Served,
) -> None:
    data = np.random.default_rng(5).integers(0, 256, 16 * MIB, dtype=np.uint8)
    with recorded.connect() as sock:
        sock.sendall(bit_not_request(data)[: -2 * MIB])
        recorded.wait_for(lambda: bool(recorded.runs))
    recorded.settled()
    with recorded.connect() as sock:  # and the server answers the next one whole
        sock.sendall(bit_not_request(data))
        assert_bit_not(read_response(sock), data)
    recorded.settled()


def test_a_header_refused_mid_body_is_refused_in_its_words(recorded: Served) -> None:
    data = np.random.default_rng(6).integers(0, 256, 12 * MIB, dtype=np.uint8)
    raw = _request(NOT, {"NotAnInput": data})
    with recorded.connect() as sock:
        sock.sendall(raw[: len(raw) // 2])  # refused from its header, half of it unsent
        body = assert_json_error(read_response(sock), 400, "InputTensor", "missing_input")
        assert "NotAnInput" in body["error"]
    assert recorded.runs == []
    recorded.settled()


def test_pipelined_requests_computed_as_they_arrive_are_answered_in_order(
    recorded: Served,
) -> None:
    rng = np.random.default_rng(7)
    first = rng.integers(0, 256, 12 * MIB + 5, dtype=np.uint8)
    second = rng.integers(0, 256, 9 * MIB, dtype=np.uint8)
    with recorded.connect() as sock:
        sock.sendall(bit_not_request(first) + bit_not_request(second))  # back to back
        assert_bit_not(read_response(sock), first)
        assert_bit_not(read_response(sock), second)
        sock.sendall(request("GET", "/v2/health/live"))
        assert read_response(sock).status == 200
    assert recorded.runs[-1][1] == second.size  # the second's pieces ran last, to its end
    recorded.settled()


def test_a_graph_models_fused_chain_is_computed_before_its_last_bytes_are_sent(
    recorded: Served,
) -> None:
    """x XOR y, shifted left by 3, then NOT (a fused chain): loaded over the repository API,
    computed in pieces while the end of y is held back."""
    load = {"parameters": {"config": json.dumps({"backend": "onnxruntime"}),
                           "file:1/model.onnx": base64.b64encode(CHAIN).decode()}}  # fmt: skip
    with recorded.connect() as sock:
        sock.sendall(request("POST", "/v2/repository/models/chain/load", {},
                             json.dumps(load).encode()))  # fmt: skip
        assert read_response(sock).status == 200
        rng = np.random.default_rng(8)
        x = rng.integers(0, 1 << 32, 4 * MIB + 3, dtype=np.uint32)
        y = rng.integers(0, 1 << 32, 4 * MIB + 3, dtype=np.uint32)
        raw = _request("chain", {"x": x, "y": y})
        sock.sendall(raw[: -4 * MIB])
        # Of y's 3 Mi elements sent, all but a piece (1 Mi) and a look (1/4 Mi): 1 Mi at least.
        recorded.wait_for(lambda: bool(recorded.runs) and recorded.runs[-1][1] >= MIB)
        sock.sendall(raw[-4 * MIB :])
        reply = read_response(sock)
    assert reply.status == 200, reply.body[:300]
    offset = int(reply.headers["inference-header-content-length"])
    z = np.frombuffer(reply.body[offset:], np.uint32)
    np.testing.assert_array_equal(z, ~((x ^ y) << np.uint32(3)))
    _covered(recorded.runs, x.size)
    recorded.settled()
