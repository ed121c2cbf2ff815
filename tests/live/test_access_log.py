"""The live server's access and lifecycle lines in JSON, and /metrics' model labels, on both
protocols: a refused inference's line names its model, client, request id, the protocol's own
status, and the refusal's rule and field; a load or unload through the API leaves a line naming
the model; the same calls over HTTP and gRPC count under the same labels; every line names the
process that wrote it; the start-up line lists the models (graph models too) and the features
on."""

from __future__ import annotations

import json
import os
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from core.graph_models import MASKED_PBTXT, masked_model
from support.grpc_live import GrpcServer
from support.live import free_port, serve
from support.v2 import NOT
from tritonclient.utils import InferenceServerException

from tensorbits.grpc import inference_pb2 as pb

pytestmark = pytest.mark.integration


def _lines(log: IO[bytes]) -> list[dict[str, Any]]:
    log.seek(0)
    return [json.loads(line) for line in log.read().decode().splitlines() if line.startswith("{")]


def _lines_once(
    log: IO[bytes], done: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    """The log's lines once ``done`` holds of them (a call's line is written as it ends, which
    may be just after its client has the answer), or after 10 s, whatever they are then."""
    deadline = time.monotonic() + 10
    while not done(lines := _lines(log)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return lines


@pytest.fixture
def logged() -> Iterator[tuple[GrpcServer, IO[bytes]]]:
    """A server with gRPC, JSON logs at info level to a file."""
    grpc_port = free_port()
    env = {
        "TENSORBITS_GRPC_PORT": str(grpc_port),
        "TENSORBITS_LOG_JSON": "true",
        "TENSORBITS_LOG_LEVEL": "info",
    }
    with tempfile.TemporaryFile() as log, serve(env, stderr=log) as server:
        yield GrpcServer(server, grpc_port), log


def _refused_input(module: Any) -> Any:
    # NOT takes numbers, not booleans: refused by a rule naming the input.
    tensor = module.InferInput("InputTensor", [4], "BOOL")
    tensor.set_data_from_numpy(np.zeros(4, dtype=np.bool_))
    return tensor


def test_a_refused_inference_is_explained_alike_on_both_protocols(
    logged: tuple[GrpcServer, IO[bytes]],
) -> None:
    server, log = logged
    http = triton_http.InferenceServerClient(server.http.url)
    with pytest.raises(InferenceServerException):
        http.infer(NOT, [_refused_input(triton_http)], headers={"X-Request-ID": "http-7"})
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as refused:
        client.infer(NOT, [_refused_input(triton_grpc)], request_id="grpc-7")
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    # No id in the request: the metadata's is the line's.
    with pytest.raises(InferenceServerException):
        client.infer(NOT, [_refused_input(triton_grpc)], headers={"x-request-id": "meta-7"})

    ids = {"http-7", "grpc-7", "meta-7"}
    lines = _lines_once(log, lambda lines: ids <= {line.get("request_id") for line in lines})
    access = {
        line["request_id"]: line
        for line in lines
        if line["logger"] == "tensorbits.access" and "request_id" in line
    }
    assert ids <= set(access), [
        (v["message"], v.get("rule"), v.get("model")) for v in access.values()
    ]
    http_line, grpc_line, meta_line = access["http-7"], access["grpc-7"], access["meta-7"]
    assert http_line["status"] == 400
    assert grpc_line["status"] == meta_line["status"] == "INVALID_ARGUMENT"
    assert (http_line["protocol"], grpc_line["protocol"]) == ("http", "grpc")
    for line in (http_line, grpc_line, meta_line):
        assert line["model"] == NOT, line
        assert line["client"].rpartition(":")[0].endswith("127.0.0.1"), line
        assert line["refusal"] == "invalid_request", line
        assert line["rule"], line
        assert line["field"], line
        assert isinstance(line["pid"], int), line
    # The same refusal, the same words for it on both protocols.
    assert (http_line["rule"], http_line["field"]) == (grpc_line["rule"], grpc_line["field"])


def test_grpc_sends_back_the_request_id_it_logged(logged: tuple[GrpcServer, IO[bytes]]) -> None:
    server, _ = logged
    with grpc.insecure_channel(server.grpc_url) as channel:
        live = channel.unary_unary(
            "/inference.GRPCInferenceService/ServerLive",
            request_serializer=pb.ServerLiveRequest.SerializeToString,
            response_deserializer=pb.ServerLiveResponse.FromString,
        )
        _, call = live.with_call(pb.ServerLiveRequest(), metadata=(("x-request-id", "live-3"),))
    assert ("x-request-id", "live-3") in tuple(call.trailing_metadata() or ())


def test_a_load_and_an_unload_through_the_api_leave_a_line_naming_the_model(
    logged: tuple[GrpcServer, IO[bytes]],
) -> None:
    server, log = logged
    http = triton_http.InferenceServerClient(server.http.url)
    http.unload_model(NOT)
    http.load_model(NOT)
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException):
        client.load_model("NO_SUCH_MODEL")
    lines = _lines_once(
        log, lambda lines: sum(line["logger"] == "tensorbits.models" for line in lines) >= 3
    )
    lifecycle = [line for line in lines if line["logger"] == "tensorbits.models"]
    outcomes = [(line["model"], line["action"], line["outcome"]) for line in lifecycle]
    assert outcomes == [
        (NOT, "unload", "unloaded"),
        (NOT, "load", "loaded"),
        ("NO_SUCH_MODEL", "load", "refused"),
    ]
    assert all(line["source"] == "api" for line in lifecycle)
    assert lifecycle[0]["version"] == "1"
    assert lifecycle[2]["refusal"] == "not_found"
    assert lifecycle[2]["reason"]


def _requests_by_labels(text: str) -> dict[str, float]:
    """tensorbits_requests_total's samples of the inference routes, keyed by their labels
    without the route and the protocol (the route names the protocol's own path)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("tensorbits_requests_total{"):
            continue
        labels, _, value = line.rpartition(" ")
        if "infer" not in labels.lower():
            continue
        pairs = labels[len("tensorbits_requests_total{") : -1].split(",")
        key = ",".join(pair for pair in pairs if not pair.startswith(("route=", "protocol=")))
        found[key] = found.get(key, 0.0) + float(value)
    return found


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text: str = response.read().decode()
    return text


def test_inferences_count_under_their_model_alike_on_both_protocols() -> None:
    """The same calls (two answered, one refused) on each protocol, on a server of its own:
    the same model labels and counts in tensorbits_requests_total."""
    counted = {}
    for side in ("http", "grpc"):
        grpc_port = free_port()
        with serve({"TENSORBITS_GRPC_PORT": str(grpc_port)}) as server:
            module: Any = triton_http if side == "http" else triton_grpc
            url = server.url if side == "http" else f"127.0.0.1:{grpc_port}"
            client = module.InferenceServerClient(url)
            tensor = module.InferInput("InputTensor", [4], "UINT8")
            tensor.set_data_from_numpy(np.arange(4, dtype=np.uint8))
            client.infer(NOT, [tensor])
            client.infer(NOT, [tensor], model_version="1")
            with pytest.raises(InferenceServerException):
                client.infer(NOT, [_refused_input(module)])
            text = _metrics(server.port)
            counted[side] = _requests_by_labels(text)
            infer = [x for x in text.splitlines() if x.startswith("tensorbits_requests_total{")]
            assert all(f'protocol="{side}"' in x for x in infer if "nfer" in x), infer
    assert counted["grpc"] == counted["http"], counted
    assert counted["http"] == {
        f'model="{NOT}",status="200",version="1"': 2.0,
        f'model="{NOT}",status="400",version="1"': 1.0,
    }


def test_with_two_workers_every_line_names_its_process_and_the_start_line_says_what_is_on(
    tmp_path: Path,
) -> None:
    pytest.importorskip("onnxruntime")
    repository = tmp_path / "models"
    (repository / "masked" / "1").mkdir(parents=True)
    (repository / "masked" / "1" / "model.onnx").write_bytes(masked_model())
    (repository / "masked" / "config.pbtxt").write_text(MASKED_PBTXT)
    env = {
        "TENSORBITS_LOG_JSON": "true",
        "TENSORBITS_LOG_LEVEL": "info",
        "TENSORBITS_WORKERS": "2",
        "TENSORBITS_MODEL_REPOSITORY": str(repository),
        "TENSORBITS_API_KEYS": "k-" + "x" * 30,
        "TENSORBITS_AUTH_OPEN_PATHS": "/v2/health/ready,/v2/health/live",
    }
    with tempfile.TemporaryFile() as log:
        with serve(env, stderr=log) as server:
            assert server.get("/v2/health/live") == 200
            # Ready when one worker is: the other's start line may come a moment later.
            _lines_once(
                log,
                lambda lines: sum(line["message"] == "tensorbits started" for line in lines) >= 2,
            )
        lines = _lines(log)
    assert lines
    assert all(isinstance(line.get("pid"), int) for line in lines), lines
    started = [line for line in lines if line["message"] == "tensorbits started"]
    assert len(started) == 2, started
    assert len({line["pid"] for line in started}) == 2  # one per worker, told apart
    summary = started[0]
    assert summary["features"] == {
        "api_keys": True,
        "tls": False,
        "shared_memory": False,  # one process only: off with --workers
        "model_repository": True,
    }
    assert summary["workers"] == 2
    assert summary["ports"]["http"] == server.port
    assert summary["graph_models"] == ["masked"]
    assert summary["models"] == summary["operators"] + 1
    assert not any(str(line["message"]).startswith("malloc") for line in lines)
    assert os.getpid() not in {line["pid"] for line in lines}
