"""The model repository folder (``TENSORBITS_MODEL_REPOSITORY``), read at start (and followed
while serving in poll mode, ``repository_poll.py``), in Triton's layout::

    <folder>/<name>/config.pbtxt         the configuration, Triton's protobuf text format
    <folder>/<name>/config.json          ... or the same configuration as JSON
    <folder>/<name>/<version>/model.onnx the ONNX file; the highest numbered version is served
    <folder>/<name>/<version>/model.json ... or the graph in the /v1 binding model, as the
                                         configuration's backend says (tensorbits)

A folder without a configuration holding ``<version>/model.onnx`` is served as Triton serves
it: with the configuration completed from the file (``COMPLETED_ONNX_CONFIG``). The version
served is the one the configuration's ``version_policy`` selects (the highest by default).

A folder holds one of the two configurations: Triton reads ``config.pbtxt`` only, so a folder
with both is refused rather than served from one while the other may say something else.
``config.pbtxt`` is made the JSON form's document (``core.graphs.triton_pbtxt``, protobuf's own
text-format parser) and checked as the JSON form is.

Each model is loaded on its own: one that cannot be (no configuration, a file past the bounds, a
graph refused) stays listed UNAVAILABLE in the repository index with the reason, the log says
why, and the others are served. Sizes are checked on the files' metadata before they are read,
and no read takes more than the bound and a byte.

A folder whose name starts with ``.`` is not read (a folder being copied in, then renamed; the
``..data`` of a Kubernetes ConfigMap volume). The folder's names are hostile too
(``core/graphs/names.py``, the rule the load API checks): a model folder's name that is not a
model's name (not UTF-8, a route's segment such as ``stats``, a built-in model's) is refused,
listed under its name with the bytes that are not UTF-8 written ``\\xNN``; a folder named in
digits is a version, which is ASCII digits, no leading zero, within int64, or the model is
refused naming it; and every path read (the model's folder, its
configuration, its file), resolved through its links, is inside the repository folder, or the
model is refused without a byte of it read."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from tensorbits.core.dataplane import DataPlane
from tensorbits.core.graphs.models import (
    Configuration,
    GraphModel,
    build,
    check_name,
    configuration,
)
from tensorbits.core.graphs.names import check_version, displayed, looks_like_version
from tensorbits.core.graphs.triton_config import (
    COMPLETED_ONNX_CONFIG,
    MAX_CONFIG_BYTES,
    ONNX,
    served_version,
)
from tensorbits.core.graphs.triton_pbtxt import pbtxt_as_json
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge, TensorbitsError
from tensorbits_protocol.operators import REGISTRY

logger = logging.getLogger("tensorbits.repository")

CONFIG_FILE = "config.json"
CONFIG_PBTXT = "config.pbtxt"


def _inside(root: Path, path: Path) -> Path:
    """``path`` with every link followed, refused where that leaves ``root`` (resolved): the
    repository folder lends nothing of the file system beyond it (a ``config.pbtxt`` linked to
    ``/proc/self/environ`` is not read)."""
    resolved = path.resolve()
    if not resolved.is_relative_to(root):
        shown = displayed(str(path.relative_to(root)))  # no more of the link than its name
        raise InvalidRequest(
            f"{shown} leads out of the repository folder (a link): not read",
            field=shown,
            rule="outside_repository",
        )
    return resolved


def _read(path: Path, limit: int, what: str, setting: str) -> bytes:
    size = path.stat().st_size
    rule = "max_config_bytes" if what in (CONFIG_FILE, CONFIG_PBTXT) else "max_model_bytes"
    data = b""
    if size <= limit:
        with path.open("rb") as file:  # at most a byte past the bound, whatever the size said
            data = file.read(limit + 1)
    if size > limit or len(data) > limit:
        raise PayloadTooLarge(
            f"{what} is {max(size, len(data))} bytes, more than the {limit} allowed ({setting})",
            field=what,
            rule=rule,
        )
    return data


def _version(root: Path, folder: Path, model_file: str, config: Configuration) -> Path:
    """The version folder holding ``model_file`` that the configuration's version policy serves
    (the highest by default); every folder named in digits is a version, checked
    (``check_version``), the others are not versions (Triton's layout)."""
    versions = []
    for entry in folder.iterdir():
        if not looks_like_version(entry.name):
            continue
        number = check_version(entry.name, f"{displayed(entry.name)}/{model_file}")
        if entry.is_dir() and (entry / model_file).is_file():
            _inside(root, entry / model_file)
            versions.append((number, entry))
    versions.sort()
    if not versions:
        raise InvalidRequest(
            f"no <version>/{model_file} in the model's folder (e.g. 1/{model_file})",
            field=model_file,
            rule="missing_file",
        )
    served = served_version(config.document, [number for number, _ in versions])
    return next(entry for number, entry in versions if number == served)


def _config(root: Path, folder: Path) -> str | bytes:
    """The folder's configuration as JSON text: config.pbtxt made JSON, or config.json."""
    pbtxt, json_file = folder / CONFIG_PBTXT, folder / CONFIG_FILE
    for path in (pbtxt, json_file):
        if path.is_symlink() or path.exists():
            _inside(root, path)
    if pbtxt.is_file() and json_file.is_file():
        raise InvalidRequest(
            f"both {CONFIG_PBTXT} and {CONFIG_FILE}: keep one (Triton reads {CONFIG_PBTXT} only)",
            field=CONFIG_PBTXT,
            rule="ambiguous_config",
        )
    if pbtxt.is_file():
        return pbtxt_as_json(
            _read(pbtxt, MAX_CONFIG_BYTES, CONFIG_PBTXT, "a configuration's bound")
        )
    if json_file.is_file():
        return _read(json_file, MAX_CONFIG_BYTES, CONFIG_FILE, "a configuration's bound")
    if any(folder.glob(f"*/{ONNX.file}")):  # Triton completes an ONNX model's from the file
        return COMPLETED_ONNX_CONFIG
    raise InvalidRequest(
        f"no {CONFIG_PBTXT} (or {CONFIG_FILE}) in the model's folder",
        field=CONFIG_PBTXT,
        rule="missing_config",
    )


@dataclass(frozen=True, slots=True)
class FolderModel:
    """A model folder read (not built): its configuration, the version served and its file."""

    name: str
    read: Configuration
    version: str
    data: bytes

    @property
    def digest(self) -> str:
        """The SHA-256 of what the model is built from: its configuration, version and file."""
        digest = hashlib.sha256(json.dumps(self.read.document, sort_keys=True).encode())
        digest.update(f"\0{self.version}\0".encode())
        digest.update(self.data)
        return digest.hexdigest()


def read_folder(plane: DataPlane, root: Path, folder: Path) -> FolderModel:
    """Model folder ``folder`` of repository ``root`` (resolved) read under every bound."""
    name = folder.name
    check_name(name, REGISTRY.__contains__)
    _inside(root, folder)
    read = configuration(name, _config(root, folder))
    model_file = read.form.file
    version = _version(root, folder, model_file, read)
    limits = plane.graphs.limits
    data = _read(
        version / model_file, limits.max_model_bytes, model_file, "TENSORBITS_MAX_MODEL_BYTES"
    )
    return FolderModel(name, read, version.name, data)


def build_folder(plane: DataPlane, read: FolderModel) -> GraphModel:
    """The graph model of a folder read, built (not served)."""
    limits, batch_limits = plane.graphs.limits, plane.batch_limits
    return build(read.name, read.read, read.data, limits, batch_limits, read.version)


# What a model folder that cannot be loaded raises: reported, the other models served.
LOAD_ERRORS = (TensorbitsError, OSError, ValueError)


def failure(name: str, exc: Exception) -> str:
    """Why model ``name`` (as ``displayed``) could not be loaded, in the index's words."""
    reason = exc.message if isinstance(exc, TensorbitsError) else str(exc)
    return displayed(f"failed to load '{name}': {reason}")


def model_folders(root: Path) -> list[Path]:
    """The model folders of ``root`` (resolved), by name; a hidden one (``.`` first: a copy
    under way, Kubernetes' ``..data`` of a ConfigMap volume) is no model's."""
    return sorted(e for e in root.iterdir() if e.is_dir() and not e.name.startswith("."))


def load_repository(plane: DataPlane, root: Path) -> dict[str, str]:
    """Load every model folder of ``root`` into ``plane``, each on its own (see the module);
    the ``FolderModel.digest`` of each loaded, by its folder's name."""
    shown = displayed(str(root))
    try:
        root = root.resolve()
        folders = model_folders(root)
    except OSError as exc:
        logger.error("model repository %s cannot be read: %s; no graph model loaded", shown, exc)
        return {}
    loaded = {}
    for folder in folders:
        # Reported under a name every encoder takes (the index's JSON and protobuf, the logs).
        name = displayed(folder.name)
        try:
            read = read_folder(plane, root, folder)
            plane.add_graph(build_folder(plane, read))
        except LOAD_ERRORS as exc:
            reason = failure(name, exc)
            plane.graphs.fail(name, reason)
            logger.warning("model repository %s: %s", shown, reason)
            continue
        loaded[folder.name] = read.digest
        logger.info(
            "model repository %s: loaded graph model '%s' version %s", shown, name, read.version
        )
    return loaded


__all__ = [
    "LOAD_ERRORS",
    "FolderModel",
    "build_folder",
    "failure",
    "load_repository",
    "model_folders",
    "read_folder",
]
