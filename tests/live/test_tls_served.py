"""HTTPS on the real server: ``tensorbits serve`` with a certificate made in the test (trustme),
the SDK verifying it against the test's CA (a CA bundle's path or an ``SSLContext``), refusing it
when that CA is not trusted, and the container health check following the server to HTTPS."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import numpy as np
import pytest
from support.live import START_TIMEOUT_S, LiveServer, serve
from support.sdk import assert_both_apis_answer
from support.tls import write_tls_files

from tensorbits_client import APIConnectionError, AsyncClient, AuthenticationError, Client

trustme = pytest.importorskip("trustme", reason="trustme not installed (dev dependency)")
if TYPE_CHECKING:
    from trustme import CA

pytestmark = pytest.mark.integration

KEY = "tb-tls-key-8c1f3e5a7b9d0246"
HEALTHCHECK = Path(__file__).resolve().parents[2] / "docker" / "healthcheck.py"


@dataclass(frozen=True)
class TlsServer:
    server: LiveServer
    ca: CA
    ca_file: Path

    @property
    def base_url(self) -> str:
        return f"https://{self.server.url}"


def _wait_ready_https(server: LiveServer, context: ssl.SSLContext) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    with httpx.Client(verify=context, timeout=2) as client:
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                raise RuntimeError(f"tensorbits serve exited with {server.proc.returncode}")
            try:
                if client.get(f"https://{server.url}/v2/health/ready").status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
    raise RuntimeError(f"the HTTPS server was not ready in {START_TIMEOUT_S} s")


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    folder = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    tls, ca_file = write_tls_files(ca, folder)
    env = {**tls, "TENSORBITS_API_KEYS": KEY}
    with serve(env, ready=None) as server:
        context = ssl.create_default_context()
        ca.configure_trust(context)
        _wait_ready_https(server, context)
        yield TlsServer(server, ca, ca_file)


def test_sdk_round_trip_verifying_against_a_ca_bundle(tls_server: TlsServer) -> None:
    data = np.arange(256, dtype=np.uint8)
    with Client(tls_server.base_url, api_key=KEY, verify=str(tls_server.ca_file)) as client:
        assert_both_apis_answer(client, data)
        # The key still counts over TLS.
        with pytest.raises(AuthenticationError):
            client.with_options(api_key="wrong").dml.bit_not(data)


def test_async_sdk_round_trip_with_an_ssl_context(tls_server: TlsServer) -> None:
    data = np.arange(1 << 16, dtype=np.uint32)
    context = ssl.create_default_context()
    tls_server.ca.configure_trust(context)

    async def run() -> None:
        async with AsyncClient(tls_server.base_url, api_key=KEY, verify=context) as client:
            np.testing.assert_array_equal(await client.dml.bit_not(data), ~data)

    asyncio.run(run())


def test_tritonclient_over_tls_with_a_key(tls_server: TlsServer) -> None:
    """The stock tritonclient, as docs/reliability.md shows it: ssl=True with the CA, and the
    key as a header."""
    import tritonclient.http as triton

    data = np.arange(6, dtype=np.uint8).reshape(2, 3)
    client = triton.InferenceServerClient(
        tls_server.server.url,
        ssl=True,
        ssl_options={"ca_certs": str(tls_server.ca_file)},
        ssl_context_factory=ssl.create_default_context,
        network_timeout=30,
    )
    try:
        tensor = triton.InferInput("InputTensor", list(data.shape), "UINT8")
        tensor.set_data_from_numpy(data, binary_data=True)
        headers = {"Authorization": f"Bearer {KEY}"}
        result = client.infer("DML_OPERATOR_ELEMENT_WISE_BIT_NOT", [tensor], headers=headers)
        np.testing.assert_array_equal(result.as_numpy("OutputTensor"), ~data)
    finally:
        client.close()


def test_an_untrusted_certificate_is_refused(tls_server: TlsServer, tmp_path: Path) -> None:
    data = np.arange(4, dtype=np.uint8)
    stranger = tmp_path / "other-ca.crt"
    trustme.CA().cert_pem.write_to_path(str(stranger))
    # The default (the system's CAs) and another CA both refuse the test CA's certificate.
    for verify in (True, str(stranger)):
        with (
            Client(tls_server.base_url, api_key=KEY, verify=verify, max_retries=0) as client,
            pytest.raises(APIConnectionError) as caught,
        ):
            client.dml.bit_not(data)
        assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)


def test_the_name_is_checked_too(tls_server: TlsServer, tmp_path: Path) -> None:
    """A certificate for other names, from the trusted CA, is refused: the hostname counts."""
    other = tmp_path / "other-names"
    other.mkdir()
    cert = tls_server.ca.issue_cert("tensorbits.example")
    cert.private_key_pem.write_to_path(str(other / "tls.key"))
    cert.cert_chain_pems[0].write_to_path(str(other / "tls.crt"))
    env = {
        "TENSORBITS_TLS_CERT_FILE": str(other / "tls.crt"),
        "TENSORBITS_TLS_KEY_FILE": str(other / "tls.key"),
    }
    with serve(env, ready=None) as server:
        unverified = ssl.create_default_context()
        unverified.check_hostname = False
        unverified.verify_mode = ssl.CERT_NONE
        _wait_ready_https(server, unverified)
        url = f"https://{server.url}"
        with (
            Client(url, verify=str(tls_server.ca_file), max_retries=0) as client,
            pytest.raises(APIConnectionError) as caught,
        ):
            client.operators()
        assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)


def test_plain_http_gets_no_answer(tls_server: TlsServer) -> None:
    url = f"http://{tls_server.server.url}"
    with Client(url, api_key=KEY, max_retries=0) as client, pytest.raises(APIConnectionError):
        client.dml.bit_not(np.zeros(4, np.uint8))


def test_the_container_health_check_follows_the_server_to_https(tls_server: TlsServer) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "TENSORBITS_HOST": "0.0.0.0",
        "TENSORBITS_PORT": str(tls_server.server.port),
        "TENSORBITS_TLS_CERT_FILE": "/etc/tensorbits/config/tls/tls.crt",  # only its presence counts
    }
    result = subprocess.run(
        [sys.executable, str(HEALTHCHECK)], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    plain = {k: v for k, v in env.items() if not k.startswith("TENSORBITS_TLS")}
    result = subprocess.run(
        [sys.executable, str(HEALTHCHECK)], env=plain, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 1
