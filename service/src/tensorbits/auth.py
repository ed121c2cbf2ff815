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

The check itself is every protocol's (``KeyRing.check``: the open paths, the comparison, the
refusal's words, field and rule, and its one log line). The gRPC service (grpc/service.py)
reads a call's metadata as these headers and a call as open when the HTTP route it mirrors is;
each front end only sends the refusal its own way (here a 401 and its challenge, there
UNAUTHENTICATED). Nothing of Starlette is imported at run time: the middleware is plain ASGI.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from pydantic import SecretStr

from tensorbits_protocol.errors import Unauthorized

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.types import ASGIApp, Receive, Scope, Send

    from tensorbits.config.settings import Settings

logger = logging.getLogger("tensorbits.auth")

REALM = "tensorbits"
API_KEY_HEADER = b"x-api-key"


# --- the check, every protocol's -----------------------------------------------------------------
# The words, field and rule of a refusal, one set for HTTP and gRPC: a gRPC client sends the same
# two names as metadata, where names are lower case (and HTTP's are any case).
MISSING = (
    "an API key is required: send it as 'Authorization: Bearer <key>' or 'X-API-Key: <key>' "
    "(gRPC metadata: the same names in lower case)"
)
NOT_VALID = "the API key is not valid"
# An Authorization header that is not "Bearer <key>" (a bare key, another scheme): the usual
# first mistake, told apart from no key at all. The value is never echoed: it may be a real key.
NO_SCHEME = (
    "the Authorization header does not use the Bearer scheme: send the key as "
    "'Authorization: Bearer <key>' or 'X-API-Key: <key>'"
)
FIELD = "Authorization"
RULE = "api_key"
# The header a request named when it presented no key, and why that was no key.
UNSCHEMED = "Authorization (not Bearer)"
_ABSENT_WORDS = {None: MISSING, UNSCHEMED: NO_SCHEME}


def refusal(presented: bool, header: str | None = None) -> Unauthorized:
    """The refusal of a request that ``presented`` a key that is not configured, or none
    (``header``: what ``presented_key`` found instead, which says why it was none)."""
    words = NOT_VALID if presented else _ABSENT_WORDS.get(header, MISSING)
    return Unauthorized(words, field=FIELD, rule=RULE)


def digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


class KeyRing:
    """The configured keys, as digests only, and the paths open without one: what every front
    end checks a request against (``check``). HTTP's middleware here and the gRPC service
    (tensorbits/grpc/service.py) each only read the request's headers (its metadata) and send
    the refusal ``check`` raises."""

    def __init__(self, keys: Sequence[SecretStr], open_paths: Iterable[str] = ()) -> None:
        # Comparing digests, all 32 bytes, keeps the comparison's time independent of the
        # presented key's length and of the configured keys' lengths.
        self._digests = tuple(digest(key.get_secret_value().encode("ascii")) for key in keys)
        self.open_paths = frozenset(open_paths)

    @classmethod
    def of(cls, settings: Settings) -> KeyRing | None:
        """The settings' keys and open paths; None without a key: access control is off."""
        keys = settings.accepted_api_keys
        return cls(keys, settings.auth_open_paths) if keys else None

    def needs_key(self, path: str | None) -> bool:
        """Whether a request for ``path`` needs a key (None: a call no open path stands for)."""
        return path not in self.open_paths

    def accepts(self, presented: bytes) -> bool:
        """Whether ``presented`` is one of the keys, in time that does not depend on which key
        (if any) it matches: every key is compared, the results OR-ed, no early exit."""
        candidate = digest(presented)
        accepted = False
        for key in self._digests:
            accepted |= hmac.compare_digest(candidate, key)
        return accepted

    def check(
        self,
        headers: Iterable[tuple[bytes, bytes]],
        method: str,
        target: str,
        client: str | Callable[[], str] | None = None,
    ) -> None:
        """Pass a request whose ``headers`` (lower-case names) present one of the keys; else log
        the refusal (``method`` and ``target`` name the request, ``client`` where it came from:
        a callable is called only then) and raise it (``refusal``)."""
        presented, header = presented_key(headers)
        if presented is not None and self.accepts(presented):
            return
        error = refusal(presented is not None, header)
        _log_refusal(method, target, error, header if presented is not None else None,
                     client() if callable(client) else client)  # fmt: skip
        raise error


def presented_key(headers: Iterable[tuple[bytes, bytes]]) -> tuple[bytes | None, str | None]:
    """The key a request presents and the header it came in: a Bearer token first, else
    ``X-API-Key``. (None, None) when there is neither; (None, ``UNSCHEMED``) when the only
    candidate was an Authorization header of another scheme, or of none (a bare key)."""
    bearer = api_key = None
    unschemed = False
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() == b"bearer":  # the scheme is case-insensitive (RFC 9110 §11.1)
                bearer = token.strip()
            else:
                unschemed = True
        elif name == API_KEY_HEADER:
            api_key = value.strip()
    if bearer is not None:
        return bearer, "Authorization"
    if api_key is not None:
        return api_key, "X-API-Key"
    return None, UNSCHEMED if unschemed else None


# What a refusal's log line says the request presented, by the refusal's words.
_LOGGED = {
    NOT_VALID: "an API key that is not configured",
    MISSING: "no API key",
    NO_SCHEME: "an Authorization header without the Bearer scheme",
}


def _log_refusal(
    method: str, target: str, error: Unauthorized, header: str | None, client: str | None
) -> None:
    # The presented key is never logged, nor any part or hash of it: a log reader is not
    # meant to learn anything that narrows the search for a key.
    logger.warning(
        "refused %s %s: %s",
        method,
        target[:200],
        _LOGGED[error.message],
        extra={
            "status": Unauthorized.status_code,
            "credential_header": header,
            "client": client,
        },
    )


# --- HTTP: the middleware -----------------------------------------------------------------------
def _response(error: Unauthorized) -> tuple[list[tuple[bytes, bytes]], bytes]:
    challenge = f'Bearer realm="{REALM}"'
    if error.message == NOT_VALID:
        challenge += ', error="invalid_token"'  # RFC 6750 §3.1: a token was sent and refused
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
        self._keys = KeyRing(keys, open_paths)  # only digests are kept
        self._open_paths = self._keys.open_paths
        # The two refusals' responses, made once: by their words.
        self._responses = {
            error.message: _response(error)
            for error in (refusal(False), refusal(True), refusal(False, UNSCHEMED))
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" or scope["path"] in self._open_paths:
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        try:
            self._keys.check(
                scope["headers"],
                scope.get("method", "WEBSOCKET"),
                scope["path"],
                client[0] if client else None,
            )
        except Unauthorized as error:
            if scope["type"] != "http":  # a WebSocket handshake: refused before it is accepted
                await send({"type": "websocket.close", "code": 1008})
                return
            headers, body = self._responses.get(error.message) or _response(error)
            await send(
                {"type": "http.response.start", "status": error.status_code, "headers": headers}
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    def accepts(self, presented: bytes) -> bool:
        return self._keys.accepts(presented)


def install(app: Starlette, settings: Settings) -> None:
    """Add the middleware when keys are configured; add nothing otherwise. Call it between the
    middleware it must run inside of (added after it) and those it must run before."""
    keys = settings.accepted_api_keys
    if keys:
        # SecretStr all the way: Starlette's Middleware record would show plain strings in a repr.
        app.add_middleware(ApiKeyMiddleware, keys=keys, open_paths=settings.auth_open_paths)
