"""The service's layers, as README.md's "Layout" draws them: the core knows no protocol and no
settings, the two front ends never import each other, and no module imports one above it in a
circle. Read from the code itself (its import statements), so a move that breaks a rule fails
here, not in a review."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "service" / "src" / "tensorbits"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> Iterator[str]:
    """Every module ``path`` imports, at its top or inside a function, absolute names."""
    package = _module(path).rsplit(".", 1)[0] if path.name != "__init__.py" else _module(path)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1]])
                base = f"{base}.{node.module}" if node.module else base
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


SOURCES = {_module(path): path for path in sorted(PACKAGE.rglob("*.py")) if "_pb2" not in path.name}


def _importers(prefix: str) -> list[str]:
    return [name for name in SOURCES if name == prefix or name.startswith(prefix + ".")]


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        ("tensorbits.core", ("tensorbits.api", "tensorbits.grpc", "tensorbits.config",
                             "tensorbits.server", "tensorbits.repository", "tensorbits.runtime",
                             "starlette", "fastapi", "grpc", "uvicorn")),
        ("tensorbits.grpc", ("tensorbits.api",)),
        ("tensorbits.api", ("tensorbits.grpc",)),
    ],
)  # fmt: skip
def test_a_layer_imports_none_of_what_it_must_not_know(
    layer: str, forbidden: tuple[str, ...]
) -> None:
    found = [
        f"{module} imports {name}"
        for module in _importers(layer)
        for name in _imports(SOURCES[module])
        if any(name == bad or name.startswith(bad + ".") for bad in forbidden)
    ]
    assert not found, found
    assert _importers(layer), f"no module of {layer}: the layout moved, update this test"


def test_no_module_of_the_service_imports_itself_through_a_circle() -> None:
    graph = {
        module: {name for name in _imports(path) if name in SOURCES and name != module}
        for module, path in SOURCES.items()
    }
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycle = [*path[path.index(target) :], target]
                pytest.fail(f"import circle: {' -> '.join(cycle)}")
            if target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_the_core_loads_without_any_front_end_or_the_settings() -> None:
    """What importing the core actually loads (its imports' imports too), in a fresh process:
    this one has loaded the front ends for other tests."""
    core = "tensorbits.core.dataplane, tensorbits.core.run, tensorbits.core.batch"
    probe = f"import sys, {core}; print(*sorted(sys.modules))"
    loaded = subprocess.check_output([sys.executable, "-c", probe], text=True).split()
    roots = {"starlette", "fastapi", "grpc", "uvicorn"}
    found = [
        name
        for name in loaded
        if name.split(".")[0] in roots
        or name.startswith(("tensorbits.api", "tensorbits.grpc", "tensorbits.config"))
    ]
    assert not found, found


# The house as a newcomer reads it: a handful of top-level modules beside the packages, and a short
# stack of floors. A room is a top-level module or a package taken whole; a room's floor is one
# above the highest room it imports. README.md's "Layout" draws these floors.
MAX_TOP_LEVEL_MODULES = 12
MAX_FLOORS = 8


def _room(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _floors() -> dict[str, int]:
    rooms: dict[str, set[str]] = {}
    for module, path in SOURCES.items():
        targets = {_room(name) for name in _imports(path) if name in SOURCES}
        rooms.setdefault(_room(module), set()).update(targets - {_room(module), "tensorbits"})
    floors: dict[str, int] = {}

    def floor(room: str, seen: tuple[str, ...]) -> int:
        if room in seen:
            pytest.fail(f"rooms in a circle: {' -> '.join([*seen, room])}")
        if room not in floors:
            floors[room] = 1 + max((floor(r, (*seen, room)) for r in rooms[room]), default=0)
        return floors[room]

    for room in rooms:
        floor(room, ())
    return floors


def test_the_house_has_few_top_level_modules_and_few_floors() -> None:
    top_level = sorted(p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(top_level) <= MAX_TOP_LEVEL_MODULES, top_level
    floors = _floors()
    assert max(floors.values()) <= MAX_FLOORS, sorted(floors.items(), key=lambda kv: -kv[1])
    # The process sits on top of both front ends, which are siblings on one floor.
    assert floors["tensorbits.server"] == max(floors.values())
    assert floors["tensorbits.api"] == floors["tensorbits.grpc"]
