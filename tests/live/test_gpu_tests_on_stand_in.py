"""tests/gpu/test_cuda_shared_memory.py runs here too, without a GPU: against a live server whose
CUDA IPC is the host stand-in (tests/gpu/stand_in: the server's one device interface and the
client's ``tritonclient.utils.cuda_shared_memory`` replaced, nothing else). So the CUDA
shared-memory paths over HTTP and gRPC with stock tritonclient, and the GPU test module itself,
are checked on every run, not first on a lent GPU. Every test of the module must pass: none may
be skipped (a skip would mean the stand-in did not take)."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_shared_memory_tests_pass_on_the_stand_in(tmp_path: Path) -> None:
    report = tmp_path / "report.xml"
    tests = str(ROOT / "tests")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (tests, os.environ.get("PYTHONPATH")))),
    }
    run = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "-p", "gpu.stand_in.plugin", f"--junitxml={report}",
            "tests/gpu/test_cuda_shared_memory.py",
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    suite = ElementTree.parse(report).getroot().find("testsuite")
    assert suite is not None
    counts = {key: int(suite.get(key, "0")) for key in ("tests", "failures", "errors", "skipped")}
    assert counts["tests"] > 0
    assert counts == {"tests": counts["tests"], "failures": 0, "errors": 0, "skipped": 0}, counts
