"""Shared fixtures. tests/ is on sys.path (pytest's rootdir-relative conftest import), so test
modules import the operator reference as ``core.bitref``. No folder of tests/ is a package: a
folder named like an installed package (tests/grpc) is a namespace folder, which never shadows it
(a regular package anywhere on sys.path wins), so a helper in it cannot be imported by its folder's
name; and test file names are unique across folders (pytest imports each by its base name)."""

from __future__ import annotations

import ast
import functools
import inspect
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tensorbits.core.backends import Backend, select_backend

if TYPE_CHECKING:
    from support.grpc_live import GrpcServer
    from support.wires import Wires

# No gRPC endpoint and no metrics listener unless a test asks for one (on a free port): in-process
# apps and the live servers the tests start inherit this. Set, not defaulted: a shell that
# exports these for a server of its own (`make serve`, on 8001 and 8002) would otherwise have
# every server the tests start try the ports that server holds.
os.environ["TENSORBITS_GRPC_PORT"] = "0"
os.environ["TENSORBITS_METRICS_PORT"] = "0"


@pytest.fixture(scope="session")
def numpy_backend() -> Iterator[Backend]:
    """The NumPy backend as ``select_backend('numpy')`` builds it (one thread per core)."""
    backend = select_backend("numpy").backend
    yield backend
    backend.close()


# One real server for the whole suite, HTTP and gRPC on free loopback ports, and ``wires``: both
# protocols' clients to it. Here, not in a folder's conftest.py: the parity tests of live/ and
# protocol/test_descriptor_parity.py share it (one server per session). Imported when first asked
# for, so that a run without them never imports grpcio.
@pytest.fixture(scope="session")
def protocols_server() -> Iterator[GrpcServer]:
    from support.grpc_live import serve_grpc

    with serve_grpc() as server:
        yield server


@pytest.fixture(scope="session")
def wires(protocols_server: GrpcServer) -> Iterator[Wires]:
    import grpc
    import httpx
    from support.wires import TIMEOUT_S, Wires

    # No message size limit on the client's side: the server's are the ones under test.
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with (
        httpx.Client(base_url=protocols_server.http.base_url, timeout=TIMEOUT_S) as http,
        grpc.insecure_channel(protocols_server.grpc_url, options=options) as channel,
    ):
        yield Wires(http, channel)


# The lanes. `make test` runs the tests that are not `live`, over the cores (pytest-xdist);
# `make test-all` runs every test, serially (the live tests measure memory and latency: they must
# not compete with each other). `live` is decided here, from what the tests use, never from a list
# of files: a test is live when
#   - it lies in a folder that is live wholesale (LIVE_FOLDERS), or
#   - it is marked `integration` (by hand, or by a conftest.py from the fixtures it requests), or
#   - its module uses, anywhere outside a type annotation, something that starts or drives another
#     process (STARTERS, PROCESS_CALLS): directly, or through a function or class of the tests' own
#     helper modules (support.*, fake_server, scripts/...) that does so, or
#   - it requests a fixture, from any conftest.py, whose function does so.
# A name only imported for annotations (support.live's LiveServer in a signature) does not count;
# support.live.free_port does not either (it only asks the kernel for a port): serve does.
LIVE_FOLDERS = frozenset({"live", "fuzz", "gpu"})
# Modules whose every use means another process: a child interpreter, a server, a tool, a browser,
# a fuzzer.
STARTERS = frozenset({"subprocess", "multiprocessing", "pty", "selenium", "atheris"})
# ... and the single functions that do, of modules that are otherwise harmless.
PROCESS_CALLS = frozenset(
    {f"os.{name}" for name in ("fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp")}
    | {f"os.{name}" for name in ("execv", "execve", "execl", "execle", "execlp", "execvp")}
    | {f"os.{name}" for name in ("execlpe", "execvpe", "spawnv", "spawnve", "spawnl", "spawnle")}
    | {
        "asyncio.create_subprocess_exec",
        "asyncio.create_subprocess_shell",
        "concurrent.futures.ProcessPoolExecutor",
    }
)
_TESTS = Path(__file__).resolve().parent
_REPO = _TESTS.parent
# Where the tests' own modules are found: tests/ (support.*, core.*), a test's own folder
# (fake_server, harness) and scripts/ (images, image_test: some tests put it on sys.path).
_HELPER_ROOTS = (_TESTS, _REPO / "scripts")


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` of a name or an attribute chain on a name; None for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _is_type_checking(test: ast.expr) -> bool:
    return _dotted(test) in {"TYPE_CHECKING", "typing.TYPE_CHECKING"}


class _Uses(ast.NodeVisitor):
    """The imports of a module (name -> dotted target) and, per top-level definition, the dotted
    names it uses at run time: type annotations and ``if TYPE_CHECKING:`` blocks left out."""

    def __init__(self) -> None:
        self.imports: dict[str, str] = {}
        self.uses: dict[str, set[str]] = {}
        self._scope = ""  # "" is the module's own top-level code

    def _use(self, dotted: str) -> None:
        self.uses.setdefault(self._scope, set()).add(dotted)

    def _top(self, node: ast.stmt, name: str) -> None:
        outer, self._scope = self._scope, (name if self._scope == "" else self._scope)
        self.generic_visit(node)
        self._scope = outer

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.imports[alias.asname] = alias.name
            else:
                head = alias.name.partition(".")[0]
                self.imports[head] = head

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and not node.level:
            for alias in node.names:
                self.imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            for stmt in node.orelse:
                self.visit(stmt)
        else:
            self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        node.returns = None
        self._top(node, node.name)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self.visit_FunctionDef(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._top(node, node.name)

    def visit_arg(self, node: ast.arg) -> None:
        pass  # its annotation only

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)

    def visit_Assign(self, node: ast.Assign) -> None:
        if self._scope == "":
            for target in node.targets:
                if isinstance(target, ast.Name):  # a module-level name: its own definition
                    self._scope = target.id
                    self.visit(node.value)
                    self._scope = ""
                    return
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted = _dotted(node)
        if dotted is None:
            self.generic_visit(node)
        elif isinstance(node.ctx, ast.Load):
            self._use(dotted)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self._use(node.id)


@functools.cache
def _module_uses(path: Path) -> _Uses:
    uses = _Uses()
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except (OSError, SyntaxError, ValueError):
        return uses  # a helper being edited: its importer's own collection says what is wrong
    uses.visit(tree)
    return uses


def _helper_module(dotted: str, near: Path) -> tuple[Path, str] | None:
    """The tests' own module that ``dotted`` starts with (its file) and the rest of the name
    after it; None when it names no module of the repository's tests or scripts."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        relative = Path(*parts[:end])
        for root in (near, *_HELPER_ROOTS):
            for candidate in (root / f"{relative}.py", root / relative / "__init__.py"):
                if candidate.is_file():
                    return candidate.resolve(), ".".join(parts[end:])
    return None


@functools.cache
def _live_names(path: Path) -> frozenset[str]:
    """The top-level names of a module whose code starts another process ("" for its own
    top-level code), directly or through another live name."""
    uses = _module_uses(path)
    live: set[str] = set()
    _live_names_pending.add(path)
    try:
        changed = True
        while changed:
            changed = False
            for scope, names in uses.uses.items():
                if scope not in live and any(
                    _is_live_use(name, uses, path, live) for name in names
                ):
                    live.add(scope)
                    changed = True
    finally:
        _live_names_pending.discard(path)
    return frozenset(live)


_live_names_pending: set[Path] = set()  # the modules being decided (import cycles)


def _is_live_use(name: str, uses: _Uses, path: Path, live: set[str]) -> bool:
    head, _, rest = name.partition(".")
    if head not in uses.imports:
        return head in live  # a live definition of the module itself
    target = f"{uses.imports[head]}.{rest}".rstrip(".")
    if any(target == s or target.startswith(f"{s}.") for s in STARTERS):
        return True
    if any(target == c or target.startswith(f"{c}.") for c in PROCESS_CALLS):
        return True
    helper = _helper_module(target, path.parent)
    if helper is None or helper[0] == path or helper[0] in _live_names_pending:
        return False
    module, attribute = helper
    names = _live_names(module)
    return bool(names) if not attribute else attribute.partition(".")[0] in names


@functools.cache
def _is_live_path(path: Path) -> bool:
    """Every test in the file at ``path`` is live: by its folder, or by what its module uses."""
    path = path.resolve()
    if path.is_relative_to(_TESTS) and path.relative_to(_TESTS).parts[0] in LIVE_FOLDERS:
        return True
    return path.suffix == ".py" and bool(_live_names(path))


@functools.cache
def _is_live_fixture(func: Callable[..., object]) -> bool:
    func = inspect.unwrap(func)
    source = inspect.getsourcefile(func)
    if source is None or not Path(source).resolve().is_relative_to(_TESTS):
        return False  # a plugin's: tmp_path, monkeypatch, ...
    return func.__name__ in _live_names(Path(source).resolve())


def _is_live(item: pytest.Item) -> bool:
    if _is_live_path(item.path) or item.get_closest_marker("integration") is not None:
        return True
    fixtureinfo = getattr(item, "_fixtureinfo", None)
    if fixtureinfo is None:
        return False
    return any(
        _is_live_fixture(fixturedef.func)
        for fixturedefs in fixtureinfo.name2fixturedefs.values()
        for fixturedef in fixturedefs
    )


# A plain hook: the conftest.py files of the folders below (registered later) run theirs first,
# so the `integration` they add counts here; and this one runs before pytest's own deselects by -m.
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _is_live(item):
            item.add_marker(pytest.mark.live)
