"""The GPU check (docs/gpu.md): what `make wheelhouse` and `make gpu-check` run.

    python scripts/gpu_check.py wheelhouse DIR [--python-version 3.12] [--uv UV]
        on a connected machine: uv.lock's wheels for the check (CPython 3.12, x86-64 Linux), each
        checked against the lock's hashes, and DIR/requirements.txt that pins them
    python scripts/gpu_check.py run --results DIR [--wheelhouse DIR | --uv UV]
        on the GPU host: the preflight, the wheelhouse installed (pip --no-index), tests/gpu in
        GPU mode, bench/gpu_ops.py --quick; DIR/summary.txt and one log a step

The host brings NumPy, CuPy and cuda-bindings (tritonclient's CUDA shared memory needs it): the
wheelhouse holds every other distribution the service, its client and the GPU tests import. The
preflight says in one line each what is missing and how to get it, and then nothing else runs.
A skipped test or a benchmark's ``skipped:`` line fails its step; the exit status is 0 only when
every step passed. ``--uv``: online, the uv that installs cuda-bindings where it is missing.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FROM_THE_HOST = ("numpy", "cupy", "cuda-bindings")  # never in the wheelhouse (CuPy: 100+ MiB)
TEST_TOOLS = ("pytest", "pytest-timeout", "hypothesis", "tritonclient")  # of the dev group
WHEELHOUSE_MIB, WITH_TREE_MIB = 60, 64  # its size; with the repository tree
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(39, 4, -1)] + [
    f"manylinux{v}_x86_64" for v in ("2014", "2010", "1")
]
SOURCES = [ROOT / "service" / "src", ROOT / "client" / "src", ROOT / "protocol" / "src"]
STEP_TIMEOUT_S = 3600
PYTEST = ["-m", "pytest", "-p", "pytest_timeout", "-p", "_hypothesis_pytestplugin"]
MiB = 1 << 20


# --- the wheelhouse, on a connected machine ----------------------------------------------------


def requirements(uv: str, python_version: str) -> list[str]:
    """uv.lock's pins for the host (``name==version --hash=...``, no markers): the dependencies
    of the service, the client and the protocol, and the GPU tests' tools from the dev group."""
    try:
        markers: Any = importlib.import_module("packaging.markers")
    except ImportError:  # a Python with pip but no packaging of its own
        markers = importlib.import_module("pip._vendor.packaging.markers")
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]["dev"]
    names = [re.match(r"[\w.-]+", str(d))[0] for d in dev]  # type: ignore[index]
    prune = [arg for name in names if name not in TEST_TOOLS for arg in ("--prune", name)]
    export = [uv, "export", "--frozen", "--no-emit-workspace", "--no-annotate", "--no-header"]
    export += [f"--no-emit-package={name}" for name in FROM_THE_HOST]
    environment = {
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
    }
    pins: dict[str, str] = {}
    for part in (["--all-packages", "--no-dev"], ["--only-group", "dev", *prune]):
        text = subprocess.run(
            [*export, *part], cwd=ROOT, check=True, capture_output=True, text=True
        )
        for entry in text.stdout.replace("\\\n", " ").splitlines():
            spec, *hashes = entry.split(" --hash=")
            pin, _, marker = spec.partition(";")
            if pin.strip() and (not marker or markers.Marker(marker.strip()).evaluate(environment)):
                line = " ".join([pin.strip(), *(f"--hash={h.strip()}" for h in hashes)])
                if pins.setdefault(pin.split("==")[0].strip(), line) != line:
                    raise SystemExit(f"gpu_check: two pins of {pin.split('==')[0]} in uv.lock")
    return [pins[name] for name in sorted(pins)]


def tree_bytes() -> int:
    """The repository's tracked files: what is copied to the host with the wheelhouse."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    files = (ROOT / name for name in listed.stdout.decode().split("\0") if name)
    return sum(path.stat().st_size for path in files if path.is_file())


def wheelhouse(folder: Path, uv: str, python_version: str) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.whl"):
        old.unlink()
    pins = requirements(uv, python_version)
    listing = folder / "requirements.txt"
    listing.write_text(
        f"# python {python_version}, linux x86_64: `make wheelhouse` from uv.lock"
        " (scripts/gpu_check.py); NumPy, CuPy and cuda-bindings are the host's\n"
        + "".join(f"{pin}\n" for pin in pins)
    )
    platforms = [arg for tag in PLATFORMS for arg in ("--platform", tag)]
    download = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    download += ["--require-hashes", "--python-version", python_version, "--implementation"]
    download += ["cp", *platforms, "--disable-pip-version-check", "-q", "-d", str(folder)]
    if subprocess.run([*download, "-r", str(listing)], check=False).returncode:
        return 1
    wheels = sorted(folder.glob("*.whl"))
    size, tree = sum(w.stat().st_size for w in wheels), tree_bytes()
    print(
        f"wheelhouse: {len(wheels)} wheels for {len(pins)} pins, {size / MiB:.1f} MiB in {folder}/"
        f" (limit {WHEELHOUSE_MIB}); with the repository tree ({tree / MiB:.1f} MiB): "
        f"{(size + tree) / MiB:.1f} MiB (limit {WITH_TREE_MIB})"
    )
    if len(wheels) != len(pins) or size > WHEELHOUSE_MIB * MiB:
        print(f"gpu_check: {len(wheels)} wheels for {len(pins)} pins, or over the limit")
        return 1
    return 1 if size + tree > WITH_TREE_MIB * MiB else 0


# --- the check, on the GPU host -----------------------------------------------------------------


def driver() -> tuple[int, str]:
    """The driver's CUDA major version and its devices, or (0, why there is none)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0, "no NVIDIA driver: libcuda.so.1 does not load (install the driver for the GPU)"
    version, count = ctypes.c_int(0), ctypes.c_int(0)
    if status := cuda.cuInit(0):
        return 0, f"the NVIDIA driver does not start (cuInit error {status}): see nvidia-smi"
    cuda.cuDriverGetVersion(ctypes.byref(version))
    if cuda.cuDeviceGetCount(ctypes.byref(count)) or count.value == 0:
        return 0, "the NVIDIA driver sees no CUDA device: see nvidia-smi"
    major, minor = divmod(version.value, 1000)
    return major, f"{count.value} CUDA device(s), driver for CUDA {major}.{minor // 10}"


def importable(module: str) -> str:
    """Why ``module`` does not import here (empty: it does)."""
    try:
        importlib.import_module(module)
    except Exception as exc:  # CuPy raises more than ImportError when its CUDA is broken
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return ""


def preflight(wheelhouse: Path | None, uv: str | None) -> tuple[list[str], list[str]]:
    """(what was found, what is missing), one line each: the driver, the Python the wheelhouse
    is for, pip, NumPy, CuPy and cuda-bindings in the Python that runs the check."""
    found: list[str] = []
    missing: list[str] = []
    major, line = driver()
    (found if major else missing).append(line)
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if wheelhouse is not None:
        listing = wheelhouse / "requirements.txt"
        wanted = re.findall(
            r"^# python (\d+\.\d+)", listing.read_text() if listing.exists() else ""
        )
        if not wanted:
            missing.append(f"no wheelhouse in {wheelhouse}/: `make wheelhouse` on a connected "
                           "machine makes one; copy its folder here")  # fmt: skip
        elif wanted[0] != python:
            missing.append(f"Python {python} runs the check, the wheelhouse is for {wanted[0]}: "
                           f"PYTHON=python{wanted[0]}, or `make wheelhouse WHEELHOUSE_PYTHON="
                           f"{python}`")  # fmt: skip
        if why := importable("pip"):
            missing.append(f"pip is missing ({why}): install the system's python3-pip")
    if (why := importable("cuda.bindings.runtime")) and uv and major:
        install = [uv, "pip", "install", "--python", sys.executable, f"cuda-bindings=={major}.*"]
        why = "" if subprocess.run(install, check=False).returncode == 0 else why
    cuda, other = major or 13, "" if major else " (12 for a CUDA 12 driver)"
    host = [
        ("NumPy", importable("numpy"), "pip install numpy"),
        ("CuPy", importable("cupy"), f"pip install cupy-cuda{cuda}x{other}"),
        (
            "cuda-bindings",
            why,
            f"pip install 'cuda-bindings=={cuda}.*'{other} (tritonclient's CUDA shared memory)",
        ),
    ]
    missing += [f"{name} is missing ({why}): {remedy}" for name, why, remedy in host if why]
    if any(why for _, why, _ in host) and not uv:
        missing.append("air-gapped host: `pip download` these on a connected machine, then "
                       "`pip install --no-index --find-links FOLDER` them here")  # fmt: skip
    if major and "cupy" in sys.modules:
        cupy = sys.modules["cupy"]
        try:
            device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
            found.append(f"{device}, CuPy {cupy.__version__}, Python {sys.version.split()[0]}")
        except Exception as exc:  # cupy.cuda.runtime.CUDARuntimeError and its kin
            missing.append(f"CuPy does not reach the device: {type(exc).__name__}: {exc}")
    return found, missing


def pytest_totals(log: str) -> str:
    """pytest's closing counts (``=== 3 passed, 1 skipped in 2.0s ===``), or empty."""
    counts = re.findall(r"^=* ?(\d+ \w+(?:, \d+ \w+)* in [\d.]+s)\b.*$", log, re.M)
    return counts[-1] if counts else ""


def verdict(status: int, log: str) -> str:
    """How a step ended: on the GPU host a skip means the device part did not run."""
    if status == 124:
        return "TIMED OUT"
    if status:
        return f"FAILED (exit {status})"
    skipped = " skipped" in pytest_totals(log) or re.search(r"^skipped:", log, re.M)
    return "FAILED (skipped)" if skipped else "PASSED"


def step(name: str, command: list[str], log: Path, env: dict[str, str]) -> tuple[str, str]:
    """Run ``command`` with its output in ``log``: (the summary's row, the log's text)."""
    started = time.monotonic()
    print(f"=== {name} -> {log}", flush=True)
    with log.open("w") as out:
        try:
            status = subprocess.run(
                command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                timeout=STEP_TIMEOUT_S, check=False,
            ).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            status = 124
    text = log.read_text()
    print("".join(text.splitlines(keepends=True)[-15:]), end="", flush=True)
    took = time.monotonic() - started
    return f"{verdict(status, text):<18} {name:<12} {took:6.0f} s  {log.name}", text


def check(results: Path, wheelhouse: Path | None, uv: str | None) -> int:
    results.mkdir(parents=True, exist_ok=True)
    for name in ("summary.txt", "preflight.log", "install.log", "tests.log", "bench.log"):
        (results / name).unlink(missing_ok=True)
    found, missing = preflight(wheelhouse, uv)
    lines = [f"preflight: {line}" for line in found] + [f"preflight: FAIL: {m}" for m in missing]
    (results / "preflight.log").write_text("".join(f"{line}\n" for line in lines))
    rows = [f"{'FAILED' if missing else 'PASSED':<18} {'preflight':<12} {0:6.0f} s  preflight.log"]
    texts: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="tensorbits-gpu-check-") as site:
        env = dict(os.environ, TENSORBITS_GPU_REQUIRED="1", TENSORBITS_BACKEND="cupy")
        env.update(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", HYPOTHESIS_NO_PLUGINS="1")
        paths = [*([site] if wheelhouse else []), *map(str, SOURCES), env.get("PYTHONPATH", "")]
        env.update(PYTHONPATH=os.pathsep.join(filter(None, paths)), PYTHONUNBUFFERED="1")
        steps = [
            (
                "tests/gpu",
                "tests.log",
                [*PYTEST, "-v", "--continue-on-collection-errors", "tests/gpu"],
            ),
            ("bench", "bench.log", ["bench/gpu_ops.py", "--quick"]),
        ]
        if wheelhouse is not None:
            install = ["-m", "pip", "install", "--no-index", "--find-links", str(wheelhouse)]
            install += ["--require-hashes", "--no-deps", "--no-compile", "--target", site, "-r"]
            steps.insert(
                0, ("install", "install.log", [*install, str(wheelhouse / "requirements.txt")])
            )
        for name, log, command in [] if missing else steps:
            row, texts[name] = step(name, [sys.executable, *command], results / log, env)
            rows.append(row)
            if name == "install" and not row.startswith("PASSED"):
                break  # nothing later could pass
    failed = missing or any(not row.startswith("PASSED") for row in rows)
    when = time.strftime("%Y-%m-%d %H:%M %Z")
    summary = [f"GPU check, {when}: {'FAILED' if failed else 'PASSED'}", *lines, *rows]
    if "tests/gpu" in texts:
        summary.append(f"tests/gpu: {pytest_totals(texts['tests/gpu']) or 'no counts'}")
    bench = re.findall(
        r"^(?:targets at .*|DIFFERENT RESULT.*|skipped:.*)$", texts.get("bench", ""), re.M
    )
    summary += [f"bench: {line}" for line in bench]
    if missing:
        summary.append("nothing else ran: install what the preflight lists, then run it again")
    (results / "summary.txt").write_text("".join(f"{line}\n" for line in summary))
    print("\n".join(["=== summary", *summary, f"(summary and logs in {results}/)"]))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    house = commands.add_parser("wheelhouse", help="uv.lock's wheels for an air-gapped GPU host")
    house.add_argument("folder", type=Path)
    house.add_argument("--python-version", default="3.12", help="the GPU host's Python")
    house.add_argument("--uv", default=str(ROOT / ".tools" / "bin" / "uv"))
    run = commands.add_parser("run", help="the check on this host's GPU")
    run.add_argument("--results", type=Path, required=True, help="summary.txt and the logs")
    source = run.add_mutually_exclusive_group()
    source.add_argument("--wheelhouse", type=Path, help="install from it (pip --no-index)")
    source.add_argument("--uv", help="online: this uv installs cuda-bindings when missing")
    args = parser.parse_args(argv)
    if args.command == "wheelhouse":
        return wheelhouse(args.folder, args.uv, args.python_version)
    return check(args.results, args.wheelhouse, args.uv)


if __name__ == "__main__":
    sys.exit(main())
