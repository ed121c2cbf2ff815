"""HTTPS: ``tensorbits serve`` serves TLS when given a certificate and its key.

``TENSORBITS_TLS_CERT_FILE`` (PEM, the server's certificate followed by any intermediates) and
``TENSORBITS_TLS_KEY_FILE`` (PEM; ``TENSORBITS_TLS_KEY_PASSWORD`` if it is encrypted) come both
or neither. uvicorn does the serving (``ssl_certfile``/``ssl_keyfile``, from ``uvicorn_options``);
the pair is checked at start-up, when the settings are built (certificates.py), so a wrong path,
a key that does not match the certificate or a wrong password is a one-line settings error
instead of a traceback from the server's start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tensorbits.config.settings import Settings


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
