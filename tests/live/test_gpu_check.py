"""The GPU check (scripts/gpu_check.py, `make wheelhouse`, `make gpu-check`; docs/gpu.md) on a
machine without a GPU: what the make targets run, the wheelhouse's pins and hashes read off
uv.lock and enough for what the check imports, `make gpu-check` failing at its preflight with
one line a missing part, and GPU mode turning a skip into a failure."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UV = ROOT / ".tools" / "bin" / "uv"
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_check  # noqa: E402


def make_n(*args: str) -> str:
    """What ``make -n ARGS`` would run, as make prints it at the top level: run from inside
    another make (``make test-all``), it would inherit that make's level and flags and print
    ``Entering directory`` lines around the commands."""
    top_level = {
        k: v for k, v in os.environ.items() if k not in {"MAKELEVEL", "MAKEFLAGS", "MFLAGS"}
    }
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", *args],
        cwd=ROOT, env=top_level, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_make_targets_run_the_script_online_and_from_a_wheelhouse() -> None:
    online = make_n("gpu-check", "UV=.tools/bin/uv")
    assert "sync --all-packages --locked --python python3 --all-extras" in online
    assert ".venv/bin/python scripts/gpu_check.py run --uv .tools/bin/uv --results " in online
    # Air-gapped: the host's Python, no uv (none can be installed there), no sync.
    offline = make_n("gpu-check", "WHEELHOUSE=w", "RESULTS=r", "UV=/no/uv", "PYTHON=python3.12")
    assert offline.strip() == "python3.12 scripts/gpu_check.py run --wheelhouse w --results r"
    house = make_n("wheelhouse", "UV=.tools/bin/uv")
    folder = re.search(r"gpu_check\.py wheelhouse (\S+) --uv .tools/bin/uv", house)
    assert folder is not None
    assert "--python-version 3.12" in house
    ignored = subprocess.run(["git", "check-ignore", "-q", f"{folder[1]}/x.whl"], cwd=ROOT)
    assert ignored.returncode == 0  # never committed by accident


@pytest.fixture(scope="module")
def pins() -> dict[str, list[str]]:
    if not UV.exists():
        pytest.skip("no .tools/bin/uv (make install makes it)")
    found = {}
    for line in gpu_check.requirements(str(UV), "3.12"):
        name, _, rest = line.partition("==")
        version, *hashes = rest.split(" --hash=")
        found[name] = [version, *sorted(hashes)]
    return found


def test_the_wheelhouse_is_the_lock_with_its_hashes(pins: dict[str, list[str]]) -> None:
    lock = tomllib.loads((ROOT / "uv.lock").read_text())["package"]
    pins = dict(pins)
    for package in lock:
        if package["name"] in pins and pins[package["name"]][0] == package["version"]:
            files = [*package.get("wheels", []), *filter(None, [package.get("sdist")])]
            assert pins.pop(package["name"])[1:] == sorted(f["hash"] for f in files)
    assert pins == {}  # every pin found in the lock, at its version, with every file's hash


def test_the_wheelhouse_holds_the_check_and_not_the_hosts_part(
    pins: dict[str, list[str]],
) -> None:
    needed = {"fastapi", "pydantic-core", "grpcio", "onnx", "uvicorn", "httpx", "jiter"}
    needed |= {"tritonclient", "geventhttpclient", "pytest", "pytest-timeout", "hypothesis"}
    assert needed <= set(pins)
    host = {"numpy", "cupy-cuda12x", "cuda-bindings", "cuda-pathfinder"}
    dev_only = {"mypy", "ruff", "pytest-xdist", "schemathesis", "onnxruntime", "kserve"}
    workspace = {"tensorbits", "tensorbits-client", "tensorbits-protocol"}
    assert not (host | dev_only | workspace) & set(pins)


# What runs on the host: the GPU tests' modules and the benchmark, importing nothing but the
# wheelhouse's distributions, the host's and the source tree.
ONLY_THE_WHEELHOUSE = """
import importlib, importlib.metadata as md, re, sys
allowed = {re.sub(r"[-_.]+", "-", n).lower() for n in sys.argv[1].split(",")}
refused = {top for top, owners in md.packages_distributions().items()
           if not any(re.sub(r"[-_.]+", "-", o).lower() in allowed for o in owners)}
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in refused:
            raise ModuleNotFoundError(f"{name}: not in the wheelhouse", name=name)
sys.meta_path.insert(0, Refuse())
import pytest
status = pytest.main(["-p", "pytest_timeout", "-p", "_hypothesis_pytestplugin", "-q",
                      "--collect-only", "-p", "no:cacheprovider", "tests/gpu"])
sys.path.insert(0, "."); importlib.import_module("bench.gpu_ops")
sys.exit(status)
"""


def test_what_the_check_imports_comes_from_the_wheelhouse(pins: dict[str, list[str]]) -> None:
    host = ["numpy", "cupy-cuda12x", "cuda-bindings", "cuda-pathfinder"]
    workspace = ["tensorbits", "tensorbits-client", "tensorbits-protocol"]
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", HYPOTHESIS_NO_PLUGINS="1")
    allowed = ",".join([*pins, *host, *workspace])
    done = subprocess.run(
        [sys.executable, "-c", ONLY_THE_WHEELHOUSE, allowed],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"^\d+ tests collected", done.stdout, re.M), done.stdout[-2000:]


def no_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return True
    return False


@pytest.mark.skipif(not no_driver(), reason="an NVIDIA driver is here: the check runs for real")
@pytest.mark.parametrize("house", ["made", "empty", None])
def test_without_a_gpu_the_check_says_what_is_missing_and_stops(
    tmp_path: Path, house: str | None
) -> None:
    results, wheelhouse = tmp_path / "results", tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    if house == "made":
        python = f"{sys.version_info.major}.{sys.version_info.minor}"
        (wheelhouse / "requirements.txt").write_text(f"# python {python}, linux x86_64\n")
    where = [f"WHEELHOUSE={wheelhouse}"] if house else []
    done = subprocess.run(
        ["make", "gpu-check", *where, f"RESULTS={results}", f"PYTHON={sys.executable}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    ) if house else subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "run", "--results", str(results)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    summary = (results / "summary.txt").read_text()
    assert re.match(r"GPU check, .*: FAILED\n", summary)
    assert "preflight: FAIL: no NVIDIA driver: libcuda.so.1 does not load" in summary
    if importlib.util.find_spec("cupy") is None:
        assert "preflight: FAIL: CuPy is missing (ModuleNotFoundError" in summary
        assert "pip install cupy-cuda13x" in summary
    assert ("no wheelhouse in" in summary) == (house == "empty")
    assert summary.endswith(
        "nothing else ran: install what the preflight lists, then run it again\n"
    )
    assert {p.name for p in results.iterdir()} == {"summary.txt", "preflight.log"}
    assert summary in done.stdout.replace("=== summary\n", "")


@pytest.mark.parametrize(
    ("status", "log", "verdict"),
    [
        (0, "| row |\ntargets at >= 64 MiB: 40/40 rows meet them\n", "PASSED"),
        (0, "skipped: no CUDA device (CUDARuntimeError)\n", "FAILED (skipped)"),
        (0, "======= 419 passed, 3 skipped in 80.1s =======\n", "FAILED (skipped)"),
        (0, "======= 422 passed in 80.1s =======\n", "PASSED"),
        (1, "======= 1 failed, 421 passed in 80.1s =======\n", "FAILED (exit 1)"),
        (124, "", "TIMED OUT"),
    ],
)
def test_a_skip_on_the_gpu_host_fails_its_step(status: int, log: str, verdict: str) -> None:
    assert gpu_check.verdict(status, log) == verdict


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is here")
def test_gpu_mode_fails_what_would_skip_without_a_device() -> None:
    files = ["tests/gpu/test_cupy.py", "tests/gpu/test_device_batch.py"]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
    env = dict(os.environ, TENSORBITS_GPU_REQUIRED="1")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    totals = gpu_check.pytest_totals(done.stdout)
    assert done.returncode != 0
    assert "error" in totals, totals
    assert "skipped" not in totals, totals
    assert "TENSORBITS_GPU_REQUIRED is set: " in done.stdout
