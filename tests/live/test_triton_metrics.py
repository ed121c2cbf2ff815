"""Triton's per-model metrics on ``/metrics``, beside tensorbits' own, on a live server of their
own: every ``nv_inference_*`` series of every model, with Triton's labels, moves by exactly the
requests sent over HTTP, gRPC and the gRPC stream, successes and failures apart, and its
durations only with successes (the sums across worker processes: test_workers.py)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from prometheus_client.parser import text_string_to_metric_families
from support.grpc_live import GrpcServer, serve_grpc
from tritonclient.utils import InferenceServerException

from tensorbits.observability import FAILURE_REASON, TRITON_COUNTERS
from tensorbits_protocol.operators import OPERATORS

pytestmark = pytest.mark.integration

NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
X = np.arange(16, dtype=np.uint8)


@pytest.fixture(scope="module")
def server() -> Iterator[GrpcServer]:
    with serve_grpc() as running:
        yield running


def series(server: GrpcServer) -> dict[tuple[str, str], float]:
    """Every nv_inference_* sample by (name, model), as the exposition writes it: a counter of
    that very name (no ``_total``: Triton's names as they are), labelled as Triton labels it;
    and readable by a Prometheus parser."""
    with urllib.request.urlopen(f"{server.http.base_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    found = {}
    for line in text.splitlines():
        if line.startswith("# TYPE nv_inference_"):
            name, kind = line.split()[2:]
            assert kind == "counter", line
            assert families[name].type == "counter"
        if not line.startswith("nv_inference_"):
            continue
        name, _, rest = line.partition("{")
        labels_text, _, value = rest.rpartition("} ")
        labels = dict(pair.split("=") for pair in labels_text.split(","))
        expected = {"model", "version"}
        if name == "nv_inference_request_failure":
            expected.add("reason")
            assert labels["reason"] == f'"{FAILURE_REASON}"'
        assert set(labels) == expected, line
        assert labels["version"] == '"1"'
        found[(name, labels["model"].strip('"'))] = float(value)
    return found


def test_every_model_has_every_series_from_the_start(server: GrpcServer) -> None:
    found = series(server)
    names = {name for name, _, _ in TRITON_COUNTERS}
    assert names == {
        "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
        "nv_inference_exec_count", "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us", "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us", "nv_inference_compute_output_duration_us",
    }  # fmt: skip
    assert set(found) == {(name, op.name) for name in names for op in OPERATORS}


def test_the_series_move_by_exactly_the_requests_sent(server: GrpcServer) -> None:
    before = series(server)
    http = triton_http.InferenceServerClient(server.http.url)
    grpc_client = triton_grpc.InferenceServerClient(server.grpc_url)
    for module, client in ((triton_http, http), (triton_grpc, grpc_client)):
        tensor = module.InferInput("InputTensor", [16], "UINT8")
        tensor.set_data_from_numpy(X)
        for _ in range(3):
            client.infer(NOT, [tensor])
        with pytest.raises(InferenceServerException):  # a failure of this model
            client.infer(NOT, [tensor], parameters={"feature_level": "2_0"})
    answers: list[object] = []
    grpc_client.start_stream(callback=lambda result, error: answers.append((result, error)))
    tensor = triton_grpc.InferInput("InputTensor", [16], "UINT8")
    tensor.set_data_from_numpy(X)
    for _ in range(2):
        grpc_client.async_stream_infer(NOT, [tensor])
    grpc_client.stop_stream()  # waits for both answers
    http.close()
    grpc_client.close()
    after = series(server)

    def moved(name: str, model: str = NOT) -> float:
        return after[(name, model)] - before[(name, model)]

    successes, failures = 3 + 3 + 2, 2
    assert moved("nv_inference_request_success") == successes
    assert moved("nv_inference_count") == successes
    assert moved("nv_inference_exec_count") == successes
    assert moved("nv_inference_request_failure") == failures
    assert moved("nv_inference_queue_duration_us") == 0  # admission answers at once, never waits
    for phase in ("request", "compute_input", "compute_infer"):
        assert moved(f"nv_inference_{phase}_duration_us") > 0
    total = moved("nv_inference_request_duration_us")
    parts = sum(
        moved(f"nv_inference_{phase}_duration_us")
        for phase in ("queue", "compute_input", "compute_infer", "compute_output")
    )
    assert parts <= total + 4  # the phases are parts of the whole (each rounded down to a µs)
    for key, value in after.items():  # no other model moved
        if key[1] != NOT:
            assert value == before[key], key
    # The statistics extension says the same, from the same counts.
    with urllib.request.urlopen(f"{server.http.base_url}/v2/models/{NOT}/stats") as response:
        (stats,) = json.loads(response.read())["model_stats"]
    assert (
        stats["inference_stats"]["success"]["count"] == after[("nv_inference_request_success", NOT)]
    )
    assert (
        stats["inference_stats"]["success"]["ns"] // 1000
        == after[("nv_inference_request_duration_us", NOT)]
    )
