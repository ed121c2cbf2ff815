"""Every Python example of the README and of docs/ runs, verbatim, in a fresh virtual environment
holding only what the README's install command installs, against a real server.

A block fenced as ``python`` is an example and must run; a sketch that is not meant to run is
fenced as something else (``text``). Examples reach the server through ``$TENSORBITS_URL``, the
client's documented default, set here to the test server.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.live import LiveServer, serve

ROOT = Path(__file__).resolve().parents[2]
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


@pytest.fixture(scope="module")
def live_server() -> Iterator[LiveServer]:
    """The session's server, but with the system shared-memory extension on: the README's
    shared-memory example registers a region."""
    with serve({"TENSORBITS_SHARED_MEMORY": "true"}) as server:
        yield server


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.parametrize("code", examples())
def test_the_example_runs_as_written(
    code: str, documented_venv: Path, live_server: LiveServer, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["TENSORBITS_URL"] = live_server.base_url
    done = subprocess.run(
        [str(documented_venv), "-c", code],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
