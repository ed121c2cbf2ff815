"""HTTP content codings of bodies, both ways: the codings the server reads and writes (``WBITS``),
which one a request's ``Accept-Encoding`` asks for (``accepted_coding``), and compressing a
response under a size bound known before a byte is compressed (``compressed_bound``).

As Triton does, and as tritonclient's ``response_compression_algorithm`` asks: ``gzip`` and
``deflate`` (zlib framing, as HTTP means it, RFC 9110 §8.4.1.2), only when the request's
``Accept-Encoding`` names one; a request without the header, or naming neither, gets the body
as it is.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from functools import lru_cache

# zlib's wbits per coding: gzip framing, and deflate as HTTP means it (zlib framing).
WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
# When the client weighs them equally, gzip first: what tritonclient and most clients ask for.
PREFERENCE = ("gzip", "deflate")
# Tensors are large and mostly of high entropy: the fastest level saves most of what the
# default level saves at a fraction of its time (docs/benchmarks.md, "Settled", has both).
LEVEL = 1
# gzip's wrapper (10-byte header, 8-byte trailer) is 12 bytes longer than zlib's, for which
# zlib.h's compressBound is written.
_GZIP_EXTRA = 12


def compressed_bound(n: int) -> int:
    """The most bytes ``compress`` can make of ``n`` bytes in either coding: zlib.h's
    ``compressBound`` (deflate falls back to stored blocks, 5 bytes per 16 KiB, when data does
    not compress), plus gzip's longer wrapper."""
    return n + (n >> 12) + (n >> 14) + (n >> 25) + 13 + _GZIP_EXTRA


def _q(parameters: Sequence[str]) -> float:
    """The weight of one Accept-Encoding member (its ``q``; 1 without one, 0 if malformed)."""
    for parameter in parameters:
        key, _, value = parameter.strip().partition("=")
        if key.strip().lower() == "q":
            try:
                weight = float(value.strip())
            except ValueError:
                return 0.0
            return weight if 0.0 <= weight <= 1.0 else 0.0
    return 1.0


@lru_cache(maxsize=64)
def accepted_coding(accept_encoding: str | None) -> str | None:
    """The coding to answer with: the one of ``WBITS`` that ``Accept-Encoding`` weighs highest
    (``*`` stands for any not named; ``x-gzip`` is gzip), ties broken by ``PREFERENCE``; None
    when the header is absent or accepts neither (then the body goes as it is). Cached: clients
    send the same few values over and over."""
    if not accept_encoding:
        return None
    weights: dict[str, float] = {}
    wildcard: float | None = None
    for member in accept_encoding.split(",")[:64]:
        name, *parameters = member.split(";")
        coding = name.strip().lower()
        coding = "gzip" if coding == "x-gzip" else coding
        if coding == "*":
            wildcard = _q(parameters)
        elif coding in WBITS:
            weights[coding] = _q(parameters)
    if wildcard is not None:
        for coding in WBITS:
            weights.setdefault(coding, wildcard)
    best = max(PREFERENCE, key=lambda c: (weights.get(c, 0.0), -PREFERENCE.index(c)))
    return best if weights.get(best, 0.0) > 0 else None


def compress(parts: Sequence[bytes | memoryview], coding: str) -> list[bytes]:
    """``parts`` as one ``coding`` stream, in pieces (not joined: no second copy of the
    body); their total length is at most ``compressed_bound`` of the input's."""
    compressor = zlib.compressobj(LEVEL, zlib.DEFLATED, WBITS[coding])
    pieces = [compressor.compress(part) for part in parts]
    pieces.append(compressor.flush())
    return [piece for piece in pieces if piece]


__all__ = ["LEVEL", "WBITS", "accepted_coding", "compress", "compressed_bound"]
