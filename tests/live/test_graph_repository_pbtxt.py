"""The repository folder at start as a Triton user has it: a model with ``config.pbtxt`` served
and inferred over HTTP with the stock ``tritonclient.http``, compared with ONNX Runtime byte for
byte; a broken ``config.pbtxt`` and a folder with both configurations listed UNAVAILABLE in the
repository index with the reason, the others served."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton_http
from core.graph_models import MASKED_PBTXT, masked_model
from support.live import LiveServer, serve

pytestmark = pytest.mark.integration
ort = pytest.importorskip("onnxruntime")

# A field Triton's ModelConfig lacks (a misspelt one): refused naming the field and line.
BROKEN = """\
name: "broken_pbtxt"
platform: "onnxruntime_onnx"
dynamic_batchng { max_queue_delay_microseconds: 100 }
"""


def _model_folder(root: Path, name: str, files: dict[str, str]) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.onnx").write_bytes(masked_model())
    for file, text in files.items():
        (root / name / file).write_text(text)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("pbtxt_repository")
    _model_folder(root, "masked", {"config.pbtxt": MASKED_PBTXT})
    _model_folder(root, "broken_pbtxt", {"config.pbtxt": BROKEN})
    both = {"config.pbtxt": MASKED_PBTXT.replace("masked", "both"), "config.json": "{}"}
    _model_folder(root, "both", both)
    with serve({"TENSORBITS_MODEL_REPOSITORY": str(root)}) as live:
        yield live


@pytest.fixture(scope="module")
def http(server: LiveServer) -> Iterator[triton_http.InferenceServerClient]:
    client = triton_http.InferenceServerClient(server.url, network_timeout=30)
    yield client
    client.close()


def test_a_triton_repository_folder_with_config_pbtxt(http: Any) -> None:
    index = {
        e["name"]: (e["state"], e.get("reason", "")) for e in http.get_model_repository_index()
    }
    assert index["masked"] == ("READY", "")
    assert http.is_model_ready("masked")
    config = http.get_model_config("masked")
    assert config["input"] == [{"name": "x", "data_type": "TYPE_UINT8", "dims": [-1, 4]}]

    x = (np.arange(24, dtype=np.uint8).reshape(6, 4) * 37).astype(np.uint8)
    session = ort.InferenceSession(masked_model(), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {"x": x})
    for binary in (True, False):
        tensor_ = triton_http.InferInput("x", list(x.shape), "UINT8")
        tensor_.set_data_from_numpy(x, binary_data=binary)
        result = http.infer("masked", [tensor_])
        got = result.as_numpy("z")
        assert got.dtype == want.dtype
        assert got.shape == want.shape
        assert got.tobytes() == want.tobytes()

    state, reason = index["broken_pbtxt"]
    assert state == "UNAVAILABLE"
    assert "broken_pbtxt" in reason
    assert "config.pbtxt: 3:1" in reason  # protobuf's line and column
    assert '"dynamic_batchng"' in reason
    assert "did you mean 'dynamic_batching'?" in reason
    assert not http.is_model_ready("broken_pbtxt")

    state, reason = index["both"]
    assert state == "UNAVAILABLE"
    assert "config.pbtxt and config.json" in reason
    assert not http.is_model_ready("both")
