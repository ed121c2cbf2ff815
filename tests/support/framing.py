"""Bodies framed by ``Inference-Header-Content-Length``: a JSON header, then buffers back to back.
The one builder for tests that frame a body to send; a test about malformed framing writes its
bytes by hand instead."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tensorbits_protocol.codec import BINARY_CONTENT_TYPE, HEADER_LENGTH

HEADER = HEADER_LENGTH  # "Inference-Header-Content-Length"


def framed(
    header: Mapping[str, Any], *buffers: bytes, binary: bool = False
) -> tuple[bytes, dict[str, str]]:
    """The body (``header`` as compact JSON text, then ``buffers`` as given) and its request
    headers: the header length, and ``binary``: ``Content-Type: application/octet-stream``."""
    head = json.dumps(header).encode()
    headers = {HEADER: str(len(head))}
    if binary:
        headers["Content-Type"] = BINARY_CONTENT_TYPE
    return head + b"".join(buffers), headers
