"""Metrics, request ids and readiness, in-process."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.framing import framed
from support.inprocess import TestClient
from support.v2 import NOT, binary_input, v2_client

from tensorbits.observability import MAX_RULE_LABELS, RequestTally
from tensorbits.runtime import Drain


@pytest.fixture
def client() -> Iterator[TestClient]:
    with v2_client() as c:
        yield c


def _samples(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = client.get("/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _infer(client: TestClient, model: str, array: np.ndarray) -> int:
    body, headers = framed({"inputs": [binary_input("InputTensor", array)]}, array.tobytes())
    status: int = client.post(
        f"/v2/models/{model}/infer", content=body, headers=headers
    ).status_code
    return status


def test_metrics_count_each_kind_of_request(client: TestClient) -> None:
    ok = np.arange(64, dtype=np.uint8)
    assert _infer(client, NOT, ok) == 200
    assert _infer(client, NOT, np.zeros((), np.uint8)) == 400  # rank 0: not for DML
    assert _infer(client, "no.such-model", ok) == 404
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v1/operators").status_code == 200
    samples = _samples(client)
    infer = "/v2/models/{model}/infer"

    def requests(route: str, model: str, status: str, version: str = "") -> float:
        labels = (
            ("model", model),
            ("protocol", "http"),
            ("route", route),
            ("status", status),
            ("version", version),
        )
        return samples.get(("tensorbits_requests_total", labels), 0.0)

    # A served model's calls under the version it is served at; caller-chosen names never
    # become labels (nor versions).
    assert requests(infer, NOT, "200", "1") == 1
    assert requests(infer, NOT, "400", "1") == 1
    assert requests(infer, "unknown", "404") == 1
    assert requests("/v2/health/live", "", "200") == 1
    assert requests("/v1/operators", "", "200") == 1
    received = samples[("tensorbits_request_bytes_total", (("protocol", "http"), ("route", infer)))]
    sent = samples[("tensorbits_response_bytes_total", (("protocol", "http"), ("route", infer)))]
    assert received > 3 * ok.nbytes
    assert sent > ok.nbytes
    assert samples[("tensorbits_request_duration_seconds_count", (("route", infer),))] == 3
    backend = [k for k in samples if k[0] == "tensorbits_backend_info"]
    assert backend
    assert dict(backend[0][1])["backend"] == "numpy"
    assert samples[("tensorbits_inflight_requests", ())] == 0


def test_request_id_is_echoed_or_made(client: TestClient) -> None:
    given = client.get("/v2/health/live", headers={"X-Request-ID": "trace-42"})
    assert given.headers["x-request-id"] == "trace-42"
    made = client.get("/v2/health/live").headers["x-request-id"]
    assert len(made) == 32
    assert int(made, 16) >= 0


def test_readiness_turns_false_while_draining() -> None:
    drain = Drain()
    with v2_client(drain=drain) as client:
        assert client.get("/v2/health/ready").status_code == 200
        drain.begin()
        assert client.get("/v2/health/ready").status_code == 503
        assert client.get("/v2/models/" + NOT + "/ready").status_code == 503
        # Work already admitted, or arriving on an open connection, is still served.
        assert _infer(client, NOT, np.zeros(4, np.uint8)) == 200


def test_a_drain_is_the_apps_own() -> None:
    """Readiness is the state of the runtime that was handed the drain, not of the process: one
    app draining leaves another ready."""
    draining, other = Drain(), Drain()
    with v2_client(drain=draining) as stopping, v2_client(drain=other) as serving:
        draining.begin()
        assert stopping.get("/v2/health/ready").status_code == 503
        assert serving.get("/v2/health/ready").status_code == 200


def test_request_tally_exports_counters_and_a_cumulative_histogram() -> None:
    tally = RequestTally(buckets=(0.1, 1.0))
    for seconds in (0.05, 0.1, 0.5, 2.0):  # a bound is inclusive ("le"): 0.1 is in the first
        tally.add("/r", "m", 200, seconds, 3, 5, version="2")
    tally.add("/r", "m", 400, 0.01, 1, 1, version="2")
    registry = CollectorRegistry()
    registry.register(tally)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }
    route = (("route", "/r"),)
    by = (("model", "m"), ("protocol", "http"), *route)
    assert samples[("tensorbits_requests_total", (*by, ("status", "200"), ("version", "2")))] == 4
    assert samples[("tensorbits_requests_total", (*by, ("status", "400"), ("version", "2")))] == 1
    assert samples[("tensorbits_request_bytes_total", (("protocol", "http"), *route))] == 13
    assert samples[("tensorbits_response_bytes_total", (("protocol", "http"), *route))] == 21
    buckets = {le: samples[("tensorbits_request_duration_seconds_bucket", (("le", le), *route))]
               for le in ("0.1", "1.0", "+Inf")}  # fmt: skip
    assert buckets == {"0.1": 3, "1.0": 4, "+Inf": 5}
    assert samples[("tensorbits_request_duration_seconds_count", route)] == 5
    assert samples[("tensorbits_request_duration_seconds_sum", route)] == pytest.approx(2.66)


def test_refusals_count_by_rule_under_bounded_label_values() -> None:
    tally = RequestTally()
    tally.refuse("http", "m", 413, "max_body_bytes", "1")
    tally.refuse("http", "m", 413, "max_body_bytes", "1")
    tally.refuse("grpc", "m", 400, 'not a rule name {"x"}', "1")
    tally.refuse("grpc", "", 404, None)
    for i in range(MAX_RULE_LABELS + 10):
        tally.refuse("http", "m", 400, f"rule_{i}", "1")
    assert tally.refusals[("http", "m", 413, "max_body_bytes", "1")] == 2
    assert tally.refusals[("grpc", "m", 400, "other", "1")] == 1
    assert tally.refusals[("grpc", "", 404, "", "")] == 1
    rules = {rule for _, _, _, rule, _ in tally.refusals}
    assert len(rules) == MAX_RULE_LABELS + 2  # the names up to the bound, then "other"; ""
    # Another worker's refusals add up in a scrape.
    total = RequestTally().merged([json.loads(json.dumps(tally.snapshot()))])
    assert total.refusals == tally.refusals
