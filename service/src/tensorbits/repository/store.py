"""The repository extension's loads and unloads, held for the whole server when it runs several
worker processes (``tensorbits serve --workers N``, ``workers.py``).

A load or an unload reaches one worker, the one that took the request. That worker applies it
(``model_lifecycle.py``), then writes it here, in the ``models/`` folder of the folder the
workers share; every other worker applies what it finds there. The folder holds the current
state of every load and unload made through the API, not a journal of them:

    models/entries/<key>@<generation>/    a graph model loaded through the API: ``config``,
                                          the configuration's text, its one file, named as the
                                          load's parameter named it (quoted:
                                          ``file%3A1%2F...``), and ``name``, the model's
    models/entries/<key>@<generation>.unloaded
                                          a model unloaded (a graph model the repository folder
                                          holds, or a built-in one); it holds the model's name
    models/applied/<pid>.<n>              8 bytes: the generation one worker has applied
    models/tmp/<pid>.<n>                  a write under way (renamed into ``entries`` or
                                          ``applied``: the same file system)
    models/generation                     8 bytes: the generation of the last change
    models/lock                           the writers' ``flock``

Each kind of file has a folder of its own, and ``entries`` holds entries only: no model's name,
whatever it is (``applied.x``, ``tmp.1.2``, ``lock``), can make a file another kind's reader
takes for its own.

``<key>`` is the model's name quoted for the file system (``entry_key``: any name a model may
have, ``/``, ``..`` and non-ASCII included; a long one hashed, its name then in the entry's
``name``). No entry for a name: what every worker has without the API. A built-in model loaded
again leaves no entry (its tombstone is removed); so does a graph model unloaded that the
repository folder does not hold. The store so holds at most the graph models loaded
(``TENSORBITS_MAX_LOADED_MODELS``, each file bounded by ``TENSORBITS_MAX_MODEL_BYTES``) and a
tombstone for each built-in model or repository folder's model unloaded.

A load's room is decided once for every worker, under the ``flock``, by what the store says is
served: the repository folder's models but those unloaded, and the graph models of its entries.
A load past ``TENSORBITS_MAX_LOADED_MODELS`` there is refused on the worker that took it, with
the refusal one worker gives (``check_room``), before it is served anywhere: two loads racing
for the last place, on two workers, are one served everywhere and one refused.

A write (``ModelStore.loaded``, ``unloaded``, ``reloaded``) is made under a temporary name,
renamed into place (atomic), the name's older entries removed, and the generation incremented,
all under an exclusive ``flock``; then the writer applies what it wrote on its own worker again,
so that a change another worker made meanwhile cannot leave it serving something else.

Every worker maps the generation (``mmap``) and compares it with the one it has scanned on every
model lookup (``FollowingGraphModels``, ``FollowingModelStates``: a read of shared memory, no
system call). On a change it scans the folder and applies at once what costs nothing (an unload,
a built-in model loaded again): an unload holds on every worker as soon as it is written. A
graph model to build is left to the worker's watcher, a timer on its event loop that looks at
the generation every ``FOLLOW_EVERY_S`` (no thread woken while nothing changes: a thread's
wake-ups would take the interpreter's lock from the loop) and hands each new model to a thread,
which builds it from its files with the load's own code and limits (``GraphModels.load``);
the worker then publishes the generation it has applied. The worker that took a load answers
once every live worker has published that generation (``served_everywhere``), so a load
answered 200 is served by every worker. A worker holds a shared ``flock`` on its ``applied``
file while it lives: the kernel drops it when the process dies, however it dies, so a dead
worker is never waited for (a lock, not a pid that may be taken again). A worker that starts
(one started in the place of one that died) applies the whole store after the repository
folder, before it serves.

With one worker there is no store: nothing here runs and nothing is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import hashlib
import itertools
import logging
import mmap
import os
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote

from tensorbits.core.dataplane import DataPlane
from tensorbits.core.graphs.limits import GraphLimits
from tensorbits.core.graphs.models import GraphModel, GraphModels, check_room
from tensorbits.core.graphs.triton_config import MAX_CONFIG_BYTES
from tensorbits.core.models import ModelStates

logger = logging.getLogger("tensorbits.repository")

MODELS = "models"
GENERATION = "generation"
LOCK = "lock"
ENTRIES = "entries"
APPLIED = "applied"
TEMPORARY = "tmp"
UNLOADED = ".unloaded"
NAME = "name"
CONFIG = "config"
# A quoted name longer than this is hashed: a file name has at most 255 bytes, and a model name
# up to 256 characters, each up to 12 once quoted.
MAX_KEY_CHARS = 160
# How often a worker's watcher looks at the generation: what a load waits at most, beyond the
# time the other workers take to build the model.
FOLLOW_EVERY_S = 0.015
# How often a load that waits for the other workers looks at what they have applied.
WAIT_EVERY_S = 0.005
# How long a load waits for every worker to serve the model. They build it from the same file
# with the same code as the worker that took the load, which took about as long (a second for
# the largest file allowed); this leaves room for workers busy serving, and still answers
# within the minute a client's connection is commonly given.
APPLY_TIMEOUT_S = 30.0
BACK_OFF_S = 1.0  # the watcher's pause after a failure, so that a lasting one logs once a second


def entry_key(name: str) -> str:
    """``name`` as a file name: percent-quoted (no ``/``, no ``@``, no ``..`` of its own), or,
    when that is long, ``#`` and the name's SHA-256 (quoting never writes ``#``)."""
    quoted = quote_name(name)
    if len(quoted) <= MAX_KEY_CHARS:
        return quoted
    return "#" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()


def quote_name(name: str) -> str:
    """Percent-encoding of ``name``'s UTF-8, every character but letters, digits and ``_.-~``
    encoded: ``/`` is ``%2F``, ``@`` is ``%40``. Of what it makes, only ``.`` and ``..`` mean
    something to the file system, and an entry's name, ``<key>@<generation>``, is neither."""
    return quote(name, safe="", errors="surrogatepass")


def unquote_key(key: str) -> str:
    return unquote(key, errors="surrogatepass")


def _name_bytes(name: str) -> bytes:
    return name.encode("utf-8", "surrogatepass")


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of the store: the model it is of, its generation, whether it is a tombstone."""

    name: str
    generation: int
    unloaded: bool
    path: Path


def _not_shared() -> None:
    """What a lookup follows in a server of one process: nothing."""


class FollowingGraphModels(GraphModels):
    """``GraphModels`` whose lookups first follow the other workers' changes (``follow``: the
    store's, a read of the shared generation while nothing changed)."""

    __slots__ = ("follow",)

    def __init__(
        self,
        limits: GraphLimits | None = None,
        max_loaded: int = 64,
        is_builtin: Callable[[str], bool] = lambda name: False,
    ) -> None:
        super().__init__(limits, max_loaded, is_builtin)
        self.follow: Callable[[], None] = _not_shared

    def get(self, name: str) -> GraphModel | None:
        self.follow()
        return GraphModels.get(self, name)  # not super(): twice its cost, on every lookup

    def models(self) -> list[GraphModel]:
        self.follow()
        return GraphModels.models(self)

    def failed(self) -> dict[str, str]:
        self.follow()
        return GraphModels.failed(self)


class FollowingModelStates(ModelStates):
    """``ModelStates`` whose lookups first follow the other workers' changes."""

    __slots__ = ("follow",)

    def __init__(self) -> None:
        super().__init__()
        self.follow: Callable[[], None] = _not_shared

    def is_loaded(self, name: str) -> bool:
        self.follow()
        return ModelStates.is_loaded(self, name)

    def check_loaded(self, name: str) -> None:
        self.follow()
        ModelStates.check_loaded(self, name)


class _Superseded(Exception):
    """An entry removed while it was read: a newer one of its name replaced it."""


_stores = itertools.count()


class ModelStore:
    """One worker's side of the store: what it writes for the loads and unloads it takes, and
    what it applies of the other workers' (see the module). ``join`` makes one."""

    def __init__(self, folder: Path, plane: DataPlane) -> None:
        graphs, models = plane.graphs, plane.models
        if not isinstance(graphs, FollowingGraphModels) or not isinstance(
            models, FollowingModelStates
        ):
            raise TypeError("a model store follows a plane of FollowingGraphModels and States")
        self.folder = folder
        self.entries = folder / ENTRIES
        self.applied_files = folder / APPLIED
        self.temporaries = folder / TEMPORARY
        self.plane = plane
        self.graphs = graphs
        self.states = models
        # The graph models this worker has without the store (the repository folder's, loaded
        # or failed): an unload of one of them is a tombstone, of any other the entry's removal.
        self.base_loaded = frozenset(model.name for model in graphs.models())
        self.base = frozenset(graphs.failed()) | self.base_loaded
        self._lock = threading.RLock()  # this worker's: its state below, its writes
        self._applied: dict[str, Entry] = {}  # by name: the entry this worker serves as
        self._pending: dict[str, Entry] = {}  # by name: graph models to build
        self._scanned = -1  # the generation whose entries were read and applied, or are pending
        self._published = -1
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None  # the watcher's next look
        self._building: asyncio.Future[None] | None = None  # graph models built on a thread
        for made in (folder, self.entries, self.applied_files, self.temporaries):
            made.mkdir(exist_ok=True)
        self._lock_fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            with self._flock():
                fd = os.open(folder / GENERATION, os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    if os.fstat(fd).st_size < 8:
                        os.ftruncate(fd, 8)
                    self._map = mmap.mmap(fd, 8)
                finally:
                    os.close(fd)
            # A read of shared memory: what every lookup costs while nothing changes.
            self._generation = ctypes.c_uint64.from_buffer(self._map)
            self._applied_path, self._applied_fd = self._applied_file()
        except BaseException:
            os.close(self._lock_fd)
            raise

    @classmethod
    def join(cls, folder: Path, plane: DataPlane) -> ModelStore:
        """The store in ``folder`` (the workers folder's ``models/``, made if it is not there),
        followed by ``plane`` from now on: everything in it applied first (here: a worker joins
        before it serves), then watched on the running event loop (the worker's)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "a model store is joined on the event loop it is watched on"
            ) from None
        store = cls(folder, plane)
        try:
            with store._lock:
                store._scan()
            store._build_pending()
            store.graphs.follow = store.states.follow = store.follow
            store._timer = loop.call_later(FOLLOW_EVERY_S, store._watch)
        except BaseException:
            store.close()
            raise
        return store

    def close(self) -> None:
        """Stop following: the watcher stopped, this worker's ``applied`` file removed (a graph
        model still being built is served, no more published)."""
        with self._lock:  # no write under way: none after (``_commit``)
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            self.graphs.follow = self.states.follow = _not_shared
            with contextlib.suppress(OSError):
                self._applied_path.unlink()
            os.close(self._applied_fd)
            os.close(self._lock_fd)
        # The mapping's view let go for one that never changes (follow: nothing to do).
        self._scanned = max(self._scanned, 0)
        self._generation = ctypes.c_uint64(self._scanned)
        with contextlib.suppress(BufferError):  # a lookup that read it just now: the object's
            self._map.close()

    # --- what this worker writes --------------------------------------------------------------

    def loaded(
        self, name: str, config: str | bytes, files: Mapping[str, bytes], model: GraphModel
    ) -> int | None:
        """Graph model ``name``, loaded on this worker as ``model`` from ``config`` and
        ``files``, written for the others (on a worker thread: a file may be large). Its
        generation, or None where it could not be written (logged: the load stays this
        worker's). Refused (``check_room``) where the store has no room for it: not served."""
        temporary = self._temporary()
        try:
            temporary.mkdir()
            (temporary / NAME).write_bytes(_name_bytes(name))
            (temporary / CONFIG).write_bytes(
                config.encode("utf-8", "surrogatepass") if isinstance(config, str) else config
            )
            for parameter, data in files.items():
                (temporary / quote_name(parameter)).write_bytes(data)

            def serve() -> None:
                if GraphModels.get(self.graphs, name) is not model:
                    self.plane.add_graph(model)

            return self._commit(name, temporary, serve, room=True)
        except OSError:
            logger.exception("graph model '%s' could not be shared with the workers", name[:100])
            if GraphModels.get(self.graphs, name) is not model:
                self.plane.add_graph(model)
            return None
        finally:
            shutil.rmtree(temporary, ignore_errors=True)

    def unloaded(self, name: str) -> int | None:
        """Model ``name`` unloaded on this worker (a graph model, or a built-in one), written for
        the others: a tombstone, or, for a graph model only the store brought, no entry. Its
        generation, or None where it could not be written (logged)."""
        try:
            if not self.graphs.is_builtin(name) and name not in self.base:
                return self._commit(name, None, lambda: self._unload_here(name))
            temporary = self._temporary()
            try:
                temporary.write_bytes(_name_bytes(name))
                return self._commit(name, temporary, lambda: self._unload_here(name), UNLOADED)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    temporary.unlink()
        except OSError:
            logger.exception("the unload of '%s' could not be shared with the workers", name[:100])
            return None

    def reloaded(self, name: str) -> int | None:
        """Built-in model ``name`` loaded again on this worker: its tombstone removed. Its
        generation, or None when there was none (nothing to tell the others)."""
        try:
            with self._lock:
                if self._closed or not self._entries_of(entry_key(name)):
                    return None
                return self._commit(name, None, lambda: self.states.load(name))
        except OSError:
            logger.exception("the load of '%s' could not be shared with the workers", name[:100])
            return None

    async def served_everywhere(self, generation: int, timeout: float = APPLY_TIMEOUT_S) -> None:
        """Wait (asynchronously) until every live worker has applied ``generation``, or
        ``timeout`` seconds have passed (logged: the answer is this worker's still)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            behind = self.behind(generation)
            if not behind:
                return
            if loop.time() >= deadline:
                logger.warning(
                    "worker processes %s have not applied generation %d of the model store in "
                    "%.0f s: they may still serve what they served before",
                    ", ".join(behind), generation, timeout,
                )  # fmt: skip
                return
            await asyncio.sleep(WAIT_EVERY_S)

    def behind(self, generation: int) -> list[str]:
        """The live workers (their ``applied`` files' names) that have not applied
        ``generation``. A file no process holds is a dead worker's: removed."""
        behind = []
        with os.scandir(self.applied_files) as listing:
            paths = [Path(item.path) for item in listing]
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue  # a worker that stopped meanwhile
            try:
                if int.from_bytes(os.pread(fd, 8, 0), "little") >= generation:
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    behind.append(path.name)  # alive: its lock is held
                    continue
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()  # dead: the kernel dropped its lock
            finally:
                os.close(fd)
        return behind

    def _commit(
        self,
        name: str,
        temporary: Path | None,
        serve: Callable[[], None],
        suffix: str = "",
        *,
        room: bool = False,
    ) -> int:
        """Write ``name``'s new entry (``temporary`` renamed into place; None: no entry), remove
        its older ones, increment the generation; then ``serve`` it on this worker again.
        ``room``: a graph model loaded, refused first where every worker's count has no room."""
        key = entry_key(name)
        entry: Entry | None = None
        with self._lock:
            if self._closed:
                raise OSError(f"the model store is closed: '{name[:100]}' is this worker's only")
            with self._flock():
                if room:
                    check_room(name, self._served(), self.graphs.max_loaded)
                generation = self._generation.value + 1
                older = self._entries_of(key)
                if temporary is not None:
                    entry = Entry(
                        name, generation, bool(suffix), self.entries / f"{key}@{generation}{suffix}"
                    )
                    if entry.path in older:  # left by a writer that died before it counted it
                        _remove(entry.path)
                    os.rename(temporary, entry.path)
                for path in older:
                    if entry is None or path != entry.path:
                        _remove(path)
                self._generation.value = generation
            # What this worker wrote is what it serves, whatever it applied of another's since
            # its own change (under this lock: nothing else is applied in between now). The
            # others' changes up to it applied first: the unloads that made its room among them.
            self._scan()
            try:
                serve()
            except Exception:
                logger.exception("'%s' as this worker wrote it could not be served", name[:100])
            self._pending.pop(name, None)
            if entry is None:
                self._applied.pop(name, None)
            else:
                self._applied[name] = entry
            self._scan()
        return generation

    # --- what this worker applies ------------------------------------------------------------

    def follow(self) -> None:
        """Every lookup's check: the other workers' changes applied, if there are any, as far
        as they cost nothing (a graph model to build is the watcher's)."""
        if self._generation.value != self._scanned:
            self._follow()

    def _follow(self) -> None:
        with self._lock:
            if self._generation.value == self._scanned or self._closed:
                return
            try:
                self._scan()
            except Exception:
                # The watcher tries again and logs what goes on failing: a lookup serves on.
                logger.debug("the model store could not be read", exc_info=True)

    def _watch(self) -> None:
        """The watcher: every ``FOLLOW_EVERY_S``, on the event loop (a timer: no thread to wake,
        nothing taken from the loop while nothing changes), the changes read and the graph
        models to build handed to a thread."""
        if self._closed:  # closed on this loop: the timer is cancelled, but for this call
            return
        loop = asyncio.get_running_loop()
        delay = FOLLOW_EVERY_S
        try:
            if self._generation.value != self._scanned:
                with self._lock:
                    self._scan()
            if self._pending and self._building is None:
                self._building = loop.run_in_executor(None, self._build_pending)
                self._building.add_done_callback(self._built)
        except Exception:
            logger.exception("the model store could not be applied")
            delay = BACK_OFF_S  # a lasting failure logs once a second
        self._timer = loop.call_later(delay, self._watch)

    def _built(self, building: asyncio.Future[None]) -> None:
        self._building = None
        if not building.cancelled() and building.exception() is not None:
            logger.error("the model store could not be applied", exc_info=building.exception())

    def _scan(self) -> None:
        """Read the store and apply what differs from what this worker serves, but the graph
        models to build (``_pending``); publish the generation once nothing is pending.
        Under ``_lock``."""
        generation = self._generation.value  # first: the folder holds at least its entries
        entries = self._read()
        for name, entry in entries.items():
            mine = self._applied.get(name)
            if mine is not None and mine.generation == entry.generation:
                continue
            if entry.unloaded:
                self._pending.pop(name, None)
                self._unload_here(name)
                self._applied[name] = entry
            else:
                self._pending[name] = entry
        for name in [name for name in self._applied if name not in entries]:
            gone = self._applied.pop(name)
            if not gone.unloaded:
                self.plane.unload_graph(name)  # a graph model the store brought, unloaded
            elif self.graphs.is_builtin(name):
                self.states.load(name)  # a built-in model loaded again
        for name in [name for name in self._pending if name not in entries]:
            del self._pending[name]
        self._scanned = generation
        if not self._pending:
            self._publish(generation)

    def _unload_here(self, name: str) -> None:
        if self.graphs.is_builtin(name):
            self.states.unload(name)
        else:
            self.plane.unload_graph(name)

    def _read(self) -> dict[str, Entry]:
        """The store's entries by model name, the newest of each name (a writer removes the
        older ones just after it renamed the new one into place)."""
        found: dict[str, Entry] = {}
        with os.scandir(self.entries) as listing:
            for item in listing:
                key, at, rest = item.name.rpartition("@")
                unloaded = rest.endswith(UNLOADED)
                digits = rest.removesuffix(UNLOADED)
                path = Path(item.path)
                try:
                    if not at or not key or not digits.isascii() or not digits.isdigit():
                        raise ValueError("not <key>@<generation>")
                    name = unquote_key(key) if key[0] != "#" else self._stored_name(path)
                    if entry_key(name) != key:
                        raise ValueError(f"its key is not its name's ({entry_key(name)[:20]}...)")
                except (OSError, ValueError) as exc:
                    logger.warning("model store: %s skipped: %s", item.name, exc)
                    continue
                entry = Entry(name, int(digits), unloaded, path)
                if name not in found or found[name].generation < entry.generation:
                    found[name] = entry
        return found

    @staticmethod
    def _stored_name(path: Path) -> str:
        data = (path / NAME if path.is_dir() else path).read_bytes()
        return data.decode("utf-8", "surrogatepass")

    def _build_pending(self) -> None:
        """Build the graph models pending, off the lock (each as a load builds it), then serve
        each that is still the store's newest of its name; publish once none is pending."""
        with self._lock:
            work = list(self._pending.values())
        for entry in work:
            model: GraphModel | None = None
            try:
                model = self._build(entry)
            except _Superseded:
                with self._lock:
                    self._scanned = -1  # read the store again: it has what replaced the entry
                continue
            except Exception as exc:
                failure: Exception | None = exc
            else:
                failure = None
            with self._lock:
                if self._pending.get(entry.name) != entry:
                    continue  # replaced or removed while it was built
                del self._pending[entry.name]
                self._applied[entry.name] = entry  # once: a broken entry is not tried again
                try:
                    if failure is not None:
                        raise failure
                    assert model is not None
                    self.plane.add_graph(model)
                except Exception as exc:
                    logger.error(
                        "graph model '%s' loaded by another worker (generation %d) could not "
                        "be loaded by this one: %s",
                        entry.name[:100], entry.generation, getattr(exc, "message", exc),
                    )  # fmt: skip
        with self._lock:
            if not self._pending:
                self._publish(self._scanned)

    def _build(self, entry: Entry) -> GraphModel:
        """The graph model of ``entry``, built as a load builds it: ``GraphModels.load`` with
        this worker's limits (a scratch instance: nothing served until it is built)."""
        graphs = self.graphs
        try:
            config: bytes | None = None
            files: dict[str, bytes] = {}
            with os.scandir(entry.path) as listing:
                for item in listing:
                    if item.name == NAME:
                        continue
                    if item.name == CONFIG:
                        config = _read_bounded(Path(item.path), MAX_CONFIG_BYTES)
                    else:
                        files[unquote_key(item.name)] = _read_bounded(
                            Path(item.path), graphs.limits.max_model_bytes
                        )
        except FileNotFoundError:
            if not entry.path.exists():
                raise _Superseded from None
            raise
        if config is None:
            raise ValueError("the entry has no configuration")
        scratch = GraphModels(graphs.limits, graphs.max_loaded, graphs.is_builtin)
        return scratch.load(entry.name, config, files, self.plane.batch_limits)

    def _publish(self, generation: int) -> None:
        if generation > self._published and not self._closed:
            os.pwrite(self._applied_fd, generation.to_bytes(8, "little"), 0)
            self._published = generation

    # --- the folder ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _flock(self) -> Iterator[None]:
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _served(self) -> set[str]:
        """The graph models every worker serves, as the store says (under the ``flock``): the
        repository folder's but those unloaded, and those of the store's entries."""
        served = set(self.base_loaded)
        for entry in self._read().values():
            if entry.unloaded:
                served.discard(entry.name)
            elif not self.graphs.is_builtin(entry.name):
                served.add(entry.name)
        return served

    def _temporary(self) -> Path:
        return self.temporaries / f"{os.getpid()}.{next(_stores)}"

    def _entries_of(self, key: str) -> list[Path]:
        prefix = f"{key}@"
        with os.scandir(self.entries) as listing:
            return [Path(item.path) for item in listing if item.name.startswith(prefix)]

    def _applied_file(self) -> tuple[Path, int]:
        """This worker's ``applied`` file, at generation 0, its shared lock held: made under a
        temporary name, locked, then renamed, so that no other worker ever sees it unlocked."""
        temporary = self._temporary()
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            os.pwrite(fd, bytes(8), 0)
            path = self.applied_files / f"{os.getpid()}.{next(_stores)}"
            os.rename(temporary, path)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise
        return path, fd


def _read_bounded(path: Path, bound: int) -> bytes:
    """At most ``bound`` + 1 bytes of ``path``: past its bound, the load's own check refuses it."""
    with path.open("rb") as file:
        return file.read(bound + 1)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


__all__ = [
    "APPLIED",
    "APPLY_TIMEOUT_S",
    "ENTRIES",
    "MODELS",
    "Entry",
    "FollowingGraphModels",
    "FollowingModelStates",
    "ModelStore",
    "entry_key",
    "quote_name",
    "unquote_key",
]
