#!/usr/bin/env python3
"""`make image-test`: start each built image through `buildah run` and check what it promises.

    .venv/bin/python scripts/image_test.py [--only cpu gpu-cuda12 ...] [--sabotage KIND]

Every image, as its own user (the image's USER) with its own CMD and environment; only the
listening address moves (TENSORBITS_HOST=127.0.0.1 and free TENSORBITS_PORT/TENSORBITS_GRPC_PORT,
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

--sabotage shows that the checks can fail: `root` runs the server as root, `no-serve` replaces
the CMD with one that never listens, `healthcheck` points the health check at a port nobody
serves, `write` writes a file under /opt while the server runs. Each must end in FAILED;
--self-check (in `make image-test`) runs them all on the CPU image after the real checks.
"""

from __future__ import annotations

import argparse
import contextlib
import os
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
import images  # scripts/images.py: the image table and buildah's settings
import yaml  # type: ignore[import-untyped]

REPO = images.REPO
READY_TIMEOUT_S = float(os.environ.get("TENSORBITS_IMAGE_READY_TIMEOUT", "90"))
STOP_TIMEOUT_S = 20.0
DEPLOYMENT = REPO / "docker" / "k8s" / "deployment.yaml"
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
}
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


def listen_env(port: int) -> dict[str, str]:
    return {
        "TENSORBITS_HOST": "127.0.0.1",
        "TENSORBITS_PORT": str(port),
        "TENSORBITS_GRPC_PORT": str(free_port()),
    }


@contextlib.contextmanager
def started(
    container: Container,
    workdir: Path,
    env: Mapping[str, str] = {},
    argv: Sequence[str] | None = None,
    user: str | None = None,
) -> Iterator[Server]:
    port = free_port()
    log_path = workdir / f"{container.image.name}-{port}.log"
    command = container.command(argv or container.config["Cmd"], {**listen_env(port), **env}, user)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, env=images.buildah_env(), stdout=log, stderr=subprocess.STDOUT
        )
    server = Server(process, log_path, port)
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


def test_image(image: images.Image, workdir: Path, sabotage: str | None) -> None:
    if not images.image_exists(image.ref):
        raise Failed(f"{image.ref} is not built (make images)")
    writable = declared_writable_paths(images_yaml(DEPLOYMENT))
    with Container(image) as container:
        check_site_packages(container)
        if image.gpu:
            check_gpu_image(container, workdir, writable)
        else:
            serve_and_check(container, workdir, writable, sabotage=sabotage)


def images_yaml(path: Path) -> dict[str, Any]:
    (document,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return dict(document)


def self_check(workdir: Path) -> int:
    """The checks fail when they should: every sabotage of the CPU image must end in its own
    failure. Returns the number of sabotages that went unnoticed."""
    cpu = images.selected(["cpu"])[0]
    missed = 0
    for sabotage, expected in SABOTAGE_FAILURES.items():
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
