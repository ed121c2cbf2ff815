"""Optional API keys: with keys configured, every request but those to the open paths needs one.

Keys come from ``TENSORBITS_API_KEYS`` (comma-separated) and ``TENSORBITS_API_KEYS_FILE`` (one a
line, so a mounted Kubernetes Secret works), read once when the settings are built. A request
presents its key as ``Authorization: Bearer <key>`` or as ``X-API-Key: <key>`` (a header any
client can add, tritonclient's ``headers=`` included). Without a key, or with one that is not
configured, it is answered 401 with ``WWW-Authenticate: Bearer realm="tensorbits"`` and the JSON
error body every 4xx carries; the refusal is logged, never the key.

With no key configured ``install`` adds nothing: the server runs the middleware stack it ran
before, so an open server's hot path pays nothing for this module. With keys, the middleware
sits inside the observability layer (a 401 is counted, timed and logged with its request id)
and ahead of everything else (HEAD-as-GET, the fast path, the framework), and it answers before
a byte of the body is read.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from pydantic import SecretStr
from starlette.types import ASGIApp, Receive, Scope, Send

from tensorbits_protocol.errors import Unauthorized

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from tensorbits.config import Settings

logger = logging.getLogger("tensorbits.auth")

REALM = "tensorbits"
API_KEY_HEADER = b"x-api-key"


# --- keys (what a key may be, and the key file: api_keys.py) --------------------------------------
def digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


class KeyRing:
    """The configured keys, as digests only: which the HTTP middleware and the gRPC front end
    (tensorbits/grpc/service.py) check a presented key against."""

    def __init__(self, keys: Sequence[SecretStr]) -> None:
        # Comparing digests, all 32 bytes, keeps the comparison's time independent of the
        # presented key's length and of the configured keys' lengths.
        self._digests = tuple(digest(key.get_secret_value().encode("ascii")) for key in keys)

    def accepts(self, presented: bytes) -> bool:
        """Whether ``presented`` is one of the keys, in time that does not depend on which key
        (if any) it matches: every key is compared, the results OR-ed, no early exit."""
        candidate = digest(presented)
        accepted = False
        for key in self._digests:
            accepted |= hmac.compare_digest(candidate, key)
        return accepted


# --- the middleware -----------------------------------------------------------------------------
def presented_key(headers: Iterable[tuple[bytes, bytes]]) -> tuple[bytes | None, str | None]:
    """The key a request presents and the header it came in: a Bearer token first, else
    ``X-API-Key``. (None, None) when there is neither."""
    bearer = api_key = None
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() == b"bearer":  # the scheme is case-insensitive (RFC 9110 §11.1)
                bearer = token.strip()
        elif name == API_KEY_HEADER:
            api_key = value.strip()
    if bearer is not None:
        return bearer, "Authorization"
    if api_key is not None:
        return api_key, "X-API-Key"
    return None, None


def _response(error: Unauthorized, challenge: str) -> tuple[list[tuple[bytes, bytes]], bytes]:
    body = json.dumps(error.to_dict()).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", challenge.encode()),
    ]
    return headers, body


class ApiKeyMiddleware:
    """Passes a request on when its path is open or it presents one of ``keys``; else 401."""

    def __init__(self, app: ASGIApp, keys: Sequence[SecretStr], open_paths: Iterable[str]) -> None:
        if not keys:
            raise ValueError("ApiKeyMiddleware needs at least one key (install() adds none)")
        self.app = app
        self._keys = KeyRing(keys)  # only digests are kept
        self._open_paths = frozenset(open_paths)
        challenge = f'Bearer realm="{REALM}"'
        self._missing = _response(
            Unauthorized(
                "an API key is required: send it as 'Authorization: Bearer <key>' or "
                "'X-API-Key: <key>'",
                field="Authorization",
                rule="api_key",
            ),
            challenge,
        )
        self._wrong = _response(
            Unauthorized("the API key is not valid", field="Authorization", rule="api_key"),
            # RFC 6750 §3.1: a token was sent and refused.
            f'{challenge}, error="invalid_token"',
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" or scope["path"] in self._open_paths:
            await self.app(scope, receive, send)
            return
        presented, header = presented_key(scope["headers"])
        if presented is not None and self.accepts(presented):
            await self.app(scope, receive, send)
            return
        _log_refusal(scope, header)
        if scope["type"] != "http":  # a WebSocket handshake: refused before it is accepted
            await send({"type": "websocket.close", "code": 1008})
            return
        headers, body = self._wrong if presented is not None else self._missing
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def accepts(self, presented: bytes) -> bool:
        return self._keys.accepts(presented)


def _log_refusal(scope: Scope, header: str | None) -> None:
    # The presented key is never logged, nor any part or hash of it: a log reader is not
    # meant to learn anything that narrows the search for a key.
    client = scope.get("client")
    logger.warning(
        "refused %s %s: %s",
        scope.get("method", "WEBSOCKET"),
        scope["path"][:200],
        "an API key that is not configured" if header is not None else "no API key",
        extra={
            "status": 401,
            "credential_header": header,
            "client": client[0] if client else None,
        },
    )


def install(app: Starlette, settings: Settings) -> None:
    """Add the middleware when keys are configured; add nothing otherwise. Call it between the
    middleware it must run inside of (added after it) and those it must run before."""
    keys = settings.accepted_api_keys
    if keys:
        # SecretStr all the way: Starlette's Middleware record would show plain strings in a repr.
        app.add_middleware(ApiKeyMiddleware, keys=keys, open_paths=settings.auth_open_paths)
