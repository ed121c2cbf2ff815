"""A model repository folder with one hostile entry of each kind beside a good model: the names
and versions a folder can hold that no model may have, and links out of the folder. The unit and
live tests of the repository reader build it from here."""

from __future__ import annotations

import json
import os
from pathlib import Path

CONFIG = json.dumps({"backend": "onnxruntime"})
GOOD = "good"
LARGEST = "largest_version"
# A file outside the repository folder, linked from inside it: its text must never be served.
SECRET = "SECRET_VARIABLE_NAME=its-value"

# Each refused entry: the name the index lists it under, and the words of its rule in the reason.
NAME_RULE = "characters of UTF-8"
RESERVED_RULE = "is a segment of the routes under /v2/models/"
VERSION_RULE = "a version is 1 to 9223372036854775807 in ASCII digits, no leading zero"
OUTSIDE_RULE = "leads out of the repository folder (a link): not read"
REFUSED = {
    "bad\\xff\\xfename": NAME_RULE,
    "stats": RESERVED_RULE,
    "ready": RESERVED_RULE,
    "versions": RESERVED_RULE,
    "past_int64": VERSION_RULE,
    "arabic_indic": VERSION_RULE,
    "leading_zero": VERSION_RULE,
    "linked_config": OUTSIDE_RULE,
    "linked_environ": OUTSIDE_RULE,
    "linked_folder": OUTSIDE_RULE,
    "linked_file": OUTSIDE_RULE,
}


def _model(root: Path, name: str | bytes, version: str, data: bytes) -> Path:
    folder = root / os.fsdecode(name)
    (folder / version).mkdir(parents=True)
    (folder / "config.json").write_text(CONFIG)
    (folder / version / "model.onnx").write_bytes(data)
    return folder


def hostile_repository(root: Path, outside: Path, data: bytes) -> Path:
    """``root`` (made) with ``GOOD`` and ``LARGEST`` served and every entry of ``REFUSED``;
    ``outside`` (made) holds what the links lead to. ``data``: a valid ONNX file."""
    root.mkdir()
    outside.mkdir()
    _model(root, GOOD, "1", data)
    _model(root, LARGEST, str((1 << 63) - 1), data)
    _model(root, b"bad\xff\xfename", "1", data)  # not UTF-8
    for name in ("stats", "ready", "versions"):
        _model(root, name, "1", data)
    _model(root, "past_int64", str(1 << 63), data)
    _model(root, "arabic_indic", "\u0661", data)  # ARABIC-INDIC DIGIT ONE
    _model(root, "leading_zero", "01", data)
    secret = outside / "config.pbtxt"
    secret.write_text(SECRET)
    linked = _model(root, "linked_config", "1", data)
    (linked / "config.json").unlink()
    (linked / "config.pbtxt").symlink_to(secret)
    environ = _model(root, "linked_environ", "1", data)
    (environ / "config.json").unlink()
    (environ / "config.pbtxt").symlink_to("/proc/self/environ")
    away = _model(outside, "away", "1", data)
    (root / "linked_folder").symlink_to(away, target_is_directory=True)
    linked_file = _model(root, "linked_file", "1", data)
    (outside / "model.onnx").write_bytes(data)
    (linked_file / "1" / "model.onnx").unlink()
    (linked_file / "1" / "model.onnx").symlink_to(outside / "model.onnx")
    return root
