"""The README's gRPC example runs as written, with the stock tritonclient.grpc, against a live
server's gRPC endpoint (``TENSORBITS_GRPC_URL``, which the example reads, as the SDK's examples
read ``TENSORBITS_URL``). It is fenced ``py``, not ``python``: the documentation test runs the
``python`` blocks in a venv holding only the SDK, which has no gRPC client."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.grpc_live import GrpcServer

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"^### gRPC\n.*?^```py\n(.*?)^```", re.MULTILINE | re.DOTALL)


def test_readme_grpc_example_runs(grpc_server: GrpcServer) -> None:
    match = BLOCK.search(README.read_text())
    assert match is not None, "README's gRPC section has no ```py example"
    result = subprocess.run(
        [sys.executable, "-c", match.group(1)],
        env={**os.environ, "TENSORBITS_GRPC_URL": grpc_server.grpc_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["[[255 127]", " [213   0]]"]
    assert set(lines[2].split(",")) >= {"UINT8", "UINT16", "UINT32", "INT64", "FP16"}
