"""The GPU check (scripts/gpu_session.sh, gpu_preflight.py, gpu_wheels.py; docs/gpu.md) on a
machine without a GPU, so that a device's short time goes to the device, not to surprises:

- the session's dry run: every step in its order, each with its log, on the stand-ins, and the
  summary passing; the plans of the device modes within their budgets and in the same order;
- the verdicts: a benchmark's ``skipped:`` or a skipped test fails its step, and a step that
  makes the rest pointless stops them;
- the preflight on the CUDA IPC stand-in, with each size query the driver might refuse
  refused, and with all of them (the failure said, and the exit status);
- GPU mode: the GPU tests fail, not skip, without a device;
- the wheel set: every pin from uv.lock with its hashes, and what a folder of wheels lacks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SESSION = ROOT / "scripts" / "gpu_session.sh"
PREFLIGHT = ROOT / "scripts" / "gpu_preflight.py"
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_wheels  # noqa: E402

STEPS = [
    "install wheels",
    "environment",
    "preflight",
    "tests/gpu",
    "bench cuda_shared_memory",
    "bench gpu_ops",
    "bench shm on cupy",
]
LOGS = {
    "install.log",
    "environment.log",
    "preflight.log",
    "gpu-tests.log",
    "bench-cuda-shared-memory.log",
    "bench-gpu-ops.log",
    "bench-shared-memory-cupy.log",
    "summary.txt",
}
MAX_FILES_BACK = 8  # the logs a run leaves in $OUT: few, so all of them can be copied back


def cupy_backend_works() -> bool:
    from tensorbits.core.backends import BackendUnavailable, select_backend

    try:
        select_backend("cupy").backend.close()
    except BackendUnavailable:
        return False
    return True


def session(
    *args: str, tmp_path: Path, timeout: float = 100, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        **(extra_env or {}),
        "PYTHON": sys.executable,
        "OUT": str(tmp_path / "out"),
        "TMPDIR": str(tmp_path),
        "SESSION_WHEELS": str(tmp_path / "no-wheels"),  # a prepared .whl/ is for Python 3.12
    }
    return subprocess.run(
        ["bash", str(SESSION), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def summary_rows(text: str) -> list[tuple[str, str]]:
    """(verdict, step) of each line of the summary."""
    rows = []
    for line in text.split("=== summary", 1)[1].splitlines()[1:]:
        for name in STEPS:
            match = re.match(rf"^(.*?)\s+{re.escape(name)}\s", line)
            if match:
                rows.append((match.group(1).strip(), name))
    return rows


def test_the_dry_run_runs_every_step_in_order_and_passes(tmp_path: Path) -> None:
    done = session("dry-run", tmp_path=tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert summary_rows(done.stdout) == [("PASSED", name) for name in STEPS]
    out = tmp_path / "out"
    assert {p.name for p in out.iterdir()} == LOGS
    assert len(LOGS) <= MAX_FILES_BACK
    summary = (out / "summary.txt").read_text()
    assert re.search(r"^preflight: PASS: .* sizes read with cuMemGetAddressRange", summary, re.M)
    collected = re.search(r"^tests/gpu: (\d+) tests collected", summary, re.M)
    assert collected is not None, summary
    assert int(collected.group(1)) > 200, summary
    environment = (out / "environment.log").read_text()
    assert "refusing the modules of every distribution not carried" in environment
    assert "0 imports failed, 0 differ from uv.lock" in environment
    assert re.search(r"^  typing-extensions +4\.1[4-9]", environment, re.M), environment
    assert "every byte inverted" in (out / "preflight.log").read_text()


def plan(mode: str, tmp_path: Path) -> tuple[int, list[tuple[str, int]]]:
    done = session("plan", mode, tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    budget = int(re.search(r"at most (\d+)s in all", done.stdout).group(1))  # type: ignore[union-attr]
    steps = [
        (m.group(1).strip(), int(m.group(2)))
        for m in re.finditer(r"^(.+?)\s+at most\s+(\d+)s\s+->", done.stdout, re.M)
    ]
    return budget, steps


@pytest.mark.parametrize(
    ("mode", "budget", "names"),
    [
        ("quick", 300, STEPS[:4]),  # a first call with room for a second
        ("bench", 240, STEPS[:2] + STEPS[4:]),
        ("full", 480, STEPS),
        ("dry-run", 240, STEPS),
    ],
)
def test_each_mode_keeps_the_order_within_its_budget(
    tmp_path: Path, mode: str, budget: int, names: list[str]
) -> None:
    got, steps = plan(mode, tmp_path)
    assert got == budget
    assert [name for name, _ in steps] == names  # environment, preflight, tests, benchmarks
    assert all(10 <= limit <= budget for _, limit in steps)
    # One device call is at most 600 s: the budget, plus the kill grace of the last step.
    assert budget + 10 < 600


@pytest.mark.parametrize(
    ("status", "log", "verdict"),
    [
        (0, "| row |\ntargets at 64 MiB: met\n", "PASSED"),
        (0, "skipped: no CUDA device (CUDARuntimeError)\n", "FAILED (skipped)"),
        (0, "======= 119 passed, 2 skipped in 80.1s =======\n", "FAILED (skipped)"),
        (0, "119 passed, 2 skipped in 80.1s\n", "FAILED (skipped)"),
        (0, "======= 121 passed in 80.1s =======\n", "PASSED"),
        (1, "======= 1 failed, 120 passed in 80.1s =======\n", "FAILED (exit 1)"),
        (124, "", "TIMED OUT"),
        (137, "", "TIMED OUT"),
        (5, "======= no tests ran in 0.1s =======\n", "NO TESTS RAN"),
    ],
)
def test_verdicts(tmp_path: Path, status: int, log: str, verdict: str) -> None:
    path = tmp_path / "step.log"
    path.write_text(log)
    done = session("verdict", str(status), str(path), tmp_path=tmp_path)
    assert done.stdout.strip() == verdict


def test_a_failed_install_stops_the_rest(tmp_path: Path) -> None:
    """No wheels on the device: nothing after it could pass; the call ends at once, failed."""
    done = session("quick", tmp_path=tmp_path)
    assert done.returncode == 1
    rows = summary_rows(done.stdout)
    assert rows[0] == ("FAILED (exit 2)", "install wheels")
    assert rows[1:] == [("NOT RUN", name) for name in STEPS[1:4]]
    assert "the wheels did not install" in done.stdout


def test_make_gpu_check_uses_the_projects_environment_without_wheels(tmp_path: Path) -> None:
    """`make gpu-check` (NO_WHEELS=1): the install step takes the running Python's packages and
    passes; without a device the preflight then stops the call, as anywhere."""
    makefile = (ROOT / "Makefile").read_text()
    target = makefile[makefile.index("\ngpu-check:") :].split("\n\n")[0]
    assert "--all-extras" in target
    assert "NO_WHEELS=1 PYTHON=$(BIN)/python bash scripts/gpu_session.sh" in target
    done = session("install", tmp_path=tmp_path, extra_env={"NO_WHEELS": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"no wheels: {sys.executable}'s own packages")
    if cupy_backend_works():
        return
    done = session("quick", tmp_path=tmp_path, extra_env={"NO_WHEELS": "1"})
    rows = summary_rows(done.stdout)
    assert rows[0] == ("PASSED", "install wheels")
    assert ("FAILED (exit 3)", "preflight") in rows
    assert done.returncode == 1


def test_without_a_device_the_preflight_says_so_and_stops_the_session() -> None:
    """Exit 3: the session runs nothing after it (steps_preflight)."""
    if cupy_backend_works():
        pytest.skip("a CuPy backend works here: the preflight runs for real (GPU session)")
    done = subprocess.run(
        [sys.executable, str(PREFLIGHT)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    assert "preflight: FAIL: no working CuPy backend" in done.stdout


def preflight(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PREFLIGHT), "--stand-in", "--sizes", "64,4096,65537", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("refused", "chosen"),
    [
        ("cuMemGetAddressRange", "cuPointerGetAttribute range"),
        ("cuMemGetAddressRange,cuPointerGetAttribute range", "buffer id extent"),
    ],
)
def test_the_preflight_takes_the_fallback_the_driver_leaves(refused: str, chosen: str) -> None:
    done = preflight("--refuse", refused)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"preflight: PASS: backend and CUDA IPC work; sizes read with {chosen} (" in done.stdout
    for size in ("64 B", "4 KiB", "65537 B"):
        assert re.search(rf"{size}: opened .* by {chosen}; .* every byte inverted", done.stdout)
    for name in refused.split(","):
        assert re.search(rf"^ +{name}: DriverError: ", done.stdout, re.M)
    assert f"sizes are read with {chosen}" in done.stderr  # the server's warning, once
    assert done.stderr.count("sizes are read with") == 1


def test_the_preflight_fails_loudly_when_no_size_can_be_read() -> None:
    done = preflight("--refuse", ",".join(size_query_names()))
    assert done.returncode == 1, done.stdout + done.stderr
    verdict = done.stdout.strip().splitlines()[-1]
    assert verdict.startswith("preflight: FAIL: 64 B: raw_handle: the size of the device")
    assert all(name in verdict for name in size_query_names())


def size_query_names() -> list[str]:
    from tensorbits.core.cuda_ipc import SIZE_QUERIES

    return list(SIZE_QUERIES)


def test_gpu_mode_fails_what_would_skip_without_a_device() -> None:
    if cupy_backend_works():
        pytest.skip("a CuPy backend works here: GPU mode runs the GPU tests (tests/gpu)")
    files = [
        "tests/gpu/test_gpu_cupy.py",
        "tests/gpu/test_gpu_batch.py",
        "tests/gpu/test_cuda_shared_memory.py",
        "tests/gpu/test_gpu_ops_bench.py::test_rows_on_the_device_or_skipped_with_the_reason",
    ]
    # Without GPU mode they skip (as every `make test` shows); with it, each fails.
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"]
    required = subprocess.run(
        [*command, "--continue-on-collection-errors", *files],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "TENSORBITS_GPU_REQUIRED": "1"},
    )  # fmt: skip
    assert required.returncode == 1, required.stdout[-3000:]
    assert re.search(r"^1 failed, 3 errors in ", required.stdout, re.M), required.stdout[-3000:]
    assert "skipped" not in required.stdout.splitlines()[-1]
    assert required.stdout.count("TENSORBITS_GPU_REQUIRED is set: ") >= 4


def lock_versions() -> dict[str, str]:
    return {p["name"]: p["version"] for p in gpu_wheels.load_lock() if p["name"] != "numpy"}


def test_the_wheel_set_is_the_lock_with_its_hashes() -> None:
    pins = {pin.name: pin for pin in gpu_wheels.carried(gpu_wheels.load_lock())}
    versions = lock_versions()
    assert all(pin.version == versions[name] for name, pin in pins.items())
    assert all(
        pin.hashes and all(h.startswith("sha256:") for h in pin.hashes) for pin in pins.values()
    )
    # What the service, the tests and their tools import, pydantic-core's typing-extensions too.
    needed = {"fastapi", "pydantic-core", "typing-extensions", "grpcio", "uvicorn", "tritonclient",
              "geventhttpclient", "pytest", "pytest-timeout", "hypothesis", "cuda-pathfinder"}  # fmt: skip
    assert needed <= set(pins)
    major, minor = map(int, pins["typing-extensions"].version.split(".")[:2])
    assert (major, minor) >= (4, 14)  # pydantic-core 2.50 needs typing_extensions.Sentinel
    # The machine's own NumPy (its CuPy's); the workspace travels as source.
    assert not {"numpy", "tensorbits", "tensorbits-client", "tensorbits-protocol"} & set(pins)
    requirement = pins["typing-extensions"].requirement()
    assert requirement.startswith(f"typing-extensions=={versions['typing-extensions']} --hash=")


def wheel_name(name: str, version: str, tags: str = "py3-none-any") -> str:
    return f"{name.replace('-', '_')}-{version}-{tags}.whl"


def test_check_says_what_a_folder_of_wheels_lacks(tmp_path: Path) -> None:
    pins = gpu_wheels.carried(gpu_wheels.load_lock())
    for pin in pins:
        (tmp_path / wheel_name(pin.name, pin.version)).touch()
    (tmp_path / wheel_name("cuda-bindings", gpu_wheels.CUDA_BINDINGS, "cp312-cp312-manylinux_2_28_x86_64")).touch()  # fmt: skip
    assert gpu_wheels.check(tmp_path, gpu_wheels.load_lock()) == []

    (tmp_path / wheel_name("typing-extensions", pins_of(pins, "typing-extensions"))).unlink()
    (tmp_path / wheel_name("pytest", "8.0.0")).touch()
    (tmp_path / wheel_name("numpy", "2.5.5", "cp312-cp312-manylinux_2_28_x86_64")).touch()
    (tmp_path / wheel_name("jiter", pins_of(pins, "jiter"))).unlink()
    (tmp_path / wheel_name("jiter", pins_of(pins, "jiter"), "cp312-cp312-win_amd64")).touch()
    problems = gpu_wheels.check(tmp_path, gpu_wheels.load_lock())
    assert any(p.startswith("typing-extensions ") and p.endswith(": missing") for p in problems)
    assert any(p.startswith("pytest: 8.0.0, ") for p in problems)  # two versions stop pip
    assert any(p.startswith("numpy 2.5.5: not needed") for p in problems)
    assert any("win_amd64" in p and "not installable" in p for p in problems)
    assert len(problems) == 4, problems


def pins_of(pins: list[gpu_wheels.Pin], name: str) -> str:
    return next(pin.version for pin in pins if pin.name == name)
