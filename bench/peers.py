"""The benchmarks' peer: a real Triton Inference Server, started by the benchmark itself.

The ``nvidia-pytriton`` wheel's ``tritonserver``, installed on demand into a venv outside the
project's lock (``$BENCH_PYTRITON_VENV``), serving Python-backend models named and bound like
ours; bench/README.md ("The Triton peer") says how and why. Where it cannot run, ``triton_peer``
raises ``PeerUnavailable`` with the reason, and the benchmarks carry on without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import free_port, note

# Pinned so that every run measures the same server (0.7.0 ships Triton 2.5x and its stubs for
# CPython 3.8 to 3.13).
PYTRITON = "nvidia-pytriton==0.7.0"
DEFAULT_VENV = Path.home() / ".cache" / "tensorbits-bench" / "pytriton-venv"
INSTALL_TIMEOUT = 600.0
START_TIMEOUT = 120.0
# Python backend shared memory: one region per model instance, grown on demand. Start it at
# 64 MiB + a margin and grow it in 64 MiB steps so that the 64 MiB round trip is not a series
# of 1 MiB growths (the backend's default), which would measure its allocator, not its serving.
SHM_BYTES = 80 * 1024 * 1024


@dataclass(frozen=True)
class Model:
    """One Python-backend model: our model name, its input names, what it computes (an
    expression of the inputs, by name, with NumPy as ``np``), its output, the tensors' type."""

    name: str
    inputs: tuple[str, ...]
    expression: str
    output: str = "OutputTensor"
    datatype: str = "UINT8"


# The same names as ours (DirectML's binding names), UINT8, rank 1, any length.
AB = ("ATensor", "BTensor")
MODELS: tuple[Model, ...] = (
    Model("DML_OPERATOR_ELEMENT_WISE_BIT_NOT", ("InputTensor",), "np.bitwise_not(InputTensor)"),
    Model("DML_OPERATOR_ELEMENT_WISE_BIT_AND", AB, "np.bitwise_and(ATensor, BTensor)"),
    Model("DML_OPERATOR_ELEMENT_WISE_BIT_OR", AB, "np.bitwise_or(ATensor, BTensor)"),
    Model("DML_OPERATOR_ELEMENT_WISE_BIT_XOR", AB, "np.bitwise_xor(ATensor, BTensor)"),
)

MODEL_PY = """\
import numpy as np
import triton_python_backend_utils as pb_utils

INPUTS = {inputs!r}


def OP({parameters}):
    return {expression}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            args = [pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in INPUTS]
            out = pb_utils.Tensor({output!r}, OP(*args))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""

CONFIG_PBTXT = """\
name: "{name}"
backend: "python"
max_batch_size: 0
input [
{inputs}
]
output [
  {{ name: "{output}" data_type: TYPE_{datatype} dims: [ -1 ] }}
]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""


class PeerUnavailable(RuntimeError):
    """The Triton peer cannot run here; the message says why and what was tried."""


@dataclass(frozen=True)
class TritonPeer:
    http_url: str
    grpc_url: str  # grpc's target form (and tritonclient.grpc's url): host:port, no scheme
    version: str
    pid: int  # tritonserver's; the backend's stubs are its children


def venv_dir() -> Path:
    # Not TENSORBITS_*: the server warns about every variable of its prefix that is no setting.
    return Path(os.environ.get("BENCH_PYTRITON_VENV", DEFAULT_VENV))


def _run(argv: list[str], what: str) -> str:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PeerUnavailable(f"{what} failed: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise PeerUnavailable(f"{what} failed (exit {done.returncode}): " + " | ".join(tail))
    return done.stdout


def ensure_pytriton(venv: Path | None = None) -> Path:
    """The venv's site-packages holding ``pytriton``, installing it first when missing."""
    venv = venv or venv_dir()
    python = venv / "bin" / "python"
    probe = "import pathlib, pytriton; print(pathlib.Path(pytriton.__file__).parent.parent)"
    if python.exists():
        with contextlib.suppress(PeerUnavailable):
            return Path(_run([str(python), "-c", probe], "import pytriton").strip())
    note(
        f"Triton peer: installing {PYTRITON} into {venv} (outside the project's lock, "
        "for the benchmarks only)"
    )
    venv.parent.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "venv", "--clear", str(venv)], f"python -m venv {venv}")
    _run([str(python), "-m", "pip", "install", "--quiet", PYTRITON], f"pip install {PYTRITON}")
    return Path(_run([str(python), "-c", probe], "import pytriton").strip())


def _interpreter_facts(venv: Path) -> tuple[str, str]:
    """The venv's Python version (major.minor) and its base interpreter's library folder."""
    code = (
        "import sys, sysconfig; "
        "print(f'{sys.version_info[0]}.{sys.version_info[1]}'); "
        "print(sysconfig.get_config_var('LIBDIR'))"
    )
    version, libdir = _run([str(venv / "bin" / "python"), "-c", code], "venv python").split()
    return version, libdir


def write_repository(root: Path) -> None:
    """One folder per model: ``config.pbtxt`` and ``1/model.py``."""
    for model in MODELS:
        folder = root / model.name
        (folder / "1").mkdir(parents=True)
        inputs = ",\n".join(
            f'  {{ name: "{name}" data_type: TYPE_{model.datatype} dims: [ -1 ] }}'
            for name in model.inputs
        )
        (folder / "config.pbtxt").write_text(
            CONFIG_PBTXT.format(
                name=model.name, inputs=inputs, output=model.output, datatype=model.datatype
            )
        )
        (folder / "1" / "model.py").write_text(
            MODEL_PY.format(
                inputs=model.inputs,
                parameters=", ".join(model.inputs),
                expression=model.expression,
                output=model.output,
            )
        )


def _backends(site: Path, version: str, into: Path) -> Path:
    """The wheel's backends folder with the Python backend's stub for this Python version
    (the wheel keeps one stub per version apart; PyTriton copies the right one in the same way)."""
    dist = site / "pytriton" / "tritonserver"
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise PeerUnavailable(f"no Python backend stub for Python {version} in {dist}")
    backends = into / "backends"
    shutil.copytree(dist / "backends", backends)
    shutil.copy(stub, backends / "python" / "triton_python_backend_stub")
    return backends


def _environment(venv: Path, site: Path, libdir: str) -> dict[str, str]:
    """The backend's stub embeds libpython: the venv's base interpreter's must load first (another
    fails with an ``_thread.RLock`` error), and ``python3`` on ``PATH`` gives it the venv's prefix,
    hence its NumPy, as PyTriton arranges it."""
    env = dict(os.environ)
    libs = [libdir, str(site / "nvidia_pytriton.libs")]
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(libs)
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)  # the stub's imports come from the peer's venv only
    env.pop("PYTHONHOME", None)
    return env


def _wait_ready(proc: subprocess.Popen[bytes], http_url: str, log: Path) -> str:
    """Triton's version, once the server and every model are ready."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PeerUnavailable(f"tritonserver exited with {proc.returncode}: {_log_tail(log)}")
        try:
            with urllib.request.urlopen(f"{http_url}/v2/health/ready", timeout=2):
                pass
            with urllib.request.urlopen(f"{http_url}/v2", timeout=2) as response:
                return str(json.load(response).get("version", "?"))
        except (OSError, urllib.error.URLError):
            time.sleep(0.2)
    raise PeerUnavailable(f"tritonserver not ready in {START_TIMEOUT:g} s: {_log_tail(log)}")


def _log_tail(log: Path, lines: int = 8) -> str:
    try:
        return " | ".join(log.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # Triton's graceful shutdown (unloads, stops stubs)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def triton_peer(venv: Path | None = None) -> Iterator[TritonPeer]:
    """A ``tritonserver`` on two free 127.0.0.1 ports (HTTP, gRPC) serving ``MODELS``: started
    directly, not through PyTriton's proxy, whose ZeroMQ hop per request made small requests
    about 20x slower (no fair peer)."""
    venv = venv or venv_dir()
    site = ensure_pytriton(venv)
    version, libdir = _interpreter_facts(venv)
    binary = site / "pytriton" / "tritonserver" / "bin" / "tritonserver"
    if not binary.exists():
        raise PeerUnavailable(f"no tritonserver binary at {binary}")
    with tempfile.TemporaryDirectory(prefix="tensorbits-triton-") as tmp:
        work = Path(tmp)
        repository = work / "models"
        write_repository(repository)
        backends = _backends(site, version, work)
        http_port, grpc_port = free_port(), free_port()
        argv = [
            str(binary), f"--model-repository={repository}", f"--backend-directory={backends}",
            f"--cache-directory={site / 'pytriton' / 'tritonserver' / 'caches'}",
            "--http-address=127.0.0.1", f"--http-port={http_port}",
            "--grpc-address=127.0.0.1", f"--grpc-port={grpc_port}",
            "--allow-metrics=false", "--allow-gpu-metrics=false", "--allow-cpu-metrics=false",
            f"--backend-config=python,shm-default-byte-size={SHM_BYTES}",
            f"--backend-config=python,shm-growth-byte-size={SHM_BYTES}",
            "--log-verbose=0",
        ]  # fmt: skip
        log = work / "tritonserver.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                argv,
                env=_environment(venv, site, libdir),
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C at the benchmark reaches it through _stop only
            )
            try:
                http_url = f"http://127.0.0.1:{http_port}"
                triton_version = _wait_ready(proc, http_url, log)
                yield TritonPeer(http_url, f"127.0.0.1:{grpc_port}", triton_version, proc.pid)
            finally:
                _stop(proc)


def stop_on_signals() -> None:
    """SIGTERM and SIGINT (even where a shell left SIGINT ignored) unwind the ``with`` blocks, so
    that no tritonserver outlives the benchmark that started it."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, interrupt)


def main() -> int:
    stop_on_signals()
    try:
        with triton_peer() as peer:
            print(f"Triton {peer.version}: HTTP {peer.http_url}, gRPC {peer.grpc_url}", flush=True)
            print("models: " + ", ".join(m.name for m in MODELS), flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
    except PeerUnavailable as exc:
        print(f"Triton peer unavailable: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
