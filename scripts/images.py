#!/usr/bin/env python3
"""`make images`: the CPU and GPU images, built by buildah on a machine without a Docker daemon.

    python3 scripts/images.py build [--only cpu gpu-cuda12 ...] [--ca-bundle FILE]
    python3 scripts/images.py rebuild-code-only    # the layer cache measured: one code edit
    python3 scripts/images.py sizes                # each image's size and its largest layers
    python3 scripts/images.py clean [--all]        # forget the images and caches (--all: the base too)
    python3 scripts/images.py lock-gpu             # regenerate docker/gpu/cuda<N>.txt

The Dockerfiles' bases are build arguments whose defaults are the pinned official images. Those
are used when they can be pulled; where no registry can be reached (a build machine that reaches
only PyPI and Debian's archive, say), stand-ins are made here and passed as the build arguments
instead:
  PYTHON_BASE  Debian bookworm (debootstrap --variant=minbase) with Debian's python3 (3.11) and
               ca-certificates: the official base's Debian release and Python minor. The root
               filesystem is cached as a tarball, so it is bootstrapped once per machine.
  UV_IMAGE     the uv the Makefile installs (.tools/bin/uv, UV_VERSION), alone in an image.
The output says which base each build used.

Everything buildah keeps (vfs storage, its layer cache, RUN cache mounts) lives under one folder,
$TENSORBITS_IMAGE_CACHE (default ~/.cache/tensorbits-images), outside the clone: a fresh clone on
the same machine reuses it, and `clean` empties it. A CA bundle for a TLS-intercepting proxy
reaches the builds only when given (--ca-bundle, or SSL_CERT_FILE through the Makefile), as the
build secret `ca-bundle`: mounted for the RUN steps that download, never stored in a layer.

Standard library only: it runs with the system python3, before any virtual environment exists.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
VERSION: str = tomllib.loads((REPO / "service" / "pyproject.toml").read_text())["project"][
    "version"
]
UV_BINARY = REPO / ".tools" / "bin" / "uv"

CACHE = Path(
    os.environ.get("TENSORBITS_IMAGE_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tensorbits-images"
)
BASE_TARBALL = CACHE / "debian-bookworm-python3.tar"  # kept by `clean`; `clean --all` drops it
DEBIAN_MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
PULL_TIMEOUT_S = float(os.environ.get("TENSORBITS_IMAGE_PULL_TIMEOUT", "60"))
# vfs keeps a full copy of the root filesystem per layer, and every code change adds layers (the
# old ones stay as the cache's): past this size a build starts from an emptied cache instead.
CACHE_MAX_BYTES = float(os.environ.get("TENSORBITS_IMAGE_CACHE_MAX_GIB", "40")) * 2**30
# auto: official when it can be pulled, else local; official/local: only that (no fallback).
BASES_MODE = os.environ.get("TENSORBITS_IMAGE_BASES", "auto")

LOCAL_PYTHON_BASE = "localhost/tensorbits-base:bookworm-python3"
LOCAL_UV_IMAGE = "localhost/tensorbits-uv"  # tagged with uv's version
# What the local Python base holds beyond minbase: the interpreter and the CA roots (uv makes
# the virtual environment itself, so neither python3-venv nor pip is needed).
BASE_PACKAGES = ("python3", "ca-certificates")


@dataclass(frozen=True)
class Image:
    """One image `make images` builds: its Dockerfile, build arguments and tags."""

    name: str
    dockerfile: Path
    build_args: dict[str, str] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    gpu: bool = False

    @property
    def ref(self) -> str:
        return self.tags[0]


def _tag(suffix: str) -> str:
    return f"localhost/tensorbits:{VERSION}-{suffix}"


# The images, as data: `make images` builds them in this order, `make image-test` tests them.
IMAGES: tuple[Image, ...] = (
    Image("cpu", DOCKER / "Dockerfile.cpu", {}, (_tag("cpu"),)),
    Image(
        "gpu-cuda12",
        DOCKER / "Dockerfile.gpu",
        {"CUDA_MAJOR": "12"},
        (_tag("gpu-cuda12"), _tag("gpu")),
        gpu=True,
    ),
    Image(
        "gpu-cuda13", DOCKER / "Dockerfile.gpu", {"CUDA_MAJOR": "13"}, (_tag("gpu-cuda13"),), True
    ),
)
IMAGE_NAMES = tuple(image.name for image in IMAGES)

# The GPU variants' CuPy + CUDA wheels: what docker/gpu/cuda<N>.txt is compiled from.
GPU_REQUIREMENTS = DOCKER / "gpu"
CUDA_INPUTS = {
    "12": ("cupy-cuda12x=={cupy}", "cuda-toolkit[cudart,nvrtc]==12.*"),
    "13": ("cupy-cuda13x=={cupy}", "cuda-toolkit[cudart,nvrtc]==13.*"),
}


def log(message: str) -> None:
    print(f"images: {message}", file=sys.stderr, flush=True)


class Failed(Exception):
    """A step failed; the message says which and why."""


# ---- buildah -------------------------------------------------------------------------------------


def buildah_env() -> dict[str, str]:
    # TMPDIR: buildah keeps RUN --mount=type=cache folders under it; keep them in CACHE too.
    (CACHE / "tmp").mkdir(parents=True, exist_ok=True)
    return {**os.environ, "TMPDIR": str(CACHE / "tmp")}


def buildah_command(*args: str) -> list[str]:
    return [
        "buildah",
        "--storage-driver",
        "vfs",
        "--root",
        str(CACHE / "storage"),
        "--runroot",
        str(CACHE / "run"),
        *args,
    ]


def buildah(
    *args: str, check: bool = True, timeout: float | None = None, quiet: bool = True
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        buildah_command(*args),
        env=buildah_env(),
        capture_output=quiet,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and result.returncode != 0:
        raise Failed(f"buildah {' '.join(args)}: exit {result.returncode}: {result.stderr}")
    return result


def ensure_tool(command: str, package: str) -> None:
    """``command`` on PATH, installed from Debian's packages when missing and we are root."""
    if shutil.which(command):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise Failed(f"{command} is missing: install the {package} package (apt-get install)")
    log(f"{command} missing: apt-get install {package}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for step in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", package]):
        subprocess.run(step, env=env, check=True, stdout=subprocess.DEVNULL)


def image_exists(ref: str) -> bool:
    return buildah("inspect", "--type", "image", ref, check=False).returncode == 0


def inspect_image(ref: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(buildah("inspect", "--type", "image", ref).stdout)
    return data


# ---- bases ---------------------------------------------------------------------------------------


def dockerfile_args(path: Path) -> dict[str, str]:
    """The global ``ARG NAME=default`` lines (before the first FROM) of a Dockerfile."""
    args: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.startswith("FROM "):
            break
        if match := re.match(r"ARG\s+(\w+)=(\S+)\s*$", line):
            args[match.group(1)] = match.group(2)
    return args


def try_pull(ref: str) -> str | None:
    """None when ``ref`` is here or was pulled; otherwise why not, in a few words."""
    if image_exists(ref):
        return None
    try:
        result = buildah("pull", "--quiet", ref, check=False, timeout=PULL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"no answer in {PULL_TIMEOUT_S:.0f} s"
    if result.returncode == 0:
        return None
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    return lines[-1][-160:] if lines else f"exit {result.returncode}"


def debootstrap_base() -> None:
    """Debian bookworm, minbase, with BASE_PACKAGES and the security updates, as a tarball."""
    ensure_tool("debootstrap", "debootstrap")
    CACHE.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=CACHE, prefix="rootfs.") as scratch:
        root = Path(scratch) / "rootfs"
        log(f"bootstrapping Debian bookworm from {DEBIAN_MIRROR} (once per machine)")
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                "bookworm",
                str(root),
                DEBIAN_MIRROR,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        security = DEBIAN_MIRROR.replace("/debian", "/debian-security")
        (root / "etc/apt/sources.list").write_text(
            f"deb {DEBIAN_MIRROR} bookworm main\n"
            f"deb {DEBIAN_MIRROR} bookworm-updates main\n"
            f"deb {security} bookworm-security main\n"
        )
        chroot_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive"}
        for step in (
            "apt-get update -qq",
            "apt-get upgrade -y -qq",
            "apt-get clean",
            "rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/*.log",
        ):
            subprocess.run(
                ["chroot", str(root), "sh", "-c", step],
                env=chroot_env,
                check=True,
                stdout=subprocess.DEVNULL,
            )
        partial = BASE_TARBALL.with_suffix(".partial")
        subprocess.run(
            ["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-cf", str(partial), "."],
            check=True,
        )
        partial.replace(BASE_TARBALL)
    log(f"base root filesystem cached: {BASE_TARBALL} ({time.monotonic() - started:.0f} s)")


def local_python_base() -> str:
    if image_exists(LOCAL_PYTHON_BASE):
        return LOCAL_PYTHON_BASE
    if not BASE_TARBALL.is_file():
        debootstrap_base()
    container = buildah("from", "scratch").stdout.strip()
    try:
        buildah("add", container, str(BASE_TARBALL), "/")
        buildah(
            "config",
            "--env",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--env",
            "LANG=C.UTF-8",
            "--cmd",
            "python3",
            "--created-by",
            f"debootstrap --variant=minbase --include={','.join(BASE_PACKAGES)} bookworm "
            "+ bookworm-security upgrades (scripts/images.py)",
            "--label",
            f"org.opencontainers.image.description=Debian bookworm minbase + "
            f"{' '.join(BASE_PACKAGES)} (debootstrap): the local stand-in for python:3.11-slim",
            container,
        )
        buildah("commit", "--quiet", container, LOCAL_PYTHON_BASE)
    finally:
        buildah("rm", container, check=False)
    return LOCAL_PYTHON_BASE


def local_uv_image(official: str) -> str:
    """The official uv image's layout (/uv, /uvx) with the Makefile's uv, at the same version."""
    version = official.partition("@")[0].rpartition(":")[2]
    ref = f"{LOCAL_UV_IMAGE}:{version}"
    if image_exists(ref):
        return ref
    if not UV_BINARY.is_file():
        raise Failed(f"{UV_BINARY} is missing: run `make {UV_BINARY.relative_to(REPO)}` first")
    found = subprocess.run(
        [str(UV_BINARY), "--version"], capture_output=True, text=True, check=True
    ).stdout.split()
    if found[1] != version:
        raise Failed(f"{UV_BINARY} is uv {found[1]}, the Dockerfiles want {version}")
    container = buildah("from", "scratch").stdout.strip()
    try:
        buildah("copy", "--chmod", "0755", container, str(UV_BINARY), "/uv")
        uvx = UV_BINARY.with_name("uvx")
        if uvx.is_file():
            buildah("copy", "--chmod", "0755", container, str(uvx), "/uvx")
        buildah("commit", "--quiet", container, ref)
    finally:
        buildah("rm", container, check=False)
    return ref


LOCAL_BASES = {"PYTHON_BASE": lambda _official: local_python_base(), "UV_IMAGE": local_uv_image}


@functools.cache
def resolve_base(name: str, official: str) -> str:
    """The base build argument ``name``: its official default when usable, else the local
    stand-in (once per run, whichever Dockerfile asks)."""
    why = "TENSORBITS_IMAGE_BASES=local" if BASES_MODE == "local" else try_pull(official)
    if why is None:
        log(f"{name}: official {official}")
        return official
    if BASES_MODE == "official":
        raise Failed(f"{name}: cannot pull {official}: {why}")
    local = LOCAL_BASES[name](official)
    log(f"{name}: local {local} (official {official} unusable: {why})")
    return local


def resolve_bases(dockerfile: Path) -> dict[str, str]:
    return {
        name: resolve_base(name, official)
        for name, official in dockerfile_args(dockerfile).items()
        if name in LOCAL_BASES
    }


# ---- builds ---------------------------------------------------------------------------------------


def build(image: Image, bases: dict[str, str], ca_bundle: Path | None, context: Path) -> float:
    args = [
        "bud",
        "--layers",  # reuse unchanged steps across runs (buildah's default is off)
        "--format",
        "docker",  # the OCI format has no HEALTHCHECK: keep it
        "--isolation",
        "chroot",
        "--network",
        "host",
        "--force-rm",
        "-f",
        str(image.dockerfile),
    ]
    for key, value in {**bases, **image.build_args}.items():
        args += ["--build-arg", f"{key}={value}"]
    if ca_bundle is not None:
        args += ["--secret", f"id=ca-bundle,src={ca_bundle}"]
    for tag in image.tags:
        args += ["-t", tag]
    started = time.monotonic()
    log(f"building {image.name} ({image.dockerfile.relative_to(REPO)}) -> {image.ref}")
    result = buildah(*args, str(context), quiet=False)
    if result.returncode != 0:
        raise Failed(f"building {image.name} failed (exit {result.returncode})")
    return time.monotonic() - started


def selected(names: Sequence[str] | None) -> list[Image]:
    return [image for image in IMAGES if not names or image.name in names]


def build_all(names: Sequence[str] | None, ca_bundle: Path | None, context: Path = REPO) -> None:
    ensure_tool("buildah", "buildah")
    if ca_bundle is not None and not ca_bundle.is_file():
        raise Failed(f"--ca-bundle {ca_bundle}: no such file")
    log(f"cache: {CACHE}; CA bundle: {ca_bundle or 'none (uv trusts its own roots)'}")
    if (size := storage_bytes()) > CACHE_MAX_BYTES:
        log(f"the cache holds {human(size)}, over {human(CACHE_MAX_BYTES)}: emptying it first")
        clean(everything=False)
    bases_by_file: dict[Path, dict[str, str]] = {}
    times: list[tuple[Image, float]] = []
    for image in selected(names):
        if image.dockerfile not in bases_by_file:
            bases_by_file[image.dockerfile] = resolve_bases(image.dockerfile)
        times.append((image, build(image, bases_by_file[image.dockerfile], ca_bundle, context)))
    for image, seconds in times:
        print(
            f"built {image.name:<11} {seconds:7.1f} s  {human(image_size(image.ref)):>9}  {image.ref}"
        )
    print(f"bases: {json.dumps({k: v for b in bases_by_file.values() for k, v in b.items()})}")


# ---- sizes ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layer:
    size: int
    created_by: str


def layers(ref: str) -> list[Layer]:
    """The image's layers (uncompressed sizes, as stored) with the step that made each."""
    data = inspect_image(ref)
    manifest = json.loads(data["Manifest"])
    sizes = [int(layer["size"]) for layer in manifest["layers"]]
    history = [h for h in data["Docker"].get("history", []) if not h.get("empty_layer")]
    steps = [h.get("created_by", "") for h in history]
    if len(steps) != len(sizes):  # a base without history: name the layers by position
        steps = [f"layer {n}" for n in range(len(sizes))]
    return [Layer(size, step) for size, step in zip(sizes, steps, strict=True)]


def image_size(ref: str) -> int:
    return sum(layer.size for layer in layers(ref))


def human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def short_step(created_by: str, width: int = 90) -> str:
    step = re.sub(r"\s+", " ", created_by.replace("/bin/sh -c #(nop) ", "")).strip()
    return step if len(step) <= width else step[: width - 3] + "..."


def report_sizes(names: Sequence[str] | None, top: int = 4) -> None:
    for image in selected(names):
        if not image_exists(image.ref):
            print(f"{image.name}: not built")
            continue
        found = layers(image.ref)
        print(f"{image.name}: {human(sum(x.size for x in found))} in {len(found)} layers; largest:")
        for layer in sorted(found, key=lambda x: x.size, reverse=True)[:top]:
            print(f"  {human(layer.size):>10}  {short_step(layer.created_by)}")


# ---- the layer cache, measured --------------------------------------------------------------------


def context_copy(destination: Path) -> None:
    """The build context's files (what .dockerignore lets through, approximately: the folders the
    Dockerfiles copy from) into ``destination``."""
    for name in ("pyproject.toml", "uv.lock", ".dockerignore"):
        shutil.copy2(REPO / name, destination / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for folder in ("service", "client", "protocol", "docker"):
        shutil.copytree(REPO / folder, destination / folder, ignore=ignore)


def rebuild_code_only(names: Sequence[str] | None, ca_bundle: Path | None) -> None:
    """Build, then build again from a copy of the context whose only change is one line of code:
    the second build must reuse the dependency (and CUDA) layers and redo only the code layer."""
    build_all(names, ca_bundle)
    with tempfile.TemporaryDirectory(prefix="tensorbits-context.") as scratch:
        context = Path(scratch)
        context_copy(context)
        edited = context / "service" / "src" / "tensorbits" / "__init__.py"
        edited.write_text(edited.read_text() + "\n# a code-only change (images.py)\n")
        log("rebuilding after a one-line code change")
        build_all(names, ca_bundle, context)
        # The tags now point at the edited build: build the real code again (cached layers).
        build_all(names, ca_bundle)


# ---- housekeeping ---------------------------------------------------------------------------------


def storage_bytes() -> int:
    """What buildah's storage under CACHE takes on disk (du: vfs folders hold many files)."""
    storage = CACHE / "storage"
    if not storage.exists():
        return 0
    result = subprocess.run(
        ["du", "-sxk", str(storage)], capture_output=True, text=True, check=False
    )
    return int(result.stdout.split()[0]) * 1024 if result.returncode == 0 else 0


def clean(everything: bool) -> None:
    """Containers, images, layers and cache mounts; the bootstrapped base tarball stays unless
    ``everything``. Only CACHE is touched: buildah's storage elsewhere is not ours."""
    if (CACHE / "storage").exists() and shutil.which("buildah"):
        buildah("rm", "--all", check=False)
    for name in ("storage", "run", "tmp"):
        path = CACHE / name
        if path.exists():
            subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=True)
    if everything:
        BASE_TARBALL.unlink(missing_ok=True)
    log(f"cleaned {CACHE}" + ("" if everything else f" (kept {BASE_TARBALL.name})"))


def locked_versions(names: Sequence[str]) -> dict[str, str]:
    """The versions uv.lock pins for ``names`` (one version each, else KeyError)."""
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    found: dict[str, set[str]] = {}
    for package in lock["package"]:
        if package["name"] in names:
            found.setdefault(package["name"], set()).add(package["version"])
    return {name: min(versions) for name, versions in found.items()}


def lock_gpu() -> None:
    """docker/gpu/cuda<N>.txt: CuPy (the lock's version) and the CUDA runtime and NVRTC wheels,
    compiled with hashes against uv.lock's runtime pins (numpy stays the lock's)."""
    uv = str(UV_BINARY if UV_BINARY.is_file() else shutil.which("uv") or "uv")
    cupy = locked_versions(["cupy-cuda12x"])["cupy-cuda12x"]
    with tempfile.TemporaryDirectory() as scratch:
        constraints = Path(scratch) / "lock.txt"
        subprocess.run(
            [
                *(uv, "export", "--frozen", "--no-dev", "--package", "tensorbits"),
                *("--no-hashes", "--no-emit-workspace", "--quiet", "-o", str(constraints)),
            ],
            cwd=REPO,
            check=True,
        )
        for major, inputs in CUDA_INPUTS.items():
            source = Path(scratch) / f"cuda{major}.in"
            source.write_text("\n".join(line.format(cupy=cupy) for line in inputs) + "\n")
            target = GPU_REQUIREMENTS / f"cuda{major}.txt"
            subprocess.run(
                [
                    *(uv, "pip", "compile", str(source), "-c", str(constraints)),
                    *("--generate-hashes", "--python-version", "3.11"),
                    *("--python-platform", "x86_64-manylinux_2_28"),
                    *("--no-header", "--no-annotate", "--quiet", "-o", str(target)),
                ],
                check=True,
            )
            header = (
                f"# CUDA {major}: {'; '.join(line.format(cupy=cupy) for line in inputs)}.\n"
                "# Generated by `python3 scripts/images.py lock-gpu` against uv.lock; do not edit.\n"
            )
            target.write_text(header + target.read_text())
            log(f"wrote {target.relative_to(REPO)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("build", "rebuild-code-only", "sizes"):
        command = sub.add_parser(name)
        command.add_argument("--only", nargs="+", choices=IMAGE_NAMES)
        if name != "sizes":
            command.add_argument("--ca-bundle", type=Path, default=None)
    sub.add_parser("clean").add_argument("--all", action="store_true")
    sub.add_parser("lock-gpu")
    args = parser.parse_args(argv)
    ca_bundle = getattr(args, "ca_bundle", None) or None
    try:
        if args.command == "build":
            build_all(args.only, ca_bundle)
        elif args.command == "rebuild-code-only":
            rebuild_code_only(args.only, ca_bundle)
        elif args.command == "sizes":
            report_sizes(args.only)
        elif args.command == "clean":
            clean(args.all)
        else:
            lock_gpu()
    except (Failed, subprocess.CalledProcessError) as exc:
        log(f"FAILED: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
