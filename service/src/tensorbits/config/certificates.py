"""Checking the TLS certificate and key pair when the settings are built (config.py).

The pair is loaded as the server will load it, so a wrong path, a key that does not match the
certificate or a wrong password is a one-line settings error instead of a traceback from the
server's start (or, for an encrypted key without a password, OpenSSL prompting on a terminal
that a container does not have). Kept apart from tls.py, whose uvicorn options are read off the
settings: the settings need this check.
"""

from __future__ import annotations

import ssl
from pathlib import Path


def _no_password() -> str:
    # Given to OpenSSL instead of nothing: an encrypted key then fails to load, it does not
    # make OpenSSL ask for a password on stdin.
    return ""


def check_certificate(cert_file: Path, key_file: Path, password: str | None) -> None:
    """Load the pair as the server will; ValueError with the reason if it does not load."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert_file, key_file, password or _no_password)
    except ssl.SSLError as exc:
        raise ValueError(
            f"TLS certificate {cert_file} and key {key_file} do not load together "
            f"({exc.reason or exc}): not PEM, a key of another certificate, or an encrypted key "
            "without its password (TENSORBITS_TLS_KEY_PASSWORD)"
        ) from None
    except OSError as exc:
        raise ValueError(
            f"TLS certificate {cert_file} or key {key_file}: cannot read it "
            f"({exc.strerror or type(exc).__name__})"
        ) from None
