"""The refusal soak: clients that send each request whole before they read its answer (as
``http.client``, ``requests`` and ``tritonclient.http`` do), in a steady mix against a live
server whose admission fills and whose body limit is small, and what each request ended as.

The mix (``MIX``), per 100 requests: 60 BIT_NOT of 4 KiB (200, or 503 while admission is full);
20 XOR of two 8 MiB inputs (200 or 503); 19 invalid requests (400, or 503); 1 body of 33 MiB,
past the 32 MiB body limit (413, refused on its declared length). The server runs with
``SERVER_ENV``: a 32 MiB body limit and 128 MiB in flight, so that the XORs fill admission.

A server that answers before it has read a body and then closes with bytes unread resets the
connection: a client still sending reads a broken pipe or a reset instead of the 503 or 413,
and retries blind. Each such ending is a transport error here (its exception's name), and the
soak's figure of merit is that there are none.

Used by tests/live/test_refusal_soak.py (briefly) and bench/load.py soak-refusals (the
figures printed)."""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from support.framing import framed
from support.live import LiveServer
from support.v2 import NOT, binary_input

MiB = 1 << 20
BODY_LIMIT = 32 * MiB
INFLIGHT_LIMIT = 128 * MiB
SERVER_ENV: Mapping[str, str] = {
    "TENSORBITS_MAX_BODY_BYTES": str(BODY_LIMIT),
    "TENSORBITS_MAX_INFLIGHT_BYTES": str(INFLIGHT_LIMIT),
}
XOR = "DML_OPERATOR_ELEMENT_WISE_BIT_XOR"
ANSWER_TIMEOUT_S = 60.0  # a request whose answer takes longer is a transport error (timeout)


@dataclass(frozen=True)
class Kind:
    """One kind of request in the mix: how often it comes (per 100), what is sent, and the
    statuses it may be answered with."""

    name: str
    weight: int
    path: str
    headers: Mapping[str, str]
    body: bytes
    answers: frozenset[int]


def _infer(name: str, weight: int, model: str, header: Mapping[str, object], *buffers: bytes,
           answers: frozenset[int]) -> Kind:  # fmt: skip
    body, headers = framed(header, *buffers)
    return Kind(name, weight, f"/v2/models/{model}/infer", headers, body, answers)


def build_mix() -> tuple[Kind, ...]:
    """The requests of the mix, built once (every client sends the same bytes)."""
    small = np.arange(4096, dtype=np.uint8)
    large = np.zeros(8 * MiB, dtype=np.uint8)
    binary = {"binary_data_output": True}
    invalid_header = {  # the shape says 8 elements, the data holds 4096 bytes: a 400
        "inputs": [{**binary_input("InputTensor", small), "shape": [8]}],
        "parameters": binary,
    }
    # Past the body limit by 1 MiB: refused on its declared length, before a byte is read.
    oversize = b"\0" * (BODY_LIMIT + MiB)
    return (
        _infer("bit_not_4k", 60, NOT,
               {"inputs": [binary_input("InputTensor", small)], "parameters": binary},
               small.tobytes(), answers=frozenset({200, 503})),
        _infer("xor_2x8m", 20, XOR,
               {"inputs": [binary_input("ATensor", large), binary_input("BTensor", large)],
                "parameters": binary},
               large.tobytes(), large.tobytes(), answers=frozenset({200, 503})),
        _infer("invalid", 19, NOT, invalid_header, small.tobytes(),
               answers=frozenset({400, 503})),
        Kind("past_body_limit", 1, f"/v2/models/{NOT}/infer",
             {"Inference-Header-Content-Length": "2"}, oversize, frozenset({413})),
    )  # fmt: skip


@dataclass
class Figures:
    """What the requests ended as: ``outcomes`` by status (``"503"``) or, for a request that got
    no answer, by the exception's name (a transport error); ``unexpected``: answers a kind may
    not get (``"bit_not_4k 500"``); ``refusals_unnamed``: 4xx/5xx answers without the JSON error
    naming a field and rule, or a 503 without Retry-After."""

    outcomes: Counter[str] = field(default_factory=Counter)
    unexpected: Counter[str] = field(default_factory=Counter)
    refusals_unnamed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def transport_errors(self) -> int:
        return sum(n for outcome, n in self.outcomes.items() if not outcome.isdigit())

    def record(self, kind: Kind, outcome: str, named: bool) -> None:
        with self.lock:
            self.outcomes[outcome] += 1
            if outcome.isdigit() and int(outcome) not in kind.answers:
                self.unexpected[f"{kind.name} {outcome}"] += 1
            if not named:
                self.refusals_unnamed += 1

    def summary(self) -> dict[str, object]:
        return {
            "requests": sum(self.outcomes.values()),
            "outcomes": dict(sorted(self.outcomes.items())),
            "transport_errors": self.transport_errors,
            "unexpected": dict(self.unexpected),
            "refusals_unnamed": self.refusals_unnamed,
        }


def _named(response: http.client.HTTPResponse, body: bytes) -> bool:
    """Whether a refusal says what it refused: a 4xx its JSON error's field and rule, a 503
    its error and when to retry (Retry-After). A 200 is named."""
    if response.status < 400:
        return True
    try:
        error = json.loads(body)
    except ValueError:
        return False
    if not isinstance(error, dict) or not error.get("error"):
        return False
    if response.status == 503:
        return response.getheader("Retry-After") is not None
    return bool(error.get("field")) and bool(error.get("rule"))


def _client(
    server: LiveServer, mix: tuple[Kind, ...], seed: int, until: float, figures: Figures
) -> None:
    rng = random.Random(seed)
    weights = [kind.weight for kind in mix]
    connection = http.client.HTTPConnection(server.host, server.port, timeout=ANSWER_TIMEOUT_S)
    try:
        while time.monotonic() < until:
            (kind,) = rng.choices(mix, weights)
            try:
                # The whole request is written before the answer is read.
                connection.request("POST", kind.path, body=kind.body, headers=dict(kind.headers))
                response = connection.getresponse()
                body = response.read()
            except (OSError, http.client.HTTPException) as exc:
                connection.close()  # the next request opens a new connection
                figures.record(kind, type(exc).__name__, True)
                continue
            figures.record(kind, str(response.status), _named(response, body))
    finally:
        connection.close()


def run_mix(
    server: LiveServer, *, clients: int, seconds: float, mix: tuple[Kind, ...] | None = None
) -> Figures:
    """``clients`` threads, each on its own keep-alive connection, sending the mix for
    ``seconds``; what their requests ended as."""
    mix = build_mix() if mix is None else mix
    figures = Figures()
    until = time.monotonic() + seconds
    threads = [
        threading.Thread(target=_client, args=(server, mix, seed, until, figures), daemon=True)
        for seed in range(clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 2 * ANSWER_TIMEOUT_S)
    return figures
