#!/usr/bin/env python3
"""Container health check: exit 0 when GET /v2/health/ready answers 200, else exit 1.

The images install this as ``tensorbits-healthcheck`` and name it in HEALTHCHECK; compose's
healthcheck runs it too. It reads the server's own settings (TENSORBITS_HOST, TENSORBITS_PORT),
so a port moved through the environment (KServe's 8080) is followed without editing anything.
TENSORBITS_HEALTHCHECK_URL replaces the whole URL. Standard library only: it runs on whatever
python3 the image has, and it bypasses any HTTP proxy set in the environment.

When the server serves HTTPS (TENSORBITS_TLS_CERT_FILE is set) the check does too, without
verifying the certificate: it dials its own container's loopback, where the certificate's names
do not apply, and it sends nothing secret (the health routes need no API key).
"""

from __future__ import annotations

import os
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping

READY_PATH = "/v2/health/ready"


def _connect_host(bind_host: str) -> str:
    """The address to dial for a server bound to ``bind_host`` (wildcards become loopback)."""
    host = bind_host.strip()
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "[::1]"
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


def ready_url(environ: Mapping[str, str]) -> str:
    override = environ.get("TENSORBITS_HEALTHCHECK_URL")
    if override:
        return override
    host = _connect_host(environ.get("TENSORBITS_HOST", "127.0.0.1"))
    port = environ.get("TENSORBITS_PORT", "8000").strip() or "8000"
    scheme = "https" if environ.get("TENSORBITS_TLS_CERT_FILE") else "http"
    return f"{scheme}://{host}:{port}{READY_PATH}"


def main() -> int:
    url = ready_url(os.environ)
    timeout = float(os.environ.get("TENSORBITS_HEALTHCHECK_TIMEOUT", "4"))
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if url.startswith("https:"):
        handlers.append(urllib.request.HTTPSHandler(context=ssl._create_unverified_context()))
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(url, timeout=timeout) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1
    if status != 200:
        print(f"unhealthy: {url} answered {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
