"""The model repository folder (``TENSORBITS_MODEL_REPOSITORY``), read once at start, in
Triton's layout::

    <folder>/<name>/config.json          the configuration, JSON (config.pbtxt is not read)
    <folder>/<name>/<version>/model.onnx the ONNX file; the highest numbered version is served

Each model is loaded on its own: one that cannot be (no configuration, a file past the bounds, a
graph refused) stays listed UNAVAILABLE in the repository index with the reason, the log says
why, and the others are served. Sizes are checked on the files' metadata before they are read."""

from __future__ import annotations

import logging
from pathlib import Path

from tensorbits.core.dataplane import DataPlane
from tensorbits.core.graphs.models import build, check_name
from tensorbits.core.graphs.triton_config import MAX_CONFIG_BYTES
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge, TensorbitsError
from tensorbits_protocol.operators import REGISTRY

logger = logging.getLogger("tensorbits.repository")

CONFIG_FILE = "config.json"
MODEL_FILE = "model.onnx"


def _read(path: Path, limit: int, what: str, setting: str) -> bytes:
    size = path.stat().st_size
    if size > limit:
        raise PayloadTooLarge(
            f"{what} is {size} bytes, more than the {limit} allowed ({setting})",
            field=what,
            rule="max_model_bytes" if what == MODEL_FILE else "max_config_bytes",
        )
    return path.read_bytes()[: limit + 1]


def _version(folder: Path) -> Path:
    versions = sorted(
        (int(entry.name), entry)
        for entry in folder.iterdir()
        if entry.is_dir() and entry.name.isdigit() and (entry / MODEL_FILE).is_file()
    )
    if not versions:
        raise InvalidRequest(
            f"no <version>/{MODEL_FILE} in the model's folder (e.g. 1/{MODEL_FILE})",
            field=MODEL_FILE,
            rule="missing_file",
        )
    return versions[-1][1]


def _load_one(plane: DataPlane, folder: Path) -> str:
    name = folder.name
    check_name(name, REGISTRY.__contains__)
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        only_pbtxt = (folder / "config.pbtxt").is_file()
        raise InvalidRequest(
            f"no {CONFIG_FILE}"
            + (
                "; config.pbtxt is not read here: write the configuration as JSON"
                if only_pbtxt
                else ""
            ),
            field=CONFIG_FILE,
            rule="missing_config",
        )
    config = _read(config_path, MAX_CONFIG_BYTES, CONFIG_FILE, "a configuration's bound")
    version = _version(folder)
    limits = plane.graphs.limits
    data = _read(
        version / MODEL_FILE, limits.max_model_bytes, MODEL_FILE, "TENSORBITS_MAX_MODEL_BYTES"
    )
    plane.add_graph(build(name, config, data, limits, version.name))
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
