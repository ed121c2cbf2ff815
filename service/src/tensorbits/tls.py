"""HTTPS: ``tensorbits serve`` serves TLS when given a certificate and its key.

``TENSORBITS_TLS_CERT_FILE`` (PEM, the server's certificate followed by any intermediates) and
``TENSORBITS_TLS_KEY_FILE`` (PEM; ``TENSORBITS_TLS_KEY_PASSWORD`` if it is encrypted) come both
or neither. uvicorn does the serving (``ssl_certfile``/``ssl_keyfile``); this module checks the
pair at start-up, when the settings are built, so a wrong path, a key that does not match the
certificate or a wrong password is a one-line settings error instead of a traceback from the
server's start (or, for an encrypted key without a password, OpenSSL prompting on a terminal
that a container does not have).
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tensorbits.config import Settings


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


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's TLS arguments for ``settings``; none when TLS is not configured."""
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return {}
    password = settings.tls_key_password
    return {
        "ssl_certfile": str(settings.tls_cert_file),
        "ssl_keyfile": str(settings.tls_key_file),
        "ssl_keyfile_password": password.get_secret_value() if password is not None else None,
    }
