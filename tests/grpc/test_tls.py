"""gRPC over TLS when the server has a certificate: the same certificate and key as HTTPS, the
stock tritonclient.grpc verifying it against the test's CA, the API key still required."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from support.live import START_TIMEOUT_S, free_port, serve
from support.tls import write_tls_files
from tritonclient.utils import InferenceServerException

trustme = pytest.importorskip("trustme", reason="trustme not installed (dev dependency)")

pytestmark = pytest.mark.integration

KEY = "tb-grpc-tls-key-5d2e9a"
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"


def test_grpc_serves_tls_with_the_https_certificate(tmp_path: Path) -> None:
    tls, ca_file = write_tls_files(trustme.CA(), tmp_path)
    port = free_port()
    env = {**tls, "TENSORBITS_API_KEYS": KEY, "TENSORBITS_GRPC_PORT": str(port)}
    with serve(env, ready=None) as server:
        client = triton_grpc.InferenceServerClient(
            f"127.0.0.1:{port}", ssl=True, root_certificates=str(ca_file)
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # the HTTP readiness route is HTTPS here: wait on the gRPC side instead
            assert server.proc.poll() is None, "the server exited"
            try:
                if client.is_server_ready():
                    break
            except InferenceServerException:
                pass
            assert time.monotonic() < deadline, "gRPC over TLS was not ready"
            time.sleep(0.1)
        x = np.arange(16, dtype=np.uint8)
        tensor = triton_grpc.InferInput("InputTensor", [16], "UINT8")
        tensor.set_data_from_numpy(x)
        result = client.infer(NOT, [tensor], headers={"authorization": f"Bearer {KEY}"})
        assert (result.as_numpy("OutputTensor") == ~x).all()
        with pytest.raises(InferenceServerException) as caught:
            client.infer(NOT, [tensor])
        assert caught.value.status() == "StatusCode.UNAUTHENTICATED"  # the key counts
        plain = triton_grpc.InferenceServerClient(f"127.0.0.1:{port}")  # no TLS: refused
        with pytest.raises(InferenceServerException):
            plain.is_server_live(client_timeout=5)


def test_an_encrypted_key_is_a_settings_error_with_grpc_on(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from pydantic import ValidationError

    from tensorbits.config.settings import Settings

    cert = trustme.CA().issue_cert("127.0.0.1")
    key = serialization.load_pem_private_key(cert.private_key_pem.bytes(), password=None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    (tmp_path / "tls.key").write_bytes(encrypted)
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))

    def settings(grpc_port: int) -> Settings:
        return Settings(
            tls_cert_file=tmp_path / "tls.crt",
            tls_key_file=tmp_path / "tls.key",
            tls_key_password="secret",
            grpc_port=grpc_port,
        )

    with pytest.raises(ValidationError) as caught:
        settings(grpc_port=8001)  # checked, never bound
    assert "gRPC serves TLS only with an unencrypted key" in str(caught.value)
    assert settings(grpc_port=0).tls_key_password is not None  # HTTPS alone: fine
