"""TLS material for a live server, made in the test by a ``trustme`` CA."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from trustme import CA


class TlsFiles(NamedTuple):
    """The server's environment naming its certificate and key, and the CA's certificate for a
    client to verify the server against."""

    env: dict[str, str]
    ca_file: Path


def write_tls_files(ca: CA, folder: Path) -> TlsFiles:
    """A certificate for 127.0.0.1 and localhost issued by ``ca``, its key and the CA's own
    certificate, written in ``folder``."""
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file, ca_file = folder / "tls.crt", folder / "tls.key", folder / "ca.crt"
    cert.private_key_pem.write_to_path(str(key_file))
    # The chain as a Kubernetes TLS Secret holds it: leaf first, then any intermediates.
    for blob in cert.cert_chain_pems:
        blob.write_to_path(str(cert_file), append=True)
    ca.cert_pem.write_to_path(str(ca_file))
    env = {"TENSORBITS_TLS_CERT_FILE": str(cert_file), "TENSORBITS_TLS_KEY_FILE": str(key_file)}
    return TlsFiles(env, ca_file)
