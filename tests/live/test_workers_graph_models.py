"""The repository extension on ``tensorbits serve --workers 2`` (``model_store.py``): a load,
through HTTP or gRPC, reaches whichever worker the connection landed on, and once it is
answered every worker serves the model; an unload, of a graph model or a built-in one, holds on
every worker too. Each check opens 40 new connections, which the kernel spreads over both
workers (each answers with its own request-id prefix, so the test sees both did)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from live.test_graph_models_served import (
    CONFIG,
    MODEL_FILE,
    X,
    Y,
    expected,
    family_model,
    http_load,
    xor_model,
)
from support.grpc_live import GrpcServer, serve_grpc
from support.live import serve
from support.rawhttp import Reply, ask, request
from support.repository_load import http_load as send_load
from support.repository_load import load_parameters
from support.v2 import NOT
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.integration

CONNECTIONS = 40


@pytest.fixture(scope="module")
def server() -> Iterator[GrpcServer]:
    with serve_grpc({"TENSORBITS_WORKERS": "2"}) as live:
        # Both workers up before the first load: the second may still be starting when the
        # first answers ready (one started later applies the store at start, but this tests
        # the workers that serve meanwhile).
        assert len(_seen_workers(live)) == 2, "one worker answered every connection"
        yield live


def _worker(reply: Reply) -> str:
    """The worker that answered: the per-process half of the request id it made."""
    return reply.headers["x-request-id"][:16]


def _seen_workers(server: GrpcServer, seconds: float = 60) -> set[str]:
    """The workers that answer new connections, until two have or ``seconds`` have passed (a
    connection the kernel gave a worker just killed is reset: tried again)."""
    seen: set[str] = set()
    deadline = time.monotonic() + seconds
    while len(seen) < 2 and time.monotonic() < deadline:
        try:
            seen.add(_worker(ask(server.http, request("GET", "/v2/health/ready"))))
        except ConnectionError:
            time.sleep(0.05)
    return seen


def _infer_body(feeds: dict[str, np.ndarray[Any, Any]]) -> bytes:
    inputs = [
        {"name": k, "shape": list(v.shape), "datatype": "UINT8", "data": v.reshape(-1).tolist()}
        for k, v in feeds.items()
    ]
    return json.dumps({"inputs": inputs}).encode()


def _on_every_connection(
    server: GrpcServer, method: str, path: str, body: bytes = b""
) -> list[Reply]:
    """The replies of ``CONNECTIONS`` new connections, each sent the one request; both workers
    answered some."""
    headers = {"Content-Type": "application/json"} if body else {}
    replies = [ask(server.http, request(method, path, headers, body)) for _ in range(CONNECTIONS)]
    assert len({_worker(reply) for reply in replies}) == 2, "one worker took every connection"
    return replies


def _assert_served_everywhere(server: GrpcServer, name: str, data: bytes) -> None:
    feeds = {"x": X, "y": Y}
    want = {k: v.tolist() for k, v in expected(data, feeds).items()}
    for reply in _on_every_connection(
        server, "POST", f"/v2/models/{name}/infer", _infer_body(feeds)
    ):
        assert reply.status == 200, (reply.status, reply.body[:300])
        got = {
            o["name"]: np.array(o["data"]).reshape(o["shape"]).tolist()
            for o in reply.json()["outputs"]
        }
        assert got == want


def test_an_http_load_and_unload_hold_on_every_worker(server: GrpcServer) -> None:
    data = family_model()
    assert http_load(server, "family", CONFIG, data) == (200, {})
    _assert_served_everywhere(server, "family", data)
    for reply in _on_every_connection(server, "GET", "/v2/models/family/ready"):
        assert reply.status == 200
    unloaded = ask(server.http, request("POST", "/v2/repository/models/family/unload"))
    assert unloaded.status == 200
    body = _infer_body({"x": X, "y": Y})
    for reply in _on_every_connection(server, "POST", "/v2/models/family/infer", body):
        assert reply.status == 404, (reply.status, reply.body[:300])
    # Loaded again with another file: that one everywhere.
    other = xor_model()
    assert http_load(server, "family", CONFIG, other) == (200, {})
    for reply in _on_every_connection(server, "GET", "/v2/models/family"):
        assert reply.status == 200
        assert [i["name"] for i in reply.json()["inputs"]] == ["a", "b"]
    assert ask(server.http, request("POST", "/v2/repository/models/family/unload")).status == 200


def test_a_builtin_unload_and_load_hold_on_every_worker(server: GrpcServer) -> None:
    path = f"/v2/models/{NOT}/ready"
    try:
        reply = ask(server.http, request("POST", f"/v2/repository/models/{NOT}/unload"))
        assert reply.status == 200
        for reply in _on_every_connection(server, "GET", path):
            assert reply.status == 400, (reply.status, reply.body[:300])
            assert "unloaded" in reply.json()["error"]
    finally:
        reply = ask(server.http, request("POST", f"/v2/repository/models/{NOT}/load"))
        assert reply.status == 200
    for reply in _on_every_connection(server, "GET", path):
        assert reply.status == 200


def test_a_grpc_load_is_served_by_every_worker(server: GrpcServer) -> None:
    data = family_model()
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    try:
        client.load_model("family_grpc", config=CONFIG, files={MODEL_FILE: data})
        _assert_served_everywhere(server, "family_grpc", data)
        client.unload_model("family_grpc")
    finally:
        client.close()
    for reply in _on_every_connection(server, "GET", "/v2/models/family_grpc/ready"):
        assert reply.status == 404


def _applied_by(temporary: Path) -> dict[int, Path]:
    """The workers of the server whose temporary folder is in ``temporary``, by pid: each has an
    ``applied`` file in the model store while it serves."""
    found = {}
    for path in temporary.glob("tensorbits-workers-*/models/applied/*"):
        found[int(path.name.split(".")[0])] = path
    return found


def test_a_worker_started_in_place_of_a_dead_one_serves_what_was_loaded(tmp_path: Path) -> None:
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    env = {"TENSORBITS_WORKERS": "2", "TENSORBITS_GRPC_PORT": "0", "TMPDIR": str(temporary)}
    with serve(env) as live:
        server = GrpcServer(live, 0)  # HTTP only: the helpers take the pair
        deadline = time.monotonic() + 60
        while len(_applied_by(temporary)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = _applied_by(temporary)
        assert len(workers) == 2, workers
        data = family_model()
        assert http_load(server, "family", CONFIG, data) == (200, {})
        dead = min(workers)
        os.kill(dead, signal.SIGKILL)
        # Until the new worker answers too (it listens once it has applied the store).
        assert len(_seen_workers(server)) == 2
        # The dead worker's file stays until a load finds it dead.
        assert len(set(_applied_by(temporary)) - {dead}) == 2, _applied_by(temporary)
        _assert_served_everywhere(server, "family", data)  # the new worker too
        started = time.monotonic()
        other = xor_model()
        assert http_load(server, "other", CONFIG, other) == (200, {})
        assert time.monotonic() - started < 10, "the load waited for the dead worker"
        assert dead not in _applied_by(temporary)  # found dead by that load: its file removed
        for reply in _on_every_connection(server, "GET", "/v2/models/other/ready"):
            assert reply.status == 200


def test_a_model_named_like_the_stores_own_files_is_served_and_loads_go_on(
    server: GrpcServer,
) -> None:
    data = family_model()
    assert http_load(server, "applied.x", CONFIG, data) == (200, {})
    _assert_served_everywhere(server, "applied.x", data)
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    try:
        client.load_model("applied.1.0", config=CONFIG, files={MODEL_FILE: data})
        _assert_served_everywhere(server, "applied.1.0", data)
        client.unload_model("applied.1.0")
    finally:
        client.close()
    assert http_load(server, "after_applied", CONFIG, data) == (200, {})
    _assert_served_everywhere(server, "after_applied", data)
    for name in ("applied.x", "after_applied"):
        assert (
            ask(server.http, request("POST", f"/v2/repository/models/{name}/unload")).status == 200
        )


RACERS = 8
ROOM = 2


def _racing_load(server: GrpcServer, name: str, start: threading.Barrier) -> tuple[int, str]:
    """One load on a new connection, over HTTP for even racers and gRPC for odd ones, sent
    once every racer is ready to send (``start``): the status as HTTP says it (gRPC's
    RESOURCE_EXHAUSTED is 413, any other code 0) and the refusal's words (with gRPC's code)."""
    data = xor_model()
    if int(name.removeprefix("racer")) % 2 == 0:
        parameters = load_parameters(CONFIG, {MODEL_FILE: data})
        start.wait()
        status, error = send_load(server.http.base_url, name, parameters)
        return status, str(error.get("error", ""))
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    try:
        start.wait()
        client.load_model(name, config=CONFIG, files={MODEL_FILE: data})
    except InferenceServerException as exc:
        code = str(exc.status())
        return (413 if code == "StatusCode.RESOURCE_EXHAUSTED" else 0), f"{code}: {exc.message()}"
    finally:
        client.close()
    return 200, ""


def test_loads_racing_for_the_last_places_are_served_everywhere_or_refused() -> None:
    env = {"TENSORBITS_WORKERS": "2", "TENSORBITS_MAX_LOADED_MODELS": str(ROOM)}
    with serve_grpc(env) as live:
        assert len(_seen_workers(live)) == 2, "one worker answered every connection"
        names = [f"racer{i}" for i in range(RACERS)]
        start = threading.Barrier(RACERS)
        with ThreadPoolExecutor(RACERS) as pool:
            answers = dict(
                zip(names, pool.map(lambda n: _racing_load(live, n, start), names), strict=True)
            )
        loaded = sorted(name for name, (status, _) in answers.items() if status == 200)
        assert len(loaded) == ROOM, answers
        for status, words in answers.values():
            if status != 200:
                assert status == 413, answers
                assert "TENSORBITS_MAX_LOADED_MODELS" in words
        # Every worker answers the same for each model: served by all, or by none.
        for name in names:
            want = 200 if name in loaded else 404
            for reply in _on_every_connection(live, "GET", f"/v2/models/{name}/ready"):
                assert reply.status == want, (name, reply.status, reply.body[:300])
        index = ask(live.http, request("POST", "/v2/repository/index", body=b"{}"))
        assert index.status == 200
        assert (
            sorted(e["name"] for e in json.loads(index.body) if e["name"].startswith("racer"))
            == loaded
        )
