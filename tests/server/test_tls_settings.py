"""TLS settings, checked at start-up: certificate and key both or neither, and a pair that loads,
handed to uvicorn as its ``ssl_*`` arguments. The live HTTPS round trips are in
tests/live/test_tls_served.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tensorbits.config.settings import Settings
from tensorbits.server import cli
from tensorbits.server.serving import uvicorn_kwargs

trustme = pytest.importorskip("trustme", reason="trustme not installed (dev dependency)")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tls")
    cert = trustme.CA().issue_cert("127.0.0.1")
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    return cert_file, key_file


def test_without_tls_uvicorn_gets_no_ssl_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not any(k.startswith("ssl_") for k in uvicorn_kwargs(Settings()))
    for name in ("CERT_FILE", "KEY_FILE", "KEY_PASSWORD"):
        monkeypatch.setenv(f"TENSORBITS_TLS_{name}", "")  # empty: unset
    assert not any(k.startswith("ssl_") for k in uvicorn_kwargs(Settings()))


def test_a_certificate_and_key_reach_uvicorn(pair: tuple[Path, Path]) -> None:
    cert_file, key_file = pair
    settings = Settings(tls_cert_file=cert_file, tls_key_file=key_file)
    options = uvicorn_kwargs(settings)
    assert options["ssl_certfile"] == str(cert_file)
    assert options["ssl_keyfile"] == str(key_file)
    assert options["ssl_keyfile_password"] is None


def test_an_encrypted_key_needs_its_password(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    from cryptography.hazmat.primitives import serialization

    cert_file, key_file = pair
    key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    encrypted = tmp_path / "encrypted.pem"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"correct horse"),
        )
    )
    # Without the password OpenSSL would prompt on stdin; here it is a settings error.
    with pytest.raises(ValidationError, match="TENSORBITS_TLS_KEY_PASSWORD"):
        Settings(tls_cert_file=cert_file, tls_key_file=encrypted)
    with pytest.raises(ValidationError, match="do not load together"):
        Settings(tls_cert_file=cert_file, tls_key_file=encrypted, tls_key_password="wrong")
    settings = Settings(
        tls_cert_file=cert_file, tls_key_file=encrypted, tls_key_password="correct horse"
    )
    assert "correct horse" not in repr(settings)
    assert uvicorn_kwargs(settings)["ssl_keyfile_password"] == "correct horse"


def test_certificate_and_key_go_together(pair: tuple[Path, Path]) -> None:
    cert_file, key_file = pair
    with pytest.raises(ValidationError, match="set both or neither"):
        Settings(tls_cert_file=cert_file)
    with pytest.raises(ValidationError, match="set both or neither"):
        Settings(tls_key_file=key_file)
    with pytest.raises(ValidationError, match="no tls_key_file"):
        Settings(tls_key_password="secret")


def test_a_pair_that_does_not_load_is_refused(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    cert_file, _ = pair
    other_key = tmp_path / "other-key.pem"
    trustme.CA().issue_cert("127.0.0.1").private_key_pem.write_to_path(str(other_key))
    with pytest.raises(ValidationError, match="do not load together"):
        Settings(tls_cert_file=cert_file, tls_key_file=other_key)
    with pytest.raises(ValidationError, match="cannot read it"):
        Settings(tls_cert_file=cert_file, tls_key_file=tmp_path / "missing.pem")


def test_serve_refuses_to_start_with_half_a_pair(
    pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TENSORBITS_TLS_CERT_FILE", str(pair[0]))
    assert cli.main(["serve"]) == 2
    assert "tls_cert_file and tls_key_file go together" in capsys.readouterr().err
