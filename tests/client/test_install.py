"""The client distribution installs and imports on its own: no FastAPI, no CuPy, no server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UV = ROOT / ".tools" / "bin" / "uv"


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_client_installs_without_the_server_stack(tmp_path: Path) -> None:
    if not UV.exists():
        pytest.skip(f"uv is not bootstrapped at {UV} (make install does it)")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    env = {**os.environ, "PYTHONPATH": str(ROOT / ".tools"), "UV_PYTHON_DOWNLOADS": "never"}
    env.pop("VIRTUAL_ENV", None)
    subprocess.run(
        [str(UV), "pip", "install", "--quiet", "--python", str(python), str(ROOT / "client")],
        check=True,
        env=env,
        timeout=150,
    )
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    check = (
        "import sys, tensorbits_client, tensorbits_client.recipes\n"
        "assert 'fastapi' not in sys.modules, 'fastapi was imported'\n"
        "assert 'cupy' not in sys.modules, 'cupy was imported'\n"
        "assert 'starlette' not in sys.modules\n"
        "c = tensorbits_client.Client('http://127.0.0.1:9'); c.close()\n"
        "print(tensorbits_client.__version__)\n"
    )
    done = subprocess.run(
        [str(python), "-c", check], env=clean, cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    for absent in ("fastapi", "cupy", "tensorbits"):
        probe = subprocess.run(
            [str(python), "-c", f"import {absent}"], env=clean, cwd=tmp_path, capture_output=True
        )
        assert probe.returncode != 0, f"{absent} is importable in the client-only venv"
