"""The version a graph model is served at, said alike everywhere: a repository folder holding
``<name>/2/model.onnx`` is served at version 2, and the statistics extension (HTTP's and gRPC's),
Triton's ``nv_inference_*`` series and the access log say 2, as the index, the metadata and the
answers do; a built-in model stays at 1."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from typing import IO, Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from core.graph_models import masked_model
from support.grpc_live import GrpcServer
from support.live import free_port, metric_samples, serve
from support.v2 import NOT

pytestmark = pytest.mark.integration

MODEL = "masked"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GrpcServer, IO[bytes]]]:
    root = tmp_path_factory.mktemp("versions")
    for version in ("1", "2"):
        (root / MODEL / version).mkdir(parents=True)
        (root / MODEL / version / "model.onnx").write_bytes(masked_model())
    grpc_port = free_port()
    env = {
        "TENSORBITS_GRPC_PORT": str(grpc_port),
        "TENSORBITS_MODEL_REPOSITORY": str(root),
        "TENSORBITS_LOG_JSON": "true",
        "TENSORBITS_LOG_LEVEL": "info",
    }
    with tempfile.TemporaryFile() as log, serve(env, stderr=log) as server:
        yield GrpcServer(server, grpc_port), log


def _infer(module: Any, client: Any, request_id: str) -> Any:
    tensor = module.InferInput("x", [1, 4], "UINT8")
    tensor.set_data_from_numpy(np.array([[255, 255, 255, 255]], np.uint8))
    # The id as a header too: an HTTP call's access line is logged under its X-Request-Id.
    return client.infer(
        MODEL, [tensor], request_id=request_id, headers={"x-request-id": request_id}
    )


def test_statistics_metrics_and_answers_say_the_version_served(
    served: tuple[GrpcServer, IO[bytes]],
) -> None:
    server, log = served
    http = triton_http.InferenceServerClient(server.http.url)
    grpc = triton_grpc.InferenceServerClient(server.grpc_url)
    answers = [
        _infer(triton_http, http, "v-http").get_response()["model_version"],
        _infer(triton_grpc, grpc, "v-grpc").get_response().model_version,
    ]
    assert answers == ["2", "2"]
    assert http.get_model_metadata(MODEL)["versions"] == ["2"]

    over_http = http.get_inference_statistics(MODEL)["model_stats"]
    by_version = http.get_inference_statistics(MODEL, "2")["model_stats"]
    over_grpc = grpc.get_inference_statistics(MODEL, as_json=True)["model_stats"]
    every_http = {e["name"]: e for e in http.get_inference_statistics()["model_stats"]}
    every_grpc = {e["name"]: e for e in grpc.get_inference_statistics(as_json=True)["model_stats"]}
    for entry in (*over_http, *by_version, *over_grpc, every_http[MODEL], every_grpc[MODEL]):
        assert (entry["name"], entry["version"]) == (MODEL, "2"), entry
    assert every_http[NOT]["version"] == every_grpc[NOT]["version"] == "1"
    assert int(over_grpc[0]["inference_count"]) == 2

    samples = metric_samples(server.http.base_url)
    success = {k: v for k, v in samples.items() if k.startswith("nv_inference_request_success{")}
    assert f'nv_inference_request_success{{model="{MODEL}",version="2"}}' in success, success
    assert not [k for k in success if f'model="{MODEL}"' in k and 'version="2"' not in k]
    assert f'nv_inference_request_success{{model="{NOT}",version="1"}}' in success
    # The server's own series name it too, on both protocols.
    counted = {k for k in samples if k.startswith("tensorbits_requests_total{") and MODEL in k}
    assert {('protocol="http"' in k, 'version="2"' in k) for k in counted} == {
        (True, True),
        (False, True),
    }, counted

    lines = _access_lines(log, {"v-http", "v-grpc"})
    assert {lines[i]["version"] for i in ("v-http", "v-grpc")} == {"2"}, lines


def _access_lines(log: IO[bytes], ids: set[str]) -> dict[str, dict[str, Any]]:
    """The access log's lines of ``ids``, once every one is written (10 s at most)."""
    deadline = time.monotonic() + 10
    found: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        log.seek(0)
        lines = [json.loads(x) for x in log.read().decode().splitlines() if x.startswith("{")]
        found = {
            line["request_id"]: line
            for line in lines
            if line.get("logger") == "tensorbits.access" and line.get("request_id") in ids
        }
        if ids <= set(found):
            break
        time.sleep(0.05)
    return found
