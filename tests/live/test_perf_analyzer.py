"""Triton's perf_analyzer itself (the binary of the PyPI wheel ``perf-analyzer``, through
``scripts/perf_analyzer.sh``) against a live server: HTTP, gRPC, the gRPC stream, system shared
memory over both, and a model with a request parameter.

Each run sends a fixed number of requests (``--request-count``), not windows until the figures are
stable: this asserts that perf_analyzer completes its run with every request answered (its exit
status is non-zero at the first failed request, or when it cannot read the server's metadata,
configuration or statistics), not how fast. About a second a run.

The first run here sets perf_analyzer up in the user's cache (downloads: a minute at most); the
tests skip only when those downloads cannot be made (no network), with the script's reason."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.grpc_live import GrpcServer, serve_grpc
from support.perf_analyzer import SCRIPT, run_perf_analyzer

# The setup's downloads count against the first test that needs it.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
SHIFT = "onnx.BitShift-11"
REQUESTS = 200
UNAVAILABLE = 69  # the script's status for a download that could not be made
RUN_TIMEOUT_S = 60


@dataclass(frozen=True)
class Run:
    returncode: int
    output: str
    throughput: float  # inferences per second, from the CSV report
    p99_us: float


@pytest.fixture(scope="module")
def perf_analyzer() -> None:
    """perf_analyzer set up once (cached across runs by the script)."""
    try:
        done = subprocess.run(
            ["bash", str(SCRIPT), "--setup-only"],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("setting perf_analyzer up took over 240 s")
    if done.returncode == UNAVAILABLE:
        reason = done.stderr.strip().splitlines()[-1]  # the script's own message: what failed
        pytest.skip(f"perf_analyzer cannot be set up here: {reason}")
    assert done.returncode == 0, f"perf_analyzer's setup failed:\n{done.stderr}"


@pytest.fixture(scope="module")
def server(perf_analyzer: None) -> Iterator[GrpcServer]:
    """The default configuration (no shared memory)."""
    with serve_grpc() as running:
        yield running


@pytest.fixture(scope="module")
def shm_server(perf_analyzer: None) -> Iterator[GrpcServer]:
    """Shared memory with the key guard widened to every key, as perf_analyzer's region keys
    (``/<tensor name>...``) need (README: compatibility with the ecosystem's clients)."""
    env = {"TENSORBITS_SHARED_MEMORY": "true", "TENSORBITS_SHARED_MEMORY_PREFIX": "/"}
    with serve_grpc(env) as running:
        yield running


def run(tmp_path: Path, *args: str) -> Run:
    done = run_perf_analyzer(
        ["--request-count", str(REQUESTS), *args], tmp_path / "report.csv", RUN_TIMEOUT_S
    )
    throughput = p99 = 0.0
    if done.rows:
        throughput = float(done.rows[0]["Inferences/Second"])
        p99 = float(done.rows[0]["p99 latency"])
    return Run(done.returncode, done.output, throughput, p99)


def assert_succeeded(result: Run) -> None:
    """Exit 0, every request answered (the client's count: perf_analyzer reports a failed one as
    an error), the server's count as perf_analyzer read it from the statistics extension, a
    throughput, and no error reported."""
    assert result.returncode == 0, result.output
    assert "error" not in result.output.lower(), result.output
    assert re.search(rf"^\s+Request count: {REQUESTS}$", result.output, re.MULTILINE), result.output
    served = re.search(r"^\s+Successful request count: (\d+)$", result.output, re.MULTILINE)
    assert served is not None, result.output
    # perf_analyzer reads the server's statistics before and after its window, while its first
    # request may already be answered: one request can fall outside (seen: 199 of 200).
    assert int(served.group(1)) >= REQUESTS - 1, result.output
    assert result.throughput > 0, result.output
    assert result.p99_us > 0, result.output


def test_http(server: GrpcServer, tmp_path: Path) -> None:
    result = run(tmp_path, "-m", NOT, "-u", server.http.url, "--shape", "InputTensor:16")
    assert_succeeded(result)


def test_grpc(server: GrpcServer, tmp_path: Path) -> None:
    """perf_analyzer's gRPC requests carry the reserved parameter
    ``triton_enable_empty_final_response``, which the server once refused."""
    result = run(
        tmp_path, "-m", NOT, "-i", "grpc", "-u", server.grpc_url, "--shape", "InputTensor:16"
    )
    assert_succeeded(result)


def test_grpc_streaming(server: GrpcServer, tmp_path: Path) -> None:
    """ModelStreamInfer: perf_analyzer counts a request done at its final answer, so one answer
    too many or too few per request shows as a wrong count or a hang."""
    result = run(
        tmp_path,
        *("-m", NOT, "-i", "grpc", "-u", server.grpc_url, "--streaming"),
        *("--shape", "InputTensor:16"),
    )
    assert_succeeded(result)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_system_shared_memory(shm_server: GrpcServer, tmp_path: Path, protocol: str) -> None:
    url = shm_server.http.url if protocol == "http" else shm_server.grpc_url
    result = run(
        tmp_path,
        *("-m", NOT, "-i", protocol, "-u", url, "--shared-memory", "system"),
        *("--shape", "InputTensor:4096"),
    )
    assert_succeeded(result)


def test_bitshift_with_a_request_parameter(server: GrpcServer, tmp_path: Path) -> None:
    """``--request-parameter`` reaches the operator: LEFT is served; a value out of the model's
    choices fails the run with the server's own message."""
    model = ("-m", SHIFT, "-i", "grpc", "-u", server.grpc_url, "--shape", "X:16", "--shape", "Y:16")
    assert_succeeded(run(tmp_path, *model, "--request-parameter", "direction:LEFT:string"))
    refused = run(tmp_path, *model, "--request-parameter", "direction:UP:string")
    assert refused.returncode != 0, refused.output
    assert "'UP' is not a valid value" in refused.output, refused.output
