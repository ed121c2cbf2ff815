"""Every Python example of the README and of docs/ runs, verbatim, in a fresh virtual environment
holding only what the README's install command installs, against a real server.

A block fenced as ``python`` is an example and must run; a sketch that is not meant to run is
fenced as something else (``text``). Examples reach the server through ``$TENSORBITS_URL``, the
client's documented default, set here to the test server.

The graph model the docs use is committed under ``examples/models/`` (written by
``examples/build_models.py``): the files are what the script writes, the configuration
docs/graph-models.md shows is that model's, the repository folder serves it at start, and the
README's ``tritonclient.grpc`` example (fenced ``py``: it needs tritonclient, which the README's
install leaves out) runs from the repository's root with the dev environment's tritonclient.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton_http
from google.protobuf import json_format, text_format
from support.live import LiveServer, free_port, serve
from tritonclient.grpc import model_config_pb2

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
UV = ROOT / ".tools" / "bin" / "uv"
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# The README's install command, run from the repository as it says.
INSTALL = re.compile(r"^pip install (\./protocol) '(\./client\[progress\])'", re.MULTILINE)
FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def examples() -> list[pytest.ParameterSet]:
    found = []
    for document in DOCUMENTS:
        text = document.read_text()
        for number, match in enumerate(FENCE.finditer(text), 1):
            line = text[: match.start()].count("\n") + 1
            name = f"{document.relative_to(ROOT)}:{line}"
            found.append(pytest.param(match.group(1), id=f"{name}#{number}"))
    return found


def test_the_readme_shows_the_install_this_test_runs() -> None:
    assert INSTALL.search((ROOT / "README.md").read_text()), "README's install command changed"
    assert len(examples()) >= 6  # README's four and the docs' own


@pytest.fixture(scope="module")
def documented_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with the client installed exactly as the README says, and nothing else."""
    if not UV.exists():
        pytest.skip(f"uv is not bootstrapped at {UV} (make install does it)")
    match = INSTALL.search((ROOT / "README.md").read_text())
    assert match is not None
    venv = tmp_path_factory.mktemp("documented") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT / ".tools"), "UV_PYTHON_DOWNLOADS": "never"}
    env.pop("VIRTUAL_ENV", None)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(UV), "pip", "install", "--quiet", "--python", str(python), *match.groups()],
        check=True,
        env=env,
        cwd=ROOT,
        timeout=240,
    )
    return python


# The gRPC port of the module's server: the README's tritonclient.grpc example reaches it.
GRPC_PORT = free_port()


@pytest.fixture(scope="module")
def live_server() -> Iterator[LiveServer]:
    """The session's server, but with the system shared-memory extension on: the README's
    shared-memory example registers a region."""
    with serve(
        {"TENSORBITS_SHARED_MEMORY": "true", "TENSORBITS_GRPC_PORT": str(GRPC_PORT)}
    ) as server:
        yield server


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.parametrize("code", examples())
def test_the_example_runs_as_written(
    code: str, documented_venv: Path, live_server: LiveServer, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["TENSORBITS_URL"] = live_server.base_url
    # The examples' models, where the docs' relative paths (from the repository's root) find them.
    shutil.copytree(EXAMPLES / "models", tmp_path / "examples" / "models")
    done = subprocess.run(
        [str(documented_venv), "-c", code],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def build_models() -> ModuleType:
    """``examples/build_models.py``, imported from its file (examples/ is no package)."""
    spec = importlib.util.spec_from_file_location("build_models", EXAMPLES / "build_models.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def masked(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """What ``examples/models/masked`` answers, computed here: each row AND [1, 3, 7, 15]."""
    out: np.ndarray[Any, Any] = x & np.array([1, 3, 7, 15], np.uint8)
    return out


def test_the_committed_examples_are_what_the_script_writes(tmp_path: Path) -> None:
    files: dict[str, bytes] = build_models().repository()
    committed = {
        str(p.relative_to(EXAMPLES / "models")): p.read_bytes()
        for p in sorted((EXAMPLES / "models").rglob("*"))
        if p.is_file()
    }
    assert committed == files, "run python examples/build_models.py and commit what it writes"
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "build_models.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert {n: (tmp_path / n).read_bytes() for n in files} == files


def documented_configurations() -> tuple[str, str]:
    """docs/graph-models.md's configuration of ``masked``: as config.pbtxt, and as JSON."""
    text = (ROOT / "docs" / "graph-models.md").read_text()
    pbtxt = re.search(r'^```text\n(name: "masked"\n.*?)^```', text, re.M | re.S)
    as_json = re.search(r'^```json\n(\{"name": "masked".*?)^```', text, re.M | re.S)
    assert pbtxt is not None
    assert as_json is not None
    return pbtxt.group(1), as_json.group(1)


def test_the_documented_configuration_is_the_examples() -> None:
    pbtxt, as_json = documented_configurations()
    assert pbtxt == (EXAMPLES / "models" / "masked" / "config.pbtxt").read_text()
    from_text = text_format.Parse(pbtxt, model_config_pb2.ModelConfig())
    from_json = json_format.Parse(as_json, model_config_pb2.ModelConfig())
    assert from_text == from_json
    # The file's own shape: rank 2, rows of 4, as the configuration says.
    onnx = pytest.importorskip("onnx")
    model = onnx.load(str(EXAMPLES / "models" / "masked" / "1" / "model.onnx"))
    for value in (*model.graph.input, *model.graph.output):
        dims = [d.dim_value or -1 for d in value.type.tensor_type.shape.dim]
        assert dims == [-1, 4]


@pytest.mark.integration
def test_the_examples_folder_served_at_start() -> None:
    """``TENSORBITS_MODEL_REPOSITORY=examples/models`` serves ``masked`` as its config.pbtxt says,
    and the configuration's JSON form loads the same file through the stock
    ``tritonclient.http.load_model``."""
    env = {"TENSORBITS_MODEL_REPOSITORY": str(EXAMPLES / "models")}
    with serve(env) as server:
        client = triton_http.InferenceServerClient(server.url)
        try:
            index = {m["name"]: m.get("state") for m in client.get_model_repository_index()}
            assert index["masked"] == "READY"
            config = client.get_model_config("masked")
            assert [(i["name"], i["dims"]) for i in config["input"]] == [("x", [-1, 4])]
            assert [(o["name"], o["dims"]) for o in config["output"]] == [("z", [-1, 4])]
            x = np.arange(24, dtype=np.uint8).reshape(6, 4)
            for name in ("masked", "masked_json"):
                if name == "masked_json":
                    as_json = json.loads(documented_configurations()[1])
                    as_json["name"] = name
                    model = (EXAMPLES / "models" / "masked" / "1" / "model.onnx").read_bytes()
                    client.load_model(
                        name, config=json.dumps(as_json), files={"file:1/model.onnx": model}
                    )
                    assert client.get_model_config(name)["input"] == config["input"]
                given = triton_http.InferInput("x", [6, 4], "UINT8")
                given.set_data_from_numpy(x)
                answer = client.infer(name, [given]).as_numpy("z")
                assert answer is not None
                np.testing.assert_array_equal(answer, masked(x))
        finally:
            client.close()


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_the_readme_tritonclient_example_runs(live_server: LiveServer) -> None:
    """The README's graph model example, as written but for the gRPC address: the file it opens
    is the committed one, from the repository's root."""
    text = (ROOT / "README.md").read_text()
    match = re.search(r"^## Graph models\n.*?^```py\n(.*?)^```", text, re.M | re.S)
    assert match is not None
    code = match.group(1)
    assert "examples/models/masked/1/model.onnx" in code
    code = code.replace("localhost:8001", f"127.0.0.1:{GRPC_PORT}")
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    want = masked(np.arange(8, dtype=np.uint8).reshape(2, 4))
    assert done.stdout.strip() == str(want)
