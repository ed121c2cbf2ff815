"""What operators and Triton users see of the gRPC endpoint beside the HTTP one: the same model
configuration, statistics counted across both protocols, API keys read from metadata, health
and readiness that follow the drain, a busy port reported before anything starts."""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from google.protobuf import json_format
from grpc_health.v1 import health_pb2
from prometheus_client.parser import text_string_to_metric_families
from support.grpc_live import GrpcServer, health_check, serve_grpc
from support.inprocess import app_client
from support.live import TENSORBITS, free_port
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from tensorbits.runtime import Drain
from tensorbits_protocol.operators import OPERATORS

pytestmark = pytest.mark.integration

NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"


def _http_json(server: GrpcServer, path: str) -> Any:
    with urllib.request.urlopen(f"{server.http.base_url}{path}", timeout=10) as response:
        return json.load(response)


@pytest.mark.parametrize("op", OPERATORS, ids=lambda op: op.name)
def test_model_config_is_the_http_one(grpc_server: GrpcServer, op: Any) -> None:
    client = triton_grpc.InferenceServerClient(grpc_server.grpc_url)
    over_grpc = client.get_model_config(op.name).config
    over_http = json_format.ParseDict(
        _http_json(grpc_server, f"/v2/models/{op.name}/config"), model_config_pb2.ModelConfig()
    )
    assert over_grpc == over_http
    assert over_grpc.name == op.name
    assert [t.name for t in over_grpc.input] == list(op.inputs)


def _stats(client: triton_grpc.InferenceServerClient) -> tuple[int, int, int]:
    (entry,) = client.get_inference_statistics(NOT).model_stats
    stats = entry.inference_stats
    return stats.success.count, stats.fail.count, entry.inference_count


def test_statistics_count_both_protocols(grpc_server: GrpcServer) -> None:
    grpc_client = triton_grpc.InferenceServerClient(grpc_server.grpc_url)
    http_client = triton_http.InferenceServerClient(grpc_server.http.url)
    before = _stats(grpc_client)
    x = np.arange(6, dtype=np.uint8)
    for client, module, times in ((http_client, triton_http, 3), (grpc_client, triton_grpc, 2)):
        for _ in range(times):
            tensor = module.InferInput("InputTensor", [6], "UINT8")
            tensor.set_data_from_numpy(x)
            client.infer(NOT, [tensor])
    tensor = triton_grpc.InferInput("InputTensor", [6], "INT32")
    tensor.set_data_from_numpy(x.astype(np.int32))
    with pytest.raises(InferenceServerException):  # INT32 is not a 3_0 type: one failure
        grpc_client.infer(NOT, [tensor], parameters={"feature_level": "3_0"})
    success, fail, inferences = _stats(grpc_client)
    assert (success - before[0], fail - before[1], inferences - before[2]) == (5, 1, 5)
    # Both protocols read the same statistics.
    (http_entry,) = _http_json(grpc_server, f"/v2/models/{NOT}/stats")["model_stats"]
    assert http_entry["inference_stats"]["success"]["count"] == success


def test_api_keys_from_metadata() -> None:
    with serve_grpc({"TENSORBITS_API_KEYS": "k1,k2"}) as server:
        client = triton_grpc.InferenceServerClient(server.grpc_url)
        assert client.is_server_live()  # /v2/health/live is open, so is ServerLive
        with pytest.raises(InferenceServerException) as caught:
            client.get_model_metadata(NOT)
        assert caught.value.status() == "StatusCode.UNAUTHENTICATED"
        assert "an API key is required" in str(caught.value.message())
        with pytest.raises(InferenceServerException) as caught:
            client.get_model_metadata(NOT, headers={"authorization": "Bearer nope"})
        assert caught.value.status() == "StatusCode.UNAUTHENTICATED"
        assert caught.value.message() == "the API key is not valid"
        assert client.get_model_metadata(NOT, headers={"authorization": "Bearer k2"}).name == NOT
        assert client.get_model_metadata(NOT, headers={"x-api-key": "k1"}).name == NOT
        with grpc.insecure_channel(server.grpc_url) as channel:  # the probe needs no key
            answer = health_check(channel)(health_pb2.HealthCheckRequest(), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_readiness_follows_the_drain() -> None:
    drain = Drain()
    port = free_port()
    with app_client(drain=drain, grpc_port=port):
        client = triton_grpc.InferenceServerClient(f"127.0.0.1:{port}")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            check = health_check(channel)
            request = health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService")
            assert client.is_server_ready()
            assert check(request, timeout=10).status == health_pb2.HealthCheckResponse.SERVING
            drain.begin()
            assert not client.is_server_ready()
            assert not client.is_model_ready(NOT)
            assert client.is_server_live()
            status = check(request, timeout=10).status
            assert status == health_pb2.HealthCheckResponse.NOT_SERVING


def test_busy_grpc_port_is_one_line() -> None:
    with serve_grpc() as server:
        other = free_port()
        result = subprocess.run(
            [str(TENSORBITS), "serve", "--port", str(other)],
            env={"PATH": "/usr/bin:/bin", "TENSORBITS_GRPC_PORT": str(server.grpc_port),
                 "TENSORBITS_BACKEND": "numpy"},
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"tensorbits: 127.0.0.1:{server.grpc_port} is already in use; choose another port with "
        "TENSORBITS_GRPC_PORT=<port> (0 switches gRPC off)"
    )


def _requests_counted(server: GrpcServer, route: str, status: int, model: str = "") -> float:
    with urllib.request.urlopen(f"{server.http.base_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    version = "1" if model not in ("", "unknown") else ""  # the version served, if any
    labels = {
        "route": route,
        "model": model,
        "version": version,
        "status": str(status),
        "protocol": "grpc",
    }
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "tensorbits_requests_total" and sample.labels == labels
    )


def test_calls_are_counted_in_metrics(grpc_server: GrpcServer) -> None:
    client = triton_grpc.InferenceServerClient(grpc_server.grpc_url)
    route = "/inference.GRPCInferenceService/ModelMetadata"
    # Each counted under the model it names (one this server does not serve: "unknown").
    ok = _requests_counted(grpc_server, route, 200, NOT)
    missing = _requests_counted(grpc_server, route, 404, "unknown")
    client.get_model_metadata(NOT)
    client.get_model_metadata(NOT)
    with pytest.raises(InferenceServerException):
        client.get_model_metadata("nope")
    assert _requests_counted(grpc_server, route, 200, NOT) == ok + 2
    assert _requests_counted(grpc_server, route, 404, "unknown") == missing + 1


def test_a_message_that_never_arrives_is_cut_off() -> None:
    """A call whose message does not come within TENSORBITS_TIMEOUT_BODY_READ is answered
    DEADLINE_EXCEEDED, and calls from other clients are answered meanwhile."""
    with serve_grpc({"TENSORBITS_TIMEOUT_BODY_READ": "1"}) as server:
        release = threading.Event()

        def never() -> Iterator[bytes]:
            release.wait(30)  # holds the call open with no message
            yield b""

        with grpc.insecure_channel(server.grpc_url) as channel:
            stalled: grpc.StreamUnaryMultiCallable[bytes, bytes] = channel.stream_unary(
                "/inference.GRPCInferenceService/ServerLive"
            )
            future = stalled.future(never(), timeout=30)
            client = triton_grpc.InferenceServerClient(server.grpc_url)
            assert client.is_server_live()  # a bystander is served while it waits
            with pytest.raises(grpc.RpcError) as caught:
                future.result(timeout=20)
            release.set()
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert caught.value.details() == (
            "the ServerLive request message did not arrive within 1 s "
            "(TENSORBITS_TIMEOUT_BODY_READ)"
        )


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"grpc_port": 70000}, "less than or equal to 65535"),
        ({"grpc_port": -1}, "greater than or equal to 0"),
        ({"grpc_port": "eight"}, "valid integer"),
        ({"grpc_port": 9000, "port": 9000}, "need ports of their own"),
    ],
)
def test_bad_grpc_ports_are_settings_errors(settings: dict[str, Any], words: str) -> None:
    from pydantic import ValidationError

    from tensorbits.config.settings import Settings

    with pytest.raises(ValidationError) as caught:
        Settings(**settings)
    assert words in str(caught.value)
