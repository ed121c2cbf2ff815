"""The model repository folder (``TENSORBITS_MODEL_REPOSITORY``), read once at start, in
Triton's layout::

    <folder>/<name>/config.pbtxt         the configuration, Triton's protobuf text format
    <folder>/<name>/config.json          ... or the same configuration as JSON
    <folder>/<name>/<version>/model.onnx the ONNX file; the highest numbered version is served
    <folder>/<name>/<version>/model.json ... or the graph in the /v1 binding model, as the
                                         configuration's backend says (tensorbits)

A folder holds one of the two configurations: Triton reads ``config.pbtxt`` only, so a folder
with both is refused rather than served from one while the other may say something else.
``config.pbtxt`` is made the JSON form's document (``core.graphs.triton_pbtxt``, protobuf's own
text-format parser) and checked as the JSON form is.

Each model is loaded on its own: one that cannot be (no configuration, a file past the bounds, a
graph refused) stays listed UNAVAILABLE in the repository index with the reason, the log says
why, and the others are served. Sizes are checked on the files' metadata before they are read."""

from __future__ import annotations

import logging
from pathlib import Path

from tensorbits.core.dataplane import DataPlane
from tensorbits.core.graphs.models import build, check_name, configuration
from tensorbits.core.graphs.triton_config import MAX_CONFIG_BYTES
from tensorbits.core.graphs.triton_pbtxt import pbtxt_as_json
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge, TensorbitsError
from tensorbits_protocol.operators import REGISTRY

logger = logging.getLogger("tensorbits.repository")

CONFIG_FILE = "config.json"
CONFIG_PBTXT = "config.pbtxt"


def _read(path: Path, limit: int, what: str, setting: str) -> bytes:
    size = path.stat().st_size
    if size > limit:
        raise PayloadTooLarge(
            f"{what} is {size} bytes, more than the {limit} allowed ({setting})",
            field=what,
            rule="max_config_bytes" if what in (CONFIG_FILE, CONFIG_PBTXT) else "max_model_bytes",
        )
    return path.read_bytes()[: limit + 1]


def _version(folder: Path, model_file: str) -> Path:
    versions = sorted(
        (int(entry.name), entry)
        for entry in folder.iterdir()
        if entry.is_dir() and entry.name.isdigit() and (entry / model_file).is_file()
    )
    if not versions:
        raise InvalidRequest(
            f"no <version>/{model_file} in the model's folder (e.g. 1/{model_file})",
            field=model_file,
            rule="missing_file",
        )
    return versions[-1][1]


def _config(folder: Path) -> str | bytes:
    """The folder's configuration as JSON text: config.pbtxt made JSON, or config.json."""
    pbtxt, json_file = folder / CONFIG_PBTXT, folder / CONFIG_FILE
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
    raise InvalidRequest(
        f"no {CONFIG_PBTXT} (or {CONFIG_FILE}) in the model's folder",
        field=CONFIG_PBTXT,
        rule="missing_config",
    )


def _load_one(plane: DataPlane, folder: Path) -> str:
    name = folder.name
    check_name(name, REGISTRY.__contains__)
    read = configuration(name, _config(folder))
    model_file = read.form.file
    version = _version(folder, model_file)
    limits = plane.graphs.limits
    data = _read(
        version / model_file, limits.max_model_bytes, model_file, "TENSORBITS_MAX_MODEL_BYTES"
    )
    plane.add_graph(build(name, read, data, limits, plane.batch_limits, version.name))
    return version.name


def load_repository(plane: DataPlane, root: Path) -> None:
    """Load every model folder of ``root`` into ``plane``, each on its own (see the module)."""
    try:
        folders = sorted(entry for entry in root.iterdir() if entry.is_dir())
    except OSError as exc:
        logger.error("model repository %s cannot be read: %s; no graph model loaded", root, exc)
        return
    for folder in folders:
        try:
            version = _load_one(plane, folder)
        except (TensorbitsError, OSError, ValueError) as exc:
            reason = exc.message if isinstance(exc, TensorbitsError) else str(exc)
            reason = f"failed to load '{folder.name}': {reason}"
            plane.graphs.fail(folder.name, reason)
            logger.warning("model repository %s: %s", root, reason)
            continue
        logger.info(
            "model repository %s: loaded graph model '%s' version %s", root, folder.name, version
        )


__all__ = ["load_repository"]
