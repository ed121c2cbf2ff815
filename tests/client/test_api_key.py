"""The SDK's API key and TLS options, offline: the key is sent as a Bearer token (argument first,
then $TENSORBITS_API_KEY), never shown, kept by with_options and map()'s async twin; a 401 is an
``AuthenticationError``, not retried; ``verify`` becomes what httpx 0.28 takes. The live
round trips are in tests/live/test_auth_served.py and test_tls_served.py."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import httpx
import numpy as np
import pytest
from fake_server import FakeServer, json_error

from tensorbits_client import (
    APIStatusError,
    AsyncClient,
    AuthenticationError,
    Client,
)
from tensorbits_client._base import ssl_verify

KEY = "tb-sdk-key-0123456789abcdef"
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"


def _unauthorized(request: httpx.Request) -> httpx.Response:
    return json_error(
        401, "the API key is not valid", code="unauthorized", field="Authorization", rule="api_key"
    )


def _authorization(server: FakeServer) -> list[str | None]:
    return [r.headers.get("authorization") for r in server.requests]


def test_the_key_is_sent_as_a_bearer_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TENSORBITS_API_KEY", raising=False)
    server = FakeServer(_unauthorized)
    for client, expected in [
        (server.client(api_key=KEY), f"Bearer {KEY}"),
        (server.client(), None),
        (server.client(api_key=""), None),
    ]:
        with client, pytest.raises(APIStatusError):
            client.infer(NOT, {"InputTensor": np.zeros(4, np.uint8)})
        assert _authorization(server)[-1] == expected


def test_the_key_falls_back_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORBITS_API_KEY", KEY)
    server = FakeServer(_unauthorized)
    with server.client() as client, pytest.raises(AuthenticationError):
        client.infer(NOT, {"InputTensor": np.zeros(4, np.uint8)})
    with server.client(api_key="explicit") as client, pytest.raises(AuthenticationError):
        client.infer(NOT, {"InputTensor": np.zeros(4, np.uint8)})
    # An explicit Authorization header is the caller's word: it wins over the key.
    with (
        server.client(default_headers={"Authorization": "Bearer from-headers"}) as client,
        pytest.raises(AuthenticationError),
    ):
        client.infer(NOT, {"InputTensor": np.zeros(4, np.uint8)})
    assert _authorization(server) == [f"Bearer {KEY}", "Bearer explicit", "Bearer from-headers"]


def test_a_401_is_an_authentication_error_and_is_not_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TENSORBITS_API_KEY", raising=False)
    server = FakeServer(_unauthorized)
    with (
        server.client(api_key="wrong", max_retries=3) as client,
        pytest.raises(AuthenticationError) as caught,
    ):
        client.infer(NOT, {"InputTensor": np.zeros(4, np.uint8)})
    assert len(server.requests) == 1
    error = caught.value
    assert error.status_code == 401
    assert (error.code, error.field, error.rule) == ("unauthorized", "Authorization", "api_key")
    assert "wrong" not in str(error)


def test_the_async_client_sends_the_key_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORBITS_API_KEY", KEY)
    server = FakeServer(_unauthorized)

    async def run() -> None:
        async with server.async_client() as client:
            with pytest.raises(AuthenticationError):
                await client.infer(NOT, {"InputTensor": np.zeros(4, np.uint8)})

    asyncio.run(run())
    assert _authorization(server) == [f"Bearer {KEY}"]


def test_the_key_is_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TENSORBITS_API_KEY", raising=False)
    server = FakeServer(_unauthorized)
    with server.client(api_key=KEY) as client:
        assert KEY not in repr(client)
        assert "api_key=set" in repr(client)
        with pytest.raises(AuthenticationError) as caught:
            client.infer(NOT, {"InputTensor": np.zeros(4, np.uint8)})
        assert KEY not in repr(caught.value.request)
        assert KEY not in repr(caught.value.request.headers)  # httpx masks Authorization
        assert KEY not in str(vars(caught.value))
    with server.client() as client:
        assert "api_key=none" in repr(client)


def test_with_options_and_the_async_twin_keep_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TENSORBITS_API_KEY", raising=False)
    server = FakeServer(_unauthorized)
    with server.client(api_key=KEY) as client:
        for copy, expected in [
            (client.with_options(max_retries=0), f"Bearer {KEY}"),
            (client.with_options(api_key="rotated"), "Bearer rotated"),
        ]:
            with pytest.raises(AuthenticationError):
                copy.infer(NOT, {"InputTensor": np.zeros(4, np.uint8)})
            assert _authorization(server)[-1] == expected
        twin = client._async_twin()
        assert twin._auth_headers == {"Authorization": f"Bearer {KEY}"}
        assert twin._verify is client._verify
        asyncio.run(twin.close())


def test_verify_becomes_what_httpx_takes(tmp_path: Path) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    assert ssl_verify(True) is True
    assert ssl_verify(False) is False
    context = ssl.create_default_context()
    assert ssl_verify(context) is context
    for path in (str(bundle), bundle):
        made = ssl_verify(path)
        assert isinstance(made, ssl.SSLContext)
        assert made.verify_mode == ssl.CERT_REQUIRED
        assert made.check_hostname
        assert len(made.get_ca_certs()) == 1
    with pytest.raises(FileNotFoundError):
        ssl_verify(tmp_path / "missing.pem")
    # The clients build their pool with it (no httpx deprecation warning: filterwarnings=error).
    with Client("https://127.0.0.1:1", verify=str(bundle)):
        pass

    async def make_async() -> None:
        async with AsyncClient("https://127.0.0.1:1", verify=bundle):
            pass

    asyncio.run(make_async())
