"""Defaults of the client: URL, timeouts, retry policy, pool limits and I/O sizes.

Each is a module constant so that tests and callers can read (or patch) the policy in one place.
"""

from __future__ import annotations

import httpx

#: Environment variable read when no ``base_url`` is passed.
BASE_URL_ENV = "TENSORBITS_URL"
DEFAULT_BASE_URL = "http://127.0.0.1:8000"
#: Environment variable read when no ``api_key`` is passed (sent as ``Authorization: Bearer``).
API_KEY_ENV = "TENSORBITS_API_KEY"

#: A compute call on 64 MiB tensors takes well under a second, but a busy server queues;
#: connecting, though, should be quick, so a dead host is reported in seconds.
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=5.0)

DEFAULT_MAX_RETRIES = 2
#: Backoff: ``min(INITIAL_RETRY_DELAY * 2**retry, MAX_RETRY_DELAY)`` seconds, minus up to a
#: quarter of jitter, so that clients told to back off at once do not come back at once.
INITIAL_RETRY_DELAY = 0.5
MAX_RETRY_DELAY = 8.0
JITTER = 0.25
#: A server's ``Retry-After`` is honoured up to this many seconds (a stray huge value must not
#: park a caller for an hour).
MAX_RETRY_AFTER = 60.0
#: Statuses that say "not processed, try again": timeout, rate limit, and unavailable/gateway
#: errors. A 500 is a bug and is not retried; every operator is a pure function, so repeating a
#: call that may have run is harmless.
RETRY_STATUSES = frozenset({408, 429, 502, 503, 504})

DEFAULT_CONNECTION_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20)

#: Request bodies go to httpcore in slices of this size. httpcore's sync ``write`` does
#: ``buffer = buffer[n:]`` after each partial ``send``: with one 64 MiB chunk that copies the
#: remainder ~20 times (quadratic, measured at 2.5x a plain socket). Slices no larger than a
#: loopback socket buffer are sent whole, so the re-slicing copies nothing.
SEND_CHUNK_BYTES = 1 << 20

#: Default number of requests ``map`` keeps in flight.
DEFAULT_MAP_CONCURRENCY = 8
