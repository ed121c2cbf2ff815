"""API keys on the real server (``tensorbits serve``, keys from a mounted-Secret-like file): the
SDK (sync and async, ``api_key=`` and ``$TENSORBITS_API_KEY``) and the stock ``tritonclient.http``
with ``headers=`` get through with a key and are refused without one; the probes stay open; the
server's log names refusals, never the key."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import pytest
import tritonclient.http as triton
from support.live import LiveServer, serve
from support.rawhttp import ask
from support.sdk import assert_both_apis_answer
from tritonclient.utils import InferenceServerException

from tensorbits_client import AsyncClient, AuthenticationError, Client

pytestmark = pytest.mark.integration

KEY = "tb-live-key-3f0c9a7e51d24b6e8a1c"
SECOND_KEY = "tb-live-key-rotation-7d2e4b1a9c"
WRONG = "tb-live-wrong-key-never-logged-5e1"
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    secret = tmp_path_factory.mktemp("secret") / "api-keys"
    secret.write_text(f"# mounted from a Kubernetes Secret\n{KEY}\n{SECOND_KEY}\n")
    # Ready once /v2/health/ready answers 200, which it does without a key.
    with serve({"TENSORBITS_API_KEYS_FILE": str(secret)}) as server:
        yield server


def _log_entries(log: IO[bytes]) -> list[dict[str, Any]]:
    log.seek(0)
    text = log.read().decode()
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


# --- the SDK --------------------------------------------------------------------------------------
def test_sdk_with_api_key(keyed: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TENSORBITS_API_KEY", raising=False)
    data = np.arange(64, dtype=np.uint8)
    for key in (KEY, SECOND_KEY):
        with Client(keyed.base_url, api_key=key) as client:
            assert_both_apis_answer(client, data)
    for client in (Client(keyed.base_url), Client(keyed.base_url, api_key=WRONG)):
        with client, pytest.raises(AuthenticationError) as caught:
            client.dml.bit_not(data)
        assert caught.value.status_code == 401
        assert caught.value.code == "unauthorized"
        assert caught.value.response.headers["www-authenticate"].startswith(
            'Bearer realm="tensorbits"'
        )


def test_sdk_with_the_environment_variable(
    keyed: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TENSORBITS_API_KEY", KEY)
    data = np.arange(16, dtype=np.uint16)
    with Client(keyed.base_url) as client:
        np.testing.assert_array_equal(client.dml.bit_not(data), ~data)
        # map() runs on an async twin, which must carry the key as well
        results = client.map(NOT, [data, data + 1], concurrency=2)
        np.testing.assert_array_equal(results[1], ~(data + 1))
    monkeypatch.setenv("TENSORBITS_API_KEY", WRONG)
    with Client(keyed.base_url) as client, pytest.raises(AuthenticationError):
        client.dml.bit_not(data)


def test_async_sdk(keyed: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TENSORBITS_API_KEY", raising=False)
    data = np.arange(32, dtype=np.uint32)

    async def run() -> None:
        async with AsyncClient(keyed.base_url, api_key=KEY) as client:
            np.testing.assert_array_equal(await client.dml.bit_not(data), ~data)
        monkeypatch.setenv("TENSORBITS_API_KEY", SECOND_KEY)
        async with AsyncClient(keyed.base_url) as client:
            np.testing.assert_array_equal(await client.dml.bit_not(data), ~data)
        async with AsyncClient(keyed.base_url, api_key=WRONG) as client:
            with pytest.raises(AuthenticationError):
                await client.dml.bit_not(data)

    asyncio.run(run())


# --- tritonclient, unchanged ----------------------------------------------------------------------
def _triton_infer(client: triton.InferenceServerClient, data: Any, **kwargs: Any) -> Any:
    tensor = triton.InferInput("InputTensor", list(data.shape), "UINT8")
    tensor.set_data_from_numpy(data, binary_data=True)
    return client.infer(NOT, [tensor], **kwargs)


def test_tritonclient_with_headers(keyed: LiveServer) -> None:
    data = np.arange(10, dtype=np.uint8).reshape(2, 5)
    client = triton.InferenceServerClient(keyed.url, network_timeout=30)
    try:
        assert client.is_server_live()  # the probes need no key
        assert client.is_server_ready()
        for headers in ({"Authorization": f"Bearer {KEY}"}, {"X-API-Key": SECOND_KEY}):
            result = _triton_infer(client, data, headers=headers)
            np.testing.assert_array_equal(result.as_numpy("OutputTensor"), ~data)
            assert client.is_model_ready(NOT, headers=headers)
            assert client.get_server_metadata(headers=headers)["name"] == "tensorbits"
        assert not client.is_model_ready(NOT)  # 401: not ready as far as it can tell
        for refused in (None, {"Authorization": f"Bearer {WRONG}"}):
            with pytest.raises(InferenceServerException) as caught:
                _triton_infer(client, data, headers=refused)
            assert caught.value.status() == "401"
            assert "API key" in str(caught.value.message())
    finally:
        client.close()


# --- the wire -----------------------------------------------------------------------------------
def test_a_refused_upload_leaves_the_connection_usable(keyed: LiveServer) -> None:
    """The 401 comes before the body is read; the body is then skipped, and the next request on
    the same connection (with a key) is served."""
    body = b"x" * (4 << 20)
    with socket.create_connection(("127.0.0.1", keyed.port), timeout=10) as sock:
        sock.sendall(
            f"POST /v1/batch HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        )
        sock.sendall(body)
        data = b""
        while b"}" not in data:
            data += sock.recv(65536)
        assert data.startswith(b"HTTP/1.1 401 ")
        sock.sendall(f"GET /v2 HTTP/1.1\r\nHost: x\r\nX-API-Key: {KEY}\r\n\r\n".encode())
        data = b""
        while b"tensorbits" not in data:
            chunk = sock.recv(65536)
            assert chunk, "the connection was closed"
            data += chunk
        assert data.startswith(b"HTTP/1.1 200 ")


def test_open_and_closed_routes(keyed: LiveServer) -> None:
    for path in ("/v2/health/live", "/v2/health/ready"):
        assert keyed.get(path) == 200
    for path in ("/metrics", "/docs", "/openapi.json", "/v2", "/v1/operators"):
        status, headers, body = ask(keyed, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert status == 401, path
        assert headers["www-authenticate"] == 'Bearer realm="tensorbits"'
        assert json.loads(body)["code"] == "unauthorized"
        status, _, _ = ask(
            keyed, f"GET {path} HTTP/1.1\r\nHost: x\r\nX-API-Key: {KEY}\r\n\r\n".encode()
        )
        assert status == 200, path


def test_the_log_names_refusals_never_the_key(tmp_path: Path) -> None:
    env = {"TENSORBITS_API_KEYS": f"{KEY},{SECOND_KEY}", "TENSORBITS_LOG_LEVEL": "info"}
    with (tmp_path / "stderr.log").open("w+b") as log_file:
        with serve(env, stderr=log_file) as server:
            status, _, _ = ask(
                server,
                f"GET /v2 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {WRONG}\r\n"
                "X-Request-ID: refused-once\r\n\r\n".encode(),
            )
            assert status == 401
            status, _, _ = ask(
                server, f"GET /v2 HTTP/1.1\r\nHost: x\r\nX-API-Key: {KEY}\r\n\r\n".encode()
            )
            assert status == 200
        # The server has stopped: every line is written.
        entries = _log_entries(log_file)
        log_file.seek(0)
        text = log_file.read().decode()
    mine = [e for e in entries if e.get("request_id") == "refused-once"]
    refusal = [e for e in mine if e["logger"] == "tensorbits.auth"]
    access = [e for e in mine if e["logger"] == "tensorbits.access"]
    assert refusal, mine
    assert refusal[0]["level"] == "warning"
    assert refusal[0]["credential_header"] == "Authorization"
    assert access[0]["status"] == 401
    for secret in (WRONG, KEY, SECOND_KEY):
        assert secret not in text


def test_a_server_without_keys_is_unchanged(live_server: LiveServer) -> None:
    """The session's plain server: no key needed anywhere, a stray key ignored."""
    data = np.arange(8, dtype=np.uint8)
    with Client(live_server.base_url, api_key="anything") as client:
        np.testing.assert_array_equal(client.dml.bit_not(data), ~data)
    status, headers, _ = ask(live_server, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 200
    assert "www-authenticate" not in headers


def test_serve_refuses_an_empty_key_file(tmp_path: Path) -> None:
    empty = tmp_path / "api-keys"
    empty.write_text("# nothing yet\n")
    with (tmp_path / "stderr").open("w+b") as stderr:
        with serve({"TENSORBITS_API_KEYS_FILE": str(empty)}, stderr=stderr, ready=None) as server:
            assert server.proc.wait(timeout=60) == 2
        stderr.seek(0)
        assert b"holds no key" in stderr.read()
