"""The base URL: tritonclient's ``host:port`` is taken, a URL that cannot work is refused at
construction, and a connection error names the URL it tried and how many attempts it made.

``Client("127.0.0.1:8000")`` used to retry for 1.2 s and then say the URL lacked
a protocol; a refused connection said "Connection refused" and nothing of where.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import Any

import httpx
import numpy as np
import pytest

from tensorbits_client import APIConnectionError, APITimeoutError, AsyncClient, Client
from tensorbits_client import _constants as constants

ALLOWED = "allowed: http://host:port, https://host:port, or host:port (http:// assumed)"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("localhost:8000", "http://localhost:8000"),
        ("localhost", "http://localhost"),
        ("[::1]:8000", "http://[::1]:8000"),
        ("tensorbits.example:8000/prefix/", "http://tensorbits.example:8000/prefix/"),
        ("  http://127.0.0.1:8000  ", "http://127.0.0.1:8000"),
        ("https://tensorbits.example", "https://tensorbits.example"),
    ],
)
@pytest.mark.parametrize("client_class", [Client, AsyncClient])
def test_host_port_means_http(given: str, expected: str, client_class: type[Any]) -> None:
    client = client_class(given)
    assert client.base_url == httpx.URL(expected)
    assert client._url("/v2") == expected.rstrip("/") + "/v2"


@pytest.mark.parametrize(
    "verify", [False, ssl.create_default_context(), "/etc/ssl/certs/ca-certificates.crt"]
)
def test_host_port_means_https_when_verify_says_tls(verify: Any) -> None:
    with Client("tensorbits.example:8443", verify=verify) as client:
        assert client.base_url == httpx.URL("https://tensorbits.example:8443")


def test_an_explicit_scheme_wins_over_verify() -> None:
    with Client("http://tensorbits.example:8000", verify=False) as client:
        assert client.base_url.scheme == "http"


def test_host_port_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(constants.BASE_URL_ENV, "10.0.0.7:9000")
    with Client() as client:
        assert client.base_url == httpx.URL("http://10.0.0.7:9000")


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ("ftp://tensorbits.example", "scheme 'ftp' is not supported"),
        ("://tensorbits.example", "scheme '' is not supported"),
        ("http://tensorbits.example:99999", "port 99999 is not in 1..65535"),
        ("http://tensorbits.example:0", "port 0 is not in 1..65535"),
        ("http://tensorbits.example:abc", "Invalid port: 'abc'"),
        ("localhost:abc", "neither a URL with '://' nor host:port"),
        ("http:/127.0.0.1:8000", "neither a URL with '://' nor host:port"),
        ("http://", "no valid host"),
        ("not a url", "host 'not%20a%20url' is not valid"),
        ("http://h:8000/?x=1", "a query or fragment cannot precede the request paths"),
    ],
)
@pytest.mark.parametrize("client_class", [Client, AsyncClient])
def test_malformed_urls_are_refused_at_construction(
    given: str, why: str, client_class: type[Any]
) -> None:
    with pytest.raises(ValueError, match=r"^base_url ") as caught:
        client_class(given)
    assert str(caught.value) == f"base_url {given.strip()!r}: {why} ({ALLOWED})"


def test_a_malformed_environment_url_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(constants.BASE_URL_ENV, "ftp://x")
    with pytest.raises(ValueError, match=r"^\$TENSORBITS_URL 'ftp://x': scheme 'ftp'"):
        Client()


def test_a_url_of_the_wrong_type_is_a_type_error() -> None:
    with pytest.raises(TypeError) as caught:
        Client(8000)  # type: ignore[arg-type]
    assert str(caught.value) == (
        "base_url must be a str or httpx.URL (http://host:port, https://host:port, or host:port "
        "(http:// assumed)), got int 8000"
    )


# --- connection errors --------------------------------------------------------------------------


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.fixture
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "INITIAL_RETRY_DELAY", 0.01)


@pytest.mark.usefixtures("quick_backoff")
def test_a_refused_connection_names_the_url_and_the_attempts() -> None:
    port = closed_port()
    client = Client(f"127.0.0.1:{port}", max_retries=2, local_validation=False)
    with client, pytest.raises(APIConnectionError) as caught:
        client.infer("onnx.BitwiseNot-18", {"X": np.zeros(2, np.uint8)})
    error = caught.value
    assert not isinstance(error, APITimeoutError)
    assert error.attempts == 3
    assert "Connection refused" in error.message
    assert error.message.endswith(
        f" (POST http://127.0.0.1:{port}/v2/models/onnx.BitwiseNot-18/infer, 3 attempts)"
    )
    assert str(error) == error.message


@pytest.mark.usefixtures("quick_backoff")
def test_async_refused_connection_names_the_url_and_the_attempts() -> None:
    port = closed_port()

    async def call() -> None:
        async with AsyncClient(f"127.0.0.1:{port}", max_retries=1) as client:
            await client.operators()

    with pytest.raises(APIConnectionError) as caught:
        asyncio.run(call())
    assert caught.value.attempts == 2
    assert "Connection refused" in caught.value.message
    assert caught.value.message.endswith(f" (GET http://127.0.0.1:{port}/v1/operators, 2 attempts)")


@pytest.mark.usefixtures("quick_backoff")
def test_a_timeout_names_the_url_and_the_attempts() -> None:
    with socket.socket() as listener:  # accepts, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = Client(f"127.0.0.1:{port}", timeout=0.2, max_retries=1)
        with client, pytest.raises(APITimeoutError) as caught:
            client.operators()
    assert caught.value.message == (
        f"Request timed out: ReadTimeout (GET http://127.0.0.1:{port}/v1/operators, 2 attempts)"
    )


def test_one_attempt_is_singular_and_no_password_is_shown() -> None:
    request = httpx.Request("GET", "http://user:secret@tensorbits.test:8000/v1/operators")
    error = APIConnectionError(request, "Connection error: refused")
    assert str(error) == (
        "Connection error: refused (GET http://tensorbits.test:8000/v1/operators, 1 attempt)"
    )
    assert error.reason == "Connection error: refused"


def test_host_port_reaches_a_live_server(server_url: str) -> None:
    host_port = server_url.removeprefix("http://")
    with Client(host_port, max_retries=0) as client:
        assert client.operators()["onnx.BitwiseNot-18"].inputs == ("X",)
        np.testing.assert_array_equal(
            client.onnx.bitwise_not(np.arange(4, dtype=np.uint8)), ~np.arange(4, dtype=np.uint8)
        )
