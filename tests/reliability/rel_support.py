"""Shared helpers of the reliability tests: an in-process app under small limits, the property
every answer must satisfy, and a live ``tensorbits serve`` subprocess.

Run longer by hand: ``TENSORBITS_FUZZ_EXAMPLES=5000 .venv/bin/pytest tests/reliability -k fuzz``.
"""

from __future__ import annotations

import json
import os
import subprocess
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from livesupport import LiveServer, serve
from starlette.exceptions import StarletteDeprecationWarning

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from fastapi.testclient import TestClient

from tensorbits.app import create_app
from tensorbits.config import Settings

KiB = 1 << 10
MiB = 1 << 20
HEADER = "Inference-Header-Content-Length"

# Small limits, so the fuzzer reaches every bound with small inputs.
SMALL_LIMITS: dict[str, Any] = {
    "max_body_bytes": 64 * KiB,
    "max_tensor_elements": 4096,
    "max_tensors": 8,
    "max_buffers": 8,
    "max_dispatches": 8,
    "max_json_depth": 16,
    "max_json_elements": 4096,
    "max_inflight_bytes": MiB,
    "max_inflight_requests": 8,
}

FUZZ_EXAMPLES = int(os.environ.get("TENSORBITS_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)

__all__ = ["FUZZ", "HEADER", "SMALL_LIMITS", "TestClient"]


@contextmanager
def small_client(**overrides: Any) -> Iterator[TestClient]:
    app = create_app(Settings(backend="numpy", cpu_threads=2, **{**SMALL_LIMITS, **overrides}))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def assert_not_server_error(status: int, body: bytes, content_type: str) -> None:
    """The reliability property: a 2xx, or a 4xx whose JSON body has a string ``error``."""
    assert status < 500, f"server error {status}: {body[:300]!r}"
    if status >= 400:
        assert content_type.startswith("application/json"), content_type
        document = json.loads(body)
        assert isinstance(document.get("error"), str), document
        assert document["error"], document


# --- a live server ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Live(LiveServer):
    """``livesupport.LiveServer`` and the server process's peak memory."""

    def peak_rss(self) -> int:
        """VmHWM of the server process, in bytes."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM")


@contextmanager
def live_server(**env: str) -> Iterator[Live]:
    """``tensorbits serve`` (uvicorn, httptools, uvloop) on a free loopback port."""
    with serve(env, stderr=subprocess.DEVNULL) as server:
        yield Live(server.host, server.port, server.proc)
