"""The Python packages the GPU check brings as wheels, read off uv.lock, and what the machine imports.

A GPU machine without network (docs/gpu.md) has Python 3.12 and packages of its own whose
versions nobody here chose (pydantic-core 2.50 fails to import beside a typing-extensions
without ``Sentinel``, for one). So every distribution the service, its client and the GPU tests
need comes as a wheel at the lock's version, checked against the lock's hashes, and put
first on the path there; only NumPy is the machine's (its CuPy is built against it), and CuPy,
which the lock does not hold for CUDA 13.

    python scripts/gpu_wheels.py requirements      # what pip downloads: name==version --hash=...
    python scripts/gpu_wheels.py check .whl        # the folder holds exactly that, for the device
    python scripts/gpu_wheels.py report [--device] # import what the check runs; print every
                                                   # distribution imported, its version and where
                                                   # from, and each that differs from the lock
    python scripts/gpu_wheels.py report --carried-only  # the same with every distribution that
                                                   # is not among the wheels refused: nothing missing offline

``cuda-bindings`` (tritonclient's CUDA helper needs it; the lock holds it only as an extra) and
its ``cuda-pathfinder`` come as wheels too, but are installed only where the machine has no
cuda-bindings 13 of its own (its CuPy's), at ``CUDA_BINDINGS``: the CUDA 13.0 build, which the
driver of those machines (580) serves.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata as metadata
import re
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "uv.lock"

# What the machine runs: the service, the client and the protocol they share (from source), and
# the GPU tests' tools.
ROOTS: dict[str, tuple[str, ...]] = {
    "tensorbits": (),
    "tensorbits-client": (),
    "tensorbits-protocol": (),
    "tritonclient": ("http", "grpc"),
    "pytest": (),
    "pytest-timeout": (),
    "hypothesis": (),
}
# The workspace's own distributions: they travel as source (PYTHONPATH), not as wheels.
WORKSPACE = frozenset({"tensorbits", "tensorbits-client", "tensorbits-protocol"})
# Kept from the machine: its CuPy is built against its NumPy.
FROM_THE_MACHINE = frozenset({"numpy"})
# Not in the lock's default resolution (tritonclient's 'cuda' extra): pinned here.
CUDA_BINDINGS = "13.0.3"
CUDA_EXTRA = ("cuda-bindings", "cuda-pathfinder")

# The machine: CPython 3.12 on x86-64 Linux (glibc 2.39 or older: manylinux up to 2_39).
MARKERS = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "implementation_version": "3.12.3",
    "platform_python_implementation": "CPython",
    "platform_machine": "x86_64",
    "platform_system": "Linux",
    "sys_platform": "linux",
    "os_name": "posix",
    "extra": "",
}
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(39, 4, -1)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
]

# What the GPU check imports (the server, its gRPC side, the tests' clients and tools).
SESSION_IMPORTS = (
    "tensorbits.server.cli",
    "tensorbits.server.app",
    "tensorbits.grpc.server",
    "tensorbits.core.backends.cupy_backend",
    "tensorbits_client",
    "tensorbits_protocol",
    "fastapi.testclient",
    "uvicorn",
    "httpx",
    "tritonclient.http",
    "tritonclient.grpc",
    "tritonclient.utils.shared_memory",
    "pytest",
    "pytest_timeout",
    "hypothesis",
)
DEVICE_IMPORTS = ("cupy", "cuda.bindings.runtime", "tritonclient.utils.cuda_shared_memory")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    hashes: tuple[str, ...]  # sha256 of each of the version's wheels in the lock

    def requirement(self) -> str:
        return " ".join([f"{self.name}=={self.version}", *(f"--hash={h}" for h in self.hashes)])


def load_lock(path: Path = LOCK) -> list[dict[str, Any]]:
    with path.open("rb") as handle:
        packages: list[dict[str, Any]] = tomllib.load(handle)["package"]
    return packages


def _applies(dependency: Mapping[str, Any], markers: Mapping[str, str]) -> bool:
    from packaging.markers import Marker

    marker = dependency.get("marker")
    return marker is None or Marker(marker).evaluate(dict(markers))


def closure(
    packages: list[dict[str, Any]],
    roots: Mapping[str, Iterable[str]] = ROOTS,
    markers: Mapping[str, str] = MARKERS,
) -> dict[str, dict[str, Any]]:
    """Every locked package the roots need on the machine (with their extras), by name."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for package in packages:
        by_name.setdefault(package["name"], []).append(package)

    def locked(name: str, version: str | None) -> dict[str, Any]:
        candidates = by_name.get(name)
        if not candidates:
            raise SystemExit(f"gpu_wheels: {name} is not in uv.lock")
        if version is not None:
            candidates = [p for p in candidates if p["version"] == version]
        if len(candidates) != 1:
            raise SystemExit(f"gpu_wheels: uv.lock holds {len(candidates)} {name} for this need")
        return candidates[0]

    needed: dict[str, dict[str, Any]] = {}
    pending: list[tuple[dict[str, Any], tuple[str, ...]]] = [
        (locked(name, None), tuple(extras)) for name, extras in roots.items()
    ]
    done: set[tuple[str, tuple[str, ...]]] = set()
    while pending:
        package, extras = pending.pop()
        if (package["name"], extras) in done:
            continue
        done.add((package["name"], extras))
        needed[package["name"]] = package
        dependencies = list(package.get("dependencies", []))
        for extra in extras:
            dependencies += package.get("optional-dependencies", {}).get(extra, [])
        for dependency in dependencies:
            if _applies(dependency, markers):
                target = locked(dependency["name"], dependency.get("version"))
                pending.append((target, tuple(dependency.get("extra", ()))))
    return needed


def carried(packages: list[dict[str, Any]]) -> list[Pin]:
    """The pins of every wheel carried, in name order: the closure but the workspace and what
    the machine keeps, then the CUDA extra's cuda-pathfinder (cuda-bindings has no lock pin)."""
    needed = closure(packages)
    names = sorted(set(needed) - WORKSPACE - FROM_THE_MACHINE)
    pathfinder = [p for p in packages if p["name"] == "cuda-pathfinder"]
    if pathfinder and "cuda-pathfinder" not in needed:
        needed["cuda-pathfinder"] = pathfinder[0]
        names.append("cuda-pathfinder")
    pins = []
    for name in names:
        package = needed[name]
        hashes = tuple(wheel["hash"] for wheel in package.get("wheels", []))
        if not hashes:
            raise SystemExit(f"gpu_wheels: uv.lock has no wheel of {name} {package['version']}")
        pins.append(Pin(name, package["version"], hashes))
    return pins


def device_tags() -> set[Any]:
    from packaging import tags

    return set(tags.cpython_tags((3, 12), abis=["cp312"], platforms=PLATFORMS)) | set(
        tags.compatible_tags((3, 12), "cp312", PLATFORMS)
    )


def check(folder: Path, packages: list[dict[str, Any]]) -> list[str]:
    """What is wrong with the wheels in ``folder`` for the machine (empty: nothing)."""
    from packaging.utils import parse_wheel_filename

    want = {canonical(pin.name): pin.version for pin in carried(packages)}
    want["cuda-bindings"] = CUDA_BINDINGS
    supported = device_tags()
    problems = []
    found: dict[str, list[str]] = {}
    for wheel in sorted(folder.glob("*.whl")):
        project, version, _, wheel_tags = parse_wheel_filename(wheel.name)
        found.setdefault(canonical(project), []).append(str(version))
        if not wheel_tags & supported:
            problems.append(f"{wheel.name}: not installable on CPython 3.12, x86-64 Linux")
    for name, versions in sorted(found.items()):
        if name not in want:
            problems.append(
                f"{name} {', '.join(versions)}: not needed (uv.lock's set has no {name})"
            )
        elif versions != [want[name]]:
            problems.append(f"{name}: {', '.join(versions)} here, {want[name]} wanted (one wheel)")
    problems += [f"{name} {want[name]}: missing" for name in sorted(set(want) - set(found))]
    return problems


class _CarriedOnly(importlib.abc.MetaPathFinder):
    """Refuses every module of a distribution the machine would not have: as if only the carried
    wheels, the machine's NumPy (and CuPy) and the source tree were installed."""

    def __init__(self, refused: set[str]) -> None:
        self.refused = refused

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] in self.refused:
            raise ModuleNotFoundError(f"No module named {fullname!r} (not carried)", name=fullname)
        return None


def carried_only(packages: list[dict[str, Any]]) -> set[str]:
    """Install ``_CarriedOnly`` first on the import path; the top-level names it refuses."""
    allowed = {canonical(pin.name) for pin in carried(packages)}
    allowed |= WORKSPACE | FROM_THE_MACHINE | set(CUDA_EXTRA) | {"cupy-cuda13x"}
    refused = {
        top
        for top, owners in metadata.packages_distributions().items()
        if not any(canonical(owner) in allowed for owner in owners) and top not in sys.modules
    }
    sys.meta_path.insert(0, _CarriedOnly(refused))
    return refused


def report(device: bool, packages: list[dict[str, Any]], only_carried: bool = False) -> int:
    """Import what the check runs; print each distribution imported, its version and where it
    came from, then the pins that differ. 1 when an import failed or a pin differs.
    ``only_carried``: with every other distribution refused (``carried_only``)."""
    if only_carried:
        refused = carried_only(packages)
        print(f"refusing the modules of every distribution not carried ({len(refused)} names)")
    failed = []
    for module in SESSION_IMPORTS + (DEVICE_IMPORTS if device else ()):
        try:
            importlib.import_module(module)
        except Exception as exc:
            failed.append(f"import {module}: {type(exc).__name__}: {exc}")
    owners = metadata.packages_distributions()
    imported: dict[str, metadata.Distribution] = {}
    for top in sorted({name.partition(".")[0] for name in list(sys.modules)}):
        for owner in owners.get(top, []):
            imported.setdefault(canonical(owner), metadata.distribution(owner))
    print(f"python {sys.version.split()[0]} ({sys.executable})")
    for name, dist in sorted(imported.items()):
        where = dist.locate_file("")
        print(f"  {name:<28} {dist.version:<14} {where}")
    pins = {canonical(pin.name): pin.version for pin in carried(packages)}
    differ = [
        f"{name}: {dist.version} imported, {pins[name]} in uv.lock"
        for name, dist in sorted(imported.items())
        # cuda-pathfinder: the machine's own stays beside its own cuda-bindings 13.
        if name in pins and name not in CUDA_EXTRA and dist.version != pins[name]
    ]
    for line in failed + differ:
        print(f"FAILED: {line}")
    print(
        f"gpu_wheels: {len(imported)} distributions imported; "
        f"{len(failed)} imports failed, {len(differ)} differ from uv.lock"
    )
    return 1 if failed or differ else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("requirements", help="pip's requirements, with the lock's hashes")
    checking = commands.add_parser("check", help="the wheels in FOLDER against the lock")
    checking.add_argument("folder", type=Path)
    reporting = commands.add_parser("report", help="import the check's modules; versions")
    reporting.add_argument("--device", action="store_true", help="CuPy and cuda-bindings too")
    reporting.add_argument(
        "--carried-only", action="store_true", help="refuse what the wheels would not bring"
    )
    args = parser.parse_args(argv)
    packages = load_lock()
    if args.command == "requirements":
        for pin in carried(packages):
            print(pin.requirement())
        return 0
    if args.command == "check":
        problems = check(args.folder, packages)
        for problem in problems:
            print(f"gpu_wheels: {problem}", file=sys.stderr)
        return 1 if problems else 0
    return report(args.device, packages, args.carried_only)


if __name__ == "__main__":
    sys.exit(main())
