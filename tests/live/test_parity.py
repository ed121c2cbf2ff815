"""HTTP and gRPC answer alike: every case of ``parity_cases.py`` sent over both protocols to one real
server, with the same outcome. An answer: the same outputs, byte for byte, with the same data type
and shape, and the reference's. A refusal: the same error class through the one status table
(``errors.STATUSES``: the HTTP status and the gRPC code each map to it), the same field, rule and
message. A query: the same document, the HTTP JSON read as the RPC's message
(``google.protobuf.json_format``) against the message gRPC sent."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
from core.bitref import reference
from support.parity_cases import INFERS, QUERIES, Infer, Pair, Query, Refusal
from support.wires import (
    Answer,
    OutputData,
    Refused,
    Wires,
    as_message_json,
    http_document,
    message_json,
    unknown_keys,
)

from tensorbits_protocol.operators import get_operator

pytestmark = pytest.mark.integration


@contextmanager
def unloaded(wires: Wires, model: str | None) -> Iterator[None]:
    """``model`` unloaded for the block (nothing when None), loaded again after it."""
    if model is None:
        yield
        return
    assert wires.http.post(f"/v2/repository/models/{model}/unload").status_code == 200
    try:
        yield
    finally:
        assert wires.http.post(f"/v2/repository/models/{model}/load").status_code == 200


def check_refusal(got: object, want: Refusal) -> None:
    assert isinstance(got, Refused), got
    assert (got.error, got.field, got.rule) == (want.error, want.field, want.rule), got
    for words in want.words:
        assert words in got.message, (words, got.message)


def expected_answer(case: Infer) -> Answer:
    request = case.request
    arrays = {tensor.name: tensor.array for tensor in request.inputs}
    want = case.expect
    if want is None:
        want = reference(request.model, arrays, request.parameters)
    assert not isinstance(want, Refusal)
    output = get_operator(request.model).output
    return Answer(request.model, "1", request.id, (OutputData.of(output, want),))


def infer_params() -> list[Any]:
    """Each case in each of its pairs of wire forms; a drift case expected to fail, strictly."""
    return [
        pytest.param(
            case, pair, id=f"{case.id}-{pair.name}",
            marks=[pytest.mark.xfail(reason=case.drift, strict=True)] if case.drift else [],
        )
        for case in INFERS
        for pair in case.pairs
    ]  # fmt: skip


@pytest.mark.parametrize(("case", "pair"), infer_params())
def test_inference(wires: Wires, case: Infer, pair: Pair) -> None:
    with unloaded(wires, case.unload):
        over_http = wires.infer(case.request, pair.http)
        over_grpc = wires.infer(case.request, pair.grpc)
    # HTTP against the expectation first, so that a drift case fails on the comparison alone.
    if isinstance(case.expect, Refusal):
        check_refusal(over_http, case.expect)
    else:
        assert over_http == expected_answer(case)
    if case.own_words:
        assert isinstance(over_http, Refused), over_http
        assert isinstance(over_grpc, Refused), over_grpc
        assert replace(over_grpc, message="") == replace(over_http, message="")
        return
    assert over_grpc == over_http


@pytest.mark.parametrize("case", QUERIES, ids=lambda case: case.id)
def test_query(wires: Wires, case: Query) -> None:
    with unloaded(wires, case.unload):
        response = wires.http.get(case.http)
        over_grpc = wires.grpc_outcome(lambda: wires.call(case.rpc, case.request, case.response))
    over_http = http_document(response, case.view, wires.http_refused)
    if isinstance(case.expect, Refusal):
        check_refusal(over_http, case.expect)
        assert over_grpc == over_http
        return
    assert not isinstance(over_http, Refused), over_http
    assert not isinstance(over_grpc, Refused), over_grpc
    assert unknown_keys(over_http, case.response.DESCRIPTOR) <= case.dropped
    document = message_json(over_grpc)
    assert document == as_message_json(over_http, case.response)
    for key, value in case.expect.items():
        assert _subset(document[key], value), (key, document[key], value)


def _subset(got: object, want: object) -> bool:
    """``want`` holds in ``got``: equal, or for a mapping, each of its keys holds."""
    if isinstance(want, dict) and isinstance(got, dict):
        return all(key in got and _subset(got[key], value) for key, value in want.items())
    return got == want
