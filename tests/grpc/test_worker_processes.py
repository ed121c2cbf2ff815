"""gRPC with several worker processes: every worker serves the port (SO_REUSEPORT), and the
statistics both protocols answer add up every worker's counts (each publishes its own)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from support.grpc_live import serve_grpc

pytestmark = pytest.mark.integration

NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
CALLS = 24


def _count(client: triton_grpc.InferenceServerClient | triton_http.InferenceServerClient) -> int:
    stats = client.get_inference_statistics(NOT)
    if isinstance(stats, dict):
        return int(stats["model_stats"][0]["inference_count"])
    return int(stats.model_stats[0].inference_count)


def test_statistics_add_up_over_workers() -> None:
    with serve_grpc({"TENSORBITS_WORKERS": "2"}) as server:
        x = np.arange(16, dtype=np.uint8)
        for _ in range(CALLS):  # a new connection each: the kernel spreads them over workers
            client = triton_grpc.InferenceServerClient(server.grpc_url)
            tensor = triton_grpc.InferInput("InputTensor", [16], "UINT8")
            tensor.set_data_from_numpy(x)
            assert (client.infer(NOT, [tensor]).as_numpy("OutputTensor") == ~x).all()
            client.close()
        deadline = time.monotonic() + 10
        grpc_client = triton_grpc.InferenceServerClient(server.grpc_url)
        http_client = triton_http.InferenceServerClient(server.http.url)
        while time.monotonic() < deadline:  # each worker publishes its counts every second
            counts = {_count(grpc_client), _count(http_client)}
            if counts == {CALLS}:
                break
            time.sleep(0.2)
        assert counts == {CALLS}
