#!/usr/bin/env python3
"""`make image-test`: start each built image through `buildah run` and check what it promises;
then the CPU image through podman, as the Kubernetes Deployment runs it.

    .venv/bin/python scripts/image_test.py [--only cpu gpu-cuda12 ...] [--sabotage KIND]

Every image, as its own user (the image's USER) with its own CMD and environment; only the
listening address moves (TENSORBITS_HOST=127.0.0.1 and free TENSORBITS_PORT/GRPC_PORT/METRICS_PORT,
as a platform moves the port), since `buildah run` shares this machine's network:
  - it serves: /v2/health/ready answers 200 within READY_TIMEOUT_S;
  - the serving process runs as the image's numeric non-root USER (read from /proc);
  - the image's HEALTHCHECK command passes while it serves, and fails once it has stopped;
  - SIGTERM stops it cleanly;
  - nothing is written outside the writable paths the Kubernetes Deployment declares (its
    emptyDir mounts; the root filesystem is read-only there): the container's root filesystem
    is compared before and after;
  - no dev tools in the environment (pytest, mypy, ruff, hypothesis, tritonclient).
The CPU image is driven by the stock tritonclient.http (every operator) and the SDK (every family,
a /v1 batch): tests/deploy/image/, run by pytest against the container. The GPU images, here
without a device (scripts/gpu_probe.py): CuPy imports and loads NVRTC from the virtual
environment, NVRTC compiles the service's kernels, TENSORBITS_BACKEND=auto falls back to NumPy with the reason in the log (and then serves
and is driven like the CPU image), TENSORBITS_BACKEND=cupy exits non-zero with a message naming
the setting, and the kernel cache (CUPY_CACHE_DIR) is writable by the image's user.

Then, where podman is installed, the CPU image once more as an orchestrator runs it (podman,
runc, the same containers/storage as buildah's, so nothing is exported): the Deployment's
container (docker/k8s/base/deployment.yaml) as far as one machine can play it. A read-only root
filesystem with tmpfs on exactly its writable paths, the image's USER, no capabilities, no
privilege escalation, the Deployment's env (the ports moved) and its API-key Secret mounted
read-only. Kubernetes' order: the startup probe until it passes, then the liveness and readiness
probes, each as the kubelet sends it (httpGet, grpc: the gRPC health service, exec: `podman exec`);
the image's HEALTHCHECK through `podman exec`; keyed inferences over HTTP (tritonclient.http) and
gRPC (tritonclient.grpc), a keyless one refused; the metrics port without a key; the preStop
hook (`podman exec`) while it still serves; then `podman stop` (SIGTERM to PID 1, SIGKILL after
terminationGracePeriodSeconds): exit 0 within the grace period, the drain in the log. Without
podman this stage says "podman: not installed, skipped" and the run does not fail for it.

--sabotage shows that the checks can fail: `root` runs the server as root, `no-serve` replaces
the CMD with one that never listens, `healthcheck` points the health check at a port nobody
serves, `write` writes a file under /opt while the server runs; under podman, `podman-writable`
leaves the root filesystem writable and `podman-kill` stops with no grace period (SIGKILL at
once). Each must end in FAILED; --self-check (in `make image-test`) runs them all on the CPU
image after the real checks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpc
import images  # scripts/images.py: the image table and buildah's settings
import yaml  # type: ignore[import-untyped]
from grpc_health.v1 import health_pb2, health_pb2_grpc

REPO = images.REPO
READY_TIMEOUT_S = float(os.environ.get("TENSORBITS_IMAGE_READY_TIMEOUT", "90"))
STOP_TIMEOUT_S = 20.0
DEPLOYMENT = REPO / "docker" / "k8s" / "base" / "deployment.yaml"
# Never in an image: the dev group's tools, and tritonclient (the tests' client, not the server's).
DEV_TOOLS = ("pytest", "mypy", "ruff", "hypothesis", "tritonclient", "schemathesis", "hadolint")
# Folders whose own entry `buildah run` itself touches on every run (it makes and removes its
# /run/.containerenv mount point there): their time may move; what is inside is still checked.
RUNTIME_TOUCHED = ("/run",)
# Each sabotage and the words its failure must carry (--self-check runs them all).
SABOTAGE_FAILURES = {
    "root": "the server runs as root",
    "no-serve": "/v2/health/ready not 200 within",
    "healthcheck": "HEALTHCHECK failed while serving",
    "write": "wrote outside",
    "podman-writable": "podman: the root filesystem is writable",
    "podman-kill": "no drain in the log",
}
# Those of the podman stage (skipped, with the stage, where podman is not installed).
PODMAN_SABOTAGES = ("podman-writable", "podman-kill")
SABOTAGES = tuple(SABOTAGE_FAILURES)


class Failed(Exception):
    """A check failed: the message names the image, the check and what was seen."""


# ---- pure checks (tests/deploy/test_image_checks.py runs them on made-up input) --------------------


def declared_writable_paths(deployment: Mapping[str, Any]) -> tuple[str, ...]:
    """The paths the Deployment lets the server write: its container's emptyDir mounts, when the
    root filesystem is read-only (otherwise the assumption under test does not hold: error)."""
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    if not container.get("securityContext", {}).get("readOnlyRootFilesystem"):
        raise Failed(f"{DEPLOYMENT.name}: the container's root filesystem is not read-only")
    empty_dirs = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
    return tuple(
        sorted(
            m["mountPath"]
            for m in container.get("volumeMounts", [])
            if m["name"] in empty_dirs and not m.get("readOnly")
        )
    )


def user_problem(config_user: str, process_uid: int | None) -> str | None:
    """The image's USER must be numeric and not root, and the server must run as it."""
    uid, _, _gid = config_user.partition(":")
    if not uid.isdigit():
        return f"USER {config_user!r} is not numeric (runAsNonRoot cannot verify it)"
    if int(uid) == 0:
        return "USER is root"
    if process_uid is None:
        return "the serving process was not found"
    if process_uid == 0:
        return "the server runs as root (uid 0)"
    if process_uid != int(uid):
        return f"the server runs as uid {process_uid}, the image's USER is {config_user}"
    return None


Snapshot = dict[str, tuple[int, int, int]]  # path -> (mode, size, mtime_ns)


def snapshot(root: Path, skip: Sequence[str] = ("/proc", "/sys", "/dev")) -> Snapshot:
    """Every file, folder and link under ``root`` (a container's root filesystem)."""
    found: Snapshot = {}
    for folder, subfolders, files in os.walk(root):
        here = "/" + Path(folder).relative_to(root).as_posix().lstrip(".")
        here = here.rstrip("/") or "/"
        subfolders[:] = [name for name in subfolders if str(PurePosixPath(here) / name) not in skip]
        for name in [*subfolders, *files, ""]:
            path = folder if not name else os.path.join(folder, name)
            with contextlib.suppress(FileNotFoundError):
                info = os.lstat(path)
                key = here if not name else str(PurePosixPath(here) / name)
                found[key] = (info.st_mode, info.st_size, info.st_mtime_ns)
    return found


def within(path: str, folders: Sequence[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def writes_outside(
    before: Snapshot,
    after: Snapshot,
    writable: Sequence[str],
    touched: Sequence[str] = RUNTIME_TOUCHED,
) -> list[str]:
    """Paths created, changed or removed between the two snapshots outside ``writable``. A
    writable path's own entry (the mount point) may change, and so may the entries (not the
    contents) of the folders in ``touched``."""
    changed = [
        path for path in sorted(before.keys() | after.keys()) if before.get(path) != after.get(path)
    ]
    return [path for path in changed if not within(path, writable) and path not in touched]


def dev_tools_in(site_packages: Sequence[str]) -> list[str]:
    """The dev tools among the names in a site-packages folder (module folders, dist-infos)."""
    found = set()
    for name in site_packages:
        project = name.split("-")[0].lower() if name.endswith(".dist-info") else name.lower()
        if project in DEV_TOOLS or project.startswith(("_pytest", "mypy")):
            found.add(project)
    return sorted(found)


def stop_problem(returncode: int, log: str) -> str | None:
    """After SIGTERM: uvicorn's shutdown ran to its end, and the process exited 0 or by the
    signal it re-raises (which `buildah run` reports as "exited on terminated", exit 1)."""
    if "Finished server process" not in log:
        return f"exit {returncode} without uvicorn's clean shutdown"
    by_sigterm = "subprocess exited on terminated" in log
    if returncode == 0 or (returncode == 1 and by_sigterm):
        return None
    return f"exit {returncode} after the shutdown"


def fallback_problem(log: str) -> str | None:
    """TENSORBITS_BACKEND=auto on a machine without a GPU: NumPy, and the reason, in the log."""
    for line in log.splitlines():
        if "backend selected: numpy" in line and "auto: fell back to numpy (" in line:
            return None
    return "the log does not say that auto fell back to numpy, and why"


def cupy_refusal_problem(returncode: int | None, log: str) -> str | None:
    """TENSORBITS_BACKEND=cupy without a GPU: a non-zero exit and a message naming the setting."""
    if returncode is None:
        return "TENSORBITS_BACKEND=cupy kept running without a GPU"
    if returncode == 0:
        return "TENSORBITS_BACKEND=cupy exited 0 without a GPU"
    if "TENSORBITS_BACKEND=cupy" not in log or "TENSORBITS_BACKEND=auto" not in log:
        return "TENSORBITS_BACKEND=cupy failed without saying why and what to do"
    return None


# ---- buildah run -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Container:
    """A working container of an image: its root filesystem, its config, `buildah run` in it."""

    image: images.Image
    name: str = ""
    root: Path = Path()
    config: dict[str, Any] = field(default_factory=dict)

    def __enter__(self) -> Container:
        self.name = images.buildah("from", "--pull-never", self.image.ref).stdout.strip()
        self.root = Path(images.buildah("mount", self.name).stdout.strip())
        self.config = images.inspect_image(self.image.ref)["Docker"]["config"]
        return self

    def __exit__(self, *exc: object) -> None:
        images.buildah("umount", self.name, check=False)
        images.buildah("rm", self.name, check=False)

    @property
    def user(self) -> str:
        return str(self.config.get("User") or "")

    def command(self, argv: Sequence[str], env: Mapping[str, str], user: str | None) -> list[str]:
        args = ["run", "--isolation", "chroot", "--network", "host", "--user", user or self.user]
        for key, value in env.items():
            args += ["--env", f"{key}={value}"]
        return images.buildah_command(*args, self.name, "--", *argv)

    def run(
        self, argv: Sequence[str], env: Mapping[str, str] = {}, user: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(argv, env, user),
            env=images.buildah_env(),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    log_path: Path
    port: int
    metrics_port: int = 0

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def serving_uid(self) -> int | None:
        """The uid of the process that serves: the `tensorbits` process among buildah's
        descendants (found through /proc; `buildah run --isolation chroot` forks it here)."""
        for pid in serving_pids(self.process.pid):
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("Uid:"):
                        return int(line.split()[2])  # the effective uid
        return None


def serving_pids(pid: int) -> list[int]:
    """The descendants of ``pid`` that run the `tensorbits` program (its console script, as the
    program or as the script python runs), not buildah's helpers (whose paths may say so too)."""
    found = []
    for child in descendants(pid):
        with contextlib.suppress(OSError):
            argv = [
                Path(os.fsdecode(a)).name
                for a in Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            ]
            if argv[0] == "tensorbits" or (
                argv[0].startswith("python") and argv[1:2] == ["tensorbits"]
            ):
                found.append(child)
    return found


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def listen_env(port: int, metrics_port: int | None = None) -> dict[str, str]:
    return {
        "TENSORBITS_HOST": "127.0.0.1",
        "TENSORBITS_PORT": str(port),
        "TENSORBITS_GRPC_PORT": str(free_port()),
        # The image's 8002 may be taken here.
        "TENSORBITS_METRICS_PORT": str(metrics_port or free_port()),
    }


@contextlib.contextmanager
def started(
    container: Container,
    workdir: Path,
    env: Mapping[str, str] = {},
    argv: Sequence[str] | None = None,
    user: str | None = None,
) -> Iterator[Server]:
    port, metrics_port = free_port(), free_port()
    log_path = workdir / f"{container.image.name}-{port}.log"
    listen = listen_env(port, metrics_port)
    command = container.command(argv or container.config["Cmd"], {**listen, **env}, user)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, env=images.buildah_env(), stdout=log, stderr=subprocess.STDOUT
        )
    server = Server(process, log_path, port, metrics_port)
    try:
        yield server
    finally:
        stop(server)


def stop(server: Server) -> int:
    """SIGTERM to the serving process (as `docker stop` sends it to PID 1), then wait."""
    if server.process.poll() is None:
        targets = serving_pids(server.process.pid) or [server.process.pid]
        for pid in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        try:
            server.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
    return server.process.returncode


def wait_ready(server: Server, timeout: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise Failed(f"exited with {server.process.returncode} before serving:\n{tail(server)}")
        try:
            with opener.open(f"http://{server.url}/v2/health/ready", timeout=2) as response:
                if response.status == 200:
                    return
                last = str(response.status)
        except urllib.error.HTTPError as exc:
            last = str(exc.code)
        except OSError as exc:
            last = repr(exc)
        time.sleep(0.3)
    raise Failed(f"/v2/health/ready not 200 within {timeout:.0f} s ({last}):\n{tail(server)}")


def tail(server: Server, lines: int = 15) -> str:
    return "\n".join("    " + line for line in server.log().splitlines()[-lines:])


# ---- the checks, per image -------------------------------------------------------------------------


def say(image: images.Image, message: str) -> None:
    print(f"image-test {image.name}: {message}", flush=True)


def healthcheck_argv(container: Container) -> list[str]:
    test = (container.config.get("Healthcheck") or {}).get("Test") or []
    if not test or test[0] != "CMD":
        raise Failed(f"no exec-form HEALTHCHECK in the image (Test={test})")
    return list(test[1:])


def check_site_packages(container: Container) -> None:
    found = list(container.root.glob("opt/venv/lib/python3*/site-packages"))
    if len(found) != 1:
        raise Failed(f"expected one /opt/venv site-packages, found {found}")
    names = [p.name for p in found[0].iterdir()]
    if tools := dev_tools_in(names):
        raise Failed(f"dev tools in the image: {', '.join(tools)}")
    has_cupy = any(n.startswith("cupy") for n in names)
    if has_cupy != container.image.gpu:
        raise Failed(f"CuPy {'missing from' if container.image.gpu else 'in'} the image")
    say(container.image, f"no dev tools in site-packages ({len(names)} entries); CuPy: {has_cupy}")


def check_metrics_port(metrics_port: int) -> None:
    """The image's metrics port (TENSORBITS_METRICS_PORT, moved to a free one) serves the
    Prometheus text without an API key."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        with opener.open(url, timeout=10) as response:
            body = response.read()
    except OSError as exc:
        raise Failed(f"{url}: {exc!r}") from exc
    if b"tensorbits_" not in body:
        raise Failed(f"{url} answered without tensorbits' metrics: {body[:200]!r}")


def drive(image: images.Image, server: Server) -> None:
    """tests/deploy/image/ against the server: tritonclient.http and the SDK."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/deploy/image"],
        cwd=REPO,
        env={**os.environ, "TENSORBITS_IMAGE_URL": server.url},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    if result.returncode != 0:
        raise Failed(f"driving it failed:\n{result.stdout[-4000:]}{result.stderr[-2000:]}")
    say(image, f"tritonclient + SDK: {summary}")


def serve_and_check(
    container: Container,
    workdir: Path,
    writable: Sequence[str],
    env: Mapping[str, str] = {},
    sabotage: str | None = None,
) -> Server:
    """Start it, check user, health check, the drive, a clean stop and the writes."""
    image = container.image
    container.run(["true"])  # buildah's own mount points, made once, are the baseline's
    before = snapshot(container.root)
    argv = ["sleep", "600"] if sabotage == "no-serve" else None
    user = "0:0" if sabotage == "root" else None
    timeout = 20.0 if sabotage == "no-serve" else READY_TIMEOUT_S
    with started(container, workdir, env, argv, user) as server:
        wait_ready(server, timeout)
        say(image, f"serves on {server.url} (log: {server.log_path})")
        if problem := user_problem(container.user, server.serving_uid()):
            raise Failed(problem)
        say(image, f"runs as uid {server.serving_uid()} (USER {container.user})")
        health_env = {**listen_env(server.port), **env}
        if sabotage == "healthcheck":
            health_env["TENSORBITS_PORT"] = str(free_port())
        check = container.run(healthcheck_argv(container), health_env)
        if check.returncode != 0:
            raise Failed(f"HEALTHCHECK failed while serving: {check.stderr.strip()[-400:]}")
        say(image, f"HEALTHCHECK {healthcheck_argv(container)} passes")
        check_metrics_port(server.metrics_port)
        say(image, f"GET /metrics on the metrics port ({server.metrics_port}) answers, no key")
        if sabotage == "write":
            container.run(["sh", "-c", "echo x > /opt/venv/sabotage"], user="0:0")
        drive(image, server)
        code = stop(server)
    if problem := stop_problem(code, server.log()):
        raise Failed(f"SIGTERM: {problem}:\n{tail(server)}")
    say(image, f"SIGTERM: stopped cleanly (exit {code})")
    check = container.run(healthcheck_argv(container), listen_env(server.port))
    if check.returncode == 0:
        raise Failed("HEALTHCHECK passes with the server stopped")
    say(image, "HEALTHCHECK fails once it has stopped (as it must)")
    if outside := writes_outside(before, snapshot(container.root), writable):
        raise Failed(f"wrote outside {', '.join(writable)}: {', '.join(outside[:10])}")
    say(image, f"wrote nothing outside {', '.join(writable)}")
    return server


GPU_PROBE = Path(__file__).with_name("gpu_probe.py")  # run inside the image: python -c


def check_gpu_image(container: Container, workdir: Path, writable: Sequence[str]) -> None:
    image = container.image
    probe = container.run(["python", "-c", GPU_PROBE.read_text()])
    if probe.returncode != 0:
        raise Failed(f"CuPy/NVRTC/cache probe failed:\n{probe.stdout}{probe.stderr[-3000:]}")
    for line in probe.stdout.strip().splitlines():
        say(image, line)
    with started(container, workdir, {"TENSORBITS_BACKEND": "cupy"}) as server:
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.process.wait(timeout=READY_TIMEOUT_S)
        if problem := cupy_refusal_problem(server.process.poll(), server.log()):
            raise Failed(f"{problem}:\n{tail(server)}")
    refusal = [line for line in server.log().splitlines() if "TENSORBITS_BACKEND=cupy" in line]
    say(
        image,
        f"TENSORBITS_BACKEND=cupy refuses (exit {server.process.returncode}): {refusal[-1][:160]}",
    )
    server = serve_and_check(container, workdir, writable, {"TENSORBITS_BACKEND": "auto"})
    if problem := fallback_problem(server.log()):
        raise Failed(problem)
    reason = [line for line in server.log().splitlines() if "fell back" in line]
    say(image, f"TENSORBITS_BACKEND=auto: {reason[0][:200]}")


# ---- podman: the CPU image as an orchestrator runs it ----------------------------------------------

# The Deployment's port names and the settings that move them to free ports here.
PORT_SETTINGS = {
    "http": "TENSORBITS_PORT",
    "grpc": "TENSORBITS_GRPC_PORT",
    "metrics": "TENSORBITS_METRICS_PORT",
}
# The Deployment's env the CPU image does not take here: the backend (the Deployment runs the GPU
# image; the CPU image keeps its NumPy) and the address (host network: loopback, not every
# interface of this machine).
NOT_TAKEN = ("TENSORBITS_BACKEND", "TENSORBITS_HOST")
PROBE_KINDS = ("startupProbe", "livenessProbe", "readinessProbe")
# What the server logs when SIGTERM reaches it (serving.py's draining_server): a drain, not a kill.
DRAIN_LOGGED = "draining: not ready from now on"
# podman asks runc for its own defaults (open files, processes), which a root without
# CAP_SYS_RESOURCE cannot grant: the container gets this process's open-file limit and a process
# (thread) limit that one server never nears.
NPROC_LIMIT = 4096
INFERENCES = 16  # a protocol, keyed; each checked against NumPy


@dataclass(frozen=True)
class Probe:
    """One of the Deployment's probes as the kubelet sends it: ``kind`` httpGet, grpc or exec;
    ``port`` the container port's name; ``target`` the path, the gRPC service or the command."""

    name: str
    kind: str
    port: str
    target: tuple[str, ...]
    period_s: float
    timeout_s: float
    failure_threshold: int


def deployment_container(deployment: Mapping[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


def port_name(container: Mapping[str, Any], port: int | str) -> str:
    """A probe's port (a name, or a number: a `grpc:` probe takes only numbers) as the name of
    the container port, one of PORT_SETTINGS (the ports this test moves)."""
    for entry in container.get("ports", []):
        if (
            port in (entry.get("name"), entry["containerPort"])
            and entry.get("name") in PORT_SETTINGS
        ):
            return str(entry["name"])
    raise Failed(f"{DEPLOYMENT.name}: probe port {port!r} is not one of the container's ports")


def declared_probes(deployment: Mapping[str, Any]) -> list[Probe]:
    """The container's probes, startup first (Kubernetes runs the others once it has passed)."""
    container = deployment_container(deployment)
    found = []
    for name in PROBE_KINDS:
        if (spec := container.get(name)) is None:
            continue
        timing = (
            float(spec.get("periodSeconds", 10)),
            float(spec.get("timeoutSeconds", 1)),
            int(spec.get("failureThreshold", 3)),
        )
        if get := spec.get("httpGet"):
            if get.get("scheme", "HTTP") != "HTTP":
                raise Failed(f"{DEPLOYMENT.name}: {name} over {get['scheme']}: not played here")
            port = port_name(container, get["port"])
            found.append(Probe(name, "httpGet", port, (get.get("path", "/"),), *timing))
        elif grpc_probe := spec.get("grpc"):
            port = port_name(container, grpc_probe["port"])
            found.append(Probe(name, "grpc", port, (grpc_probe.get("service", ""),), *timing))
        elif command := spec.get("exec", {}).get("command"):
            found.append(Probe(name, "exec", "", tuple(command), *timing))
        else:
            raise Failed(f"{DEPLOYMENT.name}: {name} is neither httpGet, grpc nor exec")
    if not found:
        raise Failed(f"{DEPLOYMENT.name}: the container declares no probe")
    return found


def orchestrated_env(deployment: Mapping[str, Any], ports: Mapping[str, int]) -> dict[str, str]:
    """The container's env as the Deployment gives it, with the ports moved to ``ports`` (by
    port name) and without what the CPU image does not take here (NOT_TAKEN)."""
    env: dict[str, str] = {}
    for entry in deployment_container(deployment).get("env", []):
        if "value" not in entry:
            raise Failed(f"{DEPLOYMENT.name}: env {entry['name']} is not a literal value")
        if entry["name"] not in NOT_TAKEN:
            env[entry["name"]] = str(entry["value"])
    env["TENSORBITS_HOST"] = "127.0.0.1"
    for name, setting in PORT_SETTINGS.items():
        env[setting] = str(ports[name])
    return env


def secret_mounts(deployment: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """The container's Secret volumes: mount path -> the files in it (the items' paths). Each
    must be mounted read-only."""
    pod = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v["secret"] for v in pod.get("volumes", []) if "secret" in v}
    mounts: dict[str, tuple[str, ...]] = {}
    for mount in deployment_container(deployment).get("volumeMounts", []):
        if (secret := volumes.get(mount["name"])) is None:
            continue
        if not mount.get("readOnly"):
            raise Failed(f"{DEPLOYMENT.name}: the Secret {mount['name']} is mounted writable")
        mounts[mount["mountPath"]] = tuple(item["path"] for item in secret.get("items", []))
    return mounts


def grace_period_s(deployment: Mapping[str, Any]) -> float:
    return float(deployment["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30))


def pre_stop_command(deployment: Mapping[str, Any]) -> list[str] | None:
    hook = deployment_container(deployment).get("lifecycle", {}).get("preStop", {})
    command = hook.get("exec", {}).get("command")
    return list(command) if command else None


def podman_run_args(
    name: str,
    ref: str,
    user: str,
    writable: Sequence[str],
    env: Mapping[str, str],
    binds: Mapping[str, str],
    grace_s: float,
    nofile: tuple[int, int],
    read_only: bool = True,
) -> list[str]:
    """`podman run` for the Deployment's container: read-only root filesystem and tmpfs on the
    writable paths alone, the image's user, every capability dropped, no privilege escalation,
    the Secret's folders bound read-only (``binds``: here -> there), host network."""
    args = [
        "run", "--detach", "--name", name, "--network", "host", f"--read-only={read_only}".lower(),
        "--read-only-tmpfs=false", "--user", user, "--cap-drop", "all",
        "--security-opt", "no-new-privileges", "--stop-timeout", f"{grace_s:.0f}",
        "--ulimit", f"nofile={nofile[0]}:{nofile[1]}",
        "--ulimit", f"nproc={NPROC_LIMIT}:{NPROC_LIMIT}",
        # podman's own health-check timer needs systemd; the check runs the command itself.
        "--no-healthcheck",
    ]  # fmt: skip
    for path in writable:
        args += ["--tmpfs", path]
    for here, there in binds.items():
        args += ["--volume", f"{here}:{there}:ro"]
    for key, value in env.items():
        args += ["--env", f"{key}={value}"]
    return [*args, ref]


def podman_stop_problem(returncode: int, log: str, elapsed_s: float, grace_s: float) -> str | None:
    """After `podman stop`: within the grace period (else SIGKILL ended it), the drain and
    uvicorn's clean shutdown in the log, exit 0."""
    if elapsed_s >= grace_s:
        return f"stopped after {elapsed_s:.1f} s, not within the grace period ({grace_s:g} s)"
    if DRAIN_LOGGED not in log:
        return f"exit {returncode}: no drain in the log ({DRAIN_LOGGED!r})"
    if "Finished server process" not in log:
        return f"exit {returncode} without uvicorn's clean shutdown"
    if returncode != 0:
        return f"exit {returncode} after the shutdown"
    return None


def runc() -> str | None:
    """Debian's runc (in /usr/sbin, which a non-root PATH may lack); None: podman's default."""
    found = shutil.which("runc") or "/usr/sbin/runc"
    return found if os.access(found, os.X_OK) else None


def podman_command(*args: str) -> list[str]:
    """podman on buildah's own storage (scripts/images.py: the same vfs root and runroot, so the
    image is there as buildah built it), with runc and cgroupfs (no systemd here)."""
    return [
        "podman", "--storage-driver", "vfs", "--root", str(images.CACHE / "storage"),
        "--runroot", str(images.CACHE / "run"), "--cgroup-manager", "cgroupfs",
        *(["--runtime", runtime] if (runtime := runc()) else []), *args,
    ]  # fmt: skip


def podman(
    *args: str, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        podman_command(*args),
        env=images.buildah_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and result.returncode != 0:
        raise Failed(
            f"podman {' '.join(args[:2])}: exit {result.returncode}: {result.stderr[-800:]}"
        )
    return result


def grpc_health_status(port: int, service: str, timeout: float) -> str:
    """What the gRPC health service says for ``service``, as the kubelet's `grpc:` probe asks."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        request = health_pb2.HealthCheckRequest(service=service)
        try:
            stub: Any = health_pb2_grpc.HealthStub(channel)  # grpcio's stubs are untyped
            reply = stub.Check(request, timeout=timeout)
        except grpc.RpcError as exc:
            return str(exc.code().name)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def probe_problem(probe: Probe, ports: Mapping[str, int], name: str) -> str | None:
    """None when ``probe`` passes against the container ``name``, else what it saw."""
    timeout = max(probe.timeout_s, 1.0)
    if probe.kind == "httpGet":
        url = f"http://127.0.0.1:{ports[probe.port]}{probe.target[0]}"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(url, timeout=timeout) as response:
                status = response.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        except OSError as exc:
            return f"{url}: {exc!r}"
        return None if 200 <= status < 400 else f"{url}: {status}"
    if probe.kind == "grpc":
        status = grpc_health_status(ports[probe.port], probe.target[0], timeout)
        return None if status == "SERVING" else f"gRPC health {probe.target[0]!r}: {status}"
    result = podman("exec", name, *probe.target, timeout=timeout + 10, check=False)
    return None if result.returncode == 0 else f"exit {result.returncode}: {result.stderr[-300:]}"


def podman_probe(probe: Probe, ports: Mapping[str, int], name: str) -> None:
    if problem := probe_problem(probe, ports, name):
        raise Failed(f"{probe.name} ({probe.kind}) failed while serving: {problem}")


def wait_started(probe: Probe, ports: Mapping[str, int], name: str) -> float:
    """The startup probe until it passes (polled faster than its period, within the time the
    Deployment allows it); the seconds it took."""
    started_at = time.monotonic()
    allowed = min(probe.period_s * probe.failure_threshold, READY_TIMEOUT_S)
    problem: str | None = "not asked"
    while time.monotonic() - started_at < allowed:
        if (problem := probe_problem(probe, ports, name)) is None:
            return time.monotonic() - started_at
        state = podman("inspect", "--format", "{{.State.Status}}", name, check=False)
        if state.stdout.strip() not in ("running", "created", "configured"):
            log = podman("logs", name, check=False)
            raise Failed(f"exited before serving ({state.stdout.strip()}):\n{log.stderr[-2000:]}")
        time.sleep(0.3)
    raise Failed(f"{probe.name} ({probe.kind}) not passing within {allowed:.0f} s: {problem}")


def infer_both(ports: Mapping[str, int], key: str, count: int = INFERENCES) -> None:
    """Keyed inferences over HTTP (tritonclient.http, bit NOT) and gRPC (tritonclient.grpc, bit
    XOR), each checked against NumPy; the same without a key refused (401, UNAUTHENTICATED)."""
    import numpy as np
    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http
    from tritonclient.utils import InferenceServerException

    rng = np.random.default_rng(7)
    bearer = f"Bearer {key}"
    http = triton_http.InferenceServerClient(f"127.0.0.1:{ports['http']}", network_timeout=30)
    rpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{ports['grpc']}")
    try:
        for i in range(count):
            a = rng.integers(0, 256, size=(4, 1 + 97 * i), dtype=np.uint8)
            b = rng.integers(0, 256, size=a.shape, dtype=np.uint8)
            x = triton_http.InferInput("InputTensor", list(a.shape), "UINT8")
            x.set_data_from_numpy(a, binary_data=True)
            got = http.infer(
                "DML_OPERATOR_ELEMENT_WISE_BIT_NOT", [x], headers={"Authorization": bearer}
            )
            if not np.array_equal(got.as_numpy("OutputTensor"), ~a):
                raise Failed(f"HTTP bit NOT of {a.shape}: a wrong answer")
            pair = [
                triton_grpc.InferInput(n, list(a.shape), "UINT8") for n in ("ATensor", "BTensor")
            ]
            pair[0].set_data_from_numpy(a)
            pair[1].set_data_from_numpy(b)
            got = rpc.infer(
                "DML_OPERATOR_ELEMENT_WISE_BIT_XOR", pair, headers={"authorization": bearer}
            )
            if not np.array_equal(got.as_numpy("OutputTensor"), a ^ b):
                raise Failed(f"gRPC bit XOR of {a.shape}: a wrong answer")
        for protocol in ("HTTP", "gRPC"):
            try:
                if protocol == "HTTP":
                    http.infer("DML_OPERATOR_ELEMENT_WISE_BIT_NOT", [x])
                else:
                    rpc.infer("DML_OPERATOR_ELEMENT_WISE_BIT_XOR", pair)
            except InferenceServerException as exc:
                if str(exc.status()) not in ("401", "StatusCode.UNAUTHENTICATED"):
                    raise Failed(f"{protocol} without a key: {exc.status()}, not refused") from exc
            else:
                raise Failed(f"{protocol} answered without an API key")
    finally:
        http.close()
        rpc.close()


def check_podman_writes(name: str, user: str, writable: Sequence[str]) -> None:
    """Root cannot write outside the tmpfs mounts (a read-only root filesystem, not permissions:
    root owns the image's files), the image's user can write in them."""
    outside = podman("exec", "--user", "0:0", name, "touch", "/opt/.image-test", check=False)
    if outside.returncode == 0 or "Read-only file system" not in outside.stderr:
        raise Failed(f"podman: the root filesystem is writable (touch /opt: {outside.stderr!r})")
    for path in writable:
        inside = podman("exec", name, "touch", f"{path}/.image-test", check=False)
        if inside.returncode != 0:
            raise Failed(f"podman: {path} is not writable by {user}: {inside.stderr.strip()}")


def drain_message(log: str) -> str:
    """The drain's line of the server's JSON log, its message alone."""
    for line in log.splitlines():
        if DRAIN_LOGGED in line:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                return str(json.loads(line)["message"])
            return line.strip()
    return ""


def podman_check(container: Container, workdir: Path, sabotage: str | None = None) -> None:
    """The CPU image under podman as the Deployment's container (the module's docstring)."""
    image = container.image
    if not shutil.which("podman"):
        say(image, "podman: not installed, skipped")
        return
    started_at = time.monotonic()
    deployment = images_yaml(DEPLOYMENT)
    writable = declared_writable_paths(deployment)
    probes = declared_probes(deployment)
    grace = grace_period_s(deployment)
    ports = {name: free_port() for name in PORT_SETTINGS}
    env = orchestrated_env(deployment, ports)
    key = secrets.token_urlsafe(32)
    binds: dict[str, str] = {}
    secrets_here = Path(tempfile.mkdtemp(dir=workdir, prefix="secrets."))  # one run's own
    for number, (there, files) in enumerate(secret_mounts(deployment).items()):
        here = secrets_here / str(number)
        here.mkdir()
        # Readable by the image's user, as the Secret's 0440 and the pod's fsGroup make it there.
        here.chmod(0o755)
        for item in files:
            (here / item).write_text(key + "\n")
            (here / item).chmod(0o444)
        binds[str(here)] = there
    name = f"tensorbits-image-test-{ports['http']}"
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    run_args = podman_run_args(
        name,
        image.ref,
        container.user,
        writable,
        env,
        binds,
        grace,
        nofile,
        read_only=sabotage != "podman-writable",
    )
    podman(*run_args)
    try:
        took = wait_started(probes[0], ports, name)
        say(
            image,
            f"podman: read-only root, tmpfs {', '.join(writable)}, --user {container.user}, "
            f"no capabilities, the Deployment's env and Secret; {probes[0].name} "
            f"({probes[0].kind} {ports[probes[0].port]} {probes[0].target[0]}) passed in {took:.1f} s",
        )
        for probe in probes[1:]:
            podman_probe(probe, ports, name)
        say(
            image,
            "podman: "
            + ", ".join(f"{p.name} ({p.kind} {' '.join(p.target)})" for p in probes)
            + " pass",
        )
        pid = int(podman("inspect", "--format", "{{.State.Pid}}", name).stdout)
        uid = None
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("Uid:"):
                    uid = int(line.split()[2])
        if problem := user_problem(container.user, uid):
            raise Failed(f"podman: {problem}")
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        say(image, f"podman: PID 1 is {b' '.join(argv).decode().strip()!r}, uid {uid}")
        check_podman_writes(name, container.user, writable)
        say(
            image,
            f"podman: root cannot write under /opt; {container.user} can in {', '.join(writable)}",
        )
        check = podman("exec", name, *healthcheck_argv(container), check=False)
        if check.returncode != 0:
            raise Failed(f"podman: HEALTHCHECK failed while serving: {check.stderr.strip()[-400:]}")
        say(image, f"podman: HEALTHCHECK {healthcheck_argv(container)} passes (podman exec)")
        infer_started = time.monotonic()
        infer_both(ports, key)
        say(
            image,
            f"podman: {INFERENCES} HTTP + {INFERENCES} gRPC keyed inferences right "
            f"({time.monotonic() - infer_started:.1f} s), keyless ones refused",
        )
        check_metrics_port(ports["metrics"])
        say(image, f"podman: GET /metrics on the metrics port ({ports['metrics']}) answers, no key")
        if hook := pre_stop_command(deployment):
            # The kubelet runs the hook, then sends SIGTERM: the pod serves through it.
            hook_started = time.monotonic()
            running = subprocess.Popen(
                podman_command("exec", name, *hook),
                env=images.buildah_env(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            time.sleep(0.5)
            for probe in probes[1:]:
                podman_probe(probe, ports, name)
            infer_both(ports, key, count=2)
            _, hook_err = running.communicate(timeout=grace)
            if running.returncode != 0:
                raise Failed(
                    f"podman: preStop {hook} exit {running.returncode}: {hook_err[-300:]!r}"
                )
            say(
                image,
                f"podman: preStop {hook} (podman exec) ran {time.monotonic() - hook_started:.1f} s, "
                "probes and inferences served through it",
            )
        stop_started = time.monotonic()
        stop_time = 0 if sabotage == "podman-kill" else grace
        podman("stop", "--time", f"{stop_time:.0f}", name, timeout=grace + 30)
        elapsed = time.monotonic() - stop_started
        code = int(podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout)
        logs = podman("logs", name, check=False)
        log = logs.stdout + logs.stderr
        (workdir / f"{name}.log").write_text(log)
        if problem := podman_stop_problem(code, log, elapsed, grace):
            tail_lines = "\n".join("    " + line for line in log.splitlines()[-15:])
            raise Failed(f"podman stop (SIGTERM): {problem}:\n{tail_lines}")
        say(
            image,
            f"podman stop (SIGTERM): exit {code} in {elapsed:.1f} s (grace {grace:g} s), logged: "
            f"{drain_message(log)!r}",
        )
    finally:
        podman("rm", "--force", "--time", "0", name, check=False)
    say(image, f"podman: passed ({time.monotonic() - started_at:.0f} s)")


def test_image(image: images.Image, workdir: Path, sabotage: str | None) -> None:
    if not images.image_exists(image.ref):
        raise Failed(f"{image.ref} is not built (make images)")
    writable = declared_writable_paths(images_yaml(DEPLOYMENT))
    with Container(image) as container:
        check_site_packages(container)
        if image.gpu:
            check_gpu_image(container, workdir, writable)
        else:
            if sabotage not in PODMAN_SABOTAGES:
                serve_and_check(container, workdir, writable, sabotage=sabotage)
            if sabotage is None or sabotage in PODMAN_SABOTAGES:
                podman_check(container, workdir, sabotage)


def images_yaml(path: Path) -> dict[str, Any]:
    (document,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return dict(document)


def self_check(workdir: Path) -> int:
    """The checks fail when they should: every sabotage of the CPU image must end in its own
    failure. Returns the number of sabotages that went unnoticed."""
    cpu = images.selected(["cpu"])[0]
    missed = 0
    for sabotage, expected in SABOTAGE_FAILURES.items():
        if sabotage in PODMAN_SABOTAGES and not shutil.which("podman"):
            print(f"image-test self-check {sabotage}: podman: not installed, skipped", flush=True)
            continue
        try:
            test_image(cpu, workdir, sabotage)
        except (Failed, images.Failed, subprocess.TimeoutExpired) as exc:
            first = str(exc).splitlines()[0]
            if expected in first:
                print(f"image-test self-check {sabotage}: caught ({first[:150]})", flush=True)
                continue
            print(f"image-test self-check {sabotage}: MISSED: wrong failure: {first}", flush=True)
        else:
            print(f"image-test self-check {sabotage}: MISSED: the checks passed", flush=True)
        missed += 1
    return missed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=images.IMAGE_NAMES)
    parser.add_argument("--sabotage", choices=SABOTAGES, help="show that one check fails")
    parser.add_argument(
        "--self-check", action="store_true", help="then run every sabotage: each must fail"
    )
    args = parser.parse_args(argv)
    chosen = images.selected(args.only or (["cpu"] if args.sabotage else None))
    failures = 0
    with tempfile.TemporaryDirectory(prefix="image-test.") as scratch:
        for image in chosen:
            started_at = time.monotonic()
            try:
                test_image(image, Path(scratch), args.sabotage)
            except (Failed, images.Failed, subprocess.TimeoutExpired) as exc:
                failures += 1
                print(f"image-test {image.name}: FAILED: {exc}", flush=True)
            else:
                say(image, f"passed ({time.monotonic() - started_at:.0f} s)")
        missed = self_check(Path(scratch)) if args.self_check else 0
    images.report_sizes([image.name for image in chosen])
    verdict = f"{failures} image(s) FAILED" if failures else "all passed"
    if args.self_check:
        verdict += (
            f"; self-check: {missed} sabotage(s) MISSED"
            if missed
            else "; self-check: every sabotage caught"
        )
    print(f"image-test: {verdict}")
    return 1 if failures or missed else 0


if __name__ == "__main__":
    sys.exit(main())
