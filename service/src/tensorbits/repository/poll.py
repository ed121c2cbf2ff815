"""Triton's ``poll`` model control mode (``TENSORBITS_MODEL_CONTROL_MODE=poll``): the model
repository folder loaded at start, then read again every ``TENSORBITS_REPOSITORY_POLL_SECS``
while the server serves, and followed:

* a model folder added is loaded, one removed is unloaded, one changed is reloaded;
* a change is seen by a cheap fingerprint of each model folder: its files' names, sizes and
  modification times (no byte read). A folder whose fingerprint differs from the one it was
  taken at is taken again only once its fingerprint is the same on two consecutive polls: a
  folder being written (copied in, unpacked) is not read while it grows, so a model appears
  whole or not at all. A folder that stays unchanged half written is read, refused by the
  reader's own checks (a file cut short does not parse) and listed UNAVAILABLE with the reason,
  as a folder refused at start is, never served;
* a folder taken again is read under the start's bounds (``model_repository.read_folder``) and
  its content's hash compared with the one served: a folder touched but not changed is left as
  it is; a changed one is built, then swapped in the model table at once
  (``GraphModels.add``): requests in flight finish on the model they resolved, new ones get
  the new one. A reload that fails leaves the model served as it was (logged);
* reading and building run on a worker thread, never the event loop; one poll at a time.

With several workers each worker polls the same folder on its own (the API's loads and unloads,
which the model store shares, are refused in this mode): every worker serves what the folder
holds, each within a poll interval of the change.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from tensorbits.core.dataplane import DataPlane
from tensorbits.core.graphs.names import displayed
from tensorbits.repository.folder import (
    LOAD_ERRORS,
    build_folder,
    failure,
    load_repository,
    model_folders,
    read_folder,
)

logger = logging.getLogger("tensorbits.repository")

# A fingerprint: each file's path in its model folder, size and modification time.
Fingerprint = tuple[tuple[str, int, int], ...]
# The entries a fingerprint reads in one model folder, and how deep: Triton's layout is a
# configuration beside version folders of a file or a few; past the bound the fingerprint
# stops there (the folder is still read under the reader's own bounds).
MAX_ENTRIES = 4096
MAX_DEPTH = 3


def fingerprint(folder: Path) -> Fingerprint:
    """``folder``'s files, sizes and modification times (links followed; a file that vanished
    while read is listed with -1, so a folder being changed never looks settled)."""
    found: list[tuple[str, int, int]] = []
    pending = [(folder, "", 0)]
    while pending and len(found) < MAX_ENTRIES:
        path, prefix, depth = pending.pop()
        try:
            with os.scandir(path) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError:
            found.append((prefix, -1, -1))
            continue
        for entry in entries[: MAX_ENTRIES - len(found)]:
            name = f"{prefix}/{entry.name}"
            try:
                if entry.is_dir():
                    if depth + 1 < MAX_DEPTH:
                        pending.append((Path(entry.path), name, depth + 1))
                    continue
                stat = entry.stat()
            except OSError:
                found.append((name, -1, -1))
                continue
            found.append((name, stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(found))


def fingerprints(root: Path) -> dict[str, Fingerprint]:
    """Every model folder of ``root``'s fingerprint, by the folder's name."""
    return {folder.name: fingerprint(folder) for folder in model_folders(root)}


class RepositoryPoller:
    """One server's poll of its repository folder (see the module). ``started`` makes one with
    the folder loaded; ``poll`` is one poll (on a worker thread); ``start`` runs them."""

    def __init__(self, plane: DataPlane, root: Path, interval_s: float) -> None:
        self.plane = plane
        self.root = root.resolve()
        self.shown = displayed(str(root))
        self.interval_s = interval_s
        self._seen: dict[str, Fingerprint] = {}  # each folder's at the last poll
        self._taken: dict[str, Fingerprint] = {}  # each folder's when it was last read
        self._served: dict[str, str] = {}  # the content hash of each folder's model served
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def started(cls, plane: DataPlane, root: Path, interval_s: float) -> RepositoryPoller:
        """The repository loaded as at start, each folder taken at the fingerprint it had
        before it was read (one changed meanwhile is read again once settled)."""
        poller = cls(plane, root, interval_s)
        try:
            before = fingerprints(poller.root)
        except OSError:
            before = {}
        poller._served = load_repository(plane, root)
        poller._seen = dict(before)
        poller._taken = dict(before)
        return poller

    def poll(self) -> None:
        """One poll: what was removed unloaded, what settled changed read (see the module)."""
        try:
            now = fingerprints(self.root)
        except OSError as exc:
            logger.error("model repository %s cannot be read: %s; kept as served", self.shown, exc)
            return
        for name in [name for name in self._taken if name not in now]:
            del self._taken[name]
            self._served.pop(name, None)
            if self.plane.unload_graph(displayed(name)):
                logger.info("model repository %s: '%s' removed, unloaded", self.shown,
                            displayed(name))  # fmt: skip
        for name, print_ in now.items():
            if self._taken.get(name) != print_ and self._seen.get(name) == print_:
                self._taken[name] = print_
                self._take(name)
        self._seen = now

    def _take(self, name: str) -> None:
        shown = displayed(name)
        try:
            read = read_folder(self.plane, self.root, self.root / name)
            if self._served.get(name) == read.digest:
                return  # touched, not changed
            self.plane.add_graph(build_folder(self.plane, read))
        except LOAD_ERRORS as exc:
            reason = failure(shown, exc)
            if name in self._served:
                logger.warning("model repository %s: %s; the model served is kept", self.shown,
                               reason)  # fmt: skip
            else:
                self.plane.graphs.fail(shown, reason)
                logger.warning("model repository %s: %s", self.shown, reason)
            return
        said = "reloaded" if name in self._served else "loaded"
        self._served[name] = read.digest
        logger.info("model repository %s: %s graph model '%s' version %s", self.shown, said,
                    shown, read.version)  # fmt: skip

    def start(self) -> None:
        """Poll every ``interval_s`` on the running event loop, each poll on a worker thread."""
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await asyncio.to_thread(self.poll)
            except Exception:
                logger.exception("model repository %s could not be polled", self.shown)

    def close(self) -> None:
        """Stop polling (a poll under way on its thread finishes; nothing after it)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None


__all__ = ["Fingerprint", "RepositoryPoller", "fingerprint", "fingerprints"]
