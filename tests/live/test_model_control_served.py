"""Triton's model control modes on a live server, with the stock ``tritonclient`` over HTTP and
gRPC: in ``poll`` mode a model folder dropped into the repository is served, a removed one
unloaded, a new version folder served as the new version, a folder written slowly never served
half, and with two workers every new connection gets the same answer; in ``none`` (and
``poll``) the load and unload API is refused with each protocol's refusal."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from core.graph_models import masked_model
from support.grpc_live import GrpcServer, serve_grpc
from support.rawhttp import ask, request
from support.v2 import NOT
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.integration

POLL_SECS = 0.5
# A state the server reaches within a poll or two: waited for this long at most (a loaded
# machine's scheduling, a model's build), never slept for.
DEADLINE_S = 30.0
MODEL = "masked"
X = np.array([[255, 255, 255, 255]], np.uint8)
WANT = [[1, 3, 7, 15]]  # masked_model's constant: z = x AND k
CONNECTIONS = 40
NOT_EXPLICIT = "explicit model load / unload is not allowed if polling is enabled"


def _wait_for(state: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not state():
        assert time.monotonic() < deadline, f"not {what} in {DEADLINE_S} s"
        time.sleep(0.05)


def _write_model(root: Path, name: str = MODEL, version: str = "1") -> None:
    (root / name / version).mkdir(parents=True, exist_ok=True)
    (root / name / version / "model.onnx").write_bytes(masked_model())


@pytest.fixture(scope="module")
def polled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GrpcServer, Path]]:
    pytest.importorskip("onnxruntime")
    root = tmp_path_factory.mktemp("polled")
    env = {
        "TENSORBITS_MODEL_REPOSITORY": str(root),
        "TENSORBITS_MODEL_CONTROL_MODE": "poll",
        "TENSORBITS_REPOSITORY_POLL_SECS": str(POLL_SECS),
    }
    with serve_grpc(env) as live:
        yield live, root


def _clients(server: GrpcServer) -> tuple[Any, Any]:
    http = triton_http.InferenceServerClient(server.http.url)
    grpc = triton_grpc.InferenceServerClient(server.grpc_url)
    return http, grpc


def _answers(server: GrpcServer, name: str = MODEL) -> list[tuple[str, list[list[int]]]]:
    """The model's version and output as each protocol answers an inference."""
    found = []
    for module, client in zip((triton_http, triton_grpc), _clients(server), strict=True):
        tensor = module.InferInput("x", list(X.shape), "UINT8")
        tensor.set_data_from_numpy(X)
        result = client.infer(name, [tensor])
        response = result.get_response()
        version = response["model_version"] if module is triton_http else response.model_version
        found.append((version, result.as_numpy("z").tolist()))
    return found


def _ready_on_both(server: GrpcServer, name: str = MODEL) -> bool:
    http, grpc = _clients(server)
    try:
        return bool(http.is_model_ready(name)) and bool(grpc.is_model_ready(name))
    except InferenceServerException:
        return False


def _gone_on_both(server: GrpcServer, name: str) -> bool:
    refusals = []
    for client in _clients(server):
        try:
            client.get_model_metadata(name)
        except InferenceServerException as exc:
            refusals.append(exc.status())
    return refusals == ["404", "StatusCode.NOT_FOUND"]


def test_a_folder_dropped_in_is_served_a_new_version_too_and_a_removed_one_unloaded(
    polled: tuple[GrpcServer, Path],
) -> None:
    server, root = polled
    name = "dropped"
    _write_model(root, name)
    _wait_for(lambda: _ready_on_both(server, name), "served")
    assert _answers(server, name) == [("1", WANT), ("1", WANT)]

    _write_model(root, name, "2")
    _wait_for(lambda: _answers(server, name)[0][0] == "2", "served at version 2")
    _wait_for(lambda: _answers(server, name) == [("2", WANT), ("2", WANT)], "2 on both")
    http, grpc = _clients(server)
    assert http.get_model_metadata(name)["versions"] == ["2"]
    assert list(grpc.get_model_metadata(name).versions) == ["2"]

    shutil.rmtree(root / name)
    _wait_for(lambda: _gone_on_both(server, name), "unloaded")
    index = {entry["name"] for entry in http.get_model_repository_index()}
    assert name not in index


def test_a_folder_written_slowly_is_never_served_half(polled: tuple[GrpcServer, Path]) -> None:
    server, root = polled
    name = "slow"
    whole = masked_model()
    (root / name / "1").mkdir(parents=True)
    path = root / name / "1" / "model.onnx"
    step = max(1, len(whole) // 8)
    with path.open("wb") as file:
        for start in range(0, len(whole), step):
            end = min(start + step, len(whole))
            file.write(whole[start:end])
            file.flush()
            if end == len(whole):
                break  # whole now: it may be served from the next settled poll on
            # Slower than a poll: the server sees every part of the file on its way.
            deadline = time.monotonic() + POLL_SECS * 1.5
            while time.monotonic() < deadline:
                assert not _ready_on_both(server, name), f"served at {end} of {len(whole)} bytes"
                time.sleep(0.05)
    _wait_for(lambda: _ready_on_both(server, name), "served once whole")
    assert _answers(server, name) == [("1", WANT), ("1", WANT)]


def _load_refusals(server: GrpcServer) -> list[tuple[str, str]]:
    """What a load and an unload of NOT get over each protocol: the status and the words."""
    found = []
    for client in _clients(server):
        for action in (client.load_model, client.unload_model):
            with pytest.raises(InferenceServerException) as refused:
                action(NOT)
            found.append((str(refused.value.status()), refused.value.message()))
    return found


def test_poll_mode_refuses_the_load_api_on_both_protocols(
    polled: tuple[GrpcServer, Path],
) -> None:
    server, _ = polled
    refusals = _load_refusals(server)
    assert [status for status, _ in refusals] == [
        "400",
        "400",
        *["StatusCode.FAILED_PRECONDITION"] * 2,
    ]
    for _, words in refusals:
        assert NOT_EXPLICIT in words, words
        assert "'poll'" in words, words
    assert _ready_on_both(server, NOT)  # nothing was unloaded


def test_none_mode_serves_the_repository_and_refuses_the_load_api(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    _write_model(tmp_path)
    env = {"TENSORBITS_MODEL_REPOSITORY": str(tmp_path), "TENSORBITS_MODEL_CONTROL_MODE": "none"}
    with serve_grpc(env) as server:
        assert _answers(server) == [("1", WANT), ("1", WANT)]
        refusals = _load_refusals(server)
        assert [s for s, _ in refusals] == ["400", "400", *["StatusCode.FAILED_PRECONDITION"] * 2]
        for _, words in refusals:
            assert NOT_EXPLICIT in words, words
            assert "'none'" in words, words


def _every_connection(server: GrpcServer, name: str) -> list[tuple[str, str]]:
    """The (worker, model version) of ``CONNECTIONS`` new connections, each one inference."""
    body = json.dumps(
        {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "UINT8", "data": [255] * 4}]}
    ).encode()
    found = []
    for _ in range(CONNECTIONS):
        reply = ask(
            server.http,
            request("POST", f"/v2/models/{name}/infer", {"Content-Type": "application/json"}, body),
        )
        version = reply.json().get("model_version", f"status {reply.status}")
        found.append((reply.headers["x-request-id"][:16], str(version)))
    return found


def _every_connection_says(server: GrpcServer, said: str) -> bool:
    return {seen for _, seen in _every_connection(server, MODEL)} == {said}


def test_two_workers_in_poll_mode_agree_on_every_connection(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    env = {
        "TENSORBITS_WORKERS": "2",
        "TENSORBITS_MODEL_REPOSITORY": str(tmp_path),
        "TENSORBITS_MODEL_CONTROL_MODE": "poll",
        "TENSORBITS_REPOSITORY_POLL_SECS": str(POLL_SECS),
    }
    with serve_grpc(env) as server:
        for version in ("1", "2"):
            _write_model(tmp_path, version=version)
            _wait_for(
                partial(_every_connection_says, server, version),
                f"version {version} on every connection",
            )
            answers = _every_connection(server, MODEL)
            assert len({worker for worker, _ in answers}) == 2, "one worker took every connection"
            assert {seen for _, seen in answers} == {version}, answers
            grpc = triton_grpc.InferenceServerClient(server.grpc_url)
            assert list(grpc.get_model_metadata(MODEL).versions) == [version]
        shutil.rmtree(tmp_path / MODEL)
        _wait_for(partial(_every_connection_says, server, "status 404"), "unloaded everywhere")
